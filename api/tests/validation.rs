//! CRD validation as the apiserver would apply it: schema defaults, CEL rules (evaluated locally
//! with kube's CEL engine), and the generated YAML in `crds/` being up to date.

use ebb_api::{NodeStateSpec, PlacementHistorySpec, ScaleDownMode, ScaleDownPolicySpec};
use kube::core::cel::{Validator, apply_defaults, compile_schema};
use serde_json::{Value, json};

fn schema_of(kind: &str) -> Value {
    let crd = ebb_api::crdgen::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"));
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

fn object(kind: &str, spec: Value) -> Value {
    json!({"apiVersion": "ebb.dev/v1alpha1", "kind": kind, "metadata": {"name": "x"}, "spec": spec})
}

/// Validation errors (messages) for an object of `kind`, as the apiserver's CEL step would give.
fn cel_errors(kind: &str, spec: Value, old_spec: Option<Value>) -> Vec<String> {
    let schema = schema_of(kind);
    let old = old_spec.map(|s| object(kind, s));
    match Validator::new().validate(&schema, &object(kind, spec), old.as_ref()) {
        Ok(()) => vec![],
        Err(errs) => errs.into_vec().into_iter().map(|e| e.to_string()).collect(),
    }
}

fn assert_rejected(kind: &str, spec: Value, old: Option<Value>, message: &str) {
    let errs = cel_errors(kind, spec.clone(), old);
    assert!(
        errs.iter().any(|e| e.contains(message)),
        "{kind} {spec} should be rejected with {message:?}, got {errs:?}"
    );
}

fn assert_accepted(kind: &str, spec: Value, old: Option<Value>) {
    let errs = cel_errors(kind, spec.clone(), old);
    assert!(
        errs.is_empty(),
        "{kind} {spec} should be accepted, got {errs:?}"
    );
}

fn role(name: &str) -> Value {
    json!({"name": name})
}

fn ph(roles: Vec<Value>) -> Value {
    json!({"selector": {"matchLabels": {"app": "db"}}, "roleLabel": "role", "roles": roles})
}

#[test]
fn drain_parallelism_cannot_exceed_total() {
    assert_rejected(
        "ScaleDownPolicy",
        json!({"maxScaleDownParallelism": 5, "maxDrainParallelism": 6}),
        None,
        "maxDrainParallelism cannot exceed maxScaleDownParallelism",
    );
    // Defaults (10) apply before CEL: 11 drains against a default total of 10 is rejected too.
    assert_rejected(
        "ScaleDownPolicy",
        json!({"maxDrainParallelism": 11}),
        None,
        "cannot exceed",
    );
    assert_accepted(
        "ScaleDownPolicy",
        json!({"maxScaleDownParallelism": 20, "maxDrainParallelism": 20}),
        None,
    );
    assert_accepted("ScaleDownPolicy", json!({}), None);
}

#[test]
fn a_removal_needs_a_mode_that_removes() {
    assert_rejected(
        "ScaleDownPolicy",
        json!({"mode": "Drain", "removal": {"method": "ClusterAPI"}}),
        None,
        "mode Drain keeps its nodes, so it cannot have a removal",
    );
    for mode in ["DrainAndDelete", "DryRun"] {
        assert_accepted(
            "ScaleDownPolicy",
            json!({"mode": mode, "removal": {"method": "Karpenter", "timeout": "5m"}}),
            None,
        );
    }
    // the default mode (DryRun) previews it
    assert_accepted("ScaleDownPolicy", json!({"removal": {}}), None);
}

#[test]
fn budget_schedule_and_duration_go_together() {
    let with = |b: Value| json!({"budgets": [b]});
    assert_rejected(
        "ScaleDownPolicy",
        with(json!({"nodes": "10%", "schedule": "0 9 * * 1-5"})),
        None,
        "schedule and duration must be set together",
    );
    assert_rejected(
        "ScaleDownPolicy",
        with(json!({"nodes": "3", "duration": "8h"})),
        None,
        "set together",
    );
    assert_accepted(
        "ScaleDownPolicy",
        with(json!({"nodes": "10%", "schedule": "0 9 * * 1-5", "duration": "8h"})),
        None,
    );
    assert_accepted("ScaleDownPolicy", with(json!({"nodes": "0"})), None);
}

#[test]
fn placement_history_needs_at_least_one_role() {
    assert_rejected(
        "PlacementHistory",
        ph(vec![]),
        None,
        "roles must list at least one role",
    );
    assert_accepted("PlacementHistory", ph(vec![role("primary")]), None);
}

#[test]
fn placement_history_role_names_are_unique() {
    assert_rejected(
        "PlacementHistory",
        ph(vec![role("primary"), role("replica"), role("primary")]),
        None,
        "role names must be unique",
    );
    assert_accepted(
        "PlacementHistory",
        ph(vec![role("primary"), role("replica")]),
        None,
    );
}

#[test]
fn node_failure_threshold_is_minus_one_or_more() {
    let with = |t: i64| ph(vec![json!({"name": "a", "nodeFailureThreshold": t})]);
    assert_rejected(
        "PlacementHistory",
        with(-2),
        None,
        "nodeFailureThreshold must be -1 (unlimited) or a non-negative count",
    );
    assert_accepted("PlacementHistory", with(-1), None);
    assert_accepted("PlacementHistory", with(0), None);
    assert_accepted("PlacementHistory", with(7), None);
}

#[test]
fn local_resource_names_are_unique_within_a_role() {
    let res = |n: &str| json!({"name": n, "url": "https://example.invalid/a.tar", "sha256": "a".repeat(64)});
    let with = |rs: Vec<Value>| ph(vec![json!({"name": "a", "localResources": rs})]);
    assert_rejected(
        "PlacementHistory",
        with(vec![res("model"), res("model")]),
        None,
        "localResources names must be unique",
    );
    assert_accepted(
        "PlacementHistory",
        with(vec![res("model"), res("index")]),
        None,
    );
}

#[test]
fn node_state_node_name_is_immutable() {
    assert_rejected(
        "NodeState",
        json!({"nodeName": "n2"}),
        Some(json!({"nodeName": "n1"})),
        "nodeName is immutable",
    );
    assert_accepted(
        "NodeState",
        json!({"nodeName": "n1"}),
        Some(json!({"nodeName": "n1"})),
    );
    assert_accepted("NodeState", json!({"nodeName": "n1"}), None);
}

#[test]
fn every_rule_compiles_and_fits_the_cost_budget() {
    for kind in ["ScaleDownPolicy", "PlacementHistory", "NodeState"] {
        let compiled = compile_schema(&schema_of(kind));
        assert!(
            !compiled.has_errors(),
            "{kind}: {:?}",
            compiled.compilation_errors()
        );
        let mut rules = vec![];
        collect_rules(&schema_of(kind), &mut rules);
        assert!(!rules.is_empty(), "{kind} has CEL rules");
        for (rule, node) in rules {
            // Cost is estimated against the schema node the rule is attached to (its bounds).
            let warnings = kube::core::cel::estimate_rule_cost(&rule, &compile_schema(&node));
            let costly: Vec<_> = warnings
                .iter()
                .filter(|w| w.kind == kube::core::cel::WarningKind::CostExceeded)
                .collect();
            assert!(
                costly.is_empty(),
                "{kind}: rule {rule:?} may exceed the CEL cost budget: {costly:?}"
            );
        }
    }
}

/// Every CEL rule with the schema node it is attached to.
fn collect_rules(schema: &Value, out: &mut Vec<(String, Value)>) {
    match schema {
        Value::Object(o) => {
            if let Some(Value::Array(rules)) = o.get("x-kubernetes-validations") {
                out.extend(
                    rules.iter().filter_map(|r| {
                        r["rule"].as_str().map(|r| (r.to_string(), schema.clone()))
                    }),
                );
            }
            o.values().for_each(|v| collect_rules(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_rules(v, out)),
        _ => {}
    }
}

/// The defaults in the schema (applied by the apiserver) and in serde (applied when the controller
/// reads a file or an object without them) must be the same values.
#[test]
fn schema_defaults_equal_serde_defaults() {
    let cases: Vec<(&str, Value)> = vec![
        ("ScaleDownPolicy", json!({})),
        ("PlacementHistory", ph(vec![role("a")])),
        ("NodeState", json!({"nodeName": "n1"})),
    ];
    for (kind, spec) in cases {
        let defaulted = apply_defaults(&schema_of(kind), &object(kind, spec.clone()));
        let via_schema = &defaulted["spec"];
        let via_serde = match kind {
            "ScaleDownPolicy" => {
                serde_json::to_value(serde_json::from_value::<ScaleDownPolicySpec>(spec).unwrap())
                    .unwrap()
            }
            "PlacementHistory" => {
                serde_json::to_value(serde_json::from_value::<PlacementHistorySpec>(spec).unwrap())
                    .unwrap()
            }
            _ => serde_json::to_value(serde_json::from_value::<NodeStateSpec>(spec).unwrap())
                .unwrap(),
        };
        // Compare field by field on what the schema defaulted (serde may add empty optional lists).
        for (field, value) in via_schema.as_object().unwrap() {
            assert_eq!(
                Some(value),
                via_serde.get(field),
                "{kind}.spec.{field}: schema default differs from serde default"
            );
        }
    }
}

#[test]
fn minimal_scale_down_policy_gets_documented_defaults() {
    let spec: ScaleDownPolicySpec = serde_json::from_value(json!({})).unwrap();
    let secs = |d: ebb_api::KubeDuration| d.as_duration().as_secs();
    assert_eq!(
        spec.mode,
        ScaleDownMode::DryRun,
        "a new policy only reports until told to act"
    );
    assert_eq!(secs(spec.scan_interval), 10);
    assert_eq!(secs(spec.unneeded_time), 600);
    assert_eq!(secs(spec.unready_time), 1200);
    assert_eq!(spec.utilization_threshold, 1.0);
    assert_eq!(spec.max_scale_down_parallelism, 10);
    assert_eq!(spec.max_drain_parallelism, 10);
    assert_eq!(secs(spec.simulation_timeout), 30);
    assert_eq!(secs(spec.max_graceful_termination), 600);
    assert_eq!(secs(spec.eviction_retry_interval), 10);
    assert_eq!(secs(spec.max_pod_eviction_time), 120);
    assert!(spec.skip_nodes_with_local_storage && spec.skip_nodes_with_system_pods);
    assert!(spec.budgets.is_empty());
    assert_eq!(
        spec.accelerator_resources,
        ["nvidia.com/gpu", "amd.com/gpu"],
        "GPU nodes are judged by their GPUs unless told otherwise"
    );
    assert_eq!(spec.accelerator_utilization_threshold, 1.0);
    assert_eq!(spec.prices, None, "no prices: today's order");
    assert_eq!(ScaleDownPolicySpec::default(), spec);
}

/// The apiserver refuses prices below 0 (JSON has no NaN or infinity), bad resource names and
/// thresholds outside 0..1 through the schema; these are the constraints it applies.
#[test]
fn prices_and_accelerators_are_constrained_by_the_schema() {
    let schema = schema_of("ScaleDownPolicy");
    let at = |p: &str| {
        schema
            .pointer(&format!("/properties/spec/properties/{p}"))
            .cloned()
            .unwrap_or_else(|| panic!("no {p} in the schema"))
    };
    let price = at("prices/properties/perHour/additionalProperties");
    assert_eq!(price["type"], "number");
    assert_eq!(price["minimum"], 0.0);
    assert!(price["maximum"].as_f64().is_some_and(|m| m.is_finite()));
    assert!(
        at("prices/properties/perHour")["maxProperties"]
            .as_u64()
            .is_some()
    );
    assert_eq!(
        at("prices/properties/label")["default"],
        "node.kubernetes.io/instance-type"
    );
    let threshold = at("acceleratorUtilizationThreshold");
    assert_eq!(
        (threshold["minimum"].as_f64(), threshold["maximum"].as_f64()),
        (Some(0.0), Some(1.0))
    );
    let resources = at("acceleratorResources");
    assert!(
        resources["items"]["pattern"]
            .as_str()
            .is_some_and(|p| p.contains('/')),
        "an extended resource has a domain"
    );
    assert!(resources["maxItems"].as_u64().is_some());
    // A well-formed table reads; a negative or non-numeric price does not even deserialize
    // as a number (the schema refuses the negative one at the apiserver).
    let spec: ScaleDownPolicySpec = serde_json::from_value(
        json!({"prices": {"perHour": {"p4d.24xlarge": 32.77, "m5.large": 0.096}}}),
    )
    .unwrap();
    let prices = spec.prices.unwrap();
    assert_eq!(prices.label, "node.kubernetes.io/instance-type");
    assert_eq!(prices.per_hour["p4d.24xlarge"], 32.77);
    assert!(
        serde_json::from_value::<ScaleDownPolicySpec>(
            json!({"prices": {"perHour": {"x": "cheap"}}})
        )
        .is_err()
    );
}

#[test]
fn minimal_placement_history_gets_documented_defaults() {
    let spec: PlacementHistorySpec = serde_json::from_value(ph(vec![role("a")])).unwrap();
    let r = &spec.roles[0];
    assert_eq!(r.policy, ebb_api::placement::PlacementPolicy::Default);
    assert_eq!(r.escalation_timeout.as_duration().as_secs(), 30);
    assert_eq!(r.node_failure_threshold, 3);
    assert_eq!(spec.failure_window.as_duration().as_secs(), 6 * 3600);
    assert_eq!(spec.retention.as_duration().as_secs(), 7 * 86_400);
    assert_eq!(spec.short_lived_threshold.as_duration().as_secs(), 60);
}

#[test]
fn a_bad_duration_in_a_file_names_the_field_problem() {
    let err = serde_json::from_value::<ScaleDownPolicySpec>(json!({"unneededTime": "10 minutes"}))
        .unwrap_err();
    assert!(
        err.to_string().contains("invalid duration \"10 minutes\""),
        "{err}"
    );
}

#[test]
fn duration_pattern_in_schema_matches_the_parser() {
    let schema = schema_of("ScaleDownPolicy");
    let pattern = schema
        .pointer("/properties/spec/properties/unneededTime/pattern")
        .and_then(Value::as_str)
        .unwrap();
    assert_eq!(pattern, ebb_api::duration::DURATION_PATTERN);
}

/// `crds/` and the chart's `charts/ebb/files/crds/` (rendered by its template `crds.yaml`) are
/// generated; both must equal what the code generates now.
#[test]
fn crds_directories_are_up_to_date() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let update = std::env::var_os("EBB_UPDATE_CRDS").is_some();
    let mut stale = vec![];
    for dir in [root.join("crds"), root.join("charts/ebb/files/crds")] {
        for crd in ebb_api::crdgen::crds() {
            let path = dir.join(ebb_api::crdgen::file_name(&crd));
            let want = ebb_api::crdgen::to_yaml(&crd).unwrap();
            if update {
                std::fs::write(&path, &want).unwrap();
                continue;
            }
            let have = std::fs::read_to_string(&path).unwrap_or_default();
            if have != want {
                stale.push(path.display().to_string());
            }
        }
    }
    assert!(
        stale.is_empty(),
        "stale CRD files {stale:?}: regenerate with `EBB_UPDATE_CRDS=1 cargo test -p ebb-api --test validation` \
         (or `cargo run -p ebb-controller -- crds --out-dir crds` and the same for charts/ebb/files/crds)"
    );
}

#[test]
fn cache_retention_is_at_most_30_days() {
    let with = |retention: &str| {
        let mut spec = ph(vec![role("a")]);
        spec["cacheRetention"] = json!(retention);
        spec
    };
    for ok in ["0s", "1h", "90m", "1.5h", "720h", "7d", "30d"] {
        assert_accepted("PlacementHistory", with(ok), None);
    }
    for too_long in ["721h", "31d", "99999h", "1d12h", "365d"] {
        assert_rejected(
            "PlacementHistory",
            with(too_long),
            None,
            "cacheRetention must be at most 30d",
        );
    }
    // the agent caps at the same maximum
    assert_eq!(ebb_api::placement::MAX_CACHE_RETENTION_SECS, 30 * 86_400);
}
