//! What the periodic NodeState report keeps between reports: the reporter (last status written),
//! the recovery result, the store's schema and writer health, and when the agent became ready.

use std::sync::Arc;
use std::time::Instant;

use ebb_api::nodestate::RecoveryStatus;

use crate::report::{Reporter, StoreHealth};
use crate::store::{SchemaVersion, WriterHealth};

/// What the report needs besides the core.
pub(in crate::agent) struct Reporting {
    pub reporter: Reporter,
    pub recovery: RecoveryStatus,
    /// `None` for the null store.
    pub schema: Option<SchemaVersion>,
    pub health: Arc<WriterHealth>,
    /// When the agent became ready (uptime in the logs).
    pub started: Instant,
}

impl Reporting {
    pub fn new(
        health: Arc<WriterHealth>,
        recovery: RecoveryStatus,
        schema: Option<SchemaVersion>,
    ) -> Self {
        Reporting {
            reporter: Reporter::default(),
            recovery,
            schema,
            health,
            started: Instant::now(),
        }
    }

    pub(super) fn store_health(&self) -> StoreHealth {
        if self.schema.is_none() {
            StoreHealth {
                healthy: true,
                message: "no state directory: the null store keeps nothing across restarts".into(),
            }
        } else if self.health.healthy() {
            StoreHealth {
                healthy: true,
                message: "the state store accepts and commits writes".into(),
            }
        } else {
            StoreHealth {
                healthy: false,
                message: self.health.last_error().unwrap_or_default(),
            }
        }
    }
}
