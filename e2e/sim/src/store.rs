//! Object storage: objects as JSON keyed by resource, namespace and name, one global
//! resourceVersion counter, per-resource event history for watch resume, and watch fan-out.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

/// `(group, plural)`: objects of all served versions of a kind share one table.
pub type ResKey = (String, String);
/// `(namespace, name)`; namespace is empty for cluster-scoped kinds.
pub type ObjKey = (String, String);

/// A watch event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change of one object.
#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub object: Arc<Value>,
    /// The object before the change (for selector transitions in watches).
    pub old: Option<Arc<Value>>,
}

/// The objects and the recent history of one resource.
#[derive(Debug)]
pub struct Table {
    pub objects: BTreeMap<ObjKey, Arc<Value>>,
    pub history: VecDeque<Arc<Event>>,
    /// Watches asking for versions at or below this get `410 Gone`.
    pub compacted: u64,
    pub tx: broadcast::Sender<Arc<Event>>,
}

impl Table {
    fn new() -> Self {
        let (tx, _) = broadcast::channel(8192);
        Self {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            tx,
        }
    }
}

/// A reference to a stored object, for the owner index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjRef {
    pub res: ResKey,
    pub key: ObjKey,
}

/// Everything stored, guarded by one lock in [`crate::api::Api`].
#[derive(Debug)]
pub struct Inner {
    pub rv: u64,
    pub tables: HashMap<ResKey, Table>,
    /// owner uid → dependents
    pub dependents: HashMap<String, BTreeSet<ObjRef>>,
    /// uid → object, for owner lookups
    pub by_uid: HashMap<String, ObjRef>,
    pub history_limit: usize,
}

fn uid_of(v: &Value) -> Option<&str> {
    v.pointer("/metadata/uid").and_then(Value::as_str)
}

fn owner_uids(v: &Value) -> Vec<String> {
    v.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|o| o.get("uid").and_then(Value::as_str).map(str::to_string))
        .collect()
}

impl Inner {
    pub fn new(history_limit: usize) -> Self {
        Self {
            rv: 1,
            tables: HashMap::new(),
            dependents: HashMap::new(),
            by_uid: HashMap::new(),
            history_limit,
        }
    }

    pub fn table(&mut self, res: &ResKey) -> &mut Table {
        self.tables.entry(res.clone()).or_insert_with(Table::new)
    }

    pub fn get(&self, res: &ResKey, key: &ObjKey) -> Option<Arc<Value>> {
        self.tables
            .get(res)
            .and_then(|t| t.objects.get(key))
            .cloned()
    }

    pub fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Stores `obj` (whose `metadata.resourceVersion` the caller already set to `rv`) and
    /// records the event.
    pub fn put(&mut self, res: &ResKey, key: ObjKey, obj: Value, rv: u64) -> Arc<Value> {
        let obj = Arc::new(obj);
        let r = ObjRef {
            res: res.clone(),
            key: key.clone(),
        };
        let old = self.table(res).objects.insert(key, obj.clone());
        if let Some(o) = &old {
            for u in owner_uids(o) {
                if let Some(s) = self.dependents.get_mut(&u) {
                    s.remove(&r);
                }
            }
        }
        for u in owner_uids(&obj) {
            self.dependents.entry(u).or_default().insert(r.clone());
        }
        if let Some(u) = uid_of(&obj) {
            self.by_uid.insert(u.to_string(), r);
        }
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(
            res,
            Event {
                rv,
                kind,
                object: obj.clone(),
                old,
            },
        );
        obj
    }

    /// Removes an object; `last` is its final state (with the deletion's resourceVersion).
    pub fn remove(
        &mut self,
        res: &ResKey,
        key: &ObjKey,
        last: Value,
        rv: u64,
    ) -> Option<Arc<Value>> {
        let old = self.table(res).objects.remove(key)?;
        let r = ObjRef {
            res: res.clone(),
            key: key.clone(),
        };
        for u in owner_uids(&old) {
            if let Some(s) = self.dependents.get_mut(&u) {
                s.remove(&r);
                if s.is_empty() {
                    self.dependents.remove(&u);
                }
            }
        }
        if let Some(u) = uid_of(&old) {
            self.by_uid.remove(u);
        }
        let last = Arc::new(last);
        self.record(
            res,
            Event {
                rv,
                kind: EventType::Deleted,
                object: last.clone(),
                old: Some(old),
            },
        );
        Some(last)
    }

    fn record(&mut self, res: &ResKey, ev: Event) {
        let limit = self.history_limit;
        let t = self.table(res);
        let ev = Arc::new(ev);
        t.history.push_back(ev.clone());
        while t.history.len() > limit {
            if let Some(e) = t.history.pop_front() {
                t.compacted = e.rv;
            }
        }
        let _ = t.tx.send(ev);
    }

    /// Forgets all history, as etcd compaction does: older resourceVersions become `410 Gone`.
    pub fn compact(&mut self) {
        let rv = self.rv;
        for t in self.tables.values_mut() {
            t.history.clear();
            t.compacted = rv;
        }
    }

    pub fn lookup_uid(&self, uid: &str) -> Option<Arc<Value>> {
        let r = self.by_uid.get(uid)?;
        self.get(&r.res, &r.key)
    }
}
