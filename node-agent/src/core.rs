//! The agent's state machine: recovery at start (`AgentCore::recover`, the only part doing
//! store and cache I/O besides running deletions) and the reactions to pods, PlacementHistories,
//! finished fetches and the clock. Each reaction returns the transitions to commit before acting.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ebb_api::PlacementHistory;
use ebb_api::placement::{LocalResource, ResourceScope};

use crate::api::{PodView, ResourceView};
use crate::cache::{Acquire, Cache, CacheLimits, EntryState, RoleKey};
use crate::deletion::{DeletionGraph, delete_confined};
use crate::livepod::LivePod;
use crate::localizer::{FetchRequest, local_path};
use crate::membership;
use crate::recovery::{self, RecoveryInput, RecoverySummary};
use crate::report::WindowPolicy;
use crate::state::apply_container_ops;
use crate::store::{
    AppId, AppRecord, CacheScope, ContainerId, ContainerRecord, LoadedState, LocalizedRecord, Op,
    StateStore, StoreError, TokenRecord, UnixMillis,
};
use crate::tokens::Keys;
use crate::transitions::{Membership, container_ops, gone_ops};

/// Default time an unused resource stays cached when no PlacementHistory says otherwise.
pub const DEFAULT_CACHE_RETENTION_MS: i64 = 3_600_000;
/// Longest retention honoured, whatever a PlacementHistory says (the CRD's maximum too).
pub const MAX_CACHE_RETENTION_MS: i64 = ebb_api::placement::MAX_CACHE_RETENTION_SECS * 1_000;
/// Reason on deletion tasks for resources whose last user went away.
pub const REASON_UNUSED: &str = "unused past cache retention";

#[derive(Clone, Debug)]
pub struct CoreConfig {
    pub cache_root: PathBuf,
    /// Upper bound on any resource's size.
    pub max_resource_bytes: u64,
    /// Quota, capacity and retry backoff of the cache.
    pub limits: CacheLimits,
}

/// What a reaction asks for: transitions to commit (first), then fetches to start.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    pub ops: Vec<Op>,
    pub fetches: Vec<FetchRequest>,
}

impl Step {
    pub fn extend(&mut self, other: Step) {
        self.ops.extend(other.ops);
        self.fetches.extend(other.fetches);
    }
}

/// The outcome of recovery, for the report and the logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered {
    pub summary: RecoverySummary,
    pub duration_ms: i64,
    pub files_deleted: usize,
    /// Messages about things skipped (missing successors, undeletable files).
    pub warnings: Vec<String>,
}

pub struct AgentCore {
    pub cfg: CoreConfig,
    pub containers: BTreeMap<ContainerId, ContainerRecord>,
    pub applications: BTreeMap<AppId, AppRecord>,
    pub cache: Cache,
    pub deletions: DeletionGraph,
    pub keys: Keys,
    pub tokens: BTreeMap<String, TokenRecord>,
    histories: Vec<PlacementHistory>,
    live: BTreeMap<String, LivePod>,
    pod_roles: BTreeMap<String, RoleKey>,
}

/// Files under `root`, as relative paths (an absent root has none).
pub fn list_cache_files(root: &Path) -> std::io::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    if !root.exists() {
        return Ok(out);
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let ty = entry.file_type()?;
            let path = entry.path();
            if ty.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(root) {
                if rel == Path::new(crate::cache_fs::MARKER) {
                    continue;
                }
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    Ok(out)
}

/// A duration in milliseconds, saturating (a huge duration cannot wrap negative).
fn millis(d: &ebb_api::KubeDuration) -> i64 {
    i64::try_from(d.as_duration().as_millis()).unwrap_or(i64::MAX)
}

impl AgentCore {
    /// Recovers from the store: loads every subsystem, plans against the live pods and the cache
    /// directory, commits the plan's transitions in one transaction, deletes the files it names.
    pub fn recover(
        cfg: CoreConfig,
        store: &dyn StateStore,
        live: BTreeMap<String, LivePod>,
        now: UnixMillis,
    ) -> Result<(AgentCore, Recovered), StoreError> {
        let started = Instant::now();
        let state = if store.can_recover() {
            store.load_all()?
        } else {
            LoadedState::default()
        };
        let files = list_cache_files(&cfg.cache_root).map_err(|e| {
            StoreError::Read(format!(
                "cannot list the cache directory {}: {e}",
                cfg.cache_root.display()
            ))
        })?;
        let plan = recovery::plan(RecoveryInput {
            state,
            live_pods: &live,
            cache_files: &files,
            now,
        });
        store.apply(&plan.ops)?;
        let mut warnings: Vec<String> = plan
            .missing_successors
            .iter()
            .map(|m| {
                format!(
                    "deletion task {} names missing successor {}; skipped",
                    m.task, m.successor
                )
            })
            .collect();
        let mut files_deleted = 0;
        for f in &plan.delete_files {
            match delete_confined(&cfg.cache_root, f) {
                Ok(true) => files_deleted += 1,
                Ok(false) => {}
                Err(e) => warnings.push(e.to_string()),
            }
        }
        let core = AgentCore {
            cache: Cache::recovered(&plan.localized),
            containers: plan.containers,
            applications: plan.applications,
            deletions: plan.deletions,
            keys: Keys::from_state(&plan.tokens),
            tokens: plan.tokens.containers,
            cfg,
            histories: Vec::new(),
            live: BTreeMap::new(),
            pod_roles: BTreeMap::new(),
        };
        let recovered = Recovered {
            summary: plan.summary,
            duration_ms: started.elapsed().as_millis() as i64,
            files_deleted,
            warnings,
        };
        Ok((core, recovered))
    }

    pub fn live_pods(&self) -> impl Iterator<Item = &String> {
        self.live.keys()
    }

    pub fn histories(&self) -> &[PlacementHistory] {
        &self.histories
    }

    fn history(&self, app: &AppId) -> Option<&PlacementHistory> {
        self.histories.iter().find(|ph| {
            ph.metadata.namespace.as_deref() == Some(&app.namespace)
                && ph.metadata.name.as_deref() == Some(&app.placement_history)
        })
    }

    /// Failure accounting per PlacementHistory.
    pub fn policies(&self) -> BTreeMap<AppId, WindowPolicy> {
        self.histories
            .iter()
            .filter_map(|ph| {
                Some((
                    AppId::new(ph.metadata.namespace.clone()?, ph.metadata.name.clone()?),
                    WindowPolicy {
                        failure_window_ms: millis(&ph.spec.failure_window),
                        short_lived_ms: millis(&ph.spec.short_lived_threshold),
                    },
                ))
            })
            .collect()
    }

    fn retention_ms(&self, scope: &CacheScope, pod_uid: Option<&str>) -> i64 {
        let app = match scope {
            CacheScope::Application {
                namespace,
                placement_history,
            } => Some(AppId::new(namespace, placement_history)),
            _ => pod_uid
                .and_then(|u| self.pod_roles.get(u))
                .map(|r| AppId::new(&r.namespace, &r.placement_history)),
        };
        app.and_then(|a| self.history(&a))
            .map(|ph| millis(&ph.spec.cache_retention))
            .unwrap_or(DEFAULT_CACHE_RETENTION_MS)
            .clamp(0, MAX_CACHE_RETENTION_MS)
    }

    /// New set of PlacementHistories: applications whose history is gone are finished and
    /// cleaned up (their unused app-scoped resources scheduled for deletion after retention).
    pub fn set_histories(&mut self, histories: Vec<PlacementHistory>, now: UnixMillis) -> Step {
        let gone: Vec<AppId> = self
            .applications
            .keys()
            .filter(|app| {
                !histories.iter().any(|ph| {
                    ph.metadata.namespace.as_deref() == Some(&app.namespace)
                        && ph.metadata.name.as_deref() == Some(&app.placement_history)
                })
            })
            .cloned()
            .collect();
        let mut step = Step::default();
        for app in gone {
            step.ops.push(Op::ApplicationFinished(app.clone(), now));
            let retention = self.retention_ms(
                &CacheScope::Application {
                    namespace: app.namespace.clone(),
                    placement_history: app.placement_history.clone(),
                },
                None,
            );
            let paths: Vec<String> = self
                .cache
                .unused_untracked()
                .into_iter()
                .filter(|p| self.cache.get(p).is_some_and(|e| app.owns(&e.scope)))
                .collect();
            for p in paths {
                let (task, op) = self.deletions.create(
                    vec![p.clone()],
                    now.saturating_add(retention),
                    vec![],
                    crate::recovery::REASON_APP_FINISHED,
                );
                self.cache.set_release_task(&p, task.id);
                step.ops.push(op);
            }
            step.ops.push(Op::ApplicationRemoved(app.clone()));
            self.applications.remove(&app);
        }
        self.histories = histories;
        step
    }

    /// A pod on this node was added or changed.
    pub fn observe_pod(&mut self, pod: LivePod, now: UnixMillis) -> Step {
        let mut step = Step::default();
        let found = membership::find(&pod.namespace, &pod.labels, &self.histories)
            .map(|(m, ph, role)| (m, ph.metadata.uid.clone().unwrap_or_default(), role.clone()));
        let membership = found.as_ref().map(|f| &f.0);
        step.ops
            .extend(self.record_containers(&pod, membership, now));
        step.ops.extend(self.record_token(&pod, now));
        if let Some((m, ph_uid, role)) = &found {
            step.ops
                .extend(self.record_application(&pod, m, ph_uid, now));
            let key = self.remember_role(&pod, m);
            if !pod.terminal && !pod.deleting {
                for res in &role.local_resources {
                    step.extend(self.localize(&pod, &key, res, now));
                }
            }
        }
        let done = pod.terminal || pod.deleting;
        let uid = pod.uid.clone();
        self.live.insert(uid.clone(), pod);
        if done {
            step.ops.extend(self.release(&uid, now));
        }
        step
    }

    /// The transitions of each of the pod's containers, applied to the records.
    fn record_containers(
        &mut self,
        pod: &LivePod,
        membership: Option<&Membership>,
        now: UnixMillis,
    ) -> Vec<Op> {
        let mut all = Vec::new();
        let names: BTreeSet<&String> = pod.images.keys().chain(pod.containers.keys()).collect();
        for name in names {
            let id = ContainerId::new(&pod.uid, name);
            let existing = self.containers.get(&id);
            let ops = container_ops(&id, existing, pod, membership, now);
            if !ops.is_empty() {
                apply_container_ops(self.containers.entry(id).or_default(), &ops);
                all.extend(ops);
            }
        }
        all
    }

    /// Stores the pod's token when it is valid, names this pod and is new or changed.
    fn record_token(&mut self, pod: &LivePod, now: UnixMillis) -> Option<Op> {
        let token = pod.token.as_ref()?;
        let claims = self.keys.validate(token, now / 1000).ok()?;
        if claims.pod_uid != pod.uid {
            return None;
        }
        let rec = TokenRecord {
            role: claims.role,
            expires_at: claims.expires_at_secs * 1000,
        };
        if self.tokens.get(&pod.uid) == Some(&rec) {
            return None;
        }
        self.tokens.insert(pod.uid.clone(), rec.clone());
        Some(Op::ContainerTokenStored(pod.uid.clone(), rec))
    }

    /// Records the pod's application the first time one of its pods is seen.
    fn record_application(
        &mut self,
        pod: &LivePod,
        m: &Membership,
        ph_uid: &str,
        now: UnixMillis,
    ) -> Option<Op> {
        let app = AppId::new(&pod.namespace, &m.placement_history);
        if self.applications.contains_key(&app) {
            return None;
        }
        let rec = AppRecord {
            uid: ph_uid.to_string(),
            init_at: now,
            finished_at: None,
        };
        self.applications.insert(app.clone(), rec.clone());
        Some(Op::ApplicationStored(app, rec))
    }

    /// Remembers which role the pod plays (for its resources' retention).
    fn remember_role(&mut self, pod: &LivePod, m: &Membership) -> RoleKey {
        let key = RoleKey {
            namespace: pod.namespace.clone(),
            placement_history: m.placement_history.clone(),
            role: m.role.clone(),
        };
        self.pod_roles.insert(pod.uid.clone(), key.clone());
        key
    }

    /// What the pod needs for one of its role's resources: a fetch, a cancelled deletion, or
    /// nothing (cached, or refused).
    fn localize(
        &mut self,
        pod: &LivePod,
        key: &RoleKey,
        res: &LocalResource,
        now: UnixMillis,
    ) -> Step {
        let mut step = Step::default();
        let req = self.fetch_request(pod, key, res);
        match self
            .cache
            .acquire(&pod.uid, key, &req, now, &self.cfg.limits)
        {
            Acquire::Fetch => {
                step.ops.push(Op::LocalizationStarted {
                    scope: req.scope.clone(),
                    local_path: req.local_path.clone(),
                    request: crate::store::ResourceRequest {
                        name: req.name.clone(),
                        url: req.shown_url(),
                        sha256: req.sha256.clone(),
                        started_at: now,
                    },
                });
                step.fetches.push(req);
            }
            Acquire::InUse { cancel_task } => {
                step.ops
                    .extend(cancel_task.and_then(|t| self.deletions.cancel(t)));
            }
            Acquire::Refused(reason) => {
                tracing::warn!(namespace = %pod.namespace, placement_history = %key.placement_history,
                    resource = %req.name, url = %req.shown_url(), "{reason}");
            }
        }
        step
    }

    /// The fetch of `res` for a pod of `key`'s role, within the agent's size limit.
    fn fetch_request(&self, pod: &LivePod, key: &RoleKey, res: &LocalResource) -> FetchRequest {
        let scope = match res.scope {
            ResourceScope::Public => CacheScope::Public,
            ResourceScope::Namespace => CacheScope::Namespace {
                namespace: pod.namespace.clone(),
            },
            ResourceScope::Application => CacheScope::Application {
                namespace: pod.namespace.clone(),
                placement_history: key.placement_history.clone(),
            },
        };
        let limit = u64::try_from(res.max_bytes)
            .ok()
            .filter(|b| *b > 0)
            .map_or(self.cfg.max_resource_bytes, |b| {
                b.min(self.cfg.max_resource_bytes)
            });
        FetchRequest {
            local_path: local_path(&scope, &res.sha256, &res.name),
            scope,
            name: res.name.clone(),
            url: res.url.clone(),
            sha256: res.sha256.clone(),
            max_bytes: limit,
            namespace: pod.namespace.clone(),
        }
    }

    fn release(&mut self, uid: &str, now: UnixMillis) -> Vec<Op> {
        let mut ops = Vec::new();
        for path in self.cache.release(uid) {
            let Some(scope) = self.cache.get(&path).map(|e| e.scope.clone()) else {
                continue;
            };
            let at = now.saturating_add(self.retention_ms(&scope, Some(uid)));
            let (task, op) = self
                .deletions
                .create(vec![path.clone()], at, vec![], REASON_UNUSED);
            self.cache.set_release_task(&path, task.id);
            ops.push(op);
        }
        ops
    }

    /// Observes every known pod again (after the PlacementHistories changed).
    pub fn reobserve_all(&mut self, now: UnixMillis) -> Step {
        let pods: Vec<LivePod> = self.live.values().cloned().collect();
        let mut step = Step::default();
        for p in pods {
            step.extend(self.observe_pod(p, now));
        }
        step
    }

    /// A pod of this node is gone (deleted, or missing after a relist).
    pub fn pod_gone(&mut self, uid: &str, now: UnixMillis) -> Step {
        let mut step = Step::default();
        let ids: Vec<ContainerId> = self
            .containers
            .keys()
            .filter(|id| id.pod_uid == uid)
            .cloned()
            .collect();
        for id in ids {
            let Some(rec) = self.containers.get_mut(&id) else {
                continue;
            };
            let (_, ops) = gone_ops(&id, rec, now);
            apply_container_ops(rec, &ops);
            if ops.iter().any(|o| matches!(o, Op::ContainerRemoved(_))) {
                self.containers.remove(&id);
            }
            step.ops.extend(ops);
        }
        step.ops.extend(self.release(uid, now));
        if self.tokens.remove(uid).is_some() {
            step.ops.push(Op::ContainerTokenRemoved(uid.to_string()));
        }
        self.live.remove(uid);
        self.pod_roles.remove(uid);
        step
    }

    /// After the first full list of pods following recovery: recovered resources nobody
    /// re-acquired are scheduled for deletion after their retention.
    pub fn after_initial_sync(&mut self, now: UnixMillis) -> Step {
        let mut step = Step::default();
        for path in self.cache.unused_untracked() {
            let Some(scope) = self.cache.get(&path).map(|e| e.scope.clone()) else {
                continue;
            };
            if self.deletions.holds_path(&path) {
                continue;
            }
            let at = now.saturating_add(self.retention_ms(&scope, None));
            let (task, op) = self
                .deletions
                .create(vec![path.clone()], at, vec![], REASON_UNUSED);
            self.cache.set_release_task(&path, task.id);
            step.ops.push(op);
        }
        step
    }

    /// Pods holding a failed resource whose backoff has passed observe again (so they retry).
    pub fn retry_due(&mut self, now: UnixMillis) -> Step {
        let mut step = Step::default();
        for uid in self.cache.due_retries(now) {
            if let Some(pod) = self.live.get(&uid).cloned() {
                step.extend(self.observe_pod(pod, now));
            }
        }
        step
    }

    /// A fetch ended at `now`.
    pub fn fetch_done(
        &mut self,
        req: &FetchRequest,
        result: Result<LocalizedRecord, String>,
        now: UnixMillis,
    ) -> Step {
        let op = match &result {
            Ok(record) => Op::LocalizationCompleted {
                scope: req.scope.clone(),
                local_path: req.local_path.clone(),
                record: record.clone(),
            },
            Err(_) => Op::LocalizationRemoved {
                scope: req.scope.clone(),
                local_path: req.local_path.clone(),
            },
        };
        self.cache
            .fetched(&req.local_path, result, now, &self.cfg.limits);
        Step {
            ops: vec![op],
            fetches: vec![],
        }
    }

    /// Runs the deletion tasks due at `now` (paths still in use are kept) and returns the
    /// transitions recording what was done, and messages about refused or failed deletions.
    pub fn run_due_deletions(&mut self, now: UnixMillis) -> (Vec<Op>, Vec<String>) {
        let mut ops = Vec::new();
        let mut problems = Vec::new();
        for task in self.deletions.due(now) {
            for path in &task.paths {
                if self.cache.in_use(path) {
                    continue;
                }
                match delete_confined(&self.cfg.cache_root, path) {
                    Ok(_) => {
                        if let Some(scope) = self.cache.forget(path) {
                            ops.push(Op::LocalizationRemoved {
                                scope,
                                local_path: path.clone(),
                            });
                        }
                    }
                    Err(e) => problems.push(format!("deletion task {}: {e}", task.id)),
                }
            }
            if let Some(op) = self.deletions.finished(task.id) {
                ops.push(op);
            }
        }
        (ops, problems)
    }

    /// Drops expired token records and container records whose pod is gone and whose ending
    /// fell out of its failure window.
    pub fn expire(&mut self, now: UnixMillis) -> Vec<Op> {
        let mut ops = Vec::new();
        let expired: Vec<String> = self
            .tokens
            .iter()
            .filter(|(_, t)| t.expires_at <= now)
            .map(|(u, _)| u.clone())
            .collect();
        for uid in expired {
            self.tokens.remove(&uid);
            ops.push(Op::ContainerTokenRemoved(uid));
        }
        let policies = self.policies();
        let old: Vec<ContainerId> = self
            .containers
            .iter()
            .filter(|(id, _)| !self.live.contains_key(&id.pod_uid))
            .filter(|(_, rec)| {
                let Some(done) = &rec.completed else {
                    return false;
                };
                let policy = rec
                    .requested
                    .as_ref()
                    .and_then(|r| Some(AppId::new(&r.namespace, r.placement_history.as_ref()?)))
                    .and_then(|a| policies.get(&a).copied())
                    .unwrap_or_default();
                let window = policy.failure_window_ms.max(1);
                done.finished_at < now - now.rem_euclid(window)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in old {
            self.containers.remove(&id);
            ops.push(Op::ContainerRemoved(id));
        }
        ops
    }

    /// The node-local API's view of each known pod with a role.
    pub fn api_pods(&self) -> BTreeMap<String, PodView> {
        self.pod_roles
            .iter()
            .map(|(uid, role)| {
                let resources = self
                    .cache
                    .of_pod(uid)
                    .map(|(path, e)| {
                        let (state, size, p, msg) = match &e.state {
                            EntryState::Ready(r) => (
                                "Localized",
                                r.size_bytes,
                                Some(self.cfg.cache_root.join(path).display().to_string()),
                                None,
                            ),
                            EntryState::Fetching => ("Fetching", 0, None, None),
                            EntryState::Failed { message, .. } => {
                                ("Failed", 0, None, Some(message.clone()))
                            }
                        };
                        ResourceView {
                            name: e.name.clone(),
                            state: state.into(),
                            path: p,
                            size_bytes: size,
                            message: msg,
                        }
                    })
                    .collect();
                (
                    uid.clone(),
                    PodView {
                        role: role.role.clone(),
                        resources,
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
