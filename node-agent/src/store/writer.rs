//! Group commit: a dedicated writer thread takes every transition that has arrived, commits them
//! in one durable transaction and only then acknowledges each submitter. Failures mark it unhealthy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use super::records::Op;
use super::{StateStore, StoreError};

/// Health of the store as seen by the writer: reported in NodeState's `StoreHealthy` condition.
#[derive(Debug, Default)]
pub struct WriterHealth {
    unhealthy: AtomicBool,
    last_error: Mutex<Option<String>>,
    commits: AtomicU64,
    transitions: AtomicU64,
}

impl WriterHealth {
    pub fn healthy(&self) -> bool {
        !self.unhealthy.load(Ordering::Relaxed)
    }
    /// The message of the last failed commit, while the store is unhealthy.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// Transactions committed.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
    /// Transitions committed (≥ commits; the difference is what group commit saved).
    pub fn transitions(&self) -> u64 {
        self.transitions.load(Ordering::Relaxed)
    }
    fn record(&self, result: &Result<(), StoreError>, transitions: usize) {
        let mut last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::Relaxed);
                self.transitions
                    .fetch_add(transitions as u64, Ordering::Relaxed);
                self.unhealthy.store(false, Ordering::Relaxed);
                *last = None;
            }
            Err(e) => {
                self.unhealthy.store(true, Ordering::Relaxed);
                *last = Some(e.to_string());
            }
        }
    }
}

struct Request {
    ops: Vec<Op>,
    ack: oneshot::Sender<Result<(), StoreError>>,
}

/// Handle to the writer thread. Dropping it lets the thread finish what was submitted and stop.
pub struct GroupWriter {
    tx: Option<mpsc::Sender<Request>>,
    health: Arc<WriterHealth>,
    thread: Option<JoinHandle<()>>,
}

impl GroupWriter {
    /// Starts the writer over `store`; at most `max_batch` submissions share one transaction.
    pub fn spawn(store: Arc<dyn StateStore>, max_batch: usize) -> GroupWriter {
        let (tx, rx) = mpsc::channel::<Request>();
        let health = Arc::new(WriterHealth::default());
        let h = health.clone();
        let max_batch = max_batch.max(1);
        let thread = std::thread::Builder::new()
            .name("ebb-store-writer".into())
            .spawn(move || writer_loop(store.as_ref(), &rx, &h, max_batch))
            .ok();
        GroupWriter {
            tx: thread.as_ref().map(|_| tx),
            health,
            thread,
        }
    }

    pub fn health(&self) -> Arc<WriterHealth> {
        self.health.clone()
    }

    /// Queues `ops` (committed atomically together); the receiver resolves after the commit.
    pub fn submit(&self, ops: Vec<Op>) -> oneshot::Receiver<Result<(), StoreError>> {
        let (ack, rx) = oneshot::channel();
        if let Some(tx) = &self.tx
            && let Err(mpsc::SendError(req)) = tx.send(Request { ops, ack })
        {
            let _ = req.ack.send(Err(StoreError::WriterStopped));
        }
        rx
    }

    /// Commits `ops` durably; returns once they are on disk.
    pub async fn commit(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        self.submit(ops)
            .await
            .unwrap_or(Err(StoreError::WriterStopped))
    }

    /// Same as `commit`, for threads outside the async runtime.
    pub fn commit_blocking(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        self.submit(ops)
            .blocking_recv()
            .unwrap_or(Err(StoreError::WriterStopped))
    }
}

impl Drop for GroupWriter {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn writer_loop(
    store: &dyn StateStore,
    rx: &mpsc::Receiver<Request>,
    health: &WriterHealth,
    max_batch: usize,
) {
    let mut batch: Vec<Request> = Vec::with_capacity(max_batch);
    let mut ops: Vec<Op> = Vec::new();
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        ops.clear();
        for r in &batch {
            ops.extend(r.ops.iter().cloned());
        }
        let result = store.apply(&ops);
        health.record(&result, ops.len());
        if let Err(e) = &result {
            tracing::error!(error = %e, transitions = ops.len(), "state store commit failed; store marked unhealthy");
        }
        let message = result.as_ref().err().map(|e| e.to_string());
        for r in batch.drain(..) {
            let reply = match &message {
                None => Ok(()),
                Some(m) => Err(StoreError::Write(m.clone())),
            };
            let _ = r.ack.send(reply);
        }
    }
}
