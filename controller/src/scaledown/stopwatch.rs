//! The loop's time bound: how long a planner loop has run, read from a clock the caller picks
//! (the monotonic clock in the controller, a stepping one in tests).

use std::time::{Duration, Instant};

/// Elapsed time since the loop started; injected so tests control the time bound.
pub trait Stopwatch {
    fn elapsed(&mut self) -> Duration;
}

/// A [`Stopwatch`] on the monotonic clock, started by the caller.
#[derive(Clone, Copy, Debug)]
pub struct InstantStopwatch(Instant);

impl InstantStopwatch {
    pub fn start() -> Self {
        InstantStopwatch(Instant::now())
    }
}

impl Stopwatch for InstantStopwatch {
    fn elapsed(&mut self) -> Duration {
        self.0.elapsed()
    }
}

/// A [`Stopwatch`] that advances by `step` every time it is read (for tests).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepStopwatch {
    pub step: Duration,
    pub now: Duration,
}

impl Stopwatch for StepStopwatch {
    fn elapsed(&mut self) -> Duration {
        self.now += self.step;
        self.now
    }
}
