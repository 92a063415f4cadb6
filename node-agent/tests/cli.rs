//! The binary's edges: `dump` of a store written by the library, and the refusals at start.

use std::process::Command;

use ebb_node_agent::store::{
    AppId, AppRecord, ContainerId, ContainerRequest, LmdbStore, MasterKey, OpenOptions, StateStore,
};

const BIN: &str = env!("CARGO_BIN_EXE_ebb-node-agent");

#[test]
fn dump_prints_every_subsystem_as_json_without_key_material() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = LmdbStore::open(dir.path(), &OpenOptions::default()).unwrap();
        store
            .store_container(
                &ContainerId::new("uid-1", "main"),
                &ContainerRequest {
                    namespace: "ns".into(),
                    pod_name: "web-1".into(),
                    ..ContainerRequest::default()
                },
            )
            .unwrap();
        store
            .store_application(
                &AppId::new("ns", "hbase"),
                &AppRecord {
                    uid: "u".into(),
                    init_at: 1,
                    finished_at: None,
                },
            )
            .unwrap();
        store
            .store_current_master_key(&MasterKey {
                id: "k7".into(),
                secret: b"0123456789abcdef0123456789abcdef".to_vec(),
            })
            .unwrap();
    }
    let out = Command::new(BIN)
        .args(["dump", "--state-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schemaVersion"], "1.0");
    assert_eq!(v["containers"][0]["podUid"], "uid-1");
    assert_eq!(v["containers"][0]["requested"]["pod_name"], "web-1");
    assert_eq!(v["applications"][0]["placementHistory"], "hbase");
    assert_eq!(v["tokens"]["currentKeyId"], "k7");
    assert!(
        !text.contains("0123456789abcdef"),
        "key material leaked: {text}"
    );
    // 48 = '0' as a byte, in case it was printed as an array
    assert!(!text.contains("[48,49,50"), "key material leaked: {text}");
}

#[test]
fn dump_of_a_missing_store_names_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing-here");
    let out = Command::new(BIN)
        .args(["dump", "--state-dir"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing-here"), "{err}");
    assert!(!missing.exists(), "dump must not create anything");
}

#[test]
fn run_refuses_an_unreadable_store_before_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("data.mdb"), vec![3u8; 8192]).unwrap();
    let out = Command::new(BIN)
        .args(["run", "--node-name", "n1", "--no-socket", "--state-dir"])
        .arg(&state)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--reset-state"), "{err}");
    assert!(err.contains(&state.display().to_string()), "{err}");
    assert_eq!(
        std::fs::read(state.join("data.mdb")).unwrap(),
        vec![3u8; 8192]
    );
}
