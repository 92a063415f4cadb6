//! `ebb-controller plan` end to end on the snapshot files in `tests/data/`. Expected node names
//! and reasons follow from the data (see the comments), not from earlier runs.

use std::process::{Command, Output};

use serde_json::Value;

fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ebb-controller"))
        .arg("plan")
        .args(args)
        .output()
        .unwrap()
}

fn plan_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json", "--now", "2026-11-22T06:00:00Z"]);
    let out = plan(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn reason<'a>(doc: &'a Value, node: &str) -> (&'a str, Option<&'a str>) {
    let u = doc["unremovable"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["node"] == node)
        .unwrap_or_else(|| panic!("{node} not in unremovable: {doc}"));
    (u["reason"].as_str().unwrap(), u["pod"].as_str())
}

fn names(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect()
}

#[test]
fn mixed_cluster_with_default_policy() {
    let doc = plan_json(&["--snapshot", &data("mixed.json")]);
    // small-4 runs only a DaemonSet pod: empty. small-1 (web + api, 0.85 cpu of 4) moves to the
    // big nodes, which have room. small-2 also holds an api pod and fits too (candidacy is
    // capacity), but the api PDB (minAvailable 2 of 3) allows a single disruption, which
    // small-1's drain takes: small-2 waits for the budget.
    let cands: Vec<&str> = doc["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["node"].as_str().unwrap())
        .collect();
    assert_eq!(cands, ["small-4", "small-1", "small-2"]);
    assert_eq!(doc["candidates"][0]["empty"], true);
    assert_eq!(doc["candidates"][0]["moves"], serde_json::json!([]));
    let moves = doc["candidates"][1]["moves"].as_array().unwrap();
    let mut moved: Vec<&str> = moves.iter().map(|m| m["pod"].as_str().unwrap()).collect();
    moved.sort();
    assert_eq!(moved, ["shop/api-5b7c-0", "shop/web-7d9f8-2"]);
    for m in moves {
        assert!(m["to"] == "big-1" || m["to"] == "big-2", "{m}");
    }
    assert_eq!(names(&doc["toDelete"]["empty"]), ["small-4"]);
    assert_eq!(names(&doc["toDelete"]["drain"]), ["small-1"]);
    assert_eq!(
        doc["candidates"][2]["throttled"],
        "WaitingForDisruptionBudget"
    );
    assert_eq!(doc["candidates"][2]["pdb"], "shop/api");
    assert!(
        doc["unremovable"]
            .as_array()
            .unwrap()
            .iter()
            .all(|u| u["node"] != "small-2"),
        "a budget does not make a node unremovable"
    );
    // pg-0 sits on a local PersistentVolume with node affinity to small-3.
    assert_eq!(reason(&doc, "small-3"), ("BlockedByPod", Some("db/pg-0")));
    // A bare pod with no controller on the gpu node.
    assert_eq!(
        reason(&doc, "gpu-1"),
        ("BlockedByPod", Some("default/debug-shell"))
    );
    assert_eq!(reason(&doc, "cordoned-1").0, "Unschedulable");
    // big-1 (10.1 of 16 cpu, batch pods of 3 cpu) receives small-1's pods; the look-ahead tries
    // it again as the next loop would, and it stays: the pods it would move (10.75 cpu with the
    // arrivals) exceed the room left on big-2 (6.55) and small-3 (3.4), gpu-1 being tainted and
    // small-2 going. big-2 holds a kube-system pod without a PDB.
    assert_eq!(reason(&doc, "big-1").0, "DestinationOfMovedPods");
    assert_eq!(
        reason(&doc, "big-2"),
        ("BlockedByPod", Some("kube-system/coredns-5d78c-x1"))
    );
    assert_eq!(
        doc["throttled"], true,
        "small-2 is throttled by the api budget"
    );
    assert_eq!(doc["simulation"]["timedOut"], false);
    assert_eq!(
        doc["simulation"]["nodesEvaluated"], 8,
        "small-1..4, gpu-1 and the big nodes reach simulation, and big-1 once more in the \
         look-ahead"
    );
}

#[test]
fn json_fields_come_in_the_documented_order() {
    let out = plan(&[
        "--snapshot",
        &data("mixed.json"),
        "-o",
        "json",
        "--now",
        "2026-11-22T06:00:00Z",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    let pos = |k: &str| {
        text.find(&format!("\"{k}\""))
            .unwrap_or_else(|| panic!("{k} missing"))
    };
    // Top-level keys (two spaces in): `throttled` is also a field of a candidate.
    let top = |k: &str| {
        text.find(&format!("\n  \"{k}\""))
            .unwrap_or_else(|| panic!("{k} missing"))
    };
    let order = [
        "candidates",
        "toDelete",
        "unremovable",
        "throttled",
        "simulation",
    ];
    assert!(order.windows(2).all(|w| top(w[0]) < top(w[1])), "{text}");
    let sim = ["durationMs", "nodesEvaluated", "timedOut"];
    assert!(sim.windows(2).all(|w| pos(w[0]) < pos(w[1])));
    assert!(!text.contains("\"pod\": null"), "absent pods are omitted");
}

#[test]
fn unknown_kinds_are_skipped_with_a_warning() {
    let out = plan(&["--snapshot", &data("mixed.json"), "-o", "json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success());
    assert!(
        err.contains("warning") && err.contains("Service (shop/web)"),
        "{err}"
    );
}

#[test]
fn yaml_snapshot_with_zone_anti_affinity() {
    let doc = plan_json(&["--snapshot", &data("zones.yaml")]);
    // The cache pods repel each other by zone. za-2 is too full for cache-0 (7.5 of 8 cpu), and
    // zone b already has cache-1: za-1 stays. cache-1 can move within zone b, to zb-2.
    assert_eq!(
        reason(&doc, "za-1"),
        ("NoPlaceToMovePods", Some("shop/cache-1a2b-0"))
    );
    let c = &doc["candidates"][0];
    assert_eq!(doc["candidates"].as_array().unwrap().len(), 1);
    assert_eq!(c["node"], "zb-1");
    assert_eq!(
        c["moves"],
        serde_json::json!([{"pod": "shop/cache-1a2b-1", "to": "zb-2"}])
    );
}

#[test]
fn policy_selects_limits_and_budget_window() {
    let p = data("policy-one-drain.yaml");
    // Sunday 06:00: the 09:00-17:00 weekday window with nodes "0" is closed. gpu-1 is outside
    // the selector. One drain at a time, empty nodes besides.
    let doc = plan_json(&["--snapshot", &data("mixed.json"), "--policy", &p]);
    assert!(
        doc["unremovable"]
            .as_array()
            .unwrap()
            .iter()
            .all(|u| u["node"] != "gpu-1")
    );
    assert_eq!(names(&doc["toDelete"]["empty"]), ["small-4"]);
    assert_eq!(names(&doc["toDelete"]["drain"]), ["small-1"]);
    // Monday 10:00 UTC: inside the window, nothing starts and the plan says so.
    let out = plan(&[
        "--snapshot",
        &data("mixed.json"),
        "--policy",
        &p,
        "-o",
        "json",
        "--now",
        "2026-11-23T10:00:00Z",
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["throttled"], true);
    assert!(doc["toDelete"]["empty"].as_array().unwrap().is_empty());
    assert!(doc["toDelete"]["drain"].as_array().unwrap().is_empty());
    assert_eq!(
        doc["candidates"].as_array().unwrap().len(),
        3,
        "still candidates"
    );
}

#[test]
fn table_output_names_nodes_and_reasons() {
    let out = plan(&[
        "--snapshot",
        &data("mixed.json"),
        "--now",
        "2026-11-22T06:00:00Z",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |node: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{node} ")))
            .unwrap_or_else(|| panic!("{node}: {text}"))
            .to_string()
    };
    assert!(line("small-4").contains("delete"));
    assert!(line("small-1").contains("drain"));
    assert!(
        line("small-3").contains("PinnedToNode"),
        "{}",
        line("small-3")
    );
    assert!(
        line("small-2").contains("throttled: WaitingForDisruptionBudget (shop/api)"),
        "{}",
        line("small-2")
    );
    assert!(line("gpu-1").contains("NotReplicated"));
}

#[test]
fn bad_input_is_named() {
    let cases = [
        (
            "bad-quantity.json",
            None,
            vec!["shop/web-7d9f8-2", "memory", "1.5 gigs"],
        ),
        (
            "missing-node.json",
            None,
            vec!["small-2", "not in the snapshot"],
        ),
        (
            "mixed.json",
            Some("policy-invalid.yaml"),
            vec!["policy-invalid.yaml", "spec.unneededTime", "ten minutes"],
        ),
    ];
    for (snap, policy, needles) in cases {
        let mut args = vec!["--snapshot".to_string(), data(snap)];
        if let Some(p) = policy {
            args.extend(["--policy".to_string(), data(p)]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = plan(&args);
        assert!(!out.status.success(), "{snap}");
        let err = String::from_utf8_lossy(&out.stderr);
        for n in needles {
            assert!(err.contains(n), "{snap}: `{n}` not in {err}");
        }
    }
    let out = plan(&["--snapshot", "/nonexistent/snap.json"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/snap.json"));
    let out = plan(&["--snapshot", &data("mixed.json"), "--now", "yesterday"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--now"));
}

/// `-o json` carries everything the table shows: each kept node's blocking pod and its reason,
/// and each candidate's throttle or wait reason.
#[test]
fn json_carries_what_the_table_shows() {
    let args = [
        "--snapshot",
        &data("mixed.json"),
        "--now",
        "2026-11-22T06:00:00Z",
    ];
    let text = String::from_utf8(plan(&args).stdout).unwrap();
    let doc = plan_json(&["--snapshot", &data("mixed.json")]);
    let gpu = doc["unremovable"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["node"] == "gpu-1")
        .unwrap_or_else(|| panic!("gpu-1 not in unremovable: {doc}"));
    assert_eq!(gpu["podReason"], "NotReplicated", "{gpu}");
    for u in doc["unremovable"].as_array().unwrap() {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("{} ", u["node"].as_str().unwrap())))
            .unwrap_or_else(|| panic!("{u} has no table row: {text}"));
        for field in ["reason", "pod", "podReason"] {
            if let Some(v) = u[field].as_str() {
                assert!(row.contains(v), "table row {row:?} shows {field} {v}");
            }
        }
    }
    for c in doc["candidates"].as_array().unwrap() {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("{} ", c["node"].as_str().unwrap())))
            .unwrap_or_else(|| panic!("{c} has no table row: {text}"));
        for field in ["throttled", "waiting"] {
            if let Some(v) = c[field].as_str() {
                assert!(row.contains(v), "table row {row:?} shows {field} {v}");
            }
        }
        let detail_shown =
            row.contains("throttled:") || row.contains("Unneeded") || row.contains("Unready");
        let in_json = c.get("throttled").is_some() || c.get("waiting").is_some();
        assert_eq!(detail_shown, in_json, "table row {row:?} vs JSON {c}");
    }
}

#[test]
fn machines_form_node_groups_and_pick_their_removal() {
    // Auto: the three Cluster API nodes form MachineDeployment infra/md-0 (min-size 2), so one
    // of them goes; the NodePool and the plain node have no minimum.
    let doc = plan_json(&[
        "--snapshot",
        &data("machines.json"),
        "--policy",
        &data("policy-remove.yaml"),
    ]);
    let candidates: Vec<&str> = doc["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["node"].as_str().unwrap())
        .collect();
    let capi: Vec<&&str> = candidates
        .iter()
        .filter(|n| n.starts_with("capi-"))
        .collect();
    assert_eq!(capi.len(), 1, "{candidates:?}");
    for n in ["karp-0", "karp-1", "plain-0"] {
        assert!(candidates.contains(&n), "{n} in {candidates:?}");
    }
    let held: Vec<&str> = ["capi-0", "capi-1", "capi-2"]
        .into_iter()
        .filter(|n| !capi.contains(&n))
        .collect();
    for n in held {
        assert_eq!(reason(&doc, n).0, "NodeGroupMinSizeReached");
    }
    // Without the Cluster API and Karpenter objects ebb cannot tell the machines' groups or
    // NodeClaims: those nodes wait, the plain node does not.
    let doc = plan_json(&[
        "--snapshot",
        &data("machines-nodes-only.json"),
        "--policy",
        &data("policy-remove.yaml"),
    ]);
    for n in ["capi-0", "capi-1", "capi-2", "karp-0", "karp-1"] {
        assert_eq!(reason(&doc, n).0, "RemovalMethodNotEnabled", "{n}");
    }
    assert_eq!(doc["candidates"][0]["node"], "plain-0");
}
