//! Karpenter hand-off of a drained node: delete the NodeClaim naming it (Karpenter's
//! termination controller then terminates the instance and the Node), wait for both to go.

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Preconditions};
use kube::discovery::{Discovery, Scope};

use super::RemovalError;

/// Karpenter's NodeClaim kind at the version the API server prefers.
#[derive(Clone, Debug)]
pub struct KarpenterKinds {
    pub node_claim: ApiResource,
}

impl KarpenterKinds {
    /// Discovers `karpenter.sh`'s NodeClaim; an error says what is missing.
    pub async fn discover(client: &kube::Client) -> Result<Self, super::DiscoveryError> {
        const GROUP: &str = "karpenter.sh";
        let discovery = Discovery::new(client.clone())
            .filter(&[GROUP])
            .run()
            .await
            .map_err(|source| super::DiscoveryError::Discovery {
                group: GROUP,
                source,
            })?;
        discovery
            .groups()
            .flat_map(|g| g.recommended_resources())
            .find(|(ar, caps)| ar.kind == "NodeClaim" && caps.scope == Scope::Cluster)
            .map(|(node_claim, _)| Self { node_claim })
            .ok_or(super::DiscoveryError::NotServed {
                group: GROUP,
                kind: "NodeClaim",
                provider: "Karpenter",
            })
    }
}

/// Removes machines through Karpenter. Cheap to clone.
#[derive(Clone)]
pub struct Karpenter {
    api: Api<DynamicObject>,
}

impl Karpenter {
    pub fn new(client: kube::Client, kinds: KarpenterKinds) -> Self {
        Self {
            api: Api::all_with(client, &kinds.node_claim),
        }
    }

    async fn get(&self, claim: &str) -> Result<Option<DynamicObject>, RemovalError> {
        self.api
            .get_opt(claim)
            .await
            .map_err(|e| RemovalError::api(format!("NodeClaim {claim}"), "reading", e))
    }

    /// Deletes NodeClaim `claim` of drained `node`, conditional on its uid. Returns its uid
    /// (`None`: already gone). Errors when it names another node.
    pub async fn hand_off(&self, node: &str, claim: &str) -> Result<Option<String>, RemovalError> {
        let Some(nc) = self.get(claim).await? else {
            return Ok(None);
        };
        let names = nc.data["status"]["nodeName"].as_str().unwrap_or_default();
        if names != node {
            return Err(RemovalError::NotTheNodesMachine {
                machine: format!("NodeClaim {claim}"),
                node: node.to_string(),
                names: names.to_string(),
            });
        }
        let uid = nc.metadata.uid.clone();
        if nc.metadata.deletion_timestamp.is_some() {
            return Ok(uid);
        }
        let params = DeleteParams {
            preconditions: uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(claim, &params).await {
            Ok(_) => {
                tracing::info!(node, claim, "NodeClaim deleted");
                Ok(uid)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(RemovalError::api(
                format!("NodeClaim {claim}"),
                "deleting",
                e,
            )),
        }
    }

    /// Whether the NodeClaim is gone (or replaced by another object of that name).
    pub async fn gone(&self, claim: &str, uid: Option<&str>) -> Result<bool, RemovalError> {
        Ok(match self.get(claim).await? {
            None => true,
            Some(nc) => uid.is_some_and(|u| nc.metadata.uid.as_deref() != Some(u)),
        })
    }

    /// Whether the NodeClaim is already being deleted (a resumed drain past its hand-off).
    pub async fn committed(&self, claim: &str) -> Result<bool, RemovalError> {
        Ok(match self.get(claim).await? {
            None => true,
            Some(nc) => nc.metadata.deletion_timestamp.is_some(),
        })
    }
}
