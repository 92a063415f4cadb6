//! Why a loop of a ScaleDownPolicy failed: typed, with the variant's name as the `reason` label of
//! `ebb_reconcile_errors_total`.

use kube::runtime::finalizer;

/// A loop that failed; retried after [`ERROR_REQUEUE`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ScaleDownPolicy {policy}: the cluster snapshot cannot be built: {source}")]
    Snapshot {
        policy: String,
        #[source]
        source: crate::cluster::SnapshotError,
    },
    #[error("ScaleDownPolicy {policy}: writing status: {source}")]
    Status {
        policy: String,
        #[source]
        source: kube::Error,
    },
    #[error("ScaleDownPolicy {policy}: {source}")]
    Finalizer {
        policy: String,
        #[source]
        source: Box<finalizer::Error<Error>>,
    },
    #[error("ScaleDownPolicy has no name")]
    NoName,
}

impl Error {
    /// Every value [`Error::reason`] gives (its series start at 0).
    pub const REASONS: &[&str] = &["Snapshot", "Status", "Finalizer", "NoName"];

    /// The `reason` label of `ebb_reconcile_errors`: the variant's name.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Snapshot { .. } => "Snapshot",
            Error::Status { .. } => "Status",
            Error::Finalizer { .. } => "Finalizer",
            Error::NoName => "NoName",
        }
    }
}
