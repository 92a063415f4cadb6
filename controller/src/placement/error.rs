//! Errors of the placement history: invalid specs and events naming unknown roles. Messages name
//! the field or object and say what to change.

/// Why the placement history refused a spec or an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    #[error("spec.roles lists the role {name:?} more than once: give every role a unique name")]
    DuplicateRole { name: String },
    #[error(
        "pod {pod:?} names role {role:?}, which is not in spec.roles: add the role to the PlacementHistory or fix the pod's role label"
    )]
    UnknownRole { pod: String, role: String },
    #[error("spec.{field} is 0s: set it to a positive duration such as \"6h\"")]
    ZeroDuration { field: &'static str },
    #[error(
        "pod {pod:?} is already bound to node {node:?}: only pods that are not yet scheduled can be placed"
    )]
    AlreadyBound { pod: String, node: String },
}
