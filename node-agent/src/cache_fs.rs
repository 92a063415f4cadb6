//! The node cache on disk: ebb's marker on the cache root, per-scope directories with restrictive
//! modes, and writes that never follow a symbolic link (each step opened relative to its parent).
//!
//! Modes: the root, `namespace/` and `application/` are 0711 (no listing); `public/**` is 0755
//! with files 0444; a namespace's or application's own directories are 0700 with files 0400.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::store::CacheScope;

/// File in the cache root that marks it as ebb's: a cache directory without it must be empty.
pub const MARKER: &str = ".ebb-cache";
const ROOT_MODE: u32 = 0o711;
const LISTLESS_MODE: u32 = 0o711;
const PUBLIC_DIR_MODE: u32 = 0o755;
const PUBLIC_FILE_MODE: u32 = 0o444;
const SCOPED_DIR_MODE: u32 = 0o700;
const SCOPED_FILE_MODE: u32 = 0o400;

#[derive(Debug, thiserror::Error)]
pub enum CacheFsError {
    #[error(
        "refusing to use --cache-dir {dir}: it is not empty and has no {MARKER} marker, so its \
         files are not ebb's and the agent would delete them; point --cache-dir at a new or \
         empty directory (if it is an ebb cache from an older version, create an empty file \
         {MARKER} in it)"
    )]
    Foreign { dir: PathBuf },
    #[error("cache path component {0:?} is not a plain name")]
    BadComponent(String),
    #[error(
        "refusing to write through {path}: it is a symbolic link or not a directory (something \
         other than the agent changed the cache)"
    )]
    NotADirectory { path: PathBuf },
    #[error("cache {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(rustix::io::Errno) -> CacheFsError + '_ {
    move |e| CacheFsError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// One directory on the way to a cached file, with the mode it must have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub name: String,
    pub mode: u32,
}

/// Where a resource goes: its directories from the root, its file name and the file's mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub dirs: Vec<Segment>,
    pub file: String,
    pub file_mode: u32,
}

fn plain(c: &str) -> Result<String, CacheFsError> {
    if c.is_empty() || c == "." || c == ".." || c.contains(['/', '\0']) || c.len() > 255 {
        return Err(CacheFsError::BadComponent(c.to_string()));
    }
    Ok(c.to_string())
}

/// The layout of `public/<sha256>/<name>`, `namespace/<ns>/<sha256>/<name>` or
/// `application/<ns>/<history>/<sha256>/<name>`.
pub fn layout(scope: &CacheScope, sha256: &str, name: &str) -> Result<Layout, CacheFsError> {
    let seg = |name: &str, mode| -> Result<Segment, CacheFsError> {
        Ok(Segment {
            name: plain(name)?,
            mode,
        })
    };
    let (dirs, file_mode) = match scope {
        CacheScope::Public => (
            vec![
                seg("public", PUBLIC_DIR_MODE)?,
                seg(sha256, PUBLIC_DIR_MODE)?,
            ],
            PUBLIC_FILE_MODE,
        ),
        CacheScope::Namespace { namespace } => (
            vec![
                seg("namespace", LISTLESS_MODE)?,
                seg(namespace, SCOPED_DIR_MODE)?,
                seg(sha256, SCOPED_DIR_MODE)?,
            ],
            SCOPED_FILE_MODE,
        ),
        CacheScope::Application {
            namespace,
            placement_history,
        } => (
            vec![
                seg("application", LISTLESS_MODE)?,
                seg(namespace, SCOPED_DIR_MODE)?,
                seg(placement_history, SCOPED_DIR_MODE)?,
                seg(sha256, SCOPED_DIR_MODE)?,
            ],
            SCOPED_FILE_MODE,
        ),
    };
    Ok(Layout {
        dirs,
        file: plain(name)?,
        file_mode,
    })
}

impl Layout {
    /// The path relative to the cache root (the key the store and the cache use).
    pub fn rel_path(&self) -> String {
        let mut parts: Vec<&str> = self.dirs.iter().map(|s| s.name.as_str()).collect();
        parts.push(&self.file);
        parts.join("/")
    }
}

/// Makes `root` ready: creates it if missing; an existing one must carry [`MARKER`], be empty,
/// or (`adopt`: the store knows files in it) be a cache of an earlier agent. Writes the marker.
pub fn prepare_root(root: &Path, adopt: bool) -> Result<(), CacheFsError> {
    let io = |source| CacheFsError::Io {
        path: root.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(root).map_err(io)?;
    let marker = root.join(MARKER);
    let marked = std::fs::symlink_metadata(&marker).is_ok_and(|m| m.is_file());
    if !marked {
        let empty = std::fs::read_dir(root).map_err(io)?.next().is_none();
        if !empty && !adopt {
            return Err(CacheFsError::Foreign {
                dir: root.to_path_buf(),
            });
        }
        let dir = open_root(root)?;
        let f = rustix::fs::openat(
            &dir,
            MARKER,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o444),
        )
        .map_err(io_err(&marker))?;
        rustix::io::write(
            &f,
            b"ebb node cache: the ebb node agent deletes files here it does not know\n",
        )
        .map_err(io_err(&marker))?;
        rustix::fs::fsync(&f).map_err(io_err(&marker))?;
        rustix::fs::fsync(&dir).map_err(io_err(root))?;
    }
    let dir = open_root(root)?;
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(ROOT_MODE)).map_err(io_err(root))?;
    Ok(())
}

fn open_root(root: &Path) -> Result<OwnedFd, CacheFsError> {
    rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err(root))
}

/// A directory of the cache opened without following links on the way.
pub struct CacheDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Opens (creating as needed) the directories of `layout` under `root`, one at a time relative
/// to the previous, refusing symbolic links, and gives each its mode.
pub fn open_dirs(root: &Path, layout: &Layout) -> Result<CacheDir, CacheFsError> {
    let mut fd = open_root(root)?;
    let mut path = root.to_path_buf();
    for seg in &layout.dirs {
        path.push(&seg.name);
        match rustix::fs::mkdirat(&fd, seg.name.as_str(), Mode::from_raw_mode(seg.mode)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(io_err(&path)(e)),
        }
        let next = rustix::fs::openat(
            &fd,
            seg.name.as_str(),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                CacheFsError::NotADirectory { path: path.clone() }
            }
            e => io_err(&path)(e),
        })?;
        rustix::fs::fchmod(&next, Mode::from_raw_mode(seg.mode)).map_err(io_err(&path))?;
        fd = next;
    }
    Ok(CacheDir { fd, path })
}

impl CacheDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates a new file (never an existing one, never through a link), owner-only until
    /// [`CacheDir::finish`] gives it its mode.
    pub fn create_new(&self, name: &str) -> Result<std::fs::File, CacheFsError> {
        let path = self.path.join(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(io_err(&path))?;
        Ok(std::fs::File::from(fd))
    }

    /// Gives the written temp file its mode and renames it over `name` (a link there is
    /// replaced, not followed), durably.
    pub fn finish(
        &self,
        file: &std::fs::File,
        tmp: &str,
        name: &str,
        mode: u32,
    ) -> Result<(), CacheFsError> {
        let target = self.path.join(name);
        rustix::fs::fchmod(file, Mode::from_raw_mode(mode)).map_err(io_err(&target))?;
        rustix::fs::renameat(&self.fd, tmp, &self.fd, name).map_err(io_err(&target))?;
        rustix::fs::fsync(&self.fd).map_err(io_err(&self.path))
    }

    /// Removes a file of this directory (a link is removed, never followed).
    pub fn remove(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty());
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_foreign_directory_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/precious"), b"keep").unwrap();
        let err = prepare_root(&root, false).unwrap_err();
        assert!(matches!(err, CacheFsError::Foreign { .. }), "{err}");
        assert!(err.to_string().contains("--cache-dir"), "{err}");
        assert!(!root.join(MARKER).exists());
        assert_eq!(std::fs::read(root.join("etc/precious")).unwrap(), b"keep");
        // adopted when the store knows files in it
        prepare_root(&root, true).unwrap();
        assert!(root.join(MARKER).is_file());
    }

    #[test]
    fn new_and_empty_directories_get_the_marker_and_a_listless_mode() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("new");
        prepare_root(&root, false).unwrap();
        assert!(root.join(MARKER).is_file());
        assert_eq!(mode(&root), 0o711);
        // marked: accepted again with files in it
        std::fs::create_dir_all(root.join("public")).unwrap();
        prepare_root(&root, false).unwrap();
    }

    #[test]
    fn scoped_directories_and_files_get_restrictive_modes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        prepare_root(&root, false).unwrap();
        let sha = "ab".repeat(32);
        let scope = CacheScope::Namespace {
            namespace: "tenant".into(),
        };
        let l = layout(&scope, &sha, "model.bin").unwrap();
        assert_eq!(l.rel_path(), format!("namespace/tenant/{sha}/model.bin"));
        let d = open_dirs(&root, &l).unwrap();
        let f = d.create_new(".tmp").unwrap();
        d.finish(&f, ".tmp", "model.bin", l.file_mode).unwrap();
        assert_eq!(mode(&root.join("namespace")), 0o711);
        assert_eq!(mode(&root.join("namespace/tenant")), 0o700);
        assert_eq!(mode(&root.join(l.rel_path())), 0o400);
        let p = layout(&CacheScope::Public, &sha, "m").unwrap();
        let d = open_dirs(&root, &p).unwrap();
        let f = d.create_new(".tmp").unwrap();
        d.finish(&f, ".tmp", "m", p.file_mode).unwrap();
        assert_eq!(mode(&root.join("public")), 0o755);
        assert_eq!(mode(&root.join(p.rel_path())), 0o444);
    }

    #[test]
    fn planted_links_are_refused_and_their_targets_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        let victim = dir.path().join("victim");
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o750)).unwrap();
        let victim_mode = mode(&victim);
        prepare_root(&root, false).unwrap();
        let sha = "cd".repeat(32);
        // a link where a directory goes, at each depth
        std::fs::create_dir_all(root.join("public")).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("public").join(&sha)).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("namespace")).unwrap();
        for scope in [
            CacheScope::Public,
            CacheScope::Namespace {
                namespace: "t".into(),
            },
        ] {
            let l = layout(&scope, &sha, "x").unwrap();
            let err = open_dirs(&root, &l).err().expect("refused");
            assert!(matches!(err, CacheFsError::NotADirectory { .. }), "{err}");
        }
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
        assert_eq!(mode(&victim), victim_mode, "the link's target was chmod-ed");
        // a link where the file goes is replaced, never written through
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let l = layout(
            &CacheScope::Application {
                namespace: "t".into(),
                placement_history: "h".into(),
            },
            &sha,
            "f",
        )
        .unwrap();
        let d = open_dirs(&root, &l).unwrap();
        std::os::unix::fs::symlink(&target, d.path().join("f")).unwrap();
        std::os::unix::fs::symlink(&target, d.path().join(".tmp")).unwrap();
        assert!(
            d.create_new(".tmp").is_err(),
            "an existing link is not opened"
        );
        d.remove(".tmp");
        let mut f = d.create_new(".tmp").unwrap();
        std::io::Write::write_all(&mut f, b"new").unwrap();
        d.finish(&f, ".tmp", "f", l.file_mode).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(
            !std::fs::symlink_metadata(d.path().join("f"))
                .unwrap()
                .is_symlink()
        );
    }

    #[test]
    fn components_must_be_plain_names() {
        for bad in ["..", ".", "", "a/b"] {
            assert!(
                layout(&CacheScope::Public, "ab", bad).is_err(),
                "{bad:?} accepted"
            );
            assert!(
                layout(
                    &CacheScope::Namespace {
                        namespace: bad.into()
                    },
                    "ab",
                    "x"
                )
                .is_err()
            );
        }
    }
}
