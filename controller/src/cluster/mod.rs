//! The cluster as the planner sees it: a [`ClusterSnapshot`] built from Kubernetes objects or
//! kept current from watch events ([`LiveCluster`]), with reversible pod moves and a reusable
//! scheduler [`PredicateChecker`].

pub mod build;
pub mod cached_pod;
pub mod cached_pod_pb;
pub mod compact_map;
pub mod incremental;
pub mod live;
pub mod machines;
pub mod predicates;
pub mod quantity;
pub mod snapshot;
pub mod steered;
pub mod types;
pub mod undo;

pub use build::{ClusterObjects, SnapshotError, build_snapshot};
pub use cached_pod::CachedPod;
pub use incremental::UpdateError;
pub use live::{ClusterEvent, LiveCluster};
pub use predicates::{PredicateChecker, Unfit};
pub use snapshot::ClusterSnapshot;
pub use steered::SteeredPods;
pub use types::{ClassId, NodeId, NodeInfo, PodId, PodInfo, Resources};
pub use undo::UndoLog;

#[cfg(test)]
pub(crate) mod cached_pod_pb_tests;
#[cfg(test)]
pub(crate) mod live_tests;
