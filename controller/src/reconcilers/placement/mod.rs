//! The PlacementHistory controller of `ebb-controller run`: places gated pods with each
//! PlacementHistory's RoleHistory, keeps the token key Secret, releases ungoverned pods.

pub mod context;
pub mod escalate;
pub mod events;
pub mod facts;
pub mod keys;
pub mod lifecycle;
pub mod pass;
pub mod patch;
pub mod place;
pub mod reconcile;
pub mod settings;
pub mod state;
pub mod status;
pub mod ungoverned;

use std::sync::Arc;
use std::time::Duration;

use ebb_api::placement::PlacementHistory;
use futures::StreamExt;
use kube::Api;
use kube::runtime::events::Recorder;
use kube::runtime::{Controller, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use context::Context;
pub use settings::PlacementSettings;

use crate::metrics::Metrics;
use crate::state::Leadership;
use crate::state::Stores;

/// PlacementHistory passes triggered within this time of each other run once.
const DEBOUNCE: Duration = Duration::from_millis(300);

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
    let controller = Controller::new(api, watcher::Config::default().any_semantic())
        .with_config(kube::runtime::controller::Config::default().debounce(DEBOUNCE));
    // NodeStates (the node agents' reports of cached data), shared with the planner.
    let node_states = stores.node_states.clone();
    let ctx = Arc::new(Context::new(
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
    vec![
        tokio::spawn(keep_key(
            keeper,
            ctx.settings.key_rotation,
            leadership,
            stop.clone(),
        )),
        tokio::spawn(run_controller(
            controller,
            pod_changes,
            ctx.clone(),
            stop.clone(),
        )),
        tokio::spawn(sweep_ungoverned(ctx, stop)),
    ]
}

/// Keep the token key Secret current while this replica leads.
async fn keep_key(
    keeper: keys::KeyKeeper,
    rotation: Duration,
    leadership: Leadership,
    stop: CancellationToken,
) {
    loop {
        if leadership.is_leader()
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
            _ = stop.cancelled() => return,
        }
    }
}

/// Run the PlacementHistory controller, every PlacementHistory also reconciled on each pod
/// change, until `stop`.
async fn run_controller(
    controller: Controller<PlacementHistory>,
    pod_changes: watch::Receiver<u64>,
    ctx: Arc<Context>,
    stop: CancellationToken,
) {
    let pods = futures::stream::unfold(pod_changes, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    });
    // Starting to act re-runs every PlacementHistory at once (not at the follower requeue).
    let wake = futures::stream::select(pods, ctx.leadership.started_acting());
    controller
        .reconcile_all_on(wake)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "placement reconcile");
            }
        })
        .await;
}

/// Release ungoverned gated pods, a sweep every quarter of the grace period (0.2 to 2 s).
async fn sweep_ungoverned(ctx: Arc<Context>, stop: CancellationToken) {
    let every = (ctx.settings.grace / 4).clamp(Duration::from_millis(200), Duration::from_secs(2));
    loop {
        ungoverned::sweep(&ctx).await;
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
    }
}
