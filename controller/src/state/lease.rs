//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager): wait to become the
//! leader, then report the moment leadership is lost so the process stops acting and exits.

use std::time::Duration;

use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError, LeaseParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a Lease is held without renewal.
pub const LEASE_DURATION_SECS: u64 = 15;
/// How long before expiry the holder renews.
pub const LEASE_GRACE_SECS: u64 = 5;

/// Leader election settings (from the command line).
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    /// How long the Lease is held without renewal ([`LEASE_DURATION_SECS`]).
    pub duration_secs: u64,
    /// How long before expiry it is renewed ([`LEASE_GRACE_SECS`]); below `duration_secs`.
    pub grace_secs: u64,
}

impl LeaderConfig {
    /// The Lease `namespace/lease_name` held as `identity`, with the default timings.
    pub fn new(lease_name: &str, namespace: &str, identity: &str) -> Self {
        Self {
            lease_name: lease_name.to_string(),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            duration_secs: LEASE_DURATION_SECS,
            grace_secs: LEASE_GRACE_SECS,
        }
    }
}

/// Leader election failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "cannot use Lease {namespace}/{name} (check that the namespace exists and the service account may create leases there and get and patch this one)"
    )]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: LeaseManagerError,
    },
    #[error("the leader-election task stopped before this replica became the leader")]
    Stopped,
}

/// Held while this replica is the leader.
pub struct Leader {
    state: watch::Receiver<bool>,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
    fence: Fence,
}

/// Self-fencing: the leader reads its Lease every `grace` seconds and counts itself deposed when
/// another holder shows, or when it could not confirm its holding for `duration - grace` (an
/// API it cannot reach may already have handed the Lease to another replica).
#[derive(Clone)]
struct Fence {
    api: kube::Api<k8s_openapi::api::coordination::v1::Lease>,
    name: String,
    identity: String,
    every: Duration,
    patience: Duration,
}

impl Fence {
    async fn deposed(&self) -> String {
        let mut confirmed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.every).await;
            match self.api.get_opt(&self.name).await {
                Ok(Some(lease)) => {
                    let holder = lease.spec.and_then(|s| s.holder_identity);
                    if holder.as_deref() == Some(self.identity.as_str()) {
                        confirmed = tokio::time::Instant::now();
                        continue;
                    }
                    return format!(
                        "the Lease is held by {}",
                        holder.as_deref().unwrap_or("nobody")
                    );
                }
                Ok(None) => return "the Lease was deleted".to_string(),
                Err(e) if confirmed.elapsed() >= self.patience => {
                    return format!(
                        "could not confirm the Lease for {}s: {e}",
                        confirmed.elapsed().as_secs()
                    );
                }
                Err(e) => tracing::warn!(error = %e, "reading the Lease"),
            }
        }
    }
}

impl Leader {
    /// Campaign until this replica holds the Lease. `on_known` is called once the Lease has
    /// been read (leadership is known, whether or not we hold it).
    pub async fn acquire(
        client: kube::Client,
        cfg: &LeaderConfig,
        on_known: impl FnOnce(),
    ) -> Result<Self, LeaderError> {
        // The builder panics unless 0 < grace < duration: keep the values in range.
        let duration = cfg.duration_secs.max(2);
        let grace = cfg.grace_secs.clamp(1, duration - 1);
        let fence = Fence {
            api: kube::Api::namespaced(client.clone(), &cfg.namespace),
            name: cfg.lease_name.clone(),
            identity: cfg.identity.clone(),
            every: Duration::from_secs(grace),
            patience: Duration::from_secs(duration - grace),
        };
        let manager = LeaseManagerBuilder::new(client, &cfg.lease_name)
            .with_namespace(&cfg.namespace)
            .with_parameters(
                LeaseParams::new(&cfg.identity, duration, grace)
                    .with_field_manager(format!("ebb-controller-lease-{}", cfg.identity)),
            )
            .build()
            .await
            .map_err(|source| LeaderError::Lease {
                namespace: cfg.namespace.clone(),
                name: cfg.lease_name.clone(),
                source,
            })?;
        on_known();
        let (mut state, task) = manager.watch().await;
        let mut waited = 0u64;
        while !*state.borrow_and_update() {
            tokio::select! {
                changed = state.changed() => {
                    if changed.is_err() {
                        return Err(LeaderError::Stopped);
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(30)) => {
                    waited += 30;
                    tracing::info!(identity = %cfg.identity, waited_secs = waited, "waiting to become the leader");
                }
            }
        }
        tracing::info!(identity = %cfg.identity, lease = %cfg.lease_name, "became the leader");
        Ok(Self { state, task, fence })
    }

    /// Resolves, with why, when leadership is lost: the election says so, the election task
    /// ends, or the Lease cannot be confirmed (see the fence).
    pub async fn lost(&mut self) -> String {
        let fence = self.fence.clone();
        let state = &mut self.state;
        let election = async move {
            loop {
                if !*state.borrow_and_update() {
                    return "the election reports another holder".to_string();
                }
                if state.changed().await.is_err() {
                    return "the election task ended".to_string();
                }
            }
        };
        tokio::select! {
            why = election => why,
            why = fence.deposed() => why,
        }
    }

    /// Give the Lease up (graceful shutdown), bounded in time.
    pub async fn release(self) {
        let Leader { state, task, .. } = self;
        drop(state); // the manager releases the Lease when its receivers are gone
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("Lease released"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "releasing the Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "leader-election task"),
            Err(_) => tracing::warn!("releasing the Lease timed out; it expires on its own"),
        }
    }
}
