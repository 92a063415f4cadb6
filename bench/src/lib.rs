//! ebb's benches that run whole clusters, and the harnesses of the peers they compare ebb with.
//! `versus`: ebb against Cluster Autoscaler and Karpenter on one real control plane per column.

pub mod versus;
