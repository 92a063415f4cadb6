//! ebb node agent library: the node-local state store (LMDB through heed), recovery at start,
//! and the command line of the `ebb-node-agent` binary.

pub mod agent;
pub mod api;
pub mod cache;
pub mod cli;
pub mod core;
pub mod crash_writer;
pub mod deletion;
pub mod dump;
pub mod kube_edge;
pub mod livepod;
pub mod localizer;
pub mod membership;
pub mod metrics;
pub mod recovery;
pub mod report;
pub mod state;
pub mod store;
pub mod tokens;
pub mod transitions;
