//! Placement history: Apache Slider's role history rebuilt for Kubernetes. A pure core that
//! remembers where each role ran and decides where its re-created pods should go.
//!
//! Everything here is a function of its inputs and a clock (`jiff::Timestamp` arguments): no
//! Kubernetes client, no wall clock. The controller feeds in pod lifecycle events, node facts
//! ([`NodeFacts`]) and a fit test, and carries the returned [`Decision`]s out as pod patches.
//! The fit test is a caller-supplied closure; the controller passes the planner's shared
//! predicate checker there.

pub mod available;
pub mod decision;
pub mod error;
pub mod escalation;
pub mod failure_window;
pub mod history;
pub mod node_map;
pub mod nodes;
pub mod outcome;
pub mod persist;
mod pick;
pub mod requests;
pub mod roles;

pub use decision::{
    Action, Decision, Overdue, PlacementOutcome, PlacementReason, RelaxedConstraints,
};
pub use error::HistoryError;
pub use history::{HistoryConfig, PodRef, RoleCounters, RoleHistory, TerminationReport};
pub use node_map::{NodeEntry, NodeMap};
pub use nodes::{NodeFacts, NodeView, warm_roles};
pub use outcome::{Requeue, Termination, TerminationClass, classify};
pub use persist::{RebuildReport, SCHEMA_VERSION};
pub use roles::{RoleConfig, RoleId, RoleTable};
