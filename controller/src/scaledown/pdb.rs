//! `pdbs_remaining_disruptions`: how many more pods each PodDisruptionBudget lets the plan
//! disrupt, decremented as pods move, with fork/commit/revert alongside the snapshot.

use std::collections::{BTreeMap, HashMap};

use crate::cluster::{ClassId, ClusterSnapshot, PodId, UndoLog};

/// Remaining disruptions per PDB of a snapshot.
#[derive(Clone, Debug)]
pub struct PdbTracker {
    remaining: Vec<i64>,
    covering: HashMap<ClassId, Vec<usize>>,
    undo: UndoLog<(usize, i64)>,
}

impl PdbTracker {
    /// Starts from each PDB's allowance at snapshot time (unhealthy pods are already counted
    /// there, so evicting them later costs nothing).
    pub fn new(snap: &ClusterSnapshot) -> Self {
        PdbTracker {
            remaining: snap.pdbs().iter().map(|p| p.disruptions_allowed).collect(),
            covering: HashMap::new(),
            undo: UndoLog::default(),
        }
    }

    /// Indices of the PDBs that select the pod.
    pub fn covering(&mut self, snap: &ClusterSnapshot, pod: PodId) -> &[usize] {
        let info = snap.pod(pod);
        self.covering.entry(info.class).or_insert_with(|| {
            let labels = snap.pod_labels(pod);
            snap.pdbs()
                .iter()
                .enumerate()
                .filter(|(_, p)| p.covers(info, labels))
                .map(|(i, _)| i)
                .collect()
        })
    }

    /// Whether some PDB selects the pod (whatever its allowance).
    pub fn has_pdb(&mut self, snap: &ClusterSnapshot, pod: PodId) -> bool {
        !self.covering(snap, pod).is_empty()
    }

    /// Whether evicting the pod now respects every PDB that selects it.
    pub fn can_evict(&mut self, snap: &ClusterSnapshot, pod: PodId) -> bool {
        if !snap.pod(pod).ready {
            return true;
        }
        let idx = self.covering(snap, pod).to_vec();
        idx.iter().all(|i| self.remaining[*i] >= 1)
    }

    /// Counts the pod's eviction against its PDBs (healthy pods only). May go below zero when
    /// used for pods that must leave anyway (nodes already being deleted).
    pub fn evict(&mut self, snap: &ClusterSnapshot, pod: PodId) {
        if !snap.pod(pod).ready {
            return;
        }
        let idx = self.covering(snap, pod).to_vec();
        for i in idx {
            self.undo.record((i, self.remaining[i]));
            self.remaining[i] -= 1;
        }
    }

    /// Starts a fork alongside the snapshot's.
    pub fn fork(&mut self) {
        self.undo.fork();
    }

    /// Keeps the innermost fork's evictions.
    pub fn commit(&mut self) {
        self.undo.commit();
    }

    /// Gives back the allowance taken since the innermost fork.
    pub fn revert(&mut self) {
        let remaining = &mut self.remaining;
        self.undo.revert(|(i, v)| remaining[i] = v);
    }

    /// `namespace/name` → remaining disruptions.
    pub fn remaining(&self, snap: &ClusterSnapshot) -> BTreeMap<String, i64> {
        snap.pdbs()
            .iter()
            .zip(&self.remaining)
            .map(|(p, r)| (format!("{}/{}", p.namespace, p.name), *r))
            .collect()
    }
}
