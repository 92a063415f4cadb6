//! What one loop knows of every node before it simulates: utilisation, hourly cost, node groups
//! and their minimums, the governed nodes, which nodes may receive pods and in which order.

use std::collections::{BTreeMap, BTreeSet};

use super::config::PlannerConfig;
use super::eligibility::{Load, accelerator_count, being_deleted, load};
use super::pricing::{hourly_cost, invalid_cost_annotation};
use crate::cluster::types::TaintEffect;
use crate::cluster::{ClusterSnapshot, NodeId};

/// What one loop knows of every node before it simulates: utilisation, node group, which
/// nodes the policy governs, and the governed nodes per group (all, and being deleted).
pub(super) struct NodeFacts {
    /// Requested share per node ([`Load::share`]), and the threshold it is judged against.
    pub util: Vec<f64>,
    pub loads: Vec<Load>,
    /// Hourly cost per node, where known.
    pub cost: Vec<Option<f64>>,
    /// Governed nodes whose cost annotation cannot be read, by name.
    pub invalid_cost: Vec<String>,
    /// Some governed node has a known hourly cost, or a cost annotation that cannot be read:
    /// costs are reported, and removals ordered by what they save.
    pub priced: bool,
    pub groups: Vec<Option<String>>,
    pub governed: Vec<NodeId>,
    pub group_sizes: BTreeMap<Option<String>, i64>,
    /// Fewest nodes each group keeps (`minNodesPerGroup`, or the group's own minimum).
    pub group_mins: BTreeMap<Option<String>, i64>,
    pub deleting_per_group: BTreeMap<Option<String>, i64>,
}

/// The node group of `n`: its `nodeGroupLabel` value when the policy sets one, else the
/// MachineDeployment, MachineSet or NodePool behind it (none for other nodes).
pub(super) fn group_key(snap: &ClusterSnapshot, cfg: &PlannerConfig, n: NodeId) -> Option<String> {
    let node = snap.node(n);
    match &cfg.node_group_label {
        Some(l) => node.labels.get(l).cloned(),
        None => node.machine.as_ref().and_then(|m| m.group.clone()),
    }
}

/// The minimum size annotated on `n`'s Cluster API node group (when groups come from it).
fn annotated_group_min(snap: &ClusterSnapshot, cfg: &PlannerConfig, n: NodeId) -> Option<i64> {
    match &cfg.node_group_label {
        Some(_) => None,
        None => snap.node(n).machine.as_ref().and_then(|m| m.group_min),
    }
}

impl NodeFacts {
    pub(super) fn gather(
        snap: &ClusterSnapshot,
        cfg: &PlannerConfig,
        deleted: &BTreeSet<String>,
    ) -> Self {
        let nodes = 0..snap.node_count() as NodeId;
        let mut loads: Vec<Load> = nodes
            .clone()
            .map(|n| {
                load(
                    snap,
                    n,
                    cfg.utilization,
                    cfg.utilization_threshold,
                    &cfg.accelerators,
                )
            })
            .collect();
        let util = loads.iter().map(|l| l.share).collect();
        let cost: Vec<Option<f64>> = nodes
            .clone()
            .map(|n| hourly_cost(snap.node(n), cfg.prices.as_ref()))
            .collect();
        // The policy's nodes; narrowed to one by the re-check before a drain, which still judges
        // it against all of them (whether it is dear).
        let selected: Vec<NodeId> = nodes
            .clone()
            .filter(|n| cfg.node_selector.matches(&snap.node(*n).labels))
            .collect();
        let governed: Vec<NodeId> = selected
            .iter()
            .copied()
            .filter(|n| {
                cfg.only_node
                    .as_ref()
                    .is_none_or(|only| *only == snap.node(*n).name)
            })
            .collect();
        let groups: Vec<Option<String>> = nodes.map(|n| group_key(snap, cfg, n)).collect();
        let mut group_sizes = BTreeMap::new();
        let mut group_mins = BTreeMap::new();
        let mut deleting_per_group = BTreeMap::new();
        for &n in &governed {
            *group_sizes.entry(groups[n as usize].clone()).or_insert(0) += 1;
            let min = cfg.limits.group_min(annotated_group_min(snap, cfg, n));
            let at_least = group_mins.entry(groups[n as usize].clone()).or_insert(min);
            *at_least = (*at_least).max(min);
            if being_deleted(snap, n, deleted) {
                *deleting_per_group
                    .entry(groups[n as usize].clone())
                    .or_insert(0) += 1;
            }
        }
        let mut invalid_cost: Vec<String> = governed
            .iter()
            .map(|n| snap.node(*n))
            .filter(|n| invalid_cost_annotation(n))
            .map(|n| n.name.clone())
            .collect();
        invalid_cost.sort();
        let priced =
            !invalid_cost.is_empty() || governed.iter().any(|n| cost[*n as usize].is_some());
        // The policy's accelerator nodes dearer per accelerator than its cheapest ([`Load::dear`]).
        let dear = dear_accelerator_nodes(snap, cfg, &selected, &loads, &cost);
        for (l, d) in loads.iter_mut().zip(dear) {
            l.dear = d;
        }
        NodeFacts {
            util,
            loads,
            cost,
            invalid_cost,
            priced,
            groups,
            governed,
            group_sizes,
            group_mins,
            deleting_per_group,
        }
    }

    /// The node's [`Load`] on `snap` (which may differ from the loop's start: pods re-placed or
    /// planned onto it), with what the loop knows of its price.
    pub fn load(&self, snap: &ClusterSnapshot, n: NodeId, cfg: &PlannerConfig) -> Load {
        Load {
            dear: self.loads[n as usize].dear,
            ..load(
                snap,
                n,
                cfg.utilization,
                cfg.utilization_threshold,
                &cfg.accelerators,
            )
        }
    }

    pub fn group_of(&self, n: NodeId) -> Option<String> {
        self.groups[n as usize].clone()
    }

    /// Fewest nodes `group` keeps.
    pub fn group_min(&self, group: &Option<String>, cfg: &PlannerConfig) -> i64 {
        self.group_mins
            .get(group)
            .copied()
            .unwrap_or(cfg.limits.min_nodes_per_group)
    }

    /// Destinations: nodes with fewer PreferNoSchedule taints first (the scheduler's
    /// TaintToleration score steers pods away from them, ebb's own deletion-candidate taint
    /// included: most pods tolerate none); then nodes without accelerators before accelerator
    /// nodes (pods that need an accelerator fit only on the latter; the others go there only
    /// when no other node has room, so they do not hold an expensive node back); then nodes
    /// that are not dear before dear ones ([`Load::dear`]: pods moved onto a dear accelerator
    /// node would keep it, where cheaper accelerators could hold them); then nodes
    /// this policy will keep (not governed, or above the threshold) before underutilised ones
    /// it may remove next, so that pods do not land on a node only to hold it back for another
    /// round and another `unneededTime`; then, when priced, cheapest per hour first (removals
    /// are tried dearest first, so pods land on the nodes tried last: a pod placed on a dear
    /// node not tried yet would keep it, where its removal saves the most; a node without a
    /// price counts as free); then fullest first (binpacking from the other end of the list).
    pub(super) fn destination_order(&self, snap: &ClusterSnapshot) -> Vec<NodeId> {
        let soft_taints: Vec<usize> = (0..snap.node_count() as NodeId)
            .map(|n| {
                snap.node(n)
                    .taints
                    .iter()
                    .filter(|t| t.effect == TaintEffect::PreferNoSchedule)
                    .count()
            })
            .collect();
        let util = &self.util;
        let mut removable_later = vec![false; snap.node_count()];
        for &n in &self.governed {
            removable_later[n as usize] = self.loads[n as usize].underutilized();
        }
        // Sort keys side by side; names (unique) break ties, so the order is total. Without
        // prices every cost is 0 and the order is the one before prices.
        let cost = |i: usize| {
            if self.priced {
                self.cost[i].unwrap_or(0.0)
            } else {
                0.0
            }
        };
        let mut keyed: Vec<(usize, bool, bool, bool, f64, f64, NodeId)> = (0..snap.node_count()
            as NodeId)
            .map(|n| {
                let i = n as usize;
                let load = &self.loads[i];
                (
                    soft_taints[i],
                    load.accelerator,
                    load.dear,
                    removable_later[i],
                    cost(i),
                    util[i],
                    n,
                )
            })
            .collect();
        keyed.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| a.1.cmp(&b.1))
                .then_with(|| a.2.cmp(&b.2))
                .then_with(|| a.3.cmp(&b.3))
                .then_with(|| a.4.total_cmp(&b.4))
                .then_with(|| b.5.total_cmp(&a.5))
                .then_with(|| snap.node(a.6).name.cmp(&snap.node(b.6).name))
        });
        keyed.into_iter().map(|k| k.6).collect()
    }
}

/// Which of the policy's accelerator nodes (`selected`) cost more per accelerator than the
/// cheapest priced one among them. Moving such a node's accelerator pods onto cheaper
/// accelerators saves money even when its accelerators are more than
/// `acceleratorUtilizationThreshold` in use; in a pool of one price per accelerator none is.
fn dear_accelerator_nodes(
    snap: &ClusterSnapshot,
    cfg: &PlannerConfig,
    selected: &[NodeId],
    loads: &[Load],
    cost: &[Option<f64>],
) -> Vec<bool> {
    let per_accelerator: Vec<(NodeId, f64)> = selected
        .iter()
        .filter(|n| loads[**n as usize].accelerator)
        .filter_map(|&n| {
            let count = accelerator_count(snap, n, &cfg.accelerators);
            let c = cost[n as usize]?;
            (count > 0).then(|| (n, c / count as f64))
        })
        .collect();
    let mut dear = vec![false; snap.node_count()];
    let Some(cheapest) = per_accelerator
        .iter()
        .map(|(_, c)| *c)
        .min_by(f64::total_cmp)
    else {
        return dear;
    };
    for (n, c) in per_accelerator {
        // Prices within a thousandth of each other are one price.
        dear[n as usize] = c > cheapest * 1.001;
    }
    dear
}

/// Nodes no pod may move to: not ready, cordoned or being deleted.
pub(super) fn not_destinations(snap: &ClusterSnapshot, deleted: &BTreeSet<String>) -> Vec<bool> {
    (0..snap.node_count() as NodeId)
        .map(|n| {
            let info = snap.node(n);
            !info.ready || info.unschedulable || being_deleted(snap, n, deleted)
        })
        .collect()
}

/// Candidate order: f64 utilisation compared totally; at equal utilisation, nodes holding warm
/// data for fewer workload roles first (they are cheaper to lose); then the name.
pub(super) fn by_util(
    snap: &ClusterSnapshot,
    util: &[f64],
    a: NodeId,
    b: NodeId,
) -> std::cmp::Ordering {
    let (na, nb) = (snap.node(a), snap.node(b));
    util[a as usize]
        .total_cmp(&util[b as usize])
        .then_with(|| na.warm_roles.cmp(&nb.warm_roles))
        .then_with(|| na.name.cmp(&nb.name))
}
