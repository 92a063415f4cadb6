//! The Cluster API hand-off's bookkeeping: ebb's mark on a Machine and the decision, from that
//! mark and the node group's generation, whether the group's replicas still need lowering. Pure.

use ebb_api::names;

/// A node group Cluster API scales: a MachineDeployment, or a MachineSet no deployment owns.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupRef {
    pub kind: GroupKind,
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    MachineDeployment,
    MachineSet,
}

impl GroupKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            GroupKind::MachineDeployment => "MachineDeployment",
            GroupKind::MachineSet => "MachineSet",
        }
    }
}

impl std::fmt::Display for GroupRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// ebb's mark on a Machine (annotation `ebb.dev/removal`): the drained node it removes, the
/// group it scales down and that group's `metadata.generation` before ebb lowered `replicas`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub node: String,
    pub group_kind: GroupKind,
    pub group_name: String,
    pub generation: i64,
}

impl Mark {
    /// The annotation value: `<node>@<Kind>/<name>@<generation>`.
    pub fn value(&self) -> String {
        format!(
            "{}@{}/{}@{}",
            self.node,
            self.group_kind.as_str(),
            self.group_name,
            self.generation
        )
    }

    /// The mark in a Machine's annotations; `None` when absent or not ebb's format.
    pub fn read(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Option<Self> {
        let v = annotations?.get(names::ANNOTATION_MACHINE_REMOVAL)?;
        let mut parts = v.rsplitn(3, '@');
        let generation = parts.next()?.parse().ok()?;
        let group = parts.next()?;
        let node = parts.next()?;
        let (kind, name) = group.split_once('/')?;
        let group_kind = match kind {
            "MachineDeployment" => GroupKind::MachineDeployment,
            "MachineSet" => GroupKind::MachineSet,
            _ => return None,
        };
        (!node.is_empty() && !name.is_empty()).then(|| Mark {
            node: node.to_string(),
            group_kind,
            group_name: name.to_string(),
            generation,
        })
    }

    fn is_for(&self, node: &str, group: &GroupRef) -> bool {
        self.node == node && self.group_kind == group.kind && self.group_name == group.name
    }
}

/// The group as read just before a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupState {
    pub generation: i64,
    pub replicas: i32,
    /// Fewest replicas it keeps: `minNodesPerGroup` or its min-size annotation, the larger.
    pub min: i32,
}

/// The next write of a hand-off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Mark the Machine with this generation, then lower `replicas`.
    Mark(Mark),
    /// The Machine carries the mark for the group's current generation: lower `replicas`
    /// from it (`replicas - 1`).
    Scale { to: i32 },
    /// The group's spec changed since the mark was written: `replicas` was lowered (by this
    /// controller, before a restart).
    AlreadyScaled,
    /// Lowering `replicas` would take the group below its minimum.
    AtMinimum,
}

/// What to do next for `node`'s Machine carrying `mark`, its group being `group` in `state`;
/// `marked_here`: this hand-off wrote that mark (it has not lowered `replicas` yet, whatever
/// the generation says: a newer one is another writer's, and the Machine is marked again).
///
/// The protocol, one group at a time in this process: read the group, mark the Machine with
/// the group's generation, lower `replicas` by one through `/scale` with the resourceVersion
/// read (a conflict re-reads, re-marks and retries). A lowered `replicas` bumps the generation,
/// so after a restart a mark older than the group's generation means "already lowered" and a
/// mark of the current generation means "not yet". Each drained node thus lowers `replicas`
/// exactly once. The one ambiguous case errs on the safe side: if another writer changed the
/// group's spec between ebb's mark and its scale and the controller died right then, the
/// replicas are not lowered (the Machine stays, marked; it is reported stuck).
pub fn next(
    mark: Option<&Mark>,
    marked_here: bool,
    node: &str,
    group: &GroupRef,
    state: &GroupState,
) -> Next {
    match mark.filter(|m| m.is_for(node, group)) {
        Some(m) if m.generation == state.generation => {
            if state.replicas - 1 < state.min {
                Next::AtMinimum
            } else {
                Next::Scale {
                    to: state.replicas - 1,
                }
            }
        }
        Some(m) if m.generation < state.generation && !marked_here => Next::AlreadyScaled,
        _ if state.replicas - 1 < state.min => Next::AtMinimum,
        _ => Next::Mark(Mark {
            node: node.to_string(),
            group_kind: group.kind,
            group_name: group.name.clone(),
            generation: state.generation,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn md() -> GroupRef {
        GroupRef {
            kind: GroupKind::MachineDeployment,
            namespace: "infra".into(),
            name: "md-0".into(),
        }
    }

    fn state(generation: i64, replicas: i32) -> GroupState {
        GroupState {
            generation,
            replicas,
            min: 0,
        }
    }

    fn mark(node: &str, generation: i64) -> Mark {
        Mark {
            node: node.into(),
            group_kind: GroupKind::MachineDeployment,
            group_name: "md-0".into(),
            generation,
        }
    }

    #[test]
    fn the_mark_reads_back() {
        let m = mark("kwok-node-3", 12);
        let ann = [(names::ANNOTATION_MACHINE_REMOVAL.to_string(), m.value())].into();
        assert_eq!(Mark::read(Some(&ann)), Some(m));
        for bad in [
            "",
            "n@MachineDeployment/md@x",
            "n@Pod/p@3",
            "@MachineSet/ms@3",
            "n@ms@3",
        ] {
            let ann = [(
                names::ANNOTATION_MACHINE_REMOVAL.to_string(),
                bad.to_string(),
            )]
            .into();
            assert_eq!(Mark::read(Some(&ann)), None, "{bad}");
        }
    }

    #[test]
    fn a_fresh_machine_is_marked_with_the_groups_generation() {
        assert_eq!(
            next(None, false, "n1", &md(), &state(7, 10)),
            Next::Mark(mark("n1", 7))
        );
        // a mark for another node (or another group) is not ours
        assert_eq!(
            next(Some(&mark("n2", 3)), false, "n1", &md(), &state(7, 10)),
            Next::Mark(mark("n1", 7))
        );
    }

    #[test]
    fn a_restart_between_the_mark_and_the_scale_scales_once() {
        // crashed after the mark: the generation has not moved
        assert_eq!(
            next(Some(&mark("n1", 7)), false, "n1", &md(), &state(7, 10)),
            Next::Scale { to: 9 }
        );
        // crashed after the scale: the generation moved on
        assert_eq!(
            next(Some(&mark("n1", 7)), false, "n1", &md(), &state(8, 9)),
            Next::AlreadyScaled
        );
    }

    #[test]
    fn another_writer_between_the_mark_and_the_scale_means_marking_again() {
        // in this process: our mark of generation 7, but someone scaled the group meanwhile
        assert_eq!(
            next(Some(&mark("n1", 7)), true, "n1", &md(), &state(8, 12)),
            Next::Mark(mark("n1", 8))
        );
    }

    #[test]
    fn the_group_minimum_holds() {
        let at_min = GroupState {
            generation: 7,
            replicas: 3,
            min: 3,
        };
        assert_eq!(next(None, false, "n1", &md(), &at_min), Next::AtMinimum);
        assert_eq!(
            next(Some(&mark("n1", 7)), false, "n1", &md(), &at_min),
            Next::AtMinimum
        );
    }

    proptest! {
        /// k drains of one group, run one after the other by one process that may restart
        /// after any write (re-deriving from the stored mark and group), with other writers
        /// bumping the group's spec between a mark and its scale, lower `replicas` by exactly
        /// k (a foreign write is modelled as a no-op spec change: the generation moves only),
        /// except that a restart right after a foreign write leaves that one node's replica
        /// (never lowers more).
        #[test]
        fn k_removals_lower_replicas_by_exactly_k(
            k in 1usize..8,
            replicas in 8i32..20,
            crash_after in proptest::collection::vec(0u8..3, 8),
            foreign in proptest::collection::vec(any::<bool>(), 8),
        ) {
            let group = md();
            let mut st = state(1, replicas);
            // the documented ambiguity: a foreign spec write, then a restart before ebb's scale
            let ambiguous = (0..k).filter(|i| foreign[*i] && crash_after[*i] == 1).count() as i32;
            for i in 0..k {
                let node = format!("n{i}");
                let mut stored: Option<Mark> = None;
                let mut marked_here = false;
                let mut writes = 0u8;
                loop {
                    match next(stored.as_ref(), marked_here, &node, &group, &st) {
                        Next::Mark(m) => {
                            stored = Some(m);
                            marked_here = true;
                            if foreign[i] && writes == 0 {
                                st.generation += 1; // someone else writes the spec now
                            }
                        }
                        Next::Scale { to } => {
                            st.replicas = to;
                            st.generation += 1;
                            marked_here = false;
                            if crash_after[i] != 2 {
                                break; // done, in process
                            }
                        }
                        Next::AlreadyScaled => break,
                        Next::AtMinimum => prop_assert!(false, "min is 0"),
                    }
                    writes += 1;
                    if writes == crash_after[i] {
                        marked_here = false; // restart: only what is stored survives
                    }
                    prop_assert!(writes < 10, "hand-off does not end");
                }
            }
            prop_assert_eq!(st.replicas, replicas - k as i32 + ambiguous);
        }
    }
}
