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
    fn run_rejects_a_bad_metrics_address() {
        let err =
            Cli::try_parse_from(["ebb-controller", "run", "--metrics-addr", "nope"]).unwrap_err();
        assert!(err.to_string().contains("--metrics-addr"), "{err}");
    }
}
