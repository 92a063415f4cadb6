//! State store benchmarks: durable transitions per second (one per transaction, and group
//! committed in batches of 100) and recovery time for 100,000 containers + 50,000 localized
//! resources, on the LMDB store and, as the baseline of the original design, on LevelDB
//! (`rusty-leveldb`, through the same `StateStore` trait, implemented here only).
//! Ends with a summary of figures and LMDB/LevelDB ratios measured in the same run.

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use ebb_node_agent::recovery::{self, RecoveryInput};
use ebb_node_agent::store::codec::{self, Write};
use ebb_node_agent::store::keys;
use ebb_node_agent::store::*;
use rusty_leveldb::LdbIterator;

/// `StateStore` over LevelDB: one keyspace, keys prefixed with `<database>/`; every `apply` is
/// one write batch followed by an fsync of the write-ahead log (the LevelDB equivalent of a
/// durable transaction). rusty-leveldb's own `sync` flag only flushes the file to the OS, so the
/// bench fsyncs the current `.log` file itself (fsync acts on the file, whichever descriptor).
struct LevelDbStore {
    db: Mutex<rusty_leveldb::DB>,
    dir: std::path::PathBuf,
}

impl LevelDbStore {
    fn open(dir: &Path) -> LevelDbStore {
        let opts = rusty_leveldb::Options {
            create_if_missing: true,
            ..rusty_leveldb::Options::default()
        };
        let db = rusty_leveldb::DB::open(dir, opts).unwrap_or_else(|e| panic!("leveldb: {e}"));
        LevelDbStore {
            db: Mutex::new(db),
            dir: dir.to_path_buf(),
        }
    }

    /// fsyncs the newest write-ahead log file.
    fn sync_log(&self) -> std::io::Result<()> {
        let mut newest: Option<(u64, std::path::PathBuf)> = None;
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let number = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(n) = number
                && newest.as_ref().is_none_or(|(m, _)| n > *m)
            {
                newest = Some((n, path));
            }
        }
        match newest {
            Some((_, path)) => std::fs::File::open(path)?.sync_data(),
            None => Ok(()),
        }
    }

    fn scan(&self, db_name: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let prefix = format!("{db_name}/");
        let mut db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        let mut it = db.new_iter().map_err(|e| StoreError::Read(e.to_string()))?;
        it.seek(prefix.as_bytes());
        let mut out = Vec::new();
        while let Some((k, v)) = it.current() {
            let Some(rest) = k.strip_prefix(prefix.as_bytes()) else {
                break;
            };
            out.push((String::from_utf8_lossy(rest).into_owned(), v.to_vec()));
            if !it.advance() {
                break;
            }
        }
        Ok(out)
    }
}

fn pairs(v: &[(String, Vec<u8>)]) -> impl Iterator<Item = codec::Pair<'_>> {
    v.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
}

impl StateStore for LevelDbStore {
    fn can_recover(&self) -> bool {
        true
    }
    fn apply(&self, ops: &[Op]) -> Result<(), StoreError> {
        let mut writes = Vec::new();
        for op in ops {
            codec::writes_for(op, &mut writes);
        }
        let mut batch = rusty_leveldb::WriteBatch::default();
        for w in &writes {
            match w {
                Write::Put { db, key, value } => batch.put(format!("{db}/{key}").as_bytes(), value),
                Write::Delete { db, key } => batch.delete(format!("{db}/{key}").as_bytes()),
            }
        }
        let mut db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        db.write(batch, true)
            .map_err(|e| StoreError::Write(e.to_string()))?;
        self.sync_log()
            .map_err(|e| StoreError::Write(format!("fsync of the LevelDB log: {e}")))
    }
    fn load_containers(&self) -> Result<ContainersState, StoreError> {
        codec::decode_containers(pairs(&self.scan(keys::DB_CONTAINERS)?))
    }
    fn load_localization(&self) -> Result<Vec<LocalizationEntry>, StoreError> {
        codec::decode_localization(pairs(&self.scan(keys::DB_LOCALIZATION)?))
    }
    fn load_applications(&self) -> Result<BTreeMap<AppId, AppRecord>, StoreError> {
        codec::decode_applications(pairs(&self.scan(keys::DB_APPLICATIONS)?))
    }
    fn load_tokens(&self) -> Result<TokenState, StoreError> {
        codec::decode_tokens(pairs(&self.scan(keys::DB_TOKENS)?))
    }
    fn load_deletion_tasks(&self) -> Result<BTreeMap<u64, DeletionTask>, StoreError> {
        codec::decode_deletion_tasks(pairs(&self.scan(keys::DB_DELETION)?))
    }
}

const CONTAINERS: u64 = 100_000;
const RESOURCES: u64 = 50_000;

fn launched(i: u64) -> Op {
    Op::ContainerLaunched(ContainerId::new(format!("uid-{i:08}"), "main"), i as i64)
}

/// 100,000 containers (requested, launched; every other one completed) and 50,000 completed
/// localized resources over the three scopes, written in batches of 1,000.
fn populate(store: &dyn StateStore) {
    let mut ops = Vec::with_capacity(3_000);
    for i in 0..CONTAINERS {
        let id = ContainerId::new(format!("uid-{i:08}"), "main");
        ops.push(Op::ContainerRequested(
            id.clone(),
            ContainerRequest {
                namespace: format!("ns-{}", i % 20),
                pod_name: format!("pod-{i}"),
                image: "registry.example/app:1".into(),
                placement_history: Some("hbase".into()),
                role: Some("region".into()),
                requested_at: i as i64,
            },
        ));
        ops.push(Op::ContainerLaunched(id.clone(), i as i64 + 1));
        if i % 2 == 0 {
            ops.push(Op::ContainerCompleted(
                id,
                Completion {
                    exit_code: 0,
                    reason: "Completed".into(),
                    message: String::new(),
                    finished_at: i as i64 + 2,
                },
            ));
        }
        if ops.len() >= 2_000 {
            store
                .apply(&ops)
                .unwrap_or_else(|e| panic!("populate: {e}"));
            ops.clear();
        }
    }
    for i in 0..RESOURCES {
        let scope = match i % 3 {
            0 => CacheScope::Public,
            1 => CacheScope::Namespace {
                namespace: format!("ns-{}", i % 20),
            },
            _ => CacheScope::Application {
                namespace: format!("ns-{}", i % 20),
                placement_history: "hbase".into(),
            },
        };
        ops.push(Op::LocalizationCompleted {
            scope,
            local_path: format!("r/{i:08}/model.bin"),
            record: LocalizedRecord {
                name: "model.bin".into(),
                url: format!("https://artifacts.example/{i}"),
                sha256: "ab".repeat(32),
                size_bytes: 1 << 20,
                completed_at: i as i64,
            },
        });
        if ops.len() >= 2_000 {
            store
                .apply(&ops)
                .unwrap_or_else(|e| panic!("populate: {e}"));
            ops.clear();
        }
    }
    store
        .apply(&ops)
        .unwrap_or_else(|e| panic!("populate: {e}"));
}

/// Recovery as the agent does it minus I/O outside the store: load every subsystem and plan
/// against the live pods (none: every launched, uncompleted container is found lost) and a
/// cache listing in which every resource is present.
fn recover(store: &dyn StateStore, files: &BTreeSet<String>) -> usize {
    let state = store.load_all().unwrap_or_else(|e| panic!("load: {e}"));
    let plan = recovery::plan(RecoveryInput {
        state,
        live_pods: &BTreeMap::new(),
        cache_files: files,
        now: i64::MAX / 2,
    });
    assert_eq!(plan.summary.containers as u64, CONTAINERS);
    assert_eq!(plan.summary.localized as u64, RESOURCES);
    plan.ops.len()
}

fn cache_files() -> BTreeSet<String> {
    (0..RESOURCES)
        .map(|i| format!("r/{i:08}/model.bin"))
        .collect()
}

struct Stores {
    _dir: tempfile::TempDir,
    lmdb: LmdbStore,
    leveldb: LevelDbStore,
}

fn stores() -> Stores {
    // under the target directory: a real disk, so fsync costs what it costs
    let base = std::env::var_os("CARGO_TARGET_DIR").map(std::path::PathBuf::from);
    let dir = match base {
        Some(b) => tempfile::tempdir_in(b),
        None => tempfile::tempdir(),
    }
    .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let lmdb = LmdbStore::open(&dir.path().join("lmdb"), &OpenOptions::default())
        .unwrap_or_else(|e| panic!("lmdb: {e}"));
    let leveldb = LevelDbStore::open(&dir.path().join("leveldb"));
    Stores {
        _dir: dir,
        lmdb,
        leveldb,
    }
}

fn bench_transitions(c: &mut Criterion, s: &Stores) {
    let mut g = c.benchmark_group("durable_transitions");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let backends: [(&str, &dyn StateStore); 2] = [("lmdb", &s.lmdb), ("leveldb", &s.leveldb)];
    for (name, store) in backends {
        let mut i = 0u64;
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("{name}/1_per_txn"), |b| {
            b.iter(|| {
                i += 1;
                store
                    .apply(&[launched(i)])
                    .unwrap_or_else(|e| panic!("{e}"));
            })
        });
        g.throughput(Throughput::Elements(100));
        g.bench_function(format!("{name}/batch_100"), |b| {
            b.iter(|| {
                let ops: Vec<Op> = (0..100).map(|k| launched(i * 100 + k)).collect();
                i += 1;
                store.apply(&ops).unwrap_or_else(|e| panic!("{e}"));
            })
        });
    }
    g.finish();
}

fn bench_recovery(c: &mut Criterion, s: &Stores, files: &BTreeSet<String>) {
    let mut g = c.benchmark_group("recovery_100k_containers_50k_resources");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(15));
    g.bench_function("lmdb", |b| b.iter(|| black_box(recover(&s.lmdb, files))));
    g.bench_function("leveldb", |b| {
        b.iter(|| black_box(recover(&s.leveldb, files)))
    });
    g.finish();
}

fn per_second(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn time(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// Fixed-count measurements of each figure, printed with the LMDB/LevelDB ratios.
fn summary(s: &Stores, files: &BTreeSet<String>) {
    let singles = 300u64;
    let batches = 30u64;
    let mut rows = Vec::new();
    let backends: [(&str, &dyn StateStore); 2] = [("lmdb", &s.lmdb), ("leveldb", &s.leveldb)];
    for (name, store) in backends {
        let base = 10_000_000u64;
        let single = time(|| {
            for i in 0..singles {
                store
                    .apply(&[launched(base + i)])
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        });
        let batched = time(|| {
            for b in 0..batches {
                let ops: Vec<Op> = (0..100)
                    .map(|k| launched(base + 100_000 + b * 100 + k))
                    .collect();
                store.apply(&ops).unwrap_or_else(|e| panic!("{e}"));
            }
        });
        let rec = (0..3)
            .map(|_| {
                time(|| {
                    black_box(recover(store, files));
                })
            })
            .min()
            .unwrap_or_default();
        rows.push((
            name,
            per_second(singles, single),
            per_second(batches * 100, batched),
            rec,
        ));
    }
    println!();
    println!("state store summary (same run, same disk)");
    println!(
        "{:<8} {:>22} {:>26} {:>30}",
        "store",
        "transitions/s (1/txn)",
        "transitions/s (batch 100)",
        "recovery 100k ctr + 50k res"
    );
    for (name, single, batch, rec) in &rows {
        println!(
            "{name:<8} {single:>22.0} {batch:>26.0} {:>27.1} ms",
            rec.as_secs_f64() * 1000.0
        );
    }
    if let [(_, l1, lb, lr), (_, d1, db, dr)] = rows.as_slice() {
        println!(
            "lmdb/leveldb: {:.2}x transitions/s (1/txn), {:.2}x (batch 100), recovery time {:.2}x",
            l1 / d1,
            lb / db,
            lr.as_secs_f64() / dr.as_secs_f64()
        );
        println!(
            "group commit gain (batch 100 vs 1/txn): lmdb {:.1}x, leveldb {:.1}x",
            lb / l1,
            db / d1
        );
    }
}

fn main() {
    let s = stores();
    populate(&s.lmdb);
    populate(&s.leveldb);
    let files = cache_files();
    let mut c = Criterion::default().configure_from_args();
    bench_recovery(&mut c, &s, &files);
    bench_transitions(&mut c, &s);
    summary(&s, &files);
    c.final_summary();
}
