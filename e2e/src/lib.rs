//! ebb end-to-end: the in-memory Kubernetes API server `ebb-sim`, the simulated cluster around
//! it, the harness that runs the real binaries against it, and the demo.

pub mod api;
pub mod apply;
pub mod clock;
pub mod cluster;
pub mod defaults;
pub mod error;
pub mod harness;
pub mod patch;
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
