//! The versus bench's PDB-paced scenario in small, for ebb alone on the real control plane: six
//! nodes with one pod each under a PDB allowing 2 unavailable, judged as the bench judges it;
//! once on kwok nodes, once on nodes Karpenter launched (ebb deleting their NodeClaims).

use std::time::Duration;

use ebb_e2e::versus::{self, Column, Measured, Nodes, Outcome, Scaler, Settings, scenario};

async fn run_small(nodes: Nodes) -> Measured {
    let mut s = scenario::pdb_paced(6);
    s.cap = Duration::from_secs(180);
    let settings = Settings {
        scan_interval: Duration::from_secs(2),
        unneeded_time: Duration::from_secs(5),
        ..Settings::default()
    };
    let column = Column::new(Scaler::Ebb, nodes);
    let outcome = versus::run_on(&s, column, &settings).await.unwrap();
    let Outcome::Ran(m) = outcome else {
        panic!("ebb did not run: {outcome:?}");
    };
    eprintln!(
        "{}",
        versus::table(&s, &[(column, Outcome::Ran(m.clone()))])
    );
    // Six 250m pods fit on one 4-cpu node: at least half of the pool can go.
    assert!(
        m.node_deletes >= 3,
        "only {} of 6 nodes removed: {m:?}",
        m.node_deletes
    );
    assert_eq!(
        m.nodes_after,
        6 - m.node_deletes,
        "the audit log's Node deletions and the final count agree: {m:?}"
    );
    assert!(m.nodes_after >= 1, "the pods need a node: {m:?}");
    assert_eq!(m.node_launches, 0, "no node was added: {m:?}");
    assert!(!m.cut, "the node count settled before the cap: {m:?}");
    assert!(m.time_to_final.is_some(), "{m:?}");
    // Every pod on a removed node left through the Eviction API, none was deleted directly.
    assert!(m.evictions >= m.node_deletes, "{m:?}");
    assert_eq!(m.direct_pod_deletes, 0, "{m:?}");
    assert_eq!(m.pdb_violations, 0, "{m:?}");
    assert_eq!(m.never_came_back, 0, "{m:?}");
    assert!(
        m.cpu_seconds.is_some_and(|c| c > 0.0),
        "the controller's CPU time was read: {m:?}"
    );
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ebb_consolidates_a_pdb_paced_pool_without_breaking_the_budget() {
    let m = run_small(Nodes::Kwok).await;
    assert_eq!(m.node_claim_deletes, 0, "{m:?}");
}

/// On Karpenter's nodes with their hostname label set to their name: as the KWOK provider
/// leaves them (hostname label = the NodeClaim's name), ebb 0.1.0 abandons every drain (its
/// re-check of a tainted node selects it by that label and finds no node); see
/// docs/performance.md, "Versus Cluster Autoscaler and Karpenter".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ebb_hands_a_pdb_paced_karpenter_pool_back_through_its_node_claims() {
    let m = run_small(Nodes::KarpenterHostnameIsName).await;
    // removal.method Auto on Karpenter's nodes: ebb deleted each removed node's NodeClaim, and
    // Karpenter (with consolidateAfter Never) deleted the Node and nothing else.
    assert_eq!(m.node_claim_deletes, m.node_deletes, "{m:?}");
    assert!(m.karpenter_cpu_seconds.is_some(), "{m:?}");
    assert!(
        m.notes
            .iter()
            .any(|n| n == "Karpenter's disruption decisions: none"),
        "Karpenter disrupted nodes by itself: {:?}",
        m.notes
    );
}
