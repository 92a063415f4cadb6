//! The PlacementHistory controller of `ebb-controller run`: places gated pods with each
//! PlacementHistory's RoleHistory, keeps the token key Secret, releases ungoverned pods.

pub mod context;
pub mod facts;
pub mod keys;
pub mod patch;
pub mod reconcile;
pub mod terminal;
pub mod ungoverned;

use std::sync::Arc;
use std::time::Duration;

use ebb_api::placement::PlacementHistory;
use futures::StreamExt;
use kube::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::Recorder;
use kube::runtime::{Controller, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use context::{Ctx, PlacementSettings};

use crate::metrics::Metrics;
use crate::state::Leadership;
use crate::state::Stores;

fn error_policy(_ph: Arc<PlacementHistory>, e: &reconcile::PassError, _ctx: Arc<Ctx>) -> Requeue {
    tracing::warn!(error = %e, "placement pass failed; retrying");
    Requeue::requeue(Duration::from_secs(2))
}

/// Start placement: the key keeper, the PlacementHistory controller (woken by pod events) and
/// the ungoverned sweep. Everything stops when `stop` is cancelled.
#[allow(clippy::too_many_arguments)]
pub fn start(
    client: kube::Client,
    stores: Stores,
    pod_changes: watch::Receiver<u64>,
    metrics: Metrics,
    recorder: Recorder,
    leadership: Leadership,
    settings: PlacementSettings,
    stop: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let (ns, name) = settings.token_secret.clone();
    let keeper = keys::KeyKeeper::new(client.clone(), &ns, &name);
    let api: Api<PlacementHistory> = Api::all(client.clone());
    let controller = Controller::new(api, watcher::Config::default().any_semantic()).with_config(
        kube::runtime::controller::Config::default().debounce(Duration::from_millis(300)),
    );
    // NodeStates (the node agents' reports of cached data), shared with the planner.
    let node_states = stores.node_states.clone();
    let ctx = Arc::new(Ctx::new(
        client,
        stores,
        controller.store(),
        metrics,
        recorder,
        leadership.clone(),
        keeper.current.clone(),
        settings,
        node_states,
    ));
    let mut tasks = vec![tokio::spawn(terminal::watch(
        ctx.client.clone(),
        ctx.terminal.clone(),
    ))];

    let rotation = ctx.settings.key_rotation;
    let key_stop = stop.clone();
    let key_leader = leadership;
    tasks.push(tokio::spawn(async move {
        loop {
            if key_leader.is_leader()
                && let Err(e) = keeper.tick(rotation).await
            {
                tracing::warn!(error = %e, "token key Secret not updated; retrying");
            }
            // Check often at first (so placement has a key), then every minute at most.
            let wait = if keeper.current.get().is_none() {
                Duration::from_secs(1)
            } else {
                (rotation / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = key_stop.cancelled() => return,
            }
        }
    }));

    let wake = futures::stream::unfold(pod_changes, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    });
    let ctrl_stop = stop.clone();
    tasks.push(tokio::spawn(
        controller
            .reconcile_all_on(wake)
            .graceful_shutdown_on(async move { ctrl_stop.cancelled().await })
            .run(reconcile::pass, error_policy, ctx.clone())
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "placement reconcile");
                }
            }),
    ));

    let sweep_ctx = ctx;
    tasks.push(tokio::spawn(async move {
        let every = (sweep_ctx.settings.grace / 4)
            .clamp(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            ungoverned::sweep(&sweep_ctx).await;
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => return,
            }
        }
    }));
    tasks
}
