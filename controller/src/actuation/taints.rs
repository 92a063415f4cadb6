//! ebb's node taints: building them (value = unix time set), reading them back, and diffing the
//! soft `deletion-candidate` taint against the candidate set with a per-loop cap. Pure.

use std::collections::BTreeSet;

use ebb_api::names::{TAINT_DELETION_CANDIDATE, TAINT_TO_BE_DELETED};
use k8s_openapi::api::core::v1::{Node, Taint};

/// The two taints ebb puts on nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EbbTaint {
    /// `ebb.dev/deletion-candidate=<unix-ts>:PreferNoSchedule` on nodes in the candidate set.
    Candidate,
    /// `ebb.dev/to-be-deleted=<unix-ts>:NoSchedule` on nodes being drained.
    ToBeDeleted,
}

impl EbbTaint {
    pub fn key(self) -> &'static str {
        match self {
            EbbTaint::Candidate => TAINT_DELETION_CANDIDATE,
            EbbTaint::ToBeDeleted => TAINT_TO_BE_DELETED,
        }
    }

    pub fn effect(self) -> &'static str {
        match self {
            EbbTaint::Candidate => "PreferNoSchedule",
            EbbTaint::ToBeDeleted => "NoSchedule",
        }
    }

    /// The taint, its value the unix time `now` in seconds.
    pub fn at(self, now: jiff::Timestamp) -> Taint {
        Taint {
            key: self.key().to_string(),
            value: Some(now.as_second().to_string()),
            effect: self.effect().to_string(),
            time_added: None,
        }
    }
}

/// The node's taints (empty when it has none).
pub fn taints_of(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

/// True when the node carries the taint (any value, any effect).
pub fn has(node: &Node, taint: EbbTaint) -> bool {
    taints_of(node).iter().any(|t| t.key == taint.key())
}

/// When the taint was set, read from its value; `None` when absent or the value is not a unix
/// time (for example set by hand), in which case callers treat it as "set now".
pub fn since(node: &Node, taint: EbbTaint) -> Option<jiff::Timestamp> {
    taints_of(node)
        .iter()
        .find(|t| t.key == taint.key())
        .and_then(|t| t.value.as_deref())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .and_then(|secs| jiff::Timestamp::from_second(secs).ok())
}

/// `taints` with `taint` added (replacing one with the same key), or `None` when a taint with
/// that key and effect is already there (nothing to write).
pub fn with(taints: &[Taint], taint: EbbTaint, now: jiff::Timestamp) -> Option<Vec<Taint>> {
    if taints
        .iter()
        .any(|t| t.key == taint.key() && t.effect == taint.effect())
    {
        return None;
    }
    let mut out: Vec<Taint> = taints
        .iter()
        .filter(|t| t.key != taint.key())
        .cloned()
        .collect();
    out.push(taint.at(now));
    Some(out)
}

/// `taints` without any taint of that key, or `None` when there is none (nothing to write).
pub fn without(taints: &[Taint], taint: EbbTaint) -> Option<Vec<Taint>> {
    if !taints.iter().any(|t| t.key == taint.key()) {
        return None;
    }
    Some(
        taints
            .iter()
            .filter(|t| t.key != taint.key())
            .cloned()
            .collect(),
    )
}

/// What soft-tainting should do this loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SoftTaintPlan {
    /// Nodes that leave the candidate set: remove the soft taint (done first: never leak).
    pub remove: Vec<String>,
    /// Candidates without the soft taint: add it.
    pub add: Vec<String>,
    /// Changes left for the next loop because of the per-loop cap.
    pub deferred: usize,
    /// Of those, candidates left without the soft taint.
    pub deferred_adds: usize,
}

impl SoftTaintPlan {
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.add.is_empty()
    }
}

/// Diff the soft taint of the policy's `nodes` against `candidates`, at most `cap` changes,
/// removals first. Nodes being drained keep whatever they have (the drain owns them).
pub fn plan_soft_taints<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    candidates: &BTreeSet<String>,
    draining: &BTreeSet<String>,
    cap: usize,
) -> SoftTaintPlan {
    let mut remove = Vec::new();
    let mut add = Vec::new();
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        if draining.contains(name) {
            continue;
        }
        let tainted = has(node, EbbTaint::Candidate);
        let wanted = candidates.contains(name);
        if tainted && !wanted {
            remove.push(name.to_string());
        } else if wanted && !tainted {
            add.push(name.to_string());
        }
    }
    remove.sort();
    add.sort();
    let total = remove.len() + add.len();
    let adds = add.len();
    remove.truncate(cap);
    add.truncate(cap - remove.len());
    let deferred = total - remove.len() - add.len();
    SoftTaintPlan {
        deferred_adds: adds - add.len(),
        remove,
        add,
        deferred,
    }
}

/// Drains wait while candidates lack the soft taint (their pods' replacements would land on the
/// unmarked ones), but at most [`SoftTaintWait::MAX`]: an API server too slow to mark them, or a
/// candidate set that changes every loop, must not hold every drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftTaintWait {
    since: Option<jiff::Timestamp>,
}

impl SoftTaintWait {
    /// The longest wait.
    pub const MAX: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

    /// Whether drains may start at `now`, with `unmarked` candidates left without the soft taint
    /// this loop.
    pub fn drains_may_start(&mut self, unmarked: usize, now: jiff::Timestamp) -> bool {
        if unmarked == 0 {
            self.since = None;
            return true;
        }
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= Self::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::node;

    fn ts(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn taint_value_is_the_unix_time_and_reads_back() {
        let t = EbbTaint::ToBeDeleted.at(ts(1_700_000_000));
        assert_eq!(t.key, "ebb.dev/to-be-deleted");
        assert_eq!(t.effect, "NoSchedule");
        assert_eq!(t.value.as_deref(), Some("1700000000"));
        let n = node("n1").taint(t).build();
        assert_eq!(since(&n, EbbTaint::ToBeDeleted), Some(ts(1_700_000_000)));
        assert_eq!(since(&n, EbbTaint::Candidate), None);
        assert!(has(&n, EbbTaint::ToBeDeleted));
        let hand = node("n2")
            .taint(Taint {
                key: "ebb.dev/to-be-deleted".into(),
                value: Some("soon".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            })
            .build();
        assert!(has(&hand, EbbTaint::ToBeDeleted));
        assert_eq!(since(&hand, EbbTaint::ToBeDeleted), None);
    }

    #[test]
    fn adding_and_removing_keep_foreign_taints() {
        let foreign = Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        };
        let base = vec![foreign.clone()];
        let added = with(&base, EbbTaint::Candidate, ts(5)).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(added[0], foreign);
        assert_eq!(added[1].key, TAINT_DELETION_CANDIDATE);
        assert_eq!(added[1].effect, "PreferNoSchedule");
        assert_eq!(with(&added, EbbTaint::Candidate, ts(9)), None);
        assert_eq!(without(&added, EbbTaint::Candidate), Some(base.clone()));
        assert_eq!(without(&base, EbbTaint::ToBeDeleted), None);
    }

    #[test]
    fn drains_wait_for_the_soft_taints_at_most_a_minute() {
        let mut wait = SoftTaintWait::default();
        assert!(wait.drains_may_start(0, ts(100)), "every candidate marked");
        assert!(!wait.drains_may_start(3, ts(100)), "three unmarked: wait");
        assert!(
            !wait.drains_may_start(1, ts(159)),
            "still within the minute"
        );
        assert!(
            wait.drains_may_start(1, ts(160)),
            "a minute since the wait began"
        );
        assert!(
            wait.drains_may_start(1, ts(170)),
            "and on, until all are marked"
        );
        assert!(wait.drains_may_start(0, ts(171)));
        // Marked once: a later wait starts its own minute.
        assert!(!wait.drains_may_start(2, ts(200)));
        assert!(!wait.drains_may_start(2, ts(259)));
        assert!(wait.drains_may_start(2, ts(260)));
    }

    #[test]
    fn soft_taints_follow_the_candidate_set_within_the_cap() {
        let soft = EbbTaint::Candidate.at(ts(1));
        let nodes = vec![
            node("a").build(),
            node("b").taint(soft.clone()).build(),
            node("c").taint(soft.clone()).build(),
            node("d").build(),
            node("e").build(),
            node("f").taint(soft.clone()).build(),
        ];
        let candidates: BTreeSet<String> = ["a", "b", "d", "e"].map(String::from).into();
        let draining: BTreeSet<String> = ["f".to_string()].into();
        let plan = plan_soft_taints(&nodes, &candidates, &draining, 10);
        assert_eq!(plan.remove, vec!["c"]);
        assert_eq!(plan.add, vec!["a", "d", "e"]);
        assert_eq!(plan.deferred, 0);
        let capped = plan_soft_taints(&nodes, &candidates, &draining, 2);
        assert_eq!(capped.remove, vec!["c"], "removals go first");
        assert_eq!(capped.add, vec!["a"]);
        assert_eq!(capped.deferred, 2);
        assert_eq!(capped.deferred_adds, 2, "d and e wait");
        let removals_only = plan_soft_taints(&nodes, &candidates, &draining, 1);
        assert_eq!(removals_only.deferred_adds, 3);
        assert_eq!(plan.deferred_adds, 0);
        assert!(
            plan_soft_taints(&nodes, &candidates, &draining, 0)
                .add
                .is_empty()
        );
    }
}
