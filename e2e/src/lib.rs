//! ebb end-to-end: the harness that runs ebb's binaries against a cluster (ebb-sim or a real
//! control plane), the demo, and the end-to-end tests (the benches are in `bench/`).

pub mod audit;
pub mod capi;
pub mod faults;
pub mod harness;
pub mod images;
pub mod karpenter;
pub mod pdb_safety;
pub mod prometheus;
pub mod rbac;
pub mod registry;
pub mod removal;
pub mod setup;

pub use ebb_sim::{Api, AuditRecord, Ctx, PdbViolation, Sim, SimConfig, api, scenario, sim};
