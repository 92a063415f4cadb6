//! Placement history scenarios (ported from Apache Slider's role history tests) against the pure
//! core: picks, failures, escalation, outcomes, save/rebuild and the size of the status.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ebb_api::KubeDuration;
use ebb_api::placement::{
    LocalResource, PlacementHistorySpec, PlacementHistoryStatus, PlacementPolicy, RoleSpec,
    defaults,
};
use ebb_controller::placement::{
    Action, Decision, HistoryError, NodeFacts, NodeView, PlacementReason, PodRef, Requeue,
    RoleHistory, Termination, TerminationClass, TerminationReport, classify,
};
use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

// ---------- builders ----------

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("test timestamp")
}

/// A role spec with the CRD defaults.
struct RoleB(RoleSpec);

fn role(name: &str) -> RoleB {
    RoleB(RoleSpec {
        name: name.to_string(),
        policy: PlacementPolicy::Default,
        escalation_timeout: defaults::escalation_timeout(),
        node_failure_threshold: defaults::node_failure_threshold(),
        node_selector: BTreeMap::new(),
        local_resources: Vec::new(),
    })
}

impl RoleB {
    fn policy(mut self, p: PlacementPolicy) -> Self {
        self.0.policy = p;
        self
    }
    fn threshold(mut self, n: i32) -> Self {
        self.0.node_failure_threshold = n;
        self
    }
    fn timeout_secs(mut self, s: u64) -> Self {
        self.0.escalation_timeout = KubeDuration::from_secs(s);
        self
    }
    fn resource(mut self, name: &str) -> Self {
        self.0.local_resources.push(LocalResource {
            name: name.to_string(),
            url: format!("https://example.com/{name}"),
            sha256: "0".repeat(64),
            scope: Default::default(),
            max_bytes: 0,
        });
        self
    }
}

fn spec(roles: Vec<RoleB>) -> PlacementHistorySpec {
    PlacementHistorySpec {
        selector: Default::default(),
        role_label: "app.kubernetes.io/component".to_string(),
        roles: roles.into_iter().map(|r| r.0).collect(),
        failure_window: defaults::failure_window(),
        retention: defaults::retention(),
        short_lived_threshold: defaults::short_lived_threshold(),
        cache_retention: defaults::cache_retention(),
    }
}

/// Termination builders: `exit(1).ran(300)`.
fn exit(code: i32) -> Termination {
    Termination {
        exit_code: Some(code),
        ..Termination::default()
    }
}
fn deleted() -> Termination {
    Termination {
        deleted_by_owner: true,
        ..exit(143)
    }
}
fn oom() -> Termination {
    Termination {
        oom_killed: true,
        ..exit(137)
    }
}
fn evicted() -> Termination {
    Termination {
        disruption_target: true,
        ..exit(143)
    }
}
fn node_lost() -> Termination {
    Termination {
        node_lost: true,
        exit_code: None,
        ..Termination::default()
    }
}

trait Ran {
    /// The pod ran `secs` seconds and ended at `end`.
    fn ran(self, secs: i64, end: Timestamp) -> Self;
}
impl Ran for Termination {
    fn ran(mut self, secs: i64, end: Timestamp) -> Self {
        self.started_at = Some(end - SignedDuration::from_secs(secs));
        self.finished_at = Some(end);
        self
    }
}

/// A history plus the cluster it sees and a clock.
struct World {
    h: RoleHistory,
    facts: NodeFacts,
    full: BTreeSet<String>,
    now: Timestamp,
    seq: u32,
    pods: HashMap<String, (String, String)>,
}

impl World {
    fn new(spec: PlacementHistorySpec, nodes: &[&str]) -> Self {
        let now = t(1_700_000_000);
        Self {
            h: RoleHistory::new(&spec, now).expect("valid spec"),
            facts: NodeFacts::new(nodes.iter().map(|n| NodeView::ready(n))),
            full: BTreeSet::new(),
            now,
            seq: 0,
            pods: HashMap::new(),
        }
    }

    fn advance(&mut self, secs: i64) {
        self.now += SignedDuration::from_secs(secs);
    }

    fn advance_ms(&mut self, ms: i64) {
        self.now += SignedDuration::from_millis(ms);
    }

    fn node(&mut self, name: &str) -> &mut NodeView {
        self.facts.get_mut(name).expect("node in world")
    }

    fn new_pod(&mut self, name: &str, role: &str) -> String {
        self.seq += 1;
        let uid = format!("uid-{}", self.seq);
        self.pods
            .insert(uid.clone(), (name.to_string(), role.to_string()));
        uid
    }

    /// Ask where a pod goes (again, for a known uid).
    fn ask(&mut self, uid: &str) -> Decision {
        let (name, role) = self.pods[uid].clone();
        let full = self.full.clone();
        let fits = move |n: &str| !full.contains(n);
        self.h
            .place(
                PodRef {
                    uid,
                    name: &name,
                    role: &role,
                },
                &self.facts,
                &fits,
                self.now,
            )
            .expect("place")
    }

    /// A new gated pod of `role`, named `name`, asks for a node.
    fn place_named(&mut self, name: &str, role: &str) -> (String, Decision) {
        let uid = self.new_pod(name, role);
        let d = self.ask(&uid);
        (uid, d)
    }

    fn place(&mut self, role: &str) -> (String, Decision) {
        let name = format!("{role}-{}", self.seq + 1);
        self.place_named(&name, role)
    }

    /// Bind a known pod to `node` and mark it running.
    fn bind(&mut self, uid: &str, node: &str) {
        let (name, role) = self.pods[uid].clone();
        let pod = PodRef {
            uid,
            name: &name,
            role: &role,
        };
        assert!(
            self.h
                .on_bound(pod, node, &self.facts, self.now)
                .expect("bind")
        );
        assert!(self.h.on_running(uid, self.now));
    }

    /// A pod of `role` runs on `node` (not placed by the history).
    fn run(&mut self, role: &str, node: &str) -> String {
        let name = format!("{role}-{}", self.seq + 1);
        let uid = self.new_pod(&name, role);
        self.bind(&uid, node);
        uid
    }

    fn end(&mut self, uid: &str, termination: Termination) -> TerminationReport {
        self.h
            .on_terminated(uid, &termination, self.now)
            .expect("known pod")
    }

    /// A long-lived pod exits 0 now.
    fn complete(&mut self, uid: &str) -> TerminationReport {
        let now = self.now;
        self.end(uid, exit(0).ran(3600, now))
    }

    /// Give `role` a history on `nodes`, released in order (the last is the most recent).
    fn history(&mut self, role: &str, nodes: &[&str]) {
        for n in nodes {
            let uid = self.run(role, n);
            self.advance(10);
            self.complete(&uid);
        }
    }

    fn list(&self, role: &str) -> Vec<String> {
        self.h
            .available(role)
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    fn save(&mut self) -> PlacementHistoryStatus {
        let mut status = PlacementHistoryStatus::default();
        self.h.write_status(&mut status, self.now);
        // Through JSON, as the API server would store it.
        serde_json::from_value(serde_json::to_value(&status).expect("serialize"))
            .expect("deserialize")
    }
}

fn pinned(d: &Decision) -> Option<&str> {
    d.pinned_node()
}

fn relaxed(d: &Decision) -> &ebb_controller::placement::RelaxedConstraints {
    match &d.action {
        Action::Relax(c) | Action::Anywhere(c) => c,
        other => panic!("expected an unpinned release, got {other:?}"),
    }
}

// ---------- Slider scenarios ----------

#[test]
fn ordering_newest_first_nodes_without_entry_last_failing_newest_still_first() {
    let mut w = World::new(
        spec(vec![role("a").threshold(0), role("b")]),
        &["n1", "n2", "n3", "n4"],
    );
    w.history("a", &["n1", "n2"]);
    w.history("b", &["n4"]);
    // The newest use of `a` is on n3, and it failed there.
    let uid = w.run("a", "n3");
    w.advance(600);
    let now = w.now;
    let report = w.end(&uid, exit(2).ran(600, now));
    assert_eq!(report.class, TerminationClass::ApplicationFailure);
    assert!(report.node_excluded, "threshold 0: one failure excludes");

    let id = w.h.roles().by_name("a").expect("role a").id;
    assert_eq!(
        w.h.node_map().nodes_by_recency(id),
        ["n3", "n2", "n1", "n4"],
        "newest first, the node without an entry for `a` last"
    );
    assert_eq!(
        w.list("a"),
        ["n3", "n2", "n1"],
        "failing-but-newest stays first"
    );
    // The pick skips it.
    let (_, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n2"));
}

#[test]
fn first_pick_skips_busy_nodes() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n2", "n1"]);
    // A pod of `a` lands on n1 without asking (e.g. not gated).
    w.run("a", "n1");
    let (_, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n2"));
    assert_eq!(d.reason, PlacementReason::MostRecentNode);
}

#[test]
fn two_requests_get_two_distinct_nodes_and_a_third_gets_none() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2", "n3"]);
    w.history("a", &["n2", "n1"]);
    let (_, d1) = w.place("a");
    let (_, d2) = w.place("a");
    let (_, d3) = w.place("a");
    assert_eq!(pinned(&d1), Some("n1"));
    assert_eq!(pinned(&d2), Some("n2"));
    assert_eq!(pinned(&d3), None);
    assert_eq!(d3.reason, PlacementReason::NoAvailableHistoryNode);
    assert!(matches!(d3.action, Action::Anywhere(_)));
    assert_eq!(w.h.counters("a").pinned, 2);
    assert_eq!(w.h.counters("a").anywhere, 1);
}

#[test]
fn roles_are_independent() {
    let mut w = World::new(spec(vec![role("a"), role("b")]), &["n1", "n2"]);
    w.history("a", &["n1"]);
    w.history("b", &["n2"]);
    // `b` running on n1 does not make n1 busy for `a`.
    w.run("b", "n1");
    let (_, db) = w.place("b");
    assert_eq!(pinned(&db), Some("n2"));
    assert_eq!(w.list("a"), ["n1"]);
    let (_, da) = w.place("a");
    assert_eq!(pinned(&da), Some("n1"));
}

#[test]
fn all_busy_gives_no_pinned_node() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n1", "n2"]);
    w.run("a", "n1");
    w.run("a", "n2");
    let (_, d) = w.place("a");
    assert_eq!(d.reason, PlacementReason::NoAvailableHistoryNode);
    assert!(
        w.list("a").is_empty(),
        "busy nodes are dropped from the list"
    );
}

#[test]
fn failures_skip_a_node_until_the_fixed_window_resets() {
    let mut w = World::new(spec(vec![role("a").threshold(1)]), &["n1", "n2"]);
    w.history("a", &["n2", "n1"]);
    // Fail twice on n1 just before the window resets: over the threshold of 1.
    let reset = w.h.next_failure_reset(w.now);
    w.now = reset - SignedDuration::from_secs(300);
    for expect_excluded in [false, true] {
        let uid = w.run("a", "n1");
        w.advance(120);
        let now = w.now;
        let r = w.end(&uid, exit(1).ran(120, now));
        assert_eq!(r.node_excluded, expect_excluded);
        assert_eq!(r.requeue, Requeue::Head);
    }
    assert_eq!(w.h.entry("n1", "a").map(|e| e.failed_recently), Some(2));
    let (uid, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n2"), "n1 is over the threshold");
    w.h.cancel(&uid);
    // One second before the reset it is still excluded; relaxed requests avoid it.
    w.now = reset - SignedDuration::from_secs(1);
    w.run("a", "n2");
    let (uid, d) = w.place("a");
    assert_eq!(d.reason, PlacementReason::NoAvailableHistoryNode);
    assert_eq!(relaxed(&d).avoid_nodes, ["n1"]);
    w.h.cancel(&uid);
    // At the reset (fixed schedule, not 6h after the failures) n1 is back.
    w.now = reset;
    let (_, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n1"));
    assert_eq!(w.h.entry("n1", "a").map(|e| e.failed_recently), Some(0));
    assert_eq!(w.h.entry("n1", "a").map(|e| e.failed), Some(2));
}

#[test]
fn threshold_boundaries_and_negative_means_unlimited() {
    let mut w = World::new(
        spec(vec![
            role("two").threshold(2),
            role("unlimited").threshold(-1),
        ]),
        &["n1", "n2"],
    );
    for r in ["two", "unlimited"] {
        w.history(r, &["n2", "n1"]);
    }
    let fail = |w: &mut World, r: &str| {
        let uid = w.run(r, "n1");
        w.advance(100);
        let now = w.now;
        w.end(&uid, exit(1).ran(100, now))
    };
    for _ in 0..2 {
        fail(&mut w, "two");
    }
    let (uid, d) = w.place("two");
    assert_eq!(
        pinned(&d),
        Some("n1"),
        "2 failures are not over a threshold of 2"
    );
    w.h.cancel(&uid);
    assert!(fail(&mut w, "two").node_excluded);
    let (_, d) = w.place("two");
    assert_eq!(pinned(&d), Some("n2"));

    for _ in 0..10 {
        assert!(!fail(&mut w, "unlimited").node_excluded);
    }
    let (_, d) = w.place("unlimited");
    assert_eq!(pinned(&d), Some("n1"), "-1: failures never exclude");
}

#[test]
fn picked_node_leaves_the_list() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n2", "n1"]);
    assert_eq!(w.list("a"), ["n1", "n2"]);
    let (uid, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n1"));
    assert_eq!(w.list("a"), ["n2"]);
    assert_eq!(w.h.entry("n1", "a").map(|e| e.requested), Some(1));
    assert_eq!(
        w.h.request(&uid).and_then(|r| r.target.as_deref()),
        Some("n1")
    );
    // Asking again for the same pod gives the same answer and takes nothing more.
    assert_eq!(w.ask(&uid), d);
    assert_eq!(w.list("a"), ["n2"]);
}

#[test]
fn strict_ignores_failures() {
    let mut w = World::new(
        spec(vec![role("s").policy(PlacementPolicy::Strict).threshold(0)]),
        &["n1", "n2"],
    );
    w.history("s", &["n2", "n1"]);
    let uid = w.run("s", "n1");
    w.advance(100);
    let now = w.now;
    let r = w.end(&uid, exit(1).ran(100, now));
    assert!(!r.node_excluded);
    let (_, d) = w.place("s");
    assert_eq!(pinned(&d), Some("n1"));
}

#[test]
fn anywhere_never_pins() {
    let mut w = World::new(
        spec(vec![role("x").policy(PlacementPolicy::Anywhere)]),
        &["n1"],
    );
    w.history("x", &["n1"]);
    let (_, d) = w.place("x");
    assert_eq!(d.reason, PlacementReason::PolicyAnywhere);
    assert!(matches!(&d.action, Action::Anywhere(c) if c.prefer_nodes.is_empty()));
    assert_eq!(w.list("x"), ["n1"], "history is kept, nothing is reserved");
    assert_eq!(w.h.entry("n1", "x").map(|e| e.requested), Some(0));
}

#[test]
fn allocation_elsewhere_resolves_request_and_returns_node_when_role_complete() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2", "n3", "n4", "n5"]);
    w.history("a", &["n3", "n2", "n1"]);
    let (p1, d1) = w.place("a");
    let (p2, d2) = w.place("a");
    assert_eq!((pinned(&d1), pinned(&d2)), (Some("n1"), Some("n2")));
    // A newer release on n5 meanwhile.
    w.history("a", &["n5"]);
    assert_eq!(w.list("a"), ["n5", "n3"]);
    // p1 lands on n4, not on n1.
    w.bind(&p1, "n4");
    assert!(w.h.request(&p1).is_none(), "request resolved");
    assert_eq!(w.h.entry("n1", "a").map(|e| e.requested), Some(0));
    assert_eq!(w.list("a"), ["n5", "n3"], "p2 is still outstanding");
    w.bind(&p2, "n2");
    assert_eq!(
        w.list("a"),
        ["n5", "n1", "n3"],
        "n1 returns at its place by lastUsed, not at the head"
    );
}

#[test]
fn escalation_at_exactly_the_timeout_does_nothing_and_one_ms_later_relaxes() {
    let mut w = World::new(spec(vec![role("a").timeout_secs(30)]), &["n1", "n2"]);
    w.history("a", &["n1"]);
    w.node("n1").schedulable_ready = false;
    let t0 = w.now;
    let (uid, d) = w.place("a");
    assert_eq!(
        d.action,
        Action::Wait {
            node: "n1".into(),
            until: Some(t0 + SignedDuration::from_secs(30))
        }
    );
    assert_eq!(d.reason, PlacementReason::NodeNotReady);
    w.advance(30);
    assert!(matches!(w.ask(&uid).action, Action::Wait { .. }));
    w.advance_ms(1);
    let d = w.ask(&uid);
    assert_eq!(d.reason, PlacementReason::EscalationTimeout);
    assert_eq!(relaxed(&d).prefer_nodes, [("n1".to_string(), 100)]);
    // Relaxed once: it never escalates again.
    w.advance(3600);
    assert_eq!(w.ask(&uid), d);
    assert!(w.h.overdue(w.now).is_empty());
    let c = w.h.counters("a");
    assert_eq!((c.escalations, c.relaxed, c.pinned), (1, 1, 0));
}

#[test]
fn waiting_pod_is_pinned_when_its_node_comes_back() {
    let mut w = World::new(spec(vec![role("a")]), &["n1"]);
    w.history("a", &["n1"]);
    w.full.insert("n1".into());
    let (uid, d) = w.place("a");
    assert_eq!(d.reason, PlacementReason::DoesNotFit);
    w.advance(10);
    w.full.clear();
    let d = w.ask(&uid);
    assert_eq!(pinned(&d), Some("n1"));
}

#[test]
fn strict_never_escalates() {
    let mut w = World::new(
        spec(vec![
            role("s").policy(PlacementPolicy::Strict).timeout_secs(1),
        ]),
        &["n1", "n2"],
    );
    w.history("s", &["n1"]);
    w.node("n1").schedulable_ready = false;
    let (uid, d) = w.place("s");
    assert_eq!(
        d.action,
        Action::Wait {
            node: "n1".into(),
            until: None
        }
    );
    w.advance(86_400);
    assert!(matches!(w.ask(&uid).action, Action::Wait { .. }));
    // Pinned and never scheduled: still not deleted.
    w.node("n1").schedulable_ready = true;
    assert_eq!(pinned(&w.ask(&uid)), Some("n1"));
    w.advance(86_400);
    assert!(w.h.overdue(w.now).is_empty());
}

#[test]
fn pinned_pod_pending_past_deadline_is_deleted_and_its_successor_relaxed() {
    let mut w = World::new(spec(vec![role("a").timeout_secs(30)]), &["n1", "n2"]);
    w.history("a", &["n2", "n1"]);
    let (uid, d) = w.place_named("web-0", "a");
    assert_eq!(pinned(&d), Some("n1"));
    w.advance(30);
    assert!(w.h.overdue(w.now).is_empty(), "not at the deadline itself");
    w.advance_ms(1);
    let overdue = w.h.overdue(w.now);
    assert_eq!(overdue.len(), 1);
    assert_eq!(
        (overdue[0].uid.as_str(), overdue[0].node.as_str()),
        (uid.as_str(), "n1")
    );
    assert_eq!(overdue[0].reason, PlacementReason::PinnedPodStillPending);
    // Its owner re-creates web-0: relaxed at once. Another pod is pinned as usual.
    let (_, d) = w.place_named("web-0", "a");
    assert_eq!(d.reason, PlacementReason::PreviousAttemptLostRace);
    let (_, d) = w.place_named("web-1", "a");
    assert_eq!(pinned(&d), Some("n2"));
}

#[test]
fn release_lifecycle_active_drops_at_release_and_node_returns_to_head() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n1", "n2"]);
    let uid = w.run("a", "n1");
    let e = w.h.entry("n1", "a").cloned().expect("entry");
    assert_eq!((e.live, e.releasing), (1, 0));
    assert!(!e.available());
    assert_eq!(w.list("a"), ["n2"]);
    w.advance(3600);
    assert!(w.h.on_releasing(&uid));
    assert!(!w.h.on_releasing(&uid), "counted once");
    let e = w.h.entry("n1", "a").cloned().expect("entry");
    assert_eq!(e.active() - e.releasing, 0, "active drops at release");
    assert_eq!(w.list("a"), ["n2"], "not requeued before completion");
    w.advance(20);
    let now = w.now;
    let r = w.end(&uid, deleted().ran(3620, now));
    assert_eq!(r.class, TerminationClass::DeletedByOwner);
    assert_eq!(r.requeue, Requeue::Head);
    let e = w.h.entry("n1", "a").cloned().expect("entry");
    assert_eq!((e.active(), e.releasing, e.last_used), (0, 0, Some(now)));
    assert_eq!(w.list("a"), ["n1", "n2"]);
}

#[test]
fn start_failure_is_not_requeued_until_the_window_resets() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n1"]);
    let uid = w.run("a", "n2");
    w.advance(5);
    let now = w.now;
    let r = w.end(&uid, exit(1).ran(5, now));
    assert_eq!(r.class, TerminationClass::StartFailure);
    assert_eq!(r.requeue, Requeue::Dropped);
    assert_eq!(w.list("a"), ["n1"]);
    assert_eq!(w.h.entry("n2", "a").map(|e| e.start_failed), Some(1));
    w.now = w.h.next_failure_reset(w.now);
    assert_eq!(
        w.list("a"),
        ["n1"],
        "the reset is applied at the next event"
    );
    let (_, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n1"));
    assert_eq!(w.list("a"), ["n2"], "trusted again after the reset");
}

#[test]
fn short_lived_release_does_not_jump_to_the_head() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n1", "n2"]);
    let before = w.h.entry("n1", "a").and_then(|e| e.last_used);
    let uid = w.run("a", "n1");
    w.advance(10);
    let now = w.now;
    let r = w.end(&uid, exit(0).ran(10, now));
    assert_eq!(
        (r.class, r.requeue),
        (TerminationClass::Completed, Requeue::Sorted)
    );
    assert_eq!(w.list("a"), ["n2", "n1"]);
    assert_eq!(w.h.entry("n1", "a").and_then(|e| e.last_used), before);
}

#[test]
fn save_rebuild_keeps_last_used_saved_at_and_drops_removed_roles() {
    let mut w = World::new(
        spec(vec![role("a"), role("b"), role("c")]),
        &["n1", "n2", "n3"],
    );
    w.history("a", &["n2"]);
    let n2_used = w.h.entry("n2", "a").and_then(|e| e.last_used);
    w.history("b", &["n3"]);
    w.run("a", "n1");
    w.run("c", "n3");
    w.advance(100);
    let saved_at = w.now;
    let status = w.save();
    assert!(!w.h.is_dirty());
    let ids: BTreeMap<String, i32> = status
        .roles
        .iter()
        .map(|r| (r.name.clone(), r.id))
        .collect();

    // Restart an hour later without role b.
    let new_spec = spec(vec![role("c"), role("a")]);
    let later = saved_at + SignedDuration::from_hours(1);
    let (mut h, report) = RoleHistory::rebuild(&new_spec, Some(&status), later).expect("rebuild");
    assert!(!report.bootstrap);
    assert_eq!(report.roles_dropped, ["b"]);
    assert_eq!(report.entries_dropped, 1);
    assert_eq!(report.active_at_save, 2);
    assert_eq!(h.entry("n1", "a").and_then(|e| e.last_used), Some(saved_at));
    assert_eq!(h.entry("n3", "c").and_then(|e| e.last_used), Some(saved_at));
    assert_eq!(h.entry("n2", "a").and_then(|e| e.last_used), n2_used);
    assert_eq!(
        h.entry("n1", "a").map(|e| e.live),
        Some(0),
        "counts are not persisted"
    );
    assert_eq!(
        h.roles().by_name("a").map(|r| r.id as i32),
        ids.get("a").copied()
    );
    assert_eq!(
        h.roles().by_name("c").map(|r| r.id as i32),
        ids.get("c").copied()
    );
    assert_eq!(h.available("a"), ["n1", "n2"]);
    // Replay the pod still running on n1: counts match the cluster again.
    let pod = PodRef {
        uid: "live-1",
        name: "a-0",
        role: "a",
    };
    assert!(h.replay_pod(pod, "n1", true, later).expect("replay"));
    assert_eq!(h.entry("n1", "a").map(|e| e.live), Some(1));
    assert_eq!(h.available("a"), ["n2"]);
}

#[test]
fn rebuild_purges_entries_older_than_retention_and_discards_unknown_schemas() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n1"]);
    w.advance(8 * 86_400);
    w.history("a", &["n2"]);
    let status = w.save();
    let (h, report) =
        RoleHistory::rebuild(&spec(vec![role("a")]), Some(&status), w.now).expect("rebuild");
    assert_eq!(report.purged, 1);
    assert_eq!(h.available("a"), ["n2"]);

    let mut future = status.clone();
    future.schema_version = 2;
    let (h, report) =
        RoleHistory::rebuild(&spec(vec![role("a")]), Some(&future), w.now).expect("rebuild");
    assert!(report.bootstrap);
    assert!(
        report
            .discarded
            .as_deref()
            .is_some_and(|m| m.contains("schemaVersion is 2"))
    );
    assert!(h.node_map().is_empty());

    let (_, report) = RoleHistory::rebuild(&spec(vec![role("a")]), None, w.now).expect("bootstrap");
    assert!(report.bootstrap && report.discarded.is_none());

    let mut garbled = status;
    garbled.nodes[0].entries.push_str(",zz,9:1");
    let (_, report) =
        RoleHistory::rebuild(&spec(vec![role("a")]), Some(&garbled), w.now).expect("rebuild");
    assert_eq!(report.malformed, 2);
}

#[test]
fn purge_forgets_idle_entries_past_retention_but_keeps_recent_failures() {
    let mut w = World::new(spec(vec![role("a").threshold(-1)]), &["n1", "n2"]);
    w.history("a", &["n1", "n2"]);
    let n2_used =
        w.h.entry("n2", "a")
            .and_then(|e| e.last_used)
            .expect("used");
    w.now = n2_used + SignedDuration::from_hours(7 * 24);
    assert_eq!(
        w.h.purge(w.now),
        1,
        "n1 is older than 7d; n2 exactly 7d is kept"
    );
    assert_eq!(w.list("a"), ["n2"]);
    // A failure within the window keeps an old entry.
    w.advance(1);
    let reset = w.h.next_failure_reset(w.now);
    let uid = w.run("a", "n1");
    w.advance(5);
    let now = w.now;
    w.end(&uid, exit(1).ran(5, now));
    assert!(w.now < reset, "the failure is still in its window");
    assert_eq!(
        w.h.purge(w.now),
        1,
        "n2 is purged; n1 failed recently and stays"
    );
    assert!(w.h.entry("n1", "a").is_some());
    assert!(w.h.entry("n2", "a").is_none());
}

#[test]
fn duplicate_role_names_are_rejected() {
    let s = spec(vec![role("a"), role("b"), role("a")]);
    let err = RoleHistory::new(&s, t(0)).expect_err("duplicate");
    assert_eq!(err, HistoryError::DuplicateRole { name: "a".into() });
    assert!(err.to_string().contains("unique name"));
    assert!(RoleHistory::rebuild(&s, None, t(0)).is_err());
}

#[test]
fn unknown_role_is_an_error_naming_the_pod() {
    let mut w = World::new(spec(vec![role("a")]), &["n1"]);
    let uid = w.new_pod("web-0", "nope");
    let err =
        w.h.place(
            PodRef {
                uid: &uid,
                name: "web-0",
                role: "nope",
            },
            &w.facts,
            &|_| true,
            w.now,
        )
        .expect_err("unknown role");
    assert!(err.to_string().contains("\"web-0\"") && err.to_string().contains("\"nope\""));
}

#[test]
fn anti_affinity_never_doubles_up() {
    let mut w = World::new(
        spec(vec![
            role("anti").policy(PlacementPolicy::AntiAffinity),
            role("plain"),
        ]),
        &["n1", "n2", "n3"],
    );
    for r in ["anti", "plain"] {
        w.history(r, &["n1"]);
    }
    let anti = w.run("anti", "n1");
    let plain = w.run("plain", "n1");
    w.run("anti", "n2");
    // Both instances on n1 are being deleted; after a window reset the lists are rebuilt.
    assert!(w.h.on_releasing(&anti) && w.h.on_releasing(&plain));
    w.now = w.h.next_failure_reset(w.now);
    let (_, d) = w.place("plain");
    assert_eq!(
        pinned(&d),
        Some("n1"),
        "Default counts a releasing pod as gone"
    );
    let (_, d) = w.place("anti");
    assert_eq!(d.reason, PlacementReason::NoAvailableHistoryNode);
    assert_eq!(
        relaxed(&d).avoid_nodes,
        ["n1", "n2"],
        "never next to a live instance"
    );
}

#[test]
fn drain_candidates_are_never_pinned_or_preferred() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2", "n3"]);
    w.history("a", &["n2", "n1"]);
    w.node("n1").draining_or_candidate = true;
    let (_, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n2"));
    w.node("n2").schedulable_ready = false;
    let (uid, d) = w.place("a");
    assert_eq!(
        d.reason,
        PlacementReason::NoAvailableHistoryNode,
        "n1 draining, n2 taken"
    );
    w.h.cancel(&uid);
    // A relaxed request never prefers a draining node.
    w.node("n2").schedulable_ready = true;
    w.node("n3").schedulable_ready = false;
    w.history("a", &["n3"]);
    let (uid, _) = w.place("a");
    w.advance(31);
    let d = w.ask(&uid);
    assert_eq!(d.reason, PlacementReason::EscalationTimeout);
    let prefer: Vec<&str> = relaxed(&d)
        .prefer_nodes
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        prefer,
        ["n3", "n2"],
        "most recent first; draining n1 left out"
    );
}

#[test]
fn not_ready_head_is_skipped_for_a_ready_history_node() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n2", "n1"]);
    w.node("n1").schedulable_ready = false;
    let (_, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n2"));
    assert_eq!(w.list("a"), ["n1"]);
}

#[test]
fn warm_data_breaks_ties_of_equal_recency() {
    // After a rebuild, nodes active at save time share lastUsed = savedAt.
    let s = spec(vec![role("a").resource("model")]);
    let mut w = World::new(s.clone(), &["n1", "n2", "n3"]);
    w.run("a", "n1");
    w.run("a", "n2");
    w.run("a", "n3");
    let status = w.save();
    let (h, _) = RoleHistory::rebuild(&s, Some(&status), w.now).expect("rebuild");
    w.h = h;
    assert_eq!(w.list("a"), ["n1", "n2", "n3"]);
    w.node("n3").warm_roles.insert("a".into());
    let (_, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n3"));
    assert_eq!(d.reason, PlacementReason::WarmDataTieBreak);
    let (_, d) = w.place("a");
    assert_eq!(
        pinned(&d),
        Some("n1"),
        "no warm data left: recency, then name"
    );
    assert_eq!(d.reason, PlacementReason::MostRecentNode);
}

#[test]
fn warm_data_never_beats_recency() {
    let mut w = World::new(spec(vec![role("a").resource("model")]), &["n1", "n2"]);
    w.history("a", &["n2", "n1"]);
    w.node("n2").warm_roles.insert("a".into());
    let (_, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n1"));
}

// ---------- termination outcomes ----------

#[test]
fn terminations_are_classified_in_order() {
    let short = SignedDuration::from_secs(60);
    let end = t(10_000);
    let c = |term: Termination| classify(&term, None, short, end);
    assert_eq!(c(exit(0).ran(5, end)), TerminationClass::Completed);
    assert_eq!(c(deleted().ran(5, end)), TerminationClass::DeletedByOwner);
    assert_eq!(c(oom().ran(5, end)), TerminationClass::LimitsExceeded);
    assert_eq!(c(evicted()), TerminationClass::Preempted);
    assert_eq!(c(node_lost()), TerminationClass::NodeLost);
    assert_eq!(c(exit(1).ran(59, end)), TerminationClass::StartFailure);
    assert_eq!(
        c(exit(1).ran(60, end)),
        TerminationClass::ApplicationFailure
    );
    assert_eq!(
        c(exit(1)),
        TerminationClass::StartFailure,
        "never seen running"
    );
    // Disruption wins over OOM and node loss; OOM over node loss.
    assert_eq!(
        c(Termination {
            oom_killed: true,
            ..evicted()
        }),
        TerminationClass::Preempted
    );
    assert_eq!(
        c(Termination {
            node_lost: true,
            ..oom()
        }),
        TerminationClass::LimitsExceeded
    );
    // The history's own running-since is used when the pod status has no start time.
    assert_eq!(
        classify(
            &exit(1),
            Some(end - SignedDuration::from_secs(600)),
            short,
            end
        ),
        TerminationClass::ApplicationFailure
    );
}

#[test]
fn termination_read_from_pod_status() {
    let pod: ebb_controller::cluster::CachedPod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0"},
        "status": {
            "conditions": [{"type": "DisruptionTarget", "status": "True"}],
            "containerStatuses": [
                {"name": "a", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 0, "startedAt": "2026-01-01T00:00:00Z",
                                          "finishedAt": "2026-01-01T01:00:00Z"}}},
                {"name": "b", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                          "startedAt": "2026-01-01T00:00:10Z",
                                          "finishedAt": "2026-01-01T00:30:00Z"}}}
            ]
        }
    }))
    .expect("pod literal");
    let term = Termination::from_pod(&pod, false, false);
    assert_eq!(term.exit_code, Some(137));
    assert!(term.oom_killed && term.disruption_target && !term.node_lost);
    assert_eq!(
        term.started_at,
        Some("2026-01-01T00:00:00Z".parse().expect("ts"))
    );
    assert_eq!(
        term.finished_at,
        Some("2026-01-01T01:00:00Z".parse().expect("ts"))
    );
    // An init container failed: the pod never ran; a start failure, not a lost node.
    let init: ebb_controller::cluster::CachedPod = serde_json::from_value(serde_json::json!({
        "status": {
            "initContainerStatuses": [
                {"name": "i", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 2}}}],
            "containerStatuses": [
                {"name": "a", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"waiting": {"reason": "PodInitializing"}}}]
        }
    }))
    .expect("pod literal");
    let term = Termination::from_pod(&init, false, false);
    assert_eq!((term.exit_code, term.started_at), (Some(2), None));
    assert_eq!(
        classify(&term, None, SignedDuration::from_secs(60), t(0)),
        TerminationClass::StartFailure
    );
    let none: ebb_controller::cluster::CachedPod = Default::default();
    let term = Termination::from_pod(&none, true, false);
    assert_eq!((term.exit_code, term.node_lost), (None, true));
}

#[test]
fn outcomes_update_the_right_counters() {
    let mut w = World::new(spec(vec![role("a").threshold(-1)]), &["n1"]);
    let cases = [
        (oom(), TerminationClass::LimitsExceeded, (0, 0, 0)),
        (evicted(), TerminationClass::Preempted, (0, 0, 1)),
        (node_lost(), TerminationClass::NodeLost, (1, 0, 1)),
        (exit(3), TerminationClass::ApplicationFailure, (2, 0, 1)),
        (exit(3), TerminationClass::StartFailure, (3, 1, 1)),
    ];
    for (i, (term, class, (failed, start_failed, preempted))) in cases.into_iter().enumerate() {
        let uid = w.run("a", "n1");
        let ran = if class == TerminationClass::StartFailure {
            1
        } else {
            600
        };
        w.advance(ran);
        let now = w.now;
        let term = if term.exit_code.is_some() {
            term.ran(ran, now)
        } else {
            term
        };
        let r = w.end(&uid, term);
        assert_eq!(r.class, class, "case {i}");
        let e = w.h.entry("n1", "a").cloned().expect("entry");
        assert_eq!(
            (e.failed, e.start_failed, e.preempted),
            (failed, start_failed, preempted),
            "case {i}"
        );
        assert_eq!(e.failed_recently, failed, "case {i}");
    }
    assert_eq!(w.h.counters("a").terminations.values().sum::<u64>(), 5);
}

// ---------- size of the persisted status ----------

#[test]
fn status_for_5000_nodes_by_10_roles_stays_well_under_the_object_limit() {
    let roles: Vec<RoleB> = (0..10).map(|i| role(&format!("role-{i}"))).collect();
    let s = spec(roles);
    let start = t(1_700_000_000);
    let mut h = RoleHistory::new(&s, start).expect("spec");
    // Realistic cloud node names; every role ran on every node at some point in the last
    // week, and a third of the entries are active at save time.
    let names: Vec<String> = (0..5000)
        .map(|i| {
            format!(
                "ip-10-{}-{}-{}.eu-west-1.compute.internal",
                i / 2000,
                (i / 250) % 8 + 100,
                i % 250 + 1
            )
        })
        .collect();
    let mut uid = 0u64;
    for (n, node) in names.iter().enumerate() {
        for r in 0..10 {
            uid += 1;
            let (id, role) = (uid.to_string(), format!("role-{r}"));
            let pod = PodRef {
                uid: &id,
                name: "p",
                role: &role,
            };
            let at = start + SignedDuration::from_secs(((n * 10 + r) * 12) as i64);
            h.on_bound(pod, node, &NodeFacts::default(), at)
                .expect("bind");
            h.on_running(&id, at);
            if (n + r) % 3 != 0 {
                h.on_terminated(&id, &exit(0).ran(3600, at), at);
            }
        }
    }
    let now = start + SignedDuration::from_secs(600_000);
    let mut status = PlacementHistoryStatus::default();
    h.write_status(&mut status, now);
    let bytes = serde_json::to_vec(&status).expect("json").len();
    println!(
        "placement history status for 5000 nodes x 10 roles: {bytes} bytes ({:.1} KiB)",
        bytes as f64 / 1024.0
    );
    // etcd's default request limit is 1.5 MiB and the status shares the object with the spec
    // and metadata: stay under 1 MiB in this worst case (every role on every node).
    assert!(bytes < 1024 * 1024, "{bytes} bytes");
    let (rebuilt, report) = RoleHistory::rebuild(&s, Some(&status), now).expect("rebuild");
    assert_eq!(
        (report.nodes, report.entries, report.malformed),
        (5000, 50_000, 0)
    );
    assert_eq!(rebuilt.available("role-0").len(), 5000);
}

// ---------- property: save → rebuild ----------

#[derive(Clone, Debug)]
enum Op {
    /// Run a pod of role r on node n for `secs`, ending with `exit`.
    Run {
        r: usize,
        n: usize,
        secs: i64,
        exit: i32,
    },
    /// A pod of role r starts on node n and is still running at save time.
    Keep {
        r: usize,
        n: usize,
    },
    Wait {
        secs: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..8usize, 1..5000i64, prop_oneof![Just(0), Just(1)])
            .prop_map(|(r, n, secs, exit)| Op::Run { r, n, secs, exit }),
        1 => (0..3usize, 0..8usize).prop_map(|(r, n)| Op::Keep { r, n }),
        1 => (1..100_000i64).prop_map(|secs| Op::Wait { secs }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn save_rebuild_preserves_recency_order_without_duplicates(ops in prop::collection::vec(op(), 1..60)) {
        let s = spec(vec![role("r0").threshold(-1), role("r1").threshold(-1), role("r2").threshold(-1)]);
        let mut now = t(1_700_000_000);
        let mut h = RoleHistory::new(&s, now).expect("spec");
        let mut uid = 0u32;
        for op in &ops {
            match *op {
                Op::Wait { secs } => now += SignedDuration::from_secs(secs),
                Op::Run { r, n, secs, exit: code } => {
                    uid += 1;
                    let (id, role) = (uid.to_string(), format!("r{r}"));
                    let pod = PodRef { uid: &id, name: "p", role: &role };
                    if h.on_bound(pod, &format!("n{n}"), &NodeFacts::default(), now).expect("bind") {
                        h.on_running(&id, now);
                        now += SignedDuration::from_secs(secs);
                        h.on_terminated(&id, &exit(code).ran(secs, now), now);
                    }
                }
                Op::Keep { r, n } => {
                    uid += 1;
                    let (id, role) = (uid.to_string(), format!("r{r}"));
                    let pod = PodRef { uid: &id, name: "p", role: &role };
                    h.on_bound(pod, &format!("n{n}"), &NodeFacts::default(), now).expect("bind");
                    h.on_running(&id, now);
                }
            }
            for r in ["r0", "r1", "r2"] {
                let list = h.available(r);
                let unique: BTreeSet<&str> = list.iter().copied().collect();
                prop_assert_eq!(unique.len(), list.len(), "duplicate in live list {:?}", list);
            }
        }
        now += SignedDuration::from_secs(1);
        let mut status = PlacementHistoryStatus::default();
        h.write_status(&mut status, now);
        let status: PlacementHistoryStatus =
            serde_json::from_value(serde_json::to_value(&status).expect("json")).expect("json");
        let (rebuilt, _) = RoleHistory::rebuild(&s, Some(&status), now).expect("rebuild");
        for r in ["r0", "r1", "r2"] {
            let list = rebuilt.available(r);
            let unique: BTreeSet<&str> = list.iter().copied().collect();
            prop_assert_eq!(unique.len(), list.len(), "duplicate in rebuilt list {:?}", list);
            // Effective recency before the save: active entries count as used at save time.
            let before = |n: &str| {
                h.entry(n, r).and_then(|e| if e.active() > 0 { Some(now) } else { e.last_used })
            };
            let cutoff = now - SignedDuration::from_hours(7 * 24);
            let expected: BTreeSet<&str> = h
                .node_map()
                .iter()
                .map(|(n, _)| n)
                .filter(|n| before(n).is_some_and(|u| u >= cutoff))
                .collect();
            prop_assert_eq!(&unique, &expected, "every used node and only those");
            for pair in list.windows(2) {
                prop_assert!(
                    before(pair[0]) >= before(pair[1]),
                    "{} before {} but used earlier: {:?} < {:?}",
                    pair[0], pair[1], before(pair[0]), before(pair[1])
                );
            }
        }
    }
}

// ---------- spec changes, cancellation, status figures, warm data ----------

#[test]
fn spec_update_keeps_ids_and_drops_removed_roles() {
    let mut w = World::new(spec(vec![role("a"), role("b")]), &["n1", "n2"]);
    w.history("a", &["n1"]);
    w.history("b", &["n1", "n2"]);
    let b_id = w.h.roles().by_name("b").map(|r| r.id);
    let (removed, dropped) =
        w.h.update_spec(&spec(vec![role("b"), role("c")]), w.now)
            .expect("valid spec");
    assert_eq!((removed, dropped), (vec!["a".to_string()], 1));
    assert_eq!(w.h.roles().by_name("b").map(|r| r.id), b_id);
    assert!(
        w.h.roles().by_name("c").map(|r| r.id) > b_id,
        "new roles get fresh ids"
    );
    assert!(w.h.entry("n1", "a").is_none());
    assert_eq!(w.list("b"), ["n2", "n1"]);
    let (_, d) = w.place("c");
    assert_eq!(d.reason, PlacementReason::NoAvailableHistoryNode);
    let err =
        w.h.update_spec(&spec(vec![role("b"), role("b")]), w.now)
            .expect_err("duplicate");
    assert_eq!(err, HistoryError::DuplicateRole { name: "b".into() });
    assert!(
        w.h.roles().by_name("c").is_some(),
        "a rejected spec changes nothing"
    );
}

#[test]
fn cancelled_request_gives_its_node_back() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2"]);
    w.history("a", &["n2", "n1"]);
    let (uid, d) = w.place("a");
    assert_eq!(pinned(&d), Some("n1"));
    assert!(w.h.cancel(&uid));
    assert!(!w.h.cancel(&uid));
    assert_eq!(w.list("a"), ["n1", "n2"]);
    assert_eq!(w.h.entry("n1", "a").map(|e| e.requested), Some(0));
    // A pod that ends before it was ever bound cancels its request too.
    let (uid, _) = w.place("a");
    assert!(w.h.on_terminated(&uid, &exit(0), w.now).is_none());
    assert_eq!(w.list("a"), ["n1", "n2"]);
}

#[test]
fn status_carries_role_figures_and_hit_rate() {
    let mut w = World::new(spec(vec![role("a")]), &["n1", "n2", "n3"]);
    w.history("a", &["n1"]);
    let (p1, _) = w.place("a");
    w.bind(&p1, "n1");
    let (p2, d) = w.place("a");
    assert_eq!(d.reason, PlacementReason::NoAvailableHistoryNode);
    w.bind(&p2, "n3");
    w.history("a", &["n2"]);
    w.node("n2").schedulable_ready = false;
    w.place("a");
    let status = w.save();
    assert_eq!(status.schema_version, 1);
    assert_eq!(
        (status.role_count, status.node_count, status.gated_pods),
        (1, 3, 1)
    );
    let r = &status.roles[0];
    assert_eq!(
        (
            r.name.as_str(),
            r.live,
            r.gated,
            r.pinned,
            r.relaxed,
            r.anywhere
        ),
        ("a", 2, 1, 1, 0, 1)
    );
    // Bound: the first pods on n1 and n2 (no history yet), p1 on n1 (hit), p2 on n3 (miss).
    assert_eq!(w.h.counters("a").bound, 4);
    assert_eq!(status.hit_rate.as_deref(), Some("25%"));
    let n1 = status
        .nodes
        .iter()
        .find(|n| n.node == "n1")
        .expect("n1 saved");
    assert!(n1.entries.ends_with(":a"), "{}", n1.entries);
}

#[test]
fn warm_roles_need_every_declared_resource_localized() {
    use ebb_api::nodestate::{LocalizedResource, NodeStateStatus};
    use ebb_controller::placement::warm_roles;
    let s = spec(vec![
        role("a").resource("m1").resource("m2"),
        role("b").resource("m1"),
        role("c"),
    ]);
    let res = |ph: &str, role: &str, name: &str, state: &str| LocalizedResource {
        namespace: "data".into(),
        placement_history: ph.into(),
        role: role.into(),
        name: name.into(),
        state: state.into(),
        ..Default::default()
    };
    let status = NodeStateStatus {
        localized: vec![
            res("db", "a", "m1", "Localized"),
            res("db", "a", "m2", "Localized"),
            res("db", "b", "m1", "Fetching"),
            res("other", "b", "m1", "Localized"),
        ],
        ..Default::default()
    };
    let warm = warm_roles(&status, "data", "db", &s);
    assert_eq!(warm.into_iter().collect::<Vec<_>>(), ["a"]);
}

#[test]
fn persisted_role_map_with_duplicates_is_read_safely() {
    let mut w = World::new(spec(vec![role("a")]), &["n1"]);
    w.history("a", &["n1"]);
    let mut status = w.save();
    let mut dup = status.roles[0].clone();
    dup.id = 9;
    status.roles.push(dup);
    let (h, report) =
        RoleHistory::rebuild(&spec(vec![role("a")]), Some(&status), w.now).expect("rebuild");
    assert_eq!(report.malformed, 1);
    assert_eq!(h.available("a"), ["n1"]);
}

// ---------- property: random event sequences keep the history consistent ----------

#[derive(Clone, Debug)]
enum Ev {
    Place { role: usize, name: usize },
    Ask { k: usize },
    Bind { k: usize, node: usize },
    End { k: usize, kind: usize },
    Release { k: usize },
    Cancel { k: usize },
    Advance { secs: i64 },
    Toggle { node: usize, draining: bool },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        4 => (0..3usize, 0..4usize).prop_map(|(role, name)| Ev::Place { role, name }),
        2 => any::<usize>().prop_map(|k| Ev::Ask { k }),
        4 => (any::<usize>(), 0..5usize).prop_map(|(k, node)| Ev::Bind { k, node }),
        3 => (any::<usize>(), 0..6usize).prop_map(|(k, kind)| Ev::End { k, kind }),
        1 => any::<usize>().prop_map(|k| Ev::Release { k }),
        1 => any::<usize>().prop_map(|k| Ev::Cancel { k }),
        2 => (1..40i64).prop_map(|secs| Ev::Advance { secs }),
        1 => (0..5usize, any::<bool>()).prop_map(|(node, draining)| Ev::Toggle { node, draining }),
    ]
}

const ROLES: [&str; 3] = ["d", "x", "s"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_events_keep_lists_counts_and_picks_consistent(evs in prop::collection::vec(ev(), 1..80)) {
        let mut w = World::new(
            spec(vec![
                role("d").threshold(1).timeout_secs(30),
                role("x").policy(PlacementPolicy::AntiAffinity).timeout_secs(30),
                role("s").policy(PlacementPolicy::Strict),
            ]),
            &["n0", "n1", "n2", "n3", "n4"],
        );
        // Unbound pods with their last decision, and bound pods.
        let mut unbound: Vec<(String, Decision)> = Vec::new();
        let mut bound: Vec<String> = Vec::new();
        for ev in evs {
            match ev {
                Ev::Place { role, name } => {
                    let r = ROLES[role];
                    let (uid, d) = w.place_named(&format!("{r}-{name}"), r);
                    if let Some(node) = pinned(&d) {
                        let view = w.facts.get(node).expect("pinned to a known node");
                        prop_assert!(view.schedulable_ready && !view.draining_or_candidate);
                        let e = w.h.entry(node, r).cloned().expect("history node");
                        if r == "d" {
                            prop_assert!(e.failed_recently <= 1, "over threshold: {e:?}");
                        }
                        if r == "x" {
                            prop_assert_eq!(e.active(), 0, "anti-affinity doubled up on {}", node);
                        }
                    }
                    unbound.push((uid, d));
                }
                Ev::Ask { k } if !unbound.is_empty() => {
                    let i = k % unbound.len();
                    let d = w.ask(&unbound[i].0.clone());
                    unbound[i].1 = d;
                }
                Ev::Bind { k, node } if !unbound.is_empty() => {
                    let i = k % unbound.len();
                    let (uid, d) = unbound[i].clone();
                    // Gated pods cannot be bound; pinned ones only to their node.
                    let node = match &d.action {
                        Action::Wait { .. } => continue,
                        Action::Pin { node } => node.clone(),
                        _ => format!("n{node}"),
                    };
                    unbound.remove(i);
                    w.bind(&uid, &node);
                    bound.push(uid);
                }
                Ev::End { k, kind } if !bound.is_empty() => {
                    let uid = bound.remove(k % bound.len());
                    let now = w.now;
                    let term = match kind {
                        0 => exit(0).ran(600, now),
                        1 => exit(1).ran(600, now),
                        2 => exit(1).ran(5, now),
                        3 => oom().ran(600, now),
                        4 => evicted(),
                        _ => node_lost(),
                    };
                    w.end(&uid, term);
                }
                Ev::Release { k } if !bound.is_empty() => {
                    let uid = bound[k % bound.len()].clone();
                    w.h.on_releasing(&uid);
                }
                Ev::Cancel { k } if !unbound.is_empty() => {
                    let (uid, _) = unbound.remove(k % unbound.len());
                    prop_assert!(w.h.cancel(&uid));
                }
                Ev::Advance { secs } => {
                    w.advance(secs);
                    for o in w.h.overdue(w.now) {
                        // The controller deletes the pod; it never binds.
                        unbound.retain(|(u, _)| *u != o.uid);
                    }
                }
                Ev::Toggle { node, draining } => {
                    let v = w.node(&format!("n{node}"));
                    if draining {
                        v.draining_or_candidate = !v.draining_or_candidate;
                    } else {
                        v.schedulable_ready = !v.schedulable_ready;
                    }
                }
                _ => {}
            }
            // Invariants.
            for r in ROLES {
                let list = w.list(r);
                let unique: BTreeSet<&String> = list.iter().collect();
                prop_assert_eq!(unique.len(), list.len(), "duplicate in {:?}", list);
                for n in &list {
                    let e = w.h.entry(n, r).cloned().expect("listed nodes have entries");
                    prop_assert!(e.available(), "{} listed for {} but busy: {:?}", n, r, e);
                    if r == "x" {
                        prop_assert_eq!(e.active(), 0);
                    }
                }
                for (node, _) in w.h.node_map().iter() {
                    let targeting = unbound
                        .iter()
                        .filter(|(u, _)| {
                            w.h.request(u).is_some_and(|q| {
                                q.target.as_deref() == Some(node)
                                    && w.h.roles().get(q.role).is_some_and(|c| c.name == r)
                            })
                        })
                        .count();
                    let requested = w.h.entry(node, r).map_or(0, |e| e.requested) as usize;
                    prop_assert_eq!(requested, targeting, "requested count of {} for {}", node, r);
                }
            }
        }
    }
}

#[test]
fn warm_landing_is_a_hit_and_replays_are_not_placements() {
    let s = spec(vec![role("a").resource("model")]);
    let mut w = World::new(s.clone(), &["n1", "n2"]);
    w.node("n2").warm_roles.insert("a".into());
    w.run("a", "n1");
    w.run("a", "n2");
    let c = w.h.counters("a");
    assert_eq!((c.bound, c.hits), (2, 1), "only the warm node is a hit");
    let status = w.save();
    assert_eq!(status.hit_rate.as_deref(), Some("50%"));
    let (mut h, _) = RoleHistory::rebuild(&s, Some(&status), w.now).expect("rebuild");
    let pod = PodRef {
        uid: "uid-1",
        name: "a-1",
        role: "a",
    };
    assert!(h.replay_pod(pod, "n1", true, w.now).expect("replay"));
    assert_eq!(h.counters("a").bound, 0);
    assert_eq!(h.entry("n1", "a").map(|e| e.live), Some(1));
}

#[test]
fn a_pod_stopped_by_its_deletion_is_told_from_one_that_ended_first() {
    let pod = |deletion: Option<(&str, i64)>, finished: Option<&str>| {
        let mut p =
            serde_json::json!({"metadata": {"name": "db-0"}, "status": {"phase": "Failed"}});
        if let Some((at, grace)) = deletion {
            p["metadata"]["deletionTimestamp"] = at.into();
            p["metadata"]["deletionGracePeriodSeconds"] = grace.into();
        }
        if let Some(f) = finished {
            p["status"]["containerStatuses"] = serde_json::json!([
                {"name": "a", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 143, "finishedAt": f}}}]);
        }
        serde_json::from_value::<ebb_controller::cluster::CachedPod>(p).expect("pod literal")
    };
    // Deletion asked at 00:00:00 (30 s grace): the container stopped at 00:00:05, killed by it.
    assert!(ebb_controller::placement::deleted_before_it_ended(&pod(
        Some(("2026-01-01T00:00:30Z", 30)),
        Some("2026-01-01T00:00:05Z")
    )));
    // Killed at the very end of its grace period.
    assert!(ebb_controller::placement::deleted_before_it_ended(&pod(
        Some(("2026-01-01T00:00:30Z", 30)),
        Some("2026-01-01T00:00:30Z")
    )));
    // Ended on its own at 23:59:00, deleted afterwards (a clean-up): its exit counts.
    assert!(!ebb_controller::placement::deleted_before_it_ended(&pod(
        Some(("2026-01-01T00:00:30Z", 30)),
        Some("2025-12-31T23:59:00Z")
    )));
    // Deleted with no container end recorded (force delete of a running pod).
    assert!(ebb_controller::placement::deleted_before_it_ended(&pod(
        Some(("2026-01-01T00:00:00Z", 0)),
        None
    )));
    // Never deleted.
    assert!(!ebb_controller::placement::deleted_before_it_ended(&pod(
        None,
        Some("2026-01-01T00:00:05Z")
    )));
}
