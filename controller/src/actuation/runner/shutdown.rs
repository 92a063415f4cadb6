//! A controller's stop reaching its drains: no drain starts after it, drains not past their
//! point of no return roll back, and what is still running at the bound is aborted.

use super::*;

/// How the controller's stop reaches its drains. `stopping` is the controller's stop: no drain
/// starts after it, and a drain not yet past its point of no return (every eviction accepted)
/// rolls back. `deadline` is the end of the shutdown bound: every drain still running stops where
/// it is and rolls back unless its machine was handed off.
#[derive(Clone, Default)]
pub(super) struct Shutdown {
    pub(super) stopping: CancellationToken,
    pub(super) deadline: CancellationToken,
    pub(super) counts: Arc<ShutdownCounts>,
}

/// Drains that ended after the stop, by how.
#[derive(Default)]
pub(super) struct ShutdownCounts {
    pub(super) finished: std::sync::atomic::AtomicUsize,
    pub(super) rolled_back: std::sync::atomic::AtomicUsize,
    pub(super) handed_off: std::sync::atomic::AtomicUsize,
}

/// What became of the drains in flight at a stop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Finished within the bound (node deleted, handed off and gone, or marked drained).
    pub finished: usize,
    /// Rolled back: `to-be-deleted` removed (ebb cordons only a finished `Drain`-mode node).
    pub rolled_back: usize,
    /// Stopped while its machine was going (handed off): the node is left to go.
    pub handed_off: usize,
    /// Still running when the bound and the roll-back reserve were spent: aborted where they
    /// were (the next leader picks them up from their taints).
    pub aborted: usize,
}

/// Of the shutdown bound, what is kept for roll-backs after the drains' time is up.
pub const SHUTDOWN_ROLLBACK_RESERVE: Duration = Duration::from_secs(4);

/// How often a stop logs its progress.
const SHUTDOWN_PROGRESS: Duration = Duration::from_secs(1);

impl Actuator {
    /// After the stop token was cancelled: wait up to `bound` for the drains in flight to finish
    /// or roll back, logging progress. Drains past their point of no return get the bound less
    /// [`SHUTDOWN_ROLLBACK_RESERVE`] to finish; then every drain left is stopped and rolled back
    /// within the reserve; what still runs after that is aborted.
    pub async fn stop_drains(&self, bound: Duration) -> ShutdownReport {
        let t0 = tokio::time::Instant::now();
        let rollback_at = t0 + bound.saturating_sub(SHUTDOWN_ROLLBACK_RESERVE);
        let end = t0 + bound;
        let in_flight = self.running();
        tracing::info!(
            in_flight,
            bound_ms = bound.as_millis() as u64,
            "stopping: no new drains; drains in flight finish or roll back"
        );
        let mut last_log = t0;
        loop {
            let running = self.running();
            let now = tokio::time::Instant::now();
            if running == 0 || now >= end {
                break;
            }
            if now >= rollback_at && !self.shutdown.deadline.is_cancelled() {
                tracing::warn!(
                    running,
                    "shutdown bound nearly spent: rolling back the drains still running"
                );
                self.shutdown.deadline.cancel();
            }
            if now.duration_since(last_log) >= SHUTDOWN_PROGRESS {
                last_log = now;
                let r = self.report(running);
                tracing::info!(
                    running,
                    finished = r.finished,
                    rolled_back = r.rolled_back,
                    handed_off = r.handed_off,
                    "stopping: drains in flight"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.shutdown.deadline.cancel();
        let aborted = self.running();
        self.abort_all();
        let report = self.report(aborted);
        tracing::info!(
            finished = report.finished,
            rolled_back = report.rolled_back,
            handed_off = report.handed_off,
            aborted = report.aborted,
            took_ms = t0.elapsed().as_millis() as u64,
            "stopped: drains finished or rolled back"
        );
        report
    }

    pub(super) fn report(&self, aborted: usize) -> ShutdownReport {
        use std::sync::atomic::Ordering::SeqCst;
        let c = &self.shutdown.counts;
        ShutdownReport {
            finished: c.finished.load(SeqCst),
            rolled_back: c.rolled_back.load(SeqCst),
            handed_off: c.handed_off.load(SeqCst),
            aborted,
        }
    }

    /// Drain tasks still running.
    pub(super) fn running(&self) -> usize {
        self.tasks
            .lock()
            .map(|t| t.iter().filter(|t| !t.is_finished()).count())
            .unwrap_or(0)
    }

    /// Stop every drain task where it is, without rolling back (as a killed process would):
    /// the next leader picks them up from their taints. A lost Lease takes this path: another
    /// leader may already act on these nodes.
    pub fn abort_all(&self) {
        if let Ok(mut tasks) = self.tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
    }
}
