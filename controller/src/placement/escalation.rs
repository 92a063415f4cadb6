//! Escalation: a pinned request that is not satisfied within its role's `escalationTimeout`
//! is relaxed, strictly after the deadline and only once.

use jiff::{SignedDuration, Timestamp};

/// When a request made at `requested_at` escalates.
pub fn deadline(requested_at: Timestamp, timeout: SignedDuration) -> Timestamp {
    requested_at
        .saturating_add(timeout)
        .unwrap_or(Timestamp::MAX)
}

/// True when `now` is strictly after `deadline`: at the deadline itself nothing happens.
pub fn is_due(deadline: Timestamp, now: Timestamp) -> bool {
    now > deadline
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_strictly_after_the_deadline() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let d = deadline(t0, SignedDuration::from_secs(30));
        assert!(!is_due(d, Timestamp::from_second(1_030).unwrap()));
        assert!(is_due(d, Timestamp::from_millisecond(1_030_001).unwrap()));
    }
}
