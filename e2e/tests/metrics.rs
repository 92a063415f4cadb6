//! `/metrics` of the controller and node agent: every metric with its type (a rename is a visible
//! change here), and Prometheus's `promtool check metrics` on what the running binaries serve.
//!
//! Debian's `prometheus` package provides promtool; the test command (`make test`) installs it.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ebb_e2e::harness::{Backend, wait_for};
use ebb_e2e::setup::{Cluster, NodeGroup, metrics_address};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every metric of the controller, with its type.
const CONTROLLER: &[(&str, &str)] = &[
    ("ebb_cost_kept_per_hour", "gauge"),
    ("ebb_cost_removed_per_hour", "gauge"),
    ("ebb_drain_duration_seconds", "histogram"),
    ("ebb_drains_in_progress", "gauge"),
    ("ebb_evictions", "counter"),
    ("ebb_evictions_in_flight", "gauge"),
    ("ebb_function_duration_seconds", "histogram"),
    ("ebb_loop_phase_duration_seconds", "histogram"),
    ("ebb_nodes_scaled_down", "counter"),
    ("ebb_placement_escalations", "counter"),
    ("ebb_placement_gate_wait_seconds", "histogram"),
    ("ebb_placement_hits", "counter"),
    ("ebb_placement_pod_ends", "counter"),
    ("ebb_placements", "counter"),
    ("ebb_policy_degraded", "gauge"),
    ("ebb_reconcile_errors", "counter"),
    ("ebb_removals", "counter"),
    ("ebb_replacement_start_timeouts", "counter"),
    ("ebb_replacement_waits_kept", "counter"),
    ("ebb_replacements", "counter"),
    ("ebb_replacements_starting", "gauge"),
    ("ebb_starting_replacements_limit", "gauge"),
    ("ebb_steering_admissions", "counter"),
    ("ebb_throttled_nodes", "gauge"),
    ("ebb_unneeded_nodes", "gauge"),
    ("ebb_unremovable_nodes", "gauge"),
];

/// Every metric of the node agent, with its type.
const NODE_AGENT: &[(&str, &str)] = &[
    ("ebb_node_agent_cached_resources", "gauge"),
    ("ebb_node_agent_containers_tracked", "gauge"),
    ("ebb_node_agent_failed_resources", "gauge"),
    ("ebb_node_agent_pending_deletions", "gauge"),
    ("ebb_node_agent_recovery_seconds", "gauge"),
    ("ebb_node_agent_recovery_lost_containers", "gauge"),
    ("ebb_node_agent_store_commits", "gauge"),
    ("ebb_node_agent_store_healthy", "gauge"),
    ("ebb_node_agent_store_transitions", "gauge"),
];

/// `name -> type` from the `# TYPE` lines.
fn types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("# TYPE ")?.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect()
}

fn expected(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

/// `promtool check metrics` on `text`: its complaints, empty when it has none.
async fn promtool(text: &str) -> String {
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "promtool is needed (Debian: apt-get install prometheus; `make test` installs it): {e}"
            )
        });
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        String::new()
    } else {
        format!("({}) {said}", out.status)
    }
}

/// GET `path` on `addr` with an `Accept` header; the body.
async fn get(addr: &str, path: &str, accept: &str) -> (String, String) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!("GET {path} HTTP/1.0\r\nHost: x\r\nAccept: {accept}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).await.unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (ctype, body.to_string())
}

/// The address a process logged with "serving /metrics".
async fn served_at(who: &str, log: &Arc<Mutex<Vec<String>>>) -> String {
    let found = wait_for("the metrics address", Duration::from_secs(30), || async {
        metrics_address(&log.lock().unwrap())
    })
    .await;
    found.unwrap_or_else(|e| panic!("{who}: {e}; its log:\n{}", log.lock().unwrap().join("\n")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_binaries_serve_every_metric_with_its_type_and_pass_promtool() {
    let c = Cluster::start(Backend::Sim, 1.0).await.unwrap();
    let env = &c.env;
    c.add_nodes(&NodeGroup::plain("metrics-", 1, "2", "8Gi"))
        .await
        .unwrap();
    let mut ctl = env
        .spawn_binary_as(
            "ebb-controller",
            "ebb-controller",
            &[
                "run",
                "--metrics-addr",
                "127.0.0.1:0",
                "--leader-election",
                "false",
                "--namespace",
                "ebb-system",
                "--log-filter",
                "info",
            ],
        )
        .unwrap();
    let ctl_log = ctl.capture_output();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cache = dir.path().join("cache");
    let mut agent = env
        .spawn_binary_as(
            "ebb-node-agent",
            "ebb-node-agent",
            &[
                "run",
                "--node-name",
                "metrics-0",
                "--state-dir",
                state.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
                "--no-socket",
                "--listen-addr",
                "127.0.0.1:0",
            ],
        )
        .unwrap();
    let agent_log = agent.capture_output();

    for (who, log, want) in [
        ("ebb-controller", &ctl_log, CONTROLLER),
        ("ebb-node-agent", &agent_log, NODE_AGENT),
    ] {
        let addr = served_at(who, log).await;
        // What Prometheus asks for: OpenMetrics (with exemplars).
        let (ctype, om) = get(
            &addr,
            "/metrics",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .await;
        assert!(
            ctype.starts_with("application/openmetrics-text"),
            "{who}: {ctype}"
        );
        assert!(om.ends_with("# EOF\n"), "{who}: {om}");
        // A family shows once it has a sample: the agent's gauges always, the controller's
        // after the activity they count (all of them: `every_controller_metric_...` below).
        let seen = types(&om);
        if who == "ebb-node-agent" {
            assert_eq!(seen, expected(want), "{who}'s metrics and types:\n{om}");
        } else {
            for (name, ty) in &seen {
                assert_eq!(
                    expected(want).get(name),
                    Some(ty),
                    "{who}: {name} {ty} is not listed:\n{om}"
                );
            }
        }
        for name in seen.keys() {
            assert_help(who, &om, name);
        }
        // The classic text format for anything else; promtool reads that one.
        let (ctype, text) = get(&addr, "/metrics", "text/plain").await;
        assert!(ctype.starts_with("text/plain"), "{who}: {ctype}");
        assert_eq!(types(&text).len(), seen.len(), "{who}: {text}");
        let complaints = promtool(&text).await;
        assert!(
            complaints.is_empty(),
            "{who}: promtool check metrics: {complaints}\n{text}"
        );
    }
    ctl.kill().await.unwrap();
    agent.kill().await.unwrap();
}

fn assert_help(who: &str, text: &str, name: &str) {
    let help = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("# HELP {name} ")))
        .unwrap_or_default();
    assert!(
        help.len() >= 15 && !help.ends_with(".."),
        "{who}: {name} has a help text (one sentence): {help:?}"
    );
}

/// Every controller metric, each family given one sample as the controller would: the list with
/// types, help texts, the exemplar, and promtool on the classic rendering.
#[tokio::test]
async fn every_controller_metric_is_listed_with_its_type_and_passes_promtool() {
    use ebb_controller::metrics::*;
    use ebb_controller::telemetry::exposition::to_prometheus_text;
    let m = Metrics::new();
    let policy = || PolicyLabels { policy: "p".into() };
    let reason = || PolicyReasonLabels {
        policy: "p".into(),
        reason: "NotUnderutilized".into(),
    };
    let ph = || PlacementHistoryLabels {
        namespace: "default".into(),
        placement_history: "db".into(),
    };
    m.unneeded_nodes.get_or_create(&policy()).set(1);
    m.unremovable_nodes.get_or_create(&reason()).set(1);
    m.nodes_scaled_down
        .get_or_create(&ScaleDownLabels {
            policy: "p".into(),
            reason: ScaleDownKind::empty,
        })
        .inc();
    m.evictions
        .get_or_create(&EvictionLabels {
            policy: "p".into(),
            result: EvictionResult::evicted,
        })
        .inc();
    m.drains_in_progress.get_or_create(&policy()).set(1);
    m.cost_removed_per_hour.get_or_create(&policy()).set(32.77);
    m.cost_kept_per_hour.get_or_create(&policy()).set(4.5);
    m.throttled.get_or_create(&reason()).set(1);
    m.degraded
        .get_or_create(&PolicyReasonLabels {
            policy: "p".into(),
            reason: "SelectorMatchesNothing".into(),
        })
        .set(1);
    m.observe(Function::plan, Duration::from_millis(3));
    m.drain_duration
        .get_or_create(&DrainLabels {
            policy: "p".into(),
            outcome: DrainResult::removed,
        })
        .observe(
            12.0,
            Some(TraceExemplar {
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            }),
            None,
        );
    m.placements
        .get_or_create(&PlacementLabels {
            namespace: "default".into(),
            placement_history: "db".into(),
            outcome: Release::pinned,
        })
        .inc();
    m.placement_escalations.get_or_create(&ph()).inc();
    m.placement_hits.get_or_create(&ph()).inc();
    m.placement_pod_ends
        .get_or_create(&PodEndLabels {
            namespace: "default".into(),
            placement_history: "db".into(),
            class: "NodeLost".into(),
        })
        .inc();
    m.gate_wait.get_or_create(&ph()).observe(0.2);
    m.observe_phase("p", LoopPhase::apply_events, Duration::from_millis(2));
    m.removals
        .get_or_create(&RemovalLabels {
            policy: "p".into(),
            method: "ClusterAPI".into(),
            outcome: RemovalOutcome::handed_off,
        })
        .inc();
    m.steering_admitted(SteeringAdmission::patched);
    m.reconcile_failed(Reconciler::scaledown, "Status");
    m.replacement("p", ReplacementOutcome::on_plan, "");
    let om = m.encode();
    assert_eq!(types(&om), expected(CONTROLLER), "{om}");
    for (name, _) in CONTROLLER {
        assert_help("ebb-controller", &om, name);
    }
    assert!(
        om.contains("# {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 12"),
        "the exemplar is in the OpenMetrics output:\n{om}"
    );
    let text = to_prometheus_text(&om);
    let complaints = promtool(&text).await;
    assert!(
        complaints.is_empty(),
        "promtool check metrics: {complaints}\n{text}"
    );
}

/// promtool is a real judge: a counter without `_total` fails it.
#[tokio::test]
async fn promtool_flags_a_badly_named_metric() {
    let bad =
        "# HELP ebb_evictions Eviction API calls\n# TYPE ebb_evictions counter\nebb_evictions 3\n";
    assert!(!promtool(bad).await.is_empty(), "promtool accepted {bad:?}");
}
