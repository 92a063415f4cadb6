//! The scheduler's filter predicates as a reusable checker: "does this pod fit that node now?"
//! against a [`ClusterSnapshot`], sharing results across pods of one scheduling class.
//!
//! Node-static predicates (node condition, unschedulable, nodeSelector, required node affinity,
//! volume node affinity, taints) never change within a snapshot, so they are cached per
//! (class, node). Resources, pod count and host ports are checked against the node's current
//! totals, in O(1) plus the pods on that node. Inter-pod affinity, anti-affinity and topology
//! spread look at the pods in the node's topology domain.

use std::collections::HashMap;

use super::snapshot::ClusterSnapshot;
use super::types::{
    ClassId, NodeId, PodAffinityTerm, PodId, SchedClass, SchedRequirements, SpreadConstraint,
    terms_match,
};

/// Why a pod does not fit a node. The first failing predicate is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unfit {
    /// The node's Ready condition is not True.
    NodeNotReady,
    /// `spec.unschedulable` (cordoned).
    NodeUnschedulable,
    NodeSelector,
    NodeAffinity,
    /// A bound local PersistentVolume's node affinity excludes the node.
    VolumeNodeAffinity,
    /// An untolerated NoSchedule or NoExecute taint.
    Taint,
    InsufficientCpu,
    InsufficientMemory,
    InsufficientEphemeralStorage,
    InsufficientExtendedResource,
    TooManyPods,
    HostPortConflict,
    PodAffinity,
    PodAntiAffinity,
    /// A pod already in the domain has anti-affinity against this pod.
    ExistingPodAntiAffinity,
    TopologySpread,
}

const UNKNOWN: u8 = 0;
const FITS: u8 = 1;

fn static_code(u: Unfit) -> u8 {
    2 + u as u8
}

fn static_unfit(code: u8) -> Unfit {
    const ALL: [Unfit; 6] = [
        Unfit::NodeNotReady,
        Unfit::NodeUnschedulable,
        Unfit::NodeSelector,
        Unfit::NodeAffinity,
        Unfit::VolumeNodeAffinity,
        Unfit::Taint,
    ];
    ALL[(code - 2) as usize]
}

/// Counters of what the checker did, for logs and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckerStats {
    /// Calls of [`PredicateChecker::check`].
    pub checks: u64,
    /// Node-static predicates answered from the class cache.
    pub static_cache_hits: u64,
}

/// Checks whether pods fit nodes of a snapshot. Keep one checker per snapshot (its caches are
/// indexed by the snapshot's class and node ids); create a new one for a new snapshot, and for
/// each loop on a model that watch events change in between.
#[derive(Debug, Default)]
pub struct PredicateChecker {
    /// `static_fit[class][node]`: 0 unknown, 1 fits, else 2 + the failing static predicate.
    static_fit: Vec<Vec<u8>>,
    stats: CheckerStats,
    /// Whether the anti-affinity terms of a class select the pods of another class.
    anti: TermMemo,
    /// Disables the class cache (for the baseline planner in benchmarks).
    no_cache: bool,
}

/// `cells[class][term][other]`: 0 unknown, 1 the `term`-th anti-affinity term of `class` selects
/// the pods of `other`, 2 it does not. A term reads only a pod's namespace and labels, which its
/// class holds.
#[derive(Debug, Default)]
struct TermMemo {
    cells: Vec<Vec<Vec<u8>>>,
}

impl TermMemo {
    fn selects(
        &mut self,
        snap: &ClusterSnapshot,
        (class, t): (ClassId, usize),
        term: &PodAffinityTerm,
        other: ClassId,
    ) -> bool {
        let (c, o) = (class as usize, other as usize);
        if self.cells.len() <= c {
            self.cells.resize(c + 1, Vec::new());
        }
        let terms = &mut self.cells[c];
        if terms.len() <= t {
            terms.resize(t + 1, Vec::new());
        }
        let cells = &mut terms[t];
        if cells.len() <= o {
            cells.resize(o + 1, UNKNOWN);
        }
        match cells[o] {
            UNKNOWN => {
                let req = &snap.class(other).req;
                let yes = term.selects(&req.namespace, &req.labels);
                cells[o] = if yes { 1 } else { 2 };
                yes
            }
            known => known == 1,
        }
    }
}

impl PredicateChecker {
    pub fn new() -> Self {
        Self::default()
    }

    /// A checker that recomputes every predicate on every call (no equivalence-class cache).
    pub fn without_cache() -> Self {
        Self {
            no_cache: true,
            ..Self::default()
        }
    }

    pub fn stats(&self) -> CheckerStats {
        self.stats
    }

    /// Does the pod fit the node, given everything currently placed in the snapshot? The pod's
    /// own current placement is ignored if it is on that node already (it does not count twice).
    pub fn check(&mut self, snap: &ClusterSnapshot, pod: PodId, node: NodeId) -> Result<(), Unfit> {
        self.stats.checks += 1;
        let class_id = snap.pod(pod).class;
        if snap.node_of(pod) == Some(node) {
            return Ok(());
        }
        self.check_static(snap, class_id, node)?;
        let class = snap.class(class_id);
        check_resources(snap, class, node)?;
        check_host_ports(snap, class, node)?;
        if class.is_inter_pod() {
            let memo = (!self.no_cache).then_some(&mut self.anti);
            check_inter_pod(snap, class_id, pod, node, memo)?;
        }
        Ok(())
    }

    /// Node-static predicates only (condition, cordon, selectors, affinity, volumes, taints).
    pub fn check_static(
        &mut self,
        snap: &ClusterSnapshot,
        class: ClassId,
        node: NodeId,
    ) -> Result<(), Unfit> {
        if self.no_cache {
            return static_predicates(snap, snap.class(class), node);
        }
        let c = class as usize;
        if self.static_fit.len() <= c {
            self.static_fit.resize(c + 1, Vec::new());
        }
        let row = &mut self.static_fit[c];
        if row.len() < snap.node_count() {
            row.resize(snap.node_count(), UNKNOWN);
        }
        let code = row[node as usize];
        if code != UNKNOWN {
            self.stats.static_cache_hits += 1;
            return if code == FITS {
                Ok(())
            } else {
                Err(static_unfit(code))
            };
        }
        let result = static_predicates(snap, snap.class(class), node);
        row[node as usize] = match result {
            Ok(()) => FITS,
            Err(u) => static_code(u),
        };
        result
    }
}

fn static_predicates(
    snap: &ClusterSnapshot,
    class: &SchedClass,
    node: NodeId,
) -> Result<(), Unfit> {
    let n = snap.node(node);
    let req = &class.req;
    if !n.ready {
        return Err(Unfit::NodeNotReady);
    }
    if n.unschedulable
        && !req.tolerations.iter().any(|t| {
            t.key.as_deref() == Some("node.kubernetes.io/unschedulable")
                || t.key.is_none() && t.exists
        })
    {
        return Err(Unfit::NodeUnschedulable);
    }
    if !req
        .node_selector
        .iter()
        .all(|(k, v)| n.labels.get(k) == Some(v))
    {
        return Err(Unfit::NodeSelector);
    }
    if !req.node_affinity.is_empty() && !terms_match(&req.node_affinity, &n.name, &n.labels) {
        return Err(Unfit::NodeAffinity);
    }
    if !req
        .volume_node_affinity
        .iter()
        .all(|terms| terms_match(terms, &n.name, &n.labels))
    {
        return Err(Unfit::VolumeNodeAffinity);
    }
    for taint in &n.taints {
        if taint.effect == super::types::TaintEffect::PreferNoSchedule {
            continue;
        }
        if !req.tolerations.iter().any(|t| t.tolerates(taint)) {
            return Err(Unfit::Taint);
        }
    }
    Ok(())
}

fn check_resources(snap: &ClusterSnapshot, class: &SchedClass, node: NodeId) -> Result<(), Unfit> {
    let n = snap.node(node);
    let used = snap.requested(node);
    let r = &class.req.requests;
    if snap.pods_on(node).len() as i64 + 1 > n.max_pods {
        return Err(Unfit::TooManyPods);
    }
    if r.cpu_milli > 0 && used.cpu_milli + r.cpu_milli > n.allocatable.cpu_milli {
        return Err(Unfit::InsufficientCpu);
    }
    if r.memory > 0 && used.memory + r.memory > n.allocatable.memory {
        return Err(Unfit::InsufficientMemory);
    }
    if r.ephemeral_storage > 0
        && used.ephemeral_storage + r.ephemeral_storage > n.allocatable.ephemeral_storage
    {
        return Err(Unfit::InsufficientEphemeralStorage);
    }
    for (name, v) in &r.extended {
        if *v > 0 && used.extended(name) + v > n.allocatable.extended(name) {
            return Err(Unfit::InsufficientExtendedResource);
        }
    }
    Ok(())
}

fn check_host_ports(snap: &ClusterSnapshot, class: &SchedClass, node: NodeId) -> Result<(), Unfit> {
    if class.req.host_ports.is_empty() {
        return Ok(());
    }
    for other in snap.pods_on(node) {
        let theirs = &snap.class_of(*other).req.host_ports;
        if class
            .req
            .host_ports
            .iter()
            .any(|p| theirs.iter().any(|q| p.conflicts(q)))
        {
            return Err(Unfit::HostPortConflict);
        }
    }
    Ok(())
}

/// Pods placed in the topology domain of `node` for `key` (empty when the node lacks the key).
fn domain_pods<'a>(
    snap: &'a ClusterSnapshot,
    node: NodeId,
    key: &str,
) -> Option<impl Iterator<Item = PodId> + 'a> {
    let value = snap.node(node).labels.get(key)?;
    Some(
        snap.domain(key, value)
            .iter()
            .flat_map(move |n| snap.pods_on(*n).iter().copied()),
    )
}

fn check_inter_pod(
    snap: &ClusterSnapshot,
    class_id: ClassId,
    pod: PodId,
    node: NodeId,
    memo: Option<&mut TermMemo>,
) -> Result<(), Unfit> {
    let class = snap.class(class_id);
    check_own_anti_affinity(snap, class_id, pod, node, memo)?;
    if class.targeted_by_anti_affinity {
        check_existing_anti_affinity(snap, &class.req, pod, node)?;
    }
    check_own_affinity(snap, &class.req, pod, node)?;
    check_topology_spread(snap, &class.req, pod, node)
}

/// Whether `term` selects `p`, another pod than `pod`.
fn selects_other(snap: &ClusterSnapshot, term: &PodAffinityTerm, pod: PodId, p: PodId) -> bool {
    p != pod && term.selects(&snap.pod(p).namespace, snap.pod_labels(p))
}

/// This pod's anti-affinity: no selected pod in the domain (whether a term selects a pod is
/// remembered per class when `memo` is given).
fn check_own_anti_affinity(
    snap: &ClusterSnapshot,
    class: ClassId,
    pod: PodId,
    node: NodeId,
    mut memo: Option<&mut TermMemo>,
) -> Result<(), Unfit> {
    for (t, term) in snap.class(class).req.anti_affinity.iter().enumerate() {
        let Some(mut pods) = domain_pods(snap, node, &term.topology_key) else {
            continue;
        };
        let found = match memo.as_deref_mut() {
            Some(m) => {
                pods.any(|p| p != pod && m.selects(snap, (class, t), term, snap.pod(p).class))
            }
            None => pods.any(|p| selects_other(snap, term, pod, p)),
        };
        if found {
            return Err(Unfit::PodAntiAffinity);
        }
    }
    Ok(())
}

/// Other pods' anti-affinity against this pod.
fn check_existing_anti_affinity(
    snap: &ClusterSnapshot,
    req: &SchedRequirements,
    pod: PodId,
    node: NodeId,
) -> Result<(), Unfit> {
    for (cid, other) in snap.classes.iter().enumerate() {
        for term in &other.req.anti_affinity {
            if !term.selects(&req.namespace, &req.labels) {
                continue;
            }
            if let Some(mut pods) = domain_pods(snap, node, &term.topology_key)
                && pods.any(|p| p != pod && snap.pod(p).class as usize == cid)
            {
                return Err(Unfit::ExistingPodAntiAffinity);
            }
        }
    }
    Ok(())
}

/// This pod's affinity: a selected pod in the domain, or (first pod of a group) none anywhere
/// and the pod selects itself.
fn check_own_affinity(
    snap: &ClusterSnapshot,
    req: &SchedRequirements,
    pod: PodId,
    node: NodeId,
) -> Result<(), Unfit> {
    for term in &req.affinity {
        let found = match domain_pods(snap, node, &term.topology_key) {
            None => return Err(Unfit::PodAffinity),
            Some(mut pods) => pods.any(|p| selects_other(snap, term, pod, p)),
        };
        if !found {
            let anywhere = (0..snap.node_count() as NodeId).any(|n| {
                snap.pods_on(n)
                    .iter()
                    .any(|p| selects_other(snap, term, pod, *p))
            });
            if anywhere || !term.selects(&req.namespace, &req.labels) {
                return Err(Unfit::PodAffinity);
            }
        }
    }
    Ok(())
}

/// Hard topology spread: placing the pod here keeps each constraint's skew.
fn check_topology_spread(
    snap: &ClusterSnapshot,
    req: &SchedRequirements,
    pod: PodId,
    node: NodeId,
) -> Result<(), Unfit> {
    for c in &req.spread {
        let Some(value) = snap.node(node).labels.get(&c.topology_key) else {
            return Err(Unfit::TopologySpread);
        };
        let counts = spread_counts(snap, req, c, pod);
        let min = counts.values().copied().min().unwrap_or(0);
        let here = counts.get(value.as_str()).copied().unwrap_or(0);
        let self_match = i64::from(c.selector.matches(&req.labels));
        if here + self_match - min > i64::from(c.max_skew) {
            return Err(Unfit::TopologySpread);
        }
    }
    Ok(())
}

/// Matching pods (other than `pod`) per domain of `c`, over the nodes the pod could select
/// (nodeAffinityPolicy Honor).
fn spread_counts<'a>(
    snap: &'a ClusterSnapshot,
    req: &SchedRequirements,
    c: &SpreadConstraint,
    pod: PodId,
) -> HashMap<&'a str, i64> {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for (i, n) in snap.nodes.iter().enumerate() {
        let Some(v) = n.labels.get(&c.topology_key) else {
            continue;
        };
        if !req
            .node_selector
            .iter()
            .all(|(k, x)| n.labels.get(k) == Some(x))
            || !req.node_affinity.is_empty() && !terms_match(&req.node_affinity, &n.name, &n.labels)
        {
            continue;
        }
        let matching = snap
            .pods_on(i as NodeId)
            .iter()
            .filter(|p| {
                **p != pod
                    && snap.pod(**p).namespace == req.namespace
                    && c.selector.matches(snap.pod_labels(**p))
            })
            .count() as i64;
        *counts.entry(v.as_str()).or_insert(0) += matching;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{NodeBuilder, PodBuilder, node, pod, snapshot, taint};

    /// Whether `candidate` (unplaced) fits node `target` among the placed pods.
    fn fits(
        nodes: Vec<NodeBuilder>,
        placed: Vec<PodBuilder>,
        candidate: PodBuilder,
        target: &str,
    ) -> Result<(), Unfit> {
        let mut all = placed;
        all.push(candidate);
        let s = snapshot(nodes, all);
        let p = (s.pod_count() - 1) as PodId;
        PredicateChecker::new().check(&s, p, s.node_id(target).unwrap())
    }

    fn small() -> NodeBuilder {
        node("n1").cpu("2").mem("4Gi")
    }

    /// Whether `candidate` fits the [`small`] node `n1` among the placed pods.
    fn fits_small(placed: Vec<PodBuilder>, candidate: PodBuilder) -> Result<(), Unfit> {
        fits(vec![small()], placed, candidate, "n1")
    }

    #[test]
    fn resources_count_what_is_placed() {
        assert_eq!(
            fits_small(vec![pod("a").on("n1").cpu("1500m")], pod("b").cpu("500m")),
            Ok(())
        );
        assert_eq!(
            fits_small(vec![pod("a").on("n1").cpu("1500m")], pod("b").cpu("501m")),
            Err(Unfit::InsufficientCpu)
        );
        assert_eq!(
            fits_small(vec![], pod("b").mem("5Gi")),
            Err(Unfit::InsufficientMemory)
        );
        assert_eq!(
            fits_small(vec![], pod("b").resource("nvidia.com/gpu", "1")),
            Err(Unfit::InsufficientExtendedResource)
        );
        assert_eq!(
            fits(
                vec![small().resource("nvidia.com/gpu", "1")],
                vec![],
                pod("b").resource("nvidia.com/gpu", "1"),
                "n1"
            ),
            Ok(())
        );
        assert_eq!(
            fits(
                vec![small().resource("ephemeral-storage", "1Gi")],
                vec![],
                pod("b").resource("ephemeral-storage", "2Gi"),
                "n1"
            ),
            Err(Unfit::InsufficientEphemeralStorage)
        );
        assert_eq!(
            fits(
                vec![small().pods(1)],
                vec![pod("a").on("n1")],
                pod("b"),
                "n1"
            ),
            Err(Unfit::TooManyPods)
        );
    }

    #[test]
    fn init_containers_take_the_max_and_sidecars_and_overhead_add() {
        // max(1, init 1.5) = 1.5 of 2: fits next to 0.5.
        let next_to_half = |candidate| fits_small(vec![pod("a").on("n1").cpu("500m")], candidate);
        assert_eq!(
            next_to_half(pod("b").cpu("1").init_cpu("1500m", false)),
            Ok(())
        );
        assert_eq!(
            next_to_half(pod("b").cpu("1").init_cpu("1600m", false)),
            Err(Unfit::InsufficientCpu)
        );
        // A sidecar runs alongside: 1 + 0.6 > 1.5.
        assert_eq!(
            next_to_half(pod("b").cpu("1").init_cpu("600m", true)),
            Err(Unfit::InsufficientCpu)
        );
        assert_eq!(
            next_to_half(pod("b").cpu("1").overhead_cpu("501m")),
            Err(Unfit::InsufficientCpu)
        );
    }

    #[test]
    fn selectors_and_node_affinity_operators() {
        let n = || vec![small().label("zone", "a").label("gen", "5")];
        assert_eq!(
            fits(n(), vec![], pod("p").node_selector("zone", "a"), "n1"),
            Ok(())
        );
        assert_eq!(
            fits(n(), vec![], pod("p").node_selector("zone", "b"), "n1"),
            Err(Unfit::NodeSelector)
        );
        let cases = [
            ("zone", "In", vec!["a", "b"], true),
            ("zone", "In", vec!["b"], false),
            ("zone", "NotIn", vec!["a"], false),
            ("zone", "NotIn", vec!["b"], true),
            ("zone", "Exists", vec![], true),
            ("disk", "Exists", vec![], false),
            ("disk", "DoesNotExist", vec![], true),
            ("zone", "DoesNotExist", vec![], false),
            ("gen", "Gt", vec!["4"], true),
            ("gen", "Gt", vec!["5"], false),
            ("gen", "Lt", vec!["6"], true),
            ("gen", "Lt", vec!["5"], false),
            ("metadata.name", "In", vec!["n1"], true),
            ("metadata.name", "NotIn", vec!["n1"], false),
        ];
        for (key, op, values, expected) in cases {
            let r = fits(n(), vec![], pod("p").node_affinity(key, op, &values), "n1");
            assert_eq!(r.is_ok(), expected, "{key} {op} {values:?}: {r:?}");
            if !expected {
                assert_eq!(r, Err(Unfit::NodeAffinity));
            }
        }
    }

    #[test]
    fn taints_need_tolerations_except_prefer_no_schedule() {
        let t = |effect: &str| vec![small().taint(taint("dedicated", "db", effect))];
        assert_eq!(
            fits(t("NoSchedule"), vec![], pod("p"), "n1"),
            Err(Unfit::Taint)
        );
        assert_eq!(
            fits(t("NoExecute"), vec![], pod("p"), "n1"),
            Err(Unfit::Taint)
        );
        assert_eq!(fits(t("PreferNoSchedule"), vec![], pod("p"), "n1"), Ok(()));
        assert_eq!(
            fits(
                t("NoSchedule"),
                vec![],
                pod("p").tolerate("dedicated", "NoSchedule"),
                "n1"
            ),
            Ok(())
        );
        assert_eq!(
            fits(
                t("NoExecute"),
                vec![],
                pod("p").tolerate("dedicated", "NoSchedule"),
                "n1"
            ),
            Err(Unfit::Taint)
        );
        assert_eq!(
            fits(
                t("NoExecute"),
                vec![],
                pod("p").tolerate("dedicated", ""),
                "n1"
            ),
            Ok(())
        );
    }

    #[test]
    fn node_state_host_ports_and_volumes() {
        assert_eq!(
            fits(vec![small().not_ready()], vec![], pod("p"), "n1"),
            Err(Unfit::NodeNotReady)
        );
        assert_eq!(
            fits(vec![small().unschedulable()], vec![], pod("p"), "n1"),
            Err(Unfit::NodeUnschedulable)
        );
        assert_eq!(
            fits(
                vec![small()],
                vec![pod("a").on("n1").host_port(8080)],
                pod("p").host_port(8080),
                "n1"
            ),
            Err(Unfit::HostPortConflict)
        );
        assert_eq!(
            fits(
                vec![small()],
                vec![pod("a").on("n1").host_port(8080)],
                pod("p").host_port(9090),
                "n1"
            ),
            Ok(())
        );
    }

    #[test]
    fn inter_pod_affinity_anti_affinity_and_spread() {
        let zones = || {
            vec![
                node("a1").cpu("8").label("zone", "a"),
                node("a2").cpu("8").label("zone", "a"),
                node("b1").cpu("8").label("zone", "b"),
            ]
        };
        let web = |n: &str| pod(n).label("app", "web");
        // Own anti-affinity by hostname and by zone.
        let placed = || vec![web("w1").on("a1")];
        let anti_host = web("w2").anti_affinity("app", "web", "kubernetes.io/hostname");
        assert_eq!(
            fits(zones(), placed(), anti_host.clone(), "a1"),
            Err(Unfit::PodAntiAffinity)
        );
        assert_eq!(fits(zones(), placed(), anti_host, "a2"), Ok(()));
        let anti_zone = web("w2").anti_affinity("app", "web", "zone");
        assert_eq!(
            fits(zones(), placed(), anti_zone.clone(), "a2"),
            Err(Unfit::PodAntiAffinity)
        );
        assert_eq!(fits(zones(), placed(), anti_zone, "b1"), Ok(()));
        // An existing pod's anti-affinity keeps others away (symmetry).
        let guard = vec![
            pod("g")
                .on("a1")
                .label("app", "guard")
                .anti_affinity("app", "web", "zone"),
        ];
        assert_eq!(
            fits(zones(), guard.clone(), web("w"), "a2"),
            Err(Unfit::ExistingPodAntiAffinity)
        );
        assert_eq!(fits(zones(), guard, web("w"), "b1"), Ok(()));
        // Affinity: with the cache in zone b only.
        let cache = || vec![pod("c").on("b1").label("app", "cache")];
        let near = pod("p").affinity("app", "cache", "zone");
        assert_eq!(
            fits(zones(), cache(), near.clone(), "a1"),
            Err(Unfit::PodAffinity)
        );
        assert_eq!(fits(zones(), cache(), near, "b1"), Ok(()));
        // First pod of a self-affine group may go anywhere.
        assert_eq!(
            fits(
                zones(),
                vec![],
                web("w").affinity("app", "web", "zone"),
                "a1"
            ),
            Ok(())
        );
        // Spread: zone a has 2, zone b has 0: max skew 1 forbids a third in a.
        let two_in_a = || vec![web("w1").on("a1"), web("w2").on("a2")];
        let spread = web("w3").spread("app", "web", "zone", 1);
        assert_eq!(
            fits(zones(), two_in_a(), spread.clone(), "a1"),
            Err(Unfit::TopologySpread)
        );
        assert_eq!(fits(zones(), two_in_a(), spread, "b1"), Ok(()));
    }

    #[test]
    fn equivalent_pods_share_static_results() {
        let nodes: Vec<NodeBuilder> = (0..10)
            .map(|i| node(&format!("n{i}")).cpu("8").label("pool", "x"))
            .collect();
        let pods: Vec<PodBuilder> = (0..30)
            .map(|i| {
                pod(&format!("web-{i}"))
                    .cpu("100m")
                    .label("app", "web")
                    .node_selector("pool", "x")
                    .owned_by_rs("web")
            })
            .collect();
        let s = snapshot(nodes, pods);
        assert_eq!(s.class_count(), 1, "30 replicas form one class");
        let mut c = PredicateChecker::new();
        for p in 0..30 {
            for n in 0..10 {
                assert!(c.check(&s, p, n).is_ok());
            }
        }
        assert_eq!(c.stats().checks, 300);
        assert_eq!(
            c.stats().static_cache_hits,
            290,
            "only the first pod computes node-static predicates"
        );
    }
}
