//! The ScaleDownPolicy reconciler: the per-policy loop (plan, soft taints,
//! drains, status, events), overlap and bad-input detection, and start-up recovery.

pub mod context;
pub mod events;
pub mod permissions;
pub mod policy_loop;
pub mod reconcile;
pub mod selection;
pub mod startup;
pub mod status;

pub use context::Context;
pub use reconcile::{error_policy, reconcile};
