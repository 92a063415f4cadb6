//! `LmdbStore`: the state store in one LMDB environment (heed), a named database per subsystem,
//! durable commits, a map that doubles when full, and the schema-version check at open.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use heed::types::{Bytes, Str};
use heed::{
    CommitOrAbort, Database, DatabaseOpenOptions, DatabaseOpener, EnvFlags, EnvOpenOptions,
    MdbError, RoTxn, WithoutTls,
};

use super::codec::{self, Write};
use super::keys;
use super::records::*;
use super::{SchemaVersion, StateStore, StoreError};

type Db = Database<'static, Str, Bytes>;
type Env = heed::Env<WithoutTls>;
/// Undecoded keys and values per database name.
pub type RawPairs = BTreeMap<String, Vec<(String, Vec<u8>)>>;

/// Tuning of the LMDB environment.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Map size at open (rounded up to whole pages); it doubles whenever a write finds it full.
    pub initial_map_size: usize,
    /// The map never grows beyond this; a write that needs more fails (store unhealthy).
    pub max_map_size: usize,
    /// Open without writing anything (for `dump`); safe while an agent has the store open.
    pub read_only: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            initial_map_size: 16 << 20,
            max_map_size: 64 << 30,
            read_only: false,
        }
    }
}

/// What was found at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// No store existed: created empty and stamped with the current schema version.
    New,
    /// A store of a compatible version existed (its version before re-stamping).
    Existing { previous: SchemaVersion },
}

pub struct LmdbStore {
    env: Env,
    /// In `keys::ALL_DBS` order: meta, localization, applications, containers, tokens, deletion.
    /// `None` only in a read-only store that never had that database.
    dbs: [Option<Db>; 6],
    /// Transactions hold it shared; growing the map holds it exclusively (LMDB requires that no
    /// transaction is active in this process while the map is resized).
    gate: RwLock<()>,
    map_size: AtomicUsize,
    max_map_size: usize,
    dir: PathBuf,
    opened: Opened,
    read_only: bool,
}

/// LMDB requires map sizes in whole OS pages; 64 KiB is a multiple of every Linux page size.
const MAP_GRANULE: usize = 64 * 1024;

fn page_round(n: usize) -> usize {
    n.div_ceil(MAP_GRANULE) * MAP_GRANULE
}

fn open_err(dir: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        dir: dir.to_path_buf(),
        message: e.to_string(),
    }
}

/// Options naming one of the store's databases (string keys, byte values).
fn db_options<'e, 'n>(
    opener: &'n DatabaseOpener<'e, WithoutTls>,
    name: &'n str,
) -> DatabaseOpenOptions<'e, 'n, WithoutTls, Str, Bytes> {
    let mut options = opener.database_options().types::<Str, Bytes>();
    options.name(name);
    options
}

/// The schema version stamped in the meta database, if this build can read it.
fn stamped_version(dir: &Path, bytes: &[u8]) -> Result<SchemaVersion, StoreError> {
    let text = String::from_utf8_lossy(bytes).into_owned();
    match SchemaVersion::parse(&text) {
        Some(found) if found.major == SchemaVersion::CURRENT.major => Ok(found),
        Some(found) => Err(StoreError::IncompatibleSchema {
            dir: dir.to_path_buf(),
            found,
            supported: SchemaVersion::CURRENT,
        }),
        None => Err(open_err(
            dir,
            format!("schema version {text:?} is not major.minor"),
        )),
    }
}

impl LmdbStore {
    /// Opens (or creates) the store in `dir`. Never wipes anything: a store that cannot be read
    /// is an error naming the directory; see `reset_state_dir`.
    pub fn open(dir: &Path, options: &OpenOptions) -> Result<LmdbStore, StoreError> {
        if !options.read_only {
            std::fs::create_dir_all(dir).map_err(|e| open_err(dir, e))?;
        } else if !dir.join("data.mdb").exists() {
            return Err(open_err(dir, "no LMDB store (data.mdb) in this directory"));
        }
        let map_size = page_round(options.initial_map_size.max(1 << 20));
        let mut env_opts = EnvOpenOptions::new().read_txn_without_tls();
        env_opts
            .map_size(map_size)
            .max_dbs(keys::ALL_DBS.len() as u32 + 2);
        if options.read_only {
            // SAFETY: READ_ONLY only restricts what this process may do with the environment.
            unsafe { env_opts.flags(EnvFlags::READ_ONLY) };
        }
        // SAFETY: the store directory belongs to this agent; LMDB's lock file coordinates the
        // other processes (a `dump`) that open it, and nothing modifies the files outside LMDB.
        let env = unsafe { env_opts.open(dir) }.map_err(|e| open_err(dir, e))?;
        let actual = env.info().map_size.max(map_size);
        let (dbs, opened) = if options.read_only {
            Self::open_read_only(&env, dir)?
        } else {
            Self::open_read_write(&env, dir)?
        };
        Ok(LmdbStore {
            env,
            dbs,
            gate: RwLock::new(()),
            map_size: AtomicUsize::new(actual),
            max_map_size: options.max_map_size.max(actual),
            dir: dir.to_path_buf(),
            opened,
            read_only: options.read_only,
        })
    }

    fn open_read_write(env: &Env, dir: &Path) -> Result<([Option<Db>; 6], Opened), StoreError> {
        let wtxn = env.write_txn().map_err(|e| open_err(dir, e))?;
        let mut opened = Opened::New;
        let result = env
            .create_databases_and_commit(wtxn, |opener, wtxn| {
                let dbs = keys::ALL_DBS
                    .iter()
                    .map(|name| db_options(opener, name).create(wtxn))
                    .collect::<heed::Result<Vec<_>>>()?;
                let meta = dbs[0];
                let stamp = meta.get(wtxn, keys::META_SCHEMA_VERSION)?;
                match stamp {
                    Some(bytes) => match stamped_version(dir, bytes) {
                        Ok(found) => opened = Opened::Existing { previous: found },
                        Err(e) => return Ok(CommitOrAbort::Abort(e)),
                    },
                    None => {
                        for (db, name) in dbs.iter().zip(keys::ALL_DBS).skip(1) {
                            if !db.is_empty(wtxn)? {
                                return Ok(CommitOrAbort::Abort(open_err(
                                    dir,
                                    format!("database {name} holds data but the store has no schema version"),
                                )));
                            }
                        }
                    }
                }
                meta.put(
                    wtxn,
                    keys::META_SCHEMA_VERSION,
                    SchemaVersion::CURRENT.to_string().as_bytes(),
                )?;
                let dbs = [dbs[0], dbs[1], dbs[2], dbs[3], dbs[4], dbs[5]];
                Ok::<_, heed::Error>(CommitOrAbort::Commit(dbs))
            })
            .map_err(|e| open_err(dir, e))?;
        match result {
            CommitOrAbort::Commit(dbs) => Ok((dbs.map(Some), opened)),
            CommitOrAbort::Abort(err) => Err(err),
        }
    }

    fn open_read_only(env: &Env, dir: &Path) -> Result<([Option<Db>; 6], Opened), StoreError> {
        let rtxn = env.read_txn().map_err(|e| open_err(dir, e))?;
        let mut opened = Opened::New;
        let result = env
            .open_databases_and_commit(rtxn, |opener, rtxn| {
                let dbs = keys::ALL_DBS
                    .iter()
                    .map(|name| db_options(opener, name).open(rtxn))
                    .collect::<heed::Result<Vec<_>>>()?;
                if let Some(meta) = dbs[0]
                    && let Some(bytes) = meta.get(rtxn, keys::META_SCHEMA_VERSION)?
                {
                    match stamped_version(dir, bytes) {
                        Ok(found) => opened = Opened::Existing { previous: found },
                        Err(e) => return Ok(CommitOrAbort::Abort(e)),
                    }
                }
                let dbs = [dbs[0], dbs[1], dbs[2], dbs[3], dbs[4], dbs[5]];
                Ok::<_, heed::Error>(CommitOrAbort::Commit(dbs))
            })
            .map_err(|e| open_err(dir, e))?;
        match result {
            CommitOrAbort::Commit(dbs) => Ok((dbs, opened)),
            CommitOrAbort::Abort(err) => Err(err),
        }
    }

    pub fn opened(&self) -> Opened {
        self.opened
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Current size of the memory map in bytes.
    pub fn map_size(&self) -> usize {
        self.map_size.load(Ordering::Relaxed)
    }

    fn shared(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    fn db(&self, name: &str) -> Option<Db> {
        keys::ALL_DBS
            .iter()
            .position(|n| *n == name)
            .and_then(|i| self.dbs[i])
    }

    fn write_once(&self, writes: &[Write]) -> Result<(), heed::Error> {
        let _shared = self.shared();
        let mut wtxn = self.env.write_txn()?;
        for w in writes {
            match w {
                Write::Put { db, key, value } => {
                    if let Some(d) = self.db(db) {
                        d.put(&mut wtxn, key, value)?;
                    }
                }
                Write::Delete { db, key } => {
                    if let Some(d) = self.db(db) {
                        d.delete(&mut wtxn, key)?;
                    }
                }
            }
        }
        wtxn.commit()
    }

    /// Doubles the map (no transaction of this process may be active meanwhile).
    fn grow(&self) -> Result<(), StoreError> {
        let _exclusive = self.gate.write().unwrap_or_else(|p| p.into_inner());
        let current = self.map_size.load(Ordering::Relaxed);
        if current >= self.max_map_size {
            return Err(StoreError::Write(format!(
                "state store {} is full at its maximum map size of {current} bytes",
                self.dir.display()
            )));
        }
        let next = page_round((current * 2).min(self.max_map_size));
        // SAFETY: `_exclusive` guarantees no transaction of this store is active in this process.
        unsafe { self.env.resize(next) }.map_err(|e| StoreError::Write(e.to_string()))?;
        self.map_size.store(next, Ordering::Relaxed);
        tracing::info!(
            dir = %self.dir.display(),
            from_bytes = current,
            to_bytes = next,
            "state store map was full; grown"
        );
        Ok(())
    }

    fn read<T>(
        &self,
        name: &'static str,
        decode: impl FnOnce(&mut dyn Iterator<Item = codec::Pair<'_>>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let _shared = self.shared();
        let rtxn = self
            .env
            .read_txn()
            .map_err(|e| StoreError::Read(e.to_string()))?;
        let Some(db) = self.db(name) else {
            return decode(&mut std::iter::empty());
        };
        let pairs = collect(&db, &rtxn, name)?;
        let mut it = pairs.iter().map(|(k, v)| (k.as_str(), v.as_slice()));
        decode(&mut it)
    }

    /// Every key of every database with its value, undecoded (for `dump --raw` and tests).
    pub fn raw_pairs(&self) -> Result<RawPairs, StoreError> {
        let _shared = self.shared();
        let rtxn = self
            .env
            .read_txn()
            .map_err(|e| StoreError::Read(e.to_string()))?;
        let mut out = BTreeMap::new();
        for name in keys::ALL_DBS {
            if let Some(db) = self.db(name) {
                out.insert(name.to_string(), collect(&db, &rtxn, name)?);
            }
        }
        Ok(out)
    }

    /// The schema version stamped in the store.
    pub fn schema_version(&self) -> Result<Option<SchemaVersion>, StoreError> {
        let _shared = self.shared();
        let rtxn = self
            .env
            .read_txn()
            .map_err(|e| StoreError::Read(e.to_string()))?;
        let Some(meta) = self.db(keys::DB_META) else {
            return Ok(None);
        };
        let v = meta
            .get(&rtxn, keys::META_SCHEMA_VERSION)
            .map_err(|e| StoreError::Read(e.to_string()))?;
        Ok(v.and_then(|b| SchemaVersion::parse(&String::from_utf8_lossy(b))))
    }

    /// Writes a schema version (tests of the version check use it to simulate other builds).
    pub fn stamp_schema_version(&self, version: SchemaVersion) -> Result<(), StoreError> {
        self.write_raw(&[Write::Put {
            db: keys::DB_META,
            key: keys::META_SCHEMA_VERSION.to_string(),
            value: version.to_string().into_bytes(),
        }])
    }

    /// Commits raw writes, growing the map when full.
    pub fn write_raw(&self, writes: &[Write]) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::Write(format!(
                "state store {} was opened read-only",
                self.dir.display()
            )));
        }
        loop {
            match self.write_once(writes) {
                Ok(()) => return Ok(()),
                Err(heed::Error::Mdb(MdbError::MapFull)) => self.grow()?,
                Err(e) => return Err(StoreError::Write(e.to_string())),
            }
        }
    }
}

fn collect(
    db: &Db,
    rtxn: &RoTxn<'_, WithoutTls>,
    name: &str,
) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let iter = db
        .iter(rtxn)
        .map_err(|e| StoreError::Read(format!("database {name}: {e}")))?;
    let mut out = Vec::new();
    for item in iter {
        let (k, v) = item.map_err(|e| StoreError::Read(format!("database {name}: {e}")))?;
        out.push((k.to_string(), v.to_vec()));
    }
    Ok(out)
}

impl StateStore for LmdbStore {
    fn can_recover(&self) -> bool {
        true
    }

    fn apply(&self, ops: &[Op]) -> Result<(), StoreError> {
        let mut writes = Vec::with_capacity(ops.len() * 2);
        for op in ops {
            codec::writes_for(op, &mut writes);
        }
        self.write_raw(&writes)
    }

    fn load_containers(&self) -> Result<ContainersState, StoreError> {
        self.read(keys::DB_CONTAINERS, |it| codec::decode_containers(it))
    }

    fn load_localization(&self) -> Result<Vec<LocalizationEntry>, StoreError> {
        self.read(keys::DB_LOCALIZATION, |it| codec::decode_localization(it))
    }

    fn load_applications(&self) -> Result<BTreeMap<AppId, AppRecord>, StoreError> {
        self.read(keys::DB_APPLICATIONS, |it| codec::decode_applications(it))
    }

    fn load_tokens(&self) -> Result<TokenState, StoreError> {
        self.read(keys::DB_TOKENS, |it| codec::decode_tokens(it))
    }

    fn load_deletion_tasks(&self) -> Result<BTreeMap<u64, DeletionTask>, StoreError> {
        self.read(keys::DB_DELETION, |it| codec::decode_deletion_tasks(it))
    }
}

/// Moves an unreadable store directory aside as `<dir>.reset-<UTC timestamp>` so that the agent
/// can start empty (`--reset-state`). Returns where it went. Nothing is deleted.
pub fn reset_state_dir(dir: &Path, now: jiff::Timestamp) -> Result<PathBuf, StoreError> {
    let stamp = now.strftime("%Y%m%dT%H%M%SZ").to_string();
    let mut name = dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "state".into());
    name.push(format!(".reset-{stamp}"));
    let aside = dir.with_file_name(name);
    std::fs::rename(dir, &aside).map_err(|e| {
        open_err(
            dir,
            format!("cannot move it aside to {}: {e}", aside.display()),
        )
    })?;
    Ok(aside)
}
