//! Replacement pacing: an eviction waits while as many replacements of the controller's
//! evictions are not Running yet as the bound allows, all drains together, the pods of the drain
//! that started first first, and of one drain the oldest waiter first.
//!
//! A wave of drains evicts hundreds of pods in a second; their replacements are created at once,
//! and a cluster that starts pods at a few dozen a second leaves the last of them Pending for
//! tens of seconds. Paced, the wave evicts as fast as the cluster starts what it moved. The bound
//! starts at `--min-starting-replacements` and follows the rate the cluster starts replacements
//! at, up to `--max-starting-replacements` ([`StartLimit`]). The drain that started first goes
//! first: its node is removed as soon as its own pods have moved, not once every drain's have.
//!
//! An eviction of a pod whose controller creates its replacement at once, as the eviction is
//! accepted (ReplicaSet, ReplicationController, Job), counts from its admission until a pod of
//! the same controller that was not in the cache then, and not one ebb evicted, is Running (each
//! such pod ends one count; no clock is compared, so a skewed API server's timestamps change
//! nothing). A StatefulSet creates its replacement only once the old pod is gone, after a grace
//! period its tenant sets: its evictions are not counted, nor are bare pods'.
//!
//! A count is given up when no replacement of its namespace has started for [`STARTING_TTL`]
//! while other replacements did (a namespace's quota, an image gone: its replacements never
//! start, where a cluster that is only slow starts none, or keeps starting some of every
//! namespace), or [`LONGEST_START`] after its eviction unless the control plane has stalled (a
//! replacement has waited [`QUEUE_STALL`] in the cluster's own queues, [`waits_for_the_cluster`]:
//! a control plane that stalls starts nothing anywhere, and its replacements' states show it),
//! which keeps it [`LONGEST_START`] more at a time, up to [`LONGEST_QUEUED`]. A count given up
//! by the first two rules leaves its namespace's evictions not paced for [`UNPACED_FOR`], or
//! only its controller's where the namespace started other replacements meanwhile (one slow
//! Deployment among others that move); one kept to [`LONGEST_QUEUED`] leaves everything
//! paced: it waited on the cluster. A tenant holds the line with
//! its own evictions only, [`LONGEST_START`] at most, once: nothing in its pod specs makes a pod
//! wait in the cluster's queues. A wait that sees counts end, or kept, is not stuck.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::pods::PodRef;
use super::start_limit::StartLimit;
use super::start_wait::waits_for_the_cluster;
use crate::cluster::CachedPod;
use crate::metrics::{Metrics, StartTimeoutLabels, StartTimeoutReason};
use crate::state::pod_index::PodIndex;
use crate::steering::{OwnerKey, owner_of};

/// The bound on replacements starting at once until the cluster's start rate says more
/// (`--min-starting-replacements`), and the least it falls to.
pub const DEFAULT_MIN_STARTING: usize = 50;

/// The most replacements starting at once, whatever the cluster's start rate
/// (`--max-starting-replacements`).
pub const DEFAULT_MAX_STARTING: usize = 1000;

/// How long a count is kept while no replacement of its namespace starts and others do.
pub const STARTING_TTL: Duration = Duration::from_secs(15);

/// Longest an eviction counts as starting, whatever its namespace's replacements do.
pub const LONGEST_START: Duration = Duration::from_secs(120);

/// Longest an eviction counts as starting while the control plane has stalled.
pub const LONGEST_QUEUED: Duration = Duration::from_secs(600);

/// How long a replacement waits in the cluster's own queues (the default scheduler's, a
/// kubelet's) before the control plane counts as stalled.
pub const QUEUE_STALL: Duration = Duration::from_secs(10);

/// How long a namespace whose replacement was waited out is not paced.
pub const UNPACED_FOR: Duration = Duration::from_secs(600);

/// What a pod's eviction window calls the pacing while it waits for it (no budget's
/// `namespace/name` has a space).
pub const PACING: &str = "starting replacements";

/// Shared by every drain of the process. Cheap to clone.
#[derive(Clone)]
pub struct Pacer {
    /// The most counts at once; 0: no pacing.
    ceiling: usize,
    pods: Store<CachedPod>,
    index: PodIndex,
    changes: watch::Receiver<u64>,
    metrics: Option<Metrics>,
    released: Arc<Notify>,
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    owners: HashMap<OwnerKey, Owner>,
    /// Evictions admitted and not answered yet.
    sending: usize,
    /// Accepted evictions whose replacement is not Running yet (all owners).
    starting: usize,
    /// Evictions waiting for their turn, by drain (the first started first), then ticket
    /// (oldest first).
    waiting: BTreeSet<(u64, u64)>,
    next_ticket: u64,
    /// The next drain's place in the line.
    next_drain: u64,
    /// The bound on counts at once, following the cluster's start rate.
    bound: StartLimit,
    /// The pod-change count at which the owners' pods were last looked at.
    looked_at: Option<u64>,
    /// Counts ended since the process started (replacement Running, or waited out).
    moved: u64,
    /// Times a count was kept past its longest wait, its replacement waiting in the cluster's
    /// queues.
    kept: u64,
    /// Namespaces not paced, until when: one of their replacements was waited out.
    unpaced: HashMap<String, Instant>,
    /// Controllers not paced, until when: one of their replacements was waited out while
    /// others of their namespace started.
    unpaced_owners: HashMap<OwnerKey, Instant>,
    /// By namespace with counts, when a replacement of it last ended a count.
    progress: HashMap<String, Instant>,
    /// When any replacement last ended a count.
    last_start: Option<Instant>,
}

impl Inner {
    fn new(floor: usize, ceiling: usize) -> Self {
        Inner {
            owners: HashMap::new(),
            sending: 0,
            starting: 0,
            waiting: BTreeSet::new(),
            next_ticket: 0,
            next_drain: 0,
            bound: StartLimit::new(floor, ceiling),
            looked_at: None,
            moved: 0,
            kept: 0,
            unpaced: HashMap::new(),
            unpaced_owners: HashMap::new(),
            progress: HashMap::new(),
            last_start: None,
        }
    }

    /// Nothing starting and no eviction waiting: the next start meets no queue of the
    /// controller's making.
    fn note_if_idle(&mut self) {
        if self.starting + self.sending == 0 && self.waiting.is_empty() {
            self.bound.nothing_starting();
        }
    }

    /// `n` counts of `namespace` ended by replacements that started `now`.
    fn started(&mut self, namespace: &str, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        self.progress.insert(namespace.to_string(), now);
        self.last_start = Some(now);
        self.starting = self.starting.saturating_sub(n);
        self.moved += n as u64;
    }

    /// Removes a ticket from the line; the bound's round ends when the line is empty.
    fn unqueue(&mut self, ticket: (u64, u64)) {
        self.waiting.remove(&ticket);
        if self.waiting.is_empty() {
            self.bound.not_waiting();
        }
    }
}

/// One controller's counts, and its pods by when the pacing first saw them.
#[derive(Default)]
struct Owner {
    /// Each accepted eviction, by when it was answered.
    counts: VecDeque<Count>,
    /// Its evictions let through and not answered yet (the owner is kept meanwhile).
    sending: usize,
    /// Its pods seen so far, by uid.
    seen: HashMap<String, SeenPod>,
    /// The generation the next eviction let through gets; every pod seen before it has a lower
    /// or equal one.
    generation: u64,
}

/// A pod of an owner as the pacing first saw it.
#[derive(Clone, Copy, Debug)]
struct SeenPod {
    /// The owner's generation when it was first seen.
    generation: u64,
    /// It can end no count: ebb evicted it, or it already ended one.
    spent: bool,
    /// When it was first seen (ebb's clock).
    at: Instant,
}

/// One accepted eviction whose replacement is not Running yet.
#[derive(Clone, Copy, Debug)]
struct Count {
    /// Its generation: a pod first seen at a higher one was not in the cache when the eviction
    /// was let through, so it can be its replacement.
    generation: u64,
    /// When the eviction was let through.
    admitted: Instant,
    /// When it is given up at the latest: [`LONGEST_START`] after `admitted`, later while a
    /// replacement waits in the cluster's queues.
    kept_until: Instant,
}

impl Count {
    fn new(generation: u64, admitted: Instant) -> Self {
        Count {
            generation,
            admitted,
            kept_until: admitted + LONGEST_START,
        }
    }

    /// When it is given up, if its namespace's replacements last started at `progress` and any
    /// replacement at `last_start`: [`STARTING_TTL`] after its namespace last started one (or
    /// its eviction) once another has started since, `kept_until` at the latest. A cluster that
    /// starts nothing is slow, not this namespace.
    fn deadline(&self, progress: Option<Instant>, last_start: Option<Instant>) -> Instant {
        self.tenants_deadline(progress, last_start)
            .map_or(self.kept_until, |d| d.min(self.kept_until))
    }

    /// [`STARTING_TTL`] after its namespace last started a replacement (or its eviction), once
    /// another namespace's has started since.
    fn tenants_deadline(
        &self,
        progress: Option<Instant>,
        last_start: Option<Instant>,
    ) -> Option<Instant> {
        let since = progress.map_or(self.admitted, |p| p.max(self.admitted));
        last_start
            .filter(|other| *other > since)
            .map(|_| since + STARTING_TTL)
    }

    /// Why it is given up at `now`, if it is: its namespace's own replacements not starting
    /// comes first; a count kept to [`LONGEST_QUEUED`] waited out a stalled control plane.
    fn given_up(
        &self,
        progress: Option<Instant>,
        last_start: Option<Instant>,
        now: Instant,
    ) -> Option<StartTimeoutReason> {
        if self
            .tenants_deadline(progress, last_start)
            .is_some_and(|d| d <= now)
        {
            Some(StartTimeoutReason::namespace_not_starting)
        } else if self.kept_until > now {
            None
        } else if self.kept_until >= self.admitted + LONGEST_QUEUED {
            Some(StartTimeoutReason::longest_queued)
        } else {
            Some(StartTimeoutReason::longest_start)
        }
    }

    /// Its longest wait is over at `now`, and not the tenant's rule: it is kept
    /// [`LONGEST_START`] more (up to [`LONGEST_QUEUED`]) if the control plane has stalled.
    fn may_be_kept(
        &self,
        progress: Option<Instant>,
        last_start: Option<Instant>,
        now: Instant,
    ) -> bool {
        self.kept_until <= now
            && self.admitted + LONGEST_QUEUED > now
            && self
                .tenants_deadline(progress, last_start)
                .is_none_or(|d| d > now)
    }
}

/// An eviction the pacing let through; hand it back with [`Pacer::settle`].
#[derive(Debug)]
#[must_use]
pub struct Taken {
    /// `None`: not counted (nothing replaces the pod, or no pacing).
    counted: Option<(OwnerKey, Count)>,
}

/// One eviction's place in the line; leaving it (drop) gives the place up.
pub struct Turn<'a> {
    pacer: &'a Pacer,
    /// Its drain's place in the line.
    drain: u64,
    ticket: Option<(u64, u64)>,
    /// The evicted pod's controller, once looked up (`Some(None)`: not one that counts).
    owner: Option<Option<OwnerKey>>,
    /// The pod-change count when this turn last asked.
    seen: u64,
}

impl Pacer {
    /// At most `floor` counts at once, more as the cluster's start rate allows, never more than
    /// `ceiling` (0: no pacing); read from the pod cache and `index`; `changes` ticks on every
    /// pod event.
    pub fn new(
        floor: usize,
        ceiling: usize,
        pods: Store<CachedPod>,
        index: PodIndex,
        changes: watch::Receiver<u64>,
    ) -> Self {
        Pacer {
            ceiling,
            pods,
            index,
            changes,
            metrics: None,
            released: Arc::default(),
            inner: Arc::new(Mutex::new(Inner::new(floor, ceiling))),
        }
    }

    /// Paces nothing: every eviction goes through uncounted.
    pub fn off() -> Self {
        let (pods, _) = kube::runtime::reflector::store::<CachedPod>();
        let (_, changes) = watch::channel(0);
        Self::new(0, 0, pods, PodIndex::default(), changes)
    }

    /// Shows the counts in `ebb_replacements_starting`, the waits given up in
    /// `ebb_replacement_start_timeouts_total` and those kept in
    /// `ebb_replacement_waits_kept_total`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The bound now (0: no pacing).
    pub fn limit(&self) -> usize {
        if self.ceiling == 0 {
            0
        } else {
            self.lock().bound.limit()
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A drain's place in the line: its pods go after those of drains that asked before it.
    pub fn drain_place(&self) -> u64 {
        let mut inner = self.lock();
        inner.next_drain += 1;
        inner.next_drain
    }

    /// A place in the line for one eviction of the drain at `drain` ([`Pacer::drain_place`]).
    pub fn turn(&self, drain: u64) -> Turn<'_> {
        Turn {
            pacer: self,
            drain,
            ticket: None,
            owner: None,
            seen: 0,
        }
    }

    /// Counts ended since the process started, and times one was kept while its replacement
    /// waits in the cluster's queues: a wait that sees it grow is not stuck.
    pub fn progress(&self) -> u64 {
        let inner = self.lock();
        inner.moved + inner.kept
    }

    /// Counts now (accepted and being sent).
    pub fn starting(&self) -> usize {
        let inner = self.lock();
        inner.starting + inner.sending
    }

    /// Ends the counts whose replacement runs or whose wait is over, and shows the counts and
    /// the bound in the metrics: once a policy loop, so that they are right when no eviction
    /// asks (a wave over).
    pub fn refresh(&self) {
        if self.ceiling == 0 {
            return;
        }
        let version = *self.changes.borrow();
        let now = Instant::now();
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        self.look_once(&mut inner, version, now);
        self.publish(&inner);
    }

    /// When the first count is given up, if none of its namespace's replacements starts.
    pub fn next_expiry(&self) -> Option<Instant> {
        next_deadline(&self.lock())
    }

    /// The pods of `owner` the pacing has not looked at since they last changed: each one is
    /// given the generation it was first seen at, and each Running one that can ends a count it
    /// may be the replacement of: the latest such (a pod seen early can end only early counts,
    /// so a later pod leaves them to it: replacements that start out of order end every count).
    /// Returns the counts ended.
    fn observe(
        &self,
        owner: &OwnerKey,
        o: &mut Owner,
        bound: &mut StartLimit,
        now: Instant,
    ) -> usize {
        let pods =
            self.index
                .controlled_changes(&owner.namespace, &owner.kind, &owner.name, &self.pods);
        let mut ended = 0;
        for pod in pods {
            let Some(uid) = pod.metadata.uid.as_deref() else {
                continue;
            };
            let next = o.generation;
            let SeenPod {
                generation: first_seen,
                spent,
                ..
            } = match o.seen.get_mut(uid) {
                Some(entry) => entry,
                None => o.seen.entry(uid.to_string()).or_insert(SeenPod {
                    generation: next,
                    spent: false,
                    at: now,
                }),
            };
            if *spent || pod.metadata.deletion_timestamp.is_some() || !started(&pod) {
                continue;
            }
            // Counts of evictions let through before the pod was first seen.
            let Some(i) = o
                .counts
                .iter()
                .enumerate()
                .filter(|(_, c)| c.generation < *first_seen)
                .max_by_key(|(_, c)| c.generation)
                .map(|(i, _)| i)
            else {
                continue;
            };
            *spent = true;
            if let Some(count) = o.counts.remove(i) {
                bound.started(now.saturating_duration_since(count.admitted));
            }
            ended += 1;
        }
        ended
    }

    /// Waits at most `limit` for something that may let a waiting eviction through: a pod event
    /// after `seen` (the change count the turn last looked at), a count given back, a count
    /// running out.
    pub async fn changed(&self, seen: u64, limit: Duration) {
        let mut limit = limit;
        if let Some(at) = self.next_expiry() {
            limit = limit.min(at.saturating_duration_since(Instant::now()));
        }
        let mut changes = self.changes.clone();
        tokio::select! {
            _ = changes.wait_for(|v| *v != seen) => {}
            _ = self.released.notified() => {}
            _ = tokio::time::sleep(limit) => {}
        }
    }

    /// The eviction was answered: an accepted one counts until its replacement runs.
    pub fn settle(&self, taken: Taken, accepted: bool) {
        let Some((owner, count)) = taken.counted else {
            return;
        };
        let mut inner = self.lock();
        inner.sending = inner.sending.saturating_sub(1);
        let o = inner.owners.entry(owner).or_default();
        o.sending = o.sending.saturating_sub(1);
        if accepted {
            o.counts.push_back(count);
            inner.starting += 1;
        } else {
            self.forget_idle(&mut inner);
            inner.note_if_idle();
        }
        self.publish(&inner);
        drop(inner);
        if !accepted {
            self.released.notify_waiters();
        }
    }

    /// Ends the counts whose wait is over.
    fn expire(&self, inner: &mut Inner, now: Instant) {
        inner.unpaced.retain(|_, until| *until > now);
        inner.unpaced_owners.retain(|_, until| *until > now);
        if next_deadline(inner).is_none_or(|d| d > now) {
            return;
        }
        let mut ended = 0usize;
        // Looked at only when a count reaches its longest wait.
        let stalled = inner.owners.iter().any(|(owner, o)| {
            let last = inner.progress.get(&owner.namespace).copied();
            o.counts
                .iter()
                .any(|c| c.may_be_kept(last, inner.last_start, now))
        }) && self.stalled(&inner.owners, now);
        let Inner {
            owners,
            unpaced,
            unpaced_owners,
            progress,
            last_start,
            kept: kept_total,
            ..
        } = inner;
        for (owner, o) in owners.iter_mut() {
            let before = o.counts.len();
            let last = progress.get(&owner.namespace).copied();
            if stalled {
                let mut kept = 0;
                for c in o.counts.iter_mut() {
                    if c.may_be_kept(last, *last_start, now) {
                        c.kept_until = (now + LONGEST_START).min(c.admitted + LONGEST_QUEUED);
                        kept += 1;
                    }
                }
                if kept > 0 {
                    *kept_total += kept;
                    if let Some(m) = &self.metrics {
                        m.replacement_waits_kept.inc_by(kept);
                    }
                    tracing::info!(
                        owner = %format!("{}/{} {}", owner.namespace, owner.kind, owner.name),
                        replacements = kept,
                        "replacements not Running after {}s, and the control plane stalled (a replacement waited {}s in the scheduler's queue or for its kubelet): counted {}s more, {}s at most",
                        LONGEST_START.as_secs(),
                        QUEUE_STALL.as_secs(),
                        LONGEST_START.as_secs(),
                        LONGEST_QUEUED.as_secs()
                    );
                }
            }
            let mut gone: HashMap<StartTimeoutReason, u64> = HashMap::new();
            // Its namespace started other replacements while every count given up at the
            // longest start waited: the controller's own replacements do not start, not the
            // namespace's (one slow Deployment among others that move).
            let mut namespace_moved = true;
            o.counts
                .retain(|c| match c.given_up(last, *last_start, now) {
                    Some(reason) => {
                        if reason == StartTimeoutReason::longest_start {
                            namespace_moved &= last.is_some_and(|p| p > c.admitted);
                        }
                        *gone.entry(reason).or_default() += 1;
                        false
                    }
                    None => true,
                });
            debug_assert_eq!(before - o.counts.len(), gone.values().sum::<u64>() as usize);
            for (reason, n) in gone {
                ended += n as usize;
                if let Some(m) = &self.metrics {
                    m.replacement_start_timeouts
                        .get_or_create(&StartTimeoutLabels { reason })
                        .inc_by(n);
                }
                // What is no longer paced: nothing when the wait was the cluster's (unpacing
                // would let the wave loose on a control plane still catching up); the
                // controller when its namespace moved meanwhile; else the namespace.
                let (namespace, controller, why) = match reason {
                    StartTimeoutReason::longest_queued => (
                        false,
                        false,
                        format!(
                            "replacements not Running {}s after their eviction, kept while the control plane stalled: no longer waited for (the namespace stays paced)",
                            LONGEST_QUEUED.as_secs()
                        ),
                    ),
                    StartTimeoutReason::namespace_not_starting => (
                        true,
                        false,
                        format!(
                            "replacements not Running, and none of the namespace's started for {}s while others did: no longer waited for, and the namespace's evictions are not paced for {}s",
                            STARTING_TTL.as_secs(),
                            UNPACED_FOR.as_secs()
                        ),
                    ),
                    StartTimeoutReason::longest_start => (!namespace_moved, namespace_moved, {
                        let (meanwhile, whose) = if namespace_moved {
                            (
                                ", while others of the namespace started",
                                "this controller's",
                            )
                        } else {
                            ("", "the namespace's")
                        };
                        format!(
                            "replacements not Running {}s after their eviction, the control plane not stalled{meanwhile}: no longer waited for, and {whose} evictions are not paced for {}s",
                            LONGEST_START.as_secs(),
                            UNPACED_FOR.as_secs()
                        )
                    }),
                };
                if namespace {
                    unpaced.insert(owner.namespace.clone(), now + UNPACED_FOR);
                }
                if controller {
                    unpaced_owners.insert(owner.clone(), now + UNPACED_FOR);
                }
                tracing::info!(
                    owner = %format!("{}/{} {}", owner.namespace, owner.kind, owner.name),
                    replacements = n,
                    reason = ?reason,
                    "{why}"
                );
            }
        }
        if ended > 0 {
            inner.starting = inner.starting.saturating_sub(ended);
            inner.moved += ended as u64;
            self.forget_idle(inner);
            inner.note_if_idle();
        }
    }

    /// Whether the control plane has stalled: a replacement of a controller with counts has
    /// waited in the cluster's own queues ([`waits_for_the_cluster`]) for [`QUEUE_STALL`] at
    /// least, since ebb first saw it (a pod leaves those queues for good once scheduled and
    /// reported, or once a scheduling attempt fails). Nothing in a pod spec makes a pod wait
    /// there, so no tenant can make the control plane look stalled.
    fn stalled(&self, owners: &HashMap<OwnerKey, Owner>, now: Instant) -> bool {
        owners
            .iter()
            .filter(|(_, o)| !o.counts.is_empty())
            .any(|(owner, o)| {
                self.index
                    .controlled(&owner.namespace, &owner.kind, &owner.name, &self.pods)
                    .iter()
                    .filter(|p| waits_for_the_cluster(p))
                    .filter_map(|p| o.seen.get(p.metadata.uid.as_deref()?))
                    .any(|s| !s.spent && now.saturating_duration_since(s.at) >= QUEUE_STALL)
            })
    }

    /// Ends a count for each replacement now Running (looking only at the pods that changed).
    fn look(&self, inner: &mut Inner, now: Instant) {
        let Inner { owners, bound, .. } = &mut *inner;
        let ended: Vec<(String, usize)> = owners
            .iter_mut()
            .map(|(owner, o)| (owner, self.observe(owner, o, bound, now)))
            .filter(|&(_, n)| n > 0)
            .map(|(owner, n)| (owner.namespace.clone(), n))
            .collect();
        for (namespace, n) in ended {
            inner.started(&namespace, n, now);
        }
        self.forget_idle(inner);
        inner.note_if_idle();
    }

    /// [`Pacer::look`] unless the pods have not changed since the last one.
    fn look_once(&self, inner: &mut Inner, version: u64, now: Instant) {
        if inner.looked_at != Some(version) {
            self.look(inner, now);
            inner.looked_at = Some(version);
        }
    }

    /// Owners without counts or evictions being sent are forgotten, with the index's watch of
    /// their pods.
    fn forget_idle(&self, inner: &mut Inner) {
        inner.owners.retain(|owner, o| {
            let keep = !o.counts.is_empty() || o.sending > 0;
            if !keep {
                self.index
                    .forget_controlled(&owner.namespace, &owner.kind, &owner.name);
            }
            keep
        });
        let Inner {
            owners, progress, ..
        } = inner;
        progress.retain(|ns, _| owners.keys().any(|o| &o.namespace == ns));
    }

    fn publish(&self, inner: &Inner) {
        if let Some(m) = &self.metrics {
            m.replacements_starting
                .set((inner.starting + inner.sending) as i64);
            m.starting_replacements_limit
                .set(inner.bound.limit() as i64);
        }
    }
}

/// When the first count is given up, if none of its namespace's replacements starts.
fn next_deadline(inner: &Inner) -> Option<Instant> {
    inner
        .owners
        .iter()
        .flat_map(|(owner, o)| {
            let last = inner.progress.get(&owner.namespace).copied();
            o.counts
                .iter()
                .map(move |c| c.deadline(last, inner.last_start))
        })
        .min()
}

/// A controller that creates a pod's replacement as soon as its eviction is accepted (a
/// StatefulSet waits for the old pod to be gone).
fn replaced_at_once(kind: &str) -> bool {
    matches!(kind, "ReplicaSet" | "ReplicationController" | "Job")
}

/// Running or finished: the replacement has started.
fn started(pod: &CachedPod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running" | "Succeeded" | "Failed")
    )
}

impl Turn<'_> {
    /// Lets `pod`'s eviction through when fewer than the limit count, counting the evictions
    /// waiting longer than this one; `None`: wait (this eviction keeps its place in the line).
    pub fn take(&mut self, pod: &PodRef) -> Option<Taken> {
        let p = self.pacer;
        let owner = self
            .owner
            .get_or_insert_with(|| {
                let key = ObjectRef::new(&pod.name).within(&pod.namespace);
                (p.ceiling > 0)
                    .then(|| p.pods.get(&key))
                    .flatten()
                    .filter(|o| o.metadata.uid.as_deref() == Some(pod.uid.as_str()))
                    .and_then(|o| owner_of(&o))
                    .filter(|o| replaced_at_once(&o.kind))
            })
            .clone();
        let Some(owner) = owner else {
            self.leave();
            return Some(Taken { counted: None });
        };
        let version = *p.changes.borrow();
        self.seen = version;
        let now = Instant::now();
        let mut inner = p.lock();
        p.expire(&mut inner, now);
        if inner.unpaced.contains_key(&owner.namespace) || inner.unpaced_owners.contains_key(&owner)
        {
            drop(inner);
            self.leave();
            return Some(Taken { counted: None });
        }
        let ticket = self.ticket;
        let drain = self.drain;
        let busy = |inner: &Inner| {
            // Ahead: the waiters of drains before this one, and the older ones of this drain.
            let ahead = match ticket {
                Some(t) => inner.waiting.range(..t).count(),
                None => inner.waiting.range(..(drain.saturating_add(1), 0)).count(),
            };
            inner.starting + inner.sending + ahead >= inner.bound.limit()
        };
        if busy(&inner) {
            p.look_once(&mut inner, version, now);
        }
        let grew = inner.bound.tick(now);
        if busy(&inner) {
            if self.ticket.is_none() {
                let t = (drain, inner.next_ticket);
                inner.next_ticket += 1;
                if inner.waiting.is_empty() {
                    inner.bound.waiting(now);
                }
                inner.waiting.insert(t);
                self.ticket = Some(t);
            }
            p.publish(&inner);
            drop(inner);
            if grew {
                p.released.notify_waiters();
            }
            return None;
        }
        if let Some(t) = self.ticket.take() {
            inner.unqueue(t);
        }
        inner.sending += 1;
        // Every pod of the owner in the cache now is seen at this generation at the latest: none
        // of them is this eviction's replacement. A controller followed anew is read whole.
        if !inner.owners.contains_key(&owner) {
            p.index
                .forget_controlled(&owner.namespace, &owner.kind, &owner.name);
        }
        let Inner { owners, bound, .. } = &mut *inner;
        let o = owners.entry(owner.clone()).or_default();
        let ended = p.observe(&owner, o, bound, now);
        let generation = o.generation;
        o.generation += 1;
        o.sending += 1;
        // The evicted pod ends no count, whatever its generation.
        o.seen.insert(
            pod.uid.clone(),
            SeenPod {
                generation,
                spent: true,
                at: now,
            },
        );
        inner.started(&owner.namespace, ended, now);
        p.publish(&inner);
        drop(inner);
        if grew {
            p.released.notify_waiters();
        }
        Some(Taken {
            counted: Some((owner, Count::new(generation, now))),
        })
    }

    /// The pod-change count this turn last looked at (for [`Pacer::changed`]).
    pub fn seen(&self) -> u64 {
        self.seen
    }

    fn leave(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.pacer.lock().unqueue(t);
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    /// A pod of ReplicaSet `rs` in namespace `ns`, created at `created` (seconds), in `phase`.
    fn pod(ns: &str, name: &str, rs: &str, created: i64, phase: &str) -> CachedPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "namespace": ns, "name": name, "uid": format!("{ns}-{name}"),
                "creationTimestamp": jiff::Timestamp::from_second(created).unwrap().to_string(),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                     "uid": format!("{ns}-{rs}"), "controller": true}],
            },
            "spec": {"containers": [], "nodeName": "n1"},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn bare(ns: &str, name: &str) -> CachedPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": format!("{ns}-{name}")},
            "spec": {"containers": [], "nodeName": "n1"},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    }

    fn r(p: &CachedPod) -> PodRef {
        PodRef {
            namespace: p.metadata.namespace.clone().unwrap(),
            name: p.metadata.name.clone().unwrap(),
            uid: p.metadata.uid.clone().unwrap(),
            grace: None,
        }
    }

    struct World {
        writer: kube::runtime::reflector::store::Writer<CachedPod>,
        index: PodIndex,
        tick: watch::Sender<u64>,
        pacer: Pacer,
        metrics: Metrics,
    }

    impl World {
        fn new(limit: usize) -> Self {
            let (reader, writer) = store::<CachedPod>();
            let index = PodIndex::watched();
            let (tick, changes) = watch::channel(0);
            let metrics = Metrics::new();
            let pacer = Pacer::new(limit, limit, reader, index.clone(), changes)
                .with_metrics(metrics.clone());
            World {
                writer,
                index,
                tick,
                pacer,
                metrics,
            }
        }

        /// `n` Running pods of ReplicaSet `web` in namespace `a`, long there, applied.
        fn webs(&mut self, n: usize) -> Vec<CachedPod> {
            let pods: Vec<CachedPod> = (0..n)
                .map(|i| pod("a", &format!("web-{i}"), "web", now_s() - 600, "Running"))
                .collect();
            for p in &pods {
                self.apply(p);
            }
            pods
        }

        fn apply(&mut self, p: &CachedPod) {
            self.writer.apply_watcher_event(&Event::Apply(p.clone()));
            self.index.applied(p);
            self.tick.send_modify(|v| *v += 1);
        }

        /// `ebb_replacement_start_timeouts_total` for `reason`.
        fn timeouts(&self, reason: StartTimeoutReason) -> u64 {
            self.metrics
                .replacement_start_timeouts
                .get_or_create(&StartTimeoutLabels { reason })
                .get()
        }

        /// Admits and settles `p`'s eviction (accepted) when the pacing lets it through.
        fn evict(&self, p: &CachedPod) -> bool {
            let mut turn = self.pacer.turn(0);
            match turn.take(&r(p)) {
                Some(t) => {
                    self.pacer.settle(t, true);
                    true
                }
                None => false,
            }
        }
    }

    fn now_s() -> i64 {
        jiff::Timestamp::now().as_second()
    }

    #[tokio::test]
    async fn evictions_wait_at_the_limit_until_replacements_run() {
        let mut w = World::new(2);
        let old = w.webs(4);
        assert!(w.evict(&old[0]));
        assert!(w.evict(&old[1]));
        assert!(
            !w.evict(&old[2]),
            "two replacements starting: the third waits"
        );
        assert_eq!(w.pacer.starting(), 2);
        // One replacement is created, Pending: still two starting.
        let new = pod("a", "web-x", "web", now_s(), "Pending");
        w.apply(&new);
        assert!(!w.evict(&old[2]));
        // It runs: one count ends.
        w.apply(&pod("a", "web-x", "web", now_s(), "Running"));
        assert!(w.evict(&old[2]));
        assert!(
            !w.evict(&old[3]),
            "the same replacement ends one count only"
        );
        assert_eq!(w.pacer.progress(), 1);
    }

    #[tokio::test]
    async fn pods_nothing_replaces_and_older_pods_end_no_count() {
        let mut w = World::new(1);
        let a = pod("a", "web-0", "web", now_s() - 600, "Running");
        let b = pod("a", "web-1", "web", now_s() - 600, "Running");
        let c = pod("a", "web-2", "web", now_s() - 600, "Running");
        let old = pod("a", "web-old", "web", now_s() - 300, "Running");
        let lone = bare("a", "lone");
        for p in [&a, &b, &c, &old, &lone] {
            w.apply(p);
        }
        assert!(w.evict(&a));
        // A bare pod has no replacement to wait for: never held, never counted.
        assert!(w.evict(&lone));
        assert_eq!(w.pacer.starting(), 1);
        // Another pod of the owner, in the cache at the eviction, changes: not its replacement.
        w.apply(&old);
        // A Running pod of another ReplicaSet, or of the same name in another namespace.
        w.apply(&pod("a", "api-0", "api", now_s(), "Running"));
        w.apply(&pod("b", "web-9", "web", now_s(), "Running"));
        assert!(!w.evict(&b));
        // The replacement runs (its creationTimestamp plays no part: an API server's clock
        // behind ebb's changes nothing).
        let x = pod("a", "web-x", "web", now_s() - 3600, "Running");
        w.apply(&x);
        assert!(w.evict(&b));
        // The owner had no count left in between: the replacement already Running when b's
        // eviction went is not b's.
        w.apply(&x);
        assert!(!w.evict(&c));
        assert_eq!(w.pacer.progress(), 1);
    }

    #[tokio::test]
    async fn the_oldest_waiter_goes_first() {
        let mut w = World::new(1);
        let pods = w.webs(3);
        assert!(w.evict(&pods[0]));
        let pacer = w.pacer.clone();
        let mut first = pacer.turn(0);
        let mut second = pacer.turn(0);
        assert!(first.take(&r(&pods[1])).is_none());
        assert!(second.take(&r(&pods[2])).is_none());
        w.apply(&pod("a", "web-x", "web", now_s(), "Running"));
        // The second asks first after the count ended: the first is still ahead of it.
        assert!(second.take(&r(&pods[2])).is_none());
        let t = first.take(&r(&pods[1])).expect("its turn");
        w.pacer.settle(t, false);
        // Refused (a budget's 429): the count is given back, the second goes.
        assert!(second.take(&r(&pods[2])).is_some());
    }

    #[tokio::test]
    async fn replacements_that_start_out_of_order_end_every_count() {
        let mut w = World::new(2);
        let old = w.webs(4);
        assert!(w.evict(&old[0]));
        // web-0's replacement is created, and seen Pending when web-1's eviction goes.
        w.apply(&pod("a", "web-r0", "web", now_s(), "Pending"));
        assert!(w.evict(&old[1]));
        // web-1's replacement runs first: it ends web-1's count, not web-0's (which web-r0,
        // seen before web-1's eviction, could not end).
        w.apply(&pod("a", "web-r1", "web", now_s(), "Running"));
        assert!(w.evict(&old[2]));
        w.apply(&pod("a", "web-r0", "web", now_s(), "Running"));
        w.apply(&pod("a", "web-r2", "web", now_s(), "Running"));
        assert!(w.evict(&old[3]));
        assert_eq!(w.pacer.progress(), 3, "every replacement ended a count");
        assert_eq!(w.pacer.starting(), 1, "web-3's count only");
    }

    #[tokio::test]
    async fn the_drain_that_started_first_goes_first() {
        let mut w = World::new(1);
        let pods = w.webs(4);
        let pacer = w.pacer.clone();
        let (early, late) = (pacer.drain_place(), pacer.drain_place());
        assert!(early < late);
        assert!(w.evict(&pods[0]));
        // The later drain's pod waits first, then the earlier drain's.
        let mut later = pacer.turn(late);
        assert!(later.take(&r(&pods[1])).is_none());
        let mut earlier = pacer.turn(early);
        assert!(earlier.take(&r(&pods[2])).is_none());
        w.apply(&pod("a", "web-x", "web", now_s(), "Running"));
        assert!(
            later.take(&r(&pods[1])).is_none(),
            "the earlier drain's pod is ahead"
        );
        let t = earlier.take(&r(&pods[2])).expect("its turn");
        w.pacer.settle(t, true);
        // A new pod of the earlier drain is still ahead of the later drain's waiter.
        w.apply(&pod("a", "web-y", "web", now_s(), "Running"));
        let mut again = pacer.turn(early);
        assert!(again.take(&r(&pods[3])).is_some());
        assert!(later.take(&r(&pods[1])).is_none(), "one place, taken");
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_grows_while_replacements_start_as_fast_as_they_are_let_through() {
        // Floor 2, ceiling 10: each replacement runs 1 s after its eviction, whatever the number.
        let (reader, mut writer) = store::<CachedPod>();
        let index = PodIndex::watched();
        let (tick, changes) = watch::channel(0u64);
        let pacer = Pacer::new(2, 10, reader, index.clone(), changes);
        let mut apply = |p: &CachedPod| {
            writer.apply_watcher_event(&Event::Apply(p.clone()));
            index.applied(p);
            tick.send_modify(|v| *v += 1);
        };
        let olds: Vec<CachedPod> = (0..200)
            .map(|i| pod("a", &format!("web-{i}"), "web", now_s() - 600, "Running"))
            .collect();
        for p in &olds {
            apply(p);
        }
        let drain = pacer.drain_place();
        let mut next = olds.iter();
        let mut waiter: Option<(Turn<'_>, &CachedPod)> = None;
        let mut pending: Vec<String> = Vec::new();
        let mut most = 0usize;
        for second in 0..20 {
            // Let through all the bound allows, one waiter kept in line.
            loop {
                let (mut turn, p) = match waiter.take() {
                    Some(w) => w,
                    None => match next.next() {
                        Some(p) => (pacer.turn(drain), p),
                        None => break,
                    },
                };
                match turn.take(&r(p)) {
                    Some(t) => {
                        pacer.settle(t, true);
                        pending.push(format!("web-r{second}-{}", pending.len()));
                    }
                    None => {
                        waiter = Some((turn, p));
                        break;
                    }
                }
            }
            most = most.max(pacer.starting());
            tokio::time::advance(Duration::from_secs(1)).await;
            for name in pending.drain(..) {
                apply(&pod("a", &name, "web", now_s(), "Running"));
            }
        }
        assert_eq!(pacer.limit(), 10, "the bound reached its ceiling");
        assert_eq!(most, 10, "and as many started at once");
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_gives_up_its_place() {
        let mut w = World::new(1);
        let pods = w.webs(3);
        assert!(w.evict(&pods[0]));
        {
            let mut gone = w.pacer.turn(0);
            assert!(gone.take(&r(&pods[1])).is_none());
        } // its drain was cancelled
        w.apply(&pod("a", "web-x", "web", now_s(), "Running"));
        assert!(w.evict(&pods[2]), "no one ahead any more");
    }

    #[tokio::test(start_paused = true)]
    async fn a_replacement_that_never_runs_holds_its_count_for_the_ttl_only() {
        // Namespace quota's replacements never run; namespace other's do.
        let mut w = World::new(2);
        let a = pod("quota", "web-0", "web", now_s() - 600, "Running");
        let b = pod("quota", "web-1", "web", now_s() - 600, "Running");
        let others: Vec<CachedPod> = (0..4)
            .map(|i| {
                pod(
                    "other",
                    &format!("api-{i}"),
                    "api",
                    now_s() - 600,
                    "Running",
                )
            })
            .collect();
        for p in [&a, &b].into_iter().chain(&others) {
            w.apply(p);
        }
        assert!(w.evict(&a));
        assert!(w.evict(&others[0]));
        tokio::time::advance(Duration::from_secs(5)).await;
        w.apply(&pod("other", "api-x", "api", now_s(), "Running"));
        assert!(
            w.evict(&others[1]),
            "api's replacement ran: a place is free"
        );
        // quota started none for 15 s while other started one: given up then.
        tokio::time::advance(STARTING_TTL - Duration::from_secs(5) - Duration::from_millis(1))
            .await;
        assert!(!w.evict(&b), "still within the wait");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(w.evict(&b), "waited out: no longer counted");
        assert_eq!(w.pacer.progress(), 2);
        assert_eq!(
            w.pacer.starting(),
            1,
            "api-1's count; b passed uncounted: its namespace is not paced"
        );
        // Nor are its next evictions, however many.
        let more: Vec<CachedPod> = (2..6)
            .map(|i| {
                pod(
                    "quota",
                    &format!("web-{i}"),
                    "web",
                    now_s() - 600,
                    "Running",
                )
            })
            .collect();
        for p in &more {
            w.apply(p);
        }
        assert!(more.iter().all(|p| w.evict(p)));
        assert_eq!(w.pacer.starting(), 1);
        // The other namespace is still paced.
        assert!(w.evict(&others[2]));
        assert!(!w.evict(&others[3]), "other's counts hold the line");
        // Once the time is up the namespace is paced again.
        tokio::time::advance(UNPACED_FOR).await;
        let f = pod("quota", "web-10", "web", now_s() - 600, "Running");
        w.apply(&f);
        assert!(w.evict(&f), "other's counts ran out");
        assert_eq!(w.pacer.starting(), 1, "f counts again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_that_starts_nothing_keeps_counts_for_the_longest_start() {
        // The first replacements of a wave take longer than 15 s to start (images pulled, a
        // cluster under load): slow, not stuck, so the wave stays paced.
        let mut w = World::new(1);
        let webs = w.webs(3);
        assert!(w.evict(&webs[0]));
        tokio::time::advance(STARTING_TTL * 4).await;
        assert!(!w.evict(&webs[1]), "no replacement started anywhere: kept");
        w.apply(&pod("a", "web-x", "web", now_s(), "Running"));
        assert!(w.evict(&webs[1]), "it ran after 60 s");
        assert_eq!(w.pacer.progress(), 1);
        tokio::time::advance(LONGEST_START - Duration::from_millis(1)).await;
        assert!(!w.evict(&webs[2]), "web-1's count is kept 2 minutes");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(w.evict(&webs[2]), "and given up then");
        assert_eq!(w.pacer.progress(), 2);
    }

    /// A Pending pod of ReplicaSet `rs` in namespace `ns` with `spec` and `status`.
    fn pending_of(
        ns: &str,
        rs: &str,
        name: &str,
        spec: serde_json::Value,
        status: serde_json::Value,
    ) -> CachedPod {
        let mut p = pod(ns, name, rs, now_s(), "Pending");
        p.spec = serde_json::from_value(spec).unwrap();
        p.status = serde_json::from_value(status).unwrap();
        p
    }

    /// A Pending pod of ReplicaSet `web` in namespace `a` with `spec` and `status`.
    fn pending(name: &str, spec: serde_json::Value, status: serde_json::Value) -> CachedPod {
        pending_of("a", "web", name, spec, status)
    }

    /// Bound by the scheduler, its kubelet not reporting yet (a control plane that stalled).
    fn bound_not_reported(ns: &str, rs: &str, name: &str) -> CachedPod {
        pending_of(
            ns,
            rs,
            name,
            serde_json::json!({"containers": [], "nodeName": "n1"}),
            serde_json::json!({"phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}]}),
        )
    }

    /// Reported by its kubelet, its containers not started: a slow image pull, or a kubelet
    /// whose next report a stalled API server holds back.
    fn container_creating(name: &str) -> CachedPod {
        pending(
            name,
            serde_json::json!({"containers": [], "nodeName": "n1"}),
            serde_json::json!({"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]}),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_controller_whose_replacements_lag_while_its_namespace_moves_is_let_go_alone() {
        // One Deployment of a namespace pulls a large image (its replacements ContainerCreating
        // past 2 minutes) while the namespace's others start: only that controller stops being
        // paced; the namespace's other evictions still wait for their replacements.
        let mut w = World::new(10);
        let webs = w.webs(3);
        let apis: Vec<CachedPod> = (0..2)
            .map(|i| pod("a", &format!("api-{i}"), "api", now_s() - 600, "Running"))
            .collect();
        for p in &apis {
            w.apply(p);
        }
        assert!(w.evict(&apis[0]));
        assert!(w.evict(&webs[0]));
        let pulling = pending_of(
            "a",
            "api",
            "api-x",
            serde_json::json!({"containers": [], "nodeName": "n1"}),
            serde_json::json!({"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]}),
        );
        w.apply(&pulling);
        tokio::time::advance(Duration::from_secs(30)).await;
        w.apply(&pod("a", "web-x", "web", now_s(), "Running"));
        w.pacer.refresh();
        assert_eq!(w.pacer.starting(), 1, "web-x ended web-0's count");
        tokio::time::advance(LONGEST_START - Duration::from_secs(30)).await;
        assert!(w.evict(&webs[1]));
        assert_eq!(
            w.pacer.starting(),
            1,
            "api-0's count given up; web-1's counted: the namespace is still paced"
        );
        assert!(w.evict(&apis[1]));
        assert_eq!(w.pacer.starting(), 1, "api is not paced: api-1 not counted");
        let timeouts = w.timeouts(StartTimeoutReason::longest_start);
        assert_eq!(timeouts, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_control_plane_keeps_every_count_up_to_the_longest_queued() {
        // A control plane that stalls (kwok's heartbeats of 5,000 nodes at once, an API server
        // overloaded) starts nothing for minutes: the wave stays paced, not let loose. One
        // replacement waiting in its queues shows it, for every namespace's counts.
        let mut w = World::new(3);
        let webs = w.webs(3);
        let api = pod("b", "api-0", "api", now_s() - 600, "Running");
        w.apply(&api);
        assert!(w.evict(&webs[0]));
        assert!(w.evict(&webs[1]));
        assert!(w.evict(&api));
        w.apply(&container_creating("web-x"));
        w.apply(&bound_not_reported("b", "api", "api-x"));
        w.pacer.refresh();
        tokio::time::advance(LONGEST_START).await;
        let before = w.pacer.progress();
        assert!(
            !w.evict(&webs[2]),
            "api-x has waited for its kubelet 2 minutes: every count is kept"
        );
        assert_eq!(w.pacer.starting(), 3);
        assert_eq!(
            w.pacer.progress(),
            before + 3,
            "a kept count is progress: the evictions waiting are not stuck"
        );
        tokio::time::advance(LONGEST_QUEUED - LONGEST_START - Duration::from_millis(1)).await;
        assert!(!w.evict(&webs[2]), "kept up to the longest queued");
        assert_eq!(w.pacer.starting(), 3);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(w.evict(&webs[2]), "and given up then");
        assert_eq!(
            w.pacer.starting(),
            1,
            "the wait was the cluster's: the namespace is still paced, web-2 counts"
        );
        assert_eq!(w.timeouts(StartTimeoutReason::longest_queued), 3);
        assert_eq!(w.timeouts(StartTimeoutReason::longest_start), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_count_ends_when_a_replacement_runs() {
        let mut w = World::new(2);
        let webs = w.webs(3);
        assert!(w.evict(&webs[0]));
        assert!(w.evict(&webs[1]));
        w.apply(&bound_not_reported("a", "web", "web-x"));
        w.apply(&container_creating("web-y"));
        w.pacer.refresh();
        tokio::time::advance(LONGEST_START).await;
        assert!(!w.evict(&webs[2]), "kept: the control plane stalled");
        w.apply(&pod("a", "web-y", "web", now_s(), "Running"));
        assert!(w.evict(&webs[2]), "web-y ran: one count ended");
        assert_eq!(w.pacer.starting(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_new_to_the_queue_shows_no_stall() {
        let mut w = World::new(1);
        let webs = w.webs(2);
        assert!(w.evict(&webs[0]));
        tokio::time::advance(LONGEST_START - QUEUE_STALL + Duration::from_secs(1)).await;
        w.apply(&bound_not_reported("a", "web", "web-x"));
        w.pacer.refresh();
        tokio::time::advance(QUEUE_STALL - Duration::from_secs(1)).await;
        assert!(
            w.evict(&webs[1]),
            "web-x waited 9 s only: a scheduler that is busy, not stalled"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn replacements_a_tenant_holds_are_given_up_at_the_longest_start() {
        // The attack: a tenant keeps its replacements Pending by their spec so that its counts
        // hold the line (and would make the control plane look stalled). None of these waits
        // in the cluster's queues.
        let held = [
            pending(
                "web-sched",
                serde_json::json!({"containers": [], "schedulerName": "never-runs"}),
                serde_json::json!({"phase": "Pending"}),
            ),
            pending(
                "web-gated",
                serde_json::json!({"containers": [], "schedulingGates": [{"name": "hold"}]}),
                serde_json::json!({"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}),
            ),
            pending(
                "web-claim",
                serde_json::json!({"containers": [], "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "slow-class"}}]}),
                serde_json::json!({"phase": "Pending"}),
            ),
            pending(
                "web-ephemeral",
                serde_json::json!({"containers": [], "volumes": [
                    {"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}),
                serde_json::json!({"phase": "Pending"}),
            ),
            pending(
                "web-nowhere",
                serde_json::json!({"containers": [], "nodeName": "no-such-node"}),
                serde_json::json!({"phase": "Pending"}),
            ),
            container_creating("web-pulling"),
        ];
        for h in held {
            let mut w = World::new(1);
            let webs = w.webs(2);
            assert!(w.evict(&webs[0]));
            w.apply(&h);
            w.pacer.refresh();
            tokio::time::advance(LONGEST_START - Duration::from_millis(1)).await;
            assert!(!w.evict(&webs[1]), "{:?}", h.metadata.name);
            tokio::time::advance(Duration::from_millis(1)).await;
            assert!(
                w.evict(&webs[1]),
                "{:?}: given up at the longest start",
                h.metadata.name
            );
            assert_eq!(w.pacer.progress(), 1, "{:?}", h.metadata.name);
            let timeouts = w.timeouts(StartTimeoutReason::longest_start);
            assert_eq!(timeouts, 1, "{:?}: no stall to keep it", h.metadata.name);
            assert_eq!(
                w.pacer.starting(),
                0,
                "{:?}: its namespace is not paced now",
                h.metadata.name
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_namespace_whose_replacements_keep_starting_keeps_its_counts() {
        // A slow cluster, not a stuck namespace: counts stay while replacements start.
        let mut w = World::new(2);
        let webs = w.webs(4);
        assert!(w.evict(&webs[0]));
        assert!(w.evict(&webs[1]));
        tokio::time::advance(Duration::from_secs(10)).await;
        w.apply(&pod("a", "web-x", "web", now_s(), "Running"));
        assert!(w.evict(&webs[2]), "a replacement ran: a place is free");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(
            !w.evict(&webs[3]),
            "20 s after its eviction web-1's count is kept: the namespace started one 10 s ago"
        );
        assert_eq!(w.pacer.progress(), 1);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            !w.evict(&webs[3]),
            "15 s without a start, but none started elsewhere either: a slow cluster"
        );
        assert_eq!(w.pacer.progress(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn progress_keeps_a_count_for_the_longest_start_at_most() {
        let mut w = World::new(2);
        // ReplicaSet db's replacement never runs; web's keep running, every 10 s.
        let stuck = pod("a", "db-0", "db", now_s() - 600, "Running");
        w.apply(&stuck);
        let webs = w.webs(13);
        assert!(w.evict(&stuck));
        let step = Duration::from_secs(10);
        for (i, web) in webs.iter().take(11).enumerate() {
            assert!(w.evict(web), "a place is free after {} s", i * 10);
            tokio::time::advance(step).await;
            w.apply(&pod("a", &format!("web-r{i}"), "web", now_s(), "Running"));
        }
        // 110 s: the next eviction sees web-10's replacement Running.
        assert!(w.evict(&webs[11]));
        assert_eq!(w.pacer.progress(), 11);
        tokio::time::advance(LONGEST_START - 11 * step - Duration::from_secs(1)).await;
        assert!(
            !w.evict(&webs[12]),
            "db's count is kept 119 s: its namespace keeps starting replacements"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(w.evict(&webs[12]), "at 120 s db's count is given up");
        assert_eq!(w.pacer.progress(), 12);
        assert_eq!(
            w.pacer.starting(),
            2,
            "web-11's and web-12's counts: the namespace moved, only db is no longer paced"
        );
        let db1 = pod("a", "db-1", "db", now_s() - 600, "Running");
        w.apply(&db1);
        assert!(w.evict(&db1), "db is not paced: it passes the full line");
        assert_eq!(w.pacer.starting(), 2, "db-1 not counted");
    }

    #[tokio::test]
    async fn statefulset_pods_are_not_counted() {
        // A StatefulSet creates the replacement only once the old pod is gone, after a grace
        // period its tenant sets (up to maxGracefulTermination): counting it would let the
        // tenant hold the line that long.
        let mut w = World::new(1);
        let mut db = pod("a", "db-0", "db", now_s() - 600, "Running");
        if let Some(o) = db.metadata.owner_references.as_mut() {
            o[0].kind = "StatefulSet".into();
        }
        w.apply(&db);
        let webs = w.webs(2);
        assert!(w.evict(&db));
        assert_eq!(w.pacer.starting(), 0);
        assert!(
            w.evict(&webs[0]),
            "the StatefulSet's eviction holds no place"
        );
        assert!(!w.evict(&webs[1]), "the ReplicaSet's does");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_ends_counts_when_no_eviction_asks() {
        let mut w = World::new(2);
        let old = w.webs(2);
        assert!(w.evict(&old[0]));
        assert!(w.evict(&old[1]));
        w.apply(&pod("a", "web-r0", "web", now_s(), "Running"));
        assert_eq!(w.pacer.starting(), 2, "nothing looked yet");
        w.pacer.refresh();
        assert_eq!(w.pacer.starting(), 1, "web-r0 ended a count");
        tokio::time::advance(LONGEST_START).await;
        w.pacer.refresh();
        assert_eq!(w.pacer.starting(), 0, "the other waited out");
    }

    #[tokio::test]
    async fn no_limit_counts_nothing() {
        let mut w = World::new(0);
        let pods = w.webs(5);
        assert!(pods.iter().all(|p| w.evict(p)));
        assert_eq!(w.pacer.starting(), 0);
    }
}
