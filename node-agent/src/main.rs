//! `ebb-node-agent`: entry point. Parses the command line and hands over to the subcommand.

use std::process::ExitCode;

use clap::Parser;
use ebb_node_agent::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let what = match cli.command {
        Command::Run(_) => "run",
        Command::Dump(_) => "dump",
    };
    eprintln!(
        "ebb-node-agent {what}: not available in this build yet; it arrives with the node agent state store."
    );
    ExitCode::from(2)
}
