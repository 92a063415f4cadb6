//! The chart's identities on a real cluster: the ServiceAccounts, ClusterRoles, Roles and bindings
//! that Helm renders from `charts/ebb`, applied, and kubeconfigs holding their TokenRequest tokens.
//!
//! Rendering uses the real Helm library (Python package `helm-sdkpy`): the chart is installed
//! without waiting into a throw-away ebb-sim and the release's manifest is read back (the library
//! has no `helm template`); the simulator serves the Prometheus Operator's kinds the chart can
//! create (ServiceMonitor, PrometheusRule) as schemaless CRDs, and a namespace `monitoring`. The node agent's ValidatingAdmissionPolicy is applied as well (the
//! simulator does not serve `admissionregistration.k8s.io`, so Helm leaves it out there; it is
//! taken from its template, which has no templating but the two names). Everything is applied
//! with kubectl as the cluster's admin; the binaries then run with the tokens only.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// The release namespace of the chart as the e2e tests install it.
pub const NAMESPACE: &str = "ebb-system";
/// The release name; the chart's objects are called `ebb-controller` and `ebb-node-agent`.
pub const RELEASE: &str = "ebb";

/// The values the identities are rendered with: node deletion allowed (DrainAndDelete policies
/// need it) and both machine removals' RBAC (Cluster API, Karpenter); everything else is the
/// chart's default.
pub fn e2e_values() -> Value {
    json!({
        "controller": {"allowNodeDeletion": true},
        "removal": {"clusterAPI": {"enabled": true}, "karpenter": {"enabled": true}},
    })
}

/// The chart's ServiceAccount a workspace binary runs as, if it is one of the chart's.
pub fn account_of(binary: &str) -> Option<&'static str> {
    match binary {
        "ebb-controller" => Some("ebb-controller"),
        "ebb-node-agent" => Some("ebb-node-agent"),
        _ => None,
    }
}

/// The user name the API server (and its audit log) gives a token of ServiceAccount `account`.
pub fn username(account: &str) -> String {
    format!("system:serviceaccount:{NAMESPACE}:{account}")
}

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ebb")
}

/// Installs the chart without waiting and prints the release's manifest.
const RENDER_PY: &str = r#"
import asyncio, json, sys
import helm_sdkpy as helm
kubeconfig, namespace, release, chart, values = sys.argv[1:6]
cfg = helm.Configuration(namespace=namespace, kubeconfig=kubeconfig)
try:
    r = asyncio.run(helm.Install(cfg).run(release, chart, values=json.loads(values),
                                          create_namespace=True, wait=False, timeout=60))
except helm.HelmError as e:
    print(json.dumps({"ok": False, "error": str(e)}))
else:
    print(json.dumps({"ok": True, "manifest": r.get("manifest", "")}))
"#;

/// The chart's objects as Helm renders them for release [`RELEASE`] in [`NAMESPACE`] with
/// `values`. Needs python3 with helm-sdkpy (`make test` installs it).
pub fn render(values: &Value) -> anyhow::Result<Vec<Value>> {
    let values = values.to_string();
    // A simulator of its own, on a runtime of its own: callers may be on any runtime, or none.
    let manifest = std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<String> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .context("cannot start a runtime to render the chart")?;
            rt.block_on(async {
                let sim = ebb_sim::Sim::start(ebb_sim::SimConfig::api_only()).await?;
                serve_optional_kinds(&sim.client().await?).await?;
                let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
                let kubeconfig = dir.path().join("kubeconfig");
                sim.write_kubeconfig(&kubeconfig, &["admin"])?;
                let out = tokio::process::Command::new("python3")
                    .arg("-c")
                    .arg(RENDER_PY)
                    .arg(&kubeconfig)
                    .arg(NAMESPACE)
                    .arg(RELEASE)
                    .arg(chart_dir())
                    .arg(&values)
                    .stdin(Stdio::null())
                    .output()
                    .await
                    .context("cannot run python3 (needed to render the chart with helm-sdkpy)")?;
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                if !out.status.success() {
                    bail!(
                        "rendering charts/ebb with helm-sdkpy failed ({}); install it with \
                         `pip install --ignore-requires-python helm-sdkpy`:\n{stdout}\n{stderr}",
                        out.status
                    );
                }
                let report: Value = serde_json::from_str(stdout.trim())
                    .with_context(|| format!("helm-sdkpy's answer is not JSON:\n{stdout}"))?;
                if report["ok"] != json!(true) {
                    bail!("helm install of charts/ebb failed: {}", report["error"]);
                }
                Ok(report["manifest"].as_str().unwrap_or_default().to_string())
            })
        })
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("rendering the chart panicked")))
    })?;
    let mut docs = Vec::new();
    for doc in manifest.split("\n---") {
        let doc: Value = serde_saphyr::from_str(doc)
            .with_context(|| format!("Helm rendered a document that is not YAML:\n{doc}"))?;
        if doc.is_object() {
            docs.push(doc);
        }
    }
    if docs.is_empty() {
        bail!("Helm rendered no objects from charts/ebb");
    }
    Ok(docs)
}

/// The Prometheus Operator's, cert-manager's and admission kinds the chart can create, served as
/// CRDs without a schema (the simulator stores what it is given): Helm needs their mapping to
/// install them. And the namespace `monitoring`, where the dashboard's ConfigMap may go.
async fn serve_optional_kinds(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    // admissionregistration.k8s.io is not served by ebb-sim: as CRDs it is in discovery, so
    // Helm's `.Capabilities.APIVersions.Has` is true and the templates that need it render.
    for (group, kind, plural, scope) in [
        (
            "monitoring.coreos.com",
            "ServiceMonitor",
            "servicemonitors",
            "Namespaced",
        ),
        (
            "monitoring.coreos.com",
            "PrometheusRule",
            "prometheusrules",
            "Namespaced",
        ),
        (
            "cert-manager.io",
            "Certificate",
            "certificates",
            "Namespaced",
        ),
        ("cert-manager.io", "Issuer", "issuers", "Namespaced"),
        (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            "Cluster",
        ),
        (
            "admissionregistration.k8s.io",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            "Cluster",
        ),
        (
            "admissionregistration.k8s.io",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            "Cluster",
        ),
    ] {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group,
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                "scope": scope,
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}],
            },
        }))?;
        crds.create(&Default::default(), &crd)
            .await
            .with_context(|| format!("cannot serve {kind} in the simulator"))?;
    }
    // Where Grafana and Prometheus usually run: a value may put the dashboard there.
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "monitoring"}}))?;
    kube::Api::all(client.clone())
        .create(&Default::default(), &ns)
        .await
        .context("cannot create the namespace monitoring in the simulator")?;
    Ok(())
}

/// The kinds that make up the chart's identities.
const IDENTITY_KINDS: [&str; 5] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// The chart's ServiceAccounts, roles and bindings among `docs`.
pub fn identities(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|d| IDENTITY_KINDS.iter().any(|k| d["kind"] == *k))
        .cloned()
        .collect()
}

/// `templates/node-agent-admission.yaml` for [`RELEASE`] in [`NAMESPACE`] (see
/// [`plain_template`]).
pub fn admission_policy() -> anyhow::Result<Vec<Value>> {
    plain_template("node-agent-admission.yaml", &e2e_values())
}

/// `templates/controller-admission.yaml` (the policy confining the controller's writes to pods
/// and its webhook configuration) for [`RELEASE`] in [`NAMESPACE`]: applied for every
/// real-backend test, so every write the controller makes there passes it.
pub fn controller_policy() -> anyhow::Result<Vec<Value>> {
    plain_template("controller-admission.yaml", &e2e_values())
}

/// `templates/steering-webhook.yaml` (the steering MutatingWebhookConfiguration) for
/// [`RELEASE`] in [`NAMESPACE`] with [`e2e_values`] (see [`plain_template`]). Helm leaves it out
/// of [`render`]: the simulator it renders into does not serve `admissionregistration.k8s.io`.
pub fn steering_webhook() -> anyhow::Result<Vec<Value>> {
    plain_template("steering-webhook.yaml", &e2e_values())
}

/// A template of the chart that has only simple templating, rendered for [`RELEASE`] in
/// [`NAMESPACE`]: Helm's control lines (and label includes) dropped, the two names, the node
/// agent's ServiceAccount and every `{{ .Values.a.b }}` (from the chart's values.yaml with
/// `values` over it) substituted; a line
/// left with `{{` is an error. For what Helm leaves out when it renders into ebb-sim.
pub fn plain_template(name: &str, values: &Value) -> anyhow::Result<Vec<Value>> {
    let path = chart_dir().join("templates").join(name);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let defaults = chart_dir().join("values.yaml");
    let mut all: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(&defaults)
            .with_context(|| format!("cannot read {}", defaults.display()))?,
    )
    .with_context(|| format!("{} is not YAML", defaults.display()))?;
    merge_values(&mut all, values);
    let agent_account = match all.pointer("/nodeAgent/serviceAccount/name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => format!("{RELEASE}-node-agent"),
    };
    let controller_account = match all.pointer("/controller/serviceAccount/name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => format!("{RELEASE}-controller"),
    };
    let mut lines = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("{{")) {
        let mut l = line
            .replace("{{ .Release.Namespace }}", NAMESPACE)
            .replace("{{ include \"ebb.fullname\" . }}", RELEASE)
            .replace(
                "{{ include \"ebb.nodeAgent.serviceAccountName\" . }}",
                &agent_account,
            )
            .replace(
                "{{ include \"ebb.controller.serviceAccountName\" . }}",
                &controller_account,
            );
        while let Some(start) = l.find("{{ .Values.") {
            let Some(len) = l[start..].find(" }}") else {
                break;
            };
            let key = &l[start + "{{ .Values.".len()..start + len];
            let value = key
                .split('.')
                .try_fold(&all, |v, k| v.get(k))
                .with_context(|| format!("{}: no value {key}", path.display()))?;
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            l.replace_range(start..start + len + " }}".len(), &value);
        }
        lines.push(l);
    }
    let plain = lines.join("\n");
    if plain.contains("{{") {
        bail!(
            "{} has templating this renderer does not know",
            path.display()
        );
    }
    plain
        .split("\n---")
        .filter(|d| d.contains("kind:"))
        .map(|d| {
            serde_saphyr::from_str::<Value>(d)
                .with_context(|| format!("{} is not YAML:\n{d}", path.display()))
        })
        .collect()
}

/// `over` merged into `base` as Helm merges values.
fn merge_values(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge_values(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// Helm's rendering with [`e2e_values`], once per test process.
static RENDERED: Mutex<Option<Vec<Value>>> = Mutex::new(None);

fn rendered_e2e() -> anyhow::Result<Vec<Value>> {
    let mut cache = RENDERED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(docs) = &*cache {
        return Ok(docs.clone());
    }
    let docs = render(&e2e_values())?;
    *cache = Some(docs.clone());
    Ok(docs)
}

/// The chart's identities applied on one cluster.
pub struct ChartRbac {
    kubectl: PathBuf,
    admin: PathBuf,
    dir: PathBuf,
}

impl ChartRbac {
    /// Applies the chart's namespace, identities, NodeState admission policy and steering
    /// webhook configuration as rendered by Helm with [`e2e_values`] (`kubectl apply` as the
    /// admin of `admin_kubeconfig`), and waits until the authorizer lets the controller's account
    /// list pods. Kubeconfigs go to `dir`.
    pub fn install(kubectl: &Path, admin_kubeconfig: &Path, dir: &Path) -> anyhow::Result<Self> {
        let docs = rendered_e2e()?;
        let this = Self {
            kubectl: kubectl.to_path_buf(),
            admin: admin_kubeconfig.to_path_buf(),
            dir: dir.to_path_buf(),
        };
        let mut admission = admission_policy()?;
        admission.extend(controller_policy()?);
        admission.extend(steering_webhook()?);
        this.apply(&identities(&docs), &admission)?;
        this.wait_authorized()?;
        Ok(this)
    }

    /// Tokens for the identities a `helm install` of the chart (release [`RELEASE`] in
    /// [`NAMESPACE`]) already made: nothing is applied.
    pub fn installed_by_helm(kubectl: &Path, admin_kubeconfig: &Path, dir: &Path) -> Self {
        Self {
            kubectl: kubectl.to_path_buf(),
            admin: admin_kubeconfig.to_path_buf(),
            dir: dir.to_path_buf(),
        }
    }

    /// Applies `identities` and `policy` (with the namespace first).
    pub fn apply(&self, identities: &[Value], policy: &[Value]) -> anyhow::Result<()> {
        let mut items = vec![json!({"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": NAMESPACE}})];
        items.extend(identities.iter().cloned());
        items.extend(policy.iter().cloned());
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        self.kubectl(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                "ebb-e2e",
                "-f",
                "-",
            ],
            Some(&list.to_string()),
        )?;
        Ok(())
    }

    fn wait_authorized(&self) -> anyhow::Result<()> {
        let user = username("ebb-controller");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.kubectl_output(
                &[
                    "auth",
                    "can-i",
                    "list",
                    "pods",
                    "--all-namespaces",
                    "--as",
                    &user,
                ],
                None,
            )?;
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "yes" {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{user} is still not allowed to list pods 20 s after the chart's ClusterRole \
                     was applied: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A kubeconfig for the cluster whose only credential is a token of ServiceAccount
    /// `account` from the TokenRequest API (one hour), bound to Node `node` when given: the API
    /// server then puts the node's name into the token's user extra
    /// `authentication.kubernetes.io/node-name`, which the NodeState admission policy checks.
    pub fn kubeconfig_for(&self, account: &str, node: Option<&str>) -> anyhow::Result<PathBuf> {
        let mut args = vec![
            "create",
            "token",
            account,
            "-n",
            NAMESPACE,
            "--duration",
            "1h",
        ];
        if let Some(node) = node {
            args.extend(["--bound-object-kind", "Node", "--bound-object-name", node]);
        }
        let token = self.kubectl(&args, None)?.trim().to_string();
        if token.is_empty() {
            bail!("kubectl create token {account} printed no token");
        }
        // The admin's cluster (server, CA) with the token as the only user.
        let text = self.kubectl(&["config", "view", "--raw", "--minify", "--flatten"], None)?;
        let mut cfg: Value = serde_saphyr::from_str(&text)
            .context("the admin kubeconfig (kubectl config view) is not YAML")?;
        let cluster = cfg["clusters"][0]["name"].clone();
        cfg["users"] = json!([{"name": account, "user": {"token": token}}]);
        cfg["contexts"] =
            json!([{"name": account, "context": {"cluster": cluster, "user": account}}]);
        cfg["current-context"] = json!(account);
        let file = self.dir.join(match node {
            Some(n) => format!("kubeconfig-{account}-{n}"),
            None => format!("kubeconfig-{account}"),
        });
        ebb_sim::sim::write_atomically(&file, &serde_json::to_string_pretty(&cfg)?)
            .with_context(|| format!("cannot write {}", file.display()))?;
        Ok(file)
    }

    fn kubectl_output(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> anyhow::Result<std::process::Output> {
        use std::io::Write;
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.admin)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {}", self.kubectl.display()))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .context("cannot write to kubectl's stdin")?;
        }
        child.wait_with_output().context("kubectl did not finish")
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let out = self.kubectl_output(args, stdin)?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The node a node agent's arguments name (`--node-name X` or `--node-name=X`).
pub fn node_name_in(args: &[&str]) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if *a == "--node-name" {
            return it.next().map(|s| s.to_string());
        }
        if let Some(v) = a.strip_prefix("--node-name=") {
            return Some(v.to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_name_is_read_in_both_spellings() {
        assert_eq!(
            node_name_in(&["run", "--node-name", "n1"]).as_deref(),
            Some("n1")
        );
        assert_eq!(
            node_name_in(&["run", "--node-name=n2", "--x"]).as_deref(),
            Some("n2")
        );
        assert_eq!(node_name_in(&["run", "--node-name"]), None);
        assert_eq!(node_name_in(&["run"]), None);
    }

    #[test]
    fn the_steering_webhook_template_renders_with_the_values() {
        let docs = steering_webhook().unwrap();
        assert_eq!(docs.len(), 1);
        let hook = &docs[0]["webhooks"][0];
        assert_eq!(docs[0]["metadata"]["name"], "ebb-steering");
        assert_eq!(hook["timeoutSeconds"], json!(2), "from values.yaml");
        assert_eq!(hook["clientConfig"]["service"]["namespace"], NAMESPACE);
        let docs = plain_template(
            "steering-webhook.yaml",
            &json!({"steering": {"timeoutSeconds": 7}}),
        )
        .unwrap();
        assert_eq!(docs[0]["webhooks"][0]["timeoutSeconds"], json!(7));
    }

    /// A policy and its binding, the policy matching `account`'s requests only.
    fn assert_policy_for(docs: &[Value], account: &str) {
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding"
            ]
        );
        let cond = docs[0]["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap();
        assert!(cond.contains(&username(account)), "{cond}");
    }

    #[test]
    fn the_controller_policy_template_renders_for_the_e2e_release() {
        let docs = controller_policy().unwrap();
        assert_policy_for(&docs, "ebb-controller");
        let text = docs[0].to_string();
        assert!(text.contains("request.namespace == 'ebb-system'"), "{text}");
    }

    #[test]
    fn the_admission_policy_template_renders_for_the_e2e_release() {
        assert_policy_for(&admission_policy().unwrap(), "ebb-node-agent");
    }
}
