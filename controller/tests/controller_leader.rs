//! Leader election on a Lease served by the in-memory API (real time, short Lease): one replica
//! leads while the other waits; the waiting one takes over when the leader steps down; a leader
//! whose Lease is taken notices and reports the loss.

mod controller_fake;

use std::time::Duration;

use controller_fake::FakeApi;
use ebb_controller::state::Leadership;
use ebb_controller::state::lease::{Leader, LeaderConfig};

fn cfg(identity: &str) -> LeaderConfig {
    LeaderConfig {
        duration_secs: 2,
        grace_secs: 1,
        ..LeaderConfig::new("ebb-controller", "ebb-system", identity)
    }
}

#[tokio::test]
async fn one_leader_at_a_time_and_loss_is_noticed() {
    let api = FakeApi::new();
    let mut known = false;
    let a = Leader::acquire(api.client(), &cfg("a"), &Leadership::default(), || {
        known = true
    })
    .await
    .unwrap();
    assert!(known, "leadership known once the Lease was read");
    assert_eq!(api.lease_holder().as_deref(), Some("a"));

    // b campaigns while a renews: b does not lead.
    let client_b = api.client();
    let b_leadership = Leadership::default();
    let b_fence = b_leadership.clone();
    let b = tokio::spawn(async move {
        let l = Leader::acquire(client_b, &cfg("b"), &b_fence, || {}).await;
        // Checked before anything else runs: a standby that waited longer than the Lease's
        // duration is within its fence the moment it wins.
        (l, b_fence.may_write())
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!b.is_finished(), "b must wait while a holds the Lease");
    assert_eq!(api.lease_holder().as_deref(), Some("a"));

    // a steps down (its handle is dropped, the Lease released): b takes over.
    drop(a);
    let (b, fenced_in) = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("b becomes the leader after a stepped down")
        .unwrap();
    let mut b = b.unwrap();
    assert!(
        fenced_in,
        "b may write from the moment it acquires the Lease"
    );
    assert!(b_leadership.may_write());
    assert_eq!(api.lease_holder().as_deref(), Some("b"));

    // Someone else takes the Lease: b notices within a renewal period.
    api.take_lease("c", 60);
    let why = tokio::time::timeout(Duration::from_secs(5), b.lost())
        .await
        .expect("b notices it lost the Lease");
    assert!(!why.is_empty());
}

#[tokio::test]
async fn a_leader_that_cannot_confirm_its_lease_steps_down() {
    let api = FakeApi::new();
    let mut a = Leader::acquire(api.client(), &cfg("a"), &Leadership::default(), || {})
        .await
        .unwrap();
    // Cut a off from its Lease: another replica may take it after expiry, so a must stop.
    api.lease_down(true);
    let why = tokio::time::timeout(Duration::from_secs(6), a.lost())
        .await
        .expect("a steps down when it cannot confirm its Lease");
    assert!(why.contains("not renewed"), "{why}");
    // Asked again (at SIGTERM, for example): the same answer at once, no fresh deadline.
    let again = tokio::time::timeout(Duration::from_millis(200), a.lost())
        .await
        .expect("lost() answers at once once lost");
    assert_eq!(again, why);
}

/// The Lease still reads as ours, but renewals fail (etcd refuses writes): the leader must stop
/// acting before its Lease expires, since a standby may acquire it from then on.
#[tokio::test]
async fn a_leader_whose_renewals_fail_stops_before_its_lease_expires() {
    let api = FakeApi::new();
    let leadership = Leadership::default();
    let mut a = Leader::acquire(api.client(), &cfg("a"), &leadership, || {})
        .await
        .unwrap();
    assert!(leadership.may_write(), "within the fence once acquired");
    api.lease_writes_down(true);
    // The fence closes on its own, before anyone asks (start-up recovery, drains and the
    // webhook's registration run before the main loop waits on `lost`).
    let fenced_at = tokio::time::timeout(Duration::from_secs(10), async {
        while leadership.may_write() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        jiff::Timestamp::now()
    })
    .await
    .expect("the fence closes when renewals fail");
    let last_renewal = api.lease_renew_time().expect("a renewTime");
    let why = tokio::time::timeout(Duration::from_secs(10), a.lost())
        .await
        .expect("a steps down when it cannot renew its Lease");
    let stopped = jiff::Timestamp::now();
    // The renewTime the standby reads: the last renewal that landed.
    let renewed: jiff::Timestamp = api
        .lease_renew_time()
        .unwrap_or(last_renewal)
        .parse()
        .unwrap();
    let expiry = renewed + jiff::SignedDuration::from_secs(2);
    assert!(
        stopped < expiry,
        "stopped at {stopped}, the Lease (renewed {renewed}) expires at {expiry}: {why}"
    );
    assert!(why.contains("not renewed"), "{why}");
    assert!(fenced_at < expiry, "fenced at {fenced_at}, expiry {expiry}");
    // Asked again (at SIGTERM, for example): the same answer at once, no fresh deadline.
    let again = tokio::time::timeout(Duration::from_millis(200), a.lost())
        .await
        .expect("lost() answers at once once lost");
    assert_eq!(again, why);
}
