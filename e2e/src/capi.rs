//! Cluster API on the real control plane: its CRDs from its Go module, node groups of Machines
//! bound to kwok nodes, and (where it builds) its core controllers.
