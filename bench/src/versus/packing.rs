//! The yardstick for cost freed: what a cost-first packing of a cluster's pods onto its own nodes
//! keeps per hour (the dearest nodes emptied first, greedily, no node launched).
//!
//! Independent of ebb's planner: resources only (cpu, memory, GPUs, pod slots), no affinity,
//! spread or budgets, so it can keep less than any scaler that honours those; a scaler within 1 %
//! of it has left next to nothing on the table.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};

/// cpu (milli), memory (bytes), GPUs, pods.
pub type Amounts = [i64; 4];

/// A node that may be kept or emptied.
#[derive(Clone, Debug, PartialEq)]
pub struct PackNode {
    pub name: String,
    pub allocatable: Amounts,
    pub per_hour: f64,
}

/// What a pod asks of its node, and whether it can go elsewhere.
#[derive(Clone, Debug, PartialEq)]
pub struct PackPod {
    pub node: String,
    pub requests: Amounts,
    pub kind: PodKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodKind {
    /// Owned by a controller that makes it again elsewhere.
    Movable,
    /// A DaemonSet's: it goes with its node.
    Daemon,
    /// No controller: its node stays.
    Pinned,
}

/// Where a moved pod may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Wherever its requests fit.
    ResourcesOnly,
    /// As [`Rule::ResourcesOnly`], but a pod asking for no GPU is never moved onto a GPU node
    /// (GPU nodes kept for GPU pods, as ebb places moved pods and as tainted GPU pools do).
    GpuNodesForGpuPods,
}

/// The nodes a packing keeps and empties, and what the kept ones cost per hour.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Packing {
    pub kept: Vec<String>,
    pub emptied: Vec<String>,
    pub kept_per_hour: f64,
}

/// Empties nodes dearest first (ties: fewer pods to move, then name): a node goes when every
/// movable pod on it fits on the nodes kept so far, each on the cheapest node with room (ties:
/// the fullest by cpu) that `rule` allows, GPU pods and bigger pods placed first. Passes repeat
/// until none empties.
pub fn cost_first(nodes: &[PackNode], pods: &[PackPod], rule: Rule) -> Packing {
    let index: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut used: Vec<Amounts> = vec![[0; 4]; nodes.len()];
    let mut on: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut pinned = vec![false; nodes.len()];
    for (p, pod) in pods.iter().enumerate() {
        let Some(&n) = index.get(pod.node.as_str()) else {
            continue;
        };
        add(&mut used[n], &pod.requests);
        match pod.kind {
            PodKind::Movable => on[n].push(p),
            PodKind::Pinned => pinned[n] = true,
            PodKind::Daemon => {}
        }
    }
    let mut kept = vec![true; nodes.len()];
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| {
        nodes[b]
            .per_hour
            .total_cmp(&nodes[a].per_hour)
            .then(on[a].len().cmp(&on[b].len()))
            .then(nodes[a].name.cmp(&nodes[b].name))
    });
    let mut changed = true;
    while changed {
        changed = false;
        for &n in &order {
            if !kept[n] || pinned[n] {
                continue;
            }
            if let Some(moves) = empty_one(n, nodes, pods, &kept, &used, &on, rule) {
                for (p, to) in moves {
                    sub(&mut used[n], &pods[p].requests);
                    add(&mut used[to], &pods[p].requests);
                    on[to].push(p);
                }
                on[n].clear();
                kept[n] = false;
                changed = true;
            }
        }
    }
    let mut out = Packing::default();
    for (i, n) in nodes.iter().enumerate() {
        if kept[i] {
            out.kept.push(n.name.clone());
            out.kept_per_hour += n.per_hour;
        } else {
            out.emptied.push(n.name.clone());
        }
    }
    out
}

/// Where each movable pod of node `n` would go, or `None` when one has no room.
fn empty_one(
    n: usize,
    nodes: &[PackNode],
    pods: &[PackPod],
    kept: &[bool],
    used: &[Amounts],
    on: &[Vec<usize>],
    rule: Rule,
) -> Option<Vec<(usize, usize)>> {
    let mut trial = used.to_vec();
    let mut movers = on[n].clone();
    movers.sort_by_key(|&p| {
        let r = pods[p].requests;
        std::cmp::Reverse((r[2], r[0], r[1]))
    });
    let mut moves = Vec::with_capacity(movers.len());
    for p in movers {
        let req = &pods[p].requests;
        let allowed =
            |d: usize| rule == Rule::ResourcesOnly || req[2] > 0 || nodes[d].allocatable[2] == 0;
        let to = (0..nodes.len())
            .filter(|&d| {
                d != n && kept[d] && allowed(d) && fits(&trial[d], req, &nodes[d].allocatable)
            })
            .min_by(|&a, &b| {
                nodes[a]
                    .per_hour
                    .total_cmp(&nodes[b].per_hour)
                    .then(free_cpu(&trial[a], &nodes[a]).cmp(&free_cpu(&trial[b], &nodes[b])))
                    .then(a.cmp(&b))
            })?;
        add(&mut trial[to], req);
        moves.push((p, to));
    }
    Some(moves)
}

fn fits(used: &Amounts, req: &Amounts, alloc: &Amounts) -> bool {
    (0..4).all(|i| used[i] + req[i] <= alloc[i])
}

fn free_cpu(used: &Amounts, node: &PackNode) -> i64 {
    node.allocatable[0] - used[0]
}

fn add(a: &mut Amounts, b: &Amounts) {
    for i in 0..4 {
        a[i] += b[i];
    }
}

fn sub(a: &mut Amounts, b: &Amounts) {
    for i in 0..4 {
        a[i] -= b[i];
    }
}

/// The packing input of a cluster: `nodes` with their price per hour (`price`), and the pods
/// bound to them (terminal pods left out). A quantity that does not parse counts as 0.
pub fn input(
    nodes: &[Node],
    pods: &[Pod],
    price: impl Fn(&Node) -> f64,
    gpu_resource: &str,
) -> (Vec<PackNode>, Vec<PackPod>) {
    let amounts = |m: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >|
     -> Amounts {
        let get = |k: &str, milli: bool| {
            m.and_then(|m| m.get(k))
                .and_then(|q| {
                    if milli {
                        ebb_controller::cluster::quantity::parse_milli(&q.0).ok()
                    } else {
                        ebb_controller::cluster::quantity::parse_units(&q.0).ok()
                    }
                })
                .unwrap_or(0)
        };
        [
            get("cpu", true),
            get("memory", false),
            get(gpu_resource, false),
            get("pods", false),
        ]
    };
    let pack_nodes = nodes
        .iter()
        .filter_map(|n| {
            Some(PackNode {
                name: n.metadata.name.clone()?,
                allocatable: amounts(n.status.as_ref().and_then(|s| s.allocatable.as_ref())),
                per_hour: price(n),
            })
        })
        .collect();
    let pack_pods = pods
        .iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter_map(|p| {
            let spec = p.spec.as_ref()?;
            let node = spec.node_name.clone()?;
            let mut requests = [0, 0, 0, 1];
            for c in &spec.containers {
                let r = amounts(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
                add(&mut requests, &[r[0], r[1], r[2], 0]);
            }
            let owner = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true));
            let kind = match owner.map(|o| o.kind.as_str()) {
                Some("DaemonSet") => PodKind::Daemon,
                Some(_) => PodKind::Movable,
                None => PodKind::Pinned,
            };
            Some(PackPod {
                node,
                requests,
                kind,
            })
        })
        .collect();
    (pack_nodes, pack_pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cpu: i64, gpus: i64, per_hour: f64) -> PackNode {
        PackNode {
            name: name.into(),
            allocatable: [cpu * 1000, 64 << 30, gpus, 110],
            per_hour,
        }
    }

    fn pod(node: &str, cpu_milli: i64, gpus: i64, kind: PodKind) -> PackPod {
        PackPod {
            node: node.into(),
            requests: [cpu_milli, 1 << 30, gpus, 1],
            kind,
        }
    }

    #[test]
    fn the_dearest_node_is_emptied_when_its_pods_fit_on_cheaper_ones() {
        // Two GPU nodes: a dear 8-GPU one and a cheap 2-GPU one, each with one 1-GPU pod.
        let nodes = [node("big", 64, 8, 24.0), node("small", 16, 2, 4.0)];
        let pods = [
            pod("big", 1000, 1, PodKind::Movable),
            pod("small", 1000, 1, PodKind::Movable),
        ];
        let p = cost_first(&nodes, &pods, Rule::ResourcesOnly);
        assert_eq!(p.kept, vec!["small".to_string()]);
        assert_eq!(p.emptied, vec!["big".to_string()]);
        assert!((p.kept_per_hour - 4.0).abs() < 1e-9);
    }

    #[test]
    fn gpu_pods_go_only_where_gpus_are_free_and_pinned_pods_keep_their_node() {
        let nodes = [
            node("gpu-a", 16, 2, 4.0),
            node("gpu-b", 16, 2, 4.0),
            node("cpu", 32, 0, 1.6),
        ];
        let pods = [
            // Both GPUs of gpu-a are in use: its pods cannot go to gpu-b (one GPU free) at once.
            pod("gpu-a", 500, 2, PodKind::Movable),
            pod("gpu-b", 500, 1, PodKind::Movable),
            // A bare pod on the CPU node keeps it.
            pod("cpu", 100, 0, PodKind::Pinned),
            // DaemonSet pods go with their nodes and never block.
            pod("gpu-a", 100, 0, PodKind::Daemon),
            pod("gpu-b", 100, 0, PodKind::Daemon),
        ];
        let p = cost_first(&nodes, &pods, Rule::ResourcesOnly);
        // gpu-b's 1-GPU pod cannot fit on gpu-a (full) nor on the CPU node; both GPU nodes stay.
        assert_eq!(p.emptied, Vec::<String>::new());
        assert!((p.kept_per_hour - 9.6).abs() < 1e-9);
    }

    #[test]
    fn cpu_pods_leave_a_gpu_node_for_cpu_nodes() {
        let nodes = [node("gpu", 64, 8, 24.0), node("cpu", 32, 0, 1.6)];
        let pods = [
            pod("gpu", 12_000, 0, PodKind::Movable),
            pod("gpu", 12_000, 0, PodKind::Movable),
            pod("cpu", 3_000, 0, PodKind::Movable),
        ];
        let p = cost_first(&nodes, &pods, Rule::ResourcesOnly);
        assert_eq!(p.kept, vec!["cpu".to_string()]);
        // A third 12-cpu pod would not fit (32 cpu): then the GPU node stays.
        let mut more = pods.to_vec();
        more.push(pod("gpu", 12_000, 0, PodKind::Movable));
        let p = cost_first(&nodes, &more, Rule::ResourcesOnly);
        assert_eq!(p.emptied, vec!["cpu".to_string()]);
    }

    #[test]
    fn with_gpu_nodes_for_gpu_pods_cpu_pods_go_only_to_cpu_nodes() {
        // The dear GPU node's CPU pod fits on the cheap GPU node's idle cpu, not on the full CPU
        // node: resources only, the dear node is emptied; GPU nodes for GPU pods, it stays.
        let nodes = [
            node("dear", 64, 8, 24.0),
            node("cheap", 64, 8, 16.0),
            node("cpu", 4, 0, 1.6),
        ];
        let pods = [
            pod("dear", 8_000, 0, PodKind::Movable),
            pod("cheap", 1_000, 1, PodKind::Movable),
            pod("cpu", 3_000, 0, PodKind::Movable),
        ];
        let p = cost_first(&nodes, &pods, Rule::ResourcesOnly);
        assert!(p.emptied.contains(&"dear".to_string()), "{p:?}");
        let p = cost_first(&nodes, &pods, Rule::GpuNodesForGpuPods);
        assert!(!p.emptied.contains(&"dear".to_string()), "{p:?}");
        // Its GPU pods still may go anywhere with GPUs.
        let gpu_pods = [
            pod("dear", 1_000, 2, PodKind::Movable),
            pod("cheap", 1_000, 1, PodKind::Movable),
        ];
        let p = cost_first(&nodes, &gpu_pods, Rule::GpuNodesForGpuPods);
        assert!(p.emptied.contains(&"dear".to_string()), "{p:?}");
    }

    #[test]
    fn pod_slots_count() {
        let mut nodes = [node("a", 64, 0, 2.0), node("b", 64, 0, 1.0)];
        nodes[1].allocatable[3] = 2;
        let pods = [
            pod("a", 100, 0, PodKind::Movable),
            pod("a", 100, 0, PodKind::Movable),
            pod("b", 100, 0, PodKind::Movable),
        ];
        // b has room for one more pod only: a cannot be emptied; b can (its pod fits on a).
        let p = cost_first(&nodes, &pods, Rule::ResourcesOnly);
        assert_eq!(p.kept, vec!["a".to_string()]);
        assert!((p.kept_per_hour - 2.0).abs() < 1e-9);
    }
}
