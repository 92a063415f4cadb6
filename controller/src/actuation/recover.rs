//! Restart safety: re-derive in-flight drains from ebb's taints and labels, and find every ebb
//! taint no live drain or candidate set accounts for. Pure; the controller runs it at start.

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::names::LABEL_DRAINED;
use k8s_openapi::api::core::v1::Node;

use super::taints::{self, EbbTaint};

/// The one policy that may act on a node (none when unselected, or selected by several).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Governor {
    pub policy: String,
    /// False when the policy is `DryRun`, being deleted, or degraded: it must not drain.
    pub acts: bool,
}

/// A drain to pick up again where the previous controller left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    pub node: String,
    pub policy: String,
    /// From the taint's value; `None` when unreadable (the runner uses "now").
    pub started: Option<jiff::Timestamp>,
}

/// What to do with ebb's marks found on nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Tainted `to-be-deleted` by a policy that still acts on the node: the drain goes on (it
    /// starts again from the re-check, so a node that is no longer removable is rolled back).
    pub resume: Vec<Resume>,
    /// `to-be-deleted` with nothing to carry the drain on: remove the taint (roll back).
    pub untaint_hard: Vec<String>,
    /// `deletion-candidate` on nodes no acting policy governs: remove the taint.
    pub untaint_soft: Vec<String>,
}

/// Re-derive what is in flight. `in_flight` are nodes this process is draining right now.
pub fn recover<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    governors: &BTreeMap<String, Governor>,
    in_flight: &BTreeSet<String>,
) -> Recovery {
    let mut out = Recovery::default();
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        let gov = governors.get(name).filter(|g| g.acts);
        let drained = node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_DRAINED));
        if taints::has(node, EbbTaint::ToBeDeleted) && !in_flight.contains(name) {
            match gov {
                Some(g) if !drained && node.metadata.deletion_timestamp.is_none() => {
                    out.resume.push(Resume {
                        node: name.to_string(),
                        policy: g.policy.clone(),
                        started: taints::since(node, EbbTaint::ToBeDeleted),
                    })
                }
                _ => out.untaint_hard.push(name.to_string()),
            }
        }
        if taints::has(node, EbbTaint::Candidate) && gov.is_none() {
            out.untaint_soft.push(name.to_string());
        }
    }
    out.resume.sort_by(|a, b| a.node.cmp(&b.node));
    out.untaint_hard.sort();
    out.untaint_soft.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::node;

    fn ts(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    fn gov(policy: &str, acts: bool) -> Governor {
        Governor {
            policy: policy.into(),
            acts,
        }
    }

    #[test]
    fn drains_resume_or_roll_back_and_stray_soft_taints_go() {
        let hard = EbbTaint::ToBeDeleted.at(ts(100));
        let soft = EbbTaint::Candidate.at(ts(50));
        let nodes = vec![
            // drained by an acting policy: resumes with its start time
            node("a").taint(hard.clone()).build(),
            // policy in DryRun (or deleted) now: roll back both taints
            node("b").taint(hard.clone()).taint(soft.clone()).build(),
            // nobody governs it any more
            node("c").taint(hard.clone()).build(),
            // already drained (crash after labelling): just untaint
            node("d")
                .label(LABEL_DRAINED, "true")
                .taint(hard.clone())
                .build(),
            // soft taint on a governed node: the per-loop diff owns it
            node("e").taint(soft.clone()).build(),
            // soft taint, ungoverned
            node("f").taint(soft.clone()).build(),
            // in flight in this process: leave alone
            node("g").taint(hard.clone()).build(),
            node("h").build(),
        ];
        let governors: BTreeMap<String, Governor> = [
            ("a", gov("p", true)),
            ("b", gov("q", false)),
            ("d", gov("p", true)),
            ("e", gov("p", true)),
            ("g", gov("p", true)),
            ("h", gov("p", true)),
        ]
        .into_iter()
        .map(|(n, g)| (n.to_string(), g))
        .collect();
        let in_flight: BTreeSet<String> = ["g".to_string()].into();
        let r = recover(&nodes, &governors, &in_flight);
        assert_eq!(
            r.resume,
            vec![Resume {
                node: "a".into(),
                policy: "p".into(),
                started: Some(ts(100)),
            }]
        );
        assert_eq!(r.untaint_hard, vec!["b", "c", "d"]);
        assert_eq!(r.untaint_soft, vec!["b", "f"]);
    }

    #[test]
    fn nothing_to_do_on_a_clean_cluster() {
        let nodes = vec![node("a").build(), node("b").unschedulable().build()];
        assert_eq!(
            recover(&nodes, &BTreeMap::new(), &BTreeSet::new()),
            Recovery::default()
        );
    }
}
