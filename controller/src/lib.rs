//! ebb controller library: the parallel-drain planner and actuator, the placement history, and
//! the command line of the `ebb-controller` binary.

pub mod actuation;
pub mod cli;
pub mod cluster;
pub mod controller;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod placement;
pub mod placement_controller;
pub mod plan;
pub mod run;
pub mod scaledown;
pub mod telemetry;
