//! Where a class of pods can still fit, within one planning simulation: a class that fitted
//! nowhere is not looked for on every node again, only where a reverted drain freed room.
//!
//! Placing pods and removing destinations only take room away, so a class (without inter-pod
//! terms) that fitted on no node still fits on none. Only a revert gives room back, and only
//! on the reverted drain's node and the destinations of the pods it had placed: a class that
//! fitted nowhere inside the reverted fork may fit on those nodes alone afterwards, and a
//! class it knew of before the fork is as it was. So a lookup tries those few nodes, in the
//! order a scan of every node would have met them, and finds what that scan would have found.
//!
//! What holds for a class holds for every larger one of the same shape: a class that asks for
//! at least as much of every resource, with the same placement requirements otherwise (node
//! selector, affinity, volumes, tolerations, ports), fits nowhere the smaller one does not. So a
//! class looked for the first time tries only where such a smaller class may still fit.

use std::collections::HashMap;

use crate::cluster::snapshot::NameHasher;
use crate::cluster::types::SchedRequirements;
use crate::cluster::{ClassId, ClusterSnapshot};

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
    only: HashMap<ClassId, Vec<usize>, NameHasher>,
    /// Per placement shape ([`SchedRequirements::placement_shape`]), the classes that fitted
    /// nowhere and ask for no more than any other of them (a larger one adds nothing: whatever
    /// covers it covers the smaller one too), so a lookup compares with a few classes.
    shapes: Vec<Vec<ClassId>>,
    /// Each shape's index in `shapes`.
    shape_index: HashMap<SchedRequirements, usize, NameHasher>,
    /// Each class's shape index, once looked up (a shape is computed once per class, not per
    /// pod placed).
    shape_of: HashMap<ClassId, usize, NameHasher>,
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

    /// Positions to try for `class` (not inter-pod), cyclically from `start` as a scan of every
    /// position would meet them; `None` when every position must be tried. A class not known
    /// yet may fit only where a smaller class of its shape that fitted nowhere may fit again.
    pub fn positions(
        &mut self,
        snap: &ClusterSnapshot,
        class: ClassId,
        start: usize,
    ) -> Option<Vec<usize>> {
        let known = if self.only.contains_key(&class) {
            class
        } else {
            self.smaller(snap, class)?
        };
        let only = self.only.get(&known)?;
        let split = only.partition_point(|&p| p < start);
        Some(
            only[split..]
                .iter()
                .chain(&only[..split])
                .copied()
                .collect(),
        )
    }

    /// The index of `class`'s shape in `shapes`.
    fn shape(&mut self, snap: &ClusterSnapshot, class: ClassId) -> usize {
        if let Some(&i) = self.shape_of.get(&class) {
            return i;
        }
        let next = self.shapes.len();
        let i = *self
            .shape_index
            .entry(snap.class(class).req.placement_shape())
            .or_insert(next);
        if i == next {
            self.shapes.push(Vec::new());
        }
        self.shape_of.insert(class, i);
        i
    }

    /// A class that fitted nowhere and that `class` covers (same shape, no larger request of
    /// any resource, not inter-pod now): the one with the fewest positions left.
    fn smaller(&mut self, snap: &ClusterSnapshot, class: ClassId) -> Option<ClassId> {
        if self.only.is_empty() {
            return None;
        }
        let shape = self.shape(snap, class);
        let wants = &snap.class(class).req.requests;
        self.shapes[shape]
            .iter()
            .copied()
            .filter(|&c| {
                let known = snap.class(c);
                !known.is_inter_pod() && wants.covers(&known.req.requests)
            })
            .min_by_key(|c| self.only.get(c).map_or(usize::MAX, Vec::len))
    }

    /// `class` (not inter-pod) fitted on none of the nodes it may fit on.
    pub fn fitted_nowhere(&mut self, snap: &ClusterSnapshot, class: ClassId) {
        if self.off {
            return;
        }
        let before = self.only.insert(class, Vec::new());
        if before.is_none() {
            let shape = self.shape(snap, class);
            let wants = &snap.class(class).req.requests;
            let requests = |c: ClassId| &snap.class(c).req.requests;
            let smallest = &mut self.shapes[shape];
            if !smallest.iter().any(|&c| wants.covers(requests(c))) {
                smallest.retain(|&c| !requests(c).covers(wants));
                smallest.push(class);
            }
        }
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
    use crate::testkit::{node, pod, snapshot};

    /// Classes of pods `a` (1 cpu), `b` (2 cpu, other labels) and `c` (1 cpu, `zone: a`
    /// only), in that order.
    fn classes() -> (ClusterSnapshot, [ClassId; 3]) {
        let s = snapshot(
            [node("n").cpu("8").label("zone", "a")],
            [
                pod("a").on("n").cpu("1").label("app", "a"),
                pod("b").on("n").cpu("2").label("app", "b"),
                pod("c").on("n").cpu("1").node_selector("zone", "a"),
            ],
        );
        let class = |name: &str| {
            (0..s.pod_count() as crate::cluster::PodId)
                .find(|&p| s.pod(p).name == name)
                .map(|p| s.pod(p).class)
                .unwrap_or_else(|| panic!("no pod {name}"))
        };
        let ids = [class("a"), class("b"), class("c")];
        assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
        (s, ids)
    }

    #[test]
    fn positions_start_where_a_full_scan_would() {
        let (s, [a, ..]) = classes();
        let mut m = FitMemory::new();
        assert_eq!(
            m.positions(&s, a, 0),
            None,
            "unknown class: scan everything"
        );
        m.fork();
        m.fitted_nowhere(&s, a);
        m.reverted([9, 2, 5, 2]);
        assert_eq!(m.positions(&s, a, 0), Some(vec![2, 5, 9]));
        assert_eq!(m.positions(&s, a, 5), Some(vec![5, 9, 2]));
        assert_eq!(m.positions(&s, a, 10), Some(vec![2, 5, 9]));
    }

    #[test]
    fn a_revert_narrows_what_was_known_before_the_fork() {
        let (s, [a, b, _]) = classes();
        let mut m = FitMemory::new();
        m.fitted_nowhere(&s, a); // outside any fork: nowhere, for good
        m.fork();
        m.fitted_nowhere(&s, a);
        m.fitted_nowhere(&s, b);
        m.fitted_nowhere(&s, b);
        m.reverted([4, 6]);
        assert_eq!(
            m.positions(&s, a, 0),
            Some(vec![]),
            "nowhere before the fork: still nowhere"
        );
        assert_eq!(m.positions(&s, b, 0), Some(vec![4, 6]));
        m.fork();
        m.fitted_nowhere(&s, b);
        m.reverted([6, 8]);
        assert_eq!(
            m.positions(&s, b, 0),
            Some(vec![6]),
            "only where both allow"
        );
        m.fork();
        m.committed();
        assert_eq!(
            m.positions(&s, b, 0),
            Some(vec![6]),
            "a kept drain frees nothing"
        );
    }

    #[test]
    fn a_larger_class_of_the_same_shape_is_tried_only_where_the_smaller_may_fit() {
        let (s, [a, b, c]) = classes();
        let mut m = FitMemory::new();
        m.fork();
        m.fitted_nowhere(&s, b);
        m.reverted([7]);
        assert_eq!(
            m.positions(&s, a, 0),
            None,
            "a smaller class than one that fitted nowhere may fit anywhere"
        );
        let mut m = FitMemory::new();
        m.fork();
        m.fitted_nowhere(&s, a);
        m.reverted([3, 1]);
        assert_eq!(
            m.positions(&s, b, 2),
            Some(vec![3, 1]),
            "twice a's cpu, other labels: only where a may fit, from the pointer on"
        );
        assert_eq!(
            m.positions(&s, c, 0),
            None,
            "a node selector is another shape"
        );
        m.fork();
        m.fitted_nowhere(&s, b);
        m.reverted([7]);
        assert_eq!(
            m.positions(&s, b, 0),
            Some(vec![7]),
            "b's own memory comes first"
        );
    }
}
