//! The apiserver's object semantics over the store: create, get, list, update, patch, apply,
//! delete (finalizers, grace, propagation), garbage collection, eviction, CRDs, and the records
//! (audit log, PDB violations) tests read. The HTTP layer and the simulated cluster both use it.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::apply::{self, Writer};
use crate::clock::{Clock, format_time};
use crate::defaults;
use crate::error::{ApiError, ApiResult};
use crate::patch;
use crate::registry::{self, ResourceInfo};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Inner, ObjKey, ObjRef, ResKey};

/// Who is calling and how.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub user: String,
    /// `fieldManager`; defaults to the user agent's program name.
    pub manager: String,
    pub dry_run: bool,
}

impl Ctx {
    pub fn new(user: &str, manager: &str) -> Self {
        Self {
            user: user.to_string(),
            manager: manager.to_string(),
            dry_run: false,
        }
    }

    /// The identity of the simulated cluster's own components.
    pub fn system(component: &str) -> Self {
        Self::new(&format!("system:{component}"), component)
    }
}

/// One write as the audit log records it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AuditRecord {
    pub time: String,
    pub user: String,
    pub verb: String,
    /// `plural` or `plural.group`
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
}

/// A pod deleted while a PodDisruptionBudget covering it allowed no disruption.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PdbViolation {
    pub time: String,
    pub user: String,
    pub namespace: String,
    pub pod: String,
    pub pdb: String,
}

/// The records tests assert on.
#[derive(Debug, Default)]
pub struct Records {
    pub audit: Vec<AuditRecord>,
    pub violations: Vec<PdbViolation>,
    /// When false, the audit log is not kept (scale runs).
    pub audit_off: bool,
}

/// Options of a delete.
#[derive(Clone, Debug, Default)]
pub struct DeleteOpts {
    pub grace: Option<i64>,
    pub propagation: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

impl DeleteOpts {
    /// Reads a `DeleteOptions` body (may be empty).
    pub fn from_body(v: &Value) -> Self {
        Self {
            grace: v.get("gracePeriodSeconds").and_then(Value::as_i64),
            propagation: v
                .get("propagationPolicy")
                .and_then(Value::as_str)
                .map(str::to_string),
            uid: v
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(str::to_string),
            resource_version: v
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string),
        }
    }
}

/// How a patch body is to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply { force: bool },
}

/// One page of a list.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

/// What a delete did.
#[derive(Debug)]
pub enum Deleted {
    /// Removed now; the last state.
    Gone(Arc<Value>),
    /// Marked for deletion (finalizers or grace period pending).
    Pending(Arc<Value>),
}

impl Deleted {
    pub fn object(&self) -> &Arc<Value> {
        match self {
            Self::Gone(o) | Self::Pending(o) => o,
        }
    }
}

/// Where a request lands: the resource, the object's namespace and name, and the subresource
/// (`""` for the main endpoint).
#[derive(Clone, Copy)]
struct Target<'a> {
    ri: &'a ResourceInfo,
    ns: &'a str,
    name: &'a str,
    sub: &'a str,
}

impl<'a> Target<'a> {
    fn new(ri: &'a ResourceInfo, ns: &'a str, name: &'a str, sub: &'a str) -> Self {
        Self { ri, ns, name, sub }
    }

    fn res(&self) -> ResKey {
        (self.ri.group.clone(), self.ri.plural.clone())
    }

    fn key(&self) -> ObjKey {
        (self.ns.to_string(), self.name.to_string())
    }
}

/// The API server's state.
#[derive(Debug)]
pub struct Api {
    inner: RwLock<Inner>,
    resources: RwLock<Vec<Arc<ResourceInfo>>>,
    pub clock: Arc<Clock>,
    pub records: Mutex<Records>,
    /// Signalled on every stored change; the simulated cluster waits on it.
    pub changed: Notify,
    seq: AtomicU64,
}

fn meta_str<'a>(v: &'a Value, f: &str) -> Option<&'a str> {
    v.get("metadata")
        .and_then(|m| m.get(f))
        .and_then(Value::as_str)
}

fn finalizers(v: &Value) -> Vec<String> {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn meta_mut(v: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    match v.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just made an object"),
    }
}

/// Everything of an object except metadata and status: what bumps `generation`.
fn spec_part(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.as_object_mut() {
        for k in ["metadata", "status", "apiVersion", "kind"] {
            m.remove(k);
        }
    }
    c
}

/// An object without the volatile parts, to detect no-op writes.
fn comparable(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        if let Some(Value::Array(mf)) = m.get_mut("managedFields") {
            for e in mf {
                if let Some(e) = e.as_object_mut() {
                    e.remove("time");
                }
            }
        }
    }
    c
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

pub const GC_USER: &str = "generic-garbage-collector";

impl Api {
    pub fn new(clock: Arc<Clock>, history_limit: usize) -> Self {
        let resources = registry::builtins().into_iter().map(Arc::new).collect();
        let api = Self {
            inner: RwLock::new(Inner::new(history_limit)),
            resources: RwLock::new(resources),
            clock,
            records: Mutex::new(Records::default()),
            changed: Notify::new(),
            seq: AtomicU64::new(0x5eed),
        };
        let ctx = Ctx::system("apiserver");
        if let Some(ns) = api.resolve("", "v1", "namespaces") {
            for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let _ = api.create(&ctx, &ns, "", json!({"metadata": {"name": n}}));
            }
        }
        api
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- registry ----

    pub fn all_resources(&self) -> Vec<Arc<ResourceInfo>> {
        self.resources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        self.all_resources()
            .into_iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The first served version of `(group, plural)`.
    pub fn resolve_any(&self, res: &ResKey) -> Option<Arc<ResourceInfo>> {
        self.all_resources()
            .into_iter()
            .find(|r| r.group == res.0 && r.plural == res.1)
    }

    fn register_crd(&self, crd: &Value) -> Result<(), String> {
        let infos = registry::from_crd(crd)?;
        let mut rs = self.resources.write().unwrap_or_else(|p| p.into_inner());
        for i in infos {
            rs.retain(|r| !(r.group == i.group && r.version == i.version && r.plural == i.plural));
            rs.push(Arc::new(i));
        }
        Ok(())
    }

    fn unregister_crd(&self, crd: &Value) {
        if let Ok(infos) = registry::from_crd(crd) {
            let mut rs = self.resources.write().unwrap_or_else(|p| p.into_inner());
            for i in infos {
                rs.retain(|r| !(r.group == i.group && r.plural == i.plural && !r.builtin));
            }
        }
    }

    // ---- records ----

    fn audit(&self, ctx: &Ctx, verb: &str, at: Target, code: u16) {
        if ctx.dry_run {
            return;
        }
        let mut r = self.records();
        if r.audit_off {
            return;
        }
        let time = self.clock.now_string();
        r.audit.push(AuditRecord {
            time,
            user: ctx.user.clone(),
            verb: verb.to_string(),
            resource: at.ri.qualified(),
            subresource: at.sub.to_string(),
            namespace: at.ns.to_string(),
            name: at.name.to_string(),
            code,
        });
    }

    /// Records `r` in the audit log (`201` for a successful create) and passes it on.
    fn audited<T>(&self, ctx: &Ctx, verb: &str, at: Target, r: ApiResult<T>) -> ApiResult<T> {
        let code = match &r {
            Ok(_) if verb == "create" => 201,
            Ok(_) => 200,
            Err(e) => e.code,
        };
        self.audit(ctx, verb, at, code);
        r
    }

    /// Runs `write` under the store's lock, then wakes the watchers of stored changes.
    fn locked<T>(&self, write: impl FnOnce(&mut Inner) -> ApiResult<T>) -> ApiResult<T> {
        let r = write(&mut self.write());
        self.changed.notify_waiters();
        r
    }

    /// One request's write: under the lock, watchers woken, recorded in the audit log.
    fn written<T>(
        &self,
        ctx: &Ctx,
        verb: &str,
        at: Target,
        write: impl FnOnce(&mut Inner) -> ApiResult<T>,
    ) -> ApiResult<T> {
        let r = self.locked(write);
        self.audited(ctx, verb, at, r)
    }

    fn next_suffix(&self) -> String {
        let mut x = self.seq.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        const CH: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|i| CH[((x >> (i * 8)) % CH.len() as u64) as usize] as char)
            .collect()
    }

    fn new_uid(&self) -> String {
        let a = self.seq.fetch_add(1, Ordering::Relaxed);
        let t = self.clock.now().as_nanosecond() as u64;
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (t >> 32) as u32,
            (t >> 16) as u16,
            a & 0xfff,
            (a >> 12) & 0xfff,
            (t ^ a.rotate_left(17)) & 0xffff_ffff_ffff
        )
    }

    pub fn resource_version(&self) -> u64 {
        self.read().rv
    }

    /// Drops all watch history (like etcd compaction): older watches get `410 Gone`.
    pub fn compact(&self) {
        self.write().compact();
    }

    /// Subscribes to a resource's events, returning the events after `since` still in history.
    #[allow(clippy::type_complexity)]
    pub fn watch_from(
        &self,
        res: &ResKey,
        since: u64,
    ) -> ApiResult<(
        Vec<Arc<crate::store::Event>>,
        tokio::sync::broadcast::Receiver<Arc<crate::store::Event>>,
    )> {
        let mut inner = self.write();
        let t = inner.table(res);
        if since < t.compacted {
            return Err(ApiError::gone(format!(
                "too old resource version: {since} ({})",
                t.compacted + 1
            )));
        }
        let rx = t.tx.subscribe();
        let past = t.history.iter().filter(|e| e.rv > since).cloned().collect();
        Ok((past, rx))
    }

    // ---- reads ----

    pub fn get(&self, ri: &ResourceInfo, ns: &str, name: &str) -> ApiResult<Arc<Value>> {
        let res = (ri.group.clone(), ri.plural.clone());
        self.read()
            .get(&res, &(ns.to_string(), name.to_string()))
            .ok_or_else(|| ApiError::not_found(ri, name))
    }

    /// Lists objects of `ri` in `ns` (all namespaces when `None`), filtered, one page at a time.
    pub fn list(
        &self,
        ri: &ResourceInfo,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: Option<usize>,
        cont: Option<&str>,
    ) -> ApiResult<ListPage> {
        let res = (ri.group.clone(), ri.plural.clone());
        let inner = self.read();
        let rv = inner.rv;
        let Some(t) = inner.tables.get(&res) else {
            return Ok(ListPage {
                items: vec![],
                resource_version: rv,
                continue_token: None,
            });
        };
        let start: Bound<ObjKey> = match cont.filter(|c| !c.is_empty()) {
            Some(c) => {
                let raw = unhex(c).ok_or_else(|| {
                    ApiError::bad_request(format!("invalid continue token {c:?}"))
                })?;
                let (n, m) = raw
                    .split_once('\0')
                    .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
                Bound::Excluded((n.to_string(), m.to_string()))
            }
            None => match ns {
                Some(n) => Bound::Included((n.to_string(), String::new())),
                None => Bound::Unbounded,
            },
        };
        let mut items = Vec::new();
        let mut next = None;
        for (k, v) in t.objects.range((start, Bound::Unbounded)) {
            if let Some(n) = ns
                && k.0 != n
            {
                break;
            }
            if !labels.matches_object(v) || !fields.matches(v) {
                continue;
            }
            if let Some(l) = limit
                && l > 0
                && items.len() == l
            {
                next = items.last().map(|o: &Arc<Value>| {
                    hex(&format!(
                        "{}\0{}",
                        meta_str(o, "namespace").unwrap_or(""),
                        meta_str(o, "name").unwrap_or("")
                    ))
                });
                break;
            }
            items.push(v.clone());
        }
        Ok(ListPage {
            items,
            resource_version: rv,
            continue_token: next,
        })
    }

    // ---- writes ----

    /// Creates an object.
    pub fn create(
        &self,
        ctx: &Ctx,
        ri: &ResourceInfo,
        ns: &str,
        obj: Value,
    ) -> ApiResult<Arc<Value>> {
        let name = meta_str(&obj, "name").unwrap_or("").to_string();
        let r = self.locked(|inner| self.create_in(inner, ctx, ri, ns, obj, None));
        let name = r
            .as_ref()
            .ok()
            .and_then(|o| meta_str(o, "name").map(str::to_string))
            .unwrap_or(name);
        self.audited(ctx, "create", Target::new(ri, ns, &name, ""), r)
    }

    fn create_in(
        &self,
        inner: &mut Inner,
        ctx: &Ctx,
        ri: &ResourceInfo,
        ns: &str,
        mut obj: Value,
        managed: Option<()>,
    ) -> ApiResult<Arc<Value>> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        let ns = create_namespace(inner, ri, ns, &obj)?;
        check_kind(ri, &obj)?;
        obj["apiVersion"] = json!(ri.api_version());
        obj["kind"] = json!(ri.kind);
        let name = self.create_name(inner, ri, &ns, &obj)?;
        let res = (ri.group.clone(), ri.plural.clone());
        let key = (ns.clone(), name.clone());
        if inner.get(&res, &key).is_some() {
            return Err(ApiError::already_exists(ri, &name));
        }
        let uid = self.new_uid();
        let now = self.clock.now_string();
        init_meta(&mut obj, ri, &name, &ns, &uid, &now, managed.is_some());
        let mut ip_seq = self.seq.fetch_add(1, Ordering::Relaxed);
        defaults::on_create(ri, &mut obj, &uid, || {
            ip_seq = ip_seq.wrapping_mul(2654435761);
            format!("10.96.{}.{}", (ip_seq >> 8) % 250, ip_seq % 250 + 2)
        });
        if !ri.builtin
            && ri.status_subresource
            && let Some(o) = obj.as_object_mut()
        {
            o.remove("status");
        }
        self.admit(ri, &mut obj, None, &name)?;
        if managed.is_none() {
            let w = Writer {
                manager: &ctx.manager,
                subresource: "",
                api_version: &ri.api_version(),
                time: &now,
            };
            apply::record_update(None, &mut obj, &w);
        }
        if is_crd(ri) {
            registry::from_crd(&obj)
                .map_err(|e| ApiError::invalid(ri, &name, vec![("spec".into(), e)]))?;
            set_crd_status(&mut obj);
        }
        if ctx.dry_run {
            return Ok(Arc::new(obj));
        }
        let rv = inner.next_rv();
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let stored = inner.put(&res, key, obj, rv);
        if is_crd(ri) {
            let _ = self.register_crd(&stored);
        }
        Ok(stored)
    }

    /// The new object's name: `metadata.name`, or `generateName` plus a free suffix.
    fn create_name(
        &self,
        inner: &Inner,
        ri: &ResourceInfo,
        ns: &str,
        obj: &Value,
    ) -> ApiResult<String> {
        let name = meta_str(obj, "name").unwrap_or("");
        if !name.is_empty() {
            return Ok(name.to_string());
        }
        match meta_str(obj, "generateName") {
            Some(g) if !g.is_empty() => loop {
                let name = format!("{g}{}", self.next_suffix());
                let res = (ri.group.clone(), ri.plural.clone());
                if inner.get(&res, &(ns.to_string(), name.clone())).is_none() {
                    return Ok(name);
                }
            },
            _ => Err(ApiError::invalid(
                ri,
                "",
                vec![(
                    "metadata.name".into(),
                    "Required value: name or generateName is required".into(),
                )],
            )),
        }
    }

    /// Schema defaults and validation (CRDs) and built-in admission checks.
    fn admit(
        &self,
        ri: &ResourceInfo,
        obj: &mut Value,
        old: Option<&Value>,
        name: &str,
    ) -> ApiResult<()> {
        if let Some(schema) = &ri.schema {
            crate::schema::prune(schema, obj);
            *obj = kube::core::cel::apply_defaults(schema, obj);
            let mut causes = crate::schema::check(schema, obj);
            if causes.is_empty() {
                let res = VALIDATOR.with(|v| v.validate(schema, obj, old));
                if let Err(errs) = res {
                    for e in errs.into_vec() {
                        causes.push((e.field_path.clone(), e.message.clone()));
                    }
                }
            }
            if !causes.is_empty() {
                return Err(ApiError::invalid(ri, name, causes));
            }
        }
        let causes = defaults::validate(ri, obj, old);
        if !causes.is_empty() {
            return Err(ApiError::invalid(ri, name, causes));
        }
        Ok(())
    }

    /// Replaces an object (PUT) on the main endpoint or a subresource (`status`).
    pub fn update(
        &self,
        ctx: &Ctx,
        ri: &ResourceInfo,
        ns: &str,
        name: &str,
        sub: &str,
        obj: Value,
    ) -> ApiResult<Arc<Value>> {
        let at = Target::new(ri, ns, name, sub);
        self.written(ctx, "update", at, |inner| {
            self.update_in(inner, ctx, at, obj)
        })
    }

    fn update_in(
        &self,
        inner: &mut Inner,
        ctx: &Ctx,
        at: Target,
        obj: Value,
    ) -> ApiResult<Arc<Value>> {
        let Target { ri, name, sub, .. } = at;
        let Some(old) = inner.get(&at.res(), &at.key()) else {
            return Err(ApiError::not_found(ri, name));
        };
        if let Some(n) = meta_str(&obj, "name")
            && n != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(rv) = meta_str(&obj, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(ri, name));
        }
        self.commit(inner, ctx, ri, &old, obj, sub, false)
    }

    /// Stores `new` as the next state of `old`: status split, generation, managedFields,
    /// admission, no-op detection, and removal when the last finalizer went.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        inner: &mut Inner,
        ctx: &Ctx,
        ri: &ResourceInfo,
        old: &Arc<Value>,
        new: Value,
        sub: &str,
        applied: bool,
    ) -> ApiResult<Arc<Value>> {
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        let name = meta_str(old, "name").unwrap_or("").to_string();
        let ns = meta_str(old, "namespace").unwrap_or("").to_string();
        let mut new = split_status(ri, old, new, sub, applied);
        new["apiVersion"] = json!(ri.api_version());
        new["kind"] = json!(ri.kind);
        keep_server_meta(old, &mut new, !applied && sub != "status");
        if !internal_write(ctx) {
            self.admit(ri, &mut new, Some(old), &name)?;
        } else if let Some(schema) = &ri.schema {
            new = kube::core::cel::apply_defaults(schema, &new);
        }
        if is_crd(ri) {
            registry::from_crd(&new)
                .map_err(|e| ApiError::invalid(ri, &name, vec![("spec".into(), e)]))?;
            set_crd_status(&mut new);
        }
        bump_generation(old, &mut new);
        if !applied {
            let now = self.clock.now_string();
            let w = Writer {
                manager: &ctx.manager,
                subresource: sub,
                api_version: &ri.api_version(),
                time: &now,
            };
            apply::record_update(Some(old), &mut new, &w);
        }
        if comparable(&new) == comparable(old) {
            return Ok(old.clone());
        }
        if ctx.dry_run {
            return Ok(Arc::new(new));
        }
        self.store_next(inner, ri, (ns, name), new)
    }

    /// Stores a changed object under the next resourceVersion, or removes it when its
    /// deletion has nothing left to wait for.
    fn store_next(
        &self,
        inner: &mut Inner,
        ri: &ResourceInfo,
        key: ObjKey,
        mut new: Value,
    ) -> ApiResult<Arc<Value>> {
        let rv = inner.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        if done_deleting(ri, &new) {
            return Ok(self.remove_obj(inner, ri, &key, new, rv));
        }
        let stored = inner.put(&(ri.group.clone(), ri.plural.clone()), key, new, rv);
        if is_crd(ri) {
            let _ = self.register_crd(&stored);
        }
        Ok(stored)
    }

    /// Applies a patch of `kind` to the object (or creates it for an apply).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        ctx: &Ctx,
        ri: &ResourceInfo,
        ns: &str,
        name: &str,
        sub: &str,
        kind: PatchKind,
        body: &[u8],
    ) -> ApiResult<Arc<Value>> {
        let at = Target::new(ri, ns, name, sub);
        self.written(ctx, "patch", at, |inner| {
            self.patch_in(inner, ctx, at, kind, body)
        })
    }

    fn patch_in(
        &self,
        inner: &mut Inner,
        ctx: &Ctx,
        at: Target,
        kind: PatchKind,
        body: &[u8],
    ) -> ApiResult<Arc<Value>> {
        let old = inner.get(&at.res(), &at.key());
        match kind {
            PatchKind::Apply { force } => self.apply_in(inner, ctx, at, old, body, force),
            other => {
                let Some(old) = old else {
                    return Err(ApiError::not_found(at.ri, at.name));
                };
                let doc = patched(at.ri, &old, other, body)?;
                if meta_str(&doc, "resourceVersion") != meta_str(&old, "resourceVersion") {
                    return Err(ApiError::conflict(at.ri, at.name));
                }
                self.commit(inner, ctx, at.ri, &old, doc, at.sub, false)
            }
        }
    }

    /// A server-side apply: merges the configuration into `old` (or creates the object).
    fn apply_in(
        &self,
        inner: &mut Inner,
        ctx: &Ctx,
        at: Target,
        old: Option<Arc<Value>>,
        body: &[u8],
        force: bool,
    ) -> ApiResult<Arc<Value>> {
        let Target { ri, ns, name, sub } = at;
        let (cfg, precondition) = apply_config(at, body)?;
        tracing::debug!(manager = %ctx.manager, config = %cfg, "server-side apply");
        let now = self.clock.now_string();
        let w = Writer {
            manager: &ctx.manager,
            subresource: sub,
            api_version: &ri.api_version(),
            time: &now,
        };
        if ctx.manager.is_empty() {
            return Err(ApiError::bad_request(
                "PATCH /apply requires fieldManager to be set",
            ));
        }
        match old {
            None => {
                if sub == "status" {
                    return Err(ApiError::not_found(ri, name));
                }
                let mut merged =
                    apply::apply(None, &cfg, &w, force).map_err(|c| conflicts(ri, name, &c))?;
                meta_mut(&mut merged).insert("name".into(), json!(name));
                self.create_in(inner, ctx, ri, ns, merged, Some(()))
            }
            Some(old) => {
                if let Some(p) = precondition
                    && Some(p.as_str()) != meta_str(&old, "resourceVersion")
                {
                    return Err(ApiError::conflict(ri, name));
                }
                let merged = apply::apply(Some(&old), &cfg, &w, force)
                    .map_err(|c| conflicts(ri, name, &c))?;
                self.commit(inner, ctx, ri, &old, merged, sub, true)
            }
        }
    }

    /// Deletes an object as the apiserver does.
    pub fn delete(
        &self,
        ctx: &Ctx,
        ri: &ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> ApiResult<Deleted> {
        let at = Target::new(ri, ns, name, "");
        self.written(ctx, "delete", at, |inner| {
            if ri.group.is_empty() && ri.plural == "pods" && !ctx.user.starts_with("system:") {
                self.detect_violation(inner, ctx, ns, name);
            }
            self.delete_in(inner, ctx, at, opts)
        })
    }

    fn delete_in(
        &self,
        inner: &mut Inner,
        ctx: &Ctx,
        at: Target,
        opts: &DeleteOpts,
    ) -> ApiResult<Deleted> {
        let (ri, key) = (at.ri, at.key());
        let Some(old) = inner.get(&at.res(), &key) else {
            return Err(ApiError::not_found(ri, at.name));
        };
        check_preconditions(at, &old, opts)?;
        if ctx.dry_run {
            return Ok(Deleted::Pending(old));
        }
        let is_pod = ri.group.is_empty() && ri.plural == "pods";
        let grace = grace_period(is_pod, &old, opts);
        let uid = meta_str(&old, "uid").unwrap_or("").to_string();
        let already = old.pointer("/metadata/deletionTimestamp").is_some();
        let mut fins = finalizers(&old);
        let propagation = opts
            .propagation
            .clone()
            .unwrap_or_else(|| "Background".into());
        let has_deps = inner.dependents.get(&uid).is_some_and(|s| !s.is_empty());
        if already {
            let cur_grace = old
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if !(is_pod && grace < cur_grace) {
                return Ok(Deleted::Pending(old));
            }
        } else {
            self.propagate(inner, &propagation, has_deps, &uid, &mut fins)?;
        }
        if fins.is_empty() && grace == 0 {
            let rv = inner.next_rv();
            let mut last = (*old).clone();
            meta_mut(&mut last).insert("resourceVersion".into(), json!(rv.to_string()));
            let last = self.remove_obj(inner, ri, &key, last, rv);
            return Ok(Deleted::Gone(last));
        }
        let mut new = (*old).clone();
        self.mark_deleted(&mut new, grace, &fins);
        let rv = inner.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let stored = inner.put(&at.res(), key, new, rv);
        if propagation == "Foreground" && has_deps && !already {
            self.delete_dependents(inner, &uid);
        }
        Ok(Deleted::Pending(stored))
    }

    /// The first delete's propagation policy: orphans the dependents, or holds the owner
    /// with the `foregroundDeletion` finalizer until they are gone.
    fn propagate(
        &self,
        inner: &mut Inner,
        propagation: &str,
        has_deps: bool,
        uid: &str,
        fins: &mut Vec<String>,
    ) -> ApiResult<()> {
        match propagation {
            "Orphan" if has_deps => self.orphan(inner, uid),
            "Foreground" if has_deps => {
                if !fins.iter().any(|f| f == "foregroundDeletion") {
                    fins.push("foregroundDeletion".into());
                }
            }
            "Orphan" | "Foreground" | "Background" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown propagationPolicy {other:?}: use Orphan, Background or Foreground"
                )));
            }
        }
        Ok(())
    }

    /// Marks an object for deletion `grace` seconds from now, holding `fins`.
    fn mark_deleted(&self, obj: &mut Value, grace: i64, fins: &[String]) {
        let now = self.clock.now();
        let m = meta_mut(obj);
        let ts = now
            .checked_add(jiff::SignedDuration::from_secs(grace))
            .unwrap_or(now);
        m.insert("deletionTimestamp".into(), json!(format_time(ts)));
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        if !fins.is_empty() {
            m.insert("finalizers".into(), json!(fins));
        }
    }

    /// Removes an object for good and runs what follows: garbage collection of dependents,
    /// foreground owners' finalizers, CRD unregistration and namespace cleanup.
    fn remove_obj(
        &self,
        inner: &mut Inner,
        ri: &ResourceInfo,
        key: &ObjKey,
        last: Value,
        rv: u64,
    ) -> Arc<Value> {
        let res = (ri.group.clone(), ri.plural.clone());
        let owners: Vec<String> = last
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|o| o.get("uid").and_then(Value::as_str).map(str::to_string))
            .collect();
        let Some(last) = inner.remove(&res, key, last, rv) else {
            return Arc::new(Value::Null);
        };
        let uid = meta_str(&last, "uid").unwrap_or("").to_string();
        self.delete_dependents(inner, &uid);
        for o in owners {
            self.finish_foreground(inner, &o);
        }
        if is_crd(ri) {
            if let Ok(infos) = registry::from_crd(&last)
                && let Some(i) = infos.first()
            {
                purge(inner, &(i.group.clone(), i.plural.clone()), |_| true);
            }
            self.unregister_crd(&last);
        }
        if ri.group.is_empty() && ri.plural == "namespaces" {
            let tables: Vec<ResKey> = inner.tables.keys().cloned().collect();
            for r in tables {
                purge(inner, &r, |k| k.0 == key.1);
            }
        }
        last
    }

    /// Background garbage collection: dependents whose owners are all gone are deleted; others
    /// lose the dangling reference.
    fn delete_dependents(&self, inner: &mut Inner, uid: &str) {
        let deps: BTreeSet<ObjRef> = inner.dependents.get(uid).cloned().unwrap_or_default();
        let gc = Ctx::system(GC_USER);
        for d in deps {
            let Some(obj) = inner.get(&d.res, &d.key) else {
                continue;
            };
            let Some(ri) = self.resolve_any(&d.res) else {
                continue;
            };
            let owner_gone = inner
                .lookup_uid(uid)
                .is_none_or(|o| o.pointer("/metadata/deletionTimestamp").is_some());
            if !owner_gone {
                continue;
            }
            let refs: Vec<Value> = obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let others_alive = refs.iter().any(|r| {
                r.get("uid")
                    .and_then(Value::as_str)
                    .is_some_and(|u| u != uid && inner.lookup_uid(u).is_some())
            });
            if others_alive {
                let mut n = (*obj).clone();
                let kept: Vec<Value> = refs
                    .into_iter()
                    .filter(|r| r.get("uid").and_then(Value::as_str) != Some(uid))
                    .collect();
                meta_mut(&mut n).insert("ownerReferences".into(), json!(kept));
                let _ = self.commit(inner, &gc, &ri, &obj, n, "", false);
            } else if obj.pointer("/metadata/deletionTimestamp").is_none() {
                let at = Target::new(&ri, &d.key.0, &d.key.1, "");
                let _ = self.delete_in(inner, &gc, at, &DeleteOpts::default());
                self.audit(&gc, "delete", at, 200);
            }
        }
    }

    fn finish_foreground(&self, inner: &mut Inner, owner_uid: &str) {
        let Some(owner) = inner.lookup_uid(owner_uid) else {
            return;
        };
        if owner.pointer("/metadata/deletionTimestamp").is_none()
            || !finalizers(&owner).iter().any(|f| f == "foregroundDeletion")
        {
            return;
        }
        let blocking = inner
            .dependents
            .get(owner_uid)
            .is_some_and(|s| !s.is_empty());
        if blocking {
            return;
        }
        let Some(r) = inner.by_uid.get(owner_uid).cloned() else {
            return;
        };
        let Some(ri) = self.resolve_any(&r.res) else {
            return;
        };
        let mut n = (*owner).clone();
        let fins: Vec<String> = finalizers(&owner)
            .into_iter()
            .filter(|f| f != "foregroundDeletion")
            .collect();
        meta_mut(&mut n).insert("finalizers".into(), json!(fins));
        let _ = self.commit(inner, &Ctx::system(GC_USER), &ri, &owner, n, "", false);
    }

    fn orphan(&self, inner: &mut Inner, uid: &str) {
        let deps: BTreeSet<ObjRef> = inner.dependents.get(uid).cloned().unwrap_or_default();
        let gc = Ctx::system(GC_USER);
        for d in deps {
            let (Some(obj), Some(ri)) = (inner.get(&d.res, &d.key), self.resolve_any(&d.res))
            else {
                continue;
            };
            let mut n = (*obj).clone();
            let kept: Vec<Value> = obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|r| r.get("uid").and_then(Value::as_str) != Some(uid))
                .cloned()
                .collect();
            meta_mut(&mut n).insert("ownerReferences".into(), json!(kept));
            let _ = self.commit(inner, &gc, &ri, &obj, n, "", false);
        }
    }

    /// Deletes every object matching the selectors (deletecollection).
    pub fn delete_collection(
        &self,
        ctx: &Ctx,
        ri: &ResourceInfo,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        opts: &DeleteOpts,
    ) -> ApiResult<Vec<Arc<Value>>> {
        let page = self.list(ri, ns, labels, fields, None, None)?;
        let mut out = Vec::new();
        for o in page.items {
            let (n, name) = (
                meta_str(&o, "namespace").unwrap_or(""),
                meta_str(&o, "name").unwrap_or(""),
            );
            if let Ok(d) = self.delete(ctx, ri, n, name, opts) {
                out.push(d.object().clone());
            }
        }
        Ok(out)
    }

    fn pdbs_for(&self, inner: &Inner, pod: &Value) -> Vec<Arc<Value>> {
        let ns = meta_str(pod, "namespace").unwrap_or("");
        let Some(t) = inner
            .tables
            .get(&("policy".to_string(), "poddisruptionbudgets".to_string()))
        else {
            return vec![];
        };
        t.objects
            .range((ns.to_string(), String::new())..)
            .take_while(|(k, _)| k.0 == ns)
            .filter(|(_, p)| {
                LabelSelector::from_object(p.pointer("/spec/selector"))
                    .is_ok_and(|s| s.matches_object(pod))
            })
            .map(|(_, p)| p.clone())
            .collect()
    }

    fn detect_violation(&self, inner: &Inner, ctx: &Ctx, ns: &str, name: &str) {
        let Some(pod) = inner.get(
            &(String::new(), "pods".into()),
            &(ns.to_string(), name.to_string()),
        ) else {
            return;
        };
        if pod.pointer("/metadata/deletionTimestamp").is_some() || !pod_ready(&pod) {
            return;
        }
        for pdb in self.pdbs_for(inner, &pod) {
            if pdb
                .pointer("/status/disruptionsAllowed")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                <= 0
            {
                let v = PdbViolation {
                    time: self.clock.now_string(),
                    user: ctx.user.clone(),
                    namespace: ns.to_string(),
                    pod: name.to_string(),
                    pdb: meta_str(&pdb, "name").unwrap_or("").to_string(),
                };
                tracing::warn!(pod = %name, namespace = %ns, pdb = %v.pdb, user = %v.user, "pod deleted while its PodDisruptionBudget allowed no disruption");
                self.records().violations.push(v);
            }
        }
    }

    /// The Eviction subresource: honours PodDisruptionBudgets (`429` when none is left).
    pub fn evict(
        &self,
        ctx: &Ctx,
        pods: &ResourceInfo,
        ns: &str,
        name: &str,
        body: &Value,
    ) -> ApiResult<Value> {
        let at = Target::new(pods, ns, name, "eviction");
        self.written(ctx, "create", at, |inner| {
            self.evict_in(inner, ctx, at, body)
        })
    }

    fn evict_in(&self, inner: &mut Inner, ctx: &Ctx, at: Target, body: &Value) -> ApiResult<Value> {
        let Some(pod) = inner.get(&(String::new(), "pods".into()), &at.key()) else {
            return Err(ApiError::not_found(at.ri, at.name));
        };
        let opts = DeleteOpts::from_body(body.get("deleteOptions").unwrap_or(&Value::Null));
        let ok = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(ok);
        }
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Pending");
        if !matches!(phase, "Succeeded" | "Failed" | "Pending") {
            let pdbs = self.pdbs_for(inner, &pod);
            if pdbs.len() > 1 {
                return Err(ApiError::new(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                ));
            }
            if let Some(pdb) = pdbs.first() {
                self.take_disruption(inner, pdb, &pod, at.name)?;
            }
        }
        self.delete_in(inner, ctx, Target { sub: "", ..at }, &opts)?;
        Ok(ok)
    }

    /// Spends one of the budget's allowed disruptions on evicting `pod` (recorded in the
    /// budget's `disruptedPods`), or refuses with `429`. An unready pod goes free while the
    /// budget is met.
    fn take_disruption(
        &self,
        inner: &mut Inner,
        pdb: &Arc<Value>,
        pod: &Value,
        name: &str,
    ) -> ApiResult<()> {
        let status =
            |f: &str, default: i64| pdb.pointer(f).and_then(Value::as_i64).unwrap_or(default);
        let gen_ = status("/metadata/generation", 1);
        let observed = status("/status/observedGeneration", 0);
        let allowed = status("/status/disruptionsAllowed", 0);
        let healthy = status("/status/currentHealthy", 0);
        let desired = status("/status/desiredHealthy", 0);
        let pdb_name = meta_str(pdb, "name").unwrap_or("");
        if !pod_ready(pod) && healthy >= desired {
            return Ok(());
        }
        if observed < gen_ {
            return Err(budget_refusal(
                "The disruption budget is still being processed by the server.".into(),
            ));
        }
        if allowed <= 0 {
            return Err(budget_refusal(format!(
                "The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"
            )));
        }
        let mut n = (**pdb).clone();
        n["status"]["disruptionsAllowed"] = json!(allowed - 1);
        if !n["status"]["disruptedPods"].is_object() {
            n["status"]["disruptedPods"] = json!({});
        }
        n["status"]["disruptedPods"][name] = json!(self.clock.now_string());
        let Some(pri) = self.resolve("policy", "v1", "poddisruptionbudgets") else {
            return Err(ApiError::new(
                500,
                "InternalError",
                "poddisruptionbudgets are not served",
            ));
        };
        let ctx = Ctx::system("disruption-controller");
        self.commit(inner, &ctx, &pri, pdb, n, "status", false)?;
        Ok(())
    }

    /// The Binding subresource: assigns a pending pod to a node.
    pub fn bind(
        &self,
        ctx: &Ctx,
        pods: &ResourceInfo,
        ns: &str,
        name: &str,
        node: &str,
    ) -> ApiResult<Arc<Value>> {
        let at = Target::new(pods, ns, name, "binding");
        self.written(ctx, "create", at, |inner| {
            self.bind_in(inner, ctx, at, node)
        })
    }

    fn bind_in(
        &self,
        inner: &mut Inner,
        ctx: &Ctx,
        at: Target,
        node: &str,
    ) -> ApiResult<Arc<Value>> {
        let (pods, name) = (at.ri, at.name);
        let Some(pod) = inner.get(&(String::new(), "pods".into()), &at.key()) else {
            return Err(ApiError::not_found(pods, name));
        };
        if let Some(n) = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict_msg(
                pods,
                name,
                &format!("pod {name} is already assigned to node \"{n}\""),
            ));
        }
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            return Err(ApiError::conflict_msg(
                pods,
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        let mut n = (*pod).clone();
        n["spec"]["nodeName"] = json!(node);
        set_condition(
            &mut n,
            "PodScheduled",
            "True",
            "",
            "",
            &self.clock.now_string(),
        );
        let internal = Ctx {
            user: ctx.user.clone(),
            manager: ctx.manager.clone(),
            dry_run: ctx.dry_run,
        };
        let mut inner_ctx = internal;
        inner_ctx.user = format!("{}{}", INTERNAL_PREFIX, inner_ctx.user);
        let stored = self.commit(inner, &inner_ctx, pods, &pod, n.clone(), "", false)?;
        let cur = stored.clone();
        let mut s = (*cur).clone();
        s["status"] = n["status"].clone();
        self.commit(inner, &inner_ctx, pods, &cur, s, "status", false)
    }

    // ---- in-process helpers for the simulated cluster ----

    /// A snapshot of all objects of a resource (cheap: shares the stored objects).
    pub fn snapshot(&self, group: &str, plural: &str) -> Vec<Arc<Value>> {
        self.read()
            .tables
            .get(&(group.to_string(), plural.to_string()))
            .map(|t| t.objects.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Counts per resource, for progress logs.
    pub fn counts(&self) -> HashMap<String, usize> {
        self.read()
            .tables
            .iter()
            .map(|(k, t)| (format!("{}/{}", k.0, k.1), t.objects.len()))
            .collect()
    }

    /// Writes a status change on behalf of a cluster component (skips admission).
    pub fn system_status(
        &self,
        component: &str,
        ri: &ResourceInfo,
        old: &Arc<Value>,
        new: Value,
    ) -> ApiResult<Arc<Value>> {
        let sub = if ri.status_subresource { "status" } else { "" };
        self.system_write(component, ri, old, new, sub)
    }

    /// Writes a whole object (spec and metadata) on behalf of a cluster component, skipping
    /// admission checks (e.g. the kubelet resetting a node).
    pub fn system_update(
        &self,
        component: &str,
        ri: &ResourceInfo,
        old: &Arc<Value>,
        new: Value,
    ) -> ApiResult<Arc<Value>> {
        self.system_write(component, ri, old, new, "")
    }

    /// A cluster component's write of `new` over `old` through `subresource` (`""` for the
    /// main endpoint): conflicts on a stale resourceVersion, audited as the component.
    fn system_write(
        &self,
        component: &str,
        ri: &ResourceInfo,
        old: &Arc<Value>,
        new: Value,
        subresource: &str,
    ) -> ApiResult<Arc<Value>> {
        let ctx = Ctx::new(&format!("{INTERNAL_PREFIX}system:{component}"), component);
        let (ns, name) = (
            meta_str(old, "namespace").unwrap_or(""),
            meta_str(old, "name").unwrap_or(""),
        );
        let at = Target::new(ri, ns, name, subresource);
        let r = self.locked(|inner| match inner.get(&at.res(), &at.key()) {
            Some(cur) if meta_str(&cur, "resourceVersion") == meta_str(old, "resourceVersion") => {
                self.commit(inner, &ctx, ri, &cur, new, subresource, false)
            }
            Some(_) => Err(ApiError::conflict(ri, name)),
            None => Err(ApiError::not_found(ri, name)),
        });
        if let Ok(o) = &r {
            let (ns, name) = (
                meta_str(o, "namespace").unwrap_or(""),
                meta_str(o, "name").unwrap_or(""),
            );
            let at = Target::new(ri, ns, name, subresource);
            self.audit(&Ctx::system(component), "update", at, 200);
        }
        r
    }
}

/// Whether `ri` is the CustomResourceDefinition resource.
fn is_crd(ri: &ResourceInfo) -> bool {
    ri.group == "apiextensions.k8s.io" && ri.plural == "customresourcedefinitions"
}

/// The namespace a create lands in (the URL's, else the body's), which must exist; `""` for a
/// cluster-scoped resource.
fn create_namespace(inner: &Inner, ri: &ResourceInfo, ns: &str, obj: &Value) -> ApiResult<String> {
    if !ri.namespaced {
        return Ok(String::new());
    }
    let body_ns = meta_str(obj, "namespace").unwrap_or("").to_string();
    let ns = if ns.is_empty() {
        body_ns.clone()
    } else {
        ns.to_string()
    };
    if !body_ns.is_empty() && body_ns != ns {
        return Err(ApiError::bad_request(format!(
            "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({ns})"
        )));
    }
    if ns.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{} must be created in a namespace",
            ri.kind
        )));
    }
    if inner
        .get(
            &(String::new(), "namespaces".into()),
            &(String::new(), ns.clone()),
        )
        .is_none()
    {
        let nsri = ResourceInfo {
            plural: "namespaces".into(),
            group: String::new(),
            ..ri.clone()
        };
        return Err(ApiError::not_found(&nsri, &ns));
    }
    Ok(ns)
}

/// A body's `kind`, when given, must be the resource's.
fn check_kind(ri: &ResourceInfo, obj: &Value) -> ApiResult<()> {
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k != ri.kind => Err(ApiError::bad_request(format!(
            "the kind {k:?} of the body does not match the resource {} (kind {})",
            ri.qualified(),
            ri.kind
        ))),
        _ => Ok(()),
    }
}

/// The metadata the server owns on a new object; `managedFields` is kept only when `managed`.
fn init_meta(
    obj: &mut Value,
    ri: &ResourceInfo,
    name: &str,
    ns: &str,
    uid: &str,
    now: &str,
    managed: bool,
) {
    let m = meta_mut(obj);
    m.insert("name".into(), json!(name));
    if ri.namespaced {
        m.insert("namespace".into(), json!(ns));
    } else {
        m.remove("namespace");
    }
    m.insert("uid".into(), json!(uid));
    m.insert("creationTimestamp".into(), json!(now));
    m.insert("generation".into(), json!(1));
    m.remove("deletionTimestamp");
    m.remove("deletionGracePeriodSeconds");
    m.remove("selfLink");
    if !managed {
        m.remove("managedFields");
    }
}

/// The status and main endpoints write separate parts: a status write keeps everything of
/// `old` but the status (and managedFields when given); a main write of a resource with a
/// status subresource keeps `old`'s status.
fn split_status(ri: &ResourceInfo, old: &Value, mut new: Value, sub: &str, applied: bool) -> Value {
    if sub == "status" {
        let mut n = old.clone();
        match new.get("status") {
            Some(s) => n["status"] = s.clone(),
            None => {
                if let Some(o) = n.as_object_mut() {
                    o.remove("status");
                }
            }
        }
        if applied || new.pointer("/metadata/managedFields").is_some() {
            meta_mut(&mut n).insert(
                "managedFields".into(),
                new.pointer("/metadata/managedFields")
                    .cloned()
                    .unwrap_or(json!([])),
            );
        }
        return n;
    }
    if ri.status_subresource {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    new
}

/// Copies the metadata only the server writes from `old` to `new` (`managedFields` too when
/// `keep_managed`).
fn keep_server_meta(old: &Value, new: &mut Value, keep_managed: bool) {
    let om = old.get("metadata").cloned().unwrap_or(json!({}));
    let m = meta_mut(new);
    for k in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match om.get(k) {
            Some(v) => m.insert(k.into(), v.clone()),
            None => m.remove(k),
        };
    }
    m.insert(
        "resourceVersion".into(),
        om.get("resourceVersion").cloned().unwrap_or(Value::Null),
    );
    if keep_managed {
        m.insert(
            "managedFields".into(),
            om.get("managedFields").cloned().unwrap_or(json!([])),
        );
    }
}

/// `generation` goes up by one when anything but metadata and status changed.
fn bump_generation(old: &Value, new: &mut Value) {
    if spec_part(new) != spec_part(old) {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        meta_mut(new).insert("generation".into(), json!(g + 1));
    }
}

/// Whether a written object marked for deletion can go now: no finalizer left, and not a
/// bound pod still in its grace period.
fn done_deleting(ri: &ResourceInfo, new: &Value) -> bool {
    new.pointer("/metadata/deletionTimestamp").is_some()
        && finalizers(new).is_empty()
        && !(ri.group.is_empty()
            && ri.plural == "pods"
            && new
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                > 0
            && new.pointer("/spec/nodeName").is_some())
}

/// `old` with a JSON, merge or strategic merge patch applied.
fn patched(ri: &ResourceInfo, old: &Value, kind: PatchKind, body: &[u8]) -> ApiResult<Value> {
    let mut doc = old.clone();
    let p: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch body is not valid JSON: {e}")))?;
    match kind {
        PatchKind::Merge => patch::merge(&mut doc, &p),
        PatchKind::Json => {
            patch::json(&mut doc, &p).map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?
        }
        PatchKind::Strategic => {
            if !ri.builtin {
                return Err(ApiError::unsupported_media(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            patch::strategic(&mut doc, &p)
                .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?
        }
        PatchKind::Apply { .. } => {}
    }
    Ok(doc)
}

/// Reads an apply body: the configuration, trimmed to what `at.sub` may write, and its
/// resourceVersion precondition.
fn apply_config(at: Target, body: &[u8]) -> ApiResult<(Value, Option<String>)> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the apply body is not UTF-8"))?;
    let mut cfg: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("the apply body is not valid YAML: {e}")))?;
    if !cfg.is_object() {
        return Err(ApiError::bad_request("the apply body must be an object"));
    }
    if let Some(n) = meta_str(&cfg, "name")
        && n != at.name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({})",
            at.name
        )));
    }
    if cfg.get("apiVersion").is_none() || cfg.get("kind").is_none() {
        return Err(ApiError::bad_request(
            "apiVersion and kind are required in an apply configuration",
        ));
    }
    let precondition = meta_str(&cfg, "resourceVersion").map(str::to_string);
    if let Some(m) = cfg.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    if let Some(o) = cfg.as_object_mut() {
        if at.sub == "status" {
            o.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"));
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                m.retain(|k, _| k == "name" || k == "namespace");
            }
        } else if at.ri.status_subresource {
            o.remove("status");
        }
    }
    Ok((cfg, precondition))
}

/// A delete's uid and resourceVersion preconditions.
fn check_preconditions(at: Target, old: &Value, opts: &DeleteOpts) -> ApiResult<()> {
    if let Some(u) = &opts.uid
        && Some(u.as_str()) != meta_str(old, "uid")
    {
        return Err(ApiError::conflict_msg(
            at.ri,
            at.name,
            &format!(
                "Precondition failed: UID in precondition: {u}, UID in object meta: {}",
                meta_str(old, "uid").unwrap_or("")
            ),
        ));
    }
    if let Some(v) = &opts.resource_version
        && Some(v.as_str()) != meta_str(old, "resourceVersion")
    {
        return Err(ApiError::conflict_msg(
            at.ri,
            at.name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {v}, ResourceVersion in object meta: {}",
                meta_str(old, "resourceVersion").unwrap_or("")
            ),
        ));
    }
    Ok(())
}

/// The grace period of a delete: a running pod on a node gets the requested one, else its
/// own (30 s by default); anything else goes at once.
fn grace_period(is_pod: bool, old: &Value, opts: &DeleteOpts) -> i64 {
    let terminal = matches!(
        old.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    let bound = old
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !(is_pod && bound && !terminal) {
        return 0;
    }
    opts.grace
        .or_else(|| {
            old.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30)
        .max(0)
}

/// The `429` an eviction gets when a disruption budget refuses it, with the reason.
fn budget_refusal(message: String) -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
    );
    e.details = Some(json!({"causes": [{"reason": "DisruptionBudget", "message": message}]}));
    e
}

/// Removes every object of `res` whose key `pick` accepts, each under its own resourceVersion.
fn purge(inner: &mut Inner, res: &ResKey, pick: impl Fn(&ObjKey) -> bool) {
    let keys: Vec<ObjKey> = inner
        .tables
        .get(res)
        .map(|t| t.objects.keys().filter(|k| pick(k)).cloned().collect())
        .unwrap_or_default();
    for k in keys {
        if let Some(o) = inner.get(res, &k) {
            let rv = inner.next_rv();
            let mut l = (*o).clone();
            meta_mut(&mut l).insert("resourceVersion".into(), json!(rv.to_string()));
            inner.remove(res, &k, l, rv);
        }
    }
}

/// Writes by the simulated cluster carry this user prefix and skip admission.
const INTERNAL_PREFIX: &str = "internal/";

fn internal_write(ctx: &Ctx) -> bool {
    ctx.user.starts_with(INTERNAL_PREFIX)
}

thread_local! {
    static VALIDATOR: kube::core::cel::Validator = kube::core::cel::Validator::new();
}

fn conflicts(ri: &ResourceInfo, name: &str, c: &apply::Conflicts) -> ApiError {
    let mut e = ApiError::new(409, "Conflict", c.message());
    e.details = Some(json!({"name": name, "group": ri.group, "kind": ri.plural,
        "causes": c.0.iter().map(|(m, f)| json!({"type": "FieldManagerConflict",
            "message": format!("conflict with \"{m}\""), "field": f})).collect::<Vec<_>>()}));
    e
}

fn set_crd_status(crd: &mut Value) {
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    crd["status"] = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": "2024-01-01T00:00:00Z"},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": "2024-01-01T00:00:00Z"}
        ]
    });
}

/// Whether a pod's Ready condition is True.
pub fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
}

/// Sets (or replaces) a condition in `status.conditions`; keeps the transition time when the
/// status does not change.
pub fn set_condition(
    obj: &mut Value,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: &str,
) {
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    if !obj["status"]["conditions"].is_array() {
        obj["status"]["conditions"] = json!([]);
    }
    let Some(list) = obj["status"]["conditions"].as_array_mut() else {
        return;
    };
    let mut c = json!({"type": type_, "status": status, "lastTransitionTime": now});
    if !reason.is_empty() {
        c["reason"] = json!(reason);
    }
    if !message.is_empty() {
        c["message"] = json!(message);
    }
    match list
        .iter_mut()
        .find(|x| x.get("type").and_then(Value::as_str) == Some(type_))
    {
        Some(x) => {
            if x.get("status").and_then(Value::as_str) == Some(status) {
                if let Some(t) = x.get("lastTransitionTime").cloned() {
                    c["lastTransitionTime"] = t;
                }
                if let Some(t) = x.get("lastProbeTime").cloned() {
                    c["lastProbeTime"] = t;
                }
            }
            *x = c;
        }
        None => list.push(c),
    }
}
