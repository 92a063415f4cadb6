//! Whether the API server really calls the webhook: a replacement created for an owner with
//! planned destinations, for which no admission of that owner was seen, is a miss; a few misses
//! in a row mean steering is off in fact, whatever the registration says.

use std::collections::{BTreeMap, HashMap};

use jiff::{SignedDuration, Timestamp};

use super::book::{OwnerKey, PodKey};

/// Misses in a row (no admission seen in between) that turn steering off in status.
pub const MISSES: usize = 3;
/// An admission of the owner this long before a pod's creation still counts as its own (the
/// API server admits a pod before it stores it; clocks of one machine).
const SLACK: SignedDuration = SignedDuration::from_secs(10);
/// A pod first seen this long after its creation is not judged (the controller was starting,
/// or the watch re-listed): its admission may have gone to an earlier process.
const FRESH: SignedDuration = SignedDuration::from_secs(30);
/// Admissions are remembered this long.
const KEEP: SignedDuration = SignedDuration::from_mins(10);
/// Misses remembered at most (the streak is what matters).
const KEEP_MISSES: usize = 16;

/// What was seen of admissions and of the replacements created meanwhile.
#[derive(Default, Debug)]
pub struct Reach {
    /// Last admission per owner.
    admitted: HashMap<OwnerKey, Timestamp>,
    /// Replacements created with no admission seen, since the last admission or steered pod.
    missed: BTreeMap<PodKey, Timestamp>,
}

impl Reach {
    /// The webhook was called for a pod of `owner`, which had planned destinations.
    pub fn admitted(&mut self, owner: &OwnerKey, now: Timestamp) {
        self.admitted.insert(owner.clone(), now);
        self.missed.clear();
        self.admitted.retain(|_, t| now.duration_since(*t) < KEEP);
    }

    /// A pod carrying a ticket this process handed out was seen: the webhook is reached.
    pub fn steered(&mut self) {
        self.missed.clear();
    }

    /// A pod of `owner` (which has planned destinations waiting) without a ticket, created at
    /// `created`: a miss unless an admission of that owner was seen since shortly before it.
    pub fn unticketed(
        &mut self,
        pod: &PodKey,
        owner: &OwnerKey,
        created: Timestamp,
        now: Timestamp,
    ) {
        if now.duration_since(created) > FRESH || self.missed.contains_key(pod) {
            return;
        }
        let called = self
            .admitted
            .get(owner)
            .is_some_and(|t| *t >= created - SLACK);
        if called {
            return;
        }
        self.missed.insert(pod.clone(), now);
        while self.missed.len() > KEEP_MISSES {
            let oldest = self
                .missed
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    self.missed.remove(&k);
                }
                None => break,
            }
        }
    }

    /// Why steering is off in fact, when [`MISSES`] replacements in a row were created without
    /// the webhook being called.
    pub fn unreached(&self) -> Option<String> {
        if self.missed.len() < MISSES {
            return None;
        }
        let mut pods: Vec<(&Timestamp, &PodKey)> =
            self.missed.iter().map(|(k, t)| (t, k)).collect();
        pods.sort();
        let named: Vec<String> = pods
            .iter()
            .rev()
            .take(MISSES)
            .map(|(_, (ns, name))| format!("{ns}/{name}"))
            .collect();
        Some(format!(
            "the API server did not call the steering webhook for the last {} replacements created ({}): check that it can reach the webhook's Service or steering.webhookURL (NetworkPolicy, steering.allowedSources); pods are created unsteered meanwhile",
            self.missed.len(),
            named.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str) -> OwnerKey {
        OwnerKey {
            kind: "ReplicaSet".into(),
            namespace: "work".into(),
            name: name.into(),
        }
    }

    fn pod(name: &str) -> PodKey {
        ("work".into(), name.into())
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn three_replacements_without_an_admission_turn_steering_off_until_one_is_seen() {
        let mut r = Reach::default();
        let web = owner("web");
        r.admitted(&web, at(0));
        // Created just after an admission of their owner: called.
        r.unticketed(&pod("a"), &web, at(1), at(2));
        assert!(r.unreached().is_none());
        // Later ones, without an admission: misses; each pod once, however often it is seen.
        for (i, p) in ["b", "c"].into_iter().enumerate() {
            r.unticketed(&pod(p), &web, at(60 + i as i64), at(61 + i as i64));
            r.unticketed(&pod(p), &web, at(60 + i as i64), at(65));
        }
        assert!(r.unreached().is_none(), "two misses are not enough");
        // A pod first seen long after its creation is not judged.
        r.unticketed(&pod("old"), &web, at(0), at(70));
        assert!(r.unreached().is_none());
        r.unticketed(&pod("d"), &owner("api"), at(70), at(71));
        let why = r.unreached().expect("three misses in a row");
        assert!(why.contains("work/d") && why.contains("work/c"), "{why}");
        // The webhook called again: on.
        r.admitted(&web, at(80));
        assert!(r.unreached().is_none());
        for p in ["e", "f", "g"] {
            r.unticketed(&pod(p), &web, at(200), at(201));
        }
        assert!(r.unreached().is_some());
        r.steered();
        assert!(r.unreached().is_none(), "a steered pod shows it is reached");
    }
}
