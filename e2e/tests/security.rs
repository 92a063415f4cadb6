//! What a tenant with only namespaced rights (a PlacementHistory and a pod in its namespace) can
//! make a real `ebb-node-agent` do through `localResources`: every attack here must fail unseen.
//! On ebb-sim and on a real control plane, where the agent has only the chart's ServiceAccount
//! (its token bound to its Node) and the NodeState admission policy applies.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use ebb_api::NodeState;
use ebb_api::nodestate::LocalizedResource;
use ebb_e2e::SimConfig;
use ebb_e2e::harness::{Backend, TestEnv, wait_for, workspace_binary};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

/// How long a test waits for the agent to settle a resource: generous, because the suite runs
/// two clusters at once on two cores; a healthy run settles in seconds.
const WAIT: Duration = Duration::from_secs(90);
const ROLE: &str = "r";

/// A name part unique to this test run (tests may share a real cluster).
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{:x}{:x}", std::process::id(), nanos % 0xff_ffff)
}

/// Hex SHA-256 of a file, computed outside ebb (coreutils).
fn sha256_of(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum runs");
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum prints a digest")
        .to_string()
}

fn sha256_of_bytes(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("b");
    std::fs::write(&f, bytes).unwrap();
    sha256_of(&f)
}

/// A test's cluster with the CRDs, a fresh namespace and a fresh Node for the agent.
struct World {
    env: TestEnv,
    client: kube::Client,
    ns: String,
    node: String,
}

async fn world(backend: Backend) -> World {
    let env = TestEnv::start_on(backend, SimConfig::api_only(), 0)
        .await
        .unwrap();
    let client = env.client.clone();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in ebb_api::crdgen::crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(
            &name,
            &PatchParams::apply("ebb-e2e-security").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
    }
    let id = unique();
    let ns = format!("tenant-{id}");
    let node = format!("sec-{id}");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": node}})).unwrap(),
        )
        .await
        .unwrap();
    let histories: Api<ebb_api::PlacementHistory> = Api::namespaced(client.clone(), &ns);
    wait_for("the PlacementHistory API", WAIT, || async {
        histories.list(&Default::default()).await.ok().map(|_| ())
    })
    .await
    .unwrap();
    World {
        env,
        client,
        ns,
        node,
    }
}

impl World {
    /// A PlacementHistory `name` whose only role declares `resources`, and one pod of it on the
    /// agent's node.
    async fn workload(&self, name: &str, resources: Value) {
        let ph = json!({
            "apiVersion": "ebb.dev/v1alpha1", "kind": "PlacementHistory",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"selector": {"matchLabels": {"app": name}}, "roleLabel": "role",
                     "roles": [{"name": ROLE, "localResources": resources}]},
        });
        Api::<ebb_api::PlacementHistory>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &serde_json::from_value(ph).unwrap())
            .await
            .unwrap();
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns,
                         "labels": {"app": name, "role": ROLE}},
            "spec": {"nodeName": self.node,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        });
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(pod).unwrap(),
            )
            .await
            .unwrap();
    }

    async fn node_state(&self) -> Option<NodeState> {
        Api::<NodeState>::all(self.client.clone())
            .get_opt(&self.node)
            .await
            .ok()
            .flatten()
    }

    /// The NodeState lines of resource `name` of this test's namespace.
    async fn localized(&self, name: &str) -> Vec<LocalizedResource> {
        self.node_state()
            .await
            .and_then(|s| s.status)
            .map(|s| s.localized)
            .unwrap_or_default()
            .into_iter()
            .filter(|l| l.namespace == self.ns && l.name == name)
            .collect()
    }

    /// Waits until resource `name` is `Localized` or `Failed` and returns its line.
    async fn settled(&self, agent: &Agent, name: &str) -> LocalizedResource {
        let r = wait_for(
            &format!("resource {name} Localized or Failed"),
            WAIT,
            || async {
                self.localized(name)
                    .await
                    .into_iter()
                    .find(|l| l.state == "Localized" || l.state == "Failed")
            },
        )
        .await;
        match r {
            Ok(l) => l,
            Err(e) => panic!(
                "{e}; NodeState: {}\nagent log:\n{}",
                serde_json::to_string_pretty(&self.node_state().await).unwrap_or_default(),
                agent.log()
            ),
        }
    }

    async fn cleanup(&self) {
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
        let _ = Api::<Node>::all(self.client.clone())
            .delete(&self.node, &DeleteParams::default())
            .await;
    }
}

/// A running `ebb-node-agent run` for the world's node, its output collected.
struct Agent {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The tasks copying stdout and stderr into `lines`; done once the agent has exited.
    readers: Vec<tokio::task::JoinHandle<()>>,
    dir: PathBuf,
}

/// Options of one agent: extra arguments and environment (settings a tenant cannot change).
#[derive(Default)]
struct AgentOpts<'a> {
    args: Vec<String>,
    env: Vec<(&'a str, String)>,
    /// Serve the node-local API on `<dir>/agent.sock` (otherwise `--no-socket`).
    socket: bool,
    /// `--listen-addr` (default: a free loopback port).
    listen: Option<SocketAddr>,
}

impl Agent {
    fn spawn(w: &World, dir: &Path, opts: AgentOpts<'_>) -> Agent {
        let mut args: Vec<String> = [
            "run",
            "--node-name",
            &w.node,
            "--state-dir",
            dir.join("state").to_str().unwrap(),
            "--cache-dir",
            dir.join("cache").to_str().unwrap(),
            "--report-interval-secs",
            "1",
            "--token-secret",
            "ebb-system/ebb-token-keys",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match opts.listen {
            Some(a) => args.extend(["--listen-addr".into(), a.to_string()]),
            None => args.extend(["--listen-addr".into(), "127.0.0.1:0".into()]),
        }
        if opts.socket {
            args.extend([
                "--socket".into(),
                dir.join("agent.sock").to_str().unwrap().to_string(),
            ]);
        } else {
            args.push("--no-socket".into());
        }
        args.extend(opts.args);
        // On the real backend: the chart's ServiceAccount, its token bound to the node.
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let kubeconfig = w
            .env
            .binary_kubeconfig("ebb-node-agent", "ebb-node-agent", &arg_refs)
            .unwrap();
        let mut cmd = tokio::process::Command::new(workspace_binary("ebb-node-agent").unwrap());
        cmd.args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let pipes: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = vec![
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        let readers = pipes
            .into_iter()
            .map(|pipe| {
                let lines = lines.clone();
                tokio::spawn(async move {
                    let mut r = tokio::io::BufReader::new(pipe).lines();
                    while let Ok(Some(l)) = r.next_line().await {
                        lines.lock().unwrap().push(l);
                    }
                })
            })
            .collect();
        Agent {
            child,
            lines,
            readers,
            dir: dir.to_path_buf(),
        }
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The whole log of an agent that has exited: waits for its pipes to be read to the end.
    async fn exited_log(&mut self) -> String {
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(10), r).await;
        }
        self.log()
    }

    /// `ebb-node-agent dump` of this agent's store, as text.
    async fn dump(&self) -> String {
        let out = tokio::process::Command::new(workspace_binary("ebb-node-agent").unwrap())
            .args(["dump", "--state-dir"])
            .arg(self.dir.join("state"))
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Every regular file under `dir` with its content.
fn files_under(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ty) = e.file_type() else { continue };
            if ty.is_dir() {
                stack.push(p);
            } else if ty.is_file() {
                out.insert(p.clone(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// A local HTTP server that records every request path; `respond` answers each.
struct Server {
    addr: SocketAddr,
    hits: Arc<Mutex<Vec<String>>>,
}

impl Server {
    async fn start(
        bind: &str,
        respond: impl Fn(&str) -> Response + Clone + Send + Sync + 'static,
    ) -> Server {
        let hits: Arc<Mutex<Vec<String>>> = Arc::default();
        let h = hits.clone();
        let app = Router::new().fallback(move |uri: Uri| {
            let h = h.clone();
            let respond = respond.clone();
            async move {
                h.lock().unwrap().push(uri.path().to_string());
                respond(uri.path())
            }
        });
        let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server { addr, hits }
    }

    fn count(&self) -> usize {
        self.hits.lock().unwrap().len()
    }

    fn count_of(&self, path: &str) -> usize {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.as_str() == path)
            .count()
    }
}

fn body(bytes: &'static [u8]) -> Response {
    (StatusCode::OK, bytes).into_response()
}

/// Lets the agent reach the test's loopback servers: an operator's setting, not a tenant's.
fn allow_loopback() -> Vec<(&'static str, String)> {
    vec![("EBB_FETCH_ALLOW_CIDRS", "127.0.0.1/32".to_string())]
}

ebb_e2e::on_both_backends! {
async fn file_url_outside_the_roots_reveals_no_digest(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    // What the agent can read and a tenant must not learn anything about (its token, say).
    let secret = dir.path().join("outside/token");
    std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
    std::fs::write(&secret, format!("eyJhbGciOi.secret.{}", unique())).unwrap();
    let real = sha256_of(&secret);
    let agent = Agent::spawn(&w, dir.path(), AgentOpts::default());
    w.workload(
        "probe",
        json!([{"name": "tok", "url": format!("file://{}", secret.display()), "sha256": "0".repeat(64)}]),
    )
    .await;
    let line = w.settled(&agent, "tok").await;
    assert_eq!(line.state, "Failed", "{line:?}");
    let message = line.message.unwrap_or_default();
    assert!(
        !message.contains(&real),
        "NodeState reveals the file's digest: {message}"
    );
    let dump = agent.dump().await;
    assert!(!dump.contains(&real), "dump reveals the digest: {dump}");
    assert!(
        !agent.log().contains(&real),
        "the log reveals the digest:\n{}",
        agent.log()
    );
    w.cleanup().await;
}

async fn file_url_with_the_right_digest_copies_nothing(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("outside/token");
    std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
    let content = format!("eyJhbGciOi.secret.{}", unique());
    std::fs::write(&secret, &content).unwrap();
    // The attacker knows the digest (learnt elsewhere, or guessed for a well-known file).
    let real = sha256_of(&secret);
    let agent = Agent::spawn(&w, dir.path(), AgentOpts::default());
    w.workload(
        "copy",
        json!([{"name": "tok", "url": format!("file://{}", secret.display()), "sha256": real}]),
    )
    .await;
    let line = w.settled(&agent, "tok").await;
    let copies: Vec<PathBuf> = files_under(&dir.path().join("cache"))
        .into_iter()
        .filter(|(_, c)| c == content.as_bytes())
        .map(|(p, _)| p)
        .collect();
    assert!(copies.is_empty(), "the file was copied to {copies:?}");
    assert_eq!(line.state, "Failed", "{line:?}");
    w.cleanup().await;
}

async fn file_url_under_an_operator_root_is_localized_but_symlinks_out_are_not(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("artifacts");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("model.bin"), b"weights v1").unwrap();
    let secret = dir.path().join("token");
    std::fs::write(&secret, b"secret").unwrap();
    std::os::unix::fs::symlink(&secret, root.join("link")).unwrap();
    let agent = Agent::spawn(
        &w,
        dir.path(),
        AgentOpts {
            env: vec![("EBB_FILE_ROOTS", root.to_str().unwrap().to_string())],
            ..AgentOpts::default()
        },
    );
    w.workload(
        "rooted",
        json!([
            {"name": "model", "url": format!("file://{}/model.bin", root.display()),
             "sha256": sha256_of(&root.join("model.bin"))},
            {"name": "link", "url": format!("file://{}/link", root.display()),
             "sha256": sha256_of(&secret)},
        ]),
    )
    .await;
    assert_eq!(w.settled(&agent, "model").await.state, "Localized");
    assert_eq!(w.settled(&agent, "link").await.state, "Failed");
    let copied = files_under(&dir.path().join("cache"));
    assert!(
        !copied.values().any(|c| c == b"secret"),
        "a symlink inside the root was followed: {:?}",
        copied.keys()
    );
    assert!(copied.values().any(|c| c == b"weights v1"));
    w.cleanup().await;
}

async fn loopback_urls_are_never_requested(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start("127.0.0.1:0", |_| body(b"internal")).await;
    let port = server.addr.port();
    let agent = Agent::spawn(&w, dir.path(), AgentOpts::default());
    let sha = "0".repeat(64);
    w.workload(
        "ssrf",
        json!([
            {"name": "literal", "url": format!("http://127.0.0.1:{port}/literal"), "sha256": sha},
            {"name": "name", "url": format!("http://localhost:{port}/name"), "sha256": sha},
            {"name": "mapped", "url": format!("http://[::ffff:127.0.0.1]:{port}/mapped"), "sha256": sha},
            {"name": "decimal", "url": format!("http://2130706433:{port}/decimal"), "sha256": sha},
        ]),
    )
    .await;
    for name in ["literal", "name", "mapped", "decimal"] {
        let line = w.settled(&agent, name).await;
        assert_eq!(line.state, "Failed", "{line:?}");
    }
    assert_eq!(
        server.count(),
        0,
        "the agent requested {:?}",
        server.hits.lock().unwrap()
    );
    w.cleanup().await;
}

async fn redirects_to_forbidden_addresses_are_not_followed(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    // 127.0.0.2 is not allowed (only 127.0.0.1/32 is).
    let inner = Server::start("127.0.0.2:0", |_| body(b"internal")).await;
    let target = format!("http://127.0.0.2:{}/secret", inner.addr.port());
    let outer = Server::start("127.0.0.1:0", move |_| {
        (StatusCode::FOUND, [(header::LOCATION, target.clone())]).into_response()
    })
    .await;
    let agent = Agent::spawn(
        &w,
        dir.path(),
        AgentOpts {
            env: allow_loopback(),
            ..AgentOpts::default()
        },
    );
    w.workload(
        "redirect",
        json!([{"name": "r", "url": format!("http://127.0.0.1:{}/start", outer.addr.port()),
                "sha256": sha256_of_bytes(b"internal")}]),
    )
    .await;
    let line = w.settled(&agent, "r").await;
    assert_eq!(line.state, "Failed", "{line:?}");
    assert!(outer.count() >= 1, "the allowed server was asked");
    assert_eq!(inner.count(), 0, "the redirect target was requested");
    w.cleanup().await;
}

async fn a_resource_beyond_the_namespace_quota_is_refused_unfetched(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    // 700 bytes kept by "one"; "two" may take 600 more: past the namespace's 1000.
    static FIRST: [u8; 700] = [b'1'; 700];
    let server = Server::start("127.0.0.1:0", |p| match p {
        "/one" => body(&FIRST),
        _ => body(b"second artifact"),
    })
    .await;
    let mut env = allow_loopback();
    env.push(("EBB_NAMESPACE_QUOTA_BYTES", "1000".into()));
    let agent = Agent::spawn(
        &w,
        dir.path(),
        AgentOpts {
            env,
            ..AgentOpts::default()
        },
    );
    let base = format!("http://127.0.0.1:{}", server.addr.port());
    w.workload(
        "quota",
        json!([
            {"name": "one", "url": format!("{base}/one"), "sha256": sha256_of_bytes(&FIRST), "maxBytes": 800},
            {"name": "two", "url": format!("{base}/two"), "sha256": sha256_of_bytes(b"second artifact"), "maxBytes": 600},
        ]),
    )
    .await;
    assert_eq!(w.settled(&agent, "one").await.state, "Localized");
    let two = w.settled(&agent, "two").await;
    assert_eq!(two.state, "Failed", "{two:?}");
    assert!(
        two.message.as_deref().unwrap_or_default().contains("quota"),
        "{two:?}"
    );
    assert_eq!(
        server.count_of("/two"),
        0,
        "the refused resource was fetched"
    );
    w.cleanup().await;
}

async fn a_failed_fetch_backs_off_across_pod_events(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start("127.0.0.1:0", |_| body(b"not what was promised")).await;
    let agent = Agent::spawn(
        &w,
        dir.path(),
        AgentOpts {
            env: allow_loopback(),
            ..AgentOpts::default()
        },
    );
    w.workload(
        "storm",
        json!([{"name": "bad", "url": format!("http://127.0.0.1:{}/bad", server.addr.port()),
                "sha256": "0".repeat(64)}]),
    )
    .await;
    assert_eq!(w.settled(&agent, "bad").await.state, "Failed");
    let before = server.count();
    assert!(before >= 1);
    let pods: Api<Pod> = Api::namespaced(w.client.clone(), &w.ns);
    for i in 0..100 {
        pods.patch(
            "storm",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"poke": i.to_string()}}})),
        )
        .await
        .unwrap();
    }
    // Let the agent see every event.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let fetches = server.count();
    assert!(
        fetches <= 3,
        "100 pod events started {} fetches of a failed resource (1 before the events)",
        fetches
    );
    w.cleanup().await;
}

async fn a_symlink_planted_in_the_cache_leaves_its_target_untouched(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    let content: &'static [u8] = b"artifact content";
    let sha = sha256_of_bytes(content);
    let server = Server::start("127.0.0.1:0", move |_| body(content)).await;
    let agent = Agent::spawn(
        &w,
        dir.path(),
        AgentOpts {
            env: allow_loopback(),
            ..AgentOpts::default()
        },
    );
    wait_for("the agent's first NodeState", WAIT, || async {
        w.node_state().await.and_then(|s| s.status).map(|_| ())
    })
    .await
    .unwrap();
    // Someone with write access to the cache plants a link where the resource's directory goes.
    let public = dir.path().join("cache/public");
    std::fs::create_dir_all(&public).unwrap();
    std::os::unix::fs::symlink(&victim, public.join(&sha)).unwrap();
    w.workload(
        "planted",
        json!([{"name": "blob", "url": format!("http://127.0.0.1:{}/blob", server.addr.port()),
                "sha256": sha, "scope": "Public"}]),
    )
    .await;
    let line = w.settled(&agent, "blob").await;
    assert_eq!(
        files_under(&victim),
        BTreeMap::new(),
        "the agent wrote through the symlink ({line:?})"
    );
    assert_eq!(line.state, "Failed", "{line:?}");
    w.cleanup().await;
}

async fn a_cache_dir_holding_unknown_files_is_refused_and_kept(backend) {
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(cache.join("etc")).unwrap();
    std::fs::write(cache.join("etc/precious.conf"), b"keep me").unwrap();
    let mut agent = Agent::spawn(&w, dir.path(), AgentOpts::default());
    let status = match tokio::time::timeout(Duration::from_secs(30), agent.child.wait()).await {
        Ok(s) => s.unwrap(),
        Err(_) => panic!(
            "the agent kept running on a foreign --cache-dir:\n{}",
            agent.log()
        ),
    };
    let log = agent.exited_log().await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("--cache-dir"), "{log}");
    assert_eq!(
        std::fs::read(cache.join("etc/precious.conf"))
            .ok()
            .as_deref(),
        Some(&b"keep me"[..]),
        "a file of the directory was deleted"
    );
    w.cleanup().await;
}

async fn the_node_local_api_is_served_only_on_its_socket(backend) {
    use std::os::unix::fs::PermissionsExt;
    let w = world(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let agent = Agent::spawn(
        &w,
        dir.path(),
        AgentOpts {
            socket: true,
            listen: Some(port),
            ..AgentOpts::default()
        },
    );
    let http = HttpClient;
    let base = format!("http://{port}");
    let ready = wait_for("the agent's /readyz", WAIT, || async {
        let r = http.get(format!("{base}/readyz")).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    assert!(ready.is_ok(), "{ready:?}\n{}", agent.log());
    let resources = http
        .get(format!("{base}/v1/resources"))
        .header("Authorization", "Bearer ebb1.k.1.u.00.r")
        .send()
        .await
        .unwrap();
    assert_eq!(
        resources.status(),
        404,
        "the node-local API answers on the TCP port"
    );
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200, "metrics stay on the port");
    let mode = std::fs::metadata(dir.path().join("agent.sock"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "socket mode {mode:o}");
    w.cleanup().await;
}
}

/// Minimal HTTP/1.1 GET over TCP, enough for the agent's probes port.
struct HttpClient;

struct Req {
    url: String,
    headers: Vec<(String, String)>,
}

struct Resp {
    status: u16,
}

impl Resp {
    fn status(&self) -> u16 {
        self.status
    }
}

impl HttpClient {
    fn get(&self, url: String) -> Req {
        Req {
            url,
            headers: vec![],
        }
    }
}

impl Req {
    fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }

    async fn send(self) -> std::io::Result<Resp> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rest = self.url.trim_start_matches("http://");
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut s = tokio::net::TcpStream::connect(host).await?;
        let mut req = format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
        for (k, v) in &self.headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok(Resp { status })
    }
}

/// The chart's ValidatingAdmissionPolicy: an agent's identity may write only the NodeState of the
/// node its credentials name. Needs a real API server (ebb-sim does not run admission policies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_state_of_another_node_is_denied() {
    // Always on a real control plane: ebb-sim does not run ValidatingAdmissionPolicies.
    let env = TestEnv::start_real(0).await.unwrap();
    real_backend::node_state_of_another_node_is_denied(&env).await;
}

/// The chart's confinement of the controller (a ValidatingAdmissionPolicy): as the controller's
/// ServiceAccount, every write beyond what ebb does (a tenant pod's image, labels, annotations,
/// tolerations or finalizers, the leader label outside its namespace, deleting a pod it did not
/// pin, the webhook's rules, failure policy or existence) is refused; what ebb does (releasing a
/// gated pod, its leader label, pointing the webhook at itself, deleting a pod it pinned) is let
/// through. Real control plane only: ebb-sim runs no admission policies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_writes_beyond_its_job_are_refused() {
    let env = TestEnv::start_real(0).await.unwrap();
    real_backend::controller_writes_are_confined(&env).await;
}

mod real_backend {
    //! The admission-policy test, against a real API server.

    use super::*;
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::DynamicObject;
    use kube::discovery::ApiResource;

    /// `charts/ebb/templates/node-agent-admission.yaml` rendered for release `ebb` in
    /// `namespace` (see [`rendered_template`]).
    pub fn rendered_policy(namespace: &str, name: &str) -> Vec<Value> {
        rendered_template("node-agent-admission.yaml", namespace, name)
    }

    /// A chart template holding one ValidatingAdmissionPolicy and its binding, rendered for
    /// release `ebb` in `namespace`: Helm's control lines dropped, the names (and the default
    /// ServiceAccounts) substituted; the policy and its binding renamed `name` so the test never
    /// touches an installed chart's.
    pub fn rendered_template(file: &str, namespace: &str, name: &str) -> Vec<Value> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../charts/ebb/templates")
            .join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let plain: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("{{"))
            .map(|l| {
                l.replace("{{ .Release.Namespace }}", namespace)
                    .replace("{{ include \"ebb.fullname\" . }}", "ebb")
                    .replace(
                        "{{ include \"ebb.nodeAgent.serviceAccountName\" . }}",
                        "ebb-node-agent",
                    )
                    .replace(
                        "{{ include \"ebb.controller.serviceAccountName\" . }}",
                        "ebb-controller",
                    )
            })
            .collect::<Vec<_>>()
            .join("\n");
        plain
            .split("\n---")
            .filter(|d| d.contains("kind:"))
            .map(|d| {
                let mut doc = serde_saphyr::from_str::<Value>(d).unwrap();
                doc["metadata"]["name"] = json!(name);
                if doc["kind"] == "ValidatingAdmissionPolicyBinding" {
                    doc["spec"]["policyName"] = json!(name);
                }
                doc
            })
            .collect()
    }

    fn resource_of(doc: &Value) -> ApiResource {
        let api_version = doc["apiVersion"].as_str().unwrap();
        let (group, version) = api_version.split_once('/').unwrap();
        let kind = doc["kind"].as_str().unwrap();
        let plural = match kind {
            "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
            other => panic!("unexpected kind {other} in the policy template"),
        };
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    async fn apply(client: &kube::Client, doc: &Value) {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource_of(doc));
        let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        api.patch(
            doc["metadata"]["name"].as_str().unwrap(),
            &PatchParams::apply("ebb-e2e-security").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap();
    }

    pub async fn node_state_of_another_node_is_denied(env: &TestEnv) {
        let c = env.client.clone();
        let id = unique();
        let ns = format!("ebb-vap-{id}");
        let (own, other) = (format!("vap-own-{id}"), format!("vap-other-{id}"));
        Api::<Namespace>::all(c.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .unwrap();
        for n in [&own, &other] {
            Api::<Node>::all(c.clone())
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap(),
                )
                .await
                .unwrap();
        }
        for crd in ebb_api::crdgen::crds() {
            let name = crd.metadata.name.clone().unwrap();
            Api::<CustomResourceDefinition>::all(c.clone())
                .patch(
                    &name,
                    &PatchParams::apply("ebb-e2e-security").force(),
                    &Patch::Apply(&crd),
                )
                .await
                .unwrap();
        }
        // The agent's identity as the chart makes it: ServiceAccount ebb-node-agent, allowed to
        // create and patch NodeStates (RBAC cannot name the node; the policy does).
        let role = format!("ebb-vap-{id}");
        identity(
            &c,
            &ns,
            "ebb-node-agent",
            &role,
            json!([
                {"apiGroups": ["ebb.dev"], "resources": ["nodestates"], "verbs": ["create", "patch", "get"]},
                {"apiGroups": ["ebb.dev"], "resources": ["nodestates/status"], "verbs": ["patch"]},
            ]),
        )
        .await;
        let policy = rendered_policy(&ns, &format!("ebb-vap-{id}"));
        for doc in &policy {
            apply(&c, doc).await;
        }
        // A pod of the agent on `own`; its bound token carries the node's name.
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": ns},
            "spec": {"nodeName": own, "serviceAccountName": "ebb-node-agent",
                     "containers": [{"name": "a", "image": "registry.k8s.io/pause:3.10"}]},
        }))
        .unwrap();
        let pod = Api::<Pod>::namespaced(c.clone(), &ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let request: TokenRequest = serde_json::from_value(json!({
            "spec": {"audiences": [], "expirationSeconds": 600,
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "agent",
                                        "uid": pod.metadata.uid}},
        }))
        .unwrap();
        let token = Api::<ServiceAccount>::namespaced(c.clone(), &ns)
            .create_token_request("ebb-node-agent", &PostParams::default(), &request)
            .await
            .unwrap()
            .status
            .unwrap()
            .token;
        let mut cfg = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        cfg.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        let agent = kube::Client::try_from(cfg).unwrap();
        let states: Api<NodeState> = Api::all(agent);
        let body = |node: &str| {
            json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState",
                   "metadata": {"name": node}, "spec": {"nodeName": node}})
        };
        // The policy may take a moment to be enforced after it is created.
        let own_ok = wait_for("the agent writes its own NodeState", WAIT, || async {
            states
                .patch(
                    &own,
                    &PatchParams::apply("ebb-node-agent").force(),
                    &Patch::Apply(body(&own)),
                )
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        assert!(own_ok.is_ok(), "{own_ok:?}");
        // A new policy takes a moment to be enforced: wait until a write to a throw-away name is
        // denied, then try the other node once.
        let probe = format!("vap-probe-{id}");
        wait_for("the policy to be enforced", WAIT, || async {
            states
                .patch(
                    &probe,
                    &PatchParams::apply("ebb-node-agent").force(),
                    &Patch::Apply(body(&probe)),
                )
                .await
                .err()
                .map(|_| ())
        })
        .await
        .unwrap();
        let denied = match states
            .patch(
                &other,
                &PatchParams::apply("ebb-node-agent").force(),
                &Patch::Apply(body(&other)),
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 403 => s.message,
            other => panic!("a write to another node's NodeState was not denied: {other:?}"),
        };
        assert!(denied.contains(&format!("not {other}")), "{denied}");
        assert!(
            Api::<NodeState>::all(c.clone())
                .get_opt(&other)
                .await
                .unwrap()
                .is_none(),
            "the other node's NodeState was created"
        );
        clean_up(&c, &policy, &role, &[&ns]).await;
        for n in [&own, &other] {
            let _ = Api::<Node>::all(c.clone())
                .delete(n, &DeleteParams::default())
                .await;
        }
    }

    /// ServiceAccount `sa` in `ns`, granted `rules` cluster-wide by a ClusterRole and binding
    /// named `role`.
    async fn identity(c: &kube::Client, ns: &str, sa: &str, role: &str, rules: Value) {
        Api::<ServiceAccount>::namespaced(c.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": sa}})).unwrap(),
            )
            .await
            .unwrap();
        Api::<ClusterRole>::all(c.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": role}, "rules": rules}))
                    .unwrap(),
            )
            .await
            .unwrap();
        Api::<ClusterRoleBinding>::all(c.clone())
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
                })).unwrap())
            .await
            .unwrap();
    }

    /// A client holding a token of ServiceAccount `sa` in `ns` (not bound to a pod).
    async fn client_as(env: &TestEnv, ns: &str, sa: &str) -> kube::Client {
        let request: TokenRequest = serde_json::from_value(json!({
            "spec": {"audiences": [], "expirationSeconds": 600},
        }))
        .unwrap();
        let token = Api::<ServiceAccount>::namespaced(env.client.clone(), ns)
            .create_token_request(sa, &PostParams::default(), &request)
            .await
            .unwrap()
            .status
            .unwrap()
            .token;
        let mut cfg = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        cfg.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        kube::Client::try_from(cfg).unwrap()
    }

    /// The message of a write the confinement policy refused; panics naming `what` when it was
    /// let through or failed otherwise.
    fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> String {
        match r {
            Err(kube::Error::Api(s))
                if (s.code == 403 || s.code == 422) && s.message.contains("ebb controller") =>
            {
                s.message
            }
            other => panic!("{what}: not refused by the confinement policy: {other:?}"),
        }
    }

    pub async fn controller_writes_are_confined(env: &TestEnv) {
        use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;

        let c = env.client.clone();
        let id = unique();
        let (home, tenant) = (format!("ebb-ctl-{id}"), format!("tenant-{id}"));
        for ns in [&home, &tenant] {
            Api::<Namespace>::all(c.clone())
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
                )
                .await
                .unwrap();
        }
        // The controller's identity with more RBAC than the chart gives (delete on the webhook
        // configuration too): what is refused below is refused by the policy, not by RBAC.
        let role = format!("ebb-confined-{id}");
        identity(
            &c,
            &home,
            "ebb-controller",
            &role,
            json!([
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch", "delete"]},
                {"apiGroups": ["admissionregistration.k8s.io"],
                 "resources": ["mutatingwebhookconfigurations"], "verbs": ["get", "patch", "delete"]},
            ]),
        )
        .await;
        let policy = rendered_template("controller-admission.yaml", &home, &role);
        assert_eq!(policy.len(), 2, "a policy and its binding: {policy:?}");
        for doc in &policy {
            apply(&c, doc).await;
        }
        // Pods of a tenant (never scheduled: there is no node), and one of the controller's.
        let pod = |ns: &str, name: &str, extra: Value| -> Pod {
            let mut v = json!({
                "metadata": {"name": name, "namespace": ns, "labels": {"app": name},
                             "annotations": {"team": "a"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            });
            if let (Some(a), Some(b)) = (v.as_object_mut(), extra.as_object()) {
                for (k, x) in b {
                    match (a.get_mut(k), x) {
                        (Some(Value::Object(m)), Value::Object(n)) => {
                            m.extend(n.clone());
                        }
                        _ => {
                            a.insert(k.clone(), x.clone());
                        }
                    }
                }
            }
            serde_json::from_value(v).unwrap()
        };
        let admin_pods = Api::<Pod>::namespaced(c.clone(), &tenant);
        let pp = PostParams::default();
        admin_pods
            .create(&pp, &pod(&tenant, "web", json!({})))
            .await
            .unwrap();
        admin_pods
            .create(
                &pp,
                &pod(
                    &tenant,
                    "gated",
                    json!({"spec": {
                "schedulingGates": [{"name": "ebb.dev/placement"}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
                ),
            )
            .await
            .unwrap();
        admin_pods
            .create(
                &pp,
                &pod(
                    &tenant,
                    "pinned",
                    json!({"metadata": {
                "annotations": {"ebb.dev/placement": "Pinned"}}}),
                ),
            )
            .await
            .unwrap();
        Api::<Pod>::namespaced(c.clone(), &home)
            .create(&pp, &pod(&home, "ctl", json!({})))
            .await
            .unwrap();
        let hook = format!("ebb-confined-{id}");
        let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": hook},
            "webhooks": [{"name": "steering.ebb.dev", "sideEffects": "None",
                "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore",
                "clientConfig": {"url": "https://127.0.0.1:1/steer"},
                "namespaceSelector": {"matchLabels": {"ebb-confined-none": id.clone()}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"]}]}],
        }))
        .unwrap();
        Api::<MutatingWebhookConfiguration>::all(c.clone())
            .create(&pp, &config)
            .await
            .unwrap();

        let ctl = client_as(env, &home, "ebb-controller").await;
        let pods = Api::<Pod>::namespaced(ctl.clone(), &tenant);
        let own = Api::<Pod>::namespaced(ctl.clone(), &home);
        let hooks = Api::<MutatingWebhookConfiguration>::all(ctl.clone());
        let merge = |v: Value| Patch::Merge(v);
        // The image of the pod's one container (a merge patch would replace the whole list).
        let image = |i: &str| {
            Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "replace", "path": "/spec/containers/0/image", "value": i}]))
                .unwrap(),
            )
        };
        let none = PatchParams::default();
        // A new policy takes a moment to be enforced: wait until the first forbidden write is
        // refused (the image of a tenant's pod; the retried patch sets the same image).
        wait_for("the confinement policy to be enforced", WAIT, || async {
            let r = pods
                .patch("web", &none, &image("registry.example/evil:1"))
                .await;
            match r {
                Err(kube::Error::Api(s)) if s.message.contains("ebb controller") => Some(()),
                Err(e) if std::env::var_os("EBB_E2E_DEBUG").is_some() => {
                    eprintln!("probe: {e}");
                    None
                }
                Ok(_) => {
                    // Let through before the policy applied: put the image back and retry.
                    let _ = admin_pods
                        .patch("web", &none, &image("registry.k8s.io/pause:3.10"))
                        .await;
                    None
                }
                Err(_) => None,
            }
        })
        .await
        .unwrap();

        // Forbidden, each refused by the policy.
        let mut messages = vec![];
        messages.push(refused(
            "a tenant pod's labels",
            pods.patch(
                "web",
                &none,
                &merge(json!({"metadata": {"labels": {"app": "other"}}})),
            )
            .await,
        ));
        messages.push(refused(
            "a tenant pod's annotations",
            pods.patch(
                "web",
                &none,
                &merge(json!({"metadata": {"annotations": {"team": "b"}}})),
            )
            .await,
        ));
        messages.push(refused(
            "a tenant pod's tolerations",
            pods.patch(
                "web",
                &none,
                &merge(json!({"spec": {"tolerations": [
                {"key": "x", "operator": "Exists"}]}})),
            )
            .await,
        ));
        messages.push(refused(
            "the leader label on a tenant pod",
            pods.patch(
                "web",
                &none,
                &merge(json!({"metadata": {"labels": {"ebb.dev/leader": "true"}}})),
            )
            .await,
        ));
        messages.push(refused(
            "a tenant pod's owners",
            pods.patch(
                "web",
                &none,
                &merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
            )
            .await,
        ));
        messages.push(refused(
            "deleting a pod ebb did not pin",
            pods.delete("web", &DeleteParams::default()).await,
        ));
        messages.push(refused(
            "the image of ebb's own pod",
            own.patch("ctl", &none, &image("registry.example/evil:1"))
                .await,
        ));
        messages.push(refused("the webhook's rules", hooks
            .patch(&hook, &none, &Patch::Json::<()>(serde_json::from_value(json!([
                {"op": "replace", "path": "/webhooks/0/rules/0/operations", "value": ["CREATE", "UPDATE"]}])).unwrap()))
            .await));
        messages.push(refused(
            "the webhook's failure policy",
            hooks
                .patch(
                    &hook,
                    &none,
                    &Patch::Json::<()>(
                        serde_json::from_value(json!([
                {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}]))
                        .unwrap(),
                    ),
                )
                .await,
        ));
        messages.push(refused(
            "deleting the webhook configuration",
            hooks.delete(&hook, &DeleteParams::default()).await,
        ));
        eprintln!("refused: {messages:#?}");
        let web = admin_pods.get("web").await.unwrap();
        assert_eq!(
            web.spec.as_ref().unwrap().containers[0].image.as_deref(),
            Some("registry.k8s.io/pause:3.10"),
            "the tenant's pod is as it was"
        );

        // What the controller does, let through.
        pods.patch("gated", &none, &merge(json!({
            "metadata": {"annotations": {"ebb.dev/token": "t", "ebb.dev/placement": "Pinned",
                                         "ebb.dev/placed-on": "n1"}},
            "spec": {"schedulingGates": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}})))
            .await
            .expect("releasing a pod gated by ebb.dev/placement, pinned");
        own.patch(
            "ctl",
            &none,
            &merge(json!({"metadata": {"labels": {"ebb.dev/leader": "true"}}})),
        )
        .await
        .expect("the leader label on its own pod");
        own.patch(
            "ctl",
            &none,
            &merge(json!({"metadata": {"labels": {"ebb.dev/leader": null}}})),
        )
        .await
        .expect("the leader label off its own pod");
        hooks
            .patch(
                &hook,
                &none,
                &Patch::Json::<()>(
                    serde_json::from_value(json!([
                {"op": "test", "path": "/webhooks/0/name", "value": "steering.ebb.dev"},
                {"op": "replace", "path": "/webhooks/0/clientConfig",
                 "value": {"url": "https://127.0.0.2:9443/steer", "caBundle": "Y2E="}}]))
                    .unwrap(),
                ),
            )
            .await
            .expect("pointing the webhook at the leader");
        pods.delete("pinned", &DeleteParams::default())
            .await
            .expect("deleting a pod ebb pinned");
        // The policy confines the controller only: an administrator changes what it likes.
        admin_pods
            .patch(
                "web",
                &none,
                &merge(json!({"metadata": {"labels": {"app": "other"}}})),
            )
            .await
            .expect("an administrator's write");

        let _ = Api::<MutatingWebhookConfiguration>::all(c.clone())
            .delete(&hook, &DeleteParams::default())
            .await;
        clean_up(&c, &policy, &role, &[&home, &tenant]).await;
    }

    /// Deletes what a policy test made: the policy documents, the ClusterRole and its binding
    /// named `role`, and `namespaces` (errors ignored: the cluster goes with the test).
    async fn clean_up(c: &kube::Client, policy: &[Value], role: &str, namespaces: &[&str]) {
        for doc in policy {
            let _ = Api::<DynamicObject>::all_with(c.clone(), &resource_of(doc))
                .delete(
                    doc["metadata"]["name"].as_str().unwrap(),
                    &DeleteParams::default(),
                )
                .await;
        }
        let _ = Api::<ClusterRoleBinding>::all(c.clone())
            .delete(role, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRole>::all(c.clone())
            .delete(role, &DeleteParams::default())
            .await;
        for ns in namespaces {
            let _ = Api::<Namespace>::all(c.clone())
                .delete(ns, &DeleteParams::default())
                .await;
        }
    }
}

/// The chart's identities as the real backend's binaries get them (see `ebb_e2e::rbac`): who the
/// API server says they are, and that they hold no verb beyond the chart's. Real control plane
/// only: ebb-sim authenticates by user name and enforces no RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_identities_are_least_privileged() {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    use k8s_openapi::api::core::v1::Secret;

    let env = TestEnv::start_real(1).await.unwrap();
    let node = "kwok-node-0";
    let client_of = |path: PathBuf| async move {
        ebb_e2e::sim::client_from_yaml(&std::fs::read_to_string(path).unwrap())
            .await
            .unwrap()
    };
    let ctl = client_of(
        env.binary_kubeconfig("ebb-controller", "ebb-controller", &["run"])
            .unwrap(),
    )
    .await;
    let agent = client_of(
        env.binary_kubeconfig(
            "ebb-node-agent",
            "ebb-node-agent",
            &["run", "--node-name", node],
        )
        .unwrap(),
    )
    .await;

    // Who they are: the chart's ServiceAccounts; the agent's token names its node.
    let whoami = |c: kube::Client| async move {
        let review: SelfSubjectReview =
            serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1",
                                          "kind": "SelfSubjectReview"}))
            .unwrap();
        let req = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&review).unwrap())
            .unwrap();
        let r: SelfSubjectReview = c.request(req).await.unwrap();
        r.status.and_then(|s| s.user_info).unwrap()
    };
    let ctl_user = whoami(ctl.clone()).await;
    assert_eq!(
        ctl_user.username.as_deref(),
        Some("system:serviceaccount:ebb-system:ebb-controller")
    );
    assert_eq!(
        env.audit_user("ebb-controller"),
        "system:serviceaccount:ebb-system:ebb-controller"
    );
    let agent_user = whoami(agent.clone()).await;
    assert_eq!(
        agent_user.username.as_deref(),
        Some("system:serviceaccount:ebb-system:ebb-node-agent")
    );
    assert_eq!(
        agent_user
            .extra
            .unwrap_or_default()
            .get("authentication.kubernetes.io/node-name"),
        Some(&vec![node.to_string()]),
        "the agent's token is bound to its node"
    );

    // What the chart grants works ...
    Api::<Pod>::all(ctl.clone())
        .list(&Default::default())
        .await
        .expect("the controller lists pods");
    Api::<Node>::all(agent.clone())
        .get(node)
        .await
        .expect("the agent reads its Node");
    // ... and nothing else: 403 for each of these.
    let forbidden = |what: &str, r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    };
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "x"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}))
    .unwrap();
    for (who, c) in [("controller", &ctl), ("agent", &agent)] {
        forbidden(
            &format!("{who} creates a pod"),
            Api::<Pod>::namespaced(c.clone(), "default")
                .create(&PostParams::default(), &pod)
                .await
                .map(|_| ()),
        );
        forbidden(
            &format!("{who} reads a Secret that is not the token Secret"),
            Api::<Secret>::namespaced(c.clone(), "kube-system")
                .list(&Default::default())
                .await
                .map(|_| ()),
        );
        forbidden(
            &format!("{who} deletes a namespace"),
            Api::<Namespace>::all(c.clone())
                .delete("default", &DeleteParams::default())
                .await
                .map(|_| ()),
        );
    }
    forbidden(
        "the agent lists nodes",
        Api::<Node>::all(agent.clone())
            .list(&Default::default())
            .await
            .map(|_| ()),
    );
    forbidden(
        "the agent patches a pod",
        Api::<Pod>::namespaced(agent.clone(), "default")
            .patch(
                "x",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
            )
            .await
            .map(|_| ()),
    );
    forbidden(
        "the controller reads another Secret of its namespace",
        Api::<Secret>::namespaced(ctl.clone(), "ebb-system")
            .get("not-the-token-keys")
            .await
            .map(|_| ()),
    );
}
