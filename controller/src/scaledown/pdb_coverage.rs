//! Which PodDisruptionBudgets cover which pods of a snapshot, memoised per scheduling class
//! (read by the drainability rules and by the pacing of drains).

use crate::cluster::{ClusterSnapshot, PodId};

/// Which budgets cover which pods of a snapshot (memoised per scheduling class).
#[derive(Clone, Debug, Default)]
pub struct PdbTracker {
    /// By class id; `None`: not computed yet.
    covering: Vec<Option<Vec<usize>>>,
}

impl PdbTracker {
    pub fn new(_snap: &ClusterSnapshot) -> Self {
        PdbTracker::default()
    }

    /// Indices of the PDBs that select the pod.
    pub fn covering(&mut self, snap: &ClusterSnapshot, pod: PodId) -> &[usize] {
        let info = snap.pod(pod);
        let class = info.class as usize;
        if self.covering.len() <= class {
            self.covering.resize(class + 1, None);
        }
        self.covering[class].get_or_insert_with(|| {
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
}
