//! Crash safety with real processes: a child commits container transitions and prints each
//! acknowledged one; it is SIGKILLed at a random moment; every acknowledged one must be in `dump`.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::SystemTime;

const BIN: &str = env!("CARGO_BIN_EXE_ebb-node-agent");

/// A number in [0, bound), different on every call (no fixed schedule to tune to).
fn random_below(bound: u64, salt: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x % bound
}

fn dump(dir: &Path) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["dump", "--state-dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs one child and SIGKILLs it once it has acknowledged a random number of transitions
/// (between 1 and 3,000 of its 10,000, so the kill always lands mid-run whatever the disk speed).
/// Returns every acknowledged (container, step) pair, including those printed just before the kill.
fn run_and_kill(dir: &Path, round: u64) -> (BTreeSet<(u64, u64)>, bool) {
    let target = random_below(3_000, round) + 1;
    let mut child = Command::new(BIN)
        .args([
            "crash-writer",
            "--transitions",
            "10000",
            "--submitters",
            "16",
            "--state-dir",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut acked = BTreeSet::new();
    let mut killed = false;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let mut parts = line.split_whitespace();
        if parts.next() != Some("ack") {
            continue;
        }
        let c = parts.next().and_then(|s| s.parse().ok());
        let s = parts.next().and_then(|s| s.parse().ok());
        if let (Some(c), Some(s)) = (c, s) {
            acked.insert((c, s));
        }
        if !killed && acked.len() as u64 >= target {
            child.kill().unwrap(); // SIGKILL on Unix; lines already printed are still read
            killed = true;
        }
    }
    child.wait().unwrap();
    (acked, killed)
}

#[test]
fn every_acknowledged_transition_survives_sigkill() {
    let mut killed_mid_run = 0;
    let start = std::time::Instant::now();
    for round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let (acked, killed) = run_and_kill(dir.path(), round);
        killed_mid_run += killed as u32;
        let state = dump(dir.path());
        assert_eq!(state["schemaVersion"], "1.0");
        let containers = state["containers"].as_array().unwrap();
        let by_uid: std::collections::HashMap<&str, &serde_json::Value> = containers
            .iter()
            .map(|c| (c["podUid"].as_str().unwrap(), c))
            .collect();
        for &(c, step) in &acked {
            let uid = format!("uid-{c:06}");
            let rec = by_uid
                .get(uid.as_str())
                .unwrap_or_else(|| panic!("round {round}: acknowledged container {uid} missing"));
            match step {
                0 => assert_eq!(rec["requested"]["pod_name"], format!("pod-{c}")),
                1 => assert_eq!(rec["launchedAt"], c),
                _ => assert_eq!(rec["completed"]["exit_code"], c % 256),
            }
        }
        // the store reopens cleanly for writing too (the agent's own start path)
        let store = ebb_node_agent::store::LmdbStore::open(
            dir.path(),
            &ebb_node_agent::store::OpenOptions::default(),
        )
        .unwrap();
        assert!(matches!(
            store.opened(),
            ebb_node_agent::store::Opened::Existing { .. }
        ));
        eprintln!(
            "round {round}: {} transitions acknowledged before the kill, {} containers in the store",
            acked.len(),
            containers.len()
        );
    }
    assert_eq!(killed_mid_run, 4, "every child must be killed mid-run");
    eprintln!("4 crash rounds in {:?}", start.elapsed());
}
