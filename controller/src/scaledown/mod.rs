//! Scale-down: node eligibility, pod drainability, PDB tracking, deletion budgets and the
//! parallel-drain planner that keeps a set of nodes removable all at once.

pub mod budgets;
pub mod config;
pub mod decisions;
pub mod drainability;
pub mod eligibility;
mod fit_memory;
pub mod memory;
mod node_facts;
pub mod pdb;
pub mod pdb_coverage;
pub mod planner;
pub mod pricing;
pub mod recheck;
pub mod removal_method;
mod simulation;
pub mod stopwatch;

pub use config::{PlannerConfig, PolicyError};
pub use decisions::{Candidate, Move, Plan, SimulationStats, Unremovable};
pub use memory::{DestinationHints, NonCandidate, PlannerState, RecentEviction};
pub use planner::{deleting, plan, select_deletions};
pub use recheck::{Refusal, recheck};
pub use stopwatch::{InstantStopwatch, StepStopwatch, Stopwatch};

#[cfg(test)]
mod accelerator_tests;
#[cfg(test)]
mod cost_tests;
#[cfg(test)]
mod fit_memory_tests;
#[cfg(test)]
mod pacing_tests;
#[cfg(test)]
mod planner_tests;
