//! `ebb-node-agent`: entry point. Parses the command line and hands over to the subcommand.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use ebb_node_agent::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(*args),
        Command::Dump(args) => dump(&args.state_dir),
        Command::CrashWriter(args) => {
            ebb_node_agent::crash_writer::run(&args).context("crash-writer")
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", ebb_telemetry::report::error_report(&e));
            ExitCode::FAILURE
        }
    }
}

fn run(args: ebb_node_agent::cli::RunArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        // Inside the runtime: the OTLP exporter needs it. Logs go to stderr.
        let _telemetry = ebb_telemetry::init("ebb-node-agent", args.log_format, &args.log_filter)?;
        ebb_node_agent::agent::run(args).await
    })
}

fn dump(dir: &std::path::Path) -> anyhow::Result<()> {
    let value = ebb_node_agent::dump::dump_dir(dir)
        .with_context(|| format!("dump of state store {}", dir.display()))?;
    let text = serde_json::to_string_pretty(&value).context("rendering the store as JSON")?;
    println!("{text}");
    Ok(())
}
