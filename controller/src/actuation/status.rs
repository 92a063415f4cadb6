//! What the actuator reports to the planner, as one value per loop: the drains in flight (all
//! policies), and the policy's drains finished, pods evicted and evictions refused since it last looked.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::cluster::CachedPod;

use super::drain::{Drain, Outcome};
use super::pods::PodRef;

/// The actuator's report to one policy's loop. Nothing flows back: the planner reads it.
#[derive(Clone, Debug, Default)]
pub struct ActuationStatus {
    /// Every drain in flight, of any policy, sorted by node.
    pub draining: Vec<Drain>,
    /// This policy's drains that ended since its last loop.
    pub finished: Vec<Finished>,
    /// This policy's accepted evictions since its last loop.
    pub evicted: Vec<Evicted>,
    /// This policy's evictions a PodDisruptionBudget refused since its last loop.
    pub refused: i64,
}

impl ActuationStatus {
    /// Nodes being drained, by any policy.
    pub fn in_flight(&self) -> BTreeSet<String> {
        self.draining.iter().map(|d| d.node.clone()).collect()
    }

    /// The drains in flight of `policy`.
    pub fn draining_of<'a>(&'a self, policy: &'a str) -> impl Iterator<Item = &'a Drain> {
        self.draining.iter().filter(move |d| d.policy == policy)
    }
}

/// A drain that ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub drain: Drain,
    pub outcome: Outcome,
    pub at: jiff::Timestamp,
}

/// A pod the actuator evicted.
#[derive(Clone, Debug, PartialEq)]
pub struct Evicted {
    pub policy: String,
    pub node: String,
    pub pod: PodRef,
    /// The Pod as it was when evicted (the planner re-injects it until it is replaced).
    pub object: Option<Arc<CachedPod>>,
    pub at: jiff::Timestamp,
}
