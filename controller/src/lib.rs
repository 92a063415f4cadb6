//! ebb controller library: the pure cores (`cluster` model, `scaledown` planner, `placement`
//! history), `actuation` (drains), the two `reconcilers` over shared `state`, and the `cli`.

pub mod actuation;
pub mod cli;
pub mod cluster;
pub mod http;
pub mod metrics;
pub mod placement;
pub mod reconcilers;
pub mod scaledown;
pub mod state;
pub mod steering;
pub mod telemetry;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
