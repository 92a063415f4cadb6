//! The machine behind a node when Cluster API or Karpenter manages it: which Machine or
//! NodeClaim, which node group (MachineDeployment, MachineSet, NodePool) and its minimum size.

use std::collections::{BTreeMap, HashMap};

use ebb_api::names;

/// What the controller knows of Cluster API and Karpenter objects, indexed for the snapshot.
/// `None` for a provider the controller does not watch (its removal is not enabled).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProviderIndex {
    pub cluster_api: Option<ClusterApiIndex>,
    pub karpenter: Option<KarpenterIndex>,
}

/// MachineSets and MachineDeployments, by `(namespace, name)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterApiIndex {
    pub machine_sets: HashMap<(String, String), MachineSetInfo>,
    /// MachineDeployment → its minimum size annotation, if any.
    pub machine_deployments: HashMap<(String, String), Option<i64>>,
}

/// One MachineSet: its owning MachineDeployment (controller owner reference), if any, and its
/// minimum size annotation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineSetInfo {
    pub deployment: Option<String>,
    pub min_size: Option<i64>,
}

/// NodeClaims by the node they name (`status.nodeName`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KarpenterIndex {
    pub claims_by_node: HashMap<String, String>,
}

/// Which provider manages a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    ClusterApi,
    Karpenter,
}

/// The machine behind one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineLink {
    pub provider: Provider,
    /// The controller watches this provider's objects (its removal is enabled).
    pub enabled: bool,
    /// `namespace/name` of the Machine, or the name of the NodeClaim naming the node; `None`
    /// when no NodeClaim names it (or the Machine annotations are incomplete).
    pub object: Option<String>,
    /// The node group: `MachineDeployment ns/name`, `MachineSet ns/name` or `NodePool name`.
    pub group: Option<String>,
    /// The group's `cluster-api-autoscaler-node-group-min-size` annotation.
    pub group_min: Option<i64>,
}

/// The machine behind a node with these labels and annotations, if Cluster API (the
/// `cluster.x-k8s.io/machine` annotation) or Karpenter (the `karpenter.sh/nodepool` label)
/// manages it.
pub fn link(
    node: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    index: &ProviderIndex,
) -> Option<MachineLink> {
    if let Some(machine) = annotations.get(names::CAPI_MACHINE_ANNOTATION) {
        return Some(cluster_api_link(machine, annotations, index));
    }
    let pool = labels.get(names::KARPENTER_NODEPOOL_LABEL)?;
    let claims = index.karpenter.as_ref();
    Some(MachineLink {
        provider: Provider::Karpenter,
        enabled: claims.is_some(),
        object: claims.and_then(|k| k.claims_by_node.get(node).cloned()),
        group: Some(format!("NodePool {pool}")),
        group_min: None,
    })
}

fn cluster_api_link(
    machine: &str,
    annotations: &BTreeMap<String, String>,
    index: &ProviderIndex,
) -> MachineLink {
    let ns = annotations
        .get(names::CAPI_CLUSTER_NAMESPACE_ANNOTATION)
        .filter(|ns| !ns.is_empty());
    let owner = match (
        annotations.get(names::CAPI_OWNER_KIND_ANNOTATION),
        annotations.get(names::CAPI_OWNER_NAME_ANNOTATION),
    ) {
        (Some(kind), Some(name)) if kind == "MachineSet" => Some(name.as_str()),
        _ => None,
    };
    let capi = index.cluster_api.as_ref();
    let set = match (ns, owner, capi) {
        (Some(ns), Some(ms), Some(c)) => c.machine_sets.get(&(ns.clone(), ms.to_string())),
        _ => None,
    };
    let (group, group_min) = match (ns, owner, set) {
        (
            Some(ns),
            _,
            Some(MachineSetInfo {
                deployment: Some(md),
                min_size,
            }),
        ) => {
            let md_min = capi
                .and_then(|c| c.machine_deployments.get(&(ns.clone(), md.clone())))
                .copied()
                .flatten();
            (
                Some(format!("MachineDeployment {ns}/{md}")),
                md_min.or(*min_size),
            )
        }
        (Some(ns), Some(ms), set) => (
            Some(format!("MachineSet {ns}/{ms}")),
            set.and_then(|s| s.min_size),
        ),
        _ => (None, None),
    };
    MachineLink {
        provider: Provider::ClusterApi,
        enabled: capi.is_some(),
        object: ns
            .filter(|_| !machine.is_empty())
            .map(|ns| format!("{ns}/{machine}")),
        group,
        group_min,
    }
}

impl ProviderIndex {
    /// Adds a MachineSet (Cluster API is then known to be there).
    pub fn add_machine_set(&mut self, o: &kube::api::DynamicObject) {
        let (Some(ns), Some(name)) = (o.metadata.namespace.clone(), o.metadata.name.clone()) else {
            return;
        };
        let deployment = o
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.kind == "MachineDeployment" && r.controller == Some(true))
            .map(|r| r.name.clone());
        let info = MachineSetInfo {
            deployment,
            min_size: parse_min_size(o.metadata.annotations.as_ref()),
        };
        self.cluster_api
            .get_or_insert_default()
            .machine_sets
            .insert((ns, name), info);
    }

    /// Adds a MachineDeployment.
    pub fn add_machine_deployment(&mut self, o: &kube::api::DynamicObject) {
        let (Some(ns), Some(name)) = (o.metadata.namespace.clone(), o.metadata.name.clone()) else {
            return;
        };
        self.cluster_api
            .get_or_insert_default()
            .machine_deployments
            .insert((ns, name), parse_min_size(o.metadata.annotations.as_ref()));
    }

    /// Adds a NodeClaim (Karpenter is then known to be there).
    pub fn add_node_claim(&mut self, o: &kube::api::DynamicObject) {
        let k = self.karpenter.get_or_insert_default();
        if let (Some(node), Some(name)) = (o.data["status"]["nodeName"].as_str(), &o.metadata.name)
        {
            k.claims_by_node.insert(node.to_string(), name.clone());
        }
    }
}

/// The minimum size annotation's value, when it is a non-negative integer.
pub fn parse_min_size(annotations: Option<&BTreeMap<String, String>>) -> Option<i64> {
    annotations?
        .get(names::CAPI_MIN_SIZE_ANNOTATION)?
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn capi_node() -> BTreeMap<String, String> {
        map(&[
            (names::CAPI_MACHINE_ANNOTATION, "md-0-abc"),
            (names::CAPI_CLUSTER_NAMESPACE_ANNOTATION, "infra"),
            (names::CAPI_OWNER_KIND_ANNOTATION, "MachineSet"),
            (names::CAPI_OWNER_NAME_ANNOTATION, "md-0-x1"),
        ])
    }

    fn capi_index() -> ProviderIndex {
        let mut c = ClusterApiIndex::default();
        c.machine_sets.insert(
            ("infra".into(), "md-0-x1".into()),
            MachineSetInfo {
                deployment: Some("md-0".into()),
                min_size: Some(1),
            },
        );
        c.machine_deployments
            .insert(("infra".into(), "md-0".into()), Some(3));
        ProviderIndex {
            cluster_api: Some(c),
            karpenter: None,
        }
    }

    #[test]
    fn a_cluster_api_node_belongs_to_its_machine_deployment() {
        let l = link("n1", &map(&[]), &capi_node(), &capi_index()).expect("linked");
        assert_eq!(l.provider, Provider::ClusterApi);
        assert!(l.enabled);
        assert_eq!(l.object.as_deref(), Some("infra/md-0-abc"));
        assert_eq!(l.group.as_deref(), Some("MachineDeployment infra/md-0"));
        assert_eq!(l.group_min, Some(3), "the deployment's minimum wins");
    }

    #[test]
    fn a_machine_set_without_deployment_is_its_own_group() {
        let mut idx = capi_index();
        if let Some(c) = idx.cluster_api.as_mut() {
            c.machine_sets.insert(
                ("infra".into(), "md-0-x1".into()),
                MachineSetInfo {
                    deployment: None,
                    min_size: Some(2),
                },
            );
        }
        let l = link("n1", &map(&[]), &capi_node(), &idx).expect("linked");
        assert_eq!(l.group.as_deref(), Some("MachineSet infra/md-0-x1"));
        assert_eq!(l.group_min, Some(2));
    }

    #[test]
    fn without_the_cluster_api_watch_the_node_is_still_recognised() {
        let l = link("n1", &map(&[]), &capi_node(), &ProviderIndex::default()).expect("linked");
        assert!(!l.enabled);
        assert_eq!(l.group.as_deref(), Some("MachineSet infra/md-0-x1"));
        assert_eq!(l.group_min, None);
        // no namespace annotation: no Machine to act on
        let mut ann = capi_node();
        ann.remove(names::CAPI_CLUSTER_NAMESPACE_ANNOTATION);
        let l = link("n1", &map(&[]), &ann, &capi_index()).expect("linked");
        assert_eq!(l.object, None);
        assert_eq!(l.group, None);
    }

    #[test]
    fn a_karpenter_node_needs_a_node_claim_naming_it() {
        let labels = map(&[(names::KARPENTER_NODEPOOL_LABEL, "general")]);
        let mut k = KarpenterIndex::default();
        k.claims_by_node.insert("n1".into(), "general-abcde".into());
        let idx = ProviderIndex {
            cluster_api: None,
            karpenter: Some(k),
        };
        let l = link("n1", &labels, &map(&[]), &idx).expect("linked");
        assert_eq!(l.provider, Provider::Karpenter);
        assert_eq!(l.object.as_deref(), Some("general-abcde"));
        assert_eq!(l.group.as_deref(), Some("NodePool general"));
        let other = link("n2", &labels, &map(&[]), &idx).expect("linked");
        assert_eq!(other.object, None);
        assert!(link("n3", &map(&[]), &map(&[]), &idx).is_none());
    }

    #[test]
    fn min_size_must_be_a_count() {
        let ann = |v: &str| map(&[(names::CAPI_MIN_SIZE_ANNOTATION, v)]);
        assert_eq!(parse_min_size(Some(&ann("4"))), Some(4));
        assert_eq!(parse_min_size(Some(&ann(" 0 "))), Some(0));
        assert_eq!(parse_min_size(Some(&ann("-1"))), None);
        assert_eq!(parse_min_size(Some(&ann("many"))), None);
        assert_eq!(parse_min_size(None), None);
    }
}
