//! Crash safety with real processes: a child commits container transitions and prints each
//! acknowledged one; it is SIGKILLed at a random moment; every acknowledged one must be in `dump`.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

const BIN: &str = env!("CARGO_BIN_EXE_ebb-node-agent");

/// A delay in [min, max) milliseconds, different on every call (no fixed schedule to tune to).
fn random_ms(min: u64, max: u64, salt: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    min + x % (max - min)
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

/// Runs one child to a random kill and returns the acknowledged (container, step) pairs and
/// whether the child was still running when killed.
fn run_and_kill(dir: &Path, round: u64) -> (BTreeSet<(u64, u64)>, bool) {
    let mut child = Command::new(BIN)
        .args(["crash-writer", "--transitions", "10000", "--state-dir"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut acked = BTreeSet::new();
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
        }
        acked
    });
    let delay = Duration::from_millis(random_ms(50, 600, round));
    let start = Instant::now();
    let mut still_running = true;
    while start.elapsed() < delay {
        if child.try_wait().unwrap().is_some() {
            still_running = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if still_running {
        child.kill().unwrap(); // SIGKILL on Unix
    }
    child.wait().unwrap();
    (reader.join().unwrap(), still_running)
}

#[test]
fn every_acknowledged_transition_survives_sigkill() {
    let mut killed_mid_run = 0;
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
    assert!(
        killed_mid_run > 0,
        "every child finished before its kill; the test exercised no crash"
    );
}
