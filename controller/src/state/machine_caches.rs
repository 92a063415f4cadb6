//! Caches of Cluster API's MachineSets and MachineDeployments and Karpenter's NodeClaims, when
//! their removal is enabled, indexed for the snapshot (node groups, minimums, NodeClaims).

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;

use super::lists::InitialList;
use super::trim::Trim;
use crate::actuation::removal::{ClusterApiKinds, KarpenterKinds};
use crate::cluster::machines::ProviderIndex;

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

fn reflect(
    api: Api<DynamicObject>,
    lists: InitialList,
    ar: &ApiResource,
    on_change: impl Fn() + Send + 'static,
) -> (Store<DynamicObject>, JoinHandle<()>) {
    let writer = reflector::store::Writer::new(ar.clone());
    let store = writer.as_reader();
    let kind = ar.kind.clone();
    let stream = watcher(api, lists.config())
        .default_backoff()
        .modify(Trim::trim)
        .reflect(writer);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(watcher::Event::Init) => {}
                Ok(_) => on_change(),
                Err(e) => tracing::warn!(kind, error = %e, "watch failed; retrying"),
            }
        }
    });
    (store, task)
}

impl ProviderStores {
    /// Starts the watches of the enabled providers; their tasks go into `tasks`, and `on_change`
    /// runs on each of their events.
    pub fn start(
        sources: &ProviderSources,
        lists: InitialList,
        tasks: &mut Vec<JoinHandle<()>>,
        on_change: impl Fn() + Clone + Send + 'static,
    ) -> Self {
        let mut out = Self::default();
        if let Some((client, kinds)) = &sources.cluster_api {
            let (ms, t) = reflect(
                Api::all_with(client.clone(), &kinds.machine_set),
                lists,
                &kinds.machine_set,
                on_change.clone(),
            );
            tasks.push(t);
            let (md, t) = reflect(
                Api::all_with(client.clone(), &kinds.machine_deployment),
                lists,
                &kinds.machine_deployment,
                on_change.clone(),
            );
            tasks.push(t);
            out.machine_sets = Some(ms);
            out.machine_deployments = Some(md);
        }
        if let Some((client, kinds)) = &sources.karpenter {
            let (nc, t) = reflect(
                Api::all_with(client.clone(), &kinds.node_claim),
                lists,
                &kinds.node_claim,
                on_change.clone(),
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
        let mut index = ProviderIndex::default();
        if self.machine_sets.is_some() {
            index.cluster_api = Some(Default::default());
        }
        if self.node_claims.is_some() {
            index.karpenter = Some(Default::default());
        }
        for o in self.machine_sets.iter().flat_map(|s| s.state()) {
            index.add_machine_set(&o);
        }
        for o in self.machine_deployments.iter().flat_map(|s| s.state()) {
            index.add_machine_deployment(&o);
        }
        for o in self.node_claims.iter().flat_map(|s| s.state()) {
            index.add_node_claim(&o);
        }
        index
    }
}
