//! The simulation clock: sim time runs `factor` times faster than real time and can be advanced
//! by hand, so grace periods, readiness delays and timeouts can be played quickly in tests.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};

#[derive(Debug)]
struct Anchor {
    real: Instant,
    sim: Timestamp,
    factor: f64,
}

/// A clock shared by the API server (timestamps) and the simulated cluster (delays).
#[derive(Debug)]
pub struct Clock {
    anchor: Mutex<Anchor>,
}

impl Clock {
    /// A clock starting at the current wall time, running `factor` times real time.
    pub fn new(factor: f64) -> Self {
        Self {
            anchor: Mutex::new(Anchor {
                real: Instant::now(),
                sim: Timestamp::now(),
                factor: sanitize(factor),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Anchor> {
        self.anchor.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current sim time.
    pub fn now(&self) -> Timestamp {
        let a = self.lock();
        let real = a.real.elapsed().as_secs_f64() * a.factor;
        a.sim
            .checked_add(SignedDuration::from_secs_f64(real))
            .unwrap_or(a.sim)
    }

    /// The current sim time as a Kubernetes timestamp (`2024-01-02T03:04:05Z`).
    pub fn now_string(&self) -> String {
        format_time(self.now())
    }

    /// How many times faster than real time sim time runs.
    pub fn factor(&self) -> f64 {
        self.lock().factor
    }

    /// Changes the speed from now on.
    pub fn set_factor(&self, factor: f64) {
        let now = self.now();
        let mut a = self.lock();
        a.real = Instant::now();
        a.sim = now;
        a.factor = sanitize(factor);
    }

    /// Jumps sim time forward.
    pub fn advance(&self, d: Duration) {
        let mut a = self.lock();
        a.sim = a
            .sim
            .checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::ZERO))
            .unwrap_or(a.sim);
    }

    /// The real time that `sim` of sim time takes at the current speed.
    pub fn real_for(&self, sim: Duration) -> Duration {
        Duration::from_secs_f64(sim.as_secs_f64() / self.factor())
    }
}

fn sanitize(f: f64) -> f64 {
    if f.is_finite() && f > 0.0 { f } else { 1.0 }
}

/// Formats a timestamp at second precision as Kubernetes does.
pub fn format_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Parses a Kubernetes timestamp.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_and_factor() {
        let c = Clock::new(1.0);
        let t0 = c.now();
        c.advance(Duration::from_secs(3600));
        let d = c.now().duration_since(t0);
        assert!(d.as_secs() >= 3600 && d.as_secs() < 3660, "{d:?}");
        c.set_factor(10.0);
        assert_eq!(c.real_for(Duration::from_secs(30)), Duration::from_secs(3));
        assert!(parse_time(&c.now_string()).is_some());
    }
}
