//! Removal of a drained node (`DrainAndDelete`): delete the Node object, or hand its machine to
//! Cluster API or Karpenter and wait for the machine and the Node to go.

pub mod cluster_api;
pub mod karpenter;
pub mod mark;

use ebb_api::RemovalMethod;
use ebb_api::scaledown::RemovalStatus;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::nodes::NodeWriter;
use crate::scaledown::removal_method::Target;
pub use cluster_api::{ClusterApi, ClusterApiKinds};
pub use karpenter::{Karpenter, KarpenterKinds};

/// A removal step that failed.
#[derive(Debug, thiserror::Error)]
pub enum RemovalError {
    #[error("{object}: {action}: {source}")]
    Api {
        object: String,
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("{machine} names node `{names}`, not the drained node {node}; nothing removed")]
    NotTheNodesMachine {
        machine: String,
        node: String,
        names: String,
    },
    #[error("{0}")]
    NoScalableGroup(String),
    #[error(
        "{group} has {replicas} replicas and keeps at least {min} (minNodesPerGroup or its cluster-api-autoscaler-node-group-min-size annotation); not scaled down"
    )]
    AtMinimum {
        group: String,
        replicas: i32,
        min: i32,
    },
    #[error("{0}: kept changing under us ({n} conflicts in a row)", n = 5)]
    Conflicts(String),
    #[error("{0} disappeared during the hand-off")]
    Gone(String),
    #[error(
        "removal method {0} is not enabled in this controller (see --cluster-api, --karpenter)"
    )]
    NotEnabled(RemovalMethod),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Node(#[from] super::nodes::NodeWriteError),
}

impl RemovalError {
    pub(crate) fn api(object: String, action: &'static str, source: kube::Error) -> Self {
        RemovalError::Api {
            object,
            action,
            source,
        }
    }

    /// Worth trying again (the hand-off is idempotent): API failures and conflicts.
    pub fn retryable(&self) -> bool {
        matches!(self, RemovalError::Api { .. } | RemovalError::Conflicts(_))
    }
}

/// What a hand-off left to wait for.
#[derive(Clone, Debug, PartialEq)]
pub struct HandedOff {
    /// The status entry: method, object, group scaled.
    pub status: RemovalStatus,
    /// uid of the Machine or NodeClaim handed off (`None`: already gone).
    pub uid: Option<String>,
    /// `replicas` before and after, when this hand-off lowered them.
    pub replicas: Option<(i32, i32)>,
}

/// The status entry of a removal about to start.
pub fn status_for(node: &str, target: &Target) -> RemovalStatus {
    let object = match target {
        Target::Node => format!("Node {node}"),
        Target::ClusterApi { machine } => format!("Machine {machine}"),
        Target::Karpenter { node_claim } => format!("NodeClaim {node_claim}"),
    };
    RemovalStatus {
        method: target.method(),
        object,
        scaled: None,
        handed_off: None,
        stuck: false,
        message: None,
    }
}

/// Removes drained nodes by each method. Cheap to clone.
#[derive(Clone)]
pub struct Remover {
    nodes: NodeWriter,
    node_api: Api<Node>,
    cluster_api: Option<ClusterApi>,
    karpenter: Option<Karpenter>,
}

impl Remover {
    /// Deletes Node objects only, until [`Self::with_cluster_api`] / [`Self::with_karpenter`].
    pub fn new(client: kube::Client) -> Self {
        Self {
            nodes: NodeWriter::new(client.clone()),
            node_api: Api::all(client),
            cluster_api: None,
            karpenter: None,
        }
    }

    pub fn with_cluster_api(mut self, c: ClusterApi) -> Self {
        self.cluster_api = Some(c);
        self
    }

    pub fn with_karpenter(mut self, k: Karpenter) -> Self {
        self.karpenter = Some(k);
        self
    }

    /// Which methods this controller can carry out.
    pub fn enabled(&self, method: RemovalMethod) -> bool {
        match method {
            RemovalMethod::Auto | RemovalMethod::Node => true,
            RemovalMethod::ClusterApi => self.cluster_api.is_some(),
            RemovalMethod::Karpenter => self.karpenter.is_some(),
        }
    }

    fn capi(&self) -> Result<&ClusterApi, RemovalError> {
        self.cluster_api
            .as_ref()
            .ok_or(RemovalError::NotEnabled(RemovalMethod::ClusterApi))
    }

    fn karp(&self) -> Result<&Karpenter, RemovalError> {
        self.karpenter
            .as_ref()
            .ok_or(RemovalError::NotEnabled(RemovalMethod::Karpenter))
    }

    /// The uid of Node `node` now (`None`: gone).
    pub async fn node_uid(&self, node: &str) -> Result<Option<String>, RemovalError> {
        let n = self
            .node_api
            .get_opt(node)
            .await
            .map_err(|e| RemovalError::api(format!("Node {node}"), "reading", e))?;
        Ok(n.map(|n| n.metadata.uid.unwrap_or_default()))
    }

    /// Whether the removal of `node` was already handed off before this process took the drain
    /// over (its Machine carries ebb's mark for it, or its NodeClaim is being deleted): such a
    /// drain goes straight to the hand-off, which finds it done, and is never rolled back.
    pub async fn committed(&self, node: &str, target: &Target) -> Result<bool, RemovalError> {
        match target {
            Target::Node => Ok(false),
            Target::ClusterApi { machine } => Ok(self.capi()?.committed(machine, node).await?.1),
            Target::Karpenter { node_claim } => self.karp()?.committed(node_claim).await,
        }
    }

    /// Deletes the Node (method `Node`), or hands its machine off. Idempotent.
    pub async fn hand_off(
        &self,
        node: &str,
        target: &Target,
        policy_min: i32,
    ) -> Result<HandedOff, RemovalError> {
        let mut status = status_for(node, target);
        let (uid, replicas) = match target {
            Target::Node => {
                self.nodes.delete(node).await?;
                (None, None)
            }
            Target::ClusterApi { machine } => {
                let capi = self.capi()?;
                let (uid, _) = capi.committed(machine, node).await?;
                match capi.hand_off(node, machine, policy_min).await? {
                    Some(h) => {
                        status.scaled = Some(h.scaled);
                        (uid, h.replicas)
                    }
                    None => (None, None),
                }
            }
            Target::Karpenter { node_claim } => {
                (self.karp()?.hand_off(node, node_claim).await?, None)
            }
        };
        Ok(HandedOff {
            status,
            uid,
            replicas,
        })
    }

    /// What of a handed-off removal is still there (empty: all gone): the Machine or NodeClaim
    /// (`uid` is the one handed off) and the Node (`node_uid`, the drained one).
    pub async fn remaining(
        &self,
        node: &str,
        node_uid: Option<&str>,
        target: &Target,
        uid: Option<&str>,
    ) -> Result<Vec<String>, RemovalError> {
        let mut left = Vec::new();
        let machine_gone = match target {
            Target::Node => true,
            Target::ClusterApi { machine } => self.capi()?.gone(machine, uid).await?,
            Target::Karpenter { node_claim } => self.karp()?.gone(node_claim, uid).await?,
        };
        if !machine_gone {
            left.push(status_for(node, target).object);
        }
        let now = self.node_uid(node).await?;
        if now.is_some() && (node_uid.is_none() || now.as_deref() == node_uid) {
            left.push(format!("Node {node}"));
        }
        Ok(left)
    }
}

/// A removal provider's kinds are not served: what is missing, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("cannot discover the {group} API group: {source}")]
    Discovery {
        group: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the API server serves no {group} {kind} (install {provider}, or disable {provider} removal)"
    )]
    NotServed {
        group: &'static str,
        kind: &'static str,
        provider: &'static str,
    },
}
