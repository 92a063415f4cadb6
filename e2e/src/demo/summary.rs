//! The demo's summary: nodes removed, pods moved (accepted evictions in the audit log), refusals,
//! unremovable nodes by reason, elapsed time and PDB violations, as `key: value` lines.

use std::time::Duration;

use ebb_api::ScaleDownPolicyStatus;
use ebb_e2e::{AuditRecord, PdbViolation};

/// The figures of one demo run.
#[derive(Debug)]
pub struct Summary {
    pub nodes: usize,
    pub removed: i64,
    pub nodes_deleted: usize,
    pub pods_moved: usize,
    pub daemon_pods_evicted: usize,
    pub evictions_refused: usize,
    pub unremovable: Vec<(String, i32)>,
    pub pods_ready: usize,
    pub pods_expected: usize,
    pub elapsed: Duration,
    pub sim_elapsed: Duration,
    pub time_factor: f64,
    pub violations: Vec<PdbViolation>,
}

fn is_eviction(r: &AuditRecord) -> bool {
    r.resource == "pods" && r.subresource == "eviction" && r.verb == "create"
}

impl Summary {
    /// Reads the figures from the audit log (writes by `controller`) and the policy status;
    /// evictions in `daemon_namespace` are DaemonSet pods (evicted, not moved).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        nodes: usize,
        status: &ScaleDownPolicyStatus,
        audit: &[AuditRecord],
        controller: &str,
        daemon_namespace: &str,
        violations: Vec<PdbViolation>,
        pods: (usize, usize),
        elapsed: (Duration, Duration),
        time_factor: f64,
    ) -> Self {
        let by_us = || audit.iter().filter(move |r| r.user == controller);
        Self {
            nodes,
            removed: status.removed_total,
            nodes_deleted: by_us()
                .filter(|r| r.resource == "nodes" && r.verb == "delete" && r.code < 300)
                .count(),
            pods_moved: by_us()
                .filter(|r| is_eviction(r) && r.code == 201 && r.namespace != daemon_namespace)
                .count(),
            daemon_pods_evicted: by_us()
                .filter(|r| is_eviction(r) && r.code == 201 && r.namespace == daemon_namespace)
                .count(),
            evictions_refused: by_us().filter(|r| is_eviction(r) && r.code == 429).count(),
            unremovable: status
                .unremovable
                .iter()
                .map(|rc| {
                    let reason = serde_json::to_value(rc.reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_else(|| format!("{:?}", rc.reason));
                    (reason, rc.count)
                })
                .collect(),
            pods_ready: pods.0,
            pods_expected: pods.1,
            elapsed: elapsed.0,
            sim_elapsed: elapsed.1,
            time_factor,
            violations,
        }
    }

    /// The lines printed under `Summary` (tests parse `nodes removed:` and `PDB violations:`).
    pub fn lines(&self) -> Vec<String> {
        let unremovable = if self.unremovable.is_empty() {
            "none".to_string()
        } else {
            self.unremovable
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut lines = vec![
            format!(
                "nodes removed:      {} of {} ({} Node objects deleted)",
                self.removed, self.nodes, self.nodes_deleted
            ),
            format!(
                "pods moved:         {} (evictions; {} refused by a PDB and retried; {} DaemonSet pods evicted with their nodes)",
                self.pods_moved, self.evictions_refused, self.daemon_pods_evicted
            ),
            format!("nodes kept:         {unremovable}"),
            format!(
                "pods ready:         {} of {}",
                self.pods_ready, self.pods_expected
            ),
            format!(
                "elapsed:            {:.1} s ({:.0} s of simulated time at time factor {})",
                self.elapsed.as_secs_f64(),
                self.sim_elapsed.as_secs_f64(),
                self.time_factor
            ),
            format!("PDB violations:     {}", self.violations.len()),
        ];
        for v in &self.violations {
            lines.push(format!(
                "  VIOLATION {} deleted {}/{} while PDB {} allowed no disruption",
                v.user, v.namespace, v.pod, v.pdb
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(user: &str, verb: &str, resource: &str, sub: &str, code: u16) -> AuditRecord {
        AuditRecord {
            time: String::new(),
            user: user.into(),
            verb: verb.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: "shop".into(),
            name: "x".into(),
            code,
        }
    }

    #[test]
    fn counts_only_the_controllers_accepted_evictions_and_deletions() {
        let audit = vec![
            rec("ebb-controller", "create", "pods", "eviction", 201),
            rec("ebb-controller", "create", "pods", "eviction", 201),
            rec("ebb-controller", "create", "pods", "eviction", 429),
            rec("admin", "create", "pods", "eviction", 201),
            AuditRecord {
                namespace: "monitoring".into(),
                ..rec("ebb-controller", "create", "pods", "eviction", 201)
            },
            rec("ebb-controller", "delete", "nodes", "", 200),
            rec("system:pod-gc", "delete", "pods", "", 200),
        ];
        let status = ScaleDownPolicyStatus {
            removed_total: 1,
            ..Default::default()
        };
        let s = Summary::new(
            3,
            &status,
            &audit,
            "ebb-controller",
            "monitoring",
            vec![],
            (5, 5),
            (Duration::from_secs(2), Duration::from_secs(40)),
            20.0,
        );
        assert_eq!(
            (
                s.pods_moved,
                s.daemon_pods_evicted,
                s.evictions_refused,
                s.nodes_deleted
            ),
            (2, 1, 1, 1)
        );
        let lines = s.lines();
        assert!(lines[0].starts_with("nodes removed:      1 of 3"));
        assert_eq!(
            lines.last().map(String::as_str),
            Some("PDB violations:     0")
        );
    }
}
