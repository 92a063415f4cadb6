//! The node cache's bookkeeping: each localized resource with its state (fetching, ready,
//! failed), the pods using it (reference count) and the roles it serves; pure, no I/O.

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::nodestate::LocalizedResource;

use crate::localizer::FetchRequest;
use crate::store::{CacheScope, LocalizedRecord};

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
    Failed(String),
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
}

/// What `acquire` asks the caller to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Start a fetch (record `started` first).
    Fetch,
    /// Already there or on its way; nothing to do. `cancel_task` names a pending deletion task
    /// that must not delete the resource any more (it is in use again).
    InUse { cancel_task: Option<u64> },
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
                (
                    path.clone(),
                    CacheEntry {
                        scope: scope.clone(),
                        name: rec.name.clone(),
                        state: EntryState::Ready(rec.clone()),
                        users: BTreeSet::new(),
                        roles: BTreeSet::new(),
                        release_task: None,
                    },
                )
            })
            .collect();
        Cache { entries }
    }

    /// A pod of `role` needs `req`.
    pub fn acquire(&mut self, pod_uid: &str, role: &RoleKey, req: &FetchRequest) -> Acquire {
        match self.entries.get_mut(&req.local_path) {
            Some(e) => {
                e.users.insert(pod_uid.to_string());
                e.roles.insert(role.clone());
                if matches!(e.state, EntryState::Failed(_)) {
                    e.state = EntryState::Fetching;
                    return Acquire::Fetch;
                }
                Acquire::InUse {
                    cancel_task: e.release_task.take(),
                }
            }
            None => {
                self.entries.insert(
                    req.local_path.clone(),
                    CacheEntry {
                        scope: req.scope.clone(),
                        name: req.name.clone(),
                        state: EntryState::Fetching,
                        users: BTreeSet::from([pod_uid.to_string()]),
                        roles: BTreeSet::from([role.clone()]),
                        release_task: None,
                    },
                );
                Acquire::Fetch
            }
        }
    }

    /// Records the end of a fetch.
    pub fn fetched(&mut self, local_path: &str, result: Result<LocalizedRecord, String>) {
        if let Some(e) = self.entries.get_mut(local_path) {
            e.state = match result {
                Ok(rec) => EntryState::Ready(rec),
                Err(msg) => EntryState::Failed(msg),
            };
        }
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
                EntryState::Ready(r) => ("Localized", r.size_bytes as i64, None),
                EntryState::Failed(m) => ("Failed", 0, Some(m.clone())),
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
        let sha = "ab".repeat(32);
        FetchRequest {
            scope: CacheScope::Public,
            local_path: local_path(&CacheScope::Public, &sha, name),
            name: name.into(),
            url: format!("http://127.0.0.1/{name}"),
            sha256: sha,
            max_bytes: 100,
        }
    }

    #[test]
    fn reference_counting_across_pods_and_reuse_cancels_deletion() {
        let mut c = Cache::default();
        let r = req("model");
        assert_eq!(c.acquire("p1", &role("region"), &r), Acquire::Fetch);
        assert_eq!(
            c.acquire("p2", &role("master"), &r),
            Acquire::InUse { cancel_task: None }
        );
        c.fetched(
            &r.local_path,
            Ok(LocalizedRecord {
                name: "model".into(),
                size_bytes: 9,
                ..LocalizedRecord::default()
            }),
        );
        assert!(c.release("p1").is_empty(), "p2 still uses it");
        assert!(c.in_use(&r.local_path));
        assert_eq!(c.release("p2"), vec![r.local_path.clone()]);
        assert!(!c.in_use(&r.local_path));
        c.set_release_task(&r.local_path, 7);
        assert!(c.unused_untracked().is_empty());
        // a new pod within retention: the pending deletion is cancelled
        assert_eq!(
            c.acquire("p3", &role("region"), &r),
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
    fn failed_fetches_are_reported_and_retried_on_next_acquire() {
        let mut c = Cache::default();
        let r = req("bad");
        assert_eq!(c.acquire("p1", &role("region"), &r), Acquire::Fetch);
        c.fetched(&r.local_path, Err("digest mismatch".into()));
        let lines = c.report();
        assert_eq!(lines[0].state, "Failed");
        assert_eq!(lines[0].message.as_deref(), Some("digest mismatch"));
        assert_eq!(c.acquire("p2", &role("region"), &r), Acquire::Fetch);
        assert_eq!(c.forget(&r.local_path), Some(CacheScope::Public));
        assert!(c.is_empty());
    }
}
