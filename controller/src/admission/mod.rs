//! The steering admission webhook: an HTTPS endpoint the API server calls as pods are created,
//! answering with what `crate::steering` decides; fail-open, least privilege, leader only.
//!
//! At start (after the caches sync) [`Webhook::start`] checks that the chart's
//! MutatingWebhookConfiguration exists (steering is off, said once, without it), makes a serving
//! certificate in memory and serves `POST /steer`. On winning the Lease, [`Webhook::lead`] points
//! the configuration at this replica (its CA, and its URL out of a cluster) and labels its Pod
//! `ebb.dev/leader=true` for the Service; [`Webhook::step_down`] removes the label.

pub mod ca;
pub mod cert;
pub mod cert_dir;
pub mod leader_label;
pub mod registration;
pub mod review;
pub mod server;

use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use leader_label::{LEADER_LABEL, PodRef};

use crate::metrics::Metrics;
use crate::state::Leadership;
use crate::steering::Steering;

/// Whether pods being created are steered, and if not why (for policy status).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SteeringAvailability {
    Enabled,
    Disabled { reason: String },
}

/// The Service the API server calls the webhook through (`namespace/name`, or `name` in the
/// controller's namespace): its DNS names go into the serving certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceName {
    pub namespace: Option<String>,
    pub name: String,
}

impl FromStr for ServiceName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (namespace, name) = match s.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, s),
        };
        let label = |part: &str| {
            !part.is_empty()
                && part.len() <= 63
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        };
        if !label(name) || namespace.is_some_and(|ns| !label(ns)) {
            return Err(format!(
                "{s:?} is not a Service as namespace/name or name (DNS labels)"
            ));
        }
        Ok(Self {
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        })
    }
}

/// The webhook's settings (from the command line).
#[derive(Clone, Debug)]
pub struct SteeringSettings {
    /// Port of the HTTPS server on every interface (0: any free port).
    pub port: u16,
    /// The chart's MutatingWebhookConfiguration.
    pub webhook_name: String,
    /// Set as the webhooks' `clientConfig.url` in place of the Service (out of a cluster).
    pub webhook_url: Option<String>,
    /// The Service of the certificate's names.
    pub service: ServiceName,
    /// The controller's namespace (the Service's when it names none).
    pub namespace: String,
    /// This replica's Pod, labelled while it leads (`None` out of a cluster).
    pub own_pod: Option<PodRef>,
    /// The Secret (in `namespace`) holding the CA the replicas share; `None`: a CA of its own.
    pub ca_secret: Option<String>,
    /// A directory with `tls.crt` and `tls.key` kept by another tool (cert-manager), served in
    /// place of a certificate of ebb's own; the configuration's `caBundle` is then that tool's
    /// to write (cert-manager's CA injector), never the controller's.
    pub cert_dir: Option<std::path::PathBuf>,
}

/// How long the leader-label and registration writes may take when leadership changes.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Failed registrations in a row (1 s apart) before steering is reported off.
const REGISTER_ATTEMPTS: u32 = 3;
/// How often the leader checks that the configuration and its Pod's label still point at it.
pub const REASSERT_EVERY: Duration = Duration::from_secs(30);

/// Replaces `*a` with `next`; whether that changed it.
fn set(a: &mut SteeringAvailability, next: SteeringAvailability) -> bool {
    if *a == next {
        false
    } else {
        *a = next;
        true
    }
}

/// The webhook of this replica: serving (when the configuration exists) or off.
pub struct Webhook {
    client: Option<kube::Client>,
    settings: Option<SteeringSettings>,
    /// The CA the leader writes as `caBundle`; `None` when another tool writes it.
    ca_pem: Option<String>,
    addr: Option<SocketAddr>,
    availability: watch::Sender<SteeringAvailability>,
}

impl Webhook {
    /// Off: `--steering=false` (said once in the log).
    pub fn off(reason: &str) -> Self {
        tracing::info!(%reason, "steering is off");
        Self {
            client: None,
            settings: None,
            ca_pem: None,
            addr: None,
            availability: watch::Sender::new(SteeringAvailability::Disabled {
                reason: reason.to_string(),
            }),
        }
    }

    /// Checks the configuration and, when it is there, serves `POST /steer` until `stop` on
    /// every replica (standbys answer without a patch). Without it, or when the server cannot
    /// start, steering is off and the log says why, once; the controller runs on without it.
    pub async fn start(
        client: &kube::Client,
        settings: SteeringSettings,
        steering: Steering,
        leadership: Leadership,
        metrics: Metrics,
        stop: CancellationToken,
    ) -> Self {
        if let SteeringAvailability::Disabled { reason } =
            registration::check(client, &settings.webhook_name).await
        {
            tracing::warn!(%reason, "steering is off");
            return Self::off_quietly(reason);
        }
        let (tls, ca_pem) = match &settings.cert_dir {
            Some(dir) => match cert_dir::CertDir::load(dir) {
                Ok(files) => {
                    tokio::spawn(files.clone().watch(cert_dir::RELOAD_EVERY, stop.clone()));
                    (files.server_config(), None)
                }
                Err(e) => return Self::failed(e.to_string()),
            },
            None => match own_certificate(client, &settings).await {
                Ok(serving) => (serving.server_config(), Some(serving.ca_pem().to_string())),
                Err(e) => return Self::failed(e.to_string()),
            },
        };
        let tls = match tls {
            Ok(t) => t,
            Err(e) => return Self::failed(e.to_string()),
        };
        let bind = SocketAddr::from((Ipv4Addr::UNSPECIFIED, settings.port));
        let app = server::router(steering, leadership, metrics);
        let addr = match server::serve(bind, tls, app, stop).await {
            Ok(a) => a,
            Err(e) => {
                return Self::failed(format!(
                    "cannot serve the steering webhook on {bind} (--steering-port): {e}"
                ));
            }
        };
        tracing::info!(%addr, path = server::PATH, webhook = %settings.webhook_name, cert_dir = ?settings.cert_dir, "serving the steering webhook");
        // A Pod restarted after it led may still carry the label: not the leader now.
        if let Some(pod) = &settings.own_pod {
            label(client, pod, false).await;
        }
        Self {
            client: Some(client.clone()),
            settings: Some(settings),
            ca_pem,
            addr: Some(addr),
            availability: watch::Sender::new(SteeringAvailability::Enabled),
        }
    }

    fn off_quietly(reason: String) -> Self {
        Self {
            client: None,
            settings: None,
            ca_pem: None,
            addr: None,
            availability: watch::Sender::new(SteeringAvailability::Disabled { reason }),
        }
    }

    fn failed(reason: String) -> Self {
        tracing::error!(%reason, "steering is off");
        Self::off_quietly(reason)
    }

    /// Whether steering is on, kept current (it turns off when the leader cannot register).
    pub fn availability(&self) -> watch::Receiver<SteeringAvailability> {
        self.availability.subscribe()
    }

    /// The address the webhook serves on, while it serves.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// While leading (run as a task of its own, aborted on stepping down): point the
    /// configuration at this replica (its CA; its URL out of a cluster) and label its Pod so the
    /// Service routes to it, then look again every [`REASSERT_EVERY`] and put back whatever was
    /// changed (a configuration re-created by GitOps, a CA written by a deposed leader, a label
    /// patch that timed out). Steering is `Enabled` while the configuration points here, and off
    /// with the reason after [`REGISTER_ATTEMPTS`] failures in a row (the API server fails open
    /// meanwhile); it comes back on at the next success.
    pub async fn lead(&self) {
        let (Some(client), Some(settings)) = (&self.client, &self.settings) else {
            return;
        };
        let mut failures = 0u32;
        let mut labelled = false;
        loop {
            let registered = tokio::time::timeout(
                WRITE_TIMEOUT,
                registration::register(
                    client,
                    &settings.webhook_name,
                    self.ca_pem.as_deref(),
                    settings.webhook_url.as_deref(),
                ),
            )
            .await;
            let last = match registered {
                Ok(Ok((webhooks, written))) => {
                    if written {
                        tracing::info!(webhook = %settings.webhook_name, webhooks, url = ?settings.webhook_url, "steering webhook registered");
                    }
                    if let Some(pod) = &settings.own_pod
                        && (written || !labelled)
                    {
                        labelled = label(client, pod, true).await;
                    } else if settings.own_pod.is_none() {
                        labelled = true;
                    }
                    failures = 0;
                    self.availability
                        .send_if_modified(|a| set(a, SteeringAvailability::Enabled));
                    tokio::time::sleep(REASSERT_EVERY).await;
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "timed out".to_string(),
            };
            failures += 1;
            if failures >= REGISTER_ATTEMPTS {
                let reason = format!(
                    "cannot register the steering webhook {}: {last}",
                    settings.webhook_name
                );
                if failures == REGISTER_ATTEMPTS {
                    tracing::error!(%reason, "steering is off until the registration succeeds");
                }
                self.availability
                    .send_if_modified(|a| set(a, SteeringAvailability::Disabled { reason }));
                tokio::time::sleep(REASSERT_EVERY).await;
            } else {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// On stopping or losing the Lease: remove the leader label from this replica's Pod.
    pub async fn step_down(&self) {
        if let (Some(client), Some(pod)) = (
            &self.client,
            self.settings.as_ref().and_then(|s| s.own_pod.as_ref()),
        ) {
            label(client, pod, false).await;
        }
    }
}

/// A serving certificate of ebb's own for the Service's names (and a `webhookURL` host): signed
/// by the CA the replicas share through `settings.ca_secret`, or by a CA of this replica's own
/// when it cannot be shared (steering still works while this replica leads).
async fn own_certificate(
    client: &kube::Client,
    settings: &SteeringSettings,
) -> Result<cert::ServingCert, cert::CertError> {
    let mut names = cert::dns_names(&settings.service, &settings.namespace);
    // The API server checks the certificate against the host it calls.
    names.extend(settings.webhook_url.as_deref().and_then(cert::url_host));
    let shared = match &settings.ca_secret {
        Some(name) => match ca::shared(
            client,
            &settings.namespace,
            name,
            registration::owner(client, &settings.webhook_name).await,
        )
        .await
        {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(error = %e, "the steering webhook's CA is not shared: this replica uses one of its own, which the configuration trusts only while it leads");
                None
            }
        },
        None => None,
    };
    match shared {
        Some(m) => cert::ServingCert::signed_by(&names, &m),
        None => cert::ServingCert::generate(&names),
    }
}

/// Sets or removes the leader label, bounded in time; failures are logged (the Service then
/// routes wrongly at worst, and the API server fails open). Whether it is as asked now.
async fn label(client: &kube::Client, pod: &PodRef, leader: bool) -> bool {
    let done = tokio::time::timeout(
        WRITE_TIMEOUT,
        leader_label::set_leader_label(client, pod, leader),
    )
    .await;
    match done {
        Ok(Ok(leader_label::Labelled::Written)) => {
            tracing::info!(pod = %pod.name, namespace = %pod.namespace, leader, label = LEADER_LABEL, "leader label written");
            true
        }
        Ok(Ok(leader_label::Labelled::NoPod)) => {
            tracing::info!(pod = %pod.name, namespace = %pod.namespace, "no such Pod: the leader label is not written");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(pod = %pod.name, error = %e, leader, "cannot write the leader label");
            false
        }
        Err(_) => {
            tracing::warn!(pod = %pod.name, leader, "writing the leader label timed out");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_parse_with_or_without_namespace() {
        assert_eq!(
            "ebb-system/ebb-steering".parse::<ServiceName>(),
            Ok(ServiceName {
                namespace: Some("ebb-system".into()),
                name: "ebb-steering".into()
            })
        );
        assert_eq!(
            "steer".parse::<ServiceName>().map(|s| s.namespace),
            Ok(None)
        );
        for bad in ["", "/x", "a/", "a/b/c", "Upper", "-x", "a b"] {
            assert!(bad.parse::<ServiceName>().is_err(), "{bad:?}");
        }
    }
}
