//! The agent's reactions and recovery against a real LMDB store and cache directory, without a
//! cluster: pods are fed in as they would come from the watch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ebb_api::nodestate::RecoveryStatus;

use super::*;
use crate::livepod::build::pod;
use crate::localizer::{Fetcher, FetcherConfig, sha256_hex};
use crate::membership::build::{HistoryBuilder, history};
use crate::report::{ReportInput, StoreHealth, build_status};
use crate::store::{LmdbStore, OpenOptions, Opened};

const MIN: i64 = 60_000;

fn open(dir: &Path) -> LmdbStore {
    LmdbStore::open(dir, &OpenOptions::default()).unwrap()
}

fn cfg(root: &Path) -> CoreConfig {
    CoreConfig {
        cache_root: root.to_path_buf(),
        max_resource_bytes: 1 << 20,
        limits: crate::cache::CacheLimits::default(),
    }
}

/// A fetcher allowed to reach the tests' loopback servers, over a prepared cache root.
fn fetcher(cache: &Path) -> Fetcher {
    crate::cache_fs::prepare_root(cache, false).unwrap();
    let policy = crate::fetch_policy::FetchPolicy::new(crate::fetch_policy::PolicyConfig {
        allow_cidrs: vec![crate::fetch_policy::parse_cidr("127.0.0.1").unwrap()],
        ..Default::default()
    })
    .unwrap();
    Fetcher::new(
        FetcherConfig::new(cache.to_path_buf()),
        std::sync::Arc::new(policy),
    )
    .unwrap()
}

fn hbase() -> PlacementHistory {
    let mut ph = history("hbase").selects("app", "hbase").role("region");
    ph.spec.cache_retention = "10m".parse().unwrap();
    ph
}

fn region(name: &str) -> LivePod {
    pod(name).label("app", "hbase").label("role", "region")
}

fn live(pods: Vec<LivePod>) -> BTreeMap<String, LivePod> {
    pods.into_iter().map(|p| (p.uid.clone(), p)).collect()
}

fn commit(store: &LmdbStore, step: &Step) {
    store.apply(&step.ops).unwrap();
}

#[test]
fn restart_records_what_happened_while_down_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let cache = dir.path().join("cache");
    let t0 = 100 * 3_600_000;
    {
        let store = open(&state_dir);
        let (mut core, rec) = AgentCore::recover(cfg(&cache), &store, BTreeMap::new(), t0).unwrap();
        assert_eq!(rec.summary, RecoverySummary::default());
        commit(&store, &core.set_histories(vec![hbase()], t0));
        for p in [
            region("p1").running("main", t0),
            region("p2").running("main", t0),
            region("p3").waiting("main"),
            region("p4").running("main", t0),
        ] {
            let step = core.observe_pod(p, t0 + 1);
            commit(&store, &step);
        }
        // p3 is deleted before it ever ran: the kill is written ahead
        let step = core.observe_pod(region("p3").waiting("main").deleting(), t0 + 2);
        assert!(
            step.ops
                .iter()
                .any(|o| matches!(o, Op::ContainerKilled(..)))
        );
        commit(&store, &step);
        assert_eq!(core.applications.len(), 1);
    } // the agent stops here (crash)

    // while it is down: p1 exits 0, p2 and p3 vanish, p4 keeps running
    let pods_now = live(vec![
        region("p1").exited("main", 0, "Completed", t0, t0 + 5 * MIN),
        region("p4").running("main", t0),
    ]);
    let t1 = t0 + 10 * MIN;
    let store = open(&state_dir);
    assert!(matches!(store.opened(), Opened::Existing { .. }));
    let (mut core, rec) = AgentCore::recover(cfg(&cache), &store, pods_now.clone(), t1).unwrap();
    assert_eq!(rec.summary.containers, 4);
    assert_eq!(rec.summary.lost, 1);
    assert_eq!(rec.summary.completed_while_down, 1);
    assert_eq!(rec.summary.killed_before_launch, 1);
    commit(&store, &core.set_histories(vec![hbase()], t1));
    for p in pods_now.into_values() {
        commit(&store, &core.observe_pod(p, t1));
    }

    let p2 = ContainerId::new("uid-p2", "main");
    let lost = core.containers[&p2].completed.clone().unwrap();
    assert_eq!((lost.exit_code, lost.reason.as_str()), (154, "Lost"));

    let status = build_status(
        ReportInput {
            agent_version: "test",
            schema_version: Some(crate::store::SchemaVersion::CURRENT),
            recovery: RecoveryStatus {
                lost: rec.summary.lost as i64,
                ..RecoveryStatus::default()
            },
            ready: true,
            store: StoreHealth {
                healthy: true,
                message: String::new(),
            },
            containers: &core.containers,
            policies: &core.policies(),
            localized: core.cache.report(),
            pending_deletions: core.deletions.pending(),
            key_ids: Default::default(),
            now: jiff::Timestamp::from_millisecond(t1).unwrap(),
        },
        &[],
    );
    assert_eq!(status.roles.len(), 1);
    let r = &status.roles[0];
    assert_eq!(
        (
            r.namespace.as_str(),
            r.placement_history.as_str(),
            r.role.as_str()
        ),
        ("ns", "hbase", "region")
    );
    assert_eq!(r.node_failures, 1, "p2 was lost");
    assert_eq!(r.completed, 2, "p1 exited 0, p3 was killed before launch");
    assert_eq!(
        r.start_failures + r.application_failures + r.limits_exceeded + r.preempted,
        0
    );
    assert_eq!(status.containers_tracked, 4);
    drop(store);

    // what recovery decided was committed: a third start sees the Lost record as it is
    let store = open(&state_dir);
    let again = store.load_containers().unwrap();
    assert_eq!(
        again.containers[&p2].completed.as_ref().unwrap().exit_code,
        154
    );
    let (_, rec) = AgentCore::recover(cfg(&cache), &store, live(vec![]), t1 + 1).unwrap();
    assert_eq!(
        rec.summary.lost, 1,
        "p4 is now gone and lost; p2 is not counted twice"
    );
}

async fn serve(content: &'static [u8]) -> String {
    use axum::Router;
    use axum::routing::get;
    let app = Router::new().route("/model.bin", get(move || async move { content }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/model.bin")
}

fn with_resource(url: &str, sha: &str) -> PlacementHistory {
    hbase().resource("region", "model.bin", url, sha)
}

/// A recovered core over a fresh store and cache, whose one history asks for the resource a
/// loopback server serves as `served`, under the digest of `expected`.
/// Returns the temporary directory (kept while in use), the cache root, store, fetcher and core.
async fn fetching(
    served: &'static [u8],
    expected: &[u8],
    t0: UnixMillis,
) -> (tempfile::TempDir, PathBuf, LmdbStore, Fetcher, AgentCore) {
    let url = serve(served).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let store = open(&dir.path().join("state"));
    let fetcher = fetcher(&cache);
    let (mut core, _) = AgentCore::recover(cfg(&cache), &store, BTreeMap::new(), t0).unwrap();
    commit(
        &store,
        &core.set_histories(vec![with_resource(&url, &sha256_hex(expected))], t0),
    );
    (dir, cache, store, fetcher, core)
}

async fn run_fetches(core: &mut AgentCore, store: &LmdbStore, fetcher: &Fetcher, step: Step) {
    commit(store, &step);
    for req in step.fetches {
        let result = fetcher.fetch(&req, || 7).await.map_err(|e| e.to_string());
        let done = core.fetch_done(&req, result, 7);
        commit(store, &done);
    }
}

#[tokio::test]
async fn resources_are_shared_by_reference_and_deleted_after_retention() {
    const CONTENT: &[u8] = b"region model";
    let t0 = 1_000_000;
    let (_dir, cache, store, fetcher, mut core) = fetching(CONTENT, CONTENT, t0).await;

    let step = core.observe_pod(region("p1").running("main", t0), t0);
    assert_eq!(step.fetches.len(), 1);
    let path = step.fetches[0].local_path.clone();
    run_fetches(&mut core, &store, &fetcher, step).await;
    let view = core.api_pods();
    let res = &view["uid-p1"].resources[0];
    assert_eq!(res.state, "Localized");
    assert_eq!(std::fs::read(res.path.as_ref().unwrap()).unwrap(), CONTENT);

    let step = core.observe_pod(region("p2").running("main", t0), t0);
    assert!(step.fetches.is_empty(), "already cached: no second fetch");
    commit(&store, &step);

    let step = core.pod_gone("uid-p1", t0 + 1);
    assert!(
        !step
            .ops
            .iter()
            .any(|o| matches!(o, Op::DeletionTaskStored(_))),
        "p2 still uses it"
    );
    commit(&store, &step);
    let step = core.pod_gone("uid-p2", t0 + 2);
    let task = step
        .ops
        .iter()
        .find_map(|o| match o {
            Op::DeletionTaskStored(t) => Some(t.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        task.scheduled_at,
        t0 + 2 + 10 * MIN,
        "after the history's cacheRetention"
    );
    commit(&store, &step);

    let (ops, problems) = core.run_due_deletions(t0 + 2 + 10 * MIN - 1);
    assert!(ops.is_empty() && problems.is_empty());
    assert!(cache.join(&path).exists());
    let (ops, problems) = core.run_due_deletions(t0 + 2 + 10 * MIN);
    assert!(problems.is_empty(), "{problems:?}");
    store.apply(&ops).unwrap();
    assert!(!cache.join(&path).exists());
    assert!(store.load_localization().unwrap().is_empty());
    assert!(store.load_deletion_tasks().unwrap().is_empty());
}

#[tokio::test]
async fn reuse_within_retention_cancels_the_deletion() {
    const CONTENT: &[u8] = b"warm data";
    let (_dir, cache, store, fetcher, mut core) = fetching(CONTENT, CONTENT, 0).await;
    let step = core.observe_pod(region("p1").running("main", 0), 0);
    let path = step.fetches[0].local_path.clone();
    run_fetches(&mut core, &store, &fetcher, step).await;
    commit(&store, &core.pod_gone("uid-p1", 1));
    assert_eq!(store.load_deletion_tasks().unwrap().len(), 1);
    let step = core.observe_pod(region("p9").running("main", 2), 2);
    assert!(step.fetches.is_empty());
    assert!(
        step.ops
            .iter()
            .any(|o| matches!(o, Op::DeletionTaskRemoved(_)))
    );
    commit(&store, &step);
    let (ops, _) = core.run_due_deletions(100 * MIN);
    assert!(ops.is_empty());
    assert!(cache.join(&path).exists());
    assert!(store.load_deletion_tasks().unwrap().is_empty());
}

#[tokio::test]
async fn a_crash_mid_fetch_leaves_no_partial_file_and_the_fetch_is_requested_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let state = dir.path().join("state");
    let sha = sha256_hex(b"x");
    let histories = vec![with_resource("http://127.0.0.1:9/never", &sha)];
    let path;
    {
        let store = open(&state);
        let (mut core, _) = AgentCore::recover(cfg(&cache), &store, BTreeMap::new(), 0).unwrap();
        commit(&store, &core.set_histories(histories.clone(), 0));
        let step = core.observe_pod(region("p1").running("main", 0), 0);
        commit(&store, &step);
        path = step.fetches[0].local_path.clone();
        // the fetch got this far before the agent died
        let partial = cache.join(format!("{path}.part-1234-0"));
        std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
        std::fs::write(&partial, b"half").unwrap();
    }
    let store = open(&state);
    let pods = live(vec![region("p1").running("main", 0)]);
    let (mut core, rec) = AgentCore::recover(cfg(&cache), &store, pods.clone(), 5).unwrap();
    assert_eq!(rec.summary.discarded_fetches, 1);
    assert_eq!(rec.files_deleted, 1);
    assert!(list_cache_files(&cache).unwrap().is_empty());
    assert!(store.load_localization().unwrap().is_empty());
    commit(&store, &core.set_histories(histories, 5));
    let step = core.observe_pod(pods["uid-p1"].clone(), 5);
    assert_eq!(step.fetches.len(), 1, "re-requested by the recovered pod");
    assert_eq!(step.fetches[0].local_path, path);
}

#[tokio::test]
async fn a_digest_mismatch_is_reported_and_never_served() {
    let (_dir, cache, store, fetcher, mut core) = fetching(b"tampered", b"original", 0).await;
    let step = core.observe_pod(region("p1").running("main", 0), 0);
    run_fetches(&mut core, &store, &fetcher, step).await;
    let view = core.api_pods();
    let res = &view["uid-p1"].resources[0];
    assert_eq!(res.state, "Failed");
    assert_eq!(res.path, None);
    assert!(
        res.message.as_ref().unwrap().contains("digest mismatch"),
        "{res:?}"
    );
    assert!(
        !res.message
            .as_ref()
            .unwrap()
            .contains(&sha256_hex(b"tampered")),
        "the content's digest is revealed: {res:?}"
    );
    let report = core.cache.report();
    assert_eq!(report[0].state, "Failed");
    assert!(list_cache_files(&cache).unwrap().is_empty());
    assert!(store.load_localization().unwrap().is_empty());
}

#[test]
fn pending_deletions_survive_a_restart_and_run_when_due() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let state = dir.path().join("state");
    std::fs::create_dir_all(cache.join("public/ab")).unwrap();
    std::fs::write(cache.join("public/ab/f"), b"data").unwrap();
    {
        let store = open(&state);
        store
            .apply(&[Op::LocalizationCompleted {
                scope: CacheScope::Public,
                local_path: "public/ab/f".into(),
                record: LocalizedRecord::default(),
            }])
            .unwrap();
        let (mut core, rec) = AgentCore::recover(cfg(&cache), &store, BTreeMap::new(), 0).unwrap();
        assert_eq!(rec.summary.localized, 1);
        // nobody uses it after the first sync: scheduled after the default retention
        let step = core.after_initial_sync(0);
        assert_eq!(step.ops.len(), 1);
        commit(&store, &step);
    }
    let store = open(&state);
    let (mut core, rec) = AgentCore::recover(cfg(&cache), &store, BTreeMap::new(), 10).unwrap();
    assert_eq!(rec.summary.deletions_resumed, 1);
    assert!(
        core.after_initial_sync(10).ops.is_empty(),
        "already covered by the resumed task"
    );
    let (ops, _) = core.run_due_deletions(DEFAULT_CACHE_RETENTION_MS - 1);
    assert!(ops.is_empty());
    let (ops, _) = core.run_due_deletions(DEFAULT_CACHE_RETENTION_MS);
    store.apply(&ops).unwrap();
    assert!(!cache.join("public/ab/f").exists());
    assert!(store.load_deletion_tasks().unwrap().is_empty());
    assert!(store.load_localization().unwrap().is_empty());
}

#[test]
fn cache_retention_is_capped_and_never_overflows() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let store = open(&dir.path().join("state"));
    let t0 = i64::MAX - 1_000;
    let (mut core, _) = AgentCore::recover(cfg(&cache), &store, BTreeMap::new(), 0).unwrap();
    let mut ph = hbase().resource(
        "region",
        "model.bin",
        "https://artifacts.example.com/m",
        &"ab".repeat(32),
    );
    ph.spec.cache_retention = "100000d".parse().unwrap();
    core.set_histories(vec![ph.clone()], 0);
    core.observe_pod(region("p1").running("main", 0), 0);
    let step = core.pod_gone("uid-p1", 0);
    let scheduled: Vec<i64> = step
        .ops
        .iter()
        .filter_map(|o| match o {
            Op::DeletionTaskStored(t) => Some(t.scheduled_at),
            _ => None,
        })
        .collect();
    assert_eq!(
        scheduled,
        vec![MAX_CACHE_RETENTION_MS],
        "capped at the maximum"
    );
    // near the end of time the deadline saturates instead of wrapping into the past
    core.observe_pod(region("p2").running("main", t0), t0);
    let step = core.pod_gone("uid-p2", t0);
    assert!(
        step.ops.iter().any(|o| matches!(o,
        Op::DeletionTaskStored(t) if t.scheduled_at == i64::MAX)),
        "{:?}",
        step.ops
    );
}

#[test]
fn urls_are_stored_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let store = open(&dir.path().join("state"));
    let (mut core, _) = AgentCore::recover(cfg(&cache), &store, BTreeMap::new(), 0).unwrap();
    let ph = hbase().resource(
        "region",
        "model.bin",
        "https://user:hunter2@artifacts.example.com/m?X-Amz-Signature=SIGNED",
        &"ab".repeat(32),
    );
    core.set_histories(vec![ph], 0);
    let step = core.observe_pod(region("p1").running("main", 0), 0);
    assert_eq!(step.fetches.len(), 1);
    let stored = format!("{:?}", step.ops);
    assert!(stored.contains("artifacts.example.com/m"), "{stored}");
    assert!(
        !stored.contains("hunter2") && !stored.contains("SIGNED"),
        "{stored}"
    );
}
