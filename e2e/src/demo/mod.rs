//! The parts of `ebb-demo`: the demo cluster, the live progress display, and the summary read
//! from the policy status and the simulator's records.

pub mod cluster;
pub mod progress;
pub mod summary;
