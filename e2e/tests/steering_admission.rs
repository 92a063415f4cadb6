//! The steering admission webhook on a real control plane: which pod creations the API server
//! sends it (controller-owned, not placement-gated), that it admits them, that pods are still
//! created and scheduled when the controller is killed or hung (fail-open, bounded by the
//! webhook's timeout), and that the Service's leader label and the registration follow the Lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebb_e2e::harness::{Backend, ChildProcess, wait_for, workspace_binary};
use ebb_e2e::setup::{
    Cluster, Controller, NodeGroup, fetch_metrics, metrics_address, steering_registered_url,
    strip_ansi,
};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The chart's webhook timeout (`steering.timeoutSeconds`), the bound of what a hung controller
/// adds to one pod creation.
const TIMEOUT: Duration = Duration::from_secs(2);
/// What the API server itself may add to a creation on this (shared, loaded) machine.
const API_SLACK: Duration = Duration::from_millis(1500);

async fn cluster() -> Cluster {
    let c = Cluster::start(Backend::Real, 1.0).await.unwrap();
    c.add_nodes(&NodeGroup::plain("n-", 2, "8", "16Gi"))
        .await
        .unwrap();
    c
}

/// Waits until the configuration calls `url` with a CA bundle (the leader registered).
async fn wait_registered(c: &Cluster, url: &str) {
    wait_for(
        &format!("the webhook configuration pointed at {url}"),
        Duration::from_secs(60),
        || async {
            (steering_registered_url(c.client()).await.as_deref() == Some(url)).then_some(())
        },
    )
    .await
    .unwrap();
}

/// The `--steering-webhook-url` a controller was started with (from its log).
fn registered_url(ctl: &Controller) -> Option<String> {
    ctl.lines().iter().find_map(|l| {
        let l = strip_ansi(l);
        if !l.contains("steering webhook registered") {
            return None;
        }
        let start = l.find("https://127.0.0.1:")?;
        Some(
            l[start..]
                .chars()
                .take_while(|c| !matches!(c, '"' | ')' | ' '))
                .collect(),
        )
    })
}

async fn registered(c: &Cluster, ctl: &Controller) -> String {
    let url = wait_for(
        "the controller registers the webhook",
        Duration::from_secs(60),
        || async { registered_url(ctl) },
    )
    .await
    .unwrap();
    wait_registered(c, &url).await;
    url
}

/// `ebb_steering_admissions_total{result}` of the controller (0 when not counted yet).
async fn admissions(ctl: &Controller, result: &str) -> u64 {
    let addr = metrics_address(&ctl.lines()).expect("the controller logged its /metrics address");
    let text = fetch_metrics(&addr, None).await.unwrap();
    let key = format!("ebb_steering_admissions_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap_or(0.0) as u64)
}

/// One pod creation as the API server's audit log recorded it.
#[derive(Debug)]
struct Creation {
    /// The audit annotations (webhook calls are recorded there).
    annotations: BTreeMap<String, String>,
    /// From the request's arrival to the response.
    took: Duration,
}

impl Creation {
    /// The API server called ebb's webhook and it answered without changing the pod.
    fn admitted_unchanged(&self) -> bool {
        self.annotations.values().any(|v| {
            v.contains("\"configuration\":\"ebb-steering\"") && v.contains("\"mutated\":false")
        }) && !self.failed_open()
            && !self
                .annotations
                .keys()
                .any(|k| k.starts_with("patch.webhook"))
    }

    /// The call to ebb's webhook failed and the API server went on without it.
    fn failed_open(&self) -> bool {
        self.annotations
            .iter()
            .any(|(k, v)| k.starts_with("failed-open.mutation.webhook") && v == "steering.ebb.dev")
    }

    /// The API server called ebb's webhook at all.
    fn called(&self) -> bool {
        self.failed_open()
            || self
                .annotations
                .values()
                .any(|v| v.contains("ebb-steering"))
    }
}

/// Successful pod creations in `namespace` from the audit log, by the name the pod got.
fn creations(c: &Cluster, namespace: &str) -> BTreeMap<String, Creation> {
    let dir = c.env.real().expect("a real control plane").dir();
    let text = std::fs::read_to_string(dir.join("audit.log")).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if e["stage"] != "ResponseComplete"
            || e["verb"] != "create"
            || e["objectRef"]["resource"] != "pods"
            || e["objectRef"]["subresource"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
            || e["objectRef"]["namespace"] != namespace
            || e["responseStatus"]["code"] != 201
        {
            continue;
        }
        let Some(name) = e["responseObject"]["metadata"]["name"].as_str() else {
            continue;
        };
        let at = |k: &str| {
            e[k].as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .unwrap_or_else(|| panic!("audit event without {k}: {e}"))
        };
        let took = at("stageTimestamp").duration_since(at("requestReceivedTimestamp"));
        let annotations = e["annotations"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        out.insert(
            name.to_string(),
            Creation {
                annotations,
                took: Duration::try_from(took).unwrap_or_default(),
            },
        );
    }
    out
}

fn pod_template(app: &str, gated: bool) -> Value {
    let mut spec = json!({"terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]});
    if gated {
        spec["schedulingGates"] = json!([{"name": "ebb.dev/placement"}]);
    }
    json!({"metadata": {"labels": {"app": app}}, "spec": spec})
}

async fn create(c: &Cluster, api_version: &str, kind: &str, plural: &str, obj: Value) {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = kube::discovery::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let mut obj = obj;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    let o: DynamicObject = serde_json::from_value(obj).unwrap();
    Api::<DynamicObject>::namespaced_with(c.client().clone(), "default", &ar)
        .create(&PostParams::default(), &o)
        .await
        .unwrap_or_else(|e| panic!("creating {kind}: {e}"));
}

async fn replica_set(c: &Cluster, name: &str, replicas: i32, gated: bool) {
    create(
        c,
        "apps/v1",
        "ReplicaSet",
        "replicasets",
        json!({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": pod_template(name, gated)}}),
    )
    .await;
}

async fn deployment(c: &Cluster, name: &str, replicas: i32) {
    create(
        c,
        "apps/v1",
        "Deployment",
        "deployments",
        json!({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": pod_template(name, false)}}),
    )
    .await;
}

async fn scale(c: &Cluster, kind_plural: &str, name: &str, replicas: i32) {
    let ar = kube::discovery::ApiResource {
        group: "apps".into(),
        version: "v1".into(),
        api_version: "apps/v1".into(),
        kind: String::new(),
        plural: kind_plural.into(),
    };
    Api::<DynamicObject>::namespaced_with(c.client().clone(), "default", &ar)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

/// Pods labelled `app=<app>` in `default`, with their node once scheduled.
async fn pods_of(c: &Cluster, app: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(c.client().clone(), "default")
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
}

/// Waits until `n` pods of `app` exist and are scheduled; returns them.
async fn scheduled(c: &Cluster, app: &str, n: usize, within: Duration) -> Vec<Pod> {
    wait_for(
        &format!("{n} pods of {app} created and scheduled"),
        within,
        || async {
            let pods = pods_of(c, app).await;
            let bound = pods
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .count();
            (pods.len() == n && bound == n).then_some(pods)
        },
    )
    .await
    .unwrap()
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// (a) A ReplicaSet's pods go through the webhook (the API server records the call, the
/// controller counts it) and are admitted unchanged. (c) Pods without a controller owner, pods of
/// a DaemonSet and pods behind the placement gate are never sent (matchConditions).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_owned_pods_go_through_the_webhook_and_others_never_do() {
    let c = cluster().await;
    let ctl = Controller::spawn(&c.env, "ebb-controller", false, "1s").unwrap();
    registered(&c, &ctl).await;

    replica_set(&c, "web", 2, false).await;
    let web = scheduled(&c, "web", 2, Duration::from_secs(60)).await;
    let audit = creations(&c, "default");
    for name in names(&web) {
        let created = audit
            .get(&name)
            .unwrap_or_else(|| panic!("{name} in the audit log"));
        assert!(created.admitted_unchanged(), "{created:?}");
    }
    for p in &web {
        let spec = p.spec.as_ref().unwrap();
        assert!(spec.affinity.is_none(), "admitted unchanged: {spec:?}");
        assert!(spec.scheduling_gates.as_ref().is_none_or(|g| g.is_empty()));
    }
    assert_eq!(admissions(&ctl, "unchanged").await, 2);

    // Not sent: a bare pod, a DaemonSet's pods, a ReplicaSet's pods behind the placement gate.
    ebb_e2e::setup::bare_pod(c.client(), "bare", "n-0")
        .await
        .unwrap();
    create(&c, "apps/v1", "DaemonSet", "daemonsets", json!({
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": pod_template("agent", false)}}))
    .await;
    replica_set(&c, "gated", 2, true).await;
    let agents = wait_for(
        "the DaemonSet's 2 pods",
        Duration::from_secs(60),
        || async {
            let p = pods_of(&c, "agent").await;
            (p.len() == 2).then_some(p)
        },
    )
    .await
    .unwrap();
    let gated = wait_for(
        "the gated ReplicaSet's 2 pods",
        Duration::from_secs(60),
        || async {
            let p = pods_of(&c, "gated").await;
            (p.len() == 2).then_some(p)
        },
    )
    .await
    .unwrap();
    // A positive control after them: the next ReplicaSet pod is counted.
    scale(&c, "replicasets", "web", 3).await;
    scheduled(&c, "web", 3, Duration::from_secs(60)).await;
    let audit = creations(&c, "default");
    let mut not_sent = names(&agents);
    not_sent.extend(names(&gated));
    not_sent.push("bare".into());
    for name in &not_sent {
        let created = audit
            .get(name)
            .unwrap_or_else(|| panic!("{name} in the audit log"));
        assert!(
            !created.called(),
            "{name} was sent to the webhook: {created:?}"
        );
    }
    assert_eq!(
        admissions(&ctl, "unchanged").await,
        3,
        "only the ReplicaSet's three pods were sent"
    );
    assert_eq!(admissions(&ctl, "error").await, 0);
}

/// (b) Fail open: with the controller killed, and with it stopped (a hung webhook), a
/// Deployment scaled up gets all its pods created and scheduled. The bound: each creation waits
/// at most the webhook's timeout (2 s) plus the API server's own time, and when the controller
/// is gone (connection refused) it does not wait at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_are_created_when_the_controller_is_killed_or_hung() {
    let c = cluster().await;
    deployment(&c, "after-kill", 0).await;
    deployment(&c, "while-hung", 0).await;

    let mut ctl = Controller::spawn(&c.env, "ebb-controller", false, "1s").unwrap();
    registered(&c, &ctl).await;
    ctl.kill().await.unwrap();
    let t0 = Instant::now();
    scale(&c, "deployments", "after-kill", 4).await;
    let pods = scheduled(&c, "after-kill", 4, Duration::from_secs(60)).await;
    let killed_took = t0.elapsed();
    let audit = creations(&c, "default");
    for name in names(&pods) {
        let created = &audit[&name];
        assert!(created.failed_open(), "{created:?}");
        assert!(
            created.took < API_SLACK,
            "a refused connection costs no wait: {created:?}"
        );
    }

    let ctl = Controller::spawn(&c.env, "ebb-controller", false, "1s").unwrap();
    registered(&c, &ctl).await;
    let pid = ctl.child.id().expect("the controller runs").to_string();
    signal("STOP", &pid);
    let t0 = Instant::now();
    scale(&c, "deployments", "while-hung", 4).await;
    let scheduled_pods = scheduled(&c, "while-hung", 4, Duration::from_secs(60)).await;
    let hung_took = t0.elapsed();
    signal("CONT", &pid);
    let audit = creations(&c, "default");
    for name in names(&scheduled_pods) {
        let created = &audit[&name];
        assert!(created.failed_open(), "{created:?}");
        assert!(
            created.took >= TIMEOUT - Duration::from_millis(300),
            "the API server waited for the hung webhook: {created:?}"
        );
        assert!(
            created.took <= TIMEOUT + API_SLACK,
            "no longer than the webhook's timeout: {created:?}"
        );
    }
    // The ReplicaSet controller creates 4 pods in slow-start batches of 1, 2 and 1: three
    // rounds of at most the timeout each, against none when the webhook is gone.
    eprintln!(
        "4 pods scheduled in {:.1} s with the controller killed, {:.1} s with it hung",
        killed_took.as_secs_f64(),
        hung_took.as_secs_f64()
    );
    assert!(
        hung_took <= killed_took + 3 * (TIMEOUT + API_SLACK),
        "hung {hung_took:?} vs killed {killed_took:?}"
    );
    drop(ctl);
}

fn signal(sig: &str, pid: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid}");
}

/// A replica as the chart runs it: its Pod named by POD_NAME, leader election on, the steering
/// webhook on a free port with its URL.
struct Replica {
    child: ChildProcess,
    log: Arc<std::sync::Mutex<Vec<String>>>,
    port: u16,
}

fn replica(c: &Cluster, name: &str) -> Replica {
    let port = ebb_e2e::harness::free_port().unwrap();
    let url = format!("https://127.0.0.1:{port}/steer");
    let port_s = port.to_string();
    let args = [
        "run",
        "--metrics-addr",
        "127.0.0.1:0",
        "--namespace",
        "ebb-system",
        "--identity",
        name,
        "--steering-port",
        &port_s,
        "--steering-webhook-url",
        &url,
    ];
    let kubeconfig = c
        .env
        .binary_kubeconfig("ebb-controller", "ebb-controller", &args)
        .unwrap();
    let child = tokio::process::Command::new(workspace_binary("ebb-controller").unwrap())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", format!("{name}-pod"))
        .env("POD_NAMESPACE", "ebb-system")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut child = ChildProcess {
        name: name.into(),
        child,
    };
    let log = child.capture_output();
    Replica { child, log, port }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            eprintln!("---- {} log ----", self.child.name);
            for l in log.iter().rev().take(60).rev() {
                eprintln!("{}", strip_ansi(l));
            }
        }
    }
}

/// The Pods of `names` in ebb-system that carry `ebb.dev/leader=true`.
async fn labelled(c: &Cluster, names: &[&str]) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(c.client().clone(), "ebb-system");
    let mut out = Vec::new();
    for n in names {
        let p = pods.get(&format!("{n}-pod")).await.unwrap();
        if p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("ebb.dev/leader"))
            .is_some_and(|v| v == "true")
        {
            out.push(n.to_string());
        }
    }
    out
}

async fn holder(c: &Cluster) -> Option<String> {
    Api::<Lease>::namespaced(c.client().clone(), "ebb-system")
        .get_opt("ebb-controller")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// (d) Two replicas: only the Lease holder's Pod carries the leader label (what the Service
/// selects) and the configuration calls it; both sign with the CA they share through a Secret,
/// so the leader's caBundle trusts the standby too; the standby answers a review sent to it
/// directly with no patch. When the leader stops, its label goes and the other replica takes
/// over both, writing the same caBundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_label_and_registration_follow_the_lease() {
    let c = cluster().await;
    for name in ["ctl-a", "ctl-b"] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-pod"), "namespace": "ebb-system",
                         "labels": {"app.kubernetes.io/component": "controller"}},
            "spec": {"nodeName": "n-0", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
        }))
        .unwrap();
        Api::<Pod>::namespaced(c.client().clone(), "ebb-system")
            .create(&PostParams::default(), &p)
            .await
            .unwrap();
    }
    let mut replicas = BTreeMap::from([
        ("ctl-a", replica(&c, "ctl-a")),
        ("ctl-b", replica(&c, "ctl-b")),
    ]);
    let leader = wait_for("a leader", Duration::from_secs(60), || holder(&c))
        .await
        .unwrap();
    let standby = if leader == "ctl-a" { "ctl-b" } else { "ctl-a" };
    let leader_url = format!("https://127.0.0.1:{}/steer", replicas[leader.as_str()].port);
    wait_registered(&c, &leader_url).await;
    // One CA for both replicas: the bundle the leader wrote is the shared Secret's, and it
    // trusts the standby's certificate too.
    let bundle = ca_bundle(&c).await;
    let secret =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.client().clone(), "ebb-system")
            .get("ebb-steering-ca")
            .await
            .expect("the replicas' shared CA Secret");
    assert_eq!(
        secret
            .data
            .as_ref()
            .and_then(|d| d.get("ca.crt"))
            .map(|b| &b.0),
        Some(&bundle),
        "the caBundle is the shared CA"
    );
    // Owned by the webhook configuration: uninstalling the chart takes the CA's key with it.
    let config =
        Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(
            c.client().clone(),
        )
        .get("ebb-steering")
        .await
        .unwrap();
    let owners: Vec<(String, String)> = secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| (o.kind.clone(), o.uid.clone()))
        .collect();
    assert_eq!(
        owners,
        vec![(
            "MutatingWebhookConfiguration".to_string(),
            config.metadata.uid.clone().unwrap_or_default()
        )],
        "the CA Secret is owned by the webhook configuration"
    );
    wait_for(
        "the leader's Pod labelled",
        Duration::from_secs(30),
        || async { (labelled(&c, &["ctl-a", "ctl-b"]).await == [leader.clone()]).then_some(()) },
    )
    .await
    .unwrap();

    // The standby serves too (once its caches are synced), and answers without a patch.
    let standby_log = replicas[standby].log.clone();
    wait_for(
        "the standby serves the webhook",
        Duration::from_secs(60),
        || async {
            standby_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|l| l.contains("serving the steering webhook"))
                .then_some(())
        },
    )
    .await
    .unwrap();
    trusted_by(replicas[standby].port, &bundle)
        .await
        .expect("the leader's caBundle trusts the standby's certificate");
    let answer = review_at(replicas[standby].port).await;
    assert_eq!(answer["response"]["uid"], "e2e-1", "{answer}");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    // The leader stops (SIGTERM): its label goes; the standby takes the Lease, registers itself
    // and labels its own Pod.
    let pid = replicas[leader.as_str()]
        .child
        .id()
        .expect("the leader runs")
        .to_string();
    signal("TERM", &pid);
    let standby_url = format!("https://127.0.0.1:{}/steer", replicas[standby].port);
    wait_registered(&c, &standby_url).await;
    wait_for(
        "only the new leader's Pod labelled",
        Duration::from_secs(60),
        || async {
            (labelled(&c, &["ctl-a", "ctl-b"]).await == [standby.to_string()]).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(holder(&c).await.as_deref(), Some(standby));
    assert_eq!(
        ca_bundle(&c).await,
        bundle,
        "the new leader writes the same caBundle"
    );
    replicas.clear();
}

/// The caBundle of the configuration's first webhook.
async fn ca_bundle(c: &Cluster) -> Vec<u8> {
    Api::<MutatingWebhookConfiguration>::all(c.client().clone())
        .get("ebb-steering")
        .await
        .unwrap()
        .webhooks
        .and_then(|w| w.into_iter().next())
        .and_then(|w| w.client_config.ca_bundle)
        .expect("a caBundle")
        .0
}

/// A TLS handshake with `127.0.0.1:<port>` trusting only the CA(s) in `bundle` (PEM), as the API
/// server does.
async fn trusted_by(port: u16, bundle: &[u8]) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(bundle) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Sends one AdmissionReview of a pod to `https://127.0.0.1:<port>/steer` (any certificate:
/// this checks the answer, the API server checks the certificate) and returns the answer.
async fn review_at(port: u16) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "e2e-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default", "operation": "CREATE", "userInfo": {"username": "e2e"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                    "uid": "u", "controller": true}]},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    .to_string();
    tls.write_all(
        format!(
            "POST /steer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap_or_default()).unwrap()
}

/// A verifier that accepts any certificate (checking only the handshake's signatures).
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// ebb-sim serves no admission webhooks: the controller finds no configuration, says once that
/// steering is off and why, and runs as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_ebb_sim_steering_is_off_and_said_once() {
    let c = Cluster::start(Backend::Sim, 10.0).await.unwrap();
    let ctl = Controller::spawn(&c.env, "ebb-controller", false, "1s").unwrap();
    wait_for("the controller acts", Duration::from_secs(30), || async {
        ctl.logged("acting").then_some(())
    })
    .await
    .unwrap();
    let off: Vec<String> = ctl
        .lines()
        .into_iter()
        .filter(|l| l.contains("steering is off"))
        .collect();
    assert_eq!(off.len(), 1, "{off:?}");
    assert!(
        off[0].contains("MutatingWebhookConfiguration ebb-steering does not exist"),
        "{}",
        off[0]
    );
    assert!(!ctl.logged("serving the steering webhook"));
}

/// A CA and a serving certificate for 127.0.0.1 signed by it, as PEM: (CA, leaf, leaf's key).
fn issued() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (ca.pem(), leaf.pem(), key.serialize_pem())
}

/// Sets the configuration's caBundle, as cert-manager's CA injector does.
async fn inject_ca(c: &Cluster, ca_pem: &str) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.client().clone());
    // ByteString serializes as the API's base64.
    let b64 = serde_json::to_value(k8s_openapi::ByteString(ca_pem.as_bytes().to_vec())).unwrap();
    api.patch(
        "ebb-steering",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([
                {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": b64}
            ]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
}

/// (cert-manager) With `--steering-cert-dir` the controller serves the files' certificate, the
/// API server trusts it through the bundle another tool wrote (the controller never writes
/// caBundle), and a renewal in the files is served within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_certificate_kept_by_another_tool_is_served_and_renewed() {
    let c = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let write = |(_, leaf, key): &(String, String, String)| {
        std::fs::write(dir.path().join("tls.crt"), leaf).unwrap();
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
    };
    let first = issued();
    write(&first);
    inject_ca(&c, &first.0).await;
    let port = ebb_e2e::harness::free_port().unwrap();
    let url = format!("https://127.0.0.1:{port}/steer");
    let port_arg = port.to_string();
    let ctl = Controller::spawn_with(
        &c.env,
        "ebb-controller",
        false,
        "1s",
        &[
            "--steering-cert-dir",
            dir.path().to_str().unwrap(),
            "--steering-port",
            &port_arg,
            "--steering-webhook-url",
            &url,
        ],
    )
    .unwrap();
    wait_registered(&c, &url).await;
    assert_eq!(
        ca_bundle(&c).await,
        first.0.as_bytes(),
        "the controller left the injected caBundle as it was"
    );
    trusted_by(port, first.0.as_bytes())
        .await
        .expect("the files' certificate is served");

    replica_set(&c, "web", 2, false).await;
    for name in names(&scheduled(&c, "web", 2, Duration::from_secs(60)).await) {
        let created = &creations(&c, "default")[&name];
        assert!(
            created.admitted_unchanged(),
            "the API server trusted the served certificate: {created:?}"
        );
    }

    // Renewed with a new CA: served within the reload period, and trusted once injected.
    let second = issued();
    write(&second);
    wait_for(
        "the renewed certificate served",
        Duration::from_secs(30),
        || async { trusted_by(port, second.0.as_bytes()).await.ok() },
    )
    .await
    .unwrap();
    assert!(
        trusted_by(port, first.0.as_bytes()).await.is_err(),
        "the old certificate is no longer served"
    );
    inject_ca(&c, &second.0).await;
    scale(&c, "replicasets", "web", 3).await;
    let pods = scheduled(&c, "web", 3, Duration::from_secs(60)).await;
    let audit = creations(&c, "default");
    let admitted = names(&pods)
        .iter()
        .filter(|n| audit[n.as_str()].admitted_unchanged())
        .count();
    assert_eq!(
        admitted, 3,
        "the third pod too, under the renewed certificate"
    );
    assert_eq!(
        ca_bundle(&c).await,
        second.0.as_bytes(),
        "still the injected bundle"
    );
    drop(ctl);
}
