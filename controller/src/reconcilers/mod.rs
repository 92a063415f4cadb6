//! The two kube-runtime reconcilers: `scaledown` (ScaleDownPolicy: plan, drain, status) and
//! `placement` (PlacementHistory: remember roles, steer re-created pods).

pub mod placement;
pub mod scaledown;
