//! A change log with nested fork marks: changes are recorded only inside a fork and handed
//! back newest first on revert, so forking, committing and reverting cost O(changes).

/// Records changes of type `C` made since the outermost open fork.
#[derive(Clone, Debug)]
pub struct UndoLog<C> {
    changes: Vec<C>,
    marks: Vec<usize>,
}

impl<C> Default for UndoLog<C> {
    fn default() -> Self {
        UndoLog {
            changes: Vec::new(),
            marks: Vec::new(),
        }
    }
}

impl<C> UndoLog<C> {
    /// Opens a fork: changes from now on can be reverted or committed.
    pub fn fork(&mut self) {
        self.marks.push(self.changes.len());
    }

    /// Keeps the innermost fork's changes (they stay revertable by an enclosing fork).
    pub fn commit(&mut self) {
        self.marks.pop();
        if self.marks.is_empty() {
            self.changes.clear();
        }
    }

    /// Records a change; outside any fork there is nothing to undo, so nothing is kept.
    pub fn record(&mut self, change: C) {
        if !self.marks.is_empty() {
            self.changes.push(change);
        }
    }

    /// Closes the innermost fork and hands its changes to `undo`, newest first.
    pub fn revert(&mut self, mut undo: impl FnMut(C)) {
        let Some(mark) = self.marks.pop() else {
            return;
        };
        while self.changes.len() > mark {
            if let Some(c) = self.changes.pop() {
                undo(c);
            }
        }
    }

    /// Depth of nested forks.
    pub fn depth(&self) -> usize {
        self.marks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::UndoLog;

    #[test]
    fn nested_forks_revert_only_their_own_changes_newest_first() {
        let mut log = UndoLog::default();
        log.record(0); // outside a fork: not kept
        log.fork();
        log.record(1);
        log.fork();
        log.record(2);
        log.record(3);
        let mut undone = Vec::new();
        log.revert(|c| undone.push(c));
        assert_eq!(undone, vec![3, 2]);
        assert_eq!(log.depth(), 1);
        log.revert(|c| undone.push(c));
        assert_eq!(undone, vec![3, 2, 1]);
        assert_eq!(log.depth(), 0);
        log.revert(|c| undone.push(c)); // no fork open: nothing happens
        assert_eq!(undone.len(), 3);
    }

    #[test]
    fn a_committed_inner_fork_is_still_undone_by_the_outer_revert() {
        let mut log = UndoLog::default();
        log.fork();
        log.fork();
        log.record("a");
        log.commit();
        let mut undone = Vec::new();
        log.revert(|c| undone.push(c));
        assert_eq!(undone, vec!["a"]);
        log.fork();
        log.record("b");
        log.commit(); // outermost commit forgets the changes
        log.fork();
        log.revert(|c| undone.push(c));
        assert_eq!(undone, vec!["a"]);
    }
}
