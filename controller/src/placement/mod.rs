//! Placement history: Apache Slider's role history rebuilt for Kubernetes. A pure core that
//! remembers where each role ran and decides where its re-created pods should go.
//!
//! Everything here is a function of its inputs and a clock (`jiff::Timestamp` arguments): no
//! Kubernetes client, no wall clock. The controller feeds in pod lifecycle events, node facts
//! ([`NodeFacts`]) and a fit test, and carries the returned [`Decision`]s out as pod patches.
//! The fit test is a caller-supplied closure; the controller passes the planner's shared
//! predicate checker there.
//!
//! How the controller drives one [`RoleHistory`] per PlacementHistory:
//!
//! | event | call |
//! |---|---|
//! | controller start | [`RoleHistory::rebuild`] from the status, then [`RoleHistory::replay_pod`] for every bound pod |
//! | spec changed | [`RoleHistory::update_spec`] |
//! | gated pod seen (and on every retry) | [`RoleHistory::place`] → [`Decision`]: pin, wait, relax or anywhere |
//! | pod bound to a node / running | [`RoleHistory::on_bound`] / [`RoleHistory::on_running`] |
//! | pod deletion requested by its owner | [`RoleHistory::on_releasing`] |
//! | pod terminated or gone | [`Termination::from_pod`], then [`RoleHistory::on_terminated`] |
//! | unbound pod deleted | [`RoleHistory::cancel`] |
//! | periodic tick | [`RoleHistory::overdue`] (delete those pods), [`RoleHistory::purge`] |
//! | status write (when [`RoleHistory::is_dirty`]) | [`RoleHistory::write_status`] |

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
pub use outcome::{Requeue, Termination, TerminationClass, classify, deleted_before_it_ended};
pub use persist::{RebuildReport, SCHEMA_VERSION};
pub use roles::{RoleConfig, RoleId, RoleTable};
