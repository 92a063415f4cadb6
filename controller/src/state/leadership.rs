//! Whether this process may act: set by the Lease holder task (or always true without leader
//! election), read by both reconcilers before every write.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this process may act (holds the Lease, or runs without leader election).
#[derive(Clone, Default)]
pub struct Leadership(Arc<AtomicBool>);

impl Leadership {
    /// Always the leader (leader election off).
    pub fn always() -> Self {
        let l = Self::default();
        l.set(true);
        l
    }
    pub fn set(&self, leader: bool) {
        self.0.store(leader, Ordering::SeqCst);
    }
    pub fn is_leader(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
