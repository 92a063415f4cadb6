//! ebb node agent library: the LMDB state store (`store`), pure recovery and bookkeeping
//! (`recovery`, `transitions`, `cache`, `deletion`, `report`), the source policy and cache files
//! (`fetch_policy`, `cache_fs`, `redact`), and the edges (`agent`, `kube_edge`, `api`, `localizer`).

pub mod agent;
pub mod api;
pub mod cache;
pub mod cache_fs;
pub mod cli;
pub mod core;
pub mod crash_writer;
pub mod deletion;
pub mod dump;
pub mod fetch_policy;
pub mod kube_edge;
pub mod livepod;
pub mod localizer;
pub mod membership;
pub mod metrics;
pub mod recovery;
pub mod redact;
pub mod report;
pub mod state;
pub mod store;
pub mod tokens;
pub mod transitions;
