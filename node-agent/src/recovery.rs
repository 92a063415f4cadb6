//! Pure recovery at start: given what the store held, the live pods of this node, the files in
//! the cache and the clock, decide per subsystem (localization, applications, containers, tokens,
//! deletion) what to record, delete, re-register and schedule. The caller does the I/O.

use std::collections::{BTreeMap, BTreeSet};

use crate::deletion::{DeletionGraph, MissingSuccessor};
use crate::livepod::LivePod;
use crate::store::{
    AppId, AppRecord, CacheScope, ContainerId, ContainerRecord, ContainersState, LoadedState,
    LocalizationEntry, LocalizationState, LocalizedRecord, Op, TokenState, UnixMillis,
};
use crate::transitions::{GoneOutcome, Membership, container_ops, gone_ops};

/// What recovery looks at besides the store.
pub struct RecoveryInput<'a> {
    pub state: LoadedState,
    /// Live pods bound to this node, by UID.
    pub live_pods: &'a BTreeMap<String, LivePod>,
    /// Files (relative paths) found under the cache root.
    pub cache_files: &'a BTreeSet<String>,
    pub now: UnixMillis,
}

/// Counts of what recovery found and did (reported in NodeState and logged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoverySummary {
    pub containers: usize,
    pub lost: usize,
    pub completed_while_down: usize,
    pub killed_before_launch: usize,
    pub killed_while_down: usize,
    pub never_launched: usize,
    pub discarded_records: usize,
    pub localized: usize,
    pub discarded_fetches: usize,
    pub missing_files: usize,
    pub unknown_files: usize,
    pub finished_applications: usize,
    pub expired_tokens: usize,
    pub deletions_resumed: usize,
}

/// The outcome of recovery: transitions to commit, files to delete, and the rebuilt state.
#[derive(Debug)]
pub struct RecoveryPlan {
    /// Committed (in one transaction) before the agent serves or reports anything.
    pub ops: Vec<Op>,
    /// Cache files to delete now (in-progress fetches, files the store does not know).
    pub delete_files: Vec<String>,
    /// Completed resources re-registered, verified present on disk.
    pub localized: BTreeMap<(CacheScope, String), LocalizedRecord>,
    pub applications: BTreeMap<AppId, AppRecord>,
    /// Container records after the ops above.
    pub containers: BTreeMap<ContainerId, ContainerRecord>,
    pub tokens: TokenState,
    pub deletions: DeletionGraph,
    pub missing_successors: Vec<MissingSuccessor>,
    pub summary: RecoverySummary,
}

/// Reason on deletion tasks created for resources of finished applications.
pub const REASON_APP_FINISHED: &str = "application finished";

pub fn plan(input: RecoveryInput<'_>) -> RecoveryPlan {
    let RecoveryInput {
        state,
        live_pods,
        cache_files,
        now,
    } = input;
    let mut planner = Planner {
        ops: Vec::new(),
        summary: RecoverySummary::default(),
        now,
    };
    // 1. localization: completed and present → re-registered; completed but gone → forgotten;
    //    in progress → deleted and forgotten; unknown files → deleted.
    let localized = planner.localization(state.localization, cache_files);
    let delete_files = planner.unknown_files(&localized, cache_files);
    // 5 (graph first, since applications add tasks). deletion tasks: rebuilt from successors.
    let (mut deletions, missing_successors) = DeletionGraph::rebuild(state.deletion_tasks);
    planner.summary.deletions_resumed = deletions.pending();
    // 2. applications: finished ones are removed; their app-scoped resources scheduled for
    //    deletion at once.
    let applications = planner.applications(state.applications, &localized, &mut deletions);
    // 3. containers: compared with the live pods.
    let containers = planner.containers(state.containers, live_pods);
    // 4. tokens: keys restored; expired per-container records dropped.
    let tokens = planner.tokens(state.tokens);
    RecoveryPlan {
        ops: planner.ops,
        delete_files,
        localized,
        applications,
        containers,
        tokens,
        deletions,
        missing_successors,
        summary: planner.summary,
    }
}

type Localized = BTreeMap<(CacheScope, String), LocalizedRecord>;

/// The transitions and counts gathered subsystem by subsystem, in recovery order.
struct Planner {
    ops: Vec<Op>,
    summary: RecoverySummary,
    now: UnixMillis,
}

impl Planner {
    /// Completed resources whose file is present; every other entry is forgotten.
    fn localization(
        &mut self,
        entries: Vec<LocalizationEntry>,
        cache_files: &BTreeSet<String>,
    ) -> Localized {
        let mut localized = BTreeMap::new();
        for entry in entries {
            match entry.state {
                LocalizationState::Completed(rec) if cache_files.contains(&entry.local_path) => {
                    localized.insert((entry.scope, entry.local_path), rec);
                    continue;
                }
                LocalizationState::Completed(_) => self.summary.missing_files += 1,
                LocalizationState::Started(_) => self.summary.discarded_fetches += 1,
            }
            self.ops.push(Op::LocalizationRemoved {
                scope: entry.scope,
                local_path: entry.local_path,
            });
        }
        self.summary.localized = localized.len();
        localized
    }

    /// Cache files no re-registered resource accounts for (to be deleted).
    fn unknown_files(
        &mut self,
        localized: &Localized,
        cache_files: &BTreeSet<String>,
    ) -> Vec<String> {
        let known: BTreeSet<&String> = localized.keys().map(|(_, p)| p).collect();
        let unknown: Vec<String> = cache_files
            .iter()
            .filter(|f| !known.contains(f))
            .cloned()
            .collect();
        self.summary.unknown_files = unknown.len();
        unknown
    }

    /// Applications still running; finished ones are removed, their resources deleted at once.
    fn applications(
        &mut self,
        apps: BTreeMap<AppId, AppRecord>,
        localized: &Localized,
        deletions: &mut DeletionGraph,
    ) -> BTreeMap<AppId, AppRecord> {
        let mut running = BTreeMap::new();
        for (app, rec) in apps {
            if rec.finished_at.is_none() {
                running.insert(app, rec);
                continue;
            }
            self.summary.finished_applications += 1;
            let paths: Vec<String> = localized
                .keys()
                .filter(|(scope, _)| app.owns(scope))
                .map(|(_, p)| p.clone())
                .filter(|p| !deletions.holds_path(p))
                .collect();
            if !paths.is_empty() {
                let (_, op) = deletions.create(paths, self.now, vec![], REASON_APP_FINISHED);
                self.ops.push(op);
            }
            self.ops.push(Op::ApplicationRemoved(app));
        }
        running
    }

    /// Container records brought in line with the live pods (or ended, for vanished pods).
    fn containers(
        &mut self,
        state: ContainersState,
        live_pods: &BTreeMap<String, LivePod>,
    ) -> BTreeMap<ContainerId, ContainerRecord> {
        let mut containers = BTreeMap::new();
        for id in state.discarded {
            self.summary.discarded_records += 1;
            self.ops.push(Op::ContainerRemoved(id));
        }
        for (id, mut rec) in state.containers {
            self.summary.containers += 1;
            let new_ops = match live_pods.get(&id.pod_uid) {
                Some(pod) => self.live_container_ops(&id, &rec, pod),
                None => self.gone_container_ops(&id, &rec),
            };
            let removed = new_ops
                .iter()
                .any(|o| matches!(o, Op::ContainerRemoved(..)));
            crate::state::apply_container_ops(&mut rec, &new_ops);
            self.ops.extend(new_ops);
            if !removed {
                containers.insert(id, rec);
            }
        }
        containers
    }

    /// A container whose pod still runs: what its status shows now.
    fn live_container_ops(
        &mut self,
        id: &ContainerId,
        rec: &ContainerRecord,
        pod: &LivePod,
    ) -> Vec<Op> {
        let membership = rec.requested.as_ref().and_then(|r| {
            Some(Membership {
                placement_history: r.placement_history.clone()?,
                role: r.role.clone()?,
            })
        });
        let ops = container_ops(id, Some(rec), pod, membership.as_ref(), self.now);
        if rec.completed.is_none()
            && ops
                .iter()
                .any(|op| matches!(op, Op::ContainerCompleted(..)))
        {
            self.summary.completed_while_down += 1;
        }
        ops
    }

    /// A container whose pod is gone: how it ended.
    fn gone_container_ops(&mut self, id: &ContainerId, rec: &ContainerRecord) -> Vec<Op> {
        let (outcome, ops) = gone_ops(id, rec, self.now);
        match outcome {
            GoneOutcome::Lost => self.summary.lost += 1,
            GoneOutcome::KilledBeforeLaunch => self.summary.killed_before_launch += 1,
            GoneOutcome::Killed => self.summary.killed_while_down += 1,
            GoneOutcome::NeverLaunched => self.summary.never_launched += 1,
            GoneOutcome::AlreadyDone => {}
        }
        ops
    }

    /// Keys as stored; per-container token records that expired are dropped.
    fn tokens(&mut self, mut tokens: TokenState) -> TokenState {
        let expired: Vec<String> = tokens
            .containers
            .iter()
            .filter(|(_, t)| t.expires_at <= self.now)
            .map(|(uid, _)| uid.clone())
            .collect();
        self.summary.expired_tokens = expired.len();
        for uid in expired {
            tokens.containers.remove(&uid);
            self.ops.push(Op::ContainerTokenRemoved(uid));
        }
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::livepod::build::pod;
    use crate::store::*;

    struct World {
        state: LoadedState,
        pods: BTreeMap<String, LivePod>,
        files: BTreeSet<String>,
    }

    fn world() -> World {
        World {
            state: LoadedState::default(),
            pods: BTreeMap::new(),
            files: BTreeSet::new(),
        }
    }

    impl World {
        fn container(mut self, uid: &str, rec: ContainerRecord) -> Self {
            self.state
                .containers
                .containers
                .insert(ContainerId::new(uid, "main"), rec);
            self
        }
        fn pod(mut self, p: LivePod) -> Self {
            self.pods.insert(p.uid.clone(), p);
            self
        }
        fn resource(mut self, scope: CacheScope, path: &str, done: bool, on_disk: bool) -> Self {
            let state = if done {
                LocalizationState::Completed(LocalizedRecord {
                    name: path.into(),
                    size_bytes: 10,
                    ..LocalizedRecord::default()
                })
            } else {
                LocalizationState::Started(ResourceRequest::default())
            };
            self.state.localization.push(LocalizationEntry {
                scope,
                local_path: path.into(),
                state,
            });
            if on_disk {
                self.files.insert(path.into());
            }
            self
        }
        fn file(mut self, path: &str) -> Self {
            self.files.insert(path.into());
            self
        }
        fn plan(self, now: i64) -> RecoveryPlan {
            plan(RecoveryInput {
                state: self.state,
                live_pods: &self.pods,
                cache_files: &self.files,
                now,
            })
        }
    }

    fn launched(at: i64) -> ContainerRecord {
        ContainerRecord {
            requested: Some(ContainerRequest {
                namespace: "ns".into(),
                placement_history: Some("hbase".into()),
                role: Some("region".into()),
                ..ContainerRequest::default()
            }),
            launched_at: Some(at),
            ..ContainerRecord::default()
        }
    }

    fn app_scope() -> CacheScope {
        CacheScope::Application {
            namespace: "ns".into(),
            placement_history: "hbase".into(),
        }
    }

    #[test]
    fn containers_are_reconciled_with_live_pods() {
        let killed_early = ContainerRecord {
            launched_at: None,
            killed: Some(KillRecord {
                at: 5,
                reason: "PodDeleted".into(),
            }),
            ..launched(0)
        };
        let p = world()
            .container("uid-gone", launched(100))
            .container("uid-exited", launched(100))
            .container("uid-running", launched(100))
            .container("uid-killed-early", killed_early)
            .pod(pod("exited").exited("main", 1, "Error", 100, 200))
            .pod(pod("running").running("main", 100))
            .plan(1_000);
        let id = |u: &str| ContainerId::new(u, "main");
        let gone = &p.containers[&id("uid-gone")];
        let done = gone.completed.as_ref().unwrap();
        assert_eq!((done.exit_code, done.reason.as_str()), (154, "Lost"));
        let exited = p.containers[&id("uid-exited")].completed.as_ref().unwrap();
        assert_eq!((exited.exit_code, exited.finished_at), (1, 200));
        assert_eq!(p.containers[&id("uid-running")].completed, None);
        let early = &p.containers[&id("uid-killed-early")];
        assert_eq!(early.launched_at, None);
        assert_eq!(
            early.completed.as_ref().unwrap().reason,
            crate::transitions::REASON_KILLED_BEFORE_LAUNCH
        );
        assert_eq!(p.summary.lost, 1);
        assert_eq!(p.summary.completed_while_down, 1);
        assert_eq!(p.summary.killed_before_launch, 1);
        assert_eq!(p.summary.containers, 4);
        // every change is an op to commit: the Lost one is written with exit code 154
        assert!(
            p.ops.iter().any(|o| matches!(o,
            Op::ContainerCompleted(i, c) if i == &id("uid-gone") && c.exit_code == EXIT_CODE_LOST))
        );
        assert!(
            !p.ops
                .iter()
                .any(|o| matches!(o, Op::ContainerCompleted(i, _) if i == &id("uid-running")))
        );
    }

    #[test]
    fn localization_keeps_completed_present_and_discards_the_rest() {
        let p = world()
            .resource(CacheScope::Public, "public/a", true, true)
            .resource(CacheScope::Public, "public/b", true, false)
            .resource(app_scope(), "app/ns/hbase/c", false, true)
            .file("public/a.part-123")
            .plan(10);
        assert_eq!(
            p.localized
                .keys()
                .map(|(_, p)| p.as_str())
                .collect::<Vec<_>>(),
            vec!["public/a"]
        );
        assert_eq!(p.delete_files, vec!["app/ns/hbase/c", "public/a.part-123"]);
        assert_eq!(p.summary.discarded_fetches, 1);
        assert_eq!(p.summary.missing_files, 1);
        assert_eq!(p.summary.unknown_files, 2);
        let removed: Vec<&str> = p
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::LocalizationRemoved { local_path, .. } => Some(local_path.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(removed, vec!["public/b", "app/ns/hbase/c"]);
    }

    #[test]
    fn finished_applications_schedule_their_resources_for_deletion() {
        let mut w = world()
            .resource(app_scope(), "app/ns/hbase/x", true, true)
            .resource(CacheScope::Public, "public/y", true, true);
        let app = AppId::new("ns", "hbase");
        w.state.applications.insert(
            app.clone(),
            AppRecord {
                uid: "u".into(),
                init_at: 1,
                finished_at: Some(5),
            },
        );
        w.state.applications.insert(
            AppId::new("ns", "kafka"),
            AppRecord {
                uid: "k".into(),
                init_at: 1,
                finished_at: None,
            },
        );
        w.state.deletion_tasks.insert(
            41,
            DeletionTask {
                id: 41,
                paths: vec!["old".into()],
                scheduled_at: 2_000,
                successors: vec![],
                reason: "retention".into(),
            },
        );
        let p = w.plan(1_000);
        assert_eq!(p.summary.finished_applications, 1);
        assert!(p.ops.contains(&Op::ApplicationRemoved(app)));
        assert_eq!(p.applications.len(), 1);
        let due = p.deletions.due(1_000);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].id, 42, "ids continue after the highest stored");
        assert_eq!(due[0].paths, vec!["app/ns/hbase/x".to_string()]);
        assert_eq!(p.deletions.pending(), 2);
        assert_eq!(p.summary.deletions_resumed, 1);
    }

    #[test]
    fn expired_container_tokens_are_dropped_and_keys_kept() {
        let mut w = world();
        w.state.tokens.current = Some(MasterKey {
            id: "k2".into(),
            secret: vec![2; 32],
        });
        for (uid, exp) in [("a", 999), ("b", 1_000), ("c", 1_001)] {
            w.state.tokens.containers.insert(
                uid.into(),
                TokenRecord {
                    role: "r".into(),
                    expires_at: exp,
                },
            );
        }
        let p = w.plan(1_000);
        assert_eq!(p.tokens.containers.keys().collect::<Vec<_>>(), vec!["c"]);
        assert_eq!(p.tokens.current.as_ref().unwrap().id, "k2");
        assert_eq!(p.summary.expired_tokens, 2);
    }
}
