//! The YARN NodeManager state-store scenarios, ported: every subsystem written, reopened, loaded.

use std::path::Path;
use std::sync::Arc;

use super::*;

fn open(dir: &Path) -> LmdbStore {
    LmdbStore::open(dir, &OpenOptions::default()).unwrap()
}

fn cid(uid: &str) -> ContainerId {
    ContainerId::new(uid, "main")
}

fn request(ns: &str, pod: &str) -> ContainerRequest {
    ContainerRequest {
        namespace: ns.into(),
        pod_name: pod.into(),
        image: "registry.example/app:1".into(),
        placement_history: Some("hbase".into()),
        role: Some("region".into()),
        requested_at: 1_000,
    }
}

fn key(id: &str, byte: u8) -> MasterKey {
    MasterKey {
        id: id.into(),
        secret: vec![byte; 32],
    }
}

#[test]
fn new_store_then_reopened_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert_eq!(store.opened(), Opened::New);
    assert!(store.can_recover());
    drop(store);
    let store = open(dir.path());
    assert_eq!(
        store.opened(),
        Opened::Existing {
            previous: SchemaVersion::CURRENT
        }
    );
}

#[test]
fn empty_state_loads_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let state = store.load_all().unwrap();
    assert!(state.containers.containers.is_empty());
    assert!(state.containers.discarded.is_empty());
    assert!(state.localization.is_empty());
    assert!(state.applications.is_empty());
    assert_eq!(state.tokens, TokenState::default());
    assert!(state.deletion_tasks.is_empty());
}

#[test]
fn same_major_is_restamped_other_major_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let older_minor = SchemaVersion {
        major: SchemaVersion::CURRENT.major,
        minor: SchemaVersion::CURRENT.minor + 7,
    };
    let store = open(dir.path());
    store.stamp_schema_version(older_minor).unwrap();
    drop(store);
    let store = open(dir.path());
    assert_eq!(
        store.opened(),
        Opened::Existing {
            previous: older_minor
        }
    );
    assert_eq!(
        store.schema_version().unwrap(),
        Some(SchemaVersion::CURRENT)
    );
    let other_major = SchemaVersion {
        major: SchemaVersion::CURRENT.major + 1,
        minor: 0,
    };
    store.stamp_schema_version(other_major).unwrap();
    drop(store);
    let err = LmdbStore::open(dir.path(), &OpenOptions::default())
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(
        matches!(err, StoreError::IncompatibleSchema { .. }),
        "{msg}"
    );
    assert!(msg.contains(&other_major.to_string()), "{msg}");
    assert!(msg.contains(&SchemaVersion::CURRENT.to_string()), "{msg}");
    assert!(msg.contains("--reset-state"), "{msg}");
    // refused, not re-stamped: still the other major on disk
    let ro = LmdbStore::open(
        dir.path(),
        &OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    );
    assert!(
        matches!(ro, Err(StoreError::IncompatibleSchema { found, .. }) if found == other_major)
    );
}

#[test]
fn applications_store_finish_remove_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let a = AppId::new("team-a", "hbase");
    let b = AppId::new("team-b", "kafka");
    {
        let store = open(dir.path());
        let rec = AppRecord {
            uid: "u-a".into(),
            init_at: 10,
            finished_at: None,
        };
        store.store_application(&a, &rec).unwrap();
        store
            .store_application(
                &b,
                &AppRecord {
                    uid: "u-b".into(),
                    init_at: 20,
                    finished_at: None,
                },
            )
            .unwrap();
        store.finish_application(&b, 99).unwrap();
    }
    let store = open(dir.path());
    let apps = store.load_applications().unwrap();
    assert_eq!(apps.len(), 2);
    assert_eq!(apps[&a].finished_at, None);
    assert_eq!(apps[&a].uid, "u-a");
    assert_eq!(apps[&b].finished_at, Some(99));
    store.remove_application(&b).unwrap();
    drop(store);
    let apps = open(dir.path()).load_applications().unwrap();
    assert_eq!(apps.keys().collect::<Vec<_>>(), vec![&a]);
}

#[test]
fn container_walks_every_state_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let id = cid("pod-1");
    let load = |dir: &Path| open(dir).load_containers().unwrap();

    open(dir.path())
        .store_container(&id, &request("ns", "web-1"))
        .unwrap();
    let s = load(dir.path());
    let rec = &s.containers[&id];
    assert_eq!(rec.requested.as_ref().unwrap().pod_name, "web-1");
    assert_eq!(rec.launched_at, None);
    assert_eq!(rec.killed, None);
    assert_eq!(rec.completed, None);

    open(dir.path())
        .store_container_launched(&id, 2_000)
        .unwrap();
    assert_eq!(load(dir.path()).containers[&id].launched_at, Some(2_000));

    let kill = KillRecord {
        at: 3_000,
        reason: "pod deleted".into(),
    };
    open(dir.path()).store_container_killed(&id, &kill).unwrap();
    let s = load(dir.path());
    assert_eq!(s.containers[&id].killed.as_ref(), Some(&kill));
    assert_eq!(s.containers[&id].launched_at, Some(2_000));

    let done = Completion {
        exit_code: 137,
        reason: "Error".into(),
        message: "killed by agent".into(),
        finished_at: 4_000,
    };
    {
        let store = open(dir.path());
        store.store_container_completed(&id, &done).unwrap();
        store
            .store_container_diagnostics(&id, "oom at 3.9s")
            .unwrap();
        store
            .apply(&[Op::ContainerRestarts(id.clone(), 3)])
            .unwrap();
    }
    let s = load(dir.path());
    let rec = &s.containers[&id];
    assert_eq!(rec.completed.as_ref(), Some(&done));
    assert_eq!(rec.diagnostics.as_deref(), Some("oom at 3.9s"));
    assert_eq!(rec.restart_count, 3);
    assert_eq!(rec.killed.as_ref(), Some(&kill));

    // a record without `requested` is discarded at load
    let orphan = cid("pod-orphan");
    open(dir.path())
        .store_container_launched(&orphan, 5)
        .unwrap();
    let s = load(dir.path());
    assert!(!s.containers.contains_key(&orphan));
    assert_eq!(s.discarded, vec![orphan]);

    open(dir.path()).remove_container(&id).unwrap();
    assert!(load(dir.path()).containers.is_empty());
}

#[test]
fn localization_start_finish_remove_for_every_scope_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let scopes = [
        CacheScope::Public,
        CacheScope::Namespace {
            namespace: "team-a".into(),
        },
        CacheScope::Application {
            namespace: "team-a".into(),
            placement_history: "hbase".into(),
        },
    ];
    let req = |n: &str| ResourceRequest {
        name: n.into(),
        url: format!("https://example.com/{n}"),
        sha256: "ab".repeat(32),
        started_at: 1,
    };
    {
        let store = open(dir.path());
        for (i, scope) in scopes.iter().enumerate() {
            store
                .start_resource_localization(scope, &format!("r{i}/started-only"), &req("a"))
                .unwrap();
            store
                .start_resource_localization(scope, &format!("r{i}/finished"), &req("b"))
                .unwrap();
            store
                .finish_resource_localization(
                    scope,
                    &format!("r{i}/finished"),
                    &LocalizedRecord {
                        name: "b".into(),
                        size_bytes: 100 + i as u64,
                        ..LocalizedRecord::default()
                    },
                )
                .unwrap();
            store
                .start_resource_localization(scope, &format!("r{i}/removed"), &req("c"))
                .unwrap();
        }
    }
    let store = open(dir.path());
    let entries = store.load_localization().unwrap();
    assert_eq!(entries.len(), 9);
    for (i, scope) in scopes.iter().enumerate() {
        let find = |p: &str| {
            entries
                .iter()
                .find(|e| &e.scope == scope && e.local_path == format!("r{i}/{p}"))
                .map(|e| e.state.clone())
        };
        assert!(
            matches!(find("started-only"), Some(LocalizationState::Started(r)) if r.name == "a")
        );
        assert!(
            matches!(find("finished"), Some(LocalizationState::Completed(r)) if r.size_bytes == 100 + i as u64)
        );
        store
            .remove_localized_resource(scope, &format!("r{i}/removed"))
            .unwrap();
        store
            .remove_localized_resource(scope, &format!("r{i}/finished"))
            .unwrap();
    }
    drop(store);
    let entries = open(dir.path()).load_localization().unwrap();
    assert_eq!(entries.len(), 3);
    assert!(
        entries
            .iter()
            .all(|e| e.local_path.ends_with("started-only"))
    );
    // the completed record replaced the started one: no key is left over
    let raw = open(dir.path()).raw_pairs().unwrap();
    assert_eq!(raw["localization"].len(), 3);
}

#[test]
fn deletion_tasks_with_successors_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let task = |id: u64, successors: Vec<u64>| DeletionTask {
        id,
        paths: vec![format!("app/{id}")],
        scheduled_at: id as i64 * 10,
        successors,
        reason: "retention".into(),
    };
    {
        let store = open(dir.path());
        store.store_deletion_task(&task(1, vec![2, 3])).unwrap();
        store.store_deletion_task(&task(2, vec![])).unwrap();
        store.store_deletion_task(&task(3, vec![4])).unwrap();
        store.store_deletion_task(&task(4, vec![])).unwrap();
        store.store_deletion_task(&task(12, vec![])).unwrap();
        store.remove_deletion_task(4).unwrap();
    }
    let tasks = open(dir.path()).load_deletion_tasks().unwrap();
    assert_eq!(tasks.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 12]);
    assert_eq!(tasks[&1].successors, vec![2, 3]);
    assert_eq!(tasks[&3].successors, vec![4]);
    assert_eq!(tasks[&12].paths, vec!["app/12".to_string()]);
}

#[test]
fn token_keys_rotate_and_container_expiry_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.store_current_master_key(&key("k1", 1)).unwrap();
        store
            .store_container_token(
                "pod-1",
                &TokenRecord {
                    role: "region".into(),
                    expires_at: 500,
                },
            )
            .unwrap();
        store
            .store_container_token(
                "pod-2",
                &TokenRecord {
                    role: "master".into(),
                    expires_at: 900,
                },
            )
            .unwrap();
    }
    let t = open(dir.path()).load_tokens().unwrap();
    assert_eq!(t.current, Some(key("k1", 1)));
    assert_eq!(t.previous, None);
    assert_eq!(t.containers.len(), 2);
    {
        // rotation: the current key becomes the previous one
        let store = open(dir.path());
        store
            .apply(&[
                Op::PreviousMasterKey(key("k1", 1)),
                Op::CurrentMasterKey(key("k2", 2)),
            ])
            .unwrap();
        store.remove_container_token("pod-1").unwrap();
    }
    let t = open(dir.path()).load_tokens().unwrap();
    assert_eq!(t.current, Some(key("k2", 2)));
    assert_eq!(t.previous, Some(key("k1", 1)));
    assert_eq!(t.containers.keys().collect::<Vec<_>>(), vec!["pod-2"]);
    assert_eq!(t.containers["pod-2"].expires_at, 900);
    assert_eq!(t.containers["pod-2"].role, "master");
}

#[test]
fn null_store_refuses_loads_and_accepts_writes() {
    let store = NullStore;
    assert!(!store.can_recover());
    store
        .store_container(&cid("p"), &request("ns", "p"))
        .unwrap();
    assert!(matches!(
        store.load_containers(),
        Err(StoreError::NotRecoverable)
    ));
    assert!(matches!(
        store.load_localization(),
        Err(StoreError::NotRecoverable)
    ));
    assert!(matches!(
        store.load_applications(),
        Err(StoreError::NotRecoverable)
    ));
    assert!(matches!(
        store.load_tokens(),
        Err(StoreError::NotRecoverable)
    ));
    assert!(matches!(
        store.load_deletion_tasks(),
        Err(StoreError::NotRecoverable)
    ));
    assert!(matches!(store.load_all(), Err(StoreError::NotRecoverable)));
}

#[test]
fn map_grows_when_full() {
    let dir = tempfile::tempdir().unwrap();
    let store = LmdbStore::open(
        dir.path(),
        &OpenOptions {
            initial_map_size: 1 << 20,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let before = store.map_size();
    let big = "x".repeat(4096);
    for i in 0..1000 {
        store
            .store_container_diagnostics(&cid(&format!("p{i}")), &big)
            .unwrap();
    }
    assert!(store.map_size() > before, "map did not grow from {before}");
    assert_eq!(store.raw_pairs().unwrap()["containers"].len(), 1000);
}

#[test]
fn map_that_cannot_grow_fails_the_write_without_losing_earlier_data() {
    let dir = tempfile::tempdir().unwrap();
    let store = LmdbStore::open(
        dir.path(),
        &OpenOptions {
            initial_map_size: 1 << 20,
            max_map_size: 1 << 20,
            read_only: false,
        },
    )
    .unwrap();
    store
        .store_container(&cid("kept"), &request("ns", "kept"))
        .unwrap();
    let big = "x".repeat(2 << 20);
    let err = store
        .store_container_diagnostics(&cid("big"), &big)
        .unwrap_err();
    assert!(err.to_string().contains("full"), "{err}");
    assert!(
        store
            .load_containers()
            .unwrap()
            .containers
            .contains_key(&cid("kept"))
    );
}

#[test]
fn unreadable_store_is_refused_and_left_untouched_until_reset() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let garbage = vec![0x5a_u8; 64 * 1024];
    std::fs::write(state.join("data.mdb"), &garbage).unwrap();
    let err = LmdbStore::open(&state, &OpenOptions::default())
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Open { .. }), "{msg}");
    assert!(msg.contains(&state.display().to_string()), "{msg}");
    assert!(msg.contains("--reset-state"), "{msg}");
    assert_eq!(std::fs::read(state.join("data.mdb")).unwrap(), garbage);

    let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
    let aside = reset_state_dir(&state, now).unwrap();
    assert_eq!(
        aside.file_name().unwrap().to_string_lossy(),
        "state.reset-20231114T221320Z"
    );
    assert_eq!(std::fs::read(aside.join("data.mdb")).unwrap(), garbage);
    let fresh = open(&state);
    assert_eq!(fresh.opened(), Opened::New);
}

#[test]
fn group_writer_batches_concurrent_transitions_and_acks_after_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    let writer = Arc::new(GroupWriter::spawn(store.clone(), 100));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let w = writer.clone();
            std::thread::spawn(move || {
                let pending: Vec<_> = (0..50)
                    .map(|i| {
                        w.submit(vec![Op::ContainerRequested(
                            cid(&format!("t{t}-{i}")),
                            request("ns", "p"),
                        )])
                    })
                    .collect();
                for p in pending {
                    p.blocking_recv().unwrap().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let health = writer.health();
    assert!(health.healthy());
    assert_eq!(health.transitions(), 400);
    assert!(
        health.commits() < 400,
        "no batching happened: {} commits",
        health.commits()
    );
    assert_eq!(store.load_containers().unwrap().containers.len(), 400);
}

#[test]
fn group_writer_reports_failures_as_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        LmdbStore::open(
            dir.path(),
            &OpenOptions {
                initial_map_size: 1 << 20,
                max_map_size: 1 << 20,
                read_only: false,
            },
        )
        .unwrap(),
    );
    let writer = GroupWriter::spawn(store, 10);
    let big = "x".repeat(2 << 20);
    let err = writer
        .commit_blocking(vec![Op::ContainerDiagnostics(cid("p"), big)])
        .unwrap_err();
    assert!(matches!(err, StoreError::Write(_)));
    let health = writer.health();
    assert!(!health.healthy());
    assert!(health.last_error().unwrap().contains("full"));
    writer
        .commit_blocking(vec![Op::ContainerLaunched(cid("p"), 1)])
        .unwrap();
    assert!(health.healthy());
}
