//! Events a placement pass or sweep sends once it is done: the object, warning or normal,
//! reason and note, and the node or pod the Event also concerns.

use crate::cluster::CachedPod;
use ebb_api::placement::PlacementHistory;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType};

/// An Event to send after a pass.
pub struct Notice {
    pub reference: ObjectReference,
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// The object the Event also concerns: repeats are folded into one series per related
    /// object (keeping the first note), so notes naming a node or pod need it set.
    pub related: Option<ObjectReference>,
}

impl Notice {
    pub fn pod(pod: &CachedPod, warning: bool, reason: &'static str, note: String) -> Self {
        Self {
            reference: pod.object_ref(&()),
            warning,
            reason,
            note,
            related: None,
        }
    }
    pub fn ph(ph: &PlacementHistory, warning: bool, reason: &'static str, note: String) -> Self {
        Self {
            reference: ph.object_ref(&()),
            warning,
            reason,
            note,
            related: None,
        }
    }
    /// The Event concerns this node too.
    pub fn about_node(mut self, node: &str) -> Self {
        self.related = Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..Default::default()
        });
        self
    }
    /// The Event concerns this pod too.
    pub fn about_pod(mut self, namespace: &str, pod: &str) -> Self {
        self.related = Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(pod.into()),
            ..Default::default()
        });
        self
    }
    /// The Event to publish (action `Placement`).
    pub fn event(&self) -> Event {
        Event {
            type_: if self.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: self.reason.into(),
            note: Some(self.note.clone()),
            action: "Placement".into(),
            secondary: self.related.clone(),
        }
    }
}
