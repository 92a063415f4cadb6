//! ebb node agent library: the LMDB state store (`store`), pure recovery and bookkeeping
//! (`recovery`, `transitions`, `cache`, `deletion`, `report`), and the edges (`agent`, `kube_edge`, `api`, `localizer`).

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
