//! Cluster API hand-off of a drained node: mark its Machine `delete-machine`, lower its
//! MachineDeployment's (or MachineSet's) replicas by one through `/scale`, wait for both to go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ebb_api::names;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{ApiCapabilities, Discovery, Scope};
use serde_json::json;

use super::RemovalError;
use super::mark::{GroupKind, GroupRef, GroupState, Mark, Next, next};
use crate::cluster::machines::parse_min_size;

/// Attempts of a conflicting write before giving up (the next loop tries again).
const CONFLICT_ATTEMPTS: usize = 5;

/// The Cluster API kinds ebb uses, at the versions the API server prefers.
#[derive(Clone, Debug)]
pub struct ClusterApiKinds {
    pub machine: ApiResource,
    pub machine_set: ApiResource,
    pub machine_deployment: ApiResource,
}

impl ClusterApiKinds {
    /// Discovers `cluster.x-k8s.io`'s Machine, MachineSet and MachineDeployment; an error
    /// names what is missing.
    pub async fn discover(client: &kube::Client) -> Result<Self, super::DiscoveryError> {
        const GROUP: &str = "cluster.x-k8s.io";
        let discovery = Discovery::new(client.clone())
            .filter(&[GROUP])
            .run()
            .await
            .map_err(|source| super::DiscoveryError::Discovery {
                group: GROUP,
                source,
            })?;
        let mut found: HashMap<String, (ApiResource, ApiCapabilities)> = HashMap::new();
        for group in discovery.groups() {
            for (ar, caps) in group.recommended_resources() {
                found.insert(ar.kind.clone(), (ar, caps));
            }
        }
        let mut take = |kind: &'static str| {
            found
                .remove(kind)
                .filter(|(_, caps)| caps.scope == Scope::Namespaced)
                .map(|(ar, _)| ar)
                .ok_or(super::DiscoveryError::NotServed {
                    group: GROUP,
                    kind,
                    provider: "Cluster API",
                })
        };
        Ok(Self {
            machine: take("Machine")?,
            machine_set: take("MachineSet")?,
            machine_deployment: take("MachineDeployment")?,
        })
    }
}

/// What a hand-off did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandOff {
    /// `Machine ns/name`.
    pub object: String,
    /// The group scaled down.
    pub scaled: String,
    /// `replicas` before and after, when this call lowered them.
    pub replicas: Option<(i32, i32)>,
}

/// Removes machines through Cluster API. Cheap to clone.
#[derive(Clone)]
pub struct ClusterApi {
    client: kube::Client,
    kinds: ClusterApiKinds,
    /// One hand-off at a time per group, so that k parallel drains lower it k times in turn.
    locks: Arc<Mutex<HashMap<GroupRef, Arc<tokio::sync::Mutex<()>>>>>,
}

fn code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn split(machine: &str) -> Result<(&str, &str), RemovalError> {
    machine
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
        .ok_or_else(|| RemovalError::Invalid(format!("Machine `{machine}` is not namespace/name")))
}

impl ClusterApi {
    pub fn new(client: kube::Client, kinds: ClusterApiKinds) -> Self {
        Self {
            client,
            kinds,
            locks: Arc::default(),
        }
    }

    fn api(&self, ar: &ApiResource, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, ar)
    }

    fn lock_of(&self, group: &GroupRef) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(group.clone()).or_default().clone()
    }

    async fn get(
        &self,
        ar: &ApiResource,
        ns: &str,
        name: &str,
    ) -> Result<Option<DynamicObject>, RemovalError> {
        self.api(ar, ns).get_opt(name).await.map_err(|source| {
            RemovalError::api(format!("{} {ns}/{name}", ar.kind), "reading", source)
        })
    }

    /// The Machine `ns/name` of `node`; `None` when it is gone. Errors when it names another
    /// node (the node's annotation is stale) or no MachineSet owns it.
    async fn machine(
        &self,
        ns: &str,
        name: &str,
        node: &str,
    ) -> Result<Option<(DynamicObject, GroupRef)>, RemovalError> {
        let Some(m) = self.get(&self.kinds.machine, ns, name).await? else {
            return Ok(None);
        };
        let node_ref = m.data["status"]["nodeRef"]["name"].as_str();
        if node_ref.is_some_and(|n| n != node) {
            return Err(RemovalError::NotTheNodesMachine {
                machine: format!("{ns}/{name}"),
                node: node.to_string(),
                names: node_ref.unwrap_or_default().to_string(),
            });
        }
        let set = controller_owner(&m, "MachineSet").ok_or_else(|| {
            RemovalError::NoScalableGroup(format!(
                "Machine {ns}/{name} is not owned by a MachineSet (control-plane and stand-alone Machines are not removed)"
            ))
        })?;
        let group = match self.get(&self.kinds.machine_set, ns, &set).await? {
            Some(ms) => match controller_owner(&ms, "MachineDeployment") {
                Some(md) => GroupRef {
                    kind: GroupKind::MachineDeployment,
                    namespace: ns.to_string(),
                    name: md,
                },
                None => GroupRef {
                    kind: GroupKind::MachineSet,
                    namespace: ns.to_string(),
                    name: set,
                },
            },
            None => {
                return Err(RemovalError::NoScalableGroup(format!(
                    "MachineSet {ns}/{set} owning Machine {ns}/{name} does not exist"
                )));
            }
        };
        Ok(Some((m, group)))
    }

    fn group_api(&self, group: &GroupRef) -> Api<DynamicObject> {
        let ar = match group.kind {
            GroupKind::MachineDeployment => &self.kinds.machine_deployment,
            GroupKind::MachineSet => &self.kinds.machine_set,
        };
        self.api(ar, &group.namespace)
    }

    /// Marks the Machine of drained `node` and lowers its group's replicas by one (once, even
    /// across restarts; see [`next`]). `policy_min` is the policy's `minNodesPerGroup`.
    pub async fn hand_off(
        &self,
        node: &str,
        machine: &str,
        policy_min: i32,
    ) -> Result<Option<HandOff>, RemovalError> {
        let (ns, name) = split(machine)?;
        let Some((mut m, group)) = self.machine(ns, name, node).await? else {
            return Ok(None);
        };
        let lock = self.lock_of(&group);
        let _one_at_a_time = lock.lock().await;
        let groups = self.group_api(&group);
        let mut marked_here = false;
        for _ in 0..CONFLICT_ATTEMPTS {
            let g = groups
                .get(&group.name)
                .await
                .map_err(|e| RemovalError::api(group.to_string(), "reading", e))?;
            let state = GroupState {
                generation: g.metadata.generation.unwrap_or(0),
                replicas: g.data["spec"]["replicas"].as_i64().unwrap_or(1) as i32,
                min: policy_min
                    .max(parse_min_size(g.metadata.annotations.as_ref()).unwrap_or(0) as i32),
            };
            let mark = Mark::read(m.metadata.annotations.as_ref());
            match next(mark.as_ref(), marked_here, node, &group, &state) {
                Next::AlreadyScaled => {
                    return Ok(Some(self.done(ns, name, &group, None)));
                }
                Next::AtMinimum => {
                    if marked_here || mark.is_some_and(|mk| mk.node == node) {
                        self.unmark(ns, name).await;
                    }
                    return Err(RemovalError::AtMinimum {
                        group: group.to_string(),
                        replicas: state.replicas,
                        min: state.min,
                    });
                }
                Next::Mark(new) => match self.write_mark(&m, &new).await? {
                    Some(updated) => {
                        m = updated;
                        marked_here = true;
                    }
                    None => m = self.reread(ns, name).await?,
                },
                Next::Scale { to } => {
                    let mut scale = groups.get_scale(&group.name).await.map_err(|e| {
                        RemovalError::api(group.to_string(), "reading the scale of", e)
                    })?;
                    // the scale's resourceVersion is the group's: a write in between conflicts
                    scale.metadata.resource_version = g.metadata.resource_version.clone();
                    scale.spec.get_or_insert_default().replicas = Some(to);
                    match groups
                        .replace_scale(&group.name, &PostParams::default(), &scale)
                        .await
                    {
                        Ok(_) => {
                            tracing::info!(%group, from = state.replicas, to, machine, "node group scaled down");
                            return Ok(Some(self.done(
                                ns,
                                name,
                                &group,
                                Some((state.replicas, to)),
                            )));
                        }
                        Err(e) if code(&e) == Some(409) => {
                            m = self.reread(ns, name).await?;
                        }
                        Err(e) => {
                            return Err(RemovalError::api(group.to_string(), "scaling down", e));
                        }
                    }
                }
            }
        }
        Err(RemovalError::Conflicts(group.to_string()))
    }

    fn done(
        &self,
        ns: &str,
        name: &str,
        group: &GroupRef,
        replicas: Option<(i32, i32)>,
    ) -> HandOff {
        HandOff {
            object: format!("Machine {ns}/{name}"),
            scaled: group.to_string(),
            replicas,
        }
    }

    async fn reread(&self, ns: &str, name: &str) -> Result<DynamicObject, RemovalError> {
        self.get(&self.kinds.machine, ns, name)
            .await?
            .ok_or_else(|| RemovalError::Gone(format!("Machine {ns}/{name}")))
    }

    /// Writes the mark and `delete-machine` with the Machine's resourceVersion; `None` on a
    /// conflict (re-read and decide again).
    async fn write_mark(
        &self,
        m: &DynamicObject,
        mark: &Mark,
    ) -> Result<Option<DynamicObject>, RemovalError> {
        let ns = m.metadata.namespace.clone().unwrap_or_default();
        let name = m.metadata.name.clone().unwrap_or_default();
        let patch = json!({
            "metadata": {
                "resourceVersion": m.metadata.resource_version,
                "annotations": {
                    names::CAPI_DELETE_MACHINE_ANNOTATION: jiff::Timestamp::now().to_string(),
                    names::ANNOTATION_MACHINE_REMOVAL: mark.value(),
                },
            },
        });
        match self
            .api(&self.kinds.machine, &ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => Ok(Some(updated)),
            Err(e) if code(&e) == Some(409) => Ok(None),
            Err(e) => Err(RemovalError::api(
                format!("Machine {ns}/{name}"),
                "marking",
                e,
            )),
        }
    }

    /// Best effort: take ebb's marks off a Machine whose group was not scaled down.
    async fn unmark(&self, ns: &str, name: &str) {
        let patch = json!({ "metadata": { "annotations": {
            names::CAPI_DELETE_MACHINE_ANNOTATION: null,
            names::ANNOTATION_MACHINE_REMOVAL: null,
        }}});
        if let Err(e) = self
            .api(&self.kinds.machine, ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(machine = %format!("{ns}/{name}"), error = %e, "could not unmark Machine");
        }
    }

    /// Whether the Machine is gone (or replaced by another object of that name).
    pub async fn gone(&self, machine: &str, uid: Option<&str>) -> Result<bool, RemovalError> {
        let (ns, name) = split(machine)?;
        Ok(match self.get(&self.kinds.machine, ns, name).await? {
            None => true,
            Some(m) => uid.is_some_and(|u| m.metadata.uid.as_deref() != Some(u)),
        })
    }

    /// The Machine's uid, and whether ebb already marked it for `node` (a resumed drain whose
    /// hand-off began before a restart: it is not rolled back).
    pub async fn committed(
        &self,
        machine: &str,
        node: &str,
    ) -> Result<(Option<String>, bool), RemovalError> {
        let (ns, name) = split(machine)?;
        Ok(match self.get(&self.kinds.machine, ns, name).await? {
            None => (None, true),
            Some(m) => (
                m.metadata.uid.clone(),
                Mark::read(m.metadata.annotations.as_ref()).is_some_and(|mk| mk.node == node),
            ),
        })
    }
}

/// The name of the controller owner of kind `kind`, if any.
fn controller_owner(o: &DynamicObject, kind: &str) -> Option<String> {
    o.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.kind == kind && r.controller == Some(true))
        .map(|r| r.name.clone())
}
