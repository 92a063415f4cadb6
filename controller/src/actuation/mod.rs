//! Actuation of a ScaleDownPolicy: soft taints, the drain state machine and its runner
//! (taint, re-check, evict, wait, remove or mark), machine removal through Cluster API or
//! Karpenter, and restart re-derivation from taints.

pub mod budget_gate;
pub mod drain;
pub mod evict;
pub mod nodes;
pub mod pacing;
pub mod pods;
pub mod recheck;
pub mod recover;
pub mod removal;
pub mod runner;
pub mod start_limit;
pub mod start_wait;
pub mod status;
pub mod taints;
pub mod tracker;

pub use drain::{Drain, DrainEvent, GiveUpReason, Outcome};
pub use evict::EvictionSettings;
pub use nodes::{NodeWriteError, NodeWriter, Written};
pub use recheck::{RecheckError, RecheckInputs};
pub use runner::{Actuator, DrainOrder, StartError};
pub use status::ActuationStatus;
pub use taints::EbbTaint;
pub use tracker::Tracker;
