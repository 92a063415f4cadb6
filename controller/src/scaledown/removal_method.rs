//! Which removal method a drained node gets (`removal.method`, `Auto` resolved per node), and
//! whether the node has what that method acts on. Decided before any simulation.

use ebb_api::RemovalMethod;
use ebb_api::reasons::UnremovableReason;

use k8s_openapi::api::core::v1::Node;

use crate::cluster::machines::{MachineLink, Provider, ProviderIndex, link};

/// What removing one drained node acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Delete the Node object.
    Node,
    /// Mark the Machine (`namespace/name`) and scale its group down.
    ClusterApi { machine: String },
    /// Delete the NodeClaim.
    Karpenter { node_claim: String },
}

impl Target {
    /// The method this target is removed with.
    pub fn method(&self) -> RemovalMethod {
        match self {
            Target::Node => RemovalMethod::Node,
            Target::ClusterApi { .. } => RemovalMethod::ClusterApi,
            Target::Karpenter { .. } => RemovalMethod::Karpenter,
        }
    }
}

/// The target of `node` under `method`:
/// - `Node` always deletes the Node object;
/// - `ClusterAPI` and `Karpenter` need the node's Machine (both Cluster API annotations) or a
///   NodeClaim naming it (`NoMachineToRemove`), and the controller watching that provider
///   (`RemovalMethodNotEnabled`);
/// - `Auto` picks Cluster API for a node with the Machine annotation, Karpenter for one with
///   the NodePool label and a NodeClaim, else `Node` (a NodePool-labelled node no NodeClaim
///   names is an orphan Karpenter no longer manages).
pub fn target(
    method: RemovalMethod,
    link: Option<&MachineLink>,
) -> Result<Target, UnremovableReason> {
    match method {
        RemovalMethod::Node => Ok(Target::Node),
        RemovalMethod::ClusterApi => provider_target(link, Provider::ClusterApi),
        RemovalMethod::Karpenter => provider_target(link, Provider::Karpenter),
        RemovalMethod::Auto => match link {
            None => Ok(Target::Node),
            Some(l) if !l.enabled => Err(UnremovableReason::RemovalMethodNotEnabled),
            Some(l) if l.provider == Provider::Karpenter && l.object.is_none() => Ok(Target::Node),
            Some(l) => provider_target(Some(l), l.provider),
        },
    }
}

/// [`target`] of a Node object, with the machine behind it looked up in `providers`.
pub fn target_of_node(
    method: RemovalMethod,
    node: &Node,
    providers: &ProviderIndex,
) -> Result<Target, UnremovableReason> {
    let empty = Default::default();
    let m = &node.metadata;
    let l = link(
        m.name.as_deref().unwrap_or_default(),
        m.labels.as_ref().unwrap_or(&empty),
        m.annotations.as_ref().unwrap_or(&empty),
        providers,
    );
    target(method, l.as_ref())
}

/// Why a planned node is not drained after all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotDrained {
    #[error("the node is gone")]
    NodeGone,
    #[error("its removal no longer applies ({0})")]
    RemovalNoLongerApplies(UnremovableReason),
}

/// What a drain of `node` removes, for a policy in `mode` whose planner checks `method`
/// ([`super::PlannerConfig::removal`]): `None` when nothing is removed (not `DrainAndDelete`);
/// an error when the node is gone or its removal no longer applies.
pub fn drain_target(
    mode: ebb_api::ScaleDownMode,
    method: Option<RemovalMethod>,
    node: Option<&Node>,
    providers: &ProviderIndex,
) -> Result<Option<Target>, NotDrained> {
    match (mode, method) {
        (ebb_api::ScaleDownMode::DrainAndDelete, Some(method)) => {
            let node = node.ok_or(NotDrained::NodeGone)?;
            target_of_node(method, node, providers)
                .map(Some)
                .map_err(NotDrained::RemovalNoLongerApplies)
        }
        _ => Ok(None),
    }
}

fn provider_target(
    link: Option<&MachineLink>,
    want: Provider,
) -> Result<Target, UnremovableReason> {
    let Some(l) = link.filter(|l| l.provider == want) else {
        return Err(UnremovableReason::NoMachineToRemove);
    };
    if !l.enabled {
        return Err(UnremovableReason::RemovalMethodNotEnabled);
    }
    let Some(object) = l.object.clone() else {
        return Err(UnremovableReason::NoMachineToRemove);
    };
    Ok(match want {
        Provider::ClusterApi => Target::ClusterApi { machine: object },
        Provider::Karpenter => Target::Karpenter { node_claim: object },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::node;
    use RemovalMethod::*;

    fn linked(provider: Provider, enabled: bool, object: Option<&str>) -> MachineLink {
        MachineLink {
            provider,
            enabled,
            object: object.map(str::to_string),
            group: None,
            group_min: None,
        }
    }

    #[test]
    fn auto_follows_the_machine_behind_the_node() {
        let plain = node("n1").cpu("4").info();
        assert_eq!(target(Auto, plain.machine.as_ref()), Ok(Target::Node));
        assert_eq!(
            target(
                Auto,
                Some(&linked(Provider::ClusterApi, true, Some("ns/m1")))
            ),
            Ok(Target::ClusterApi {
                machine: "ns/m1".into()
            })
        );
        assert_eq!(
            target(
                Auto,
                Some(&linked(Provider::Karpenter, true, Some("claim-1")))
            ),
            Ok(Target::Karpenter {
                node_claim: "claim-1".into()
            })
        );
        assert_eq!(
            target(Auto, Some(&linked(Provider::Karpenter, true, None))),
            Ok(Target::Node),
            "a NodePool label without a NodeClaim is an orphan node"
        );
        assert_eq!(
            target(Auto, Some(&linked(Provider::ClusterApi, true, None))),
            Err(UnremovableReason::NoMachineToRemove),
            "a Machine annotation without namespace is never deleted as a bare Node"
        );
        for p in [Provider::ClusterApi, Provider::Karpenter] {
            assert_eq!(
                target(Auto, Some(&linked(p, false, Some("x")))),
                Err(UnremovableReason::RemovalMethodNotEnabled),
                "{p:?}"
            );
        }
    }

    #[test]
    fn an_explicit_method_needs_its_object() {
        let plain = node("n1").cpu("4").info();
        assert_eq!(
            target(ClusterApi, plain.machine.as_ref()),
            Err(UnremovableReason::NoMachineToRemove)
        );
        assert_eq!(
            target(
                Karpenter,
                Some(&linked(Provider::ClusterApi, true, Some("ns/m1")))
            ),
            Err(UnremovableReason::NoMachineToRemove)
        );
        assert_eq!(
            target(Karpenter, Some(&linked(Provider::Karpenter, true, None))),
            Err(UnremovableReason::NoMachineToRemove)
        );
        assert_eq!(
            target(
                ClusterApi,
                Some(&linked(Provider::ClusterApi, false, Some("ns/m1")))
            ),
            Err(UnremovableReason::RemovalMethodNotEnabled)
        );
        assert_eq!(
            target(
                Node,
                Some(&linked(Provider::ClusterApi, true, Some("ns/m1")))
            ),
            Ok(Target::Node),
            "method Node deletes the Node object whatever manages it"
        );
    }
}
