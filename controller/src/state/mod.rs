//! State both reconcilers share: the reflector stores of the watched kinds, leadership (the
//! Lease and the flag every write checks), and the coalescing of wake-ups.

pub mod ended_pods;
pub mod leadership;
pub mod lease;
pub mod lists;
pub mod machine_caches;
pub mod pod_index;
pub mod pod_stream;
pub mod pod_wire;
pub mod shared_model;
pub mod stores;
pub mod trim;
pub mod wakes;

pub use leadership::Leadership;
pub use stores::Stores;

#[cfg(test)]
mod pod_stream_tests;
#[cfg(test)]
mod shared_model_tests;
#[cfg(test)]
mod trim_tests;
