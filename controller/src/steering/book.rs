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
    /// Prefer this node (the slot is now the pod's).
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
    /// Replacements bound elsewhere, or not steered although their owner had planned
    /// destinations, by reason.
    pub fell_back: BTreeMap<Fallback, u64>,
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

/// A slot handed to a replacement, waiting to see where it is bound.
#[derive(Clone, Debug)]
struct Given {
    slot: Slot,
    at: Timestamp,
}

/// Planned destinations per owner, open and given, with each policy's tally.
#[derive(Clone, Debug, Default)]
pub struct SteeringBook {
    open: BTreeMap<OwnerKey, VecDeque<Slot>>,
    given: BTreeMap<OwnerKey, Vec<Given>>,
    tallies: BTreeMap<String, Tally>,
}

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

    /// A replacement of `owner` is being created at `now`: the first of its owner's open slots
    /// whose node can take pods (`unusable` says why one cannot), oldest first. Slots whose node cannot are dropped (counted as
    /// fallbacks). `None` when the owner has no open slot (not a replacement ebb planned).
    pub fn assign(
        &mut self,
        owner: &OwnerKey,
        now: Timestamp,
        unusable: &dyn Fn(&str) -> Option<Fallback>,
    ) -> Option<Assignment> {
        let queue = self.open.get_mut(owner)?;
        let mut dropped: Vec<(String, Fallback)> = Vec::new();
        let mut taken = None;
        while let Some(slot) = queue.pop_front() {
            match unusable(&slot.node) {
                None => {
                    taken = Some(slot);
                    break;
                }
                Some(reason) => dropped.push((slot.policy, reason)),
            }
        }
        self.drop_empty(owner);
        for (policy, reason) in &dropped {
            self.count_fallback(policy, *reason);
        }
        match taken {
            Some(slot) => {
                let a = Assignment::Steer {
                    node: slot.node.clone(),
                    policy: slot.policy.clone(),
                };
                self.tallies.entry(slot.policy.clone()).or_default().steered += 1;
                self.given
                    .entry(owner.clone())
                    .or_default()
                    .push(Given { slot, at: now });
                Some(a)
            }
            None => dropped
                .pop()
                .map(|(policy, reason)| Assignment::FellBack { policy, reason }),
        }
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

    /// A replacement of `owner` steered to `planned` was bound to `actual`: the slot is closed
    /// and counted. `None` when no such slot was given (bound before, or not ebb's).
    pub fn landed(
        &mut self,
        owner: &OwnerKey,
        planned: &str,
        actual: &str,
        unusable: &dyn Fn(&str) -> Option<Fallback>,
    ) -> Option<(Slot, Landing)> {
        let given = self.given.get_mut(owner)?;
        let i = given.iter().position(|g| g.slot.node == planned)?;
        let g = given.remove(i);
        if given.is_empty() {
            self.given.remove(owner);
        }
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

    /// Open slots older than `ttl` are dropped (their replacements never came, or came before
    /// the slot opened), counted as `Expired`; given slots whose pod has not been seen bound
    /// within `ttl` are forgotten.
    pub fn expire(&mut self, now: Timestamp, ttl: SignedDuration) {
        let cutoff = now - ttl;
        let mut expired: Vec<String> = Vec::new();
        for q in self.open.values_mut() {
            while q.front().is_some_and(|s| s.opened < cutoff) {
                if let Some(s) = q.pop_front() {
                    expired.push(s.policy);
                }
            }
        }
        self.open.retain(|_, q| !q.is_empty());
        for g in self.given.values_mut() {
            g.retain(|g| g.at >= cutoff);
        }
        self.given.retain(|_, g| !g.is_empty());
        for p in expired {
            self.count_fallback(&p, Fallback::Expired);
        }
    }

    /// The tally of `policy`.
    pub fn tally(&self, policy: &str) -> Tally {
        self.tallies.get(policy).cloned().unwrap_or_default()
    }

    /// Open slots of `policy` (waiting for their replacements).
    pub fn open_count(&self, policy: &str) -> usize {
        self.open
            .values()
            .flatten()
            .filter(|s| s.policy == policy)
            .count()
    }

    /// Planned nodes of the open slots, for the model: each counts where its pod will go.
    pub fn open_slots(&self) -> impl Iterator<Item = (&OwnerKey, &Slot)> {
        self.open
            .iter()
            .flat_map(|(o, q)| q.iter().map(move |s| (o, s)))
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
            b.assign(&other, ts(2), &|n| all_up().unusable(n)),
            None,
            "not a replacement"
        );
        let first = b.assign(&web(), ts(2), &|n| all_up().unusable(n));
        assert_eq!(
            first,
            Some(Assignment::Steer {
                node: "keep-0".into(),
                policy: "pool".into()
            })
        );
        let second = b.assign(&web(), ts(2), &|n| all_up().unusable(n));
        assert!(matches!(second, Some(Assignment::Steer { node, .. }) if node == "keep-1"));
        assert_eq!(
            b.assign(&web(), ts(3), &|n| all_up().unusable(n)),
            None,
            "each slot once"
        );
        assert!(b.is_empty());
        assert_eq!(b.tally("pool").steered, 2);
    }

    #[test]
    fn a_destination_that_cannot_take_pods_falls_back_at_once() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("gone", 0));
        b.open(web(), slot("cordoned", 0));
        b.open(web(), slot("keep-0", 0));
        let nodes = Nodes {
            gone: ["gone"].into(),
            cordoned: ["cordoned"].into(),
        };
        let a = b.assign(&web(), ts(1), &|n| nodes.unusable(n));
        assert!(matches!(a, Some(Assignment::Steer { node, .. }) if node == "keep-0"));
        let t = b.tally("pool");
        assert_eq!(t.fell_back.get(&Fallback::NodeGone), Some(&1));
        assert_eq!(t.fell_back.get(&Fallback::NodeUnavailable), Some(&1));
        // Nothing usable left: the scheduler chooses, and the reason is given.
        b.open(web(), slot("gone", 2));
        assert_eq!(
            b.assign(&web(), ts(3), &|n| nodes.unusable(n)),
            Some(Assignment::FellBack {
                policy: "pool".into(),
                reason: Fallback::NodeGone
            })
        );
    }

    #[test]
    fn landings_are_counted_on_plan_or_with_the_reason() {
        let mut b = SteeringBook::default();
        for n in ["keep-0", "keep-1", "keep-2"] {
            b.open(web(), slot(n, 0));
            b.assign(&web(), ts(1), &|n| all_up().unusable(n));
        }
        let landed = |b: &mut SteeringBook, planned: &str, actual: &str, nodes: &Nodes| {
            b.landed(&web(), planned, actual, &|n| nodes.unusable(n))
                .map(|(slot, landing)| (slot.policy, landing))
        };
        assert_eq!(
            landed(&mut b, "keep-0", "keep-0", &all_up()),
            Some(("pool".into(), Landing::OnPlan))
        );
        assert_eq!(landed(&mut b, "keep-0", "keep-0", &all_up()), None, "once");
        assert_eq!(
            landed(&mut b, "keep-1", "keep-9", &all_up()),
            Some((
                "pool".into(),
                Landing::Elsewhere(Fallback::SchedulerChoseAnother)
            ))
        );
        let gone = Nodes {
            gone: ["keep-2"].into(),
            cordoned: BTreeSet::new(),
        };
        assert_eq!(
            landed(&mut b, "keep-2", "keep-9", &gone),
            Some(("pool".into(), Landing::Elsewhere(Fallback::NodeGone)))
        );
        let t = b.tally("pool");
        assert_eq!((t.steered, t.on_plan, t.fell_back_total()), (3, 1, 2));
        assert_eq!(t.on_plan_percent().map(|p| p.round()), Some(33.0));
    }

    #[test]
    fn slots_nobody_took_expire() {
        let mut b = SteeringBook::default();
        b.open(web(), slot("keep-0", 0));
        b.open(web(), slot("keep-1", 50));
        b.expire(ts(70), SignedDuration::from_secs(60));
        assert_eq!(b.open_count("pool"), 1);
        assert_eq!(b.tally("pool").fell_back.get(&Fallback::Expired), Some(&1));
        let a = b.assign(&web(), ts(71), &|n| all_up().unusable(n));
        assert!(matches!(a, Some(Assignment::Steer { node, .. }) if node == "keep-1"));
        b.expire(ts(200), SignedDuration::from_secs(60));
        assert!(
            b.landed(&web(), "keep-1", "keep-1", &|n| all_up().unusable(n))
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
            b.assign(&web(), ts(2), &|n| nodes.unusable(n)),
            Some(Assignment::Steer {
                node: "keep-1".into(),
                policy: "pool".into()
            })
        );
        b.withdraw(&web(), "default/web-unknown");
        assert!(!b.has_open(&web()), "nothing left to give");
        assert!(b.is_empty());
    }
}
