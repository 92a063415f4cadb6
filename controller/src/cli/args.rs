//! Command line of `ebb-controller`: `run` (the controller), `plan` (offline what-if) and `crds`.
//! Every flag has an environment variable equivalent so the Helm chart can set it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use ebb_api::KubeDuration;

use crate::reconcilers::placement::PlacementSettings;

/// ebb: removes under-used Kubernetes nodes in parallel without stranding workloads, and sends
/// workloads back to the nodes that hold their warm local data.
#[derive(Debug, Parser)]
#[command(name = "ebb-controller", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start: the size of `run`'s flags does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller against the cluster of the current kubeconfig (or in-cluster config).
    Run(RunArgs),
    /// Show which nodes a ScaleDownPolicy would remove, offline and read-only.
    Plan(PlanArgs),
    /// Print the CustomResourceDefinitions of ebb as YAML (or write one file per CRD).
    Crds(CrdsArgs),
}

pub use ebb_telemetry::LogFormat;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Address of the HTTP server for /metrics, /healthz and /readyz.
    #[arg(long, env = "EBB_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Campaign for a Lease and act only while holding it. Turn off only when a single replica runs.
    #[arg(long, env = "EBB_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "EBB_LEASE_NAME", default_value = "ebb-controller")]
    pub lease_name: String,
    /// Namespace of the Lease and of the token Secret (the controller's own namespace). Defaults
    /// to the pod's namespace in a cluster, else the kubeconfig context's namespace, else `default`.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Identity in the Lease; defaults to the pod name, else the host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Log format.
    #[arg(long, env = "EBB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter in RUST_LOG syntax (for example `info,ebb_controller=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
    /// Extra wait, once the node watch shows a node's `ebb.dev/to-be-deleted` taint, before
    /// re-checking that it is still removable. None is needed: pods on their way to the node
    /// fail the re-check, a pod that lands later makes the drain give up, and no node is
    /// deleted within 5s of its taint.
    #[arg(long, env = "EBB_RECHECK_DELAY", default_value = "0s")]
    pub recheck_delay: ebb_api::KubeDuration,
    /// Eviction calls in flight at once, all drains of all policies together. A pod waiting
    /// for its disruption budget takes no slot; an API server slow to answer gets no more calls
    /// than this.
    #[arg(long, env = "EBB_MAX_EVICTIONS_IN_FLIGHT", default_value_t = crate::actuation::evict::DEFAULT_MAX_IN_FLIGHT, value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u16).range(1..), usize::from))]
    pub max_evictions_in_flight: usize,
    /// Replacements of the controller's evictions starting at once (created and not Running
    /// yet), all drains together, at first and at least; the next eviction waits. Above it the
    /// bound follows the rate the cluster starts replacements at (1.5 × the starts a second ×
    /// the shortest start), up to `--max-starting-replacements`. Counted: evictions of
    /// ReplicaSet, ReplicationController and Job pods. A count is given up when none of its
    /// namespace's replacements started for 15 s while others did, or 2 minutes after its
    /// eviction (and its namespace is not paced for 10 minutes).
    #[arg(long, env = "EBB_MIN_STARTING_REPLACEMENTS", default_value_t = crate::actuation::pacing::DEFAULT_MIN_STARTING, value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u16), usize::from))]
    pub min_starting_replacements: usize,
    /// The most replacements of the controller's evictions starting at once, whatever the
    /// cluster's start rate (a larger `--min-starting-replacements` is lowered to it). 0:
    /// evictions are not paced by their replacements.
    #[arg(long, env = "EBB_MAX_STARTING_REPLACEMENTS", default_value_t = crate::actuation::pacing::DEFAULT_MAX_STARTING, value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u16), usize::from))]
    pub max_starting_replacements: usize,
    /// How long a stop (SIGTERM, Ctrl-C) may take: no new drain starts, drains in flight finish
    /// or roll back (none leaves its node tainted), the Lease is released. Keep it 5 s below the
    /// pod's `terminationGracePeriodSeconds` (the chart derives it so).
    #[arg(long, env = "EBB_SHUTDOWN_TIMEOUT", default_value_t = KubeDuration(crate::cli::run::DEFAULT_SHUTDOWN_TIMEOUT))]
    pub shutdown_timeout: ebb_api::KubeDuration,
    /// Name of the Secret (in `--namespace`) holding the node-local API token keys.
    #[arg(long, env = "EBB_TOKEN_SECRET", default_value = PlacementSettings::DEFAULT_TOKEN_SECRET_NAME)]
    pub token_secret: String,
    /// Gated pods (`ebb.dev/placement`) that no valid PlacementHistory governs are released
    /// unchanged after this long.
    #[arg(long, env = "EBB_PLACEMENT_GRACE", default_value_t = KubeDuration(PlacementSettings::DEFAULT_GRACE))]
    pub placement_grace: ebb_api::KubeDuration,
    /// A PlacementHistory's status is written at most this often (and only on change).
    #[arg(long, env = "EBB_PLACEMENT_STATUS_INTERVAL", default_value_t = KubeDuration(PlacementSettings::DEFAULT_STATUS_INTERVAL))]
    pub placement_status_interval: ebb_api::KubeDuration,
    /// Lifetime of the node-local API tokens minted into placed pods.
    #[arg(long, env = "EBB_TOKEN_TTL", default_value_t = KubeDuration(PlacementSettings::DEFAULT_TOKEN_TTL))]
    pub token_ttl: ebb_api::KubeDuration,
    /// How often the token key in `--token-secret` is replaced (the old key stays valid as the
    /// previous key).
    #[arg(long, env = "EBB_TOKEN_ROTATION", default_value_t = KubeDuration(PlacementSettings::DEFAULT_KEY_ROTATION))]
    pub token_rotation: ebb_api::KubeDuration,
    /// Remove drained nodes' machines through Cluster API (`removal.method: ClusterAPI`, or
    /// `Auto` on nodes with a Machine): watches MachineSets and MachineDeployments, marks
    /// Machines and scales their groups down. Fails at start when Cluster API is not served.
    #[arg(long, env = "EBB_CLUSTER_API", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub cluster_api: bool,
    /// Kubeconfig of the Cluster API management cluster, when it is not this cluster (the
    /// chart mounts it from a Secret).
    #[arg(long, env = "EBB_CLUSTER_API_KUBECONFIG")]
    pub cluster_api_kubeconfig: Option<std::path::PathBuf>,
    /// Remove drained nodes' machines through Karpenter (`removal.method: Karpenter`, or `Auto`
    /// on nodes a NodeClaim names): watches NodeClaims and deletes them. Fails at start when
    /// Karpenter's NodeClaim is not served.
    #[arg(long, env = "EBB_KARPENTER", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub karpenter: bool,
    /// Steer replacement pods to their planned nodes with a preferred node affinity added at
    /// admission, through the MutatingWebhookConfiguration `--steering-webhook-name` (without it
    /// steering is off and the log says so). false: no webhook server, nothing is steered.
    #[arg(long, env = "EBB_STEERING", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub steering: bool,
    /// Port of the steering webhook's HTTPS server, on every interface (0: any free port).
    #[arg(long, env = "EBB_STEERING_PORT", default_value_t = 9443)]
    pub steering_port: u16,
    /// Name of the MutatingWebhookConfiguration the leader points at itself (CA bundle).
    #[arg(
        long,
        env = "EBB_STEERING_WEBHOOK_NAME",
        default_value = "ebb-steering"
    )]
    pub steering_webhook_name: String,
    /// URL the API server calls the webhook at, set in the configuration in place of its
    /// Service, for a controller running outside the cluster (`https://127.0.0.1:9443/steer`).
    #[arg(long, env = "EBB_STEERING_WEBHOOK_URL", value_parser = https_url)]
    pub steering_webhook_url: Option<String>,
    /// Secret (in `--namespace`) holding the CA every replica signs its serving certificate
    /// with: read, or made and created by the first replica to start. Empty: each replica makes
    /// a CA of its own (trusted only while it leads).
    #[arg(
        long,
        env = "EBB_STEERING_CA_SECRET",
        default_value = "ebb-steering-ca"
    )]
    pub steering_ca_secret: String,
    /// Directory holding the webhook's serving certificate as `tls.crt` and `tls.key`, kept by
    /// another tool (cert-manager's Secret, mounted): served in place of ebb's own certificate
    /// and re-read when renewed; `--steering-ca-secret` is then unused and the webhook
    /// configuration's `caBundle` is left to that tool (cert-manager's CA injector).
    #[arg(long, env = "EBB_STEERING_CERT_DIR")]
    pub steering_cert_dir: Option<std::path::PathBuf>,
    /// The webhook's Service, `namespace/name` (or `name` in `--namespace`): its DNS names are
    /// the serving certificate's.
    #[arg(long, env = "EBB_STEERING_SERVICE", default_value = "ebb-steering")]
    pub steering_service: crate::admission::ServiceName,
    /// How the caches take their first list: `stream` (one watch sending the current objects,
    /// Kubernetes 1.34+), `list` (paged LIST calls), or `auto` (stream on 1.34 and newer).
    #[arg(long, env = "EBB_INITIAL_LIST", value_enum, default_value_t = crate::state::lists::InitialList::Auto)]
    pub initial_list: crate::state::lists::InitialList,
    /// How the pod cache asks for pods: `protobuf` (JSON where the API server answers only
    /// JSON; a third cheaper for the API server to list) or `json` (kube's watcher, as before).
    #[arg(long, env = "EBB_POD_ENCODING", value_enum, default_value_t = crate::state::pod_stream::PodEncoding::Protobuf)]
    pub pod_encoding: crate::state::pod_stream::PodEncoding,
}

/// An `https://` URL, as the API server calls webhooks.
fn https_url(s: &str) -> Result<String, String> {
    if s.starts_with("https://") && s.len() > "https://".len() && !s.contains(['#', '?', ' ']) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not an https:// URL without query or fragment (the API server calls webhooks over HTTPS)"
        ))
    }
}

/// Output format of `plan`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum PlanOutput {
    /// Stable JSON document (see docs/plan.md).
    Json,
    /// Aligned table for people.
    #[default]
    Table,
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// A `List` as written by `kubectl get nodes,pods,pdb,replicasets,statefulsets,daemonsets,jobs,pv,pvc,storageclasses -A -o json`
    /// (or `-o yaml`). Without it the same objects are read from the current kubeconfig context.
    #[arg(long, env = "EBB_PLAN_SNAPSHOT")]
    pub snapshot: Option<PathBuf>,
    /// A ScaleDownPolicy YAML or JSON file; without it every default applies and all nodes are selected.
    #[arg(long, env = "EBB_PLAN_POLICY")]
    pub policy: Option<PathBuf>,
    /// The moment to plan at (RFC 3339); defaults to now.
    #[arg(long)]
    pub now: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = PlanOutput::Table)]
    pub output: PlanOutput,
}

#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// Write one `<plural>.ebb.dev.yaml` file per CRD into this directory instead of printing.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn plan_parses_output_and_files() {
        let cli = Cli::try_parse_from([
            "ebb-controller",
            "plan",
            "--snapshot",
            "s.json",
            "-o",
            "json",
        ])
        .unwrap();
        match cli.command {
            Command::Plan(p) => {
                assert_eq!(p.output, PlanOutput::Json);
                assert_eq!(p.snapshot.as_deref(), Some(std::path::Path::new("s.json")));
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(Cli::try_parse_from(["ebb-controller", "plan", "-o", "xml"]).is_err());
    }

    #[test]
    fn steering_flags_parse_and_bad_values_are_refused() {
        let run = |args: &[&str]| {
            let mut all = vec!["ebb-controller", "run"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).map(|c| match c.command {
                Command::Run(r) => r,
                other => panic!("parsed as {other:?}"),
            })
        };
        let d = run(&[]).unwrap();
        assert!(d.steering);
        assert_eq!(d.steering_port, 9443);
        assert_eq!(d.steering_webhook_name, "ebb-steering");
        assert_eq!(d.steering_webhook_url, None);
        assert_eq!(d.steering_service.name, "ebb-steering");
        let r = run(&[
            "--steering=false",
            "--steering-port",
            "0",
            "--steering-webhook-url",
            "https://127.0.0.1:40001/steer",
            "--steering-service",
            "ops/ebb-steer",
        ])
        .unwrap();
        assert!(!r.steering);
        assert_eq!(r.steering_port, 0);
        assert_eq!(
            r.steering_webhook_url.as_deref(),
            Some("https://127.0.0.1:40001/steer")
        );
        assert_eq!(r.steering_service.namespace.as_deref(), Some("ops"));
        let err = run(&["--steering-webhook-url", "http://127.0.0.1/steer"]).unwrap_err();
        assert!(err.to_string().contains("https://"), "{err}");
        let err = run(&["--steering-service", "a/b/c"]).unwrap_err();
        assert!(err.to_string().contains("--steering-service"), "{err}");
        assert!(run(&["--steering-port", "70000"]).is_err());
    }

    #[test]
    fn run_rejects_a_bad_metrics_address() {
        let err =
            Cli::try_parse_from(["ebb-controller", "run", "--metrics-addr", "nope"]).unwrap_err();
        assert!(err.to_string().contains("--metrics-addr"), "{err}");
    }
}
