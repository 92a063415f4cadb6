//! ebb controller library: the parallel-drain planner and actuator, the placement history, and
//! the command line of the `ebb-controller` binary.

pub mod cli;
pub mod cluster;
pub mod scaledown;
