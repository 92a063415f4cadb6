//! Writes to Node objects: add or remove an ebb taint, finish a `Drain`-mode drain (cordon and
//! label), delete a node. Optimistic concurrency: each write carries the resourceVersion read;
//! a deletion carries the drained node's UID, so a node re-created under its name survives.

use ebb_api::names::LABEL_DRAINED;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
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
    #[error("node {node}: not deleted: {reason}")]
    NotTheDrainedNode { node: String, reason: &'static str },
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

    /// Delete the Node object (`DrainAndDelete`), only the object ebb drained: it must still
    /// carry the `to-be-deleted` taint, and the delete is conditional on its UID, so a node
    /// re-created under the same name (between the read and the delete, too) is never deleted.
    pub async fn delete(&self, name: &str) -> Result<Written, NodeWriteError> {
        let api_err = |source| NodeWriteError::Api {
            node: name.to_string(),
            action: "deleting",
            source,
        };
        let not_ours = |reason| NodeWriteError::NotTheDrainedNode {
            node: name.to_string(),
            reason,
        };
        let Some(node) = self.api.get_opt(name).await.map_err(api_err)? else {
            return Ok(Written::NotFound);
        };
        if !taints::has(&node, EbbTaint::ToBeDeleted) {
            return Err(not_ours(
                "it no longer carries the ebb.dev/to-be-deleted taint (it was re-created, or the taint was removed)",
            ));
        }
        // The UID names this very object; an object without one (never served by an apiserver)
        // is pinned by its resourceVersion instead.
        let preconditions = match (&node.metadata.uid, &node.metadata.resource_version) {
            (Some(uid), _) => Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            },
            (None, Some(rv)) => Preconditions {
                uid: None,
                resource_version: Some(rv.clone()),
            },
            (None, None) => {
                return Err(not_ours(
                    "it has neither a UID nor a resourceVersion to make the deletion conditional on",
                ));
            }
        };
        let params = DeleteParams {
            preconditions: Some(preconditions),
            ..DeleteParams::default()
        };
        match self.api.delete(name, &params).await {
            Ok(_) => Ok(Written::Changed),
            Err(e) if code(&e) == Some(404) => Ok(Written::NotFound),
            Err(e) if code(&e) == Some(409) => Err(not_ours(
                "it was replaced by another node of the same name after it was drained",
            )),
            Err(source) => Err(api_err(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use kube::client::Body;
    use serde_json::Value;

    use super::*;

    /// A node API answering GET with `node` and recording DELETE bodies; a DELETE whose UID
    /// precondition is not `current_uid` gets 409 as from the apiserver.
    fn client(
        node: Value,
        current_uid: &'static str,
        deletes: Arc<Mutex<Vec<Value>>>,
    ) -> kube::Client {
        let svc = tower::service_fn(move |req: Request<Body>| {
            let node = node.clone();
            let deletes = deletes.clone();
            async move {
                let method = req.method().clone();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let (status, out) = if method == Method::DELETE {
                    let opts: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    deletes.lock().unwrap().push(opts.clone());
                    if opts["preconditions"]["uid"] == current_uid {
                        (200, node)
                    } else {
                        (
                            409,
                            serde_json::json!({"kind": "Status", "apiVersion": "v1",
                            "status": "Failure", "reason": "Conflict", "code": 409,
                            "message": "Precondition failed: UID in precondition"}),
                        )
                    }
                } else {
                    (200, node)
                };
                Ok::<_, Infallible>(crate::testkit::api::json_response(status, &out))
            }
        });
        kube::Client::new(svc, "default")
    }

    fn node(uid: &str, tainted: bool) -> Value {
        let taints = if tainted {
            serde_json::json!([{"key": ebb_api::names::TAINT_TO_BE_DELETED, "value": "1", "effect": "NoSchedule"}])
        } else {
            serde_json::json!([])
        };
        serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": uid, "resourceVersion": "7"},
            "spec": {"taints": taints}})
    }

    #[tokio::test]
    async fn deletion_is_conditional_on_the_drained_nodes_uid() {
        let deletes = Arc::default();
        let w = NodeWriter::new(client(node("u1", true), "u1", Arc::clone(&deletes)));
        assert_eq!(w.delete("n1").await.unwrap(), Written::Changed);
        let sent = deletes.lock().unwrap().clone();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["preconditions"]["uid"], "u1", "{sent:?}");
    }

    #[tokio::test]
    async fn a_node_replaced_under_the_same_name_is_not_deleted() {
        // read as u1, but by the time of the delete the object is u2
        let deletes = Arc::default();
        let w = NodeWriter::new(client(node("u1", true), "u2", Arc::clone(&deletes)));
        let err = w.delete("n1").await.unwrap_err();
        assert!(
            matches!(err, NodeWriteError::NotTheDrainedNode { .. }),
            "{err}"
        );
        // a new node without ebb's taint is not even tried
        let deletes: Arc<Mutex<Vec<Value>>> = Arc::default();
        let w = NodeWriter::new(client(node("u3", false), "u3", Arc::clone(&deletes)));
        let err = w.delete("n1").await.unwrap_err();
        assert!(err.to_string().contains("to-be-deleted"), "{err}");
        assert!(deletes.lock().unwrap().is_empty(), "no DELETE was sent");
    }
}
