//! NodeStates as the node agents report them, for the planner's warm-data ordering.

use ebb_api::nodestate::{LocalizedResource, NodeState, NodeStateSpec, NodeStateStatus};

/// A NodeState for `node` whose agent reports `roles` (PlacementHistory name, role) of
/// namespace `default` localized, plus one fetch still running (not warm).
pub fn node_state_warm(node: &str, roles: &[(&str, &str)]) -> NodeState {
    let res = |ph: &str, role: &str, state: &str| LocalizedResource {
        namespace: "default".into(),
        placement_history: ph.into(),
        role: role.into(),
        name: "data".into(),
        size_bytes: 1 << 20,
        state: state.into(),
        message: None,
    };
    let mut localized: Vec<LocalizedResource> = roles
        .iter()
        .map(|(ph, role)| res(ph, role, "Localized"))
        .collect();
    localized.push(res("other", "fetching", "Fetching"));
    let mut st = NodeState::new(
        node,
        NodeStateSpec {
            node_name: node.into(),
        },
    );
    st.status = Some(NodeStateStatus {
        localized,
        ..Default::default()
    });
    st
}
