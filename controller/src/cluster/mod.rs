//! The cluster as the planner sees it: a [`ClusterSnapshot`] built from Kubernetes objects,
//! with reversible pod moves and a reusable scheduler [`PredicateChecker`].

pub mod build;
pub mod model;
pub mod predicates;
pub mod providers;
pub mod quantity;
pub mod snapshot;
pub mod undo;

pub use build::{ClusterObjects, SnapshotError, build_snapshot};
pub use model::{ClassId, NodeId, NodeInfo, PodId, PodInfo, Resources};
pub use predicates::{PredicateChecker, Unfit};
pub use snapshot::ClusterSnapshot;
pub use undo::UndoLog;
