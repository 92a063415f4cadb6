//! ebb-sim: an in-memory Kubernetes API server and the simulated cluster around it (scheduler,
//! workload controllers, PDB status, kubelet), for the demo and the fast test backend.

pub mod api;
pub mod apply;
pub mod clock;
pub mod cluster;
pub mod defaults;
pub mod error;
pub mod openapi;
pub mod patch;
pub mod poll;
pub mod protobuf;
pub mod registry;
pub mod scenario;
pub mod schema;
pub mod selector;
pub mod server;
pub mod sim;
pub mod store;

pub use api::{Api, AuditRecord, Ctx, PdbViolation};
pub use sim::{Sim, SimConfig};
