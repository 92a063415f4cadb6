//! The hidden `crash-writer` subcommand, a testing aid: submitters push container transitions
//! through the group writer and print each acknowledged one, so a test can SIGKILL the process.

use std::io::Write as _;
use std::sync::{Arc, Mutex};

use crate::cli::CrashWriterArgs;
use crate::store::{
    Completion, ContainerId, ContainerRequest, GroupWriter, LmdbStore, Op, OpenOptions, StoreError,
};

/// The transition number `step` (0 requested, 1 launched, 2 completed) of container `c`.
pub fn transition(c: u64, step: u64) -> Op {
    let id = ContainerId::new(format!("uid-{c:06}"), "main");
    match step {
        0 => Op::ContainerRequested(
            id,
            ContainerRequest {
                namespace: "crash".into(),
                pod_name: format!("pod-{c}"),
                image: "img".into(),
                placement_history: None,
                role: None,
                requested_at: c as i64,
            },
        ),
        1 => Op::ContainerLaunched(id, c as i64),
        _ => Op::ContainerCompleted(
            id,
            Completion {
                exit_code: (c % 256) as i32,
                reason: "Completed".into(),
                message: String::new(),
                finished_at: c as i64,
            },
        ),
    }
}

pub fn run(args: &CrashWriterArgs) -> Result<(), StoreError> {
    let store = Arc::new(LmdbStore::open(&args.state_dir, &OpenOptions::default())?);
    let writer = Arc::new(GroupWriter::spawn(store, 256));
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let containers = args.transitions.div_ceil(3);
    let submitters = args.submitters.max(1);
    let total = args.transitions;
    let handles: Vec<_> = (0..submitters)
        .map(|t| {
            let writer = writer.clone();
            let out = out.clone();
            std::thread::spawn(move || -> Result<(), StoreError> {
                for c in (t..containers).step_by(submitters as usize) {
                    for step in 0..3 {
                        if c * 3 + step >= total {
                            return Ok(());
                        }
                        writer.commit_blocking(vec![transition(c, step)])?;
                        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                        let _ = writeln!(o, "ack {c} {step}");
                        let _ = o.flush();
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| StoreError::Write("a submitter thread panicked".into()))??;
    }
    Ok(())
}
