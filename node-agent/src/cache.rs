//! The node cache's bookkeeping: each localized resource with its state (fetching, ready,
//! failed with a retry time), the pods using it, the roles it serves, and the space it takes
//! against its namespace's quota and the node's capacity; pure, no I/O.

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::nodestate::LocalizedResource;

use crate::localizer::FetchRequest;
use crate::store::{CacheScope, LocalizedRecord, UnixMillis};

/// A role using cached resources.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RoleKey {
    pub namespace: String,
    pub placement_history: String,
    pub role: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryState {
    Fetching,
    Ready(LocalizedRecord),
    /// Not fetched again before `retry_at`, however many pods ask for it.
    Failed {
        message: String,
        retry_at: UnixMillis,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    pub scope: CacheScope,
    pub name: String,
    pub state: EntryState,
    /// Pod UIDs holding a reference.
    pub users: BTreeSet<String>,
    pub roles: BTreeSet<RoleKey>,
    /// Deletion task scheduled when the last user went away.
    pub release_task: Option<u64>,
    /// Failed fetches in a row (sets the backoff).
    pub failures: u32,
    /// Namespace charged for the space (`None`: a recovered public resource, counted node-wide).
    pub charged_to: Option<String>,
    /// Bytes reserved while fetching: the request's size limit.
    pub reserved: u64,
}

impl CacheEntry {
    /// Space counted against quotas: the size when ready, the limit while fetching.
    fn bytes(&self) -> u64 {
        match &self.state {
            EntryState::Fetching => self.reserved,
            EntryState::Ready(r) => r.size_bytes,
            EntryState::Failed { .. } => 0,
        }
    }
}

/// Space and retry limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Bytes one namespace's resources may take (or reserve while fetching) on the node.
    pub namespace_quota: u64,
    /// Bytes all resources may take on the node.
    pub node_capacity: u64,
    /// First wait after a failed fetch; doubled per failure in a row, up to `backoff_max_ms`.
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            namespace_quota: 20 << 30,
            node_capacity: 100 << 30,
            backoff_base_ms: 10_000,
            backoff_max_ms: 600_000,
        }
    }
}

impl CacheLimits {
    /// Wait before the next attempt after `failures` failed ones in a row.
    pub fn backoff_ms(&self, failures: u32) -> i64 {
        let factor = 2i64
            .checked_pow(failures.saturating_sub(1))
            .unwrap_or(i64::MAX);
        self.backoff_base_ms
            .saturating_mul(factor)
            .min(self.backoff_max_ms)
            .max(0)
    }
}

/// What `acquire` asks the caller to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Start a fetch (record `started` first).
    Fetch,
    /// Already there, on its way, or failed and waiting for its retry time; nothing to do.
    /// `cancel_task` names a pending deletion task that must not delete the resource any more
    /// (it is in use again).
    InUse { cancel_task: Option<u64> },
    /// Not fetched: over the namespace's quota or the node's capacity (the entry is `Failed`).
    Refused(String),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cache {
    entries: BTreeMap<String, CacheEntry>,
}

impl Cache {
    /// The cache as recovery re-registered it (no users until pods acquire again).
    pub fn recovered(localized: &BTreeMap<(CacheScope, String), LocalizedRecord>) -> Cache {
        let entries = localized
            .iter()
            .map(|((scope, path), rec)| {
                let charged_to = match scope {
                    CacheScope::Public => None,
                    CacheScope::Namespace { namespace }
                    | CacheScope::Application { namespace, .. } => Some(namespace.clone()),
                };
                (
                    path.clone(),
                    CacheEntry {
                        scope: scope.clone(),
                        name: rec.name.clone(),
                        state: EntryState::Ready(rec.clone()),
                        users: BTreeSet::new(),
                        roles: BTreeSet::new(),
                        release_task: None,
                        failures: 0,
                        charged_to,
                        reserved: 0,
                    },
                )
            })
            .collect();
        Cache { entries }
    }

    /// Bytes used or reserved, by the namespace `ns` or (None) by everyone.
    pub fn used_bytes(&self, ns: Option<&str>) -> u64 {
        self.entries
            .values()
            .filter(|e| ns.is_none() || e.charged_to.as_deref() == ns)
            .fold(0u64, |sum, e| sum.saturating_add(e.bytes()))
    }

    /// Why `req` may not be fetched now, if it may not.
    fn over_limits(&self, req: &FetchRequest, limits: &CacheLimits) -> Option<String> {
        let ns_used = self.used_bytes(Some(&req.namespace));
        if ns_used.saturating_add(req.max_bytes) > limits.namespace_quota {
            return Some(format!(
                "cache quota: namespace {} has {ns_used} of its {} bytes on this node in use or \
                 reserved, and this resource may take up to {} bytes; lower its maxBytes or wait \
                 for unused resources to expire",
                req.namespace, limits.namespace_quota, req.max_bytes
            ));
        }
        let node_used = self.used_bytes(None);
        if node_used.saturating_add(req.max_bytes) > limits.node_capacity {
            return Some(format!(
                "cache capacity: the node cache has {node_used} of {} bytes in use or reserved, \
                 and this resource may take up to {} bytes",
                limits.node_capacity, req.max_bytes
            ));
        }
        None
    }

    /// A pod of `role` needs `req` at `now`.
    pub fn acquire(
        &mut self,
        pod_uid: &str,
        role: &RoleKey,
        req: &FetchRequest,
        now: UnixMillis,
        limits: &CacheLimits,
    ) -> Acquire {
        if let Some(e) = self.entries.get_mut(&req.local_path) {
            e.users.insert(pod_uid.to_string());
            e.roles.insert(role.clone());
            let due = matches!(e.state, EntryState::Failed { retry_at, .. } if now >= retry_at);
            if !due {
                return Acquire::InUse {
                    cancel_task: e.release_task.take(),
                };
            }
        }
        let refusal = self.over_limits(req, limits);
        let e = self
            .entries
            .entry(req.local_path.clone())
            .or_insert_with(|| CacheEntry {
                scope: req.scope.clone(),
                name: req.name.clone(),
                state: EntryState::Fetching,
                users: BTreeSet::from([pod_uid.to_string()]),
                roles: BTreeSet::from([role.clone()]),
                release_task: None,
                failures: 0,
                charged_to: None,
                reserved: 0,
            });
        match refusal {
            Some(reason) => {
                e.failures = e.failures.saturating_add(1);
                e.state = EntryState::Failed {
                    message: reason.clone(),
                    retry_at: now.saturating_add(limits.backoff_ms(e.failures)),
                };
                Acquire::Refused(reason)
            }
            None => {
                e.state = EntryState::Fetching;
                e.charged_to = Some(req.namespace.clone());
                e.reserved = req.max_bytes;
                Acquire::Fetch
            }
        }
    }

    /// Records the end of a fetch at `now`; a failure waits out its backoff before a retry.
    pub fn fetched(
        &mut self,
        local_path: &str,
        result: Result<LocalizedRecord, String>,
        now: UnixMillis,
        limits: &CacheLimits,
    ) {
        if let Some(e) = self.entries.get_mut(local_path) {
            e.reserved = 0;
            e.state = match result {
                Ok(rec) => {
                    e.failures = 0;
                    EntryState::Ready(rec)
                }
                Err(message) => {
                    e.failures = e.failures.saturating_add(1);
                    EntryState::Failed {
                        message,
                        retry_at: now.saturating_add(limits.backoff_ms(e.failures)),
                    }
                }
            };
        }
    }

    /// Pods holding a failed resource whose retry time has come.
    pub fn due_retries(&self, now: UnixMillis) -> BTreeSet<String> {
        self.entries
            .values()
            .filter(|e| matches!(e.state, EntryState::Failed { retry_at, .. } if now >= retry_at))
            .flat_map(|e| e.users.iter().cloned())
            .collect()
    }

    /// Drops every reference of a pod; returns the paths nobody uses any more.
    pub fn release(&mut self, pod_uid: &str) -> Vec<String> {
        let mut unused = Vec::new();
        for (path, e) in &mut self.entries {
            if e.users.remove(pod_uid) && e.users.is_empty() {
                unused.push(path.clone());
            }
        }
        unused
    }

    /// Unused ready entries that no deletion task covers (e.g. recovered ones nobody re-acquired).
    pub fn unused_untracked(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| e.users.is_empty() && e.release_task.is_none())
            .map(|(p, _)| p.clone())
            .collect()
    }

    pub fn set_release_task(&mut self, local_path: &str, task: u64) {
        if let Some(e) = self.entries.get_mut(local_path) {
            e.release_task = Some(task);
        }
    }

    pub fn in_use(&self, local_path: &str) -> bool {
        self.entries
            .get(local_path)
            .is_some_and(|e| !e.users.is_empty())
    }

    /// Removes an entry (its file was deleted); returns its scope for the store transition.
    pub fn forget(&mut self, local_path: &str) -> Option<CacheScope> {
        self.entries.remove(local_path).map(|e| e.scope)
    }

    pub fn get(&self, local_path: &str) -> Option<&CacheEntry> {
        self.entries.get(local_path)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries a pod holds, with their paths.
    pub fn of_pod<'a>(
        &'a self,
        pod_uid: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a CacheEntry)> + 'a {
        self.entries
            .iter()
            .filter(move |(_, e)| e.users.contains(pod_uid))
    }

    /// One NodeState line per (resource, role).
    pub fn report(&self) -> Vec<LocalizedResource> {
        let mut out = Vec::new();
        for e in self.entries.values() {
            let (state, size, message) = match &e.state {
                EntryState::Fetching => ("Fetching", 0, None),
                EntryState::Ready(r) => (
                    "Localized",
                    i64::try_from(r.size_bytes).unwrap_or(i64::MAX),
                    None,
                ),
                EntryState::Failed { message, .. } => ("Failed", 0, Some(message.clone())),
            };
            let line = |ns: &str, ph: &str, role: &str| LocalizedResource {
                namespace: ns.to_string(),
                placement_history: ph.to_string(),
                role: role.to_string(),
                name: e.name.clone(),
                size_bytes: size,
                state: state.to_string(),
                message: message.clone(),
            };
            if e.roles.is_empty() {
                let (ns, ph) = match &e.scope {
                    CacheScope::Public => ("", ""),
                    CacheScope::Namespace { namespace } => (namespace.as_str(), ""),
                    CacheScope::Application {
                        namespace,
                        placement_history,
                    } => (namespace.as_str(), placement_history.as_str()),
                };
                out.push(line(ns, ph, ""));
            }
            for r in &e.roles {
                out.push(line(&r.namespace, &r.placement_history, &r.role));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::localizer::local_path;

    fn role(r: &str) -> RoleKey {
        RoleKey {
            namespace: "ns".into(),
            placement_history: "hbase".into(),
            role: r.into(),
        }
    }

    fn req(name: &str) -> FetchRequest {
        req_in("ns", name, 100)
    }

    fn req_in(ns: &str, name: &str, max_bytes: u64) -> FetchRequest {
        let sha = "ab".repeat(32);
        let scope = CacheScope::Namespace {
            namespace: ns.into(),
        };
        FetchRequest {
            local_path: local_path(&scope, &sha, name),
            scope,
            name: name.into(),
            url: format!("https://example.com/{name}"),
            sha256: sha,
            max_bytes,
            namespace: ns.into(),
        }
    }

    const L: CacheLimits = CacheLimits {
        namespace_quota: 1_000,
        node_capacity: 1_500,
        backoff_base_ms: 10_000,
        backoff_max_ms: 600_000,
    };

    fn ready(size: u64) -> Result<LocalizedRecord, String> {
        Ok(LocalizedRecord {
            size_bytes: size,
            ..LocalizedRecord::default()
        })
    }

    #[test]
    fn reference_counting_across_pods_and_reuse_cancels_deletion() {
        let mut c = Cache::default();
        let r = req("model");
        assert_eq!(c.acquire("p1", &role("region"), &r, 0, &L), Acquire::Fetch);
        assert_eq!(
            c.acquire("p2", &role("master"), &r, 0, &L),
            Acquire::InUse { cancel_task: None }
        );
        c.fetched(&r.local_path, ready(9), 1, &L);
        assert!(c.release("p1").is_empty(), "p2 still uses it");
        assert!(c.in_use(&r.local_path));
        assert_eq!(c.release("p2"), vec![r.local_path.clone()]);
        assert!(!c.in_use(&r.local_path));
        c.set_release_task(&r.local_path, 7);
        assert!(c.unused_untracked().is_empty());
        // a new pod within retention: the pending deletion is cancelled
        assert_eq!(
            c.acquire("p3", &role("region"), &r, 2, &L),
            Acquire::InUse {
                cancel_task: Some(7)
            }
        );
        let lines = c.report();
        assert_eq!(lines.len(), 2, "one line per role");
        assert!(
            lines
                .iter()
                .all(|l| l.state == "Localized" && l.size_bytes == 9)
        );
    }

    #[test]
    fn a_failed_fetch_is_retried_only_after_its_backoff() {
        let mut c = Cache::default();
        let r = req("bad");
        assert_eq!(c.acquire("p1", &role("region"), &r, 0, &L), Acquire::Fetch);
        c.fetched(&r.local_path, Err("digest mismatch".into()), 1_000, &L);
        let lines = c.report();
        assert_eq!(lines[0].state, "Failed");
        assert_eq!(lines[0].message.as_deref(), Some("digest mismatch"));
        // a storm of pod events before the retry time starts nothing
        let fetches = (0..100)
            .filter(|i| {
                c.acquire(&format!("p{i}"), &role("region"), &r, 1_000 + i * 10, &L)
                    == Acquire::Fetch
            })
            .count();
        assert_eq!(fetches, 0);
        assert!(c.due_retries(10_999).is_empty());
        assert!(c.due_retries(11_000).contains("p1"), "retry due after 10 s");
        assert_eq!(
            c.acquire("p1", &role("region"), &r, 11_000, &L),
            Acquire::Fetch
        );
        // the second failure in a row waits twice as long
        c.fetched(&r.local_path, Err("again".into()), 12_000, &L);
        assert_ne!(
            c.acquire("p1", &role("region"), &r, 31_999, &L),
            Acquire::Fetch
        );
        assert_eq!(
            c.acquire("p1", &role("region"), &r, 32_000, &L),
            Acquire::Fetch
        );
        // a success resets the count
        c.fetched(&r.local_path, ready(5), 33_000, &L);
        assert_eq!(c.get(&r.local_path).unwrap().failures, 0);
        assert_eq!(c.forget(&r.local_path), Some(r.scope.clone()));
        assert!(c.is_empty());
    }

    #[test]
    fn backoff_is_capped_and_never_overflows() {
        assert_eq!(L.backoff_ms(1), 10_000);
        assert_eq!(L.backoff_ms(3), 40_000);
        assert_eq!(L.backoff_ms(10), 600_000);
        assert_eq!(L.backoff_ms(u32::MAX), 600_000);
        let mut c = Cache::default();
        let r = req("x");
        c.acquire("p", &role("r"), &r, i64::MAX - 5, &L);
        c.fetched(&r.local_path, Err("e".into()), i64::MAX - 5, &L);
        assert!(matches!(
            c.get(&r.local_path).unwrap().state,
            EntryState::Failed {
                retry_at: i64::MAX,
                ..
            }
        ));
    }

    #[test]
    fn namespace_quota_and_node_capacity_refuse_before_any_fetch() {
        let mut c = Cache::default();
        let a1 = req_in("a", "one", 600);
        let a2 = req_in("a", "two", 600);
        assert_eq!(c.acquire("p", &role("r"), &a1, 0, &L), Acquire::Fetch);
        // 600 reserved while fetching: another 600 would pass the quota of 1000
        let refused = c.acquire("p", &role("r"), &a2, 0, &L);
        assert!(
            matches!(&refused, Acquire::Refused(m) if m.contains("quota") && m.contains("namespace a")),
            "{refused:?}"
        );
        assert_eq!(c.report().iter().filter(|l| l.state == "Failed").count(), 1);
        // once ready, only the real size counts
        c.fetched(&a1.local_path, ready(100), 1, &L);
        assert_eq!(c.used_bytes(Some("a")), 100);
        assert_eq!(c.acquire("p", &role("r"), &a2, 60_000, &L), Acquire::Fetch);
        // other namespaces have their own quota; the node's capacity (1500) binds them all
        let b1 = req_in("b", "one", 700);
        assert_eq!(c.acquire("q", &role("r"), &b1, 0, &L), Acquire::Fetch);
        let b2 = req_in("b", "two", 200);
        let refused = c.acquire("q", &role("r"), &b2, 0, &L);
        assert!(
            matches!(&refused, Acquire::Refused(m) if m.contains("capacity")),
            "{refused:?}: {} used",
            c.used_bytes(None)
        );
    }
}
