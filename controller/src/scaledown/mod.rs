//! Scale-down: node eligibility, pod drainability, PDB tracking, deletion budgets and the
//! parallel-drain planner that keeps a set of nodes removable all at once.

pub mod budgets;
pub mod config;
pub mod drainability;
pub mod eligibility;
pub mod pdb;
pub mod planner;
pub mod recheck;
pub mod removal;
mod simulation;

pub use config::{PlannerConfig, PolicyError};
pub use planner::{
    Candidate, InstantStopwatch, Move, Plan, PlannerState, SimulationStats, StepStopwatch,
    Stopwatch, Unremovable, plan, select_deletions,
};
pub use recheck::recheck;

#[cfg(test)]
mod pacing_tests;
#[cfg(test)]
mod planner_tests;
