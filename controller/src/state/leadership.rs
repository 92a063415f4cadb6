//! Whether this process may act: the Lease holder's acting flag (set after start-up recovery)
//! and its fence (the moment the Lease may have passed to another replica), read before writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures::Stream;
use tokio::sync::watch;

/// No deadline: leader election off, or the fence not armed yet.
const NO_DEADLINE: u64 = u64::MAX;

/// Whether this process may act (holds the Lease, or runs without leader election). Cheap to
/// clone; every clone sees the same state.
#[derive(Clone)]
pub struct Leadership(Arc<Inner>);

struct Inner {
    /// The acting flag, as a channel: reconcilers wake when this replica starts acting, not at
    /// their next requeue.
    acting: watch::Sender<bool>,
    /// Milliseconds after `base` until which this replica may still write (the fence), or
    /// [`NO_DEADLINE`].
    valid_until_ms: AtomicU64,
    base: Instant,
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership(Arc::new(Inner {
            acting: watch::Sender::new(false),
            valid_until_ms: AtomicU64::new(NO_DEADLINE),
            base: Instant::now(),
        }))
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("acting", &*self.0.acting.borrow())
            .field("may_write", &self.may_write())
            .finish()
    }
}

impl Leadership {
    /// Always the leader (leader election off).
    pub fn always() -> Self {
        let l = Self::default();
        l.set(true);
        l
    }

    /// Starts (after start-up recovery) or stops acting: reconcilers and the webhook.
    pub fn set(&self, leader: bool) {
        self.0.acting.send_replace(leader);
    }

    /// A unit each time this replica starts acting (after start-up recovery, or on taking
    /// over from another leader), and one at once when it acts already: a reconciler that
    /// found it not acting re-runs then instead of at its follower requeue.
    pub fn started_acting(&self) -> impl Stream<Item = ()> + Send + 'static {
        let mut rx = self.0.acting.subscribe();
        if *rx.borrow() {
            rx.mark_changed();
        }
        futures::stream::unfold(rx, |mut rx| async move {
            loop {
                rx.changed().await.ok()?;
                if *rx.borrow_and_update() {
                    return Some(((), rx));
                }
            }
        })
    }

    /// Acting, and within the fence.
    pub fn is_leader(&self) -> bool {
        *self.0.acting.borrow() && self.may_write()
    }

    /// Within the fence: the Lease this replica holds cannot have passed to another replica
    /// yet (always true without leader election). Drains check this before each write, from
    /// the moment the Lease is acquired (start-up recovery included).
    pub fn may_write(&self) -> bool {
        let until = self.0.valid_until_ms.load(Ordering::SeqCst);
        until == NO_DEADLINE || self.now_ms() < until
    }

    /// The fence moves to `until` (the last renewal seen plus the Lease's duration, less a
    /// margin).
    pub fn fence_at(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.0.base).as_millis();
        let ms = u64::try_from(ms)
            .unwrap_or(NO_DEADLINE - 1)
            .min(NO_DEADLINE - 1);
        self.0.valid_until_ms.store(ms, Ordering::SeqCst);
    }

    /// Deposed: nothing more may be written, at once.
    pub fn fence_now(&self) {
        self.0.acting.send_replace(false);
        self.0.valid_until_ms.store(0, Ordering::SeqCst);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.0.base.elapsed().as_millis()).unwrap_or(NO_DEADLINE - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_fence_closes_at_its_deadline_and_when_deposed() {
        let l = Leadership::default();
        assert!(!l.is_leader() && l.may_write(), "no fence before a Lease");
        l.set(true);
        assert!(l.is_leader());
        l.fence_at(Instant::now() + Duration::from_secs(60));
        assert!(l.is_leader() && l.may_write());
        l.fence_at(Instant::now() - Duration::from_millis(1));
        assert!(!l.may_write() && !l.is_leader(), "past its deadline");
        l.fence_at(Instant::now() + Duration::from_secs(60));
        let clone = l.clone();
        clone.fence_now();
        assert!(!l.may_write() && !l.is_leader(), "every clone is fenced");
    }

    #[tokio::test]
    async fn starting_to_act_wakes_each_time_and_stopping_does_not() {
        use futures::StreamExt;
        let l = Leadership::default();
        let mut starts = std::pin::pin!(l.started_acting());
        let wait = Duration::from_millis(200);
        l.set(false);
        let seen = tokio::time::timeout(wait, starts.next()).await;
        assert!(seen.is_err(), "not acting is no start");
        l.clone().set(true);
        let seen = tokio::time::timeout(wait, starts.next()).await;
        assert_eq!(seen.ok(), Some(Some(())), "a clone starts it");
        l.fence_now();
        let seen = tokio::time::timeout(wait, starts.next()).await;
        assert!(seen.is_err(), "deposed is no start");
        l.set(true);
        let seen = tokio::time::timeout(wait, starts.next()).await;
        assert_eq!(seen.ok(), Some(Some(())), "acting again");
        let mut late = std::pin::pin!(l.started_acting());
        let seen = tokio::time::timeout(wait, late.next()).await;
        assert_eq!(seen.ok(), Some(Some(())), "acting before the call");
        let seen = tokio::time::timeout(wait, late.next()).await;
        assert!(seen.is_err(), "once");
    }
}
