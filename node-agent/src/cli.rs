//! Command line of `ebb-node-agent`: `run` (the DaemonSet process) and `dump` (read the store).
//! Every flag has an environment variable equivalent so the Helm chart can set it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
pub use ebb_telemetry::LogFormat;
use ipnet::IpNet;

use crate::fetch_policy::parse_cidr;

/// ebb node agent: keeps node-local state (containers, cached resources, tokens, deletion tasks)
/// in an LMDB store that survives restarts, and reports it into the node's NodeState.
#[derive(Debug, Parser)]
#[command(name = "ebb-node-agent", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent for one node.
    Run(Box<RunArgs>),
    /// Print the whole state store as JSON (read-only; safe while the agent runs).
    Dump(DumpArgs),
    /// Testing aid for the crash-safety test: performs container transitions through the group
    /// writer as fast as it can and prints `ack <container> <step>` for each one committed.
    #[command(hide = true)]
    CrashWriter(CrashWriterArgs),
}

#[derive(Debug, clap::Args)]
pub struct CrashWriterArgs {
    #[arg(long)]
    pub state_dir: PathBuf,
    /// Number of transitions (three per container: requested, launched, completed).
    #[arg(long, default_value_t = 10_000)]
    pub transitions: u64,
    /// Concurrent submitters (their transitions are group-committed together).
    #[arg(long, default_value_t = 4)]
    pub submitters: u64,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Name of the node this agent serves (the chart sets it from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Directory of the LMDB state store. Without it nothing survives a restart (null store).
    #[arg(long, env = "EBB_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Move an unreadable state store aside (timestamped) and start empty. Never done implicitly.
    #[arg(long, env = "EBB_RESET_STATE", default_value_t = false)]
    pub reset_state: bool,
    /// Directory of the node cache for localized resources.
    #[arg(long, env = "EBB_CACHE_DIR", default_value = "/var/cache/ebb")]
    pub cache_dir: PathBuf,
    /// Unix socket of the node-local API that pods use (mode 0660: root, or group 0).
    #[arg(long, env = "EBB_SOCKET", default_value = "/run/ebb/agent.sock")]
    pub socket: PathBuf,
    /// Serve /healthz, /readyz and /metrics on this address (never the node-local API).
    #[arg(long, env = "EBB_LISTEN_ADDR", default_value = "127.0.0.1:8081")]
    pub listen_addr: SocketAddr,
    /// Directories whose files `file://` resources may name (comma-separated). None by default:
    /// every `file://` URL is refused. Never a directory holding credentials or ebb's state.
    #[arg(long = "file-root", env = "EBB_FILE_ROOTS", value_delimiter = ',')]
    pub file_roots: Vec<PathBuf>,
    /// Hosts (`artifacts.internal`, `*.svc.cluster.local`) fetched from even at private,
    /// loopback or cluster addresses (comma-separated). Link-local addresses stay refused.
    #[arg(
        long = "fetch-allow-host",
        env = "EBB_FETCH_ALLOW_HOSTS",
        value_delimiter = ','
    )]
    pub fetch_allow_hosts: Vec<String>,
    /// Address ranges (CIDRs or single addresses) fetched from even when private, loopback or
    /// the cluster's (comma-separated). Link-local and the node's own addresses stay refused.
    #[arg(long = "fetch-allow-cidr", env = "EBB_FETCH_ALLOW_CIDRS", value_delimiter = ',', value_parser = parse_cidr)]
    pub fetch_allow_cidrs: Vec<IpNet>,
    /// The cluster's pod and service ranges (comma-separated): refused like private addresses
    /// even where they are public ones.
    #[arg(long = "cluster-cidr", env = "EBB_CLUSTER_CIDRS", value_delimiter = ',', value_parser = parse_cidr)]
    pub cluster_cidrs: Vec<IpNet>,
    /// Bytes all localized resources may take on this node (fetches reserve their size limit).
    #[arg(long, env = "EBB_CACHE_MAX_BYTES", default_value_t = 100 << 30)]
    pub cache_max_bytes: u64,
    /// Bytes one namespace's localized resources may take on this node.
    #[arg(long, env = "EBB_NAMESPACE_QUOTA_BYTES", default_value_t = 20 << 30)]
    pub namespace_quota_bytes: u64,
    /// Seconds between NodeState reports (written only when something changed).
    #[arg(long, env = "EBB_REPORT_INTERVAL", default_value_t = 10)]
    pub report_interval_secs: u64,
    /// Secret (`namespace/name`) holding the node-local API token keys: data `current.id`,
    /// `current.key` and optionally `previous.id`, `previous.key`. Re-read every report interval.
    #[arg(
        long,
        env = "EBB_TOKEN_SECRET",
        default_value = "ebb-system/ebb-node-agent-tokens"
    )]
    pub token_secret: String,
    /// Largest resource the localizer accepts, in bytes (a role's `maxBytes` can only lower it).
    #[arg(long, env = "EBB_MAX_RESOURCE_BYTES", default_value_t = 10 * 1024 * 1024 * 1024)]
    pub max_resource_bytes: u64,
    /// Fetches running at the same time.
    #[arg(long, env = "EBB_FETCH_CONCURRENCY", default_value_t = 4)]
    pub fetch_concurrency: usize,
    /// Do not serve the node-local API at all (probes and metrics stay on --listen-addr).
    #[arg(long, env = "EBB_NO_SOCKET", default_value_t = false)]
    pub no_socket: bool,
    /// Log format. Traces are exported over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
    #[arg(long, env = "EBB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter in RUST_LOG syntax (for example `info,ebb_node_agent=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
}

#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// Directory of the LMDB state store.
    #[arg(long, env = "EBB_STATE_DIR")]
    pub state_dir: PathBuf,
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
    fn allow_lists_are_comma_separated_and_checked() {
        let cli = Cli::try_parse_from([
            "ebb-node-agent",
            "run",
            "--node-name",
            "n1",
            "--fetch-allow-cidr",
            "10.20.0.0/16,10.1.2.3",
            "--file-root",
            "/srv/a,/srv/b",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(
            r.fetch_allow_cidrs
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>(),
            vec!["10.20.0.0/16", "10.1.2.3/32"]
        );
        assert_eq!(r.file_roots.len(), 2);
        let err = Cli::try_parse_from([
            "ebb-node-agent",
            "run",
            "--node-name",
            "n1",
            "--cluster-cidr",
            "10.0.0.0/40",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("address range"), "{err}");
    }

    #[test]
    fn run_requires_a_node_name() {
        // SAFETY-free: only checks that the flag is required when NODE_NAME is unset in the test env.
        if std::env::var_os("NODE_NAME").is_none() {
            let err = Cli::try_parse_from(["ebb-node-agent", "run"]).unwrap_err();
            assert!(err.to_string().contains("--node-name"), "{err}");
        }
        let cli = Cli::try_parse_from([
            "ebb-node-agent",
            "run",
            "--node-name",
            "n1",
            "--state-dir",
            "/tmp/x",
        ])
        .unwrap();
        match cli.command {
            Command::Run(r) => {
                assert_eq!(r.node_name, "n1");
                assert_eq!(r.state_dir.as_deref(), Some(std::path::Path::new("/tmp/x")));
                assert!(!r.reset_state);
                assert!(
                    r.file_roots.is_empty(),
                    "no file:// without an operator's root"
                );
            }
            other => panic!("parsed as {other:?}"),
        }
    }
}
