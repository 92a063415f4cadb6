//! Deletion service: a graph of deletion tasks (a task's successors run after it) and the
//! executor that deletes paths, refusing anything that resolves outside the cache root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use crate::store::{DeletionTask, Op, UnixMillis};

/// Tasks waiting to run: roots are scheduled; successors wait for their predecessors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeletionGraph {
    tasks: BTreeMap<u64, DeletionTask>,
    /// Tasks whose predecessors have all run (or that have none), with their due time.
    scheduled: BTreeMap<u64, UnixMillis>,
    next_id: u64,
}

/// A successor id that names no stored task: logged and skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingSuccessor {
    pub task: u64,
    pub successor: u64,
}

impl DeletionGraph {
    /// Rebuilds the graph from stored tasks: only roots are scheduled; ids continue after the
    /// highest stored one.
    pub fn rebuild(tasks: BTreeMap<u64, DeletionTask>) -> (DeletionGraph, Vec<MissingSuccessor>) {
        let mut missing = Vec::new();
        let mut referenced = BTreeSet::new();
        for (id, task) in &tasks {
            for s in &task.successors {
                if tasks.contains_key(s) {
                    referenced.insert(*s);
                } else {
                    missing.push(MissingSuccessor {
                        task: *id,
                        successor: *s,
                    });
                }
            }
        }
        let scheduled = tasks
            .iter()
            .filter(|(id, _)| !referenced.contains(id))
            .map(|(id, t)| (*id, t.scheduled_at))
            .collect();
        let next_id = tasks.keys().next_back().map_or(1, |m| m + 1);
        (
            DeletionGraph {
                tasks,
                scheduled,
                next_id,
            },
            missing,
        )
    }

    /// Creates a task (not yet stored: commit the returned op first) and schedules it.
    pub fn create(
        &mut self,
        paths: Vec<String>,
        scheduled_at: UnixMillis,
        successors: Vec<u64>,
        reason: &str,
    ) -> (DeletionTask, Op) {
        let task = DeletionTask {
            id: self.next_id,
            paths,
            scheduled_at,
            successors,
            reason: reason.to_string(),
        };
        self.next_id += 1;
        self.tasks.insert(task.id, task.clone());
        self.scheduled.insert(task.id, scheduled_at);
        let op = Op::DeletionTaskStored(task.clone());
        (task, op)
    }

    /// Scheduled tasks due at `now`, oldest first.
    pub fn due(&self, now: UnixMillis) -> Vec<DeletionTask> {
        let mut due: Vec<_> = self
            .scheduled
            .iter()
            .filter(|(_, at)| **at <= now)
            .filter_map(|(id, _)| self.tasks.get(id).cloned())
            .collect();
        due.sort_by_key(|t| (t.scheduled_at, t.id));
        due
    }

    /// When the next scheduled task falls due.
    pub fn next_due(&self) -> Option<UnixMillis> {
        self.scheduled.values().min().copied()
    }

    /// Marks a task done: returns the op removing it; its successors become scheduled.
    pub fn finished(&mut self, id: u64) -> Option<Op> {
        let task = self.tasks.remove(&id)?;
        self.scheduled.remove(&id);
        for s in task.successors {
            if let Some(t) = self.tasks.get(&s) {
                let waits_on_other = self
                    .tasks
                    .values()
                    .any(|o| o.id != s && o.successors.contains(&s));
                if !waits_on_other {
                    self.scheduled.insert(s, t.scheduled_at);
                }
            }
        }
        Some(Op::DeletionTaskRemoved(id))
    }

    /// Drops a task that is no longer wanted (its resource is in use again); its successors are
    /// scheduled as if it had run. Returns the op removing it from the store.
    pub fn cancel(&mut self, id: u64) -> Option<Op> {
        self.finished(id)
    }

    /// Ids of the tasks that can run now or later (not waiting on a predecessor).
    pub fn scheduled_ids(&self) -> Vec<u64> {
        self.scheduled.keys().copied().collect()
    }

    pub fn pending(&self) -> usize {
        self.tasks.len()
    }

    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Whether a path is waiting to be deleted by some task.
    pub fn holds_path(&self, path: &str) -> bool {
        self.tasks
            .values()
            .any(|t| t.paths.iter().any(|p| p == path))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("refusing to delete {path:?}: it is not a relative path inside the cache root {root}")]
    OutsideRoot { root: PathBuf, path: String },
    #[error(
        "refusing to delete {path:?}: it resolves to {resolved}, outside the cache root {root}"
    )]
    Escapes {
        root: PathBuf,
        path: String,
        resolved: PathBuf,
    },
    #[error("cannot delete {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Deletes `rel` (file or directory tree) under `root`. Absolute paths, `..` components and
/// symlinks that lead outside the (canonicalized) root are refused. A missing path is not an error.
pub fn delete_confined(root: &Path, rel: &str) -> Result<bool, DeleteError> {
    let rel_path = Path::new(rel);
    let plain = rel_path
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    if rel.is_empty() || !plain {
        return Err(DeleteError::OutsideRoot {
            root: root.to_path_buf(),
            path: rel.to_string(),
        });
    }
    let root = root.canonicalize().map_err(|source| DeleteError::Io {
        path: root.to_path_buf(),
        source,
    })?;
    let target = root.join(rel_path);
    let meta = match std::fs::symlink_metadata(&target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(DeleteError::Io {
                path: target,
                source,
            });
        }
    };
    // The parent must resolve inside the root (a symlinked directory on the way could escape);
    // the last component itself is removed as a link, never followed.
    let parent = target.parent().unwrap_or(&root);
    let resolved = parent.canonicalize().map_err(|source| DeleteError::Io {
        path: parent.to_path_buf(),
        source,
    })?;
    if !resolved.starts_with(&root) {
        return Err(DeleteError::Escapes {
            root,
            path: rel.to_string(),
            resolved,
        });
    }
    let result = if meta.is_dir() {
        std::fs::remove_dir_all(&target)
    } else {
        std::fs::remove_file(&target)
    };
    result.map_err(|source| DeleteError::Io {
        path: target,
        source,
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: u64, at: i64, successors: &[u64]) -> DeletionTask {
        DeletionTask {
            id,
            paths: vec![format!("p{id}")],
            scheduled_at: at,
            successors: successors.to_vec(),
            reason: "test".into(),
        }
    }

    #[test]
    fn rebuild_schedules_only_roots_and_successors_follow_their_predecessors() {
        let tasks: BTreeMap<u64, DeletionTask> = [
            task(1, 100, &[2, 3]),
            task(2, 50, &[]),
            task(3, 500, &[4]),
            task(4, 10, &[]),
            task(7, 1_000, &[99]),
        ]
        .into_iter()
        .map(|t| (t.id, t))
        .collect();
        let (mut g, missing) = DeletionGraph::rebuild(tasks);
        assert_eq!(
            missing,
            vec![MissingSuccessor {
                task: 7,
                successor: 99
            }]
        );
        assert_eq!(g.scheduled_ids(), vec![1, 7]);
        assert_eq!(g.next_id(), 8);
        assert_eq!(g.due(99), vec![]);
        assert_eq!(g.due(100).iter().map(|t| t.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(g.finished(1), Some(Op::DeletionTaskRemoved(1)));
        // 2 is past due, 3 is not yet due; 4 still waits for 3
        assert_eq!(g.due(100).iter().map(|t| t.id).collect::<Vec<_>>(), vec![2]);
        assert_eq!(g.scheduled_ids(), vec![2, 3, 7]);
        g.finished(3);
        assert_eq!(
            g.due(100).iter().map(|t| t.id).collect::<Vec<_>>(),
            vec![4, 2]
        );
        assert_eq!(g.pending(), 3);
        let (t, op) = g.create(vec!["x".into()], 5, vec![], "retention");
        assert_eq!(t.id, 8);
        assert_eq!(op, Op::DeletionTaskStored(t));
    }

    #[test]
    fn deletes_inside_the_root_and_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), b"x").unwrap();
        let outside = dir.path().join("precious");
        std::fs::write(&outside, b"keep").unwrap();

        assert!(delete_confined(&root, "a/b/f").unwrap());
        assert!(!root.join("a/b/f").exists());
        assert!(
            !delete_confined(&root, "a/b/f").unwrap(),
            "missing is not an error"
        );
        for bad in ["../precious", "/etc/passwd", "a/../../precious", ""] {
            let err = delete_confined(&root, bad).unwrap_err();
            assert!(
                matches!(err, DeleteError::OutsideRoot { .. }),
                "{bad}: {err}"
            );
        }
        // a symlinked directory leading out of the root
        std::os::unix::fs::symlink(dir.path(), root.join("link")).unwrap();
        let err = delete_confined(&root, "link/precious").unwrap_err();
        assert!(matches!(err, DeleteError::Escapes { .. }), "{err}");
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        // the link itself is removed as a link, its target untouched
        assert!(delete_confined(&root, "link").unwrap());
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        assert!(delete_confined(&root, "a").unwrap());
        assert!(!root.join("a").exists());
    }
}
