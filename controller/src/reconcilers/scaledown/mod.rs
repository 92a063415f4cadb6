//! The ScaleDownPolicy reconciler: the per-policy loop (plan, soft taints,
//! drains, status, events), overlap and bad-input detection, and start-up recovery.

mod act;
pub mod context;
pub mod error;
pub mod events;
mod observe;
pub mod orders;
pub mod permissions;
mod plan_phase;
pub mod policy_loop;
pub mod reconcile;
mod report;
pub mod selection;
pub mod startup;
pub mod status;

pub use context::Context;
pub use error::Error;
pub use reconcile::{error_policy, reconcile};
pub use report::apply_status;
