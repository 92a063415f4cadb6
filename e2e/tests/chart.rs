//! The Helm chart `charts/ebb` with the real Helm library (Python package `helm-sdkpy`): lint,
//! schema validation, install into ebb-sim and into a real control plane, upgrade and uninstall.
//! Fails, saying how to install it, when python3 or helm-sdkpy is missing.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ebb_e2e::SimConfig;
use ebb_e2e::harness::{Backend, TestEnv, wait_for, workspace_binary};
use ebb_e2e::scenario::Scenario;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource;
use kube::api::Api;
use serde_json::{Value, json};

#[path = "chart/aggregated_roles.rs"]
mod aggregated_roles;
#[path = "chart/conventions.rs"]
mod conventions;
#[path = "chart/observability.rs"]
mod observability;

const NS: &str = "ebb-system";
const RELEASE: &str = "ebb";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart_dir() -> PathBuf {
    repo().join("charts/ebb")
}

/// Fails the test, saying how to install it, when python3 with helm-sdkpy is missing.
fn require_helm(test: &str) {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import helm_sdkpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{test}: python3 with helm-sdkpy is not installed; `make test` installs it (pip install --ignore-requires-python helm-sdkpy)"
    );
}

/// Runs one action of `tests/chart/helm_chart.py`; returns `Ok(result)` or `Err(Helm's message)`.
async fn helm(args: &[&str]) -> Result<Value, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chart/helm_chart.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(script)
            .args(args)
            .output(),
    )
    .await
    .expect("a Helm action finishes within 120 s")
    .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "helm_chart.py {args:?} crashed:\n{stdout}\n{stderr}"
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: not JSON:\n{stdout}\n{stderr}"));
    if report["ok"] == json!(true) {
        Ok(report["result"].clone())
    } else {
        Err(report["error"].as_str().unwrap_or_default().to_string())
    }
}

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `over` merged into `base` the way Helm merges a values file into the chart's values.
fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// A copy of the chart whose values.yaml is the chart's values with `over` merged in: what
/// `helm lint -f <file>` lints (the library's lint action takes no values file).
fn chart_copy_with(over: &Value) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("ebb");
    copy(&chart_dir(), &chart);
    let mut values = yaml_file(&chart_dir().join("values.yaml"));
    merge(&mut values, over);
    // JSON is YAML.
    std::fs::write(
        chart.join("values.yaml"),
        serde_json::to_string_pretty(&values).unwrap(),
    )
    .unwrap();
    dir
}

/// Lint messages at warning severity or above (Helm: 1 info, 2 warning, 3 error), as
/// `(severity, path)`.
async fn lint_problems(chart: &Path) -> Vec<(i64, String)> {
    let report = helm(&["lint", chart.to_str().unwrap()])
        .await
        .unwrap_or_else(|e| panic!("helm lint failed to run: {e}"));
    assert_eq!(report["TotalChartsLinted"], json!(1), "{report}");
    report["Messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|m| {
            let sev = m["Severity"].as_i64()?;
            (sev >= 2).then(|| (sev, m["Path"].as_str().unwrap_or("").to_string()))
        })
        .collect()
}

#[test]
fn chart_version_and_app_version_are_the_crate_version() {
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let mut section = "";
    let mut crate_version = None;
    for line in cargo.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[workspace.package]"
            && let Some(v) = line.strip_prefix("version")
        {
            crate_version = Some(
                v.trim_start_matches([' ', '='])
                    .trim_matches('"')
                    .to_string(),
            );
        }
    }
    let crate_version = crate_version.expect("[workspace.package] version in Cargo.toml");
    assert_eq!(crate_version, env!("CARGO_PKG_VERSION"));
    let chart = yaml_file(&chart_dir().join("Chart.yaml"));
    assert_eq!(chart["version"], json!(crate_version), "Chart.yaml version");
    assert_eq!(
        chart["appVersion"],
        json!(crate_version),
        "Chart.yaml appVersion"
    );
}

#[tokio::test]
async fn chart_lints_clean_with_defaults_and_with_every_feature_on() {
    require_helm("chart_lints_clean_with_defaults_and_with_every_feature_on");
    assert_eq!(
        lint_problems(&chart_dir()).await,
        vec![],
        "helm lint charts/ebb"
    );
    let all_on =
        yaml_file(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chart/all-on.yaml"));
    let copy = chart_copy_with(&all_on);
    assert_eq!(
        lint_problems(&copy.path().join("ebb")).await,
        vec![],
        "helm lint -f e2e/tests/chart/all-on.yaml"
    );
    // The same lint does report bad values: it runs the schema.
    let bad = chart_copy_with(&json!({"controller": {"replicas": "two"}}));
    let problems = lint_problems(&bad.path().join("ebb")).await;
    assert!(
        problems.contains(&(3, "values.yaml".to_string())),
        "lint of replicas: \"two\" gave {problems:?}"
    );
}

/// The rules as a set of `(apiGroup, resource, verb, resourceName)`, one per combination.
fn flatten(rules: &[PolicyRule]) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        let names = r
            .resource_names
            .clone()
            .unwrap_or_else(|| vec![String::new()]);
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    for n in &names {
                        out.insert((g.clone(), res.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    out
}

/// Expected rules written as `(group, "resource,resource", "verb,verb", resourceName)`.
fn expected(spec: &[(&str, &str, &str, &str)]) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    for (g, resources, verbs, name) in spec {
        for res in resources.split(',') {
            for v in verbs.split(',') {
                out.insert((
                    g.to_string(),
                    res.to_string(),
                    v.to_string(),
                    name.to_string(),
                ));
            }
        }
    }
    out
}

/// What the controller calls (controller/src: reflectors in controller/stores.rs, actuation/
/// nodes.rs and evict.rs, the finalizer and status writes of controller/reconcile.rs, the pod
/// patches and deletes, status writes and NodeState watch of reconcilers/placement/, kube's event
/// recorder).
/// The controller's cluster rules; `removal`: with `removal.clusterAPI.enabled` and
/// `removal.karpenter.enabled` (their rules and nothing more).
fn controller_cluster_rules(
    node_delete: bool,
    removal: bool,
) -> BTreeSet<(String, String, String, String)> {
    let nodes = if node_delete {
        "delete,get,list,patch,watch"
    } else {
        "get,list,patch,watch"
    };
    let mut rules = expected(&[
        ("", "nodes", nodes, ""),
        ("", "pods", "delete,list,patch,watch", ""),
        ("", "pods/eviction", "create", ""),
        ("policy", "poddisruptionbudgets", "list,watch", ""),
        (
            "apps",
            "daemonsets,replicasets,statefulsets",
            "list,watch",
            "",
        ),
        ("batch", "jobs", "list,watch", ""),
        ("", "replicationcontrollers", "list,watch", ""),
        (
            "",
            "persistentvolumeclaims,persistentvolumes",
            "list,watch",
            "",
        ),
        ("storage.k8s.io", "storageclasses", "list,watch", ""),
        ("events.k8s.io", "events", "create,patch", ""),
        ("ebb.dev", "scaledownpolicies", "list,patch,watch", ""),
        ("ebb.dev", "scaledownpolicies/status", "patch", ""),
        ("ebb.dev", "placementhistories", "list,watch", ""),
        ("ebb.dev", "placementhistories/status", "patch", ""),
        ("ebb.dev", "nodestates", "list,watch", ""),
        // steering (on by default): the chart's webhook configuration only
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "get,patch",
            "ebb-steering",
        ),
    ]);
    if removal {
        rules.extend(expected(&[
            ("cluster.x-k8s.io", "machines", "get,list,patch,watch", ""),
            (
                "cluster.x-k8s.io",
                "machinedeployments,machinesets",
                "get,list,watch",
                "",
            ),
            (
                "cluster.x-k8s.io",
                "machinedeployments/scale,machinesets/scale",
                "get,patch,update",
                "",
            ),
            ("karpenter.sh", "nodeclaims", "delete,get,list,watch", ""),
        ]));
    }
    rules
}

/// Environment variables a binary reads: the `[env: NAME=]` of `<binary> run --help`.
fn env_names_of(binary: &str) -> BTreeSet<String> {
    let path = workspace_binary(binary).unwrap();
    let out = std::process::Command::new(path)
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    help.split("[env: ")
        .skip(1)
        .filter_map(|s| s.split('=').next())
        .map(str::to_string)
        .collect()
}

fn env_of(c: &Container) -> BTreeMap<String, String> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

/// Every variable the chart sets is one the binary reads: a flag's `env`, or one of `extra`.
fn assert_env_known(c: &Container, binary: &str, extra: &[&str]) {
    let mut known = env_names_of(binary);
    assert!(known.len() > 3, "{binary} run --help lists its env names");
    known.extend(extra.iter().map(|s| s.to_string()));
    for name in env_of(c).keys() {
        assert!(
            known.contains(name),
            "{binary}: the chart sets {name}, which it does not read"
        );
    }
}

/// Every variable of the binary's `run` flags is set in the container: a flag added to the binary
/// needs a value in the chart (charts/ebb/values.yaml, values.schema.json, the template).
fn assert_every_flag_set(c: &Container, binary: &str) {
    // Set only with an add-on this cluster lacks (cert-manager): the chart's conventions test
    // renders it (`with_cert_manager_the_controller_serves_its_certificate_...`).
    const WITH_ADDONS: [&str; 1] = ["EBB_STEERING_CERT_DIR"];
    let set = env_of(c);
    let missing: Vec<String> = env_names_of(binary)
        .into_iter()
        .filter(|name| !set.contains_key(name) && !WITH_ADDONS.contains(&name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{binary}: the chart cannot set {missing:?}; add a value for each"
    );
}

fn assert_hardened(c: &Container, who: &str) {
    let sc = c
        .security_context
        .as_ref()
        .unwrap_or_else(|| panic!("{who}: securityContext"));
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{who}: readOnlyRootFilesystem"
    );
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{who}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()]),
        "{who}: drop all capabilities"
    );
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.add.clone()),
        None,
        "{who}: no capability added"
    );
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault"),
        "{who}: seccomp"
    );
    assert_ne!(sc.privileged, Some(true), "{who}: not privileged");
}

async fn get<K>(client: &kube::Client, name: &str) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    Api::<K>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .unwrap()
}

async fn get_cluster<K>(client: &kube::Client, name: &str) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K: Resource<Scope = k8s_openapi::ClusterResourceScope>,
{
    Api::<K>::all(client.clone()).get_opt(name).await.unwrap()
}

/// Starts `binary` with the container's args and exactly its environment, as the kubelet would:
/// downward-API fields from `fields`, the container's directories mapped into `dir`, its
/// listen addresses to a free loopback port, and only `KUBECONFIG` added. Its stderr goes to `<dir>/<binary>.log`.
fn start_like(
    c: &Container,
    binary: &str,
    kubeconfig: &Path,
    fields: &BTreeMap<&str, &str>,
    dir: &Path,
) -> tokio::process::Child {
    let mut cmd = tokio::process::Command::new(workspace_binary(binary).unwrap());
    cmd.args(c.args.iter().flatten())
        .env_clear()
        .env("KUBECONFIG", kubeconfig)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{binary}.log"))).unwrap());
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => {
                let path = &from.field_ref.as_ref().expect("fieldRef").field_path;
                fields
                    .get(path.as_str())
                    .unwrap_or_else(|| panic!("no value for the field {path}"))
                    .to_string()
            }
            (None, None) => String::new(),
        };
        // The pod's own network: any free port on the loopback, so tests running at the same
        // time do not collide.
        let mapped = if value.starts_with("0.0.0.0:") || e.name == "EBB_STEERING_PORT" {
            if e.name == "EBB_STEERING_PORT" {
                "0".to_string()
            } else {
                "127.0.0.1:0".to_string()
            }
        } else if value.starts_with('/') {
            dir.join(value.trim_start_matches('/'))
                .to_string_lossy()
                .into_owned()
        } else {
            value
        };
        if let Some(parent) = Path::new(&mapped).parent()
            && mapped.starts_with(dir.to_str().unwrap())
        {
            std::fs::create_dir_all(parent).unwrap();
        }
        cmd.env(&e.name, mapped);
    }
    cmd.spawn().unwrap()
}

/// The paths where `have` and `want` differ, with both values.
fn json_diff(have: &Value, want: &Value, path: &str, out: &mut Vec<String>) {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => {
            for k in h.keys().chain(w.keys()).collect::<BTreeSet<_>>() {
                json_diff(
                    h.get(k).unwrap_or(&Value::Null),
                    w.get(k).unwrap_or(&Value::Null),
                    &format!("{path}.{k}"),
                    out,
                );
            }
        }
        (Value::Array(h), Value::Array(w)) if h.len() == w.len() => {
            for (i, (h, w)) in h.iter().zip(w).enumerate() {
                json_diff(h, w, &format!("{path}[{i}]"), out);
            }
        }
        // A number is its value: the API server and Helm write a default of 1.0 back as 1.
        (Value::Number(h), Value::Number(w)) if h.as_f64() == w.as_f64() => {}
        (h, w) if h != w => out.push(format!("{path}: installed {h}, file {w}")),
        _ => {}
    }
}

fn log_of(dir: &Path, binary: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{binary}.log"))).unwrap_or_default()
}

ebb_e2e::on_both_backends! {
async fn values_schema_rejects_a_string_replica_count(backend) {
    require_helm("values_schema_rejects_a_string_replica_count");
    let env = TestEnv::start_on(backend, SimConfig::api_only(), 0).await.unwrap();
    let chart = chart_dir();
    let err = helm(&[
        "install",
        env.kubeconfig.to_str().unwrap(),
        NS,
        RELEASE,
        chart.to_str().unwrap(),
        r#"{"controller": {"replicas": "two"}}"#,
    ])
    .await
    .expect_err("replicas: \"two\" must be rejected");
    assert!(
        err.contains("values don't meet the specifications of the schema(s)"),
        "{err}"
    );
    assert!(
        err.contains("at '/controller/replicas': got string, want integer"),
        "{err}"
    );
    // Two replicas without leader election would both act: refused too.
    let err = helm(&[
        "install",
        env.kubeconfig.to_str().unwrap(),
        NS,
        RELEASE,
        chart.to_str().unwrap(),
        r#"{"controller": {"leaderElection": false}}"#,
    ])
    .await
    .expect_err("leaderElection: false with 2 replicas must be rejected");
    assert!(
        err.contains("at '/controller/replicas': maximum: got 2, want 1"),
        "{err}"
    );
    assert!(
        get::<Deployment>(&env.client, "ebb-controller")
            .await
            .is_none(),
        "nothing is installed"
    );
}

/// On a real control plane the install also carries what only a real API server serves and
/// enforces (the NodeState ValidatingAdmissionPolicy, the NetworkPolicies), and the binaries
/// started with the chart's environment act with tokens of the ServiceAccounts Helm made.
async fn helm_install_creates_every_object_and_uninstall_keeps_the_crds(backend) {
    require_helm("helm_install_creates_every_object_and_uninstall_keeps_the_crds");
    let (env, node0) = start_with_two_nodes(backend).await;
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_string();
    let chart = chart_dir().to_str().unwrap().to_string();
    let c = env.client.clone();
    install(&kubeconfig, &chart).await;
    assert_real_only_objects(&env, &c).await;
    let (deploy, ds) = assert_default_objects(&c).await;
    assert_controller_rbac(&c).await;
    assert_agent_rbac_and_bindings(&c).await;
    assert_agent_daemonset(&ds);
    let ctrl_c = &deploy.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
    let agent_c = &ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
    assert_hardened_workloads(ctrl_c, agent_c);
    let files = assert_crds_are_those_of_the_repo(&c).await;
    let run_dir = tempfile::tempdir().unwrap();
    let (controller, agent) = start_like_the_chart(&env, ctrl_c, agent_c, node0, run_dir.path());
    assert_binaries_act(&c, node0, run_dir.path(), controller, agent).await;
    upgrade_with_every_option(&env, &c, &kubeconfig, &chart).await;
    assert_upgraded(&c, env.real().is_some()).await;
    assert_uninstall_keeps_the_crds(&c, &kubeconfig, &files).await;
}
}

// ---- the install test's steps ----------------------------------------------------------

/// A cluster with two nodes (ebb-sim's `node-0..1`, kwok's `kwok-node-0..1`) and the name of
/// the first.
async fn start_with_two_nodes(backend: Backend) -> (TestEnv, &'static str) {
    let env = TestEnv::start_on(
        backend,
        SimConfig {
            time_factor: 20.0,
            ..SimConfig::default()
        },
        2,
    )
    .await
    .unwrap();
    let node0 = match env.sim() {
        Some(sim) => {
            Scenario::from_yaml("nodes: {count: 2}")
                .unwrap()
                .load(&sim.api)
                .unwrap();
            "node-0"
        }
        None => "kwok-node-0",
    };
    (env, node0)
}

/// `helm install` with the default values.
async fn install(kubeconfig: &str, chart: &str) {
    let installed = helm(&["install", kubeconfig, NS, RELEASE, chart, "{}"])
        .await
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    assert_eq!(
        installed["info"]["status"],
        json!("deployed"),
        "{installed}"
    );
}

/// A real API server serves and has accepted what ebb-sim does not serve: the NodeState
/// admission policy with its binding, and the node agent's NetworkPolicy.
async fn assert_real_only_objects(env: &TestEnv, c: &kube::Client) {
    if env.real().is_some() {
        for (plural, kind) in [
            ("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
            (
                "validatingadmissionpolicybindings",
                "ValidatingAdmissionPolicyBinding",
            ),
        ] {
            let ar = kube::discovery::ApiResource {
                group: "admissionregistration.k8s.io".into(),
                version: "v1".into(),
                api_version: "admissionregistration.k8s.io/v1".into(),
                kind: kind.into(),
                plural: plural.into(),
            };
            let api: Api<kube::api::DynamicObject> = Api::all_with(c.clone(), &ar);
            assert!(
                api.get_opt("ebb-node-agent-own-nodestate")
                    .await
                    .unwrap()
                    .is_some(),
                "{kind} ebb-node-agent-own-nodestate installed"
            );
        }
        let hook = get_cluster::<MutatingWebhookConfiguration>(c, "ebb-steering")
            .await
            .expect("the steering MutatingWebhookConfiguration installed");
        assert_steering_webhook(&serde_json::to_value(&hook).unwrap());
        let np = get::<k8s_openapi::api::networking::v1::NetworkPolicy>(c, "ebb-node-agent")
            .await
            .expect("the node agent's NetworkPolicy installed");
        assert!(
            np.spec
                .is_some_and(|s| s.egress.is_some_and(|e| !e.is_empty())),
            "the agent's NetworkPolicy limits egress"
        );
    }
}

/// Every object of the default values (helm waited for the workloads to be ready); returns
/// the controller's Deployment and the agent's DaemonSet.
async fn assert_default_objects(c: &kube::Client) -> (Deployment, DaemonSet) {
    for sa in ["ebb-controller", "ebb-node-agent"] {
        assert!(
            get::<ServiceAccount>(c, sa).await.is_some(),
            "ServiceAccount {sa}"
        );
    }
    assert!(get::<Service>(c, "ebb-controller-metrics").await.is_some());
    assert_steering_service(c).await;
    let pdb = get::<PodDisruptionBudget>(c, "ebb-controller")
        .await
        .expect("controller PDB");
    assert_eq!(
        pdb.spec.and_then(|s| s.min_available),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    let deploy = get::<Deployment>(c, "ebb-controller")
        .await
        .expect("Deployment");
    assert_eq!(
        deploy.status.as_ref().and_then(|s| s.ready_replicas),
        Some(2)
    );
    assert_shutdown_fits_the_grace_period(&deploy);
    let ds = get::<DaemonSet>(c, "ebb-node-agent")
        .await
        .expect("DaemonSet");
    assert_eq!(
        ds.status.as_ref().map(|s| s.number_ready),
        Some(2),
        "one agent per node"
    );
    (deploy, ds)
}

/// The steering webhook's Service routes to the leading controller only (the label the leader
/// sets on its own Pod), port 443 to the container's steering port.
async fn assert_steering_service(c: &kube::Client) {
    let svc = get::<Service>(c, "ebb-steering")
        .await
        .expect("the steering Service");
    let spec = svc.spec.unwrap();
    let selector = spec.selector.unwrap_or_default();
    assert_eq!(
        selector.get("ebb.dev/leader").map(String::as_str),
        Some("true"),
        "{selector:?}"
    );
    assert_eq!(
        selector
            .get("app.kubernetes.io/component")
            .map(String::as_str),
        Some("controller")
    );
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.port, 443);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("steering".into()))
    );
    let deploy = get::<Deployment>(c, "ebb-controller").await.unwrap();
    let ctrl = &deploy.spec.unwrap().template.spec.unwrap().containers[0];
    let steering_port = ctrl
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("steering"))
        .expect("the controller's steering port");
    assert_eq!(steering_port.container_port, 9443);
    let env = env_of(ctrl);
    for (name, value) in [
        ("EBB_STEERING", "true"),
        ("EBB_STEERING_PORT", "9443"),
        ("EBB_STEERING_WEBHOOK_NAME", "ebb-steering"),
        ("EBB_STEERING_SERVICE", "ebb-system/ebb-steering"),
    ] {
        assert_eq!(env.get(name).map(String::as_str), Some(value), "{name}");
    }
    let downward: Vec<&str> = ctrl
        .env
        .iter()
        .flatten()
        .filter_map(|e| {
            Some(
                e.value_from
                    .as_ref()?
                    .field_ref
                    .as_ref()?
                    .field_path
                    .as_str(),
            )
        })
        .collect();
    assert_eq!(
        downward,
        ["metadata.name", "metadata.namespace"],
        "POD_NAME and POD_NAMESPACE from the downward API (the leader labels its own Pod)"
    );
}

/// The steering MutatingWebhookConfiguration as installed (or rendered): fail-open, pods CREATE
/// only, short timeout, no side effects, the Service's `/steer`, matchConditions.
fn assert_steering_webhook(config: &Value) {
    let hooks = config["webhooks"].as_array().expect("webhooks");
    assert_eq!(hooks.len(), 1, "{config}");
    let h = &hooks[0];
    assert_eq!(h["name"], "steering.ebb.dev");
    assert_eq!(h["failurePolicy"], "Ignore", "fail open");
    assert_eq!(h["timeoutSeconds"], json!(2));
    assert_eq!(h["sideEffects"], "None");
    assert_eq!(h["reinvocationPolicy"], "Never");
    assert_eq!(h["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(
        h["rules"],
        json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["pods"], "scope": "Namespaced"}])
    );
    let svc = &h["clientConfig"]["service"];
    assert_eq!(
        (
            svc["namespace"].as_str(),
            svc["name"].as_str(),
            svc["path"].as_str(),
            svc["port"].as_i64()
        ),
        (Some(NS), Some("ebb-steering"), Some("/steer"), Some(443))
    );
    let excluded = &h["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(excluded["operator"], "NotIn");
    assert_eq!(excluded["values"], json!(["kube-system", NS]));
    let conditions: Vec<&str> = h["matchConditions"]
        .as_array()
        .expect("matchConditions")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(conditions, ["controller-owned", "not-placement-gated"]);
}

/// The controller's shutdown bound is the pod's grace period less the margin the binary needs,
/// and by default the binary's own default.
fn assert_shutdown_fits_the_grace_period(deploy: &Deployment) {
    use ebb_controller::cli::run::{DEFAULT_SHUTDOWN_TIMEOUT, SHUTDOWN_MARGIN};
    let pod = deploy
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    let grace = pod
        .termination_grace_period_seconds
        .expect("terminationGracePeriodSeconds set");
    let env = env_of(&pod.containers[0]);
    let timeout = env
        .get("EBB_SHUTDOWN_TIMEOUT")
        .expect("EBB_SHUTDOWN_TIMEOUT set");
    assert_eq!(
        timeout,
        &format!("{}s", grace - SHUTDOWN_MARGIN.as_secs() as i64),
        "--shutdown-timeout is the grace period less {SHUTDOWN_MARGIN:?}"
    );
    assert_eq!(
        grace as u64,
        (DEFAULT_SHUTDOWN_TIMEOUT + SHUTDOWN_MARGIN).as_secs(),
        "the chart's default grace period fits the binary's default shutdown bound"
    );
}

/// RBAC: exactly the verbs the controller uses, no wildcard.
async fn assert_controller_rbac(c: &kube::Client) {
    let cr = get_cluster::<ClusterRole>(c, "ebb-controller")
        .await
        .expect("ClusterRole");
    let rules = flatten(cr.rules.as_deref().unwrap_or_default());
    assert!(
        !rules
            .iter()
            .any(|(g, r, v, _)| g == "*" || r == "*" || v == "*"),
        "no wildcard: {rules:?}"
    );
    assert_eq!(
        rules,
        controller_cluster_rules(false, false),
        "controller ClusterRole"
    );
    let role = get::<Role>(c, "ebb-controller")
        .await
        .expect("controller Role");
    assert_eq!(
        flatten(role.rules.as_deref().unwrap_or_default()),
        expected(&[
            ("coordination.k8s.io", "leases", "create", ""),
            (
                "coordination.k8s.io",
                "leases",
                "get,patch",
                "ebb-controller"
            ),
            ("", "secrets", "create", ""),
            ("", "secrets", "get,patch", "ebb-token-keys"),
            ("", "secrets", "get", "ebb-steering-ca"),
        ]),
        "controller Role: the Lease, the token Secret and the steering CA Secret"
    );
}

/// RBAC: exactly the verbs the node agent uses, no wildcard; both bound to the chart's accounts.
async fn assert_agent_rbac_and_bindings(c: &kube::Client) {
    let agent = get_cluster::<ClusterRole>(c, "ebb-node-agent")
        .await
        .expect("agent ClusterRole");
    let agent_rules = flatten(agent.rules.as_deref().unwrap_or_default());
    assert!(
        !agent_rules
            .iter()
            .any(|(g, r, v, _)| g == "*" || r == "*" || v == "*")
    );
    assert_eq!(
        agent_rules,
        expected(&[
            ("", "pods", "list,watch", ""),
            ("", "nodes", "get", ""),
            ("ebb.dev", "nodestates", "create,patch", ""),
            ("ebb.dev", "nodestates/status", "patch", ""),
            ("ebb.dev", "placementhistories", "list,watch", ""),
        ]),
        "node agent ClusterRole"
    );
    let agent_role = get::<Role>(c, "ebb-node-agent").await.expect("agent Role");
    assert_eq!(
        flatten(agent_role.rules.as_deref().unwrap_or_default()),
        expected(&[("", "secrets", "get", "ebb-token-keys")]),
        "node agent Role: only the token Secret"
    );
    for name in ["ebb-controller", "ebb-node-agent"] {
        let crb = get_cluster::<ClusterRoleBinding>(c, name)
            .await
            .expect("ClusterRoleBinding");
        assert_eq!(
            (crb.role_ref.kind.as_str(), crb.role_ref.name.as_str()),
            ("ClusterRole", name)
        );
        let subject = &crb.subjects.as_deref().unwrap_or_default()[0];
        assert_eq!(
            (
                subject.kind.as_str(),
                subject.name.as_str(),
                subject.namespace.as_deref()
            ),
            ("ServiceAccount", name, Some(NS))
        );
        let rb = get::<RoleBinding>(c, name).await.expect("RoleBinding");
        assert_eq!(
            (rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()),
            ("Role", name)
        );
    }
}

/// The DaemonSet: state directory on the host, created if missing, at the path the agent uses;
/// the node name from the downward API, every taint tolerated, never two agents on a node.
fn assert_agent_daemonset(ds: &DaemonSet) {
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let agent_c = &pod.containers[0];
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "state")
        .expect("state volume");
    let host = volume.host_path.as_ref().expect("state is a hostPath");
    assert_eq!(host.path, "/var/lib/ebb");
    assert_eq!(host.type_.as_deref(), Some("DirectoryOrCreate"));
    let mount = agent_c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "state")
        .expect("state mounted");
    let agent_env = env_of(agent_c);
    assert_eq!(agent_env.get("EBB_STATE_DIR"), Some(&mount.mount_path));
    assert_eq!(
        agent_env.get("EBB_TOKEN_SECRET").map(String::as_str),
        Some("ebb-system/ebb-token-keys"),
        "the agent takes namespace/name"
    );
    assert!(
        !agent_env.contains_key("EBB_FILE_ROOTS")
            && !agent_env.contains_key("EBB_FETCH_ALLOW_CIDRS"),
        "file:// and internal addresses are off unless an operator lists them"
    );
    let node_name = agent_c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node_name
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "tolerates every taint"
    );
    let rolling = ds
        .spec
        .as_ref()
        .unwrap()
        .update_strategy
        .as_ref()
        .and_then(|u| u.rolling_update.as_ref());
    assert_eq!(
        rolling.and_then(|r| r.max_surge.clone()),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)),
        "never two agents on one node"
    );
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
}

/// Both workloads are hardened, the controller runs as non-root, both have readiness probes,
/// and every variable the chart sets is one the binaries read.
fn assert_hardened_workloads(ctrl_c: &Container, agent_c: &Container) {
    assert_hardened(ctrl_c, "controller");
    assert_hardened(agent_c, "node agent");
    assert_eq!(
        ctrl_c
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root),
        Some(true)
    );
    assert_eq!(
        ctrl_c
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.as_deref()),
        Some("/readyz")
    );
    assert_eq!(
        agent_c
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.as_deref()),
        Some("/readyz")
    );

    // Every variable the chart sets is one the binaries read.
    assert_env_known(
        ctrl_c,
        "ebb-controller",
        &["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_RESOURCE_ATTRIBUTES"],
    );
    assert_env_known(agent_c, "ebb-node-agent", &["RUST_LOG"]);
}

/// The chart's CRDs are those of crds/ (installed as they are written); returns their files.
async fn assert_crds_are_those_of_the_repo(c: &kube::Client) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("crds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 3);
    for file in &files {
        let want: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let name = want.metadata.name.clone().unwrap();
        let have = get_cluster::<CustomResourceDefinition>(c, &name)
            .await
            .unwrap_or_else(|| panic!("CRD {name} installed"));
        // The real API server writes defaults into the spec: the conversion strategy None and
        // listKind `<kind>List` (ebb-sim keeps the spec as written).
        let mut have_spec = have.spec.clone();
        if want.spec.names.list_kind.is_none()
            && have_spec.names.list_kind.as_deref()
                == Some(format!("{}List", want.spec.names.kind).as_str())
        {
            have_spec.names.list_kind = None;
        }
        if have_spec
            .conversion
            .as_ref()
            .is_some_and(|c| c.strategy == "None" && c.webhook.is_none())
            && want.spec.conversion.is_none()
        {
            have_spec.conversion = None;
        }
        let mut diff = Vec::new();
        json_diff(
            &serde_json::to_value(&have_spec).unwrap(),
            &serde_json::to_value(&want.spec).unwrap(),
            "spec",
            &mut diff,
        );
        assert!(
            diff.is_empty(),
            "CRD {name} differs from {}: {diff:#?}",
            file.display()
        );
    }
    files
}

/// Starts the binaries with exactly the chart's environment. On a real control plane each runs
/// with a TokenRequest token of the ServiceAccount Helm made (the agent's bound to its Node,
/// which the admission policy checks): the chart's RBAC is all they have.
fn start_like_the_chart(
    env: &TestEnv,
    ctrl_c: &Container,
    agent_c: &Container,
    node0: &str,
    run_dir: &Path,
) -> (tokio::process::Child, tokio::process::Child) {
    let fields = BTreeMap::from([
        ("metadata.name", "ebb-controller-chart-test"),
        ("metadata.namespace", NS),
        ("spec.nodeName", node0),
    ]);
    let (ctrl_kubeconfig, agent_kubeconfig) = match env.real() {
        Some(real) => {
            let tokens = ebb_e2e::rbac::ChartRbac::installed_by_helm(
                &real.kubectl().unwrap(),
                &env.kubeconfig,
                run_dir,
            );
            (
                tokens.kubeconfig_for("ebb-controller", None).unwrap(),
                tokens
                    .kubeconfig_for("ebb-node-agent", Some(node0))
                    .unwrap(),
            )
        }
        None => (env.kubeconfig.clone(), env.kubeconfig.clone()),
    };
    let controller = start_like(ctrl_c, "ebb-controller", &ctrl_kubeconfig, &fields, run_dir);
    let agent = start_like(
        agent_c,
        "ebb-node-agent",
        &agent_kubeconfig,
        &fields,
        run_dir,
    );
    (controller, agent)
}

/// The controller takes the Lease and creates the token Secret; the agent (reading that Secret
/// as namespace/name) writes its node's NodeState into its store under EBB_STATE_DIR.
async fn assert_binaries_act(
    c: &kube::Client,
    node0: &str,
    run_dir: &Path,
    mut controller: tokio::process::Child,
    mut agent: tokio::process::Child,
) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(c.clone(), NS);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.clone(), NS);
    let started = wait_for(
        "the controller leads and keeps the token Secret",
        Duration::from_secs(60),
        || async {
            let lease = leases.get_opt("ebb-controller").await.ok()??;
            let holder = lease.spec?.holder_identity?;
            let secret = secrets.get_opt("ebb-token-keys").await.ok()??;
            let has_key = secret.data.is_some_and(|d| d.contains_key("current.key"));
            (holder == "ebb-controller-chart-test" && has_key).then_some(())
        },
    )
    .await;
    assert!(
        started.is_ok(),
        "{started:?}; ebb-controller log:\n{}",
        log_of(run_dir, "ebb-controller")
    );
    let node_states: Api<ebb_api::NodeState> = Api::all(c.clone());
    let reported = wait_for(
        "the agent reports its NodeState",
        Duration::from_secs(60),
        || async {
            let ns = node_states.get_opt(node0).await.ok()??;
            ns.status?.reported_at.map(|_| ())
        },
    )
    .await;
    assert!(
        reported.is_ok(),
        "{reported:?}; ebb-node-agent log:\n{}",
        log_of(run_dir, "ebb-node-agent")
    );
    assert!(
        run_dir
            .join("var/lib/ebb")
            .read_dir()
            .unwrap()
            .next()
            .is_some(),
        "the agent's store is in EBB_STATE_DIR"
    );
    controller.kill().await.unwrap();
    agent.kill().await.unwrap();
}

/// Upgrade with node deletion allowed, traces on and every optional agent setting.
async fn upgrade_with_every_option(env: &TestEnv, c: &kube::Client, kubeconfig: &str, chart: &str) {
    let values = json!({
        "controller": {"allowNodeDeletion": true},
        "removal": {"clusterAPI": {"enabled": true, "managementKubeconfigSecret": "capi-management"},
                    "karpenter": {"enabled": true}},
        "otel": {"endpoint": "http://collector.observability:4317",
                 "resourceAttributes": {"deployment.environment": "test"}},
        "steering": {"webhookURL": "https://ebb-steering.example:8443/steer", "timeoutSeconds": 5,
                     "allowedSources": [{"ipBlock": {"cidr": "10.0.0.0/28"}}]},
        // ebb-sim serves no NetworkPolicies: the real control plane checks them.
        "networkPolicy": {"enabled": env.real().is_some()},
        "nodeAgent": {"resetState": true, "serveSocket": false,
                      "fileRoots": ["/srv/artifacts"],
                      "fetch": {"allowHosts": ["artifacts.internal"],
                                "allowCIDRs": ["10.20.30.0/24"],
                                "clusterCIDRs": ["10.96.0.0/12", "10.244.0.0/16"]}},
    })
    .to_string();
    // kwok holds a terminating pod for its whole grace period (the agent's is 30 s), where the
    // binaries exit at once on SIGTERM: on the real backend the rolling update's old pods are
    // removed as soon as they terminate, as their kubelet would once they exited.
    let reaper = env.real().is_some().then(|| {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), NS);
        tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&Default::default()).await {
                    for p in list.items {
                        if p.metadata.deletion_timestamp.is_some() {
                            let _ = pods
                                .delete(
                                    p.metadata.name.as_deref().unwrap_or_default(),
                                    &kube::api::DeleteParams::default().grace_period(0),
                                )
                                .await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    });
    let upgraded = helm(&["upgrade", kubeconfig, NS, RELEASE, chart, &values]).await;
    if let Some(r) = reaper {
        r.abort();
    }
    upgraded.unwrap_or_else(|e| panic!("helm upgrade: {e}"));
}

/// After the upgrade: delete on nodes appears, the OTel environment is set, the agent's
/// optional flags are ones it reads, and every flag of `run` is set by the chart.
async fn assert_upgraded(c: &kube::Client, network_policies: bool) {
    let cr = get_cluster::<ClusterRole>(c, "ebb-controller")
        .await
        .unwrap();
    assert_eq!(
        flatten(cr.rules.as_deref().unwrap_or_default()),
        controller_cluster_rules(true, true),
        "allowNodeDeletion grants delete on nodes, the removal providers their own rules, nothing else"
    );
    let deploy = get::<Deployment>(c, "ebb-controller").await.unwrap();
    let ctrl_c = deploy.spec.unwrap().template.spec.unwrap().containers[0].clone();
    let ctrl_env = env_of(&ctrl_c);
    assert_eq!(
        ctrl_env
            .get("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(String::as_str),
        Some("http://collector.observability:4317")
    );
    assert_eq!(
        ctrl_env.get("OTEL_RESOURCE_ATTRIBUTES").map(String::as_str),
        Some(format!(
            "service.namespace=ebb-system,service.version={},deployment.environment=test",
            env!("CARGO_PKG_VERSION")
        ))
        .as_deref()
    );
    assert_env_known(
        &ctrl_c,
        "ebb-controller",
        &["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_RESOURCE_ATTRIBUTES"],
    );
    for (name, value) in [
        (
            "EBB_STEERING_WEBHOOK_URL",
            "https://ebb-steering.example:8443/steer",
        ),
        ("EBB_CLUSTER_API", "true"),
        ("EBB_KARPENTER", "true"),
        (
            "EBB_CLUSTER_API_KUBECONFIG",
            "/etc/ebb/cluster-api/kubeconfig",
        ),
    ] {
        assert_eq!(
            ctrl_env.get(name).map(String::as_str),
            Some(value),
            "{name}"
        );
    }
    // The webhook's port admits only the sources named (the control plane's addresses).
    if network_policies {
        assert_webhook_sources(c).await;
    }
    assert_upgraded_binaries(c).await;
}

async fn assert_webhook_sources(c: &kube::Client) {
    let np = get::<k8s_openapi::api::networking::v1::NetworkPolicy>(c, "ebb-controller")
        .await
        .expect("the controller's NetworkPolicy");
    let rules = np.spec.and_then(|s| s.ingress).unwrap_or_default();
    let steering_rule = rules
        .iter()
        .find(|r| {
            r.ports
                .iter()
                .flatten()
                .any(|p| p.port == Some(IntOrString::Int(9443)))
        })
        .expect("a rule for the webhook's port");
    let from = steering_rule.from.clone().unwrap_or_default();
    assert_eq!(from.len(), 1, "{from:?}");
    assert_eq!(
        from[0].ip_block.as_ref().map(|b| b.cidr.as_str()),
        Some("10.0.0.0/28")
    );
}

async fn assert_upgraded_binaries(c: &kube::Client) {
    let deploy = get::<Deployment>(c, "ebb-controller").await.unwrap();
    let ctrl_c = deploy.spec.unwrap().template.spec.unwrap().containers[0].clone();
    let ctrl_env = env_of(&ctrl_c);
    let mgmt = ctrl_c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/etc/ebb/cluster-api")
        .expect("the management cluster's kubeconfig is mounted");
    assert_eq!(mgmt.read_only, Some(true));
    let ds = get::<DaemonSet>(c, "ebb-node-agent").await.unwrap();
    let agent_c = ds.spec.unwrap().template.spec.unwrap().containers[0].clone();
    let agent_env = env_of(&agent_c);
    assert_eq!(
        agent_env.get("EBB_RESET_STATE").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        agent_env.get("EBB_NO_SOCKET").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        agent_env.get("EBB_CLUSTER_CIDRS").map(String::as_str),
        Some("10.96.0.0/12,10.244.0.0/16")
    );
    let root_mount = agent_c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/srv/artifacts")
        .expect("the file root is mounted");
    assert_eq!(root_mount.read_only, Some(true), "file roots are read-only");
    assert_eq!(
        agent_env
            .get("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(String::as_str),
        Some("http://collector.observability:4317"),
        "the node agent exports traces too"
    );
    assert_eq!(
        agent_env.get("OTEL_RESOURCE_ATTRIBUTES"),
        ctrl_env.get("OTEL_RESOURCE_ATTRIBUTES")
    );
    assert_env_known(
        &agent_c,
        "ebb-node-agent",
        &["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_RESOURCE_ATTRIBUTES"],
    );
    // With the optional ones on, every flag of `run` is set by the chart: all are values.
    assert_every_flag_set(&ctrl_c, "ebb-controller");
    assert_every_flag_set(&agent_c, "ebb-node-agent");
}

/// Uninstall removes every object and keeps the CRDs.
async fn assert_uninstall_keeps_the_crds(c: &kube::Client, kubeconfig: &str, files: &[PathBuf]) {
    helm(&["uninstall", kubeconfig, NS, RELEASE])
        .await
        .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
    for name in ["ebb-controller", "ebb-node-agent"] {
        assert!(
            get::<ServiceAccount>(c, name).await.is_none(),
            "ServiceAccount {name} removed"
        );
        assert!(
            get_cluster::<ClusterRole>(c, name).await.is_none(),
            "ClusterRole {name} removed"
        );
        assert!(
            get_cluster::<ClusterRoleBinding>(c, name).await.is_none(),
            "ClusterRoleBinding {name} removed"
        );
        assert!(get::<Role>(c, name).await.is_none(), "Role {name} removed");
        assert!(
            get::<RoleBinding>(c, name).await.is_none(),
            "RoleBinding {name} removed"
        );
    }
    assert!(get::<Deployment>(c, "ebb-controller").await.is_none());
    assert!(get::<DaemonSet>(c, "ebb-node-agent").await.is_none());
    assert!(get::<Service>(c, "ebb-controller-metrics").await.is_none());
    assert!(get::<Service>(c, "ebb-steering").await.is_none());
    // Nothing is left to steer pods created from now on: the API server calls no ebb webhook.
    assert!(
        get_cluster::<MutatingWebhookConfiguration>(c, "ebb-steering")
            .await
            .is_none(),
        "the steering MutatingWebhookConfiguration removed"
    );
    assert!(
        get::<PodDisruptionBudget>(c, "ebb-controller")
            .await
            .is_none()
    );
    for file in files {
        let name = file.file_stem().unwrap().to_str().unwrap();
        assert!(
            get_cluster::<CustomResourceDefinition>(c, name)
                .await
                .is_some(),
            "CRD {name} kept"
        );
    }
}

/// `templates/node-agent-admission.yaml` as Helm renders it for release `ebb` in `ebb-system`:
/// its control lines and label includes dropped, its names and the agent's default
/// ServiceAccount substituted (it has no other templating).
fn rendered_admission_policy() -> Vec<Value> {
    let text =
        std::fs::read_to_string(chart_dir().join("templates/node-agent-admission.yaml")).unwrap();
    let plain: Vec<String> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("{{"))
        .map(|l| {
            l.replace("{{ .Release.Namespace }}", NS)
                .replace("{{ include \"ebb.fullname\" . }}", RELEASE)
                .replace(
                    "{{ include \"ebb.nodeAgent.serviceAccountName\" . }}",
                    &format!("{RELEASE}-node-agent"),
                )
        })
        .collect();
    let plain = plain.join("\n");
    assert!(!plain.contains("{{"), "templating left:\n{plain}");
    plain
        .split("\n---")
        .map(|d| serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("{e}:\n{d}")))
        .collect()
}

/// Evaluates a CEL expression of the policy with kube's CEL engine.
fn cel_eval(expr: &str, vars: &serde_json::Map<String, Value>) -> Value {
    use kube::core::cel::cel;
    let program =
        cel::Program::compile(expr).unwrap_or_else(|e| panic!("{expr} does not compile: {e}"));
    let mut ctx = cel::Context::default();
    for (k, v) in vars {
        ctx.add_variable(k.as_str(), v.clone()).unwrap();
    }
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => json!(b),
        Ok(cel::Value::String(s)) => json!(s.as_str()),
        other => panic!("{expr}: {other:?}"),
    }
}

/// What the policy decides for one request: `None` admitted, `Some(message)` denied. Mirrors the
/// API server: unmatched requests are admitted; variables are evaluated in order.
fn admit(
    policy: &Value,
    user: &str,
    node_extra: Option<&str>,
    operation: &str,
    name: &str,
    object: Value,
    old_object: Value,
) -> Option<String> {
    let mut user_info = json!({"username": user, "groups": ["system:serviceaccounts"]});
    if let Some(n) = node_extra {
        user_info["extra"] = json!({"authentication.kubernetes.io/node-name": [n]});
    }
    let mut vars = serde_json::Map::new();
    vars.insert(
        "request".into(),
        json!({"operation": operation, "name": name, "userInfo": user_info}),
    );
    vars.insert("object".into(), object);
    vars.insert("oldObject".into(), old_object);
    let spec = &policy["spec"];
    for c in spec["matchConditions"].as_array().unwrap() {
        if cel_eval(c["expression"].as_str().unwrap(), &vars) != json!(true) {
            return None;
        }
    }
    let mut variables = serde_json::Map::new();
    for v in spec["variables"].as_array().unwrap() {
        vars.insert("variables".into(), Value::Object(variables.clone()));
        let value = cel_eval(v["expression"].as_str().unwrap(), &vars);
        variables.insert(v["name"].as_str().unwrap().to_string(), value);
    }
    vars.insert("variables".into(), Value::Object(variables));
    for v in spec["validations"].as_array().unwrap() {
        if cel_eval(v["expression"].as_str().unwrap(), &vars) != json!(true) {
            return Some(match v["messageExpression"].as_str() {
                Some(m) => cel_eval(m, &vars).as_str().unwrap().to_string(),
                None => v["message"].as_str().unwrap().to_string(),
            });
        }
    }
    None
}

#[test]
fn node_state_policy_lets_the_agent_write_only_its_own_nodes_state() {
    let docs = rendered_admission_policy();
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("a ValidatingAdmissionPolicy");
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("its binding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rules["apiGroups"], json!(["ebb.dev"]));
    assert_eq!(
        rules["resources"],
        json!(["nodestates", "nodestates/status"])
    );
    assert_eq!(rules["operations"], json!(["CREATE", "UPDATE", "DELETE"]));

    let agent = format!("system:serviceaccount:{NS}:ebb-node-agent");
    let state = |name: &str, node: &str| {
        json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState",
               "metadata": {"name": name}, "spec": {"nodeName": node}})
    };
    let null = Value::Null;
    // its own node: create, status update, delete
    for (op, obj, old) in [
        ("CREATE", state("n1", "n1"), null.clone()),
        ("UPDATE", state("n1", "n1"), state("n1", "n1")),
        ("DELETE", null.clone(), state("n1", "n1")),
    ] {
        assert_eq!(
            admit(policy, &agent, Some("n1"), op, "n1", obj, old),
            None,
            "{op} of its own NodeState"
        );
    }
    // another node's, in every way
    for (op, obj, old) in [
        ("CREATE", state("n2", "n2"), null.clone()),
        ("UPDATE", state("n2", "n2"), state("n2", "n2")),
        ("DELETE", null.clone(), state("n2", "n2")),
    ] {
        let denied = admit(policy, &agent, Some("n1"), op, "n2", obj, old);
        assert!(
            denied.as_deref().is_some_and(|m| m.contains("not n2")),
            "{op} of another node's NodeState: {denied:?}"
        );
    }
    // its own name, describing another node
    assert!(
        admit(
            policy,
            &agent,
            Some("n1"),
            "CREATE",
            "n1",
            state("n1", "n2"),
            null.clone()
        )
        .is_some()
    );
    // credentials without a node (a token not bound to the agent's pod)
    let denied = admit(
        policy,
        &agent,
        None,
        "CREATE",
        "n1",
        state("n1", "n1"),
        null.clone(),
    );
    assert!(
        denied
            .as_deref()
            .is_some_and(|m| m.contains("name no node")),
        "{denied:?}"
    );
    // other identities are not this policy's business (RBAC decides)
    assert_eq!(
        admit(
            policy,
            "kubernetes-admin",
            None,
            "UPDATE",
            "n2",
            state("n2", "n2"),
            state("n2", "n2")
        ),
        None
    );
    assert_eq!(
        admit(
            policy,
            "system:serviceaccount:other:ebb-node-agent",
            Some("n1"),
            "UPDATE",
            "n2",
            state("n2", "n2"),
            null
        ),
        None,
        "a same-named account of another namespace is not the agent"
    );
}

/// Whether the API server sends the creation of `pod` to the steering webhook: every
/// matchCondition of the chart's configuration is true (evaluated with kube's CEL engine).
fn sent_to_steering(config: &Value, pod: Value) -> bool {
    let mut vars = serde_json::Map::new();
    vars.insert("object".into(), pod);
    config["webhooks"][0]["matchConditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| cel_eval(c["expression"].as_str().unwrap(), &vars) == json!(true))
}

#[test]
fn steering_webhook_is_sent_only_controller_owned_pods_outside_the_placement_gate() {
    let docs = ebb_e2e::rbac::plain_template("steering-webhook.yaml", &json!({})).unwrap();
    assert_eq!(docs.len(), 1);
    let config = &docs[0];
    assert_eq!(config["kind"], "MutatingWebhookConfiguration");
    assert_steering_webhook(config);
    let pod = |owners: Value, gates: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "p-", "ownerReferences": owners},
               "spec": {"schedulingGates": gates, "containers": [{"name": "c", "image": "i"}]}})
    };
    let owner = |api: &str, kind: &str, controller: bool| json!([{"apiVersion": api, "kind": kind, "name": "o", "uid": "u", "controller": controller}]);
    for (api, kind) in [
        ("apps/v1", "ReplicaSet"),
        ("apps/v1", "StatefulSet"),
        ("batch/v1", "Job"),
        ("v1", "ReplicationController"),
    ] {
        assert!(
            sent_to_steering(config, pod(owner(api, kind, true), json!([]))),
            "a {kind}'s pod is sent"
        );
        assert!(
            !sent_to_steering(
                config,
                pod(
                    owner(api, kind, true),
                    json!([{"name": "ebb.dev/placement"}])
                )
            ),
            "a {kind}'s pod behind ebb's placement gate is not sent"
        );
    }
    // another gate does not matter
    assert!(sent_to_steering(
        config,
        pod(
            owner("apps/v1", "ReplicaSet", true),
            json!([{"name": "example.com/quota"}])
        )
    ));
    for (why, owners) in [
        ("no owner", json!([])),
        ("a DaemonSet's", owner("apps/v1", "DaemonSet", true)),
        (
            "a non-controller owner",
            owner("apps/v1", "ReplicaSet", false),
        ),
        (
            "a ReplicaSet of another group",
            owner("example.com/v1", "ReplicaSet", true),
        ),
        ("a Node's (mirror pod)", owner("v1", "Node", true)),
    ] {
        assert!(
            !sent_to_steering(config, pod(owners, json!([]))),
            "{why} pod is not sent"
        );
    }
    // fields absent altogether (as the API server gives them)
    let bare = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b"},
                      "spec": {"containers": [{"name": "c", "image": "i"}]}});
    assert!(!sent_to_steering(config, bare));
    let owned_no_gates = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"ownerReferences": owner("apps/v1", "ReplicaSet", true)},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    assert!(sent_to_steering(config, owned_no_gates));
    let no_controller_field = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "o", "uid": "u"}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    assert!(!sent_to_steering(config, no_controller_field));
}
