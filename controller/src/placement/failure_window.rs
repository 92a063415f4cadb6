//! The failure window: failure counters reset on a fixed schedule (multiples of the period since
//! the Unix epoch), not a sliding window, so old failures stop counting all at once.

use jiff::{SignedDuration, Timestamp};

use super::error::HistoryError;

/// Which fixed window the failure counters belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureWindow {
    period: SignedDuration,
    start: Timestamp,
}

impl FailureWindow {
    /// The window containing `now`. The period must be positive.
    pub fn new(period: SignedDuration, now: Timestamp) -> Result<Self, HistoryError> {
        if period.as_nanos() <= 0 {
            return Err(HistoryError::ZeroDuration {
                field: "failureWindow",
            });
        }
        Ok(Self {
            period,
            start: window_start(period, now),
        })
    }

    /// Move to the window containing `now`; true when that is a new window (counters reset).
    pub fn roll(&mut self, now: Timestamp) -> bool {
        let start = window_start(self.period, now);
        if start > self.start {
            self.start = start;
            true
        } else {
            false
        }
    }

    /// When the current window began.
    pub fn start(&self) -> Timestamp {
        self.start
    }

    /// When the counters reset next.
    pub fn next_reset(&self) -> Timestamp {
        self.start
            .saturating_add(self.period)
            .unwrap_or(Timestamp::MAX)
    }
}

fn window_start(period: SignedDuration, now: Timestamp) -> Timestamp {
    let p = period.as_nanos().max(1);
    let n = now.as_nanosecond();
    Timestamp::from_nanosecond(n.div_euclid(p) * p).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_at_fixed_boundaries_not_sliding() {
        let six_h = SignedDuration::from_hours(6);
        let t = |h: i64, m: i64| Timestamp::from_second(h * 3600 + m * 60).unwrap();
        let mut w = FailureWindow::new(six_h, t(7, 0)).unwrap();
        assert_eq!(w.start(), t(6, 0));
        assert_eq!(w.next_reset(), t(12, 0));
        assert!(!w.roll(t(11, 59)));
        assert!(w.roll(t(12, 0)));
        assert!(!w.roll(t(12, 1)));
        // Skipping several windows resets once, onto the grid.
        assert!(w.roll(t(31, 0)));
        assert_eq!(w.start(), t(30, 0));
    }

    #[test]
    fn zero_period_is_rejected() {
        assert!(FailureWindow::new(SignedDuration::ZERO, Timestamp::UNIX_EPOCH).is_err());
    }
}
