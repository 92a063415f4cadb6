//! Pending pods ebb steered at their creation, with the node planned for each: the only pending
//! pods the model counts on a node because of ebb (the pod watch vouches for each by its ticket).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::live::PodKey;

/// Shared between the steering book (which vouches) and the model (which reads). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct SteeredPods(Arc<RwLock<HashMap<PodKey, String>>>);

impl SteeredPods {
    /// The planned node of `pod`, if ebb steered it and it still waits.
    pub fn planned(&self, pod: &PodKey) -> Option<String> {
        let map = self.0.read().unwrap_or_else(|p| p.into_inner());
        map.get(pod).cloned()
    }

    /// Sets (`Some`) or clears (`None`) the planned node of `pod`; whether that changed it.
    pub fn set(&self, pod: PodKey, node: Option<&str>) -> bool {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        match node {
            Some(n) => map.insert(pod, n.to_string()).as_deref() != Some(n),
            None => map.remove(&pod).is_some(),
        }
    }

    /// How many pods are vouched for.
    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
