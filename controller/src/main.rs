//! `ebb-controller`: entry point. Parses the command line and hands over to the subcommand.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use ebb_controller::cli::{Cli, Command, CrdsArgs};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crds(args) => crds(args),
        Command::Run(args) => run(args),
        Command::Plan(args) => ebb_controller::plan::run(args).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: ebb_controller::cli::RunArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let exit = runtime.block_on(ebb_controller::run::run(args))?;
    // Do not wait for stray blocking work (a planner re-check) to end.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    Ok(match exit {
        ebb_controller::run::Exit::Stopped => ExitCode::SUCCESS,
        ebb_controller::run::Exit::LostLeadership => ExitCode::from(3),
    })
}

fn crds(args: CrdsArgs) -> anyhow::Result<ExitCode> {
    match args.out_dir {
        None => {
            let yaml = ebb_api::crdgen::yaml_stream().context("serializing the CRDs")?;
            std::io::stdout()
                .write_all(yaml.as_bytes())
                .context("writing to stdout")?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for crd in ebb_api::crdgen::crds() {
                let path = dir.join(ebb_api::crdgen::file_name(&crd));
                let yaml = ebb_api::crdgen::to_yaml(&crd).context("serializing a CRD")?;
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
