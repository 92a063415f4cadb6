//! Karpenter's KWOK provider on the real control plane, the ground of `removal.method:
//! Karpenter`: it provisions nodes for pending pods (one NodeClaim each), and deleting a
//! NodeClaim, as ebb does after its drain, makes it terminate that node and no other.
//!
//! Needs the control plane and `karpenter-kwok` (`e2e/k8s/build.sh` and `build.sh peers
//! karpenter`; both are built on demand, and the test fails with the reason when they cannot be).

use std::time::{Duration, Instant};

use ebb_e2e::harness::Backend;
use ebb_e2e::karpenter::{
    self, DISRUPTED_TAINT, Karpenter, NODEPOOL_LABEL, PoolSpec, Provision, Settings,
};
use ebb_e2e::setup::Cluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

const POOL: &str = "karpenter-a";

/// Each step's time, printed at the end (and on failure, up to the step that failed).
struct Steps {
    t0: Instant,
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Steps {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            t0: now,
            last: now,
            done: Vec::new(),
        }
    }

    fn step(&mut self, name: &'static str) -> Duration {
        let now = Instant::now();
        let d = now - self.last;
        self.last = now;
        self.done.push((name, d));
        eprintln!(
            "[{:>7.3}s] {name}: {:.3}s",
            self.t0.elapsed().as_secs_f64(),
            d.as_secs_f64()
        );
        d
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_node_claim_removes_its_node_and_no_other() {
    let mut steps = Steps::new();
    karpenter::build()
        .await
        .expect("karpenter-kwok and its CRDs are needed");
    steps.step("build karpenter-kwok (cached)");
    let c = Cluster::start(Backend::Real, 30.0)
        .await
        .expect("the real control plane is needed");
    steps.step("control plane up");
    let client = c.client().clone();
    karpenter::install_crds(&c.env).await.unwrap();
    steps.step("Karpenter CRDs Established");
    let k = Karpenter::start(&c.env, &Settings::default())
        .await
        .unwrap();
    steps.step("karpenter-kwok ready");

    // Karpenter's own consolidation off: only the NodeClaim's deletion removes a node.
    let pool = PoolSpec::new(POOL);
    assert_eq!(pool.consolidate_after, "Never");
    karpenter::node_pool(&client, &pool).await.unwrap();
    karpenter::wait_node_pool_ready(&client, POOL, Duration::from_secs(30))
        .await
        .unwrap();
    steps.step("NodePool Ready");

    let p = karpenter::provision(&client, &Provision::new("app", POOL, 3))
        .await
        .unwrap();
    steps.step("3 nodes provisioned, pods Running");
    eprintln!("nodes {:?}\nNodeClaims {:?}", p.nodes, p.node_claims);

    // Each node is a NodeClaim's (status.nodeName) and carries the pool's label; three distinct.
    let claims = karpenter::node_claims(&client).await.unwrap();
    assert_eq!(claims.len(), 3, "{claims:?}");
    let nodes_api = Api::<Node>::all(client.clone());
    let mut distinct = p.nodes.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{:?}", p.nodes);
    for (node, claim) in p.nodes.iter().zip(&p.node_claims) {
        let info = claims
            .iter()
            .find(|c| &c.name == claim)
            .unwrap_or_else(|| panic!("NodeClaim {claim} not listed: {claims:?}"));
        assert_eq!(info.node_name.as_deref(), Some(node.as_str()), "{info:?}");
        assert_eq!(info.pool.as_deref(), Some(POOL), "{info:?}");
        assert!(info.ready, "{info:?}");
        let n = nodes_api.get(node).await.unwrap();
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(NODEPOOL_LABEL).map(String::as_str),
            Some(POOL),
            "node {node} labels {labels:?}"
        );
        assert_eq!(
            karpenter::node_claim_of(&client, node)
                .await
                .unwrap()
                .map(|c| c.name),
            Some(claim.clone())
        );
    }

    // ebb's drain: the victim's pod goes (scale-in, no replacement), the node stays.
    let victim = p.nodes[0].clone();
    let victim_claim = p.node_claims[0].clone();
    karpenter::empty_node(&client, &p, &victim).await.unwrap();
    steps.step("victim node emptied");
    assert!(
        nodes_api.get_opt(&victim).await.unwrap().is_some(),
        "Karpenter removed the empty node {victim} by itself (consolidateAfter: Never)"
    );

    // ebb's removal: delete the NodeClaim; Karpenter terminates its node.
    karpenter::delete_node_claim(&client, &victim_claim)
        .await
        .unwrap();
    let gone = karpenter::wait_gone(&client, &victim_claim, &victim, Duration::from_secs(30))
        .await
        .unwrap();
    steps.step("NodeClaim deleted -> NodeClaim and Node gone");
    eprintln!(
        "after the delete: node deleting {:?}, tainted {DISRUPTED_TAINT} {:?}, node gone {:?}, \
         NodeClaim gone {:?}; taints seen {:?}",
        gone.node_deleting, gone.node_disrupted, gone.node_gone, gone.node_claim_gone, gone.taints
    );
    assert!(
        gone.taints
            .iter()
            .any(|t| t == &format!("{DISRUPTED_TAINT}:NoSchedule")),
        "Karpenter should taint a node it terminates {DISRUPTED_TAINT}:NoSchedule; saw {:?}",
        gone.taints
    );
    assert!(
        gone.node_gone <= Duration::from_secs(15)
            && gone.node_claim_gone <= Duration::from_secs(15),
        "termination took too long: {gone:?}"
    );

    // The other two stay (and no replacement comes: nothing is pending).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = karpenter::node_claims(&client).await.unwrap();
    let mut names: Vec<String> = after.iter().map(|c| c.name.clone()).collect();
    names.sort();
    let mut expected: Vec<String> = p.node_claims[1..].to_vec();
    expected.sort();
    assert_eq!(names, expected, "{after:?}");
    for (node, claim) in p.nodes[1..].iter().zip(&p.node_claims[1..]) {
        let info = after.iter().find(|c| &c.name == claim).unwrap();
        assert!(info.deletion_timestamp.is_none(), "{info:?}");
        assert_eq!(info.node_name.as_deref(), Some(node.as_str()));
        let n = nodes_api.get(node).await.unwrap();
        assert!(
            n.metadata.deletion_timestamp.is_none(),
            "node {node} is being deleted"
        );
        let tainted = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == DISRUPTED_TAINT);
        assert!(!tainted, "node {node} tainted {DISRUPTED_TAINT}");
    }
    steps.step("the other two stay");
    let mut k = k;
    assert!(k.running(), "karpenter-kwok exited:\n{}", k.log_tail(30));
    for e in k.errors() {
        eprintln!("karpenter-kwok error: {e}");
    }
    eprintln!(
        "steps: {}",
        steps
            .done
            .iter()
            .map(|(n, d)| format!("{n} {:.2}s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join("; ")
    );
}
