//! Restart safety against an in-memory API: a controller killed mid-drain (its runtime dropped)
//! is replaced by a fresh one that finishes the drain from the taint; start-up recovery resumes
//! or rolls back every ebb mark it finds.

mod controller_fake;

use std::sync::Arc;
use std::time::Duration;

use controller_fake::FakeApi;
use controller_fake::fixtures::{logs_pod, policy};
use ebb_api::{ScaleDownMode, ScaleDownPolicy};
use ebb_controller::actuation::{EbbTaint, taints};
use ebb_controller::reconcilers::scaledown::startup::{Recovered, recover_at_start};
use ebb_controller::reconcilers::scaledown::{Context, reconcile};
use ebb_controller::testkit::{node, pod};

fn context(api: &FakeApi, policies: &[&ScaleDownPolicy]) -> Arc<Context> {
    api.context(policies, 4)
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

fn tainted(api: &FakeApi, n: &str, t: EbbTaint) -> bool {
    api.node(n).is_some_and(|node| taints::has(&node, t))
}

#[test]
fn a_controller_killed_mid_drain_is_finished_by_the_next_one() {
    let api = FakeApi::new();
    api.add_node(node("n1").cpu("4").mem("16Gi").label("pool", "a").build());
    api.add_node(node("n2").cpu("4").mem("16Gi").label("pool", "a").build());
    api.add_pod(logs_pod("n1"));
    // n1's pod needs 3 of n2's 4 cpus: n1 is removable, n2 is the destination.
    api.add_pod(pod("web-1").on("n1").cpu("1").owned_by_rs("web").build());
    api.add_pod(pod("web-2").on("n2").cpu("3").owned_by_rs("web").build());
    // The PDB keeps the eviction waiting long enough to kill the controller mid-drain.
    api.script_evictions("default/web-1", &[429, 429, 429]);
    let p = policy("p", ScaleDownMode::DrainAndDelete, "a");

    // First controller: starts the drain, then dies (its runtime and tasks are dropped).
    let first = paused_runtime();
    first.block_on(async {
        let ctx = context(&api, &[&p]);
        reconcile(Arc::new(p.clone()), ctx.clone()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_eq!(
            ctx.actuator.tracker().draining(Some("p"))[0].phase.as_str(),
            "Evicting"
        );
    });
    drop(first);
    assert!(
        tainted(&api, "n1", EbbTaint::ToBeDeleted),
        "left tainted by the dead controller"
    );
    assert!(api.node("n1").is_some());

    // Second controller: re-derives the drain from the taint and finishes it.
    let second = paused_runtime();
    second.block_on(async {
        let ctx = context(&api, &[&p]);
        let r = recover_at_start(&ctx).await;
        assert_eq!(
            r,
            Recovered {
                resumed: 1,
                rolled_back: 0,
                soft_untainted: 0
            }
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(api.node("n1").is_none(), "drain finished: n1 deleted");
        assert!(!tainted(&api, "n2", EbbTaint::ToBeDeleted));
        reconcile(Arc::new(p.clone()), ctx).await.unwrap();
    });
    let status: ScaleDownPolicy = serde_json::from_value(api.policy("p").unwrap()).unwrap();
    let status = status.status.unwrap();
    assert_eq!(status.removed_total, 1);
    assert_eq!(status.draining, 0);
}

#[tokio::test(start_paused = true)]
async fn start_up_recovery_resumes_or_rolls_back_every_mark() {
    let api = FakeApi::new();
    let t = jiff::Timestamp::from_second(1_700_000_000).unwrap();
    let hard = EbbTaint::ToBeDeleted.at(t);
    let soft = EbbTaint::Candidate.at(t);
    // n1: empty, governed by an acting policy -> resumed and removed.
    api.add_node(
        node("n1")
            .cpu("4")
            .label("pool", "a")
            .taint(hard.clone())
            .build(),
    );
    api.add_pod(logs_pod("n1"));
    // n4: governed by the same policy, but scale-down was disabled on it since -> resumed, the
    // planner's re-check refuses it, rolled back.
    api.add_node(
        node("n4")
            .cpu("4")
            .label("pool", "a")
            .annotation(
                "cluster-autoscaler.kubernetes.io/scale-down-disabled",
                "true",
            )
            .taint(hard.clone())
            .build(),
    );
    // n2: its policy is DryRun -> rolled back at once.
    api.add_node(
        node("n2")
            .cpu("4")
            .label("pool", "b")
            .taint(hard.clone())
            .build(),
    );
    // n3: a soft taint nobody governs -> removed.
    api.add_node(
        node("n3")
            .cpu("4")
            .label("pool", "c")
            .taint(soft.clone())
            .build(),
    );
    let a = policy("a", ScaleDownMode::DrainAndDelete, "a");
    let b = policy("b", ScaleDownMode::DryRun, "b");
    let ctx = context(&api, &[&a, &b]);
    let r = recover_at_start(&ctx).await;
    assert_eq!(
        r,
        Recovered {
            resumed: 2,
            rolled_back: 1,
            soft_untainted: 1
        }
    );
    assert!(!tainted(&api, "n2", EbbTaint::ToBeDeleted));
    assert!(!tainted(&api, "n3", EbbTaint::Candidate));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(api.node("n1").is_none(), "resumed drain finished");
    assert!(api.node("n4").is_some(), "not removable: kept");
    assert!(
        !tainted(&api, "n4", EbbTaint::ToBeDeleted),
        "and rolled back"
    );
    assert!(api.requests("DELETE", "/nodes/n4").is_empty());
}
