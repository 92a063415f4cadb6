//! `ebb-sim`: runs the in-memory Kubernetes API server and simulated cluster, writes a kubeconfig
//! for kubectl, Helm and the ebb binaries, and serves until interrupted.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ebb_sim::{Sim, SimConfig};

#[derive(Parser)]
#[command(
    name = "ebb-sim",
    about = "In-memory Kubernetes API server and simulated cluster for ebb"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API on 127.0.0.1 until Ctrl-C.
    Serve {
        /// Port to listen on (0 picks a free one; the kubeconfig names it).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Where to write a kubeconfig pointing at the server.
        #[arg(long)]
        kubeconfig_out: Option<PathBuf>,
        /// Users to put in the kubeconfig (one context and token each; the first is current).
        #[arg(long = "user", default_values_t = vec!["admin".to_string()])]
        users: Vec<String>,
        /// Manifests to create first: a YAML file (multi-document) or a directory of .yaml/.yml
        /// files, e.g. `crds/`. Repeatable.
        #[arg(long = "apply")]
        apply: Vec<PathBuf>,
        /// A scenario YAML file to preload (objects and generators).
        #[arg(long)]
        scenario: Option<PathBuf>,
        /// Sim time runs this many times faster than real time.
        #[arg(long, default_value_t = 1.0)]
        time_factor: f64,
        /// Serve the API only: no scheduler, kubelet or controllers.
        #[arg(long)]
        api_only: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            port,
            kubeconfig_out,
            users,
            apply,
            scenario,
            time_factor,
            api_only,
        } => {
            let cfg = SimConfig {
                port,
                time_factor,
                cluster: !api_only,
                ..SimConfig::default()
            };
            let sim = Sim::start(cfg).await?;
            for path in &apply {
                for file in manifest_files(path)? {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("cannot read manifests {}", file.display()))?;
                    let sc = ebb_sim::scenario::Scenario::from_manifests(&text)
                        .with_context(|| format!("invalid manifests {}", file.display()))?;
                    let n = sc.load(&sim.api).with_context(|| {
                        format!("cannot create the objects of {}", file.display())
                    })?;
                    tracing::info!(objects = n, file = %file.display(), "manifests applied");
                }
            }
            if let Some(path) = scenario {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read scenario {}", path.display()))?;
                let sc = ebb_sim::scenario::Scenario::from_yaml(&text)
                    .with_context(|| format!("invalid scenario {}", path.display()))?;
                let n = sc
                    .load(&sim.api)
                    .with_context(|| format!("cannot load scenario {}", path.display()))?;
                tracing::info!(objects = n, scenario = %path.display(), "scenario loaded");
            }
            let users: Vec<&str> = users.iter().map(String::as_str).collect();
            if let Some(p) = &kubeconfig_out {
                sim.write_kubeconfig(p, &users)?;
                tracing::info!(kubeconfig = %p.display(), "kubeconfig written");
            }
            println!("ebb-sim serving on {}", sim.url());
            tokio::signal::ctrl_c()
                .await
                .context("cannot wait for Ctrl-C")?;
            tracing::info!("stopping");
            Ok(())
        }
    }
}

/// The YAML files of `path`: itself, or the `.yaml`/`.yml` files in it, sorted.
fn manifest_files(path: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))? {
        let p = e
            .with_context(|| format!("cannot list {}", path.display()))?
            .path();
        if matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}
