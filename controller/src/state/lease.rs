//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager): wait to become the
//! leader, then report the moment leadership is lost so the process stops acting and exits.

use std::time::Duration;

use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError, LeaseParams};

use super::Leadership;
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
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
    /// Why leadership was lost, once it is (set by the one fence task started at acquisition).
    lost: watch::Receiver<Option<String>>,
    fence_task: FenceTask,
}

/// The fence task, aborted when its [`Leader`] is dropped: it holds the election's last
/// receiver, and the Lease is released once that is gone.
struct FenceTask(JoinHandle<()>);

impl Drop for FenceTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Self-fencing: the leader reads its Lease every `every` and counts itself deposed when another
/// holder shows, or when the last renewal it can see (the Lease's `renewTime`) is older than
/// `duration - margin`. A standby acquires the Lease only once `renewTime + duration` has passed,
/// so a leader that cannot renew (API server or etcd unreachable) stops acting `margin` before
/// anyone else may start. kube-lease-manager keeps believing it holds the Lease while its
/// renewals fail (it retries with a back-off and reports no loss), hence this deadline of its own.
#[derive(Clone)]
struct Fence {
    api: kube::Api<k8s_openapi::api::coordination::v1::Lease>,
    name: String,
    identity: String,
    every: Duration,
    /// How long after its last renewal the holder may still act: the Lease's duration less a
    /// margin for clock skew and for a request in flight.
    valid_for: Duration,
}

/// Why a read of the Lease deposes its holder, or how long ago it was renewed.
#[derive(Debug, PartialEq, Eq)]
enum LeaseRead {
    /// Held by this identity, renewed this long ago (zero when `renewTime` is in the future).
    Held(Duration),
    Deposed(String),
}

/// What the Lease says of `identity` at `now` (wall clock, as `renewTime` is written).
fn read_lease(
    lease: &k8s_openapi::api::coordination::v1::Lease,
    identity: &str,
    now: jiff::Timestamp,
) -> LeaseRead {
    let spec = lease.spec.as_ref();
    let holder = spec.and_then(|s| s.holder_identity.as_deref());
    if holder != Some(identity) {
        return LeaseRead::Deposed(format!(
            "the Lease is held by {}",
            holder.unwrap_or("nobody")
        ));
    }
    match spec.and_then(|s| s.renew_time.as_ref()) {
        Some(t) => {
            let age = now.duration_since(t.0).unsigned_abs();
            let age = if t.0 > now { Duration::ZERO } else { age };
            LeaseRead::Held(age)
        }
        None => LeaseRead::Deposed("the Lease has no renewTime".to_string()),
    }
}

impl Fence {
    /// Reads the Lease until it deposes this holder, moving `leadership`'s fence to each
    /// renewal seen; `acquired` is when the Lease was won (its renewTime was written then).
    async fn deposed(&self, leadership: &Leadership, acquired: tokio::time::Instant) -> String {
        let mut valid_until = acquired + self.valid_for;
        leadership.fence_at(valid_until.into_std());
        loop {
            let read = tokio::time::timeout(self.every, self.api.get_opt(&self.name)).await;
            match read {
                Ok(Ok(Some(lease))) => {
                    match read_lease(&lease, &self.identity, jiff::Timestamp::now()) {
                        LeaseRead::Held(age) => {
                            valid_until =
                                tokio::time::Instant::now() + self.valid_for.saturating_sub(age);
                            leadership.fence_at(valid_until.into_std());
                        }
                        LeaseRead::Deposed(why) => return why,
                    }
                }
                Ok(Ok(None)) => return "the Lease was deleted".to_string(),
                Ok(Err(e)) => tracing::warn!(error = %e, "reading the Lease"),
                Err(_) => tracing::warn!("reading the Lease timed out"),
            }
            let now = tokio::time::Instant::now();
            if now >= valid_until {
                return format!(
                    "the Lease was not renewed for {:.1}s; another replica may acquire it soon",
                    self.valid_for.as_secs_f64()
                );
            }
            tokio::time::sleep(self.every.min(valid_until - now)).await;
        }
    }
}

/// How much sooner than a standby may acquire the Lease its holder stops acting: room for clock
/// skew between replicas and for a request already sent (at most; half the renewal grace when
/// that is shorter, so that a renewal on time never trips the fence).
const FENCE_MARGIN: Duration = Duration::from_secs(2);
/// How often the holder reads its Lease (at most; the margin when that is shorter).
const FENCE_POLL: Duration = Duration::from_secs(1);

impl Leader {
    /// Campaign until this replica holds the Lease. `on_known` is called once the Lease has
    /// been read (leadership is known, whether or not we hold it). From the moment it is held,
    /// one fence task keeps `leadership`'s fence at the last renewal seen plus the Lease's
    /// duration less a margin, and closes it when the Lease is lost: every write checks it.
    pub async fn acquire(
        client: kube::Client,
        cfg: &LeaderConfig,
        leadership: &Leadership,
        on_known: impl FnOnce(),
    ) -> Result<Self, LeaderError> {
        // The builder panics unless 0 < grace < duration: keep the values in range.
        let duration = cfg.duration_secs.max(2);
        let grace = cfg.grace_secs.clamp(1, duration - 1);
        let margin = FENCE_MARGIN.min(Duration::from_secs(grace) / 2);
        let fence = Fence {
            api: kube::Api::namespaced(client.clone(), &cfg.namespace),
            name: cfg.lease_name.clone(),
            identity: cfg.identity.clone(),
            every: FENCE_POLL.min(margin),
            valid_for: Duration::from_secs(duration).saturating_sub(margin),
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
        let acquired = tokio::time::Instant::now();
        // Armed before this returns: whatever acts next (start-up recovery first) is within
        // the fence from the first moment, before the fence task has run at all.
        leadership.fence_at((acquired + fence.valid_for).into_std());
        let (lost_tx, lost) = watch::channel(None);
        let fenced = leadership.clone();
        let fence_task = tokio::spawn(async move {
            let election = async {
                loop {
                    if !*state.borrow_and_update() {
                        return "the election reports another holder".to_string();
                    }
                    if state.changed().await.is_err() {
                        return "the election task ended".to_string();
                    }
                }
            };
            let why = tokio::select! {
                why = election => why,
                why = fence.deposed(&fenced, acquired) => why,
            };
            fenced.fence_now();
            let _ = lost_tx.send(Some(why));
            // The election's receiver is kept until the Lease is released (see `release`).
            std::future::pending::<()>().await;
        });
        Ok(Self {
            task,
            lost,
            fence_task: FenceTask(fence_task),
        })
    }

    /// Resolves, with why, when leadership is lost: the election says so, the election task
    /// ends, or the Lease cannot be confirmed (see the fence). The same answer however often it
    /// is asked: one fence task decides, from the moment the Lease was acquired.
    pub async fn lost(&mut self) -> String {
        loop {
            if let Some(why) = self.lost.borrow_and_update().clone() {
                return why;
            }
            if self.lost.changed().await.is_err() {
                return "the fence task ended".to_string();
            }
        }
    }

    /// Give the Lease up (graceful shutdown: its holder is cleared, so a standby acquires it at
    /// once), within `bound` (at least a second).
    pub async fn release(self, bound: Duration) {
        let Leader {
            task,
            mut fence_task,
            ..
        } = self;
        // The manager releases the Lease when its receivers are gone: the fence task holds the
        // last one.
        fence_task.0.abort();
        let _ = (&mut fence_task.0).await;
        match tokio::time::timeout(bound.max(Duration::from_secs(1)), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("Lease released"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "releasing the Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "leader-election task"),
            Err(_) => tracing::warn!("releasing the Lease timed out; it expires on its own"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: Option<&str>, renewed: Option<jiff::Timestamp>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed.map(MicroTime),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn a_lease_reads_as_held_since_its_renewal_or_deposed() {
        let now: jiff::Timestamp = "2026-01-01T00:00:10Z".parse().unwrap();
        let renewed: jiff::Timestamp = "2026-01-01T00:00:07Z".parse().unwrap();
        assert_eq!(
            read_lease(&lease(Some("a"), Some(renewed)), "a", now),
            LeaseRead::Held(Duration::from_secs(3))
        );
        // A renewal stamped ahead of this clock counts as just now.
        assert_eq!(
            read_lease(
                &lease(Some("a"), Some(now + jiff::SignedDuration::from_secs(1))),
                "a",
                now
            ),
            LeaseRead::Held(Duration::ZERO)
        );
        assert!(matches!(
            read_lease(&lease(Some("b"), Some(renewed)), "a", now),
            LeaseRead::Deposed(w) if w.contains("held by b")
        ));
        assert!(matches!(
            read_lease(&lease(None, None), "a", now),
            LeaseRead::Deposed(w) if w.contains("nobody")
        ));
        assert!(matches!(
            read_lease(&lease(Some("a"), None), "a", now),
            LeaseRead::Deposed(_)
        ));
    }
}
