//! ebb's API: the `ScaleDownPolicy`, `PlacementHistory` and `NodeState` custom resources of
//! group `ebb.dev/v1alpha1`, their reasons and conditions, the CRD generator and the field reference.

// `#[kube(printcolumn(type_ = ...))]` repeats keys across columns by design, which this lint
// mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod conditions;
pub mod crdgen;
pub mod duration;
pub mod names;
pub mod nodestate;
pub mod placement;
pub mod reasons;
pub mod reference;
pub mod scaledown;
pub mod token;

pub use duration::{DurationError, KubeDuration, parse_duration};
pub use nodestate::{NodeState, NodeStateSpec, NodeStateStatus};
pub use placement::{PlacementHistory, PlacementHistorySpec, PlacementHistoryStatus, RoleSpec};
pub use scaledown::{
    Removal, RemovalMethod, ScaleDownMode, ScaleDownPolicy, ScaleDownPolicySpec,
    ScaleDownPolicyStatus,
};
