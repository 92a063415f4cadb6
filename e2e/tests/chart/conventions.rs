//! The chart's conventions as Helm renders them (the manifest of an install into a throw-away
//! ebb-sim): scheduling defaults, identities, labels, images, security contexts and the CRDs.

use super::*;

/// The chart rendered by Helm for release `ebb` in `ebb-system` with `values` over its defaults.
pub fn render(values: &Value) -> Vec<Value> {
    require_helm("render");
    ebb_e2e::rbac::render(values).unwrap_or_else(|e| panic!("rendering with {values}: {e:#}"))
}

/// Helm's refusal of `values` (the schema's message).
pub fn render_error(values: &Value) -> String {
    require_helm("render_error");
    match ebb_e2e::rbac::render(values) {
        Ok(_) => panic!("values {values} were accepted"),
        Err(e) => format!("{e:#}"),
    }
}

/// The one object of `kind` named `name` among `docs`.
pub fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {kind} {name} among {:?}",
        docs.iter()
            .map(|d| format!("{} {}", d["kind"], d["metadata"]["name"]))
            .collect::<Vec<_>>()
    );
    found[0]
}

/// The objects of `kind` among `docs`.
pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

fn pod_spec(workload: &Value) -> k8s_openapi::api::core::v1::PodSpec {
    typed(&workload["spec"]["template"]["spec"])
}

fn images(docs: &[Value], deploy: &str, ds: &str) -> (String, String) {
    let c = pod_spec(object(docs, "Deployment", deploy)).containers[0]
        .image
        .clone()
        .unwrap();
    let a = pod_spec(object(docs, "DaemonSet", ds)).containers[0]
        .image
        .clone()
        .unwrap();
    (c, a)
}

#[test]
fn defaults_schedule_like_karpenter_and_cluster_autoscaler() {
    let docs = render(&json!({}));
    let deploy = object(&docs, "Deployment", "ebb-controller");
    let selector = deploy["spec"]["selector"]["matchLabels"].clone();
    let pod = pod_spec(deploy);
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    assert_eq!(
        pod.node_selector.clone().unwrap_or_default(),
        BTreeMap::from([("kubernetes.io/os".to_string(), "linux".to_string())])
    );
    // Two replicas never share a node: required anti-affinity on the hostname, selecting the
    // controller's own pods.
    let anti = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .expect("a pod anti-affinity by default");
    let required = anti
        .required_during_scheduling_ignored_during_execution
        .as_deref()
        .unwrap_or_default();
    assert_eq!(required.len(), 1, "{anti:?}");
    assert_eq!(required[0].topology_key, "kubernetes.io/hostname");
    assert_eq!(
        serde_json::to_value(&required[0].label_selector).unwrap()["matchLabels"],
        selector,
        "the term selects the controller's pods"
    );
    assert!(
        anti.preferred_during_scheduling_ignored_during_execution
            .is_none()
    );
    // A rollout can replace a replica in place when every node already runs one.
    assert_eq!(
        deploy["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})
    );
    // Spread over zones where there are several, never blocking a start.
    let spread = pod.topology_spread_constraints.clone().unwrap_or_default();
    assert_eq!(spread.len(), 1);
    assert_eq!(spread[0].topology_key, "topology.kubernetes.io/zone");
    assert_eq!(spread[0].when_unsatisfiable, "ScheduleAnyway");
    assert_eq!(
        serde_json::to_value(&spread[0].label_selector).unwrap()["matchLabels"],
        selector
    );

    let ds = object(&docs, "DaemonSet", "ebb-node-agent");
    let agent = pod_spec(ds);
    assert_eq!(
        agent.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(
        agent.node_selector.clone().unwrap_or_default(),
        BTreeMap::from([("kubernetes.io/os".to_string(), "linux".to_string())]),
        "the agent is a Linux binary: never scheduled on Windows nodes"
    );
    let tolerations = serde_json::to_value(agent.tolerations.clone().unwrap_or_default()).unwrap();
    assert_eq!(
        tolerations,
        json!([{"operator": "Exists"}]),
        "every taint tolerated, as the boolean it replaces did"
    );
    assert!(agent.affinity.is_none());

    // Images: the registry, the default names and the chart's appVersion.
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        images(&docs, "ebb-controller", "ebb-node-agent"),
        (
            format!("ghcr.io/ebb-dev/ebb-controller:{version}"),
            format!("ghcr.io/ebb-dev/ebb-node-agent:{version}")
        )
    );
    // Identities: both ServiceAccounts made by the chart, named after the release.
    for (sa, workload) in [("ebb-controller", &pod), ("ebb-node-agent", &agent)] {
        let account = object(&docs, "ServiceAccount", sa);
        assert!(account["metadata"]["annotations"].is_null(), "{account}");
        assert_eq!(workload.service_account_name.as_deref(), Some(sa));
    }
    // Security contexts: strict unless overridden.
    assert_hardened(&pod.containers[0], "controller");
    assert_hardened(&agent.containers[0], "node agent");
    assert_eq!(
        pod.containers[0]
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root),
        Some(true)
    );
    assert_eq!(
        pod.security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root),
        Some(true)
    );
    assert!(pod.containers[0].env_from.is_none() && agent.containers[0].env_from.is_none());
}

#[test]
fn anti_affinity_modes_and_an_own_affinity() {
    let anti = |values: Value| -> Option<Value> {
        let docs = render(&values);
        let pod = pod_spec(object(&docs, "Deployment", "ebb-controller"));
        pod.affinity.map(|a| serde_json::to_value(a).unwrap())
    };
    let preferred = anti(json!({"controller": {"podAntiAffinity": "preferred"}})).unwrap();
    let terms = &preferred["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        terms[0]["podAffinityTerm"]["topologyKey"],
        json!("kubernetes.io/hostname"),
        "{preferred}"
    );
    assert!(
        preferred["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_null()
    );
    assert_eq!(
        anti(json!({"controller": {"podAntiAffinity": "none"}})),
        None
    );
    // One replica has nothing to keep apart.
    assert_eq!(anti(json!({"controller": {"replicas": 1}})), None);
    // An affinity of the user's replaces the default entirely.
    let own = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}]}}});
    assert_eq!(
        anti(json!({"controller": {"affinity": own.clone()}})),
        Some(own)
    );
    let err = render_error(&json!({"controller": {"podAntiAffinity": "sometimes"}}));
    assert!(err.contains("/controller/podAntiAffinity"), "{err}");
}

#[test]
fn every_knob_lands_where_it_belongs() {
    let mut all_on =
        yaml_file(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chart/all-on.yaml"));
    // The simulator Helm renders into does not serve NetworkPolicy (the controller's is not
    // guarded by a capability check); the install test covers it on a real API server.
    all_on["networkPolicy"]["enabled"] = json!(false);
    let docs = render(&all_on);
    // fullnameOverride names every object; nameOverride is the app name; additionalLabels are
    // on every object and pod template.
    for d in &docs {
        let name = d["metadata"]["name"].as_str().unwrap();
        let labels = &d["metadata"]["labels"];
        if d["kind"] != "CustomResourceDefinition" && d["kind"] != "ServiceAccount" {
            assert!(name.starts_with("ebb-all-on"), "{} {name}", d["kind"]);
        }
        assert_eq!(labels["team"], json!("platform"), "{} {name}", d["kind"]);
        assert_eq!(
            labels["app.kubernetes.io/name"],
            json!("scaler"),
            "{} {name}",
            d["kind"]
        );
    }
    let deploy = object(&docs, "Deployment", "ebb-all-on-controller");
    let ds = object(&docs, "DaemonSet", "ebb-all-on-node-agent");
    for w in [deploy, ds] {
        let meta = &w["spec"]["template"]["metadata"];
        assert_eq!(meta["labels"]["team"], json!("platform"));
        assert_eq!(meta["annotations"]["example.com/scrape"], json!("true"));
        assert_eq!(
            w["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            json!("scaler")
        );
        assert!(
            w["spec"]["selector"]["matchLabels"]["team"].is_null(),
            "selectors are immutable: additionalLabels stay out of them"
        );
    }
    assert_eq!(
        deploy["spec"]["template"]["metadata"]["labels"]["tier"],
        json!("control")
    );
    assert_eq!(
        ds["spec"]["template"]["metadata"]["labels"]["tier"],
        json!("node")
    );

    // Per-image repository and tag; a digest wins over the tag.
    assert_eq!(
        images(&docs, "ebb-all-on-controller", "ebb-all-on-node-agent"),
        (
            "mirror.example.com/ebb/controller@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".to_string(),
            "mirror.example.com/ebb/node-agent:0.1.0-agent".to_string()
        )
    );

    // ServiceAccounts: the controller's made with its name and annotations; the agent's not
    // made (create: false) but used, bound and named by the admission policy.
    let ctl_sa = object(&docs, "ServiceAccount", "ebb-ctl");
    assert_eq!(
        ctl_sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        json!("arn:aws:iam::123456789012:role/ebb")
    );
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == "ebb-agent-existing"),
        "serviceAccount.create: false makes no ServiceAccount"
    );
    let pod = pod_spec(deploy);
    let agent = pod_spec(ds);
    assert_eq!(pod.service_account_name.as_deref(), Some("ebb-ctl"));
    assert_eq!(
        agent.service_account_name.as_deref(),
        Some("ebb-agent-existing")
    );
    for (kind, name, account) in [
        ("ClusterRoleBinding", "ebb-all-on-controller", "ebb-ctl"),
        ("RoleBinding", "ebb-all-on-controller", "ebb-ctl"),
        (
            "ClusterRoleBinding",
            "ebb-all-on-node-agent",
            "ebb-agent-existing",
        ),
        ("RoleBinding", "ebb-all-on-node-agent", "ebb-agent-existing"),
    ] {
        assert_eq!(
            object(&docs, kind, name)["subjects"][0]["name"],
            json!(account),
            "{kind} {name}"
        );
    }

    // envFrom, extra volumes and mounts on both workloads.
    for (who, spec, env_from) in [
        (
            "controller",
            &pod,
            json!([{"configMapRef": {"name": "ebb-extra-env"}}]),
        ),
        (
            "node agent",
            &agent,
            json!([{"secretRef": {"name": "ebb-agent-env"}}]),
        ),
    ] {
        let c = &spec.containers[0];
        assert_eq!(
            serde_json::to_value(&c.env_from).unwrap(),
            env_from,
            "{who}"
        );
        assert!(
            spec.volumes.iter().flatten().any(|v| v.name == "extra"),
            "{who}: extra volume"
        );
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "extra" && m.mount_path == "/extra"),
            "{who}: extra mount"
        );
        assert_eq!(
            env_of(c).get("EXTRA").map(String::as_str),
            Some("1"),
            "{who}: extraEnv"
        );
    }
    // The management cluster's kubeconfig is still mounted next to the extra volume.
    assert!(
        pod.volumes
            .iter()
            .flatten()
            .any(|v| v.name == "cluster-api-kubeconfig")
    );

    // Security contexts are merged into the strict defaults, not replacing them.
    let sc = pod.containers[0].security_context.clone().unwrap();
    assert_eq!(sc.run_as_user, Some(65533));
    assert_hardened(&pod.containers[0], "controller with runAsUser overridden");
    assert_eq!(
        pod.security_context.as_ref().and_then(|s| s.fs_group),
        Some(65532)
    );
    assert_hardened(&agent.containers[0], "node agent");

    // Scheduling: the user's affinity, spread (with the pods' selector filled in), tolerations
    // and node selectors merged with the OS selector.
    assert!(
        serde_json::to_value(&pod.affinity).unwrap()["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0]["weight"]
            == json!(100)
    );
    let spread = pod.topology_spread_constraints.clone().unwrap();
    assert_eq!(spread[0].when_unsatisfiable, "DoNotSchedule");
    assert_eq!(
        serde_json::to_value(&spread[0].label_selector).unwrap()["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        serde_json::to_value(&agent.tolerations).unwrap(),
        json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}])
    );
    assert_eq!(
        agent.node_selector.clone().unwrap_or_default(),
        BTreeMap::from([
            ("ebb.dev/agent".to_string(), "true".to_string()),
            ("kubernetes.io/os".to_string(), "linux".to_string())
        ])
    );
    assert!(
        serde_json::to_value(&agent.affinity).unwrap()["nodeAffinity"].is_object(),
        "{:?}",
        agent.affinity
    );
}

#[test]
fn crds_are_templates_kept_on_uninstall_and_optional() {
    let docs = render(&json!({}));
    let crds = of_kind(&docs, "CustomResourceDefinition");
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("crds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(crds.len(), files.len(), "one CRD per file of crds/");
    for file in &files {
        let want: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let name = want.metadata.name.clone().unwrap();
        let have: CustomResourceDefinition = typed(
            crds.iter()
                .find(|c| c["metadata"]["name"] == name.as_str())
                .unwrap_or_else(|| panic!("CRD {name} rendered")),
        );
        let mut diff = Vec::new();
        json_diff(
            &serde_json::to_value(&have.spec).unwrap(),
            &serde_json::to_value(&want.spec).unwrap(),
            "spec",
            &mut diff,
        );
        assert!(
            diff.is_empty(),
            "{name} differs from {}: {diff:#?}",
            file.display()
        );
        let meta = &have.metadata;
        assert_eq!(
            meta.annotations
                .as_ref()
                .and_then(|a| a.get("helm.sh/resource-policy"))
                .map(String::as_str),
            Some("keep"),
            "{name}: helm uninstall keeps it"
        );
        assert_eq!(
            meta.labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/instance"))
                .map(String::as_str),
            Some(RELEASE),
            "{name}: labelled as the release's"
        );
    }
    let unkept = render(&json!({"crds": {"keep": false}}));
    for crd in of_kind(&unkept, "CustomResourceDefinition") {
        assert!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"].is_null(),
            "{}",
            crd["metadata"]
        );
    }
    let none = render(&json!({"crds": {"install": false}}));
    assert!(of_kind(&none, "CustomResourceDefinition").is_empty());
    // The chart ships no crds/ directory: Helm would install those once and never upgrade them.
    assert!(!chart_dir().join("crds").exists());
}

#[test]
fn schema_refuses_what_the_templates_cannot_use() {
    for (values, path) in [
        (
            json!({"nodeAgent": {"tolerateAllTaints": false}}),
            "/nodeAgent",
        ),
        (
            json!({"controller": {"image": {"digest": "latest"}}}),
            "/controller/image/digest",
        ),
        (
            json!({"controller": {"image": "ebb-controller"}}),
            "/controller/image",
        ),
        (
            json!({"nodeAgent": {"serviceAccount": {"create": "yes"}}}),
            "/nodeAgent/serviceAccount/create",
        ),
        (json!({"crds": {"install": "true"}}), "/crds/install"),
        (
            json!({"prometheusRule": {"degradedFor": "ten minutes"}}),
            "/prometheusRule/degradedFor",
        ),
        (
            json!({"additionalLabels": {"team": 1}}),
            "/additionalLabels/team",
        ),
    ] {
        let err = render_error(&values);
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "{values}: {err}"
        );
        assert!(err.contains(path), "{values}: {path} not in {err}");
    }
}

#[test]
fn with_cert_manager_the_controller_serves_its_certificate_and_never_owns_the_bundle() {
    let env_names = |d: &Value| -> BTreeSet<String> {
        pod_spec(d).containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| e.name.clone())
            .collect()
    };
    let plain = render(&json!({}));
    assert!(of_kind(&plain, "Certificate").is_empty());
    assert!(of_kind(&plain, "Issuer").is_empty());
    let deploy = object(&plain, "Deployment", "ebb-controller");
    assert!(env_names(deploy).contains("EBB_STEERING_CA_SECRET"));
    assert!(!env_names(deploy).contains("EBB_STEERING_CERT_DIR"));

    let docs = render(&json!({"steering": {"certManager": {"enabled": true},
        "webhookURL": "https://steer.example.internal:8443/steer"}}));
    let cert = object(&docs, "Certificate", "ebb-steering");
    let names: Vec<&str> = cert["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        names,
        [
            "ebb-steering",
            "ebb-steering.ebb-system",
            "ebb-steering.ebb-system.svc",
            "ebb-steering.ebb-system.svc.cluster.local",
            "steer.example.internal"
        ],
        "the Service's names, as the controller's own certificate has them, and the URL's host"
    );
    // With no issuer given, a CA chain of the release's own issues it.
    assert_eq!(cert["spec"]["issuerRef"]["name"], "ebb-steering-ca");
    let ca_issuer = object(&docs, "Issuer", "ebb-steering-ca");
    let ca_cert = object(&docs, "Certificate", "ebb-steering-ca");
    assert_eq!(ca_cert["spec"]["isCA"], true);
    assert_eq!(
        ca_issuer["spec"]["ca"]["secretName"],
        ca_cert["spec"]["secretName"]
    );
    assert_eq!(
        ca_cert["spec"]["issuerRef"]["name"],
        object(&docs, "Issuer", "ebb-steering-selfsigned")["metadata"]["name"]
    );
    // The controller serves the Secret cert-manager writes, mounted where its flag points.
    let deploy = object(&docs, "Deployment", "ebb-controller");
    let spec = pod_spec(deploy);
    let c = &spec.containers[0];
    let env = env_of(c);
    let dir = env
        .get("EBB_STEERING_CERT_DIR")
        .expect("--steering-cert-dir set");
    assert!(!env.contains_key("EBB_STEERING_CA_SECRET"), "{env:?}");
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| &m.mount_path == dir)
        .unwrap_or_else(|| panic!("a volume mounted at {dir}"));
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name.as_deref(),
        cert["spec"]["secretName"].as_str()
    );
    // cert-manager's injector writes the bundle; the controller may not read a CA Secret.
    let hook = object(&docs, "MutatingWebhookConfiguration", "ebb-steering");
    assert_eq!(
        hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "ebb-system/ebb-steering"
    );
    let role = object(&docs, "Role", "ebb-controller");
    assert!(
        !role.to_string().contains("ebb-steering-ca"),
        "no rule on the CA Secret: {role}"
    );

    // An issuer of the user's: no CA chain of the chart's.
    let theirs = render(&json!({"steering": {"certManager": {"enabled": true,
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}}));
    assert!(of_kind(&theirs, "Issuer").is_empty());
    assert_eq!(of_kind(&theirs, "Certificate").len(), 1);
    let cert = object(&theirs, "Certificate", "ebb-steering");
    assert_eq!(
        cert["spec"]["issuerRef"],
        json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
    let err = render_error(&json!({"steering": {"certManager": {"enabled": true,
        "issuerRef": {"kind": "Issuer"}}}}));
    assert!(err.contains("issuerRef.name"), "{err}");
}
