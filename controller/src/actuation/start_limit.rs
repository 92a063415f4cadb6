//! The pacing's bound, following the cluster: as many replacements starting at once as keep the
//! rate it starts them at, and half as many again, between a floor and a ceiling.
//!
//! A constant bound lets a wave through at bound ÷ the time a pod takes to start. Where each
//! start waits on its own node (an image pulled, a volume attached) the cluster starts more at
//! once the more it is given; where starts wait in one queue (scheduler, API server, a busy
//! kubelet) more at once only lengthens the queue. So, per round of the shortest start (at least
//! [`ROUND_MIN`], at most [`ROUND_MAX`]) during which evictions waited for the bound the whole
//! time, the bound becomes [`GAIN`] × the replacements started per second × the shortest start:
//! the starts a cluster with no queue would hold to go at the rate it showed, plus half to find
//! out whether it goes faster. Bounded by a queue the rate stays, and the bound falls back to
//! it; bounded by each pod's own wait the rate rises with the bound, and the bound with it (at
//! most half again a round). A round in which no eviction waited says nothing of the cluster: the
//! bound is kept.
//!
//! The shortest start is the shortest since nothing was last starting: the first replacements
//! of a wave meet no queue of the wave's making, later ones may, and a start slowed by a queue
//! taken for the cluster's own time would let the bound grow with its own queue.

use std::time::Duration;

use tokio::time::Instant;

/// How much more than the starts that keep the observed rate the bound allows.
pub const GAIN: f64 = 1.5;
/// Shortest round.
pub const ROUND_MIN: Duration = Duration::from_secs(1);
/// Longest round.
pub const ROUND_MAX: Duration = Duration::from_secs(30);

/// The bound on replacements starting at once, and what it follows.
#[derive(Debug, Clone)]
pub struct StartLimit {
    floor: usize,
    ceiling: usize,
    limit: usize,
    /// The shortest start since nothing was last starting.
    shortest: Option<Duration>,
    /// The round under way, while evictions wait for the bound.
    round: Option<Round>,
}

#[derive(Debug, Clone, Copy)]
struct Round {
    start: Instant,
    started: usize,
}

impl StartLimit {
    /// Starts at `floor` (at most `ceiling`) and stays within both.
    pub fn new(floor: usize, ceiling: usize) -> Self {
        let floor = floor.min(ceiling);
        StartLimit {
            floor,
            ceiling,
            limit: floor,
            shortest: None,
            round: None,
        }
    }

    /// Replacements allowed to start at once now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The shortest start since nothing was last starting.
    pub fn shortest_start(&self) -> Option<Duration> {
        self.shortest
    }

    /// A replacement started, `took` after its eviction was let through (a start seen late only
    /// looks longer: the shortest is still right).
    pub fn started(&mut self, took: Duration) {
        self.shortest = Some(self.shortest.map_or(took, |s| s.min(took)));
        if let Some(r) = &mut self.round {
            r.started += 1;
        }
    }

    /// Evictions wait for the bound: a round starts, unless one is under way.
    pub fn waiting(&mut self, now: Instant) {
        self.round.get_or_insert(Round {
            start: now,
            started: 0,
        });
    }

    /// No eviction waits for the bound any more: the round ends, measuring nothing.
    pub fn not_waiting(&mut self) {
        self.round = None;
    }

    /// Nothing is starting: the next start meets no queue of ours, and is the shortest anew.
    /// The bound is kept.
    pub fn nothing_starting(&mut self) {
        self.shortest = None;
        self.round = None;
    }

    /// Ends the round once it has lasted the shortest start, the bound following its rate; the
    /// next one starts. True when the bound grew.
    pub fn tick(&mut self, now: Instant) -> bool {
        let (Some(round), Some(shortest)) = (self.round, self.shortest_start()) else {
            return false;
        };
        let took = now.saturating_duration_since(round.start);
        if took < shortest.clamp(ROUND_MIN, ROUND_MAX) {
            return false;
        }
        let rate = round.started as f64 / took.as_secs_f64();
        let target = (GAIN * rate * shortest.as_secs_f64()).ceil() as usize;
        let before = self.limit;
        self.limit = target.clamp(self.floor, self.ceiling);
        self.round = Some(Round {
            start: now,
            started: 0,
        });
        if self.limit != before {
            tracing::debug!(
                from = before,
                to = self.limit,
                started = round.started,
                round_ms = took.as_millis() as u64,
                shortest_start_ms = shortest.as_millis() as u64,
                "the bound on starting replacements follows the cluster's start rate"
            );
        }
        self.limit > before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A cluster that starts each replacement `delay` after it is created, at most `per_sec` a
    /// second (one queue): replays `secs` seconds of a wave that always has evictions waiting,
    /// the bound letting a new one through as soon as a start frees a place. Returns the bound at
    /// the end and the longest start seen.
    fn replay(
        floor: usize,
        start: usize,
        ceiling: usize,
        delay: Duration,
        per_sec: f64,
        secs: u64,
    ) -> (usize, Duration) {
        let t0 = Instant::now();
        let mut limit = StartLimit::new(floor, ceiling);
        limit.limit = start.clamp(limit.floor, ceiling);
        // The queue's next free time; the evictions let through and not started (when let
        // through, when started).
        let mut queue_free = t0;
        let mut starting: Vec<(Instant, Instant)> = Vec::new();
        let step = Duration::from_millis(50);
        let mut longest = Duration::ZERO;
        let mut now = t0;
        limit.waiting(now);
        while now < t0 + Duration::from_secs(secs) {
            // Let through what the bound allows.
            while starting.len() < limit.limit() {
                // Each start: its own delay, then one at a time through the queue.
                let ready = (now + delay).max(queue_free);
                queue_free = ready + Duration::from_secs_f64(1.0 / per_sec);
                starting.push((now, ready));
            }
            now += step;
            starting.retain(|&(admitted, ready)| {
                if ready <= now {
                    let took = now - admitted;
                    longest = longest.max(took);
                    limit.started(took);
                    false
                } else {
                    true
                }
            });
            limit.tick(now);
        }
        (limit.limit(), longest)
    }

    #[test]
    fn starts_at_the_floor_and_keeps_it_without_a_round() {
        let mut l = StartLimit::new(50, 1000);
        assert_eq!(l.limit(), 50);
        let t = Instant::now();
        l.started(Duration::from_secs(1));
        assert!(!l.tick(t + Duration::from_secs(5)), "no eviction waited");
        assert_eq!(l.limit(), 50);
        assert_eq!(StartLimit::new(50, 2).limit(), 2, "the ceiling wins");
    }

    #[test]
    fn grows_where_each_start_waits_on_its_own_node() {
        // Starts take 10 s each, the cluster takes 200 a second: a bound of 50 would let 5 a
        // second through.
        let (bound, longest) = replay(50, 50, 2000, Duration::from_secs(10), 200.0, 300);
        assert!(bound >= 1000, "the bound grew to {bound}");
        assert!(
            longest < Duration::from_secs(20),
            "no queue of its own making: longest start {longest:?}"
        );
    }

    #[test]
    fn stays_near_the_queue_a_cluster_starts_through() {
        // Starts take 1 s, then one queue of 5 a second: 5 at once keep it busy. From a bound
        // of 100 (a queue of 20 s) it falls back to about 1.5 × 5.
        // An hour of it: the queue's own wait never counts as the cluster's.
        let (bound, longest) = replay(1, 100, 2000, Duration::from_secs(1), 5.0, 3600);
        assert!(bound <= 10, "the bound is {bound}");
        assert!(
            longest < Duration::from_secs(25),
            "longest start {longest:?}"
        );
        // Growing from 1, it stops there too.
        let (bound, longest) = replay(1, 1, 2000, Duration::from_secs(1), 5.0, 600);
        assert!(bound <= 10, "the bound is {bound}");
        assert!(
            longest < Duration::from_secs(4),
            "longest start {longest:?}"
        );
        // The floor holds: 50 at once is a queue of 10 s here, as with a constant bound.
        let (bound, _) = replay(50, 50, 2000, Duration::from_secs(1), 5.0, 600);
        assert_eq!(bound, 50);
    }

    #[test]
    fn a_round_without_waiters_measures_nothing() {
        let t = Instant::now();
        let mut l = StartLimit::new(50, 1000);
        l.started(Duration::from_secs(2));
        l.waiting(t);
        l.not_waiting();
        // 500 starts, none while evictions waited.
        for _ in 0..500 {
            l.started(Duration::from_secs(2));
        }
        assert!(!l.tick(t + Duration::from_secs(3)));
        assert_eq!(l.limit(), 50);
        // Waiting again: the round counts from now.
        l.waiting(t + Duration::from_secs(3));
        for _ in 0..100 {
            l.started(Duration::from_secs(2));
        }
        assert!(l.tick(t + Duration::from_secs(5)));
        // 100 starts in 2 s, the shortest 2 s: 1.5 × 50/s × 2 s.
        assert_eq!(l.limit(), 150);
    }

    #[test]
    fn the_shortest_start_is_forgotten_when_nothing_is_starting() {
        let mut l = StartLimit::new(1, 1000);
        l.started(Duration::from_secs(4));
        l.started(Duration::from_secs(1));
        l.started(Duration::from_secs(6));
        assert_eq!(l.shortest_start(), Some(Duration::from_secs(1)));
        l.nothing_starting();
        assert_eq!(l.shortest_start(), None);
        l.started(Duration::from_secs(6));
        assert_eq!(l.shortest_start(), Some(Duration::from_secs(6)));
    }

    proptest! {
        #[test]
        fn the_bound_stays_within_floor_and_ceiling(
            floor in 0usize..200,
            ceiling in 0usize..3000,
            events in proptest::collection::vec((0u64..5000, 0u64..60_000, 0u8..5), 1..300),
        ) {
            let t0 = Instant::now();
            let mut l = StartLimit::new(floor, ceiling);
            let mut at = t0;
            for (gap_ms, took_ms, what) in events {
                at += Duration::from_millis(gap_ms);
                match what {
                    0 => l.waiting(at),
                    1 => l.not_waiting(),
                    2 => { l.tick(at); }
                    3 => l.started(Duration::from_millis(took_ms)),
                    _ => l.nothing_starting(),
                }
                prop_assert!(l.limit() >= floor.min(ceiling));
                prop_assert!(l.limit() <= ceiling);
            }
        }
    }
}
