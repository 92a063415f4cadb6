//! The re-check of a tainted node, owned by the actuator: the planner restricted to that node,
//! on the shared cluster model brought up to date, with the other drains in flight.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::cluster::SnapshotError;
use crate::scaledown::{InstantStopwatch, PlannerConfig, PlannerState, Refusal};
use crate::state::Stores;

/// What the re-check of a drain plans with: its policy's configuration and planner memory as
/// they were when the drain was ordered.
#[derive(Clone, Debug)]
pub struct RecheckInputs {
    pub cfg: Arc<PlannerConfig>,
    pub state: Arc<PlannerState>,
    /// Tests of the actuation alone (feature `testkit`) skip the re-check.
    #[cfg(any(test, feature = "testkit"))]
    pub skip: bool,
}

impl RecheckInputs {
    /// One policy loop's configuration and planner state, shared by the drains it starts (a
    /// copy each held the state's destination hints and recent evictions: hundreds of MiB in a
    /// wave of 50 drains at 5,000 nodes).
    pub fn new(cfg: Arc<PlannerConfig>, state: Arc<PlannerState>) -> Self {
        Self {
            cfg,
            state,
            #[cfg(any(test, feature = "testkit"))]
            skip: false,
        }
    }

    /// These inputs, leaving `self` with the configuration and an empty planner state: a drain
    /// re-checks once, and the state it shares with its loop's other drains (destination hints,
    /// recent evictions: tens of MiB at 5,000 nodes) is freed once the last has re-checked.
    pub fn take(&mut self) -> Self {
        Self {
            cfg: self.cfg.clone(),
            state: std::mem::take(&mut self.state),
            #[cfg(any(test, feature = "testkit"))]
            skip: self.skip,
        }
    }

    /// No re-check: for tests of the drain's other steps (feature `testkit` only).
    #[cfg(any(test, feature = "testkit"))]
    pub fn skipped() -> Self {
        Self {
            skip: true,
            ..Self::new(Arc::default(), Arc::default())
        }
    }
}

/// Why a tainted node is no longer drained.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecheckError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// An object of the cluster cannot be read, so nothing can be trusted.
    #[error("the cluster model cannot be used: {0}")]
    Unreadable(#[from] SnapshotError),
}

/// Re-checks `node` on the shared model (caught up first; forked and left as it was).
pub fn recheck(
    stores: &Stores,
    inputs: &RecheckInputs,
    in_flight: &BTreeSet<String>,
    node: &str,
) -> Result<(), RecheckError> {
    #[cfg(any(test, feature = "testkit"))]
    if inputs.skip {
        return Ok(());
    }
    let (mut live, _) = stores.model();
    let snap = live.snapshot_mut()?;
    crate::scaledown::recheck(
        snap,
        &inputs.cfg,
        &inputs.state,
        in_flight,
        node,
        jiff::Timestamp::now(),
        &mut InstantStopwatch::start(),
    )?;
    Ok(())
}
