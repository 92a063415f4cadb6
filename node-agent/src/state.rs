//! The agent's in-memory picture of its node, kept equal to the store by applying the same
//! transitions that were committed. Reporting reads it; only committed transitions change it.

use crate::store::{ContainerRecord, Op};

/// Applies container transitions to one record, as the store does.
pub fn apply_container_ops(rec: &mut ContainerRecord, ops: &[Op]) {
    for op in ops {
        match op {
            Op::ContainerRequested(_, r) => rec.requested = Some(r.clone()),
            Op::ContainerLaunched(_, t) => rec.launched_at = Some(*t),
            Op::ContainerRelaunched(_, t) => {
                rec.launched_at = Some(*t);
                rec.killed = None;
                rec.completed = None;
            }
            Op::ContainerKilled(_, k) => rec.killed = Some(k.clone()),
            Op::ContainerCompleted(_, c) => rec.completed = Some(c.clone()),
            Op::ContainerRestarts(_, n) => rec.restart_count = *n,
            Op::ContainerDiagnostics(_, m) => rec.diagnostics = Some(m.clone()),
            _ => {}
        }
    }
}
