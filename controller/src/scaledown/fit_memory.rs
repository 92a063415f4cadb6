//! Where a class of pods can still fit, within one planning simulation: a class that fitted
//! nowhere is not looked for on every node again, only where a reverted drain freed room.
//!
//! Placing pods and removing destinations only take room away, so a class (without inter-pod
//! terms) that fitted on no node still fits on none. Only a revert gives room back, and only
//! on the reverted drain's node and the destinations of the pods it had placed: a class that
//! fitted nowhere inside the reverted fork may fit on those nodes alone afterwards, and a
//! class it knew of before the fork is as it was. So a lookup tries those few nodes, in the
//! order a scan of every node would have met them, and finds what that scan would have found.

use std::collections::HashMap;

use crate::cluster::ClassId;

#[cfg(test)]
thread_local! {
    /// Tests set it to plan without the memory (every lookup scans every node), to compare.
    pub(super) static FORGETFUL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Per class, the positions (in the destination order) of the only nodes it may fit on.
#[derive(Default)]
pub(super) struct FitMemory {
    /// Classes that fitted nowhere: the sorted positions of the nodes where they may fit
    /// again (empty: none).
    only: HashMap<ClassId, Vec<usize>>,
    /// Classes that fitted nowhere since the current drain's fork, with what was known of
    /// them before it.
    in_fork: Vec<(ClassId, Option<Vec<usize>>)>,
    forked: bool,
    off: bool,
}

impl FitMemory {
    pub fn new() -> Self {
        #[cfg(test)]
        let off = FORGETFUL.with(|f| f.get());
        #[cfg(not(test))]
        let off = false;
        FitMemory {
            off,
            ..FitMemory::default()
        }
    }

    /// Positions to try for `class`, cyclically from `start` as a scan of every position would
    /// meet them; `None` when every position must be tried.
    pub fn positions(&self, class: ClassId, start: usize) -> Option<Vec<usize>> {
        let only = self.only.get(&class)?;
        let split = only.partition_point(|&p| p < start);
        Some(
            only[split..]
                .iter()
                .chain(&only[..split])
                .copied()
                .collect(),
        )
    }

    /// `class` fitted on none of the nodes it may fit on.
    pub fn fitted_nowhere(&mut self, class: ClassId) {
        if self.off {
            return;
        }
        let before = self.only.insert(class, Vec::new());
        if self.forked {
            self.in_fork.push((class, before));
        }
    }

    /// A drain's simulation starts (the snapshot forked).
    pub fn fork(&mut self) {
        self.forked = true;
        self.in_fork.clear();
    }

    /// The drain was kept: room was only taken.
    pub fn committed(&mut self) {
        self.forked = false;
        self.in_fork.clear();
    }

    /// The drain was reverted: room is back at `freed` (positions, any order) and nowhere
    /// else, so what fitted nowhere inside the fork may fit there alone (and, when it was
    /// known before the fork, only where it could fit then too).
    pub fn reverted(&mut self, freed: impl IntoIterator<Item = usize>) {
        self.forked = false;
        if self.in_fork.is_empty() {
            return;
        }
        let mut freed: Vec<usize> = freed.into_iter().collect();
        freed.sort_unstable();
        freed.dedup();
        // In reverse: a class that failed twice in the fork gets what was known before the
        // fork last.
        for (class, before) in self.in_fork.drain(..).rev() {
            let only = match before {
                Some(before) => before
                    .into_iter()
                    .filter(|p| freed.binary_search(p).is_ok())
                    .collect(),
                None => freed.clone(),
            };
            self.only.insert(class, only);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_start_where_a_full_scan_would() {
        let mut m = FitMemory::new();
        assert_eq!(m.positions(7, 0), None, "unknown class: scan everything");
        m.fork();
        m.fitted_nowhere(7);
        m.reverted([9, 2, 5, 2]);
        assert_eq!(m.positions(7, 0), Some(vec![2, 5, 9]));
        assert_eq!(m.positions(7, 5), Some(vec![5, 9, 2]));
        assert_eq!(m.positions(7, 10), Some(vec![2, 5, 9]));
    }

    #[test]
    fn a_revert_narrows_what_was_known_before_the_fork() {
        let mut m = FitMemory::new();
        m.fitted_nowhere(1); // outside any fork: nowhere, for good
        m.fork();
        m.fitted_nowhere(1);
        m.fitted_nowhere(2);
        m.fitted_nowhere(2);
        m.reverted([4, 6]);
        assert_eq!(
            m.positions(1, 0),
            Some(vec![]),
            "nowhere before the fork: still nowhere"
        );
        assert_eq!(m.positions(2, 0), Some(vec![4, 6]));
        m.fork();
        m.fitted_nowhere(2);
        m.reverted([6, 8]);
        assert_eq!(m.positions(2, 0), Some(vec![6]), "only where both allow");
        m.fork();
        m.committed();
        assert_eq!(
            m.positions(2, 0),
            Some(vec![6]),
            "a kept drain frees nothing"
        );
    }
}
