//! ebb's benches that run whole clusters, and the harnesses of the peers they compare ebb with.
//! `etcd_load`: the scale bench's bulk set-up written straight into etcd.
//! `kubelet`: the scale bench's kubelet of the drain pool's pods while kwok is stopped.
//! `versus`: ebb against Cluster Autoscaler and Karpenter on one real control plane per column.

pub mod etcd_load;
pub mod kubelet;
pub mod versus;
