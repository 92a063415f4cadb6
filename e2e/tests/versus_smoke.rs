//! The versus bench's PDB-paced scenario in small, for ebb alone on the real control plane: six
//! nodes with one pod each under a PDB allowing 2 unavailable, judged as the bench judges it.

use std::time::Duration;

use ebb_e2e::versus::{self, Outcome, Scaler, Settings, scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ebb_consolidates_a_pdb_paced_pool_without_breaking_the_budget() {
    let mut s = scenario::pdb_paced(6);
    s.cap = Duration::from_secs(180);
    let settings = Settings {
        scan_interval: Duration::from_secs(2),
        unneeded_time: Duration::from_secs(5),
        ..Settings::default()
    };
    let outcome = versus::run(&s, Scaler::Ebb, &settings).await.unwrap();
    let Outcome::Ran(m) = outcome else {
        panic!("ebb did not run: {outcome:?}");
    };
    eprintln!(
        "{}",
        versus::table(&s, &[(Scaler::Ebb, Outcome::Ran(m.clone()))])
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
}
