//! The NodeState status the agent reports, built purely from its state and the clock, and the
//! `Reporter` that lets through only changed statuses (the caller writes at most once per tick).

use std::collections::BTreeMap;

use ebb_api::NodeStateStatus;
use ebb_api::conditions::{self, Condition, Time};
use ebb_api::nodestate::{KeyIds, LocalizedResource, RecoveryStatus, RoleOutcomes};

use crate::store::{AppId, ContainerId, ContainerRecord, SchemaVersion};
use crate::transitions::{OutcomeClass, classify};

/// Failure accounting of one PlacementHistory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowPolicy {
    /// Counters cover the current fixed period of this length (aligned to the Unix epoch).
    pub failure_window_ms: i64,
    pub short_lived_ms: i64,
}

impl Default for WindowPolicy {
    fn default() -> Self {
        Self {
            failure_window_ms: 6 * 3_600_000,
            short_lived_ms: 60_000,
        }
    }
}

/// Store health as the writer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreHealth {
    pub healthy: bool,
    pub message: String,
}

pub struct ReportInput<'a> {
    pub agent_version: &'a str,
    /// `None` for the null store.
    pub schema_version: Option<SchemaVersion>,
    pub recovery: RecoveryStatus,
    pub ready: bool,
    pub store: StoreHealth,
    pub containers: &'a BTreeMap<ContainerId, ContainerRecord>,
    pub policies: &'a BTreeMap<AppId, WindowPolicy>,
    pub localized: Vec<LocalizedResource>,
    pub pending_deletions: usize,
    pub key_ids: KeyIds,
    pub now: jiff::Timestamp,
}

/// Outcomes per (namespace, PlacementHistory, role) within each history's current window.
pub fn role_outcomes(
    containers: &BTreeMap<ContainerId, ContainerRecord>,
    policies: &BTreeMap<AppId, WindowPolicy>,
    now_ms: i64,
) -> Vec<RoleOutcomes> {
    let mut out: BTreeMap<(String, String, String), RoleOutcomes> = BTreeMap::new();
    for rec in containers.values() {
        let Some(req) = &rec.requested else { continue };
        let (Some(ph), Some(role)) = (&req.placement_history, &req.role) else {
            continue;
        };
        let policy = policies
            .get(&AppId::new(&req.namespace, ph))
            .copied()
            .unwrap_or_default();
        let Some(done) = &rec.completed else { continue };
        let window = policy.failure_window_ms.max(1);
        let window_start = now_ms - now_ms.rem_euclid(window);
        if done.finished_at < window_start {
            continue;
        }
        let Some(class) = classify(rec, policy.short_lived_ms) else {
            continue;
        };
        let entry = out
            .entry((req.namespace.clone(), ph.clone(), role.clone()))
            .or_insert_with(|| RoleOutcomes {
                namespace: req.namespace.clone(),
                placement_history: ph.clone(),
                role: role.clone(),
                ..RoleOutcomes::default()
            });
        match class {
            OutcomeClass::Completed => entry.completed += 1,
            OutcomeClass::StartFailure => entry.start_failures += 1,
            OutcomeClass::ApplicationFailure => entry.application_failures += 1,
            OutcomeClass::LimitsExceeded => entry.limits_exceeded += 1,
            OutcomeClass::NodeFailure => entry.node_failures += 1,
            OutcomeClass::Preempted => entry.preempted += 1,
        }
        let at = jiff::Timestamp::from_millisecond(done.finished_at).ok();
        let newer = match (&entry.last_outcome_at, at) {
            (Some(prev), Some(at)) => at > prev.0,
            (None, Some(_)) => true,
            _ => false,
        };
        if newer && let Some(at) = at {
            entry.last_outcome_at = Some(Time(at));
        }
    }
    out.into_values().collect()
}

/// Builds the status. `previous` conditions keep their transition times while unchanged.
pub fn build_status(input: ReportInput<'_>, previous: &[Condition]) -> NodeStateStatus {
    let now_ms = input.now.as_millisecond();
    let mut conds: Vec<Condition> = previous.to_vec();
    let c = |t: &str, ok: bool, reason: &str, msg: String| {
        conditions::condition(t, ok, reason, msg, None, input.now)
    };
    conditions::set_condition(
        &mut conds,
        c(
            conditions::STORE_HEALTHY,
            input.store.healthy,
            if input.store.healthy {
                "WritesCommitted"
            } else {
                "WriteFailed"
            },
            input.store.message.clone(),
        ),
    );
    let recovered = input.ready;
    conditions::set_condition(
        &mut conds,
        c(
            conditions::RECOVERED,
            recovered,
            if recovered {
                "RecoveryFinished"
            } else {
                "Recovering"
            },
            format!(
                "{} containers, {} lost, {} cached resources, {} deletions resumed",
                input.recovery.containers,
                input.recovery.lost,
                input.recovery.localized,
                input.recovery.deletions_resumed
            ),
        ),
    );
    let ready = input.ready && input.store.healthy;
    conditions::set_condition(
        &mut conds,
        c(
            conditions::READY,
            ready,
            if ready {
                "Serving"
            } else if !input.ready {
                "Recovering"
            } else {
                "StoreUnhealthy"
            },
            if ready {
                "recovery finished; the node-local API is serving".to_string()
            } else {
                input.store.message.clone()
            },
        ),
    );
    let roles = role_outcomes(input.containers, input.policies, now_ms);
    NodeStateStatus {
        observed_generation: None,
        conditions: conds,
        agent_version: Some(input.agent_version.to_string()),
        store_schema_version: input.schema_version.map(|v| v.to_string()),
        recovery: Some(input.recovery),
        containers_tracked: input.containers.len() as i64,
        roles,
        localized_count: input.localized.len() as i64,
        localized: input.localized,
        pending_deletions: input.pending_deletions as i64,
        key_ids: (input.key_ids.current.is_some() || input.key_ids.previous.is_some())
            .then_some(input.key_ids),
        reported_at: None,
    }
}

/// Lets a status through only when it differs from the last one let through (ignoring
/// `reportedAt`), stamping `reportedAt`.
#[derive(Debug, Default)]
pub struct Reporter {
    last: Option<NodeStateStatus>,
}

impl Reporter {
    pub fn next(
        &mut self,
        mut status: NodeStateStatus,
        now: jiff::Timestamp,
    ) -> Option<NodeStateStatus> {
        status.reported_at = None;
        if self.last.as_ref() == Some(&status) {
            return None;
        }
        self.last = Some(status.clone());
        status.reported_at = Some(Time(now));
        Some(status)
    }

    /// Forgets the last status so the next one is written again (after a failed write).
    pub fn forget(&mut self) {
        self.last = None;
    }

    pub fn conditions(&self) -> &[Condition] {
        self.last.as_ref().map_or(&[], |s| s.conditions.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ContainerRequest;
    use crate::transitions::build::ended;

    fn done(
        ph: &str,
        role: &str,
        reason: &str,
        code: i32,
        start: i64,
        end: i64,
    ) -> ContainerRecord {
        ContainerRecord {
            requested: Some(ContainerRequest {
                namespace: "ns".into(),
                placement_history: Some(ph.into()),
                role: Some(role.into()),
                ..ContainerRequest::default()
            }),
            ..ended(reason, code, start, end)
        }
    }

    const H: i64 = 3_600_000;

    #[test]
    fn outcomes_are_counted_per_role_within_the_current_window() {
        let now = 10 * H + 5;
        let mut cs = BTreeMap::new();
        let mut add = |uid: &str, rec| {
            cs.insert(ContainerId::new(uid, "main"), rec);
        };
        add(
            "a",
            done("hbase", "region", "Completed", 0, 9 * H, 9 * H + 10),
        );
        add("b", done("hbase", "region", "Lost", 154, 9 * H, 9 * H + 20));
        add(
            "c",
            done("hbase", "region", "OOMKilled", 137, 9 * H, 9 * H + 30),
        );
        add(
            "d",
            done("hbase", "region", "Error", 1, 9 * H, 9 * H + 1_000),
        );
        add("e", done("hbase", "region", "Error", 1, 6 * H, 7 * H));
        add(
            "f",
            done("hbase", "master", "Preempted", 137, 9 * H, 9 * H + 40),
        );
        // before the current 6h period (which started at 6h): not counted
        add("old", done("hbase", "region", "Lost", 154, 0, 5 * H));
        let outcomes = role_outcomes(&cs, &BTreeMap::new(), now);
        assert_eq!(outcomes.len(), 2);
        let master = &outcomes[0];
        assert_eq!((master.role.as_str(), master.preempted), ("master", 1));
        let region = &outcomes[1];
        assert_eq!(region.completed, 1);
        assert_eq!(region.node_failures, 1);
        assert_eq!(region.limits_exceeded, 1);
        assert_eq!(region.start_failures, 1);
        assert_eq!(region.application_failures, 1);
        assert_eq!(
            region
                .last_outcome_at
                .as_ref()
                .map(|t| t.0.as_millisecond()),
            Some(9 * H + 1_000)
        );
        // a one-hour window of this history leaves only the outcomes after 10h: none
        let mut policies = BTreeMap::new();
        policies.insert(
            AppId::new("ns", "hbase"),
            WindowPolicy {
                failure_window_ms: H,
                short_lived_ms: 60_000,
            },
        );
        assert!(role_outcomes(&cs, &policies, now).is_empty());
    }

    fn input<'a>(
        cs: &'a BTreeMap<ContainerId, ContainerRecord>,
        p: &'a BTreeMap<AppId, WindowPolicy>,
        healthy: bool,
        now: i64,
    ) -> ReportInput<'a> {
        ReportInput {
            agent_version: "0.1.0",
            schema_version: Some(SchemaVersion::CURRENT),
            recovery: RecoveryStatus::default(),
            ready: true,
            store: StoreHealth {
                healthy,
                message: if healthy {
                    "ok".into()
                } else {
                    "disk full".into()
                },
            },
            containers: cs,
            policies: p,
            localized: vec![],
            pending_deletions: 2,
            key_ids: KeyIds {
                current: Some("k2".into()),
                previous: Some("k1".into()),
            },
            now: jiff::Timestamp::from_second(now).unwrap(),
        }
    }

    #[test]
    fn status_reports_health_and_is_sent_only_on_change() {
        let cs = BTreeMap::new();
        let p = BTreeMap::new();
        let mut reporter = Reporter::default();
        let s1 = build_status(input(&cs, &p, true, 100), reporter.conditions());
        assert!(conditions::is_true(&s1.conditions, conditions::READY));
        assert!(conditions::is_true(
            &s1.conditions,
            conditions::STORE_HEALTHY
        ));
        assert_eq!(s1.store_schema_version.as_deref(), Some("1.0"));
        assert_eq!(s1.key_ids.as_ref().unwrap().previous.as_deref(), Some("k1"));
        assert_eq!(s1.pending_deletions, 2);
        let sent = reporter
            .next(s1, jiff::Timestamp::from_second(100).unwrap())
            .unwrap();
        assert!(sent.reported_at.is_some());

        let s2 = build_status(input(&cs, &p, true, 200), reporter.conditions());
        assert!(
            reporter
                .next(s2, jiff::Timestamp::from_second(200).unwrap())
                .is_none(),
            "unchanged"
        );

        let s3 = build_status(input(&cs, &p, false, 300), reporter.conditions());
        let sent = reporter
            .next(s3, jiff::Timestamp::from_second(300).unwrap())
            .unwrap();
        let store = conditions::find(&sent.conditions, conditions::STORE_HEALTHY).unwrap();
        assert_eq!(store.status, "False");
        assert_eq!(store.message, "disk full");
        assert_eq!(store.last_transition_time.0.as_second(), 300);
        let ready = conditions::find(&sent.conditions, conditions::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "StoreUnhealthy")
        );
        let recovered = conditions::find(&sent.conditions, conditions::RECOVERED).unwrap();
        assert_eq!(
            recovered.last_transition_time.0.as_second(),
            100,
            "unchanged since first report"
        );
    }
}
