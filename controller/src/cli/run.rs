//! `ebb-controller run`: telemetry, client, HTTP endpoints, leader election, shared caches, start-up
//! recovery, the ScaleDownPolicy and PlacementHistory controllers, shutdown (signal, lost lease).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ebb_api::ScaleDownPolicy;
use futures::StreamExt;
use kube::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use tokio_util::sync::CancellationToken;
use tokio_util::sync::DropGuard;

use crate::actuation::removal::{ClusterApi, ClusterApiKinds, Karpenter, KarpenterKinds, Remover};
use crate::actuation::{Actuator, Tracker};
use crate::admission::{PodRef, SteeringSettings, Webhook};
use crate::cli::RunArgs;
use crate::http::{Readiness, router};
use crate::metrics::Metrics;
use crate::reconcilers::placement::{self, PlacementSettings};
use crate::reconcilers::scaledown::startup::recover_at_start;
use crate::reconcilers::scaledown::{Context, error_policy, reconcile};
use crate::state::lease::{Leader, LeaderConfig};
use crate::state::lists::InitialList;
use crate::state::machine_caches::ProviderSources;
use crate::state::pod_stream::PodEncoding;
use crate::state::wakes::throttle;
use crate::state::{Leadership, stores};
use crate::steering::Steering;

/// How the controller ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// A signal asked it to stop.
    Stopped,
    /// Another replica took the Lease: exit non-zero so the pod restarts and campaigns again.
    LostLeadership,
}

fn identity(args: &RunArgs) -> String {
    args.identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("ebb-controller-{}", std::process::id()))
}

async fn signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the controller");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// What `serve` needs besides a client (from the command line, or set by tests).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Address of `/metrics`, `/healthz`, `/readyz` (port 0: any free port).
    pub metrics_addr: std::net::SocketAddr,
    /// `None`: leader election off (a single replica).
    pub leader: Option<LeaderConfig>,
    /// Wait between the `to-be-deleted` taint and the re-check.
    pub recheck_delay: Duration,
    /// `--max-evictions-in-flight`.
    pub max_evictions_in_flight: usize,
    /// `--min-starting-replacements`.
    pub min_starting_replacements: usize,
    /// `--max-starting-replacements`.
    pub max_starting_replacements: usize,
    /// This replica's name in Events and the Lease.
    pub identity: String,
    /// Policy loops triggered within this time of each other run once ([`DEFAULT_DEBOUNCE`]).
    pub debounce: Duration,
    /// Placement of gated pods by PlacementHistories.
    pub placement: PlacementSettings,
    /// Which machine removals are enabled besides deleting Node objects.
    pub removal: RemovalSettings,
    /// How the caches take their first list.
    pub initial_list: InitialList,
    /// How the pod cache asks for pods (`--pod-encoding`).
    pub pod_encoding: PodEncoding,
    /// How long a stop (SIGTERM) may take: drains in flight finish or roll back, the Lease is
    /// released ([`DEFAULT_SHUTDOWN_TIMEOUT`]). Keep it [`SHUTDOWN_MARGIN`] below the pod's
    /// `terminationGracePeriodSeconds`.
    pub shutdown_timeout: Duration,
    /// The steering admission webhook (`None`: `--steering=false`).
    pub steering: Option<SteeringSettings>,
}

/// Default of `--shutdown-timeout`: the chart's default `terminationGracePeriodSeconds` (30)
/// less [`SHUTDOWN_MARGIN`].
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(25);
/// What a stop needs beyond `--shutdown-timeout` before the kubelet's SIGKILL: the runtime's
/// last tasks and the process exit.
pub const SHUTDOWN_MARGIN: Duration = Duration::from_secs(5);
/// Of `--shutdown-timeout`, what is kept for releasing the Lease.
const LEASE_RELEASE_BUDGET: Duration = Duration::from_secs(3);

/// Machine removal through Cluster API and Karpenter (both off by default).
#[derive(Clone, Debug, Default)]
pub struct RemovalSettings {
    pub cluster_api: bool,
    /// The Cluster API management cluster's kubeconfig (`None`: this cluster).
    pub cluster_api_kubeconfig: Option<std::path::PathBuf>,
    pub karpenter: bool,
}

impl RemovalSettings {
    /// Discovers the enabled providers' kinds; an error says what is missing and how to fix it.
    async fn sources(&self, client: &kube::Client) -> anyhow::Result<ProviderSources> {
        let mut out = ProviderSources::default();
        if self.cluster_api {
            let capi = match &self.cluster_api_kubeconfig {
                None => client.clone(),
                Some(path) => {
                    let kubeconfig =
                        kube::config::Kubeconfig::read_from(path).with_context(|| {
                            format!("reading --cluster-api-kubeconfig {}", path.display())
                        })?;
                    let config = kube::Config::from_custom_kubeconfig(
                        kubeconfig,
                        &kube::config::KubeConfigOptions::default(),
                    )
                    .await
                    .with_context(|| {
                        format!("using --cluster-api-kubeconfig {}", path.display())
                    })?;
                    kube::Client::try_from(config)
                        .context("building the Cluster API management cluster's client")?
                }
            };
            let kinds = ClusterApiKinds::discover(&capi)
                .await
                .context("--cluster-api")?;
            tracing::info!(machine = %kinds.machine.api_version, "Cluster API removal enabled");
            out.cluster_api = Some((capi, kinds));
        }
        if self.karpenter {
            let kinds = KarpenterKinds::discover(client)
                .await
                .context("--karpenter")?;
            tracing::info!(node_claim = %kinds.node_claim.api_version, "Karpenter removal enabled");
            out.karpenter = Some((client.clone(), kinds));
        }
        Ok(out)
    }
}

/// Debounce of a policy's own events (its status writes come back as events).
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(200);

/// Node changes, budgets allowing more and finished drains wake every policy at most this often
/// (the first at once, a burst as one wake at the end of the interval): drains waiting for a
/// budget start well within a second, and ebb's own node writes do not loop the policies.
pub const WAKE_INTERVAL: Duration = Duration::from_millis(200);

impl Settings {
    /// Settings from the command line; `namespace` is `--namespace` or the client's default.
    pub fn from_args(args: &RunArgs, namespace: &str) -> Self {
        let identity = identity(args);
        Self {
            metrics_addr: args.metrics_addr,
            leader: args
                .leader_election
                .then(|| LeaderConfig::new(&args.lease_name, namespace, &identity)),
            recheck_delay: args.recheck_delay.as_duration(),
            max_evictions_in_flight: args.max_evictions_in_flight,
            min_starting_replacements: args.min_starting_replacements,
            max_starting_replacements: args.max_starting_replacements,
            identity,
            debounce: DEFAULT_DEBOUNCE,
            placement: PlacementSettings {
                grace: args.placement_grace.as_duration(),
                status_interval: args.placement_status_interval.as_duration(),
                token_ttl: args.token_ttl.as_duration(),
                key_rotation: args.token_rotation.as_duration(),
                token_secret: (namespace.to_string(), args.token_secret.clone()),
                ..PlacementSettings::default()
            },
            removal: RemovalSettings {
                cluster_api: args.cluster_api,
                cluster_api_kubeconfig: args.cluster_api_kubeconfig.clone(),
                karpenter: args.karpenter,
            },
            initial_list: args.initial_list,
            pod_encoding: args.pod_encoding,
            shutdown_timeout: args.shutdown_timeout.as_duration(),
            steering: args.steering.then(|| SteeringSettings {
                port: args.steering_port,
                webhook_name: args.steering_webhook_name.clone(),
                webhook_url: args.steering_webhook_url.clone(),
                service: args.steering_service.clone(),
                namespace: namespace.to_string(),
                own_pod: PodRef::from_env(namespace),
                ca_secret: Some(args.steering_ca_secret.clone())
                    .filter(|s| !s.is_empty() && args.steering_cert_dir.is_none()),
                cert_dir: args.steering_cert_dir.clone(),
            }),
        }
    }
}

/// `ebb-controller run`: telemetry, client from the environment, signals, then [`serve`].
pub async fn run(args: RunArgs) -> anyhow::Result<Exit> {
    let _telemetry = crate::telemetry::init("ebb-controller", args.log_format, &args.log_filter)?;
    let config = kube::Config::infer().await.context(
        "connecting to Kubernetes (in-cluster config or the current kubeconfig context)",
    )?;
    // Like kubectl: the pod's namespace in a cluster, else the kubeconfig context's, else `default`.
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    tracing::info!(%namespace, "Lease and token Secret namespace");
    let clients = Clients::new(config)?;
    let stop = CancellationToken::new();
    let sig_stop = stop.clone();
    tokio::spawn(async move {
        signal().await;
        tracing::info!("signal received; stopping");
        sig_stop.cancel();
    });
    serve(clients, Settings::from_args(&args, &namespace), stop).await
}

/// The controller's API clients: one for everything, with kube's retry of 429/503/504 answers,
/// and one for evictions without it. A PodDisruptionBudget refuses an eviction with a 429; the
/// drain must see that answer (to count it, trace it and retry on its own schedule,
/// `evictionRetryInterval` within `maxPodEvictionTime`) instead of a client that silently backs
/// off for minutes.
#[derive(Clone)]
pub struct Clients {
    pub api: kube::Client,
    pub evictions: kube::Client,
}

impl Clients {
    /// One client for both, for a client that never retries on its own (ebb-sim's).
    pub fn single(client: kube::Client) -> Self {
        Self {
            api: client.clone(),
            evictions: client,
        }
    }

    pub fn new(config: kube::Config) -> anyhow::Result<Self> {
        let mut no_retry = config.clone();
        no_retry.default_retry = false;
        Ok(Self {
            api: kube::Client::try_from(config).context("building the Kubernetes client")?,
            evictions: kube::Client::try_from(no_retry)
                .context("building the Kubernetes client for evictions")?,
        })
    }
}

/// Run the controller with `client` until `stop` is cancelled (`Ok(Exit::Stopped)`) or
/// leadership is lost (`Ok(Exit::LostLeadership)`). On a stop, within `shutdown_timeout`: no new
/// drain starts, drains in flight finish or roll back (no node is left tainted), the Lease is
/// released. On a lost Lease nothing more is written: drains in flight are abandoned as a killed
/// process would leave them (tainted, for the next leader). On return nothing of it runs any
/// more.
pub async fn serve(
    clients: Clients,
    settings: Settings,
    stop: CancellationToken,
) -> anyhow::Result<Exit> {
    let metrics = Metrics::new();
    metrics.known_reconcile_errors(
        crate::metrics::Reconciler::scaledown,
        crate::reconcilers::scaledown::error::Error::REASONS,
    );
    metrics.known_reconcile_errors(
        crate::metrics::Reconciler::placement,
        crate::reconcilers::placement::reconcile::Error::REASONS,
    );
    let readiness = Readiness::default();
    let stop = stop.child_token();
    let _stop_on_exit: DropGuard = stop.clone().drop_guard();
    // HTTP endpoints first, so liveness holds while we campaign and sync.
    serve_http(&settings, metrics.clone(), readiness.clone(), stop.clone()).await?;
    let sources = settings.removal.sources(&clients.api).await?;
    // The webhook asks this `Steering`, drains open its slots, the pod watch reports landings.
    let steering = Steering::default().with_metrics(metrics.clone());
    let lists = settings.initial_list.resolve(&clients.api).await;
    let Some(watches) = sync_caches(
        &clients.api,
        &sources,
        (lists, settings.pod_encoding),
        &steering,
        &readiness,
        &stop,
    )
    .await?
    else {
        return Ok(Exit::Stopped);
    };
    let stores::Watches {
        stores,
        pod_changes,
        node_changes,
        pdb_changes,
        budget_rises,
        tasks,
    } = watches;
    let _watch_tasks = AbortOnDrop(tasks);
    // The reconcilers and the webhook do not act until start-up recovery is done (the
    // leadership flag).
    let leadership = Leadership::default();
    steering.set_nodes(stores.nodes.clone());
    let webhook = match &settings.steering {
        Some(s) => {
            Webhook::start(
                &clients.api,
                s.clone(),
                steering.clone(),
                leadership.clone(),
                metrics.clone(),
                stop.clone(),
            )
            .await
        }
        None => Webhook::off("--steering=false"),
    };
    let Some(mut leader) =
        campaign(&clients.api, &settings, &leadership, &readiness, &stop).await?
    else {
        return Ok(Exit::Stopped);
    };
    let shared = Shared {
        stores,
        pod_changes,
        metrics,
        leadership,
        stop,
        steering: steering.clone(),
        steering_availability: webhook.availability(),
    };
    let wakes = Wakes {
        node_changes,
        budget_rises,
        pdb_changes,
    };
    let scaledown = ScaleDown::start(clients, &settings, &shared, wakes, &sources);
    if !wait_for_policy_cache(&scaledown.ctx, &shared.stop).await? {
        return Ok(Exit::Stopped);
    }
    // From here every actor is under the fence the Lease task keeps (see `Leader::acquire`):
    // recovery's writes and the drains it resumes check it, and a Lease lost meanwhile ends
    // recovery at once.
    let recovered = match leader.as_mut() {
        Some(l) => tokio::select! {
            _ = recover_at_start(&scaledown.ctx) => None,
            why = l.lost() => Some(why),
        },
        None => {
            recover_at_start(&scaledown.ctx).await;
            None
        }
    };
    if let Some(why) = recovered {
        tracing::error!(%why, "leadership lost during start-up recovery");
        shared.leadership.set(false);
        scaledown.ctx.actuator.abort_all();
        shared.stop.cancel();
        scaledown
            .shut_down(
                Exit::LostLeadership,
                leader,
                &shared.leadership,
                settings.shutdown_timeout,
            )
            .await;
        return Ok(Exit::LostLeadership);
    }
    let client = scaledown.ctx.client.clone();
    let _placement_tasks = AbortOnDrop(placement::start(
        client.clone(),
        shared.stores.clone(),
        shared.pod_changes.clone(),
        shared.metrics.clone(),
        Recorder::new(client, reporter(&settings)),
        shared.leadership.clone(),
        settings.placement.clone(),
        shared.stop.clone(),
    ));
    shared.leadership.set(true);
    tracing::info!("acting");
    // Registration in a task of its own: a slow API server delays no drain.
    let webhook = std::sync::Arc::new(webhook);
    let registering = {
        let w = webhook.clone();
        AbortOnDrop(vec![tokio::spawn(async move { w.lead().await })])
    };
    let exit = until_exit(leader.as_mut(), &shared.stop).await;
    if exit == Exit::LostLeadership {
        // Another leader may act already: not one more write, drains stop where they are.
        shared.leadership.set(false);
        scaledown.ctx.actuator.abort_all();
    }
    drop(registering);
    // The webhook's Service stops routing here (the only write after a lost Lease: this
    // replica's own Pod label).
    webhook.step_down().await;
    // No new drain from here; in-flight ones finish or roll back (see `ScaleDown::shut_down`).
    shared.stop.cancel();
    scaledown
        .shut_down(exit, leader, &shared.leadership, settings.shutdown_timeout)
        .await;
    Ok(exit)
}

/// What both reconcilers share, built once by [`serve`].
struct Shared {
    stores: stores::Stores,
    /// Ticks on every pod event.
    pod_changes: tokio::sync::watch::Receiver<u64>,
    metrics: Metrics,
    leadership: Leadership,
    stop: CancellationToken,
    /// Where replacements are steered, and whether the webhook is in place.
    steering: Steering,
    steering_availability: tokio::sync::watch::Receiver<crate::admission::SteeringAvailability>,
}

/// This replica in Events.
fn reporter(settings: &Settings) -> Reporter {
    Reporter {
        controller: "ebb-controller".into(),
        instance: Some(settings.identity.clone()),
    }
}

/// Binds `--metrics-addr` and serves `/metrics`, `/healthz`, `/readyz` until `stop`.
async fn serve_http(
    settings: &Settings,
    metrics: Metrics,
    readiness: Readiness,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(settings.metrics_addr)
        .await
        .with_context(|| format!("binding --metrics-addr {}", settings.metrics_addr))?;
    let bound = listener.local_addr().unwrap_or(settings.metrics_addr);
    tracing::info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    let app = router(metrics, readiness);
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });
    Ok(())
}

/// Starts the shared caches and waits for them to sync (`None`: stopped first). They run on
/// every replica: a standby is ready to take over at once, and ready for rollouts (`/readyz`
/// does not wait for leadership, only for it to be known).
async fn sync_caches(
    client: &kube::Client,
    sources: &ProviderSources,
    (lists, pods): (InitialList, PodEncoding),
    steering: &Steering,
    readiness: &Readiness,
    stop: &CancellationToken,
) -> anyhow::Result<Option<stores::Watches>> {
    let seen = steering.clone();
    // Steered pods still pending count on their planned node in this model (see
    // `Steering::observe`).
    let model = std::sync::Arc::new(crate::state::shared_model::SharedModel::default());
    steering.set_model(model.clone());
    let watches = stores::start_seeing_pods(
        client.clone(),
        sources,
        lists,
        pods,
        model,
        move |p| match p {
            stores::PodSeen::Applied(p) => {
                seen.observe(p);
            }
            stores::PodSeen::Deleted(p) => seen.observe_deleted(p),
        },
    )
    .await;
    tracing::info!(initial_list = ?lists, pod_encoding = ?pods, "waiting for the caches to sync");
    tokio::select! {
        synced = watches.stores.wait_synced() => synced.context("a cache stopped before it synced")?,
        _ = stop.cancelled() => {
            AbortOnDrop(watches.tasks);
            return Ok(None);
        }
    }
    readiness.set_caches_synced(true);
    tracing::info!(
        nodes = watches.stores.nodes.state().len(),
        pods = watches.stores.pods.state().len(),
        "caches synced"
    );
    Ok(Some(watches))
}

/// Leader election: `Some(Some(lease))` once leader, `Some(None)` without leader election,
/// `None` when stopped while campaigning.
async fn campaign(
    client: &kube::Client,
    settings: &Settings,
    leadership: &Leadership,
    readiness: &Readiness,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Option<Leader>>> {
    let Some(cfg) = &settings.leader else {
        readiness.set_leadership_known(true);
        return Ok(Some(None));
    };
    let ready = readiness.clone();
    tokio::select! {
        l = Leader::acquire(client.clone(), cfg, leadership, move || ready.set_leadership_known(true)) => Ok(Some(Some(l?))),
        _ = stop.cancelled() => Ok(None),
    }
}

/// Waits for the ScaleDownPolicy cache (`false`: stopped first). The controller's own runner
/// waits on the same store, and kube-runtime 5.0 keeps only the last waiter's waker, so a single
/// long wait here can miss the moment: wait in short slices.
async fn wait_for_policy_cache(ctx: &Context, stop: &CancellationToken) -> anyhow::Result<bool> {
    loop {
        if stop.is_cancelled() {
            return Ok(false);
        }
        let slice = Duration::from_millis(200);
        if let Ok(ready) = tokio::time::timeout(slice, ctx.policies.wait_until_ready()).await {
            ready.context("the ScaleDownPolicy cache stopped before it synced")?;
            return Ok(true);
        }
    }
}

/// Runs until the Lease is lost or `stop` is cancelled.
async fn until_exit(leader: Option<&mut Leader>, stop: &CancellationToken) -> Exit {
    match leader {
        Some(l) => tokio::select! {
            why = l.lost() => {
                tracing::error!(%why, "leadership lost");
                Exit::LostLeadership
            }
            _ = stop.cancelled() => Exit::Stopped,
        },
        None => {
            stop.cancelled().await;
            Exit::Stopped
        }
    }
}

/// What wakes every policy besides its own events: node changes, budgets allowing more, and
/// (from the actuator) finished drains; and starting to act.
struct Wakes {
    node_changes: tokio::sync::mpsc::Receiver<()>,
    budget_rises: tokio::sync::mpsc::Receiver<()>,
    /// Ticks on every budget event (the actuator's disruption gate waits on it).
    pdb_changes: tokio::sync::watch::Receiver<u64>,
}

/// The running ScaleDownPolicy reconciler.
struct ScaleDown {
    ctx: Arc<Context>,
    task: tokio::task::JoinHandle<()>,
}

impl ScaleDown {
    /// Builds the actuator and the context and runs the reconciler, woken by node changes,
    /// budgets allowing more and finished drains besides policy events.
    fn start(
        clients: Clients,
        settings: &Settings,
        shared: &Shared,
        wakes: Wakes,
        sources: &ProviderSources,
    ) -> Self {
        let Wakes {
            mut node_changes,
            mut budget_rises,
            pdb_changes,
        } = wakes;
        let client = clients.api;
        let mut remover = Remover::new(client.clone());
        if let Some((c, kinds)) = &sources.cluster_api {
            remover = remover.with_cluster_api(ClusterApi::new(c.clone(), kinds.clone()));
        }
        if let Some((c, kinds)) = &sources.karpenter {
            remover = remover.with_karpenter(Karpenter::new(c.clone(), kinds.clone()));
        }
        let (finished_tx, mut finished_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let actuator = Actuator::new(
            client.clone(),
            shared.stores.clone(),
            shared.pod_changes.clone(),
            Tracker::default(),
            shared.metrics.clone(),
        )
        .with_eviction_client(clients.evictions)
        .with_budgets(shared.stores.pdbs.clone(), pdb_changes)
        .with_recheck_delay(settings.recheck_delay)
        .with_max_evictions_in_flight(settings.max_evictions_in_flight)
        .with_starting_replacements(
            settings.min_starting_replacements,
            settings.max_starting_replacements,
        )
        .with_remover(remover)
        .with_stop(shared.stop.clone())
        .with_leadership(shared.leadership.clone())
        .with_steering(shared.steering.clone())
        .notify_finished(finished_tx);
        let policies: Api<ScaleDownPolicy> = Api::all(client.clone());
        // Debounced: the node events our own taint writes cause do not re-run every policy at once.
        let controller = Controller::new(policies, watcher::Config::default().any_semantic())
            .with_config(kube::runtime::controller::Config::default().debounce(settings.debounce));
        let ctx = Arc::new(
            Context::new(
                client.clone(),
                shared.stores.clone(),
                controller.store(),
                actuator,
                shared.metrics.clone(),
                Recorder::new(client.clone(), reporter(settings)),
                shared.leadership.clone(),
                // Every policy's drains are cancelled with the controller's stop.
                shared.stop.clone(),
            )
            .with_steering(
                shared.steering.clone(),
                shared.steering_availability.clone(),
            ),
        );
        let node_changes = futures::stream::poll_fn(move |cx| node_changes.poll_recv(cx));
        // A finished drain wakes the policies at once rather than at their next scan.
        let finished = futures::stream::poll_fn(move |cx| finished_rx.poll_recv(cx)).map(|_| ());
        // A budget allowing more starts the drains waiting for it within the wake interval.
        let rises = futures::stream::poll_fn(move |cx| budget_rises.poll_recv(cx));
        // Starting to act (after start-up recovery, or taking over) runs every policy at once:
        // a loop that found this replica not acting yet waits for no follower requeue.
        let acting = shared.leadership.started_acting();
        let wake = throttle(
            futures::stream::select(
                futures::stream::select(node_changes, finished),
                futures::stream::select(rises, acting),
            ),
            WAKE_INTERVAL,
        );
        let ctrl_stop = shared.stop.clone();
        let task = tokio::spawn(
            controller
                .reconcile_all_on(wake)
                .graceful_shutdown_on(async move { ctrl_stop.cancelled().await })
                .run(reconcile, error_policy, ctx.clone())
                .for_each(|r| async move {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "reconcile");
                    }
                }),
        );
        Self { ctx, task }
    }

    /// After a stop: within `bound`, let the reconciler finish its loop, let the drains in
    /// flight finish or roll back (reporting counts), then stop acting and release the Lease.
    /// After a lost Lease (drains already aborted): exit at once so this replica campaigns again.
    async fn shut_down(
        self,
        exit: Exit,
        mut leader: Option<Leader>,
        leadership: &Leadership,
        bound: Duration,
    ) {
        match exit {
            Exit::LostLeadership => {
                tracing::error!("leadership lost; exiting so this replica campaigns again");
            }
            Exit::Stopped => {
                let t0 = tokio::time::Instant::now();
                let drains_bound = bound.saturating_sub(LEASE_RELEASE_BUDGET);
                let reconciler = tokio::time::timeout(drains_bound, self.task);
                let work = async {
                    tokio::join!(reconciler, self.ctx.actuator.stop_drains(drains_bound)).1
                };
                // The Lease can still be lost while drains finish: then stop at once.
                let lost = async {
                    match leader.as_mut() {
                        Some(l) => l.lost().await,
                        None => std::future::pending().await,
                    }
                };
                let ended = tokio::select! {
                    report = work => Ok(report),
                    why = lost => Err(why),
                };
                match ended {
                    Ok(report) => {
                        leadership.set(false);
                        if let Some(l) = leader {
                            l.release(bound.saturating_sub(t0.elapsed())).await;
                        }
                        tracing::info!(
                            finished = report.finished,
                            rolled_back = report.rolled_back,
                            handed_off = report.handed_off,
                            aborted = report.aborted,
                            took_ms = t0.elapsed().as_millis() as u64,
                            "shutdown complete"
                        );
                    }
                    Err(why) => {
                        leadership.set(false);
                        self.ctx.actuator.abort_all();
                        tracing::error!(%why, "leadership lost while stopping; drains left to the next leader");
                    }
                }
            }
        }
        self.ctx.actuator.abort_all();
    }
}

/// Aborts the watch tasks when `serve` returns, whichever way.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
