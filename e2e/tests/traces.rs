//! ebb's traces as a platform team receives them: the controller and node agents export to a
//! real OpenTelemetry Collector, and the tests read what its file exporter wrote.
//!
//! The collector is built by `e2e/k8s/build.sh otelcol` (OTLP receiver, file exporter).
//! One collector serves the whole test binary (the endpoint is process-wide environment of the
//! spawned binaries); every test tells its spans apart by names of its own (policy, workload,
//! node). Without Go or the module proxy the collector cannot be built and the tests fail with
//! that reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ebb_api::names::TAINT_TO_BE_DELETED;
use ebb_e2e::faults::stop_node;
use ebb_e2e::harness::{Backend, ChildProcess, TestEnv, set_child_env, wait_for, workspace_binary};
use ebb_e2e::setup::{
    Apps, Cluster, Controller, NodeGroup, create_policy, fast_policy_spec, fetch_metrics,
    has_taint, merged, metrics_address, node_of, spawn_node_agent, wait_running,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

// ---- the collector -----------------------------------------------------------------------

/// A running collector: its OTLP/gRPC endpoint and the file its exporter writes.
struct Collector {
    endpoint: String,
    output: PathBuf,
    log: PathBuf,
    /// The wrapper shell's stdin: when this process exits the pipe closes and the wrapper
    /// stops the collector, so no collector outlives the tests.
    _child: Mutex<Child>,
    _dir: tempfile::TempDir,
}

static COLLECTOR: OnceLock<Result<Collector, String>> = OnceLock::new();

fn k8s_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s").join(name)
}

/// Builds the collector when it is not cached (a few minutes cold, under a second warm).
fn build_collector() -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(k8s_script("build.sh"))
        .arg("otelcol")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run e2e/k8s/build.sh: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(30).collect();
        return Err(format!(
            "the OpenTelemetry Collector could not be built (`bash e2e/k8s/build.sh otelcol` needs Go 1.26+ and the Go module proxy):\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    let bin_dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bin = Path::new(&bin_dir).join("otelcol-ebb");
    if !bin.is_file() {
        return Err(format!("build.sh otelcol made no {}", bin.display()));
    }
    Ok(bin)
}

fn start_collector() -> Result<Collector, String> {
    let bin = build_collector()?;
    let dir = tempfile::Builder::new()
        .prefix("ebb-otelcol-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let output = dir.path().join("traces.jsonl");
    let log = dir.path().join("otelcol.log");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{port}\n\
             exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n\
             \x20 pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
            output.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#""$0" --config "$1" </dev/null >"$2" 2>&1 & pid=$!; read _; kill $pid"#)
        .arg(&bin)
        .arg(&config)
        .arg(&log)
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let addr = format!("127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + ebb_e2e::harness::scaled(Duration::from_secs(30));
    while std::net::TcpStream::connect(&addr).is_err() {
        if std::time::Instant::now() > deadline {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("the collector did not listen on {addr}:\n{text}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Collector {
        endpoint: format!("http://{addr}"),
        output,
        log,
        _child: Mutex::new(child),
        _dir: dir,
    })
}

/// The shared collector, started on first use; every ebb binary spawned afterwards exports to
/// it. Panics (failing the test) with the reason when it cannot be built or started.
fn collector() -> &'static Collector {
    let c = COLLECTOR.get_or_init(|| tokio::task::block_in_place(start_collector));
    match c {
        Ok(c) => {
            set_child_env("OTEL_EXPORTER_OTLP_ENDPOINT", &c.endpoint);
            // Export every 200 ms instead of 5 s: the tests wait less.
            set_child_env("OTEL_BSP_SCHEDULE_DELAY", "200");
            c
        }
        Err(e) => panic!("{e}"),
    }
}

// ---- reading what the collector wrote ----------------------------------------------------

/// One span as the collector exported it (OTLP JSON).
#[derive(Clone, Debug)]
struct Span {
    service: String,
    trace: String,
    id: String,
    parent: String,
    name: String,
    attrs: BTreeMap<String, Value>,
    events: Vec<(String, BTreeMap<String, Value>)>,
}

impl Span {
    fn str(&self, key: &str) -> Option<&str> {
        self.attrs.get(key)?.as_str()
    }
    fn int(&self, key: &str) -> Option<i64> {
        match self.attrs.get(key)? {
            Value::String(s) => s.parse().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
    }
}

/// An OTLP `AnyValue` as plain JSON (ints arrive as strings, as OTLP JSON writes int64).
fn any_value(v: &Value) -> Value {
    for k in ["stringValue", "intValue", "boolValue", "doubleValue"] {
        if let Some(x) = v.get(k) {
            return x.clone();
        }
    }
    v.clone()
}

fn attributes(list: &Value) -> BTreeMap<String, Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| Some((a["key"].as_str()?.to_string(), any_value(&a["value"]))))
        .collect()
}

impl Collector {
    /// The raw text the file exporter wrote so far.
    fn text(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    fn spans(&self) -> Vec<Span> {
        let mut out = Vec::new();
        for line in self.text().lines() {
            let Ok(doc) = serde_json::from_str::<Value>(line) else {
                continue; // a line being written
            };
            for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
                let resource = attributes(&rs["resource"]["attributes"]);
                let service = resource
                    .get("service.name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for s in ss["spans"].as_array().into_iter().flatten() {
                        out.push(Span {
                            service: service.clone(),
                            trace: s["traceId"].as_str().unwrap_or_default().to_string(),
                            id: s["spanId"].as_str().unwrap_or_default().to_string(),
                            parent: s["parentSpanId"].as_str().unwrap_or_default().to_string(),
                            name: s["name"].as_str().unwrap_or_default().to_string(),
                            attrs: attributes(&s["attributes"]),
                            events: s["events"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|e| {
                                    (
                                        e["name"].as_str().unwrap_or_default().to_string(),
                                        attributes(&e["attributes"]),
                                    )
                                })
                                .collect(),
                        });
                    }
                }
            }
        }
        out
    }

    /// Waits until `pick` finds what it looks for in the collected spans.
    async fn wait_spans<T>(
        &self,
        what: &str,
        timeout: Duration,
        pick: impl Fn(&[Span]) -> Option<T>,
    ) -> T {
        let r = wait_for(what, timeout, || {
            let spans = self.spans();
            let found = pick(&spans);
            async move { found }
        })
        .await;
        match r {
            Ok(v) => v,
            Err(e) => {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let names: BTreeMap<String, usize> =
                    self.spans().iter().fold(BTreeMap::new(), |mut m, s| {
                        *m.entry(format!("{}:{}", s.service, s.name)).or_default() += 1;
                        m
                    });
                let decisions: Vec<String> = self
                    .spans()
                    .iter()
                    .filter(|s| s.name == "placement")
                    .map(|s| format!("{:?} {:?}", s.attrs, s.events))
                    .collect();
                panic!(
                    "{e}; spans collected: {names:?}\nplacement spans:\n{}\ncollector log:\n{log}",
                    decisions.join("\n")
                )
            }
        }
    }
}

/// The span tree of one trace as indented lines (`name attr=value ...`, events marked `·`), for
/// failure messages and docs/operations.md.
fn tree(spans: &[Span], trace: &str) -> String {
    fn line(s: &Span, depth: usize, out: &mut String) {
        let attrs: Vec<String> = s
            .attrs
            .iter()
            .filter(|(k, _)| {
                !k.starts_with("code.")
                    && !k.starts_with("thread.")
                    && !["busy_ns", "idle_ns", "target", "level"].contains(&k.as_str())
            })
            .map(|(k, v)| format!("{k}={}", v.as_str().map_or(v.to_string(), str::to_string)))
            .collect();
        out.push_str(&format!(
            "{}{} {}\n",
            "  ".repeat(depth),
            s.name,
            attrs.join(" ")
        ));
        for (name, a) in &s.events {
            let attrs: Vec<String> = a
                .iter()
                .filter(|(k, _)| ["pod", "pdb"].contains(&k.as_str()))
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            out.push_str(&format!(
                "{}· {name} {}\n",
                "  ".repeat(depth + 1),
                attrs.join(" ")
            ));
        }
    }
    fn walk(of: &[&Span], parent: &str, depth: usize, out: &mut String) {
        for s in of.iter().filter(|s| s.parent == parent) {
            line(s, depth, out);
            walk(of, &s.id, depth + 1, out);
        }
    }
    let of: Vec<&Span> = spans.iter().filter(|s| s.trace == trace).collect();
    let ids: BTreeSet<&str> = of.iter().map(|s| s.id.as_str()).collect();
    let mut out = String::new();
    // Roots: no parent, or a parent not collected.
    for root in of.iter().filter(|s| !ids.contains(s.parent.as_str())) {
        line(root, 0, &mut out);
        walk(&of, &root.id, 1, &mut out);
    }
    out
}

/// Nothing secret in the collected output: none of `secrets` (raw, base64 or hex) appears.
fn assert_no_secret(text: &str, secrets: &[(String, Vec<u8>)]) {
    assert!(!text.is_empty(), "the collector wrote nothing");
    for (what, bytes) in secrets {
        assert!(bytes.len() >= 16, "{what} is too short to search for");
        // k8s-openapi writes a ByteString as standard base64.
        let b64 = serde_json::to_value(ByteString(bytes.clone()))
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut forms = vec![b64, hex];
        if let Ok(s) = std::str::from_utf8(bytes) {
            forms.push(s.to_string());
        }
        for f in forms {
            assert!(
                !text.contains(&f),
                "the collected telemetry contains {what} ({} chars)",
                f.len()
            );
        }
    }
}

// ---- scale-down ---------------------------------------------------------------------------

async fn apply_policy(client: &kube::Client, name: &str, pool: &str) {
    let spec = merged(
        fast_policy_spec(pool),
        &json!({"utilizationThreshold": 0.8}),
    );
    create_policy(client, name, spec).await.unwrap();
}

/// The controller's `/metrics` text (address from its log line), as Prometheus asks for it:
/// OpenMetrics, which carries the exemplars.
async fn scrape(ctl: &Controller) -> String {
    let addr = wait_for("the metrics address", Duration::from_secs(10), || async {
        metrics_address(&ctl.lines())
    })
    .await
    .unwrap();
    fetch_metrics(&addr, Some("application/openmetrics-text;version=1.0.0"))
        .await
        .unwrap()
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Sim => "sim",
        Backend::Real => "real",
    }
}

ebb_e2e::on_both_backends! {

/// Three nodes drained: each drain is a `drain` span (policy, node, pod count, outcome,
/// duration) in the trace of the policy loop that started it, next to that loop's `simulate`
/// span; each eviction is an `evict` child whose events name the pod and the PDB's answer;
/// the drains' trace ids are the exemplars of `ebb_drain_duration_seconds`.
async fn a_scale_down_is_a_trace_per_loop_with_a_span_per_drain(backend) {
    let col = collector();
    let c = Cluster::start(backend, 20.0).await.unwrap();
    let env = &c.env;
    let b = backend_name(backend);
    let pool = format!("traces-{b}");
    let policy = format!("traces-{b}");
    let prefix = format!("tr{b}-");
    c.add_nodes(&NodeGroup::retiring(&prefix, 3, &pool))
    .await
    .unwrap();
    // 250m pods: however the scheduler spreads them, every node stays under the policy's
    // threshold (six pods on one node would be 75%).
    c.add_apps(&Apps {
        count: 2,
        replicas: 3,
        pdb: Some(json!({"maxUnavailable": 1})),
        requests: json!({"cpu": "250m"}),
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(&env.client, 6).await.unwrap();
    let before: BTreeMap<String, String> = Api::<Pod>::all(env.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| (format!("default/{}", p.metadata.name.clone().unwrap_or_default()), node_of(p)))
        .collect();
    c.add_nodes(&NodeGroup::plain(&format!("trkeep{b}-"), 2, "32", "128Gi"))
    .await
    .unwrap();
    let ctl = Controller::spawn(env, "ebb-controller", false, "200ms").unwrap();
    apply_policy(&env.client, &policy, &pool).await;

    let nodes: BTreeSet<String> = (0..3).map(|i| format!("{prefix}{i}")).collect();
    let drains = col
        .wait_spans("three drain spans of the policy, ended", Duration::from_secs(120), |spans| {
            let d: Vec<Span> = spans
                .iter()
                .filter(|s| s.name == "drain" && s.str("policy") == Some(policy.as_str()))
                .cloned()
                .collect();
            let on: BTreeSet<String> = d.iter().filter_map(|s| s.str("node").map(String::from)).collect();
            (on == nodes).then_some(d)
        })
        .await;
    // Give the evict children and the loops a moment to be exported (they end earlier, but a
    // batch may still be in flight).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spans = col.spans();
    let by_id: BTreeMap<&str, &Span> = spans.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut traces = BTreeSet::new();
    for d in &drains {
        let node = d.str("node").unwrap();
        let show = tree(&spans, &d.trace);
        assert_eq!(d.service, "ebb-controller");
        assert_eq!(d.str("outcome"), Some("removed"), "{show}");
        assert!(d.int("duration_ms").is_some_and(|ms| ms > 0), "{show}");
        let loop_span = by_id.get(d.parent.as_str()).unwrap_or_else(|| panic!("the drain on {node} has its loop as parent:\n{show}"));
        assert_eq!(loop_span.name, "loop", "{show}");
        assert_eq!(loop_span.str("policy"), Some(policy.as_str()));
        assert_eq!(loop_span.trace, d.trace);
        // The loop runs inside kube-runtime's `reconciling object` span, the trace's root.
        let root = match by_id.get(loop_span.parent.as_str()) {
            Some(r) => {
                assert_eq!(r.name, "reconciling object", "{show}");
                *r
            }
            None => *loop_span,
        };
        assert!(root.parent.is_empty(), "the loop's trace starts with it:\n{show}");
        assert!(
            spans.iter().any(|s| s.name == "simulate" && s.parent == loop_span.id),
            "the loop's simulation is in the same trace:\n{show}"
        );
        // The pods the API server saw on the node are the drain's evictions.
        let expected: BTreeSet<String> = before.iter().filter(|(_, n)| *n == node).map(|(p, _)| p.clone()).collect();
        assert_eq!(d.int("pods"), Some(expected.len() as i64), "{show}");
        let evicts: Vec<&Span> = spans.iter().filter(|s| s.name == "evict" && s.parent == d.id).collect();
        let evicted: BTreeSet<String> = evicts.iter().filter_map(|s| s.str("pod").map(String::from)).collect();
        assert_eq!(evicted, expected, "one evict span per pod of {node}:\n{show}");
        for e in &evicts {
            assert!(!e.events.is_empty(), "{show}");
            for (name, a) in &e.events {
                assert_eq!(name, "eviction", "{show}");
                assert_eq!(a.get("pod").and_then(Value::as_str), e.str("pod"), "{show}");
                let answer = a.get("pdb").and_then(Value::as_str).unwrap_or_default();
                assert!(["accepted", "refused"].contains(&answer), "{answer}:\n{show}");
            }
            assert_eq!(e.events.last().and_then(|(_, a)| a.get("pdb")?.as_str()), Some("accepted"), "{show}");
        }
        traces.insert(d.trace.clone());
    }
    eprintln!("one drain's trace as the collector recorded it:\n{}", tree(&spans, &drains[0].trace));

    // The drain-duration histogram's exemplars are the drains' trace ids.
    let text = scrape(&ctl).await;
    let exemplars: BTreeSet<String> = text
        .lines()
        .filter(|l| l.starts_with("ebb_drain_duration_seconds_bucket") && l.contains(&format!("policy=\"{policy}\"")))
        .filter_map(|l| {
            let rest = &l[l.find("# {trace_id=\"")? + 13..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect();
    assert!(!exemplars.is_empty(), "no exemplar on ebb_drain_duration_seconds:\n{text}");
    assert!(exemplars.is_subset(&traces), "exemplars {exemplars:?} are drain traces {traces:?}");
    drop(ctl);
}

/// PlacementHistory decisions are spans with the pod, its role and the node: three first
/// placements (`release`), then a replaced pod pinned back (`pin`) to the node it ran on; when
/// that node stops, the next replacement waits for it (`wait`) and is relaxed (`relax`). The
/// collected output holds none of the token keys' Secret data, nor a pod's token.
async fn placement_decisions_are_spans_without_key_material(backend) {
    let col = collector();
    let c = Cluster::start(backend, 5.0).await.unwrap();
    let env = &c.env;
    let b = backend_name(backend);
    let app = format!("trdb{b}");
    let role = format!("role{b}");
    c.add_nodes(&NodeGroup::plain(&format!("trhome{b}-"), 3, "2", "8Gi"))
    .await
    .unwrap();
    let ctl = Controller::spawn(env, "ebb-controller", false, "200ms").unwrap();
    let ph: Value = json!({
        "apiVersion": "ebb.dev/v1alpha1", "kind": "PlacementHistory",
        "metadata": {"name": app, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}, "roleLabel": "ebb.dev/role",
            "shortLivedThreshold": "1s",
            "roles": [{"name": role, "escalationTimeout": "3s", "nodeFailureThreshold": 1}]},
    });
    let ar = kube::discovery::ApiResource {
        group: "ebb.dev".into(),
        version: "v1alpha1".into(),
        api_version: "ebb.dev/v1alpha1".into(),
        kind: "PlacementHistory".into(),
        plural: "placementhistories".into(),
    };
    let ph_api: Api<kube::api::DynamicObject> = Api::namespaced_with(env.client.clone(), "default", &ar);
    let obj: kube::api::DynamicObject = serde_json::from_value(ph).unwrap();
    wait_for("the PlacementHistory created", Duration::from_secs(30), || async {
        ph_api.create(&PostParams::default(), &obj).await.ok()
    })
    .await
    .unwrap();
    let sts: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": app, "namespace": "default"},
        "spec": {"replicas": 3, "podManagementPolicy": "Parallel", "serviceName": app,
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app, "ebb.dev/role": role}},
                "spec": {"terminationGracePeriodSeconds": 1,
                    "schedulingGates": [{"name": "ebb.dev/placement"}],
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                        [{"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}},
                    "containers": [{"name": "db", "image": "db",
                        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}}]}}},
    }))
    .unwrap();
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &sts)
        .await
        .unwrap();
    let pods_api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let first = format!("{app}-1");
    let home = wait_for("the first pod running", Duration::from_secs(120), || async {
        let p = pods_api.get_opt(&first).await.ok()??;
        running(&p).then(|| node_of(&p))
    })
    .await
    .unwrap();
    // Every pod's first placement: released anywhere (no history yet). A decision whose gate
    // could not come off yet (no token key in the first moments) is a span with released=false
    // and the reason as its event; the pass after makes it again.
    let decisions = col
        .wait_spans("three pods released", Duration::from_secs(60), |spans| {
            let d: Vec<Span> = spans
                .iter()
                .filter(|s| s.name == "placement" && s.str("role") == Some(role.as_str()))
                .cloned()
                .collect();
            let released: BTreeSet<&str> = d
                .iter()
                .filter(|s| {
                    s.str("decision") == Some("release")
                        && s.attrs.get("released") == Some(&Value::Bool(true))
                })
                .filter_map(|s| s.str("pod"))
                .collect();
            (released.len() == 3).then_some(d)
        })
        .await;
    for s in &decisions {
        assert!(s.str("pod").is_some_and(|p| p.starts_with(&format!("default/{app}-"))), "{s:?}");
        assert_eq!(s.str("decision"), Some("release"), "{s:?}");
        assert_eq!(s.str("node"), Some(""), "released anywhere: {s:?}");
        assert!(s.attrs.contains_key("reason"), "{s:?}");
        if s.attrs.get("released") != Some(&Value::Bool(true)) {
            assert!(
                s.events.iter().any(|(n, _)| n.contains("no token key yet") || n.contains("could not release")),
                "a decision not carried out says why: {s:?}"
            );
        }
    }
    // The history knows the three nodes; then one pod is replaced: it is pinned back to its node.
    wait_for("the history of 3 nodes saved", Duration::from_secs(30), || async {
        let o = ph_api.get(&app).await.ok()?;
        (o.data["status"]["nodeCount"].as_i64() == Some(3)).then_some(())
    })
    .await
    .unwrap();
    let old = pods_api.get(&first).await.unwrap();
    pods_api.delete(&first, &DeleteParams::default()).await.unwrap();
    let back = wait_for("the replacement running", Duration::from_secs(60), || async {
        let p = pods_api.get_opt(&first).await.ok()??;
        (p.metadata.uid != old.metadata.uid && running(&p)).then_some(p)
    })
    .await
    .unwrap();
    assert_eq!(node_of(&back), home);
    let pin = col
        .wait_spans("a pin decision", Duration::from_secs(30), |spans| {
            spans
                .iter()
                .find(|s| s.name == "placement" && s.str("role") == Some(role.as_str()) && s.str("decision") == Some("pin"))
                .cloned()
        })
        .await;
    assert_eq!(pin.str("pod"), Some(format!("default/{first}").as_str()));
    assert_eq!(pin.str("node"), Some(home.as_str()), "the chosen node is the one the API server bound it to");
    assert_eq!(pin.service, "ebb-controller");

    // Its node stops (NotReady): the next replacement waits for it, then is relaxed after the
    // role's 3 s escalation timeout onto another node.
    c.add_nodes(&NodeGroup::plain(&format!("trbig{b}-"), 1, "32", "128Gi"))
    .await
    .unwrap();
    stop_node(env, &home).await.unwrap();
    let pinned = pods_api.get(&first).await.unwrap();
    pods_api
        .delete(&first, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .unwrap();
    let moved = wait_for("the second replacement running", Duration::from_secs(60), || async {
        let p = pods_api.get_opt(&first).await.ok()??;
        (p.metadata.uid != pinned.metadata.uid && running(&p)).then_some(p)
    })
    .await
    .unwrap();
    assert_ne!(node_of(&moved), home);
    let (wait, relax) = col
        .wait_spans("a wait and a relax decision", Duration::from_secs(30), |spans| {
            let of = |d: &str| {
                spans
                    .iter()
                    .find(|s| {
                        s.name == "placement"
                            && s.str("role") == Some(role.as_str())
                            && s.str("pod") == Some(format!("default/{first}").as_str())
                            && s.str("decision") == Some(d)
                    })
                    .cloned()
            };
            Some((of("wait")?, of("relax")?))
        })
        .await;
    assert_eq!(wait.str("node"), Some(home.as_str()), "it waited for its node: {wait:?}");
    assert_eq!(wait.attrs.get("released"), Some(&Value::Bool(false)), "{wait:?}");
    assert_eq!(relax.attrs.get("released"), Some(&Value::Bool(true)), "{relax:?}");
    assert_eq!(relax.str("reason"), Some("EscalationTimeout"), "{relax:?}");

    // No key material: the token keys' Secret and the pod's token.
    let secret: Secret = Api::namespaced(env.client.clone(), "ebb-system").get("ebb-token-keys").await.unwrap();
    let mut secrets: Vec<(String, Vec<u8>)> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        // Key ids are names, not secrets: the key material is what must not leak.
        .filter(|(_, ByteString(v))| v.len() >= 16)
        .map(|(k, ByteString(v))| (format!("Secret ebb-token-keys key {k}"), v))
        .collect();
    assert!(!secrets.is_empty(), "the token keys' Secret holds key material");
    if let Some(t) = back.metadata.annotations.as_ref().and_then(|a| a.get("ebb.dev/token")) {
        secrets.push(("the pod's token".into(), t.as_bytes().to_vec()));
    }
    assert_no_secret(&col.text(), &secrets);
    drop(ctl);
}

/// A node agent restarted on its state directory recovers in one trace: a root `recover` span
/// with what every subsystem found (containers, localized resources, tokens, deletions).
async fn node_agent_recovery_is_one_trace_with_its_counts(backend) {
    let col = collector();
    let c = Cluster::start(backend, 30.0).await.unwrap();
    let env = &c.env;
    let b = backend_name(backend);
    let node = format!("tragent{b}-0");
    c.add_nodes(&NodeGroup::plain(&format!("tragent{b}-"), 1, "4", "8Gi"))
    .await
    .unwrap();
    // A pod of a PlacementHistory's role runs on the node: the agent tracks its container.
    let app = format!("tragent{b}");
    let ar = kube::discovery::ApiResource {
        group: "ebb.dev".into(),
        version: "v1alpha1".into(),
        api_version: "ebb.dev/v1alpha1".into(),
        kind: "PlacementHistory".into(),
        plural: "placementhistories".into(),
    };
    let ph: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1", "kind": "PlacementHistory",
        "metadata": {"name": app, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}, "roleLabel": "role",
            "roles": [{"name": "worker"}]},
    }))
    .unwrap();
    let ph_api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(env.client.clone(), "default", &ar);
    wait_for("the PlacementHistory created", Duration::from_secs(30), || async {
        ph_api.create(&PostParams::default(), &ph).await.ok()
    })
    .await
    .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{app}-w"), "namespace": "default",
            "labels": {"app": app, "role": "worker"}},
        "spec": {"nodeName": node, "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.k8s.io/busybox:1.36"}]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for("the role's pod running", Duration::from_secs(60), || async {
        let p = pods.get_opt(&format!("{app}-w")).await.ok()??;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = spawn_agent(env, &node, dir.path());
    wait_for("the first recovery", Duration::from_secs(60), || async {
        agent.1.lock().unwrap().iter().any(|l| l.contains("recovery finished")).then_some(())
    })
    .await
    .unwrap();
    // Its span is exported (the kill below gives the exporter no chance to flush).
    col.wait_spans("the first recover span", Duration::from_secs(30), |spans| {
        spans
            .iter()
            .any(|s| s.name == "recover" && s.str("node") == Some(node.as_str()))
            .then_some(())
    })
    .await;
    // The agent has recorded the pod's container before it is killed.
    let state = dir.path().join("state");
    wait_for("the container recorded", Duration::from_secs(60), || async {
        let out = tokio::process::Command::new(workspace_binary("ebb-node-agent").ok()?)
            .args(["dump", "--state-dir"])
            .arg(&state)
            .output()
            .await
            .ok()?;
        let d: Value = serde_json::from_slice(&out.stdout).ok()?;
        (d["containers"].as_array()?.len() == 1).then_some(())
    })
    .await
    .unwrap();
    agent.0.kill().await.unwrap();
    let again = spawn_agent(env, &node, dir.path());
    let recovers = col
        .wait_spans("two recover spans of the node", Duration::from_secs(60), |spans| {
            let r: Vec<Span> = spans
                .iter()
                .filter(|s| s.name == "recover" && s.str("node") == Some(node.as_str()))
                .cloned()
                .collect();
            (r.len() >= 2).then_some(r)
        })
        .await;
    for r in &recovers {
        let show = tree(&col.spans(), &r.trace);
        assert_eq!(r.service, "ebb-node-agent", "{show}");
        assert!(r.parent.is_empty(), "recovery is a trace of its own:\n{show}");
        for key in [
            "containers",
            "containers_lost",
            "completed_while_down",
            "localized_resources",
            "discarded_fetches",
            "files_deleted",
            "finished_applications",
            "expired_tokens",
            "deletions_resumed",
            "duration_ms",
        ] {
            assert!(r.int(key).is_some(), "{key} on the recover span:\n{show}");
        }
        assert!(r.events.iter().any(|(n, _)| n == "recovery finished"), "{show}");
    }
    assert_ne!(recovers[0].trace, recovers[1].trace, "each recovery is its own trace");
    let show = tree(&col.spans(), &recovers[1].trace);
    assert_eq!(recovers[0].int("containers"), Some(0), "nothing recorded before the first start:\n{show}");
    assert_eq!(recovers[1].int("containers"), Some(1), "the restart found the pod's container:\n{show}");
    assert_eq!(recovers[1].int("live_pods"), Some(1), "{show}");
    assert_eq!(recovers[1].int("containers_lost"), Some(0), "the pod still runs:\n{show}");
    eprintln!("the agent's recovery as the collector recorded it:\n{}", tree(&col.spans(), &recovers[1].trace));
    // The agent's token key never reaches the collector.
    if let Ok(secret) = Api::<Secret>::namespaced(env.client.clone(), "ebb-system").get("ebb-node-agent-tokens").await {
        let secrets: Vec<(String, Vec<u8>)> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, ByteString(v))| v.len() >= 16)
            .map(|(k, ByteString(v))| (format!("Secret ebb-node-agent-tokens key {k}"), v))
            .collect();
        assert_no_secret(&col.text(), &secrets);
    }
    drop(again);
}

/// A PodDisruptionBudget that allows no disruption yet: the drain's `evict` spans record the wait
/// for the budget (naming it), then the API server's answers: one `pdb=refused` event per 429 of
/// the audit log (if any got through) and the acceptance last. (The set-up of the scale-down test
/// of evictions waiting for their budget: never-ready pods the budget protects until three more
/// pods are ready.)
async fn a_drain_waiting_for_its_budget_shows_in_its_evict_span(backend) {
    let col = collector();
    let c = Cluster::start(backend, 20.0).await.unwrap();
    let env = &c.env;
    let b = backend_name(backend);
    let pool = format!("trpdb-{b}");
    let policy = format!("trpdb-{b}");
    let prefix = format!("trpdb{b}-");
    let tier = format!("web{b}");
    c.add_nodes(&NodeGroup::retiring(&prefix, 2, &pool))
    .await
    .unwrap();
    c.add_apps(&Apps {
        prefix: "flaky-",
        replicas: 2,
        labels: json!({"tier": tier}),
        requests: json!({"cpu": "500m"}),
        never_ready: true,
        ..Apps::default()
    })
    .await
    .unwrap();
    let pods_api: Api<Pod> = Api::all(env.client.clone());
    wait_for("2 pods started (never ready)", Duration::from_secs(30), || async {
        let l = pods_api
            .list(&kube::api::ListParams::default().fields("status.phase=Running"))
            .await
            .ok()?;
        let on: BTreeSet<String> = l.items.iter().map(node_of).collect();
        (on.len() == 2).then_some(())
    })
    .await
    .unwrap();
    c.create_pdb(json!({"metadata": {"name": tier, "namespace": "default"},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"tier": tier}}}}))
        .await
        .unwrap();
    c.add_nodes(&NodeGroup::plain(&format!("trpdbkeep{b}-"), 2, "32", "128Gi"))
    .await
    .unwrap();
    let _ctl = Controller::spawn(env, "ebb-controller", false, "200ms").unwrap();
    apply_policy(&env.client, &policy, &pool).await;
    // The budget's healthy pods come only once a drain has begun (a node of the pool carries
    // the to-be-deleted taint): its eviction has to wait for them however slow the machine.
    let nodes_api: Api<Node> = Api::all(env.client.clone());
    wait_for("a drain begun", Duration::from_secs(60), || async {
        let l = nodes_api.list(&kube::api::ListParams::default()).await.ok()?;
        l.items
            .iter()
            .any(|n| n.metadata.name.as_deref().is_some_and(|m| m.starts_with(&prefix)) && has_taint(n, TAINT_TO_BE_DELETED))
            .then_some(())
    })
    .await
    .unwrap();
    c.add_apps(&Apps {
        prefix: "web-",
        replicas: 3,
        labels: json!({"tier": tier}),
        requests: json!({"cpu": "500m"}),
        ready_after: Some(Duration::from_secs(10)),
        ..Apps::default()
    })
    .await
    .unwrap();
    let drains = col
        .wait_spans("two drains of the policy, ended", Duration::from_secs(90), |spans| {
            let d: Vec<Span> = spans
                .iter()
                .filter(|s| s.name == "drain" && s.str("policy") == Some(policy.as_str()))
                .cloned()
                .collect();
            (d.len() == 2).then_some(d)
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spans = col.spans();
    let audit = env.audit().unwrap();
    let refused_429 = audit
        .iter()
        .filter(|r| r.subresource == "eviction" && r.code == 429)
        .count();
    let mut refused_events = 0;
    for d in &drains {
        let show = tree(&spans, &d.trace);
        assert_eq!(d.str("outcome"), Some("removed"), "{show}");
        let evicts: Vec<&Span> = spans.iter().filter(|s| s.name == "evict" && s.parent == d.id).collect();
        assert_eq!(evicts.len(), 1, "the flaky pod of the node:\n{show}");
        let answers: Vec<&str> = evicts[0]
            .events
            .iter()
            .filter(|(n, _)| n == "eviction")
            .filter_map(|(_, a)| a.get("pdb")?.as_str())
            .collect();
        assert_eq!(answers.last(), Some(&"accepted"), "{show}");
        assert!(answers[..answers.len() - 1].iter().all(|a| *a == "refused"), "{answers:?}");
        assert_eq!(evicts[0].int("attempts"), Some(answers.len() as i64), "{show}");
        let waited = evicts[0]
            .events
            .iter()
            .position(|(n, a)| {
                n == "eviction waits for its disruption budget"
                    && a.get("pdb").and_then(Value::as_str) == Some(&format!("default/{tier}"))
            });
        let answered = evicts[0].events.iter().position(|(n, _)| n == "eviction");
        assert!(
            waited.is_some() && waited < answered,
            "the wait for the budget, named, comes before the eviction:\n{show}"
        );
        refused_events += answers.len() - 1;
    }
    assert!(refused_429 <= 1, "evictions wait for the budget rather than being refused");
    assert_eq!(
        refused_events, refused_429,
        "one refused event per 429 the API server answered"
    );
    eprintln!("a drain that waited for its budget:\n{}", tree(&spans, &drains[0].trace));
}

}

/// A node agent on `node` with its state in `dir`; its output is kept.
fn spawn_agent(env: &TestEnv, node: &str, dir: &Path) -> (ChildProcess, Arc<Mutex<Vec<String>>>) {
    let mut child = spawn_node_agent(env, node, dir, "ebb-system/ebb-node-agent-tokens").unwrap();
    let log = child.capture_output();
    (child, log)
}

#[test]
fn secrets_are_found_in_any_encoding() {
    let key = b"0123456789abcdef0123".to_vec();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    for leaked in [
        "{\"k\":\"0123456789abcdef0123\"}".to_string(),
        format!("x={hex}"),
    ] {
        let r =
            std::panic::catch_unwind(|| assert_no_secret(&leaked, &[("k".into(), key.clone())]));
        assert!(r.is_err(), "{leaked} was not caught");
    }
    assert_no_secret("nothing here", &[("k".into(), key)]);
}
