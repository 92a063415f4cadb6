//! Writes to Node objects: add or remove an ebb taint, finish a `Drain`-mode drain (cordon and
//! label), delete a node. Optimistic concurrency: each write carries the resourceVersion read.

use ebb_api::names::LABEL_DRAINED;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use super::taints::{self, EbbTaint};

/// Attempts of a read-modify-write before giving up on conflicts.
const CONFLICT_ATTEMPTS: usize = 5;

/// A node write that failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeWriteError {
    #[error("node {node}: {action}: {source}")]
    Api {
        node: String,
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(
        "node {node}: {action}: the node kept changing under us ({CONFLICT_ATTEMPTS} conflicts in a row); will retry next loop"
    )]
    Conflicts { node: String, action: &'static str },
}

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// The node was changed.
    Changed,
    /// It already was as wanted.
    Unchanged,
    /// The node does not exist (any more).
    NotFound,
}

fn code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Writes ebb's marks on nodes.
#[derive(Clone)]
pub struct NodeWriter {
    api: Api<Node>,
}

impl NodeWriter {
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }

    /// Read the node, let `change` compute the new taints (`None`: nothing to do), write them
    /// back with the read resourceVersion; retried on conflict.
    async fn update_taints(
        &self,
        name: &str,
        action: &'static str,
        change: impl Fn(&Node) -> Option<serde_json::Value>,
    ) -> Result<Written, NodeWriteError> {
        let api_err = |source| NodeWriteError::Api {
            node: name.to_string(),
            action,
            source,
        };
        for _ in 0..CONFLICT_ATTEMPTS {
            let node = match self.api.get_opt(name).await.map_err(api_err)? {
                Some(n) => n,
                None => return Ok(Written::NotFound),
            };
            let Some(mut patch) = change(&node) else {
                return Ok(Written::Unchanged);
            };
            patch["metadata"]["resourceVersion"] = json!(node.metadata.resource_version);
            match self
                .api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(Written::Changed),
                Err(e) if code(&e) == Some(409) => continue,
                Err(e) if code(&e) == Some(404) => return Ok(Written::NotFound),
                Err(e) => return Err(api_err(e)),
            }
        }
        Err(NodeWriteError::Conflicts {
            node: name.to_string(),
            action,
        })
    }

    fn taints_patch(taints: Vec<Taint>) -> serde_json::Value {
        json!({ "metadata": {}, "spec": { "taints": taints } })
    }

    /// Add `taint` (value: unix time `now`) unless present.
    pub async fn add_taint(
        &self,
        name: &str,
        taint: EbbTaint,
        now: jiff::Timestamp,
    ) -> Result<Written, NodeWriteError> {
        self.update_taints(name, "adding taint", |node| {
            taints::with(taints::taints_of(node), taint, now).map(Self::taints_patch)
        })
        .await
    }

    /// Remove `taint` if present.
    pub async fn remove_taint(
        &self,
        name: &str,
        taint: EbbTaint,
    ) -> Result<Written, NodeWriteError> {
        self.update_taints(name, "removing taint", |node| {
            taints::without(taints::taints_of(node), taint).map(Self::taints_patch)
        })
        .await
    }

    /// End of a `Drain`-mode drain, in one write: cordon, label `ebb.dev/drained=true`, and
    /// remove the `to-be-deleted` taint (so a crash never leaves one half done).
    pub async fn mark_drained(&self, name: &str) -> Result<Written, NodeWriteError> {
        self.update_taints(name, "marking drained", |node| {
            let taints = taints::without(taints::taints_of(node), EbbTaint::ToBeDeleted)
                .unwrap_or_else(|| taints::taints_of(node).to_vec());
            Some(json!({
                "metadata": { "labels": { LABEL_DRAINED: "true" } },
                "spec": { "unschedulable": true, "taints": taints },
            }))
        })
        .await
    }

    /// Delete the Node object (`DrainAndDelete`).
    pub async fn delete(&self, name: &str) -> Result<Written, NodeWriteError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(Written::Changed),
            Err(e) if code(&e) == Some(404) => Ok(Written::NotFound),
            Err(source) => Err(NodeWriteError::Api {
                node: name.to_string(),
                action: "deleting",
                source,
            }),
        }
    }
}
