//! Caches of Cluster API's MachineSets and MachineDeployments and Karpenter's NodeClaims, when
//! their removal is enabled, indexed for the snapshot (node groups, minimums, NodeClaims).

use std::collections::HashMap;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;

use crate::actuation::removal::{ClusterApiKinds, KarpenterKinds};
use crate::cluster::providers::{
    ClusterApiIndex, KarpenterIndex, MachineSetInfo, ProviderIndex, parse_min_size,
};

/// Where the provider objects are read from: the Cluster API management cluster (this one
/// unless `--cluster-api-kubeconfig` says otherwise) and this cluster for NodeClaims.
#[derive(Clone, Default)]
pub struct ProviderSources {
    pub cluster_api: Option<(kube::Client, ClusterApiKinds)>,
    pub karpenter: Option<(kube::Client, KarpenterKinds)>,
}

/// The provider caches (empty when a provider is not enabled).
#[derive(Clone, Default)]
pub struct ProviderStores {
    machine_sets: Option<Store<DynamicObject>>,
    machine_deployments: Option<Store<DynamicObject>>,
    node_claims: Option<Store<DynamicObject>>,
}

fn reflect(api: Api<DynamicObject>, ar: &ApiResource) -> (Store<DynamicObject>, JoinHandle<()>) {
    let writer = reflector::store::Writer::new(ar.clone());
    let store = writer.as_reader();
    let kind = ar.kind.clone();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None)
        .reflect(writer);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                tracing::warn!(kind, error = %e, "watch failed; retrying");
            }
        }
    });
    (store, task)
}

impl ProviderStores {
    /// Starts the watches of the enabled providers; their tasks go into `tasks`.
    pub fn start(sources: &ProviderSources, tasks: &mut Vec<JoinHandle<()>>) -> Self {
        let mut out = Self::default();
        if let Some((client, kinds)) = &sources.cluster_api {
            let (ms, t) = reflect(
                Api::all_with(client.clone(), &kinds.machine_set),
                &kinds.machine_set,
            );
            tasks.push(t);
            let (md, t) = reflect(
                Api::all_with(client.clone(), &kinds.machine_deployment),
                &kinds.machine_deployment,
            );
            tasks.push(t);
            out.machine_sets = Some(ms);
            out.machine_deployments = Some(md);
        }
        if let Some((client, kinds)) = &sources.karpenter {
            let (nc, t) = reflect(
                Api::all_with(client.clone(), &kinds.node_claim),
                &kinds.node_claim,
            );
            tasks.push(t);
            out.node_claims = Some(nc);
        }
        out
    }

    /// Waits until each enabled cache has listed once.
    pub async fn wait_synced(&self) -> Result<(), reflector::store::WriterDropped> {
        for s in [
            &self.machine_sets,
            &self.machine_deployments,
            &self.node_claims,
        ]
        .into_iter()
        .flatten()
        {
            s.wait_until_ready().await?;
        }
        Ok(())
    }

    /// The index the snapshot resolves each node's machine with.
    pub fn index(&self) -> ProviderIndex {
        ProviderIndex {
            cluster_api: self.machine_sets.as_ref().map(|ms| ClusterApiIndex {
                machine_sets: ms.state().iter().filter_map(|o| machine_set(o)).collect(),
                machine_deployments: self
                    .machine_deployments
                    .iter()
                    .flat_map(|s| s.state())
                    .filter_map(|o| {
                        let key = (o.metadata.namespace.clone()?, o.metadata.name.clone()?);
                        Some((key, parse_min_size(o.metadata.annotations.as_ref())))
                    })
                    .collect(),
            }),
            karpenter: self.node_claims.as_ref().map(|nc| KarpenterIndex {
                claims_by_node: nc
                    .state()
                    .iter()
                    .filter_map(|o| {
                        let node = o.data["status"]["nodeName"].as_str()?;
                        Some((node.to_string(), o.metadata.name.clone()?))
                    })
                    .collect::<HashMap<_, _>>(),
            }),
        }
    }
}

fn machine_set(o: &DynamicObject) -> Option<((String, String), MachineSetInfo)> {
    let key = (o.metadata.namespace.clone()?, o.metadata.name.clone()?);
    let deployment = o
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.kind == "MachineDeployment" && r.controller == Some(true))
        .map(|r| r.name.clone());
    Some((
        key,
        MachineSetInfo {
            deployment,
            min_size: parse_min_size(o.metadata.annotations.as_ref()),
        },
    ))
}
