//! The demo binary end to end: a small cluster at a high time factor must remove nodes, leave
//! every pod Ready and violate no PodDisruptionBudget, as its printed summary says.

use std::process::Stdio;
use std::time::Duration;

use ebb_e2e::harness::workspace_binary;

/// The first number after `key` on the summary line starting with it.
fn figure(out: &str, key: &str) -> Option<(u64, Vec<u64>)> {
    let line = out.lines().map(str::trim).find(|l| l.starts_with(key))?;
    let numbers: Vec<u64> = line[key.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect();
    Some((*numbers.first()?, numbers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_demo_removes_nodes_without_pdb_violations() {
    let bin = workspace_binary("ebb-demo").unwrap();
    let child = tokio::process::Command::new(bin)
        .args(["--nodes", "12", "--time-factor", "60", "--timeout", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .expect("the demo hung")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed ({:?})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let (removed, removed_line) = figure(&stdout, "nodes removed:").expect("nodes removed line");
    assert!(removed >= 1, "no node removed:\n{stdout}");
    // "R of 12 (D Node objects deleted)": the pool size and, in DrainAndDelete, every removal
    // is a deleted Node.
    assert_eq!(removed_line, vec![removed, 12, removed], "{stdout}");
    let (violations, _) = figure(&stdout, "PDB violations:").expect("PDB violations line");
    assert_eq!(violations, 0, "{stdout}");
    let (ready, ready_line) = figure(&stdout, "pods ready:").expect("pods ready line");
    assert_eq!(
        ready_line.get(1),
        Some(&ready),
        "pods not all Ready:\n{stdout}"
    );
    // Some pods were not on empty nodes: the summary counts their evictions.
    assert!(
        figure(&stdout, "pods moved:").is_some(),
        "no pods moved line:\n{stdout}"
    );
    assert!(stdout.contains("Run it with --keep"), "{stdout}");
}

#[tokio::test]
async fn rejects_a_too_small_cluster_with_a_message() {
    let bin = workspace_binary("ebb-demo").unwrap();
    let out = tokio::process::Command::new(bin)
        .args(["--nodes", "2"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--nodes 2 is too few"), "{stderr}");
}
