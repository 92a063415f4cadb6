//! `ebb-controller`: entry point. Parses the command line and hands over to the subcommand.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use ebb_controller::cli::{self, Cli, Command};

/// mimalloc rather than the platform's malloc (see docs/performance-scale.md, "Memory").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crds(args) => cli::crds::run(args).map(|()| ExitCode::SUCCESS),
        Command::Run(args) => run(args),
        Command::Plan(args) => cli::plan::run(args).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprint!("{}", ebb_telemetry::report::error_report(&err));
            ExitCode::FAILURE
        }
    }
}

fn run(args: cli::RunArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let exit = runtime.block_on(cli::run::run(args))?;
    // Do not wait for stray blocking work (a planner re-check) to end.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    Ok(match exit {
        cli::run::Exit::Stopped => ExitCode::SUCCESS,
        cli::run::Exit::LostLeadership => ExitCode::from(3),
    })
}
