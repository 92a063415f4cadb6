//! The crate's test builders ([`crate::testkit`]) where the actuator's unit tests import them:
//! `node("n1").taint(..).build()`, `pod("web-1").on("n1").owned_by("ReplicaSet", "web")`.

pub use crate::testkit::{node, pod};
