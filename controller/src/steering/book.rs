//! The steering book: for each owner with pods evicted by a drain, the nodes the plan put them
//! on, handed one by one to the owner's replacements as they are created, and what became of them.

use std::collections::{BTreeMap, VecDeque};

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

/// The workload a pod belongs to: its controller's kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// One planned destination of an evicted pod, waiting for its replacement.
#[derive(Clone, Debug)]
pub struct Slot {
    /// Where the plan put the evicted pod.
    pub node: String,
    /// The policy whose drain evicted it.
    pub policy: String,
    /// The node it was evicted from.
    pub from: String,
    /// `namespace/name` of the evicted pod.
    pub evicted: String,
    /// When the eviction was accepted.
    pub opened: Timestamp,
    /// The drain's place in its trace: the replacement's landing is traced under it.
    pub trace: ebb_telemetry::TraceParent,
}

/// Why a replacement was not steered, or did not land where it was steered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Fallback {
    /// Its planned node is gone.
    NodeGone,
    /// Its planned node is cordoned, tainted `NoSchedule`/`NoExecute`, or being removed.
    NodeUnavailable,
    /// The scheduler put it elsewhere (its planned node had no room left, or scored lower).
    SchedulerChoseAnother,
    /// The planned destinations of its owner expired before it was created.
    Expired,
}

impl Fallback {
    pub const ALL: [Fallback; 4] = [
        Fallback::NodeGone,
        Fallback::NodeUnavailable,
        Fallback::SchedulerChoseAnother,
        Fallback::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::NodeGone => "NodeGone",
            Fallback::NodeUnavailable => "NodeUnavailable",
            Fallback::SchedulerChoseAnother => "SchedulerChoseAnother",
            Fallback::Expired => "Expired",
        }
    }
}

/// What the book answers for a pod being created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// Prefer this node (the slot is held for the pod until the watch sees it).
    Steer { node: String, policy: String },
    /// Its owner has planned destinations, but none can take it: the scheduler chooses.
    FellBack { policy: String, reason: Fallback },
}

/// How a steered replacement ended up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Landing {
    OnPlan,
    Elsewhere(Fallback),
}

/// Counts of one policy's replacements since the controller started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Replacements given a planned node at creation.
    pub steered: u64,
    /// Steered replacements bound to their planned node.
    pub on_plan: u64,
    /// Replacements bound elsewhere, or planned destinations dropped unused, by reason.
    pub fell_back: BTreeMap<Fallback, u64>,
    /// Destinations handed out at admission whose pod never appeared (refused after the
    /// webhook answered, or a request that was not the API server's): offered again.
    pub not_created: u64,
}

impl Tally {
    pub fn fell_back_total(&self) -> u64 {
        self.fell_back.values().sum()
    }

    /// Share of the replacements that landed on their planned node, in percent (`None` before
    /// the first one landed or fell back).
    pub fn on_plan_percent(&self) -> Option<f64> {
        let decided = self.on_plan + self.fell_back_total();
        (decided > 0).then(|| self.on_plan as f64 * 100.0 / decided as f64)
    }
}

/// The key of a pod: (namespace, name).
pub type PodKey = (String, String);

/// A slot handed out at admission under a ticket, until a pod carrying that ticket is seen.
#[derive(Clone, Debug)]
struct Held {
    owner: OwnerKey,
    slot: Slot,
    at: Timestamp,
}

/// A slot whose replacement the pod watch has seen, until it is bound (or forgotten).
#[derive(Clone, Debug)]
struct Given {
    ticket: String,
    slot: Slot,
    at: Timestamp,
}

/// What the pod watch learns of a pod carrying a ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The planned node of the slot the pod holds.
    pub node: String,
    pub policy: String,
    /// First time this pod was seen with the ticket (counted as steered now).
    pub new: bool,
}

/// Planned destinations per owner: open, held by a ticket an admission handed out, given to
/// the pod seen carrying that ticket; with each policy's tally.
///
/// Only the pod watch counts: an admission takes a slot tentatively (a pod refused after the
/// webhook answered, a dry run or a request that was not the API server's never appears, and
/// its slot is offered again after [`HOLD_TTL`]); a ticket is claimed by the first pod seen
/// carrying it, of the owner the slot was opened for, and by no other.
#[derive(Clone, Debug, Default)]
pub struct SteeringBook {
    open: BTreeMap<OwnerKey, VecDeque<Slot>>,
    held: BTreeMap<String, Held>,
    given: BTreeMap<PodKey, Given>,
    tallies: BTreeMap<String, Tally>,
}

/// What one sweep ([`SteeringBook::expire`]) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Pods whose slots were forgotten (the model stops counting them).
    pub forgotten: Vec<PodKey>,
    /// The policy of each held slot whose pod never appeared.
    pub not_created: Vec<String>,
    /// Open slots dropped, with their policy and why.
    pub dropped: Vec<(String, Fallback)>,
}

/// How long a destination handed out at admission is kept from another replacement of its
/// owner that finds none open: a real replacement is seen by the pod watch well within this.
pub const HOLD_STEAL: SignedDuration = SignedDuration::from_secs(5);

/// How long a slot handed out at admission waits for its pod to be seen before it is offered
/// again (the API server stores a pod within its request timeout; the watch reports it within
/// seconds).
pub const HOLD_TTL: SignedDuration = SignedDuration::from_secs(30);

impl SteeringBook {
    /// A pod of `owner` was evicted; the plan put it on `slot.node`.
    pub fn open(&mut self, owner: OwnerKey, slot: Slot) {
        self.open.entry(owner).or_default().push_back(slot);
    }

    /// Removes the open slot of the evicted pod `evicted` (its eviction was not accepted).
    pub fn withdraw(&mut self, owner: &OwnerKey, evicted: &str) {
        if let Some(q) = self.open.get_mut(owner)
            && let Some(i) = q.iter().position(|s| s.evicted == evicted)
        {
            q.remove(i);
        }
        self.drop_empty(owner);
    }

    /// Whether any owner has planned destinations (the admission path answers at once if not).
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Owners with open slots, for a quick check on the admission path.
    pub fn has_open(&self, owner: &OwnerKey) -> bool {
        self.open.get(owner).is_some_and(|q| !q.is_empty())
    }

    /// A replacement of `owner` is being created at `now`: the oldest of its owner's open slots
    /// whose node can take pods (`unusable` says why one cannot) is held under `ticket` until
    /// a pod carrying it is seen. Slots whose node cannot take pods stay open (the sweep in
    /// [`SteeringBook::expire`] drops and counts them): an admission counts nothing. `None`
    /// when the owner has no open slot (not a replacement ebb planned).
    pub fn hold(
        &mut self,
        owner: &OwnerKey,
        ticket: &str,
        now: Timestamp,
        unusable: &dyn Fn(&str) -> Option<Fallback>,
    ) -> Option<Assignment> {
        let mut reason = None;
        let mut taken: Option<Slot> = None;
        if let Some(queue) = self.open.get_mut(owner) {
            let mut usable = None;
            for (i, slot) in queue.iter().enumerate() {
                match unusable(&slot.node) {
                    None => {
                        usable = Some(i);
                        break;
                    }
                    Some(r) => {
                        reason.get_or_insert((slot.policy.clone(), r));
                    }
                }
            }
            taken = usable.and_then(|i| queue.remove(i));
        }
        self.drop_empty(owner);
        // None open: a destination held longer than [`HOLD_STEAL`] by a ticket no pod carried
        // (a request not followed by a pod) goes to this one.
        let slot = match taken {
            Some(slot) => slot,
            None => {
                let stale = self
                    .held
                    .iter()
                    .filter(|(_, h)| {
                        &h.owner == owner
                            && h.at < now - HOLD_STEAL
                            && unusable(&h.slot.node).is_none()
                    })
                    .min_by_key(|(_, h)| h.at)
                    .map(|(t, _)| t.clone());
                let Some(held) = stale.and_then(|t| self.held.remove(&t)) else {
                    return reason.map(|(policy, reason)| Assignment::FellBack { policy, reason });
                };
                self.tallies
                    .entry(held.slot.policy.clone())
                    .or_default()
                    .not_created += 1;
                held.slot
            }
        };
        let a = Assignment::Steer {
            node: slot.node.clone(),
            policy: slot.policy.clone(),
        };
        self.held.insert(
            ticket.to_string(),
            Held {
                owner: owner.clone(),
                slot,
                at: now,
            },
        );
        Some(a)
    }

    /// Whether `owner` has destinations waiting: open, or held by a ticket no pod carried yet.
    pub fn has_waiting(&self, owner: &OwnerKey) -> bool {
        self.has_open(owner) || self.held.values().any(|h| &h.owner == owner)
    }

    fn drop_empty(&mut self, owner: &OwnerKey) {
        if self.open.get(owner).is_some_and(VecDeque::is_empty) {
            self.open.remove(owner);
        }
    }

    fn count_fallback(&mut self, policy: &str, reason: Fallback) {
        *self
            .tallies
            .entry(policy.to_string())
            .or_default()
            .fell_back
            .entry(reason)
            .or_insert(0) += 1;
    }

    /// The pod watch saw `pod` (of `owner`) carrying `ticket`: the slot held under the ticket is
    /// now the pod's, counted as steered once. `None` when the ticket is not one this book
    /// handed out, was claimed by another pod, or was handed out for another owner.
    pub fn claim(
        &mut self,
        ticket: &str,
        pod: &PodKey,
        owner: &OwnerKey,
        now: Timestamp,
    ) -> Option<Claim> {
        if let Some(g) = self.given.get(pod) {
            return (g.ticket == ticket).then(|| Claim {
                node: g.slot.node.clone(),
                policy: g.slot.policy.clone(),
                new: false,
            });
        }
        if self.held.get(ticket).is_none_or(|h| &h.owner != owner) {
            return None;
        }
        let held = self.held.remove(ticket)?;
        self.tallies
            .entry(held.slot.policy.clone())
            .or_default()
            .steered += 1;
        let claim = Claim {
            node: held.slot.node.clone(),
            policy: held.slot.policy.clone(),
            new: true,
        };
        self.given.insert(
            pod.clone(),
            Given {
                ticket: ticket.to_string(),
                slot: held.slot,
                at: now,
            },
        );
        Some(claim)
    }

    /// The replacement `pod`, holding `ticket`, was bound to `actual`: its slot is closed and
    /// counted on plan or with the reason it is elsewhere. `None` when the pod holds no slot
    /// under that ticket (bound before, or not ebb's).
    pub fn landed(
        &mut self,
        pod: &PodKey,
        ticket: &str,
        actual: &str,
        unusable: &dyn Fn(&str) -> Option<Fallback>,
    ) -> Option<(Slot, Landing)> {
        if self.given.get(pod).is_none_or(|g| g.ticket != ticket) {
            return None;
        }
        let g = self.given.remove(pod)?;
        let planned = g.slot.node.as_str();
        let landing = if planned == actual {
            self.tallies
                .entry(g.slot.policy.clone())
                .or_default()
                .on_plan += 1;
            Landing::OnPlan
        } else {
            let reason = unusable(planned).unwrap_or(Fallback::SchedulerChoseAnother);
            self.count_fallback(&g.slot.policy, reason);
            Landing::Elsewhere(reason)
        };
        Some((g.slot, landing))
    }

    /// The pod `pod` was deleted before it was bound: its slot is forgotten.
    pub fn deleted(&mut self, pod: &PodKey) -> bool {
        self.given.remove(pod).is_some()
    }

    /// The pod holding a slot under `ticket`, if the watch has seen it.
    pub fn holder(&self, pod: &PodKey) -> Option<&str> {
        self.given.get(pod).map(|g| g.slot.node.as_str())
    }

    /// The sweep, once per loop:
    /// - slots held longer than [`HOLD_TTL`] whose pod never appeared are offered again (first
    ///   in their owner's queue) and counted `notCreated`;
    /// - open slots whose node cannot take pods any more are dropped, counted by reason;
    /// - open slots older than `ttl` are dropped (their replacements never came, or came before
    ///   the slot opened), counted as `Expired`;
    /// - given slots whose pod has not been seen bound within `ttl` are forgotten.
    ///
    /// Returns what it did, for metrics and the model.
    pub fn expire(
        &mut self,
        now: Timestamp,
        ttl: SignedDuration,
        unusable: &dyn Fn(&str) -> Option<Fallback>,
    ) -> Swept {
        let cutoff = now - ttl;
        let hold_cutoff = now - HOLD_TTL;
        let stale: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.at < hold_cutoff)
            .map(|(t, _)| t.clone())
            .collect();
        let mut not_created = Vec::new();
        for ticket in stale {
            if let Some(h) = self.held.remove(&ticket) {
                self.tallies
                    .entry(h.slot.policy.clone())
                    .or_default()
                    .not_created += 1;
                not_created.push(h.slot.policy.clone());
                self.open.entry(h.owner).or_default().push_front(h.slot);
            }
        }
        let mut dropped: Vec<(String, Fallback)> = Vec::new();
        for q in self.open.values_mut() {
            q.retain(|s| {
                let reason = if s.opened < cutoff {
                    Some(Fallback::Expired)
                } else {
                    unusable(&s.node)
                };
                if let Some(r) = reason {
                    dropped.push((s.policy.clone(), r));
                }
                reason.is_none()
            });
        }
        self.open.retain(|_, q| !q.is_empty());
        let forgotten: Vec<PodKey> = self
            .given
            .iter()
            .filter(|(_, g)| g.at < cutoff)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &forgotten {
            self.given.remove(k);
        }
        for (p, r) in &dropped {
            self.count_fallback(p, *r);
        }
        Swept {
            forgotten,
            not_created,
            dropped,
        }
    }

    /// The tally of `policy`.
    pub fn tally(&self, policy: &str) -> Tally {
        self.tallies.get(policy).cloned().unwrap_or_default()
    }

    /// Slots of `policy` waiting for their replacement: open, or held by an admission whose
    /// pod has not been seen yet.
    pub fn open_count(&self, policy: &str) -> usize {
        self.open
            .values()
            .flatten()
            .chain(self.held.values().map(|h| &h.slot))
            .filter(|s| s.policy == policy)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    struct Nodes {
        gone: BTreeSet<&'static str>,
        cordoned: BTreeSet<&'static str>,
    }

    impl Nodes {
        fn unusable(&self, node: &str) -> Option<Fallback> {
            if self.gone.contains(node) {
                Some(Fallback::NodeGone)
            } else if self.cordoned.contains(node) {
                Some(Fallback::NodeUnavailable)
            } else {
                None
            }
        }
    }

    fn all_up() -> Nodes {
        Nodes {
            gone: BTreeSet::new(),
            cordoned: BTreeSet::new(),
        }
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap_or_default()
    }

    fn web() -> OwnerKey {
        OwnerKey {
            kind: "ReplicaSet".into(),
            namespace: "default".into(),
            name: "web".into(),
        }
    }

    fn slot(node: &str, at: i64) -> Slot {
        Slot {
            node: node.into(),
            policy: "pool".into(),
            from: "drain-0".into(),
            evicted: format!("default/web-{node}"),
            opened: ts(at),
            trace: Default::default(),
        }
    }

    fn key(name: &str) -> PodKey {
        ("default".into(), name.into())
    }

    /// Holds the next destination of `web` under `ticket` and has the watch see `pod` carry it.
    fn steer(b: &mut SteeringBook, ticket: &str, pod: &str, at: i64) -> Option<String> {
        match b.hold(&web(), ticket, ts(at), &|n| all_up().unusable(n))? {
            Assignment::Steer { .. } => {}
            Assignment::FellBack { .. } => return None,
        }
        b.claim(ticket, &key(pod), &web(), ts(at)).map(|c| c.node)
    }

    #[test]
    fn replacements_take_their_owners_destinations_in_order_once_each() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("keep-0", 0));
        b.open(web(), slot("keep-1", 1));
        let other = OwnerKey {
            name: "db".into(),
            ..web()
        };
        assert_eq!(
            b.hold(&other, "t0", ts(2), &|n| all_up().unusable(n)),
            None,
            "not a replacement"
        );
        let first = b.hold(&web(), "t1", ts(2), &|n| all_up().unusable(n));
        assert_eq!(
            first,
            Some(Assignment::Steer {
                node: "keep-0".into(),
                policy: "pool".into()
            })
        );
        let second = b.hold(&web(), "t2", ts(2), &|n| all_up().unusable(n));
        assert!(matches!(second, Some(Assignment::Steer { node, .. }) if node == "keep-1"));
        assert_eq!(
            b.hold(&web(), "t3", ts(3), &|n| all_up().unusable(n)),
            None,
            "each slot once"
        );
        assert!(b.is_empty());
        assert_eq!(
            b.tally("pool").steered,
            0,
            "nothing counts before a pod is seen"
        );
        assert_eq!(b.open_count("pool"), 2, "held slots still wait");
    }

    #[test]
    fn only_the_first_pod_seen_with_a_ticket_of_its_owner_claims_it() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("keep-0", 0));
        assert!(matches!(
            b.hold(&web(), "t1", ts(1), &|n| all_up().unusable(n)),
            Some(Assignment::Steer { .. })
        ));
        let db = OwnerKey {
            name: "db".into(),
            ..web()
        };
        assert_eq!(b.claim("forged", &key("web-a"), &web(), ts(2)), None);
        assert_eq!(
            b.claim("t1", &key("db-a"), &db, ts(2)),
            None,
            "another owner"
        );
        let c = b.claim("t1", &key("web-a"), &web(), ts(2));
        assert_eq!(
            c,
            Some(Claim {
                node: "keep-0".into(),
                policy: "pool".into(),
                new: true
            })
        );
        assert_eq!(
            b.claim("t1", &key("web-a"), &web(), ts(3)).map(|c| c.new),
            Some(false),
            "seen again: same slot, counted once"
        );
        assert_eq!(
            b.claim("t1", &key("web-copy"), &web(), ts(3)),
            None,
            "a copied ticket"
        );
        assert_eq!(b.holder(&key("web-a")), Some("keep-0"));
        assert_eq!(b.holder(&key("web-copy")), None);
        assert_eq!(b.tally("pool").steered, 1);
    }

    #[test]
    fn a_destination_that_cannot_take_pods_is_skipped_then_dropped_by_the_sweep() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("gone", 0));
        b.open(web(), slot("cordoned", 0));
        b.open(web(), slot("keep-0", 0));
        let nodes = Nodes {
            gone: ["gone"].into(),
            cordoned: ["cordoned"].into(),
        };
        let a = b.hold(&web(), "t1", ts(1), &|n| nodes.unusable(n));
        assert!(matches!(a, Some(Assignment::Steer { node, .. }) if node == "keep-0"));
        assert_eq!(
            b.tally("pool").fell_back_total(),
            0,
            "an admission counts nothing"
        );
        // Nothing usable left: the scheduler chooses, and the reason is given.
        assert_eq!(
            b.hold(&web(), "t2", ts(2), &|n| nodes.unusable(n)),
            Some(Assignment::FellBack {
                policy: "pool".into(),
                reason: Fallback::NodeGone
            })
        );
        b.expire(ts(3), SignedDuration::from_mins(10), &|n| nodes.unusable(n));
        let t = b.tally("pool");
        assert_eq!(t.fell_back.get(&Fallback::NodeGone), Some(&1));
        assert_eq!(t.fell_back.get(&Fallback::NodeUnavailable), Some(&1));
        assert!(!b.has_open(&web()));
    }

    #[test]
    fn landings_are_counted_for_the_pod_that_holds_the_slot() {
        let mut b = SteeringBook::default();
        for (i, n) in ["keep-0", "keep-1", "keep-2"].iter().enumerate() {
            b.open(web(), slot(n, 0));
            assert_eq!(
                steer(&mut b, &format!("t{i}"), &format!("web-{i}"), 1).as_deref(),
                Some(*n)
            );
        }
        let landed =
            |b: &mut SteeringBook, pod: &str, ticket: &str, actual: &str, nodes: &Nodes| {
                b.landed(&key(pod), ticket, actual, &|n| nodes.unusable(n))
                    .map(|(slot, landing)| (slot.node, landing))
            };
        // Another pod's binding (or a forged ticket) never closes web-0's slot.
        assert_eq!(landed(&mut b, "web-1", "t0", "keep-0", &all_up()), None);
        assert_eq!(
            landed(&mut b, "web-0", "t0", "keep-0", &all_up()),
            Some(("keep-0".into(), Landing::OnPlan))
        );
        assert_eq!(
            landed(&mut b, "web-0", "t0", "keep-0", &all_up()),
            None,
            "once"
        );
        assert_eq!(
            landed(&mut b, "web-1", "t1", "keep-9", &all_up()),
            Some((
                "keep-1".into(),
                Landing::Elsewhere(Fallback::SchedulerChoseAnother)
            ))
        );
        let gone = Nodes {
            gone: ["keep-2"].into(),
            cordoned: BTreeSet::new(),
        };
        assert_eq!(
            landed(&mut b, "web-2", "t2", "keep-9", &gone),
            Some(("keep-2".into(), Landing::Elsewhere(Fallback::NodeGone)))
        );
        let t = b.tally("pool");
        assert_eq!((t.steered, t.on_plan, t.fell_back_total()), (3, 1, 2));
        assert_eq!(t.on_plan_percent().map(|p| p.round()), Some(33.0));
    }

    #[test]
    fn a_held_slot_whose_pod_never_appears_is_offered_again_and_counted() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("keep-0", 0));
        b.open(web(), slot("keep-1", 0));
        // A forged review, a dry run that slipped through, or a pod a quota refused.
        assert!(matches!(
            b.hold(&web(), "never", ts(1), &|n| all_up().unusable(n)),
            Some(Assignment::Steer { node, .. }) if node == "keep-0"
        ));
        b.expire(
            ts(1) + HOLD_TTL - SignedDuration::from_secs(1),
            SignedDuration::from_mins(10),
            &|n| all_up().unusable(n),
        );
        assert_eq!(b.tally("pool").not_created, 0, "still within the hold");
        b.expire(ts(2) + HOLD_TTL, SignedDuration::from_mins(10), &|n| {
            all_up().unusable(n)
        });
        let t = b.tally("pool");
        assert_eq!((t.not_created, t.steered, t.fell_back_total()), (1, 0, 0));
        assert_eq!(
            b.claim("never", &key("late"), &web(), ts(40)),
            None,
            "its ticket is void"
        );
        // The real replacement gets the same destination, first in line again.
        assert_eq!(
            steer(&mut b, "real", "web-a", 41).as_deref(),
            Some("keep-0")
        );
    }

    #[test]
    fn a_destination_held_by_a_request_no_pod_followed_goes_to_the_next_replacement() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("keep-0", 0));
        let up = |n: &str| all_up().unusable(n);
        assert!(b.hold(&web(), "forged", ts(1), &up).is_some());
        // Within HOLD_STEAL a real replacement finds nothing (the scheduler chooses)...
        assert_eq!(b.hold(&web(), "early", ts(2), &up), None);
        // ...after it, the destination is its.
        let later = ts(1) + HOLD_STEAL + SignedDuration::from_secs(1);
        assert!(matches!(
            b.hold(&web(), "real", later, &up),
            Some(Assignment::Steer { node, .. }) if node == "keep-0"
        ));
        assert_eq!(b.claim("forged", &key("x"), &web(), later), None, "void");
        assert_eq!(
            b.claim("real", &key("web-a"), &web(), later)
                .map(|c| c.node),
            Some("keep-0".to_string())
        );
        let t = b.tally("pool");
        assert_eq!((t.steered, t.not_created), (1, 1));
    }

    #[test]
    fn slots_nobody_took_expire() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("keep-0", 0));
        b.open(web(), slot("keep-1", 50));
        b.expire(ts(70), SignedDuration::from_secs(60), &|n| {
            all_up().unusable(n)
        });
        assert_eq!(b.open_count("pool"), 1);
        assert_eq!(b.tally("pool").fell_back.get(&Fallback::Expired), Some(&1));
        assert_eq!(steer(&mut b, "t1", "web-a", 71).as_deref(), Some("keep-1"));
        let swept = b.expire(ts(200), SignedDuration::from_secs(60), &|n| {
            all_up().unusable(n)
        });
        assert_eq!(swept.forgotten, vec![key("web-a")]);
        assert!(
            b.landed(&key("web-a"), "t1", "keep-1", &|n| all_up().unusable(n))
                .is_none(),
            "forgotten"
        );
    }

    #[test]
    fn a_withdrawn_slot_is_never_given_and_the_others_stay() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("keep-0", 0));
        b.open(web(), slot("keep-1", 1));
        b.withdraw(&web(), "default/web-keep-0");
        let nodes = all_up();
        assert_eq!(
            b.hold(&web(), "t", ts(2), &|n| nodes.unusable(n)),
            Some(Assignment::Steer {
                node: "keep-1".into(),
                policy: "pool".into()
            })
        );
        b.withdraw(&web(), "default/web-unknown");
        assert!(!b.has_open(&web()), "nothing left to give");
        assert!(b.is_empty());
    }

    #[test]
    fn a_pod_deleted_before_binding_gives_up_its_slot() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("keep-0", 0));
        assert!(steer(&mut b, "t", "web-a", 1).is_some());
        assert!(b.deleted(&key("web-a")));
        assert!(!b.deleted(&key("web-a")));
        assert_eq!(b.holder(&key("web-a")), None);
    }
}
