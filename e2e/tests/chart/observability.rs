//! The chart's monitoring objects: the node agent's metrics Service, the ServiceMonitors, the
//! PrometheusRule (checked and unit-tested by Prometheus's promtool) and the Grafana dashboard,
//! whose every metric must be one the controller or the node agent exports.

use std::collections::BTreeSet;
use std::process::Stdio;

use super::conventions::{object, of_kind, render};
use super::*;

/// Values with every monitoring object on.
fn monitoring_on() -> Value {
    json!({"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true},
           "dashboard": {"enabled": true}})
}

/// Series names a registration file exports, from its `register("name", "help", x.field.clone())`
/// calls, its `with_prefix` and each field's declared type (counters get `_total`, histograms
/// `_bucket`, `_sum`, `_count`), as the prometheus-client crate encodes them.
fn exported_by(source: &str) -> BTreeSet<String> {
    let prefix = source
        .split("with_prefix(\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a Registry::with_prefix");
    // `pub field: Type` declarations of the metrics struct.
    let field_type = |field: &str| -> String {
        source
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(&format!("pub {field}: ")))
            .unwrap_or_else(|| panic!("no declaration of the metric field {field}"))
            .to_string()
    };
    let mut out = BTreeSet::new();
    for call in source.split(".register(").skip(1) {
        // The call ends at the value it registers: help text may hold "); ".
        let end = call
            .find(".clone()")
            .expect("a register call passes field.clone()");
        let call = &call[..end + ".clone()".len()];
        let name = call
            .split('"')
            .nth(1)
            .expect("a register call starts with the metric's name");
        let field = call
            .rsplit(".clone()")
            .nth(1)
            .and_then(|s| s.rsplit('.').next())
            .expect("a register call passes field.clone()");
        let ty = field_type(field);
        let full = format!("{prefix}_{name}");
        if ty.contains("Histogram") {
            for suffix in ["_bucket", "_sum", "_count"] {
                out.insert(format!("{full}{suffix}"));
            }
        } else if ty.contains("Counter") {
            out.insert(format!("{full}_total"));
        } else {
            assert!(ty.contains("Gauge"), "{field}: {ty}");
            out.insert(full);
        }
    }
    out
}

/// Every series the controller and the node agent export.
fn exported() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for file in ["controller/src/metrics.rs", "node-agent/src/metrics.rs"] {
        let source = std::fs::read_to_string(repo().join(file)).unwrap();
        let found = exported_by(&source);
        assert!(found.len() >= 9, "{file}: {found:?}");
        all.extend(found);
    }
    all
}

/// The metric names a PromQL expression selects: its words outside quoted strings and label
/// matchers that start with `ebb_` (no label, function or keyword of ebb's does), and `up`.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut plain = String::new();
    let (mut quoted, mut braces) = (false, 0);
    for ch in expr.chars() {
        match ch {
            '"' => quoted = !quoted,
            '{' if !quoted => braces += 1,
            '}' if !quoted => braces -= 1,
            _ if quoted || braces > 0 => {}
            _ => plain.push(ch),
        }
    }
    plain
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("ebb_") || *w == "up")
        .map(str::to_string)
        .collect()
}

/// The names in `exprs` that no code exports (`up` is Prometheus's own, per target).
fn unknown_metrics<'a>(
    exprs: impl IntoIterator<Item = &'a str>,
    known: &BTreeSet<String>,
) -> Vec<String> {
    let mut unknown = Vec::new();
    for expr in exprs {
        let names = metrics_in(expr);
        if names.is_empty() {
            unknown.push(format!("no metric in {expr:?}"));
        }
        for n in names {
            if n != "up" && !known.contains(&n) {
                unknown.push(format!("{n} (in {expr:?})"));
            }
        }
    }
    unknown
}

fn rule_exprs(rule: &Value) -> Vec<String> {
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| r["expr"].as_str().unwrap().to_string())
        .collect()
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(chart_dir().join("dashboards/ebb.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn dashboard_exprs(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            out.push((
                p["title"].as_str().unwrap().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// Runs promtool with `args` in `dir`; returns (success, what it said).
fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool is needed (Debian: apt-get install prometheus; .ci/run installs it): {e}"
            )
        });
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_metric_name_check_can_fail() {
    let known = exported();
    for real in [
        "ebb_policy_degraded",
        "ebb_removals_total",
        "ebb_drain_duration_seconds_count",
        "ebb_node_agent_store_healthy",
        "ebb_replacement_start_timeouts_total",
        "ebb_replacement_waits_kept_total",
    ] {
        assert!(known.contains(real), "{real} not found in {known:?}");
    }
    assert_eq!(
        unknown_metrics(
            [r#"sum by (policy) (rate(ebb_evictions_total{result="ebb_x"}[5m]))"#],
            &known
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        unknown_metrics(["sum by (policy) (ebb_policy_degraded_total)"], &known),
        vec!["ebb_policy_degraded_total (in \"sum by (policy) (ebb_policy_degraded_total)\")"]
    );
    assert_eq!(
        unknown_metrics(["vector(1)"], &known),
        vec!["no metric in \"vector(1)\""]
    );
}

#[test]
fn dashboard_and_alerts_use_only_exported_metrics() {
    let known = exported();
    let docs = render(&monitoring_on());
    let rule = object(&docs, "PrometheusRule", "ebb");
    let exprs = rule_exprs(rule);
    assert!(exprs.len() >= 6, "{exprs:?}");
    let unknown = unknown_metrics(exprs.iter().map(String::as_str), &known);
    assert!(
        unknown.is_empty(),
        "alerts use unknown metrics: {unknown:#?}"
    );
    let panels = dashboard_exprs(&dashboard());
    let unknown = unknown_metrics(panels.iter().map(|(_, e)| e.as_str()), &known);
    assert!(
        unknown.is_empty(),
        "dashboard uses unknown metrics: {unknown:#?}"
    );
    // Every metric family of both binaries is on the dashboard.
    let shown: BTreeSet<String> = panels.iter().flat_map(|(_, e)| metrics_in(e)).collect();
    let family = |s: &str| {
        ["_bucket", "_sum", "_count", "_total"]
            .iter()
            .fold(s.to_string(), |n, suf| n.trim_end_matches(suf).to_string())
    };
    let shown_families: BTreeSet<String> = shown.iter().map(|s| family(s)).collect();
    let missing: Vec<String> = known
        .iter()
        .map(|s| family(s))
        .filter(|f| !shown_families.contains(f))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(missing.is_empty(), "metrics on no panel: {missing:?}");
}

#[test]
fn promtool_accepts_the_rules_and_their_alerts_fire_on_the_series_they_watch() {
    let docs = render(&monitoring_on());
    let rule = object(&docs, "PrometheusRule", "ebb");
    assert_eq!(rule["metadata"]["namespace"], json!(NS));
    let groups = rule["spec"]["groups"].clone();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_json::to_string(&json!({ "groups": groups })).unwrap(),
    )
    .unwrap();
    let (ok, said) = promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    assert!(ok, "promtool check rules: {said}");
    assert!(said.contains("SUCCESS: 7 rules found"), "{said}");

    // promtool is a real judge: a broken expression fails it.
    let mut broken = groups.clone();
    broken[0]["rules"][0]["expr"] = json!("max by (policy (ebb_policy_degraded)");
    std::fs::write(
        dir.path().join("broken.yaml"),
        serde_json::to_string(&json!({ "groups": broken })).unwrap(),
    )
    .unwrap();
    let (ok, said) = promtool(dir.path(), &["check", "rules", "broken.yaml"]);
    assert!(!ok, "promtool accepted a broken expression: {said}");

    // Unit tests of the alerts (promtool test rules), on the rules without their annotations
    // (only the labels are compared here; check rules above parsed the annotation templates).
    let mut bare = groups.clone();
    for r in bare[0]["rules"].as_array_mut().unwrap() {
        r.as_object_mut().unwrap().remove("annotations");
    }
    std::fs::write(
        dir.path().join("bare.yaml"),
        serde_json::to_string(&json!({ "groups": bare })).unwrap(),
    )
    .unwrap();
    let ctl = r#"job="ebb-controller-metrics", namespace="ebb-system""#;
    let agent = r#"job="ebb-node-agent-metrics", namespace="ebb-system""#;
    let alert = |name: &str, at: &str, labels: Value| {
        json!({"alertname": name, "eval_time": at,
               "exp_alerts": if labels.is_null() { json!([]) } else { json!([{"exp_labels": labels}]) }})
    };
    let tests = json!({
        "rule_files": ["bare.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m",
             "input_series": [
                {"series": "ebb_policy_degraded{policy=\"workers\",reason=\"SelectorMatchesNothing\"}", "values": "1x30"},
                {"series": "ebb_policy_degraded{policy=\"workers\",reason=\"InvalidSpec\"}", "values": "0x30"},
                {"series": "ebb_policy_degraded{policy=\"fine\",reason=\"SelectorMatchesNothing\"}", "values": "0x30"},
                {"series": format!("up{{{ctl}, instance=\"10.0.0.1:8080\"}}"), "values": "1x30"},
             ],
             "alert_rule_test": [
                alert("EbbPolicyDegraded", "5m", Value::Null),
                alert("EbbPolicyDegraded", "15m", json!({"alertname": "EbbPolicyDegraded",
                    "policy": "workers", "reason": "SelectorMatchesNothing", "severity": "warning"})),
                alert("EbbControllerDown", "15m", Value::Null),
             ]},
            {"interval": "1m",
             "input_series": [
                {"series": "ebb_drains_in_progress{policy=\"workers\"}", "values": "0x10 2x80"},
                {"series": "ebb_drain_duration_seconds_count{policy=\"workers\",outcome=\"removed\"}", "values": "3x90"},
                {"series": "ebb_drains_in_progress{policy=\"moving\"}", "values": "0x10 2x80"},
                {"series": "ebb_drain_duration_seconds_count{policy=\"moving\",outcome=\"removed\"}", "values": "0+1x90"},
                {"series": "ebb_removals_total{policy=\"workers\",method=\"Karpenter\",outcome=\"stuck\"}", "values": "0 0 0 0 0 1 1 1 1 1 1"},
                {"series": "ebb_removals_total{policy=\"workers\",method=\"ClusterAPI\",outcome=\"failed\"}", "values": "0x10"},
                {"series": "ebb_node_agent_store_healthy{instance=\"10.0.0.7:8081\",node=\"n7\"}", "values": "0x10"},
                {"series": "ebb_node_agent_store_healthy{instance=\"10.0.0.8:8081\",node=\"n8\"}", "values": "1x10"},
                {"series": format!("up{{{agent}, instance=\"10.0.0.7:8081\"}}"), "values": "0x15"},
                {"series": format!("up{{{agent}, instance=\"10.0.0.8:8081\"}}"), "values": "1x15"},
             ],
             "alert_rule_test": [
                alert("EbbDrainStuck", "30m", Value::Null),
                alert("EbbDrainStuck", "75m", json!({"alertname": "EbbDrainStuck",
                    "policy": "workers", "severity": "warning"})),
                alert("EbbRemovalStuck", "3m", Value::Null),
                alert("EbbRemovalStuck", "8m", json!({"alertname": "EbbRemovalStuck",
                    "policy": "workers", "method": "Karpenter", "severity": "warning"})),
                alert("EbbRemovalFailed", "8m", Value::Null),
                alert("EbbNodeAgentStoreUnhealthy", "3m", Value::Null),
                alert("EbbNodeAgentStoreUnhealthy", "7m", json!({"alertname": "EbbNodeAgentStoreUnhealthy",
                    "instance": "10.0.0.7:8081", "node": "n7", "severity": "critical"})),
                alert("EbbControllerDown", "3m", Value::Null),
                alert("EbbControllerDown", "7m", json!({"alertname": "EbbControllerDown",
                    "severity": "critical"})),
                alert("EbbNodeAgentDown", "12m", json!({"alertname": "EbbNodeAgentDown",
                    "job": "ebb-node-agent-metrics", "namespace": "ebb-system",
                    "instance": "10.0.0.7:8081", "severity": "warning"})),
             ]},
        ],
    });
    std::fs::write(
        dir.path().join("tests.yaml"),
        serde_json::to_string(&tests).unwrap(),
    )
    .unwrap();
    let (ok, said) = promtool(dir.path(), &["test", "rules", "tests.yaml"]);
    assert!(ok, "promtool test rules: {said}");
    assert!(said.contains("SUCCESS"), "{said}");
}

#[test]
fn promtool_parses_every_dashboard_query() {
    // Grafana's variables replaced by what they stand for, each query a recording rule.
    let rules: Vec<Value> = dashboard_exprs(&dashboard())
        .iter()
        .enumerate()
        .map(|(i, (_, e))| {
            let e = e.replace("$__rate_interval", "5m").replace("$policy", ".*");
            json!({"record": format!("ebb:dashboard_query_{i}"), "expr": e})
        })
        .collect();
    assert!(rules.len() >= 20);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("queries.yaml"),
        serde_json::to_string(&json!({"groups": [{"name": "dashboard", "rules": rules}]})).unwrap(),
    )
    .unwrap();
    let (ok, said) = promtool(dir.path(), &["check", "rules", "queries.yaml"]);
    assert!(
        ok,
        "promtool check rules on the dashboard's queries: {said}"
    );
}

#[test]
fn monitoring_objects_render_when_asked() {
    let defaults = render(&json!({}));
    assert!(of_kind(&defaults, "ServiceMonitor").is_empty());
    assert!(of_kind(&defaults, "PrometheusRule").is_empty());
    assert!(of_kind(&defaults, "ConfigMap").is_empty());
    // The agents' metrics have a Service at all times (headless: one endpoint per agent).
    let svc = object(&defaults, "Service", "ebb-node-agent-metrics");
    assert_eq!(svc["spec"]["clusterIP"], json!("None"));
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], json!("http"));
    assert_eq!(svc["spec"]["ports"][0]["port"], json!(8081));
    let ds = object(&defaults, "DaemonSet", "ebb-node-agent");
    let port = &ds["spec"]["template"]["spec"]["containers"][0]["ports"][0];
    assert_eq!(
        (port["name"].clone(), port["containerPort"].clone()),
        (json!("http"), json!(8081))
    );
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &pod_labels[k], v,
            "the Service selects the agent pods ({k})"
        );
    }

    let docs = render(&monitoring_on());
    for (monitor, service) in [
        ("ebb-controller", "ebb-controller-metrics"),
        ("ebb-node-agent", "ebb-node-agent-metrics"),
    ] {
        let sm = object(&docs, "ServiceMonitor", monitor);
        let svc = object(&docs, "Service", service);
        for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(
                &svc["metadata"]["labels"][k], v,
                "{monitor} selects {service} ({k})"
            );
        }
        let ep = &sm["spec"]["endpoints"][0];
        assert_eq!(ep["port"], svc["spec"]["ports"][0]["name"], "{monitor}");
        assert_eq!(ep["path"], json!("/metrics"));
        assert_eq!(ep["relabelings"][0]["targetLabel"], json!("node"));
        assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"], json!([NS]));
    }
    // The steering Service also carries the controller's labels, but no port `metrics`.
    let steering = object(&docs, "Service", "ebb-steering");
    assert!(
        steering["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["name"] != "metrics")
    );
    let cm = object(&docs, "ConfigMap", "ebb-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], json!("1"));
    let shipped: Value = serde_json::from_str(cm["data"]["ebb.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        shipped,
        dashboard(),
        "the ConfigMap holds dashboards/ebb.json"
    );

    // Without the node agent, neither its monitor nor its alert.
    let no_agent = render(&json!({"serviceMonitor": {"enabled": true},
        "prometheusRule": {"enabled": true}, "nodeAgent": {"enabled": false}}));
    assert_eq!(of_kind(&no_agent, "ServiceMonitor").len(), 1);
    let names: Vec<Value> =
        object(&no_agent, "PrometheusRule", "ebb")["spec"]["groups"][0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["alert"].clone())
            .collect();
    assert!(!names.contains(&json!("EbbNodeAgentDown")), "{names:?}");
}

#[test]
fn dashboard_is_a_grafana_dashboard_with_unique_panels() {
    let d = dashboard();
    assert_eq!(d["uid"], json!("ebb-overview"));
    let panels = d["panels"].as_array().unwrap();
    let ids: BTreeSet<i64> = panels.iter().map(|p| p["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "policy"]);
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            p["datasource"]["uid"],
            json!("${datasource}"),
            "{}",
            p["title"]
        );
        assert!(
            p["description"].as_str().is_some_and(|s| s.len() > 20),
            "{} has a description",
            p["title"]
        );
        for t in p["targets"].as_array().unwrap() {
            let e = t["expr"].as_str().unwrap();
            for var in e.split('$').skip(1) {
                assert!(
                    var.starts_with("policy") || var.starts_with("__rate_interval"),
                    "{}: unknown variable in {e}",
                    p["title"]
                );
            }
        }
    }
}

#[test]
fn operations_doc_lists_every_panel_query_and_alert() {
    let doc = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let section = doc
        .split("## Dashboard and alerts")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/operations.md has a section Dashboard and alerts");
    for (title, expr) in dashboard_exprs(&dashboard()) {
        assert!(
            section.contains(&format!("| {title} |")),
            "panel {title} is not in docs/operations.md"
        );
        let quoted = format!("`{}`", expr.replace('|', "\\|"));
        assert!(
            section.contains(&quoted),
            "the query of panel {title} is not in docs/operations.md: {quoted}"
        );
    }
    let docs = render(&monitoring_on());
    let rule = object(&docs, "PrometheusRule", "ebb");
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let name = r["alert"].as_str().unwrap();
        assert!(
            section.contains(&format!("| `{name}` |")),
            "alert {name} is not in docs/operations.md"
        );
    }
}
