//! The spool: agents' stores the card server cannot take now, kept on the host until it
//! can, so a lesson learned during an outage is not lost.
//!
//! A store the server could not take (not reached, timed out, 5xx, 503 while its
//! database restarts), or one that arrives while earlier stores of its workspace still
//! wait, is written to `spool/queue/<seq>-<store id>.json` (file and directory flushed to
//! disk) before the agent is answered `queued`. The [`replayer`] sends each workspace's
//! queue in order, one at a time, backing off while the server cannot take it. Every
//! store carries its id as the idempotency key, so however often one is sent (a direct
//! try that timed out after reaching the server, a replay after a kill -9, another
//! replica after a failover) the server applies it once and answers repeats with its
//! first answer. What became of each queued store is kept without its text in
//! `spool/done/` (for `mop memory store-status`, `mopd status` and the task's receipt);
//! a store older than `spool.max_age_secs` is dropped, logged and counted.
//!
//! The queue is bounded per task and per host, by count and by bytes: a full queue
//! refuses with a message that names the limit.
//!
//! Must not decide what a store does on the server, nor decide what a task sees.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use mop_cards::CardId;
use mop_proto::StoreStatus;
use mop_proto::receipts::StoreEventOutcome;
use mop_proto::status::{RefusedStore, SpoolInfo};
use mop_proto::sync::{StoreOutcome, StoreRequest};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use crate::client::ClientError;
use crate::config::SpoolSection;
use crate::paths::Paths;
use crate::receipts::Receipts;
use crate::state::State;

/// A store waiting for the server, as its file holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Queued {
    /// Its id, sent as the idempotency key.
    pub store_id: String,
    /// Its workspace.
    pub workspace: String,
    /// Its task.
    pub task_id: String,
    /// When its task was prepared (which receipt it belongs to).
    pub prepared_at: Timestamp,
    /// When it was queued.
    pub queued_at: Timestamp,
    /// The store, with the task's provenance.
    pub request: StoreRequest,
}

/// What became of a queued store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Resolution {
    /// The server took it.
    Stored {
        /// What it did.
        outcome: StoreOutcome,
        /// The card.
        id: Option<CardId>,
        /// What the agent would have been told.
        note: String,
    },
    /// The server refused it by its rules.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error code.
        code: Option<String>,
        /// The server's message (kinds and places of credentials, a rejection's reason;
        /// never a credential).
        message: String,
    },
    /// It waited longer than the host keeps stores.
    Dropped {
        /// Why.
        reason: String,
    },
}

/// A resolved store's record: no text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Done {
    /// Its id.
    pub store_id: String,
    /// Its workspace.
    pub workspace: String,
    /// Its task.
    pub task_id: String,
    /// When its task was prepared.
    pub prepared_at: Timestamp,
    /// When it was queued.
    pub queued_at: Timestamp,
    /// When it was sent or given up.
    pub resolved_at: Timestamp,
    /// Tries.
    pub attempts: u32,
    /// What became of it.
    pub result: Resolution,
}

impl Done {
    /// As the agent socket shows it.
    pub fn status(&self) -> StoreStatus {
        let (state, outcome, id, status, code, message) = match &self.result {
            Resolution::Stored { outcome, id, note } => (
                "stored",
                Some(*outcome),
                *id,
                None,
                None,
                format!(
                    "the card server took it: {}{}",
                    outcome.meaning(),
                    if note.is_empty() {
                        String::new()
                    } else {
                        format!(". {note}")
                    }
                ),
            ),
            Resolution::Refused {
                status,
                code,
                message,
            } => (
                "refused",
                None,
                None,
                Some(*status),
                code.clone(),
                format!("the card server refused it: {message}"),
            ),
            Resolution::Dropped { reason } => ("dropped", None, None, None, None, reason.clone()),
        };
        StoreStatus {
            store_id: self.store_id.clone(),
            state: state.into(),
            outcome,
            id,
            queued_at: self.queued_at,
            resolved_at: Some(self.resolved_at),
            attempts: self.attempts,
            status,
            code,
            message,
        }
    }
}

/// Why a store could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// A bound is reached; nothing was queued.
    #[error("{0}")]
    Full(String),
    /// The state directory would not take it.
    #[error("cannot keep the store on this host: {0}")]
    Io(#[from] std::io::Error),
}

/// One waiting store, as the queue's index keeps it.
#[derive(Debug, Clone)]
struct Entry {
    store_id: String,
    workspace: String,
    task_id: String,
    prepared_at: Timestamp,
    queued_at: Timestamp,
    bytes: u64,
    attempts: u32,
}

#[derive(Debug, Default)]
struct Inner {
    next_seq: u64,
    /// Waiting stores by their place in the queue.
    queue: BTreeMap<u64, Entry>,
    sent: u64,
    dropped: u64,
    last_error: Option<String>,
    /// The latest refusals on replay (at most [`REFUSALS_SHOWN`], newest first), kept in
    /// memory so `mopd status` and the metrics read no file.
    refused: Vec<RefusedStore>,
}

/// Refusals `mopd status` lists.
const REFUSALS_SHOWN: usize = 20;

fn refusal(d: &Done) -> Option<RefusedStore> {
    match &d.result {
        Resolution::Refused { status, code, .. } => Some(RefusedStore {
            store_id: d.store_id.clone(),
            workspace: d.workspace.clone(),
            task_id: d.task_id.clone(),
            status: *status,
            code: code.clone(),
            at: d.resolved_at,
        }),
        _ => None,
    }
}

/// The host's queue of stores.
pub struct Spool {
    paths: Paths,
    inner: Mutex<Inner>,
    wake: Notify,
}

/// `<20 digits>-<store id>.json` → (seq, store id).
fn parse_entry_name(name: &str) -> Option<(u64, &str)> {
    let stem = name.strip_suffix(".json")?;
    let (seq, id) = stem.split_at_checked(20)?;
    Some((seq.parse().ok()?, id.strip_prefix('-')?))
}

/// Store ids are UUIDs the daemon makes: nothing else names a file here.
pub fn is_store_id(s: &str) -> bool {
    uuid::Uuid::parse_str(s).is_ok_and(|u| u.hyphenated().to_string() == s)
}

impl Spool {
    /// The spool under the state directory, its queue read back (after a restart or a
    /// kill, every store that was answered `queued` is here).
    pub fn open(paths: &Paths) -> std::io::Result<Spool> {
        let mut inner = Inner::default();
        let dir = paths.spool_queue();
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") {
                // A write that never finished: its store was not answered `queued`.
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let Some((seq, store_id)) = parse_entry_name(&name) else {
                tracing::warn!(file = %e.path().display(), "a file that is no queued store; left alone");
                continue;
            };
            let bytes = std::fs::read(e.path())?;
            match serde_json::from_slice::<Queued>(&bytes) {
                Ok(q) if q.store_id == store_id => {
                    inner.next_seq = inner.next_seq.max(seq + 1);
                    inner.queue.insert(
                        seq,
                        Entry {
                            store_id: q.store_id,
                            workspace: q.workspace,
                            task_id: q.task_id,
                            prepared_at: q.prepared_at,
                            queued_at: q.queued_at,
                            bytes: bytes.len() as u64,
                            attempts: 0,
                        },
                    );
                }
                _ => {
                    tracing::warn!(file = %e.path().display(), "an unreadable queued store; left alone for inspection")
                }
            }
        }
        if !inner.queue.is_empty() {
            tracing::info!(
                stores = inner.queue.len(),
                "queued stores found; they are sent when the server takes them"
            );
        }
        // The refusals kept from before, read once here.
        inner.refused = std::fs::read_dir(paths.spool_done())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| serde_json::from_slice::<Done>(&std::fs::read(e.path()).ok()?).ok())
            .filter_map(|d| refusal(&d))
            .collect();
        inner.refused.sort_by_key(|r| std::cmp::Reverse(r.at));
        inner.refused.truncate(REFUSALS_SHOWN);
        Ok(Spool {
            paths: paths.clone(),
            inner: Mutex::new(inner),
            wake: Notify::new(),
        })
    }

    /// True when stores of `ws` wait: a new one must queue behind them to keep the order.
    pub fn has_waiting(&self, ws: &str) -> bool {
        self.inner.lock().queue.values().any(|e| e.workspace == ws)
    }

    /// Queues a store, on disk before this returns, within the limits.
    pub fn enqueue(&self, q: &Queued, limits: &SpoolSection) -> Result<(), SpoolError> {
        let bytes = serde_json::to_vec(q).expect("queued stores serialize");
        let size = bytes.len() as u64;
        let mut inner = self.inner.lock();
        let (mut task_n, mut task_bytes, mut all_bytes) = (0usize, 0u64, 0u64);
        for e in inner.queue.values() {
            all_bytes += e.bytes;
            if e.workspace == q.workspace && e.task_id == q.task_id {
                task_n += 1;
                task_bytes += e.bytes;
            }
        }
        let full = |what: String| {
            Err(SpoolError::Full(format!(
                "the card server cannot take stores now and this host's queue of them is full ({what}); \
                 nothing was kept. Try again later, when the server is back"
            )))
        };
        if task_n + 1 > limits.max_per_task {
            return full(format!(
                "{task_n} of this task's stores wait, spool.max_per_task is {}",
                limits.max_per_task
            ));
        }
        if task_bytes + size > limits.max_bytes_per_task {
            return full(format!(
                "this task's waiting stores take {task_bytes} bytes, spool.max_bytes_per_task is {}",
                limits.max_bytes_per_task
            ));
        }
        if inner.queue.len() + 1 > limits.max_stores {
            return full(format!(
                "{} stores wait on this host, spool.max_stores is {}",
                inner.queue.len(),
                limits.max_stores
            ));
        }
        if all_bytes + size > limits.max_bytes {
            return full(format!(
                "waiting stores take {all_bytes} bytes on this host, spool.max_bytes is {}",
                limits.max_bytes
            ));
        }
        let seq = inner.next_seq;
        // Written under the lock, so the queue's order is the order of the files.
        crate::files::replace_durably(&self.paths.spool_entry(seq, &q.store_id), &bytes)?;
        inner.next_seq += 1;
        inner.queue.insert(
            seq,
            Entry {
                store_id: q.store_id.clone(),
                workspace: q.workspace.clone(),
                task_id: q.task_id.clone(),
                prepared_at: q.prepared_at,
                queued_at: q.queued_at,
                bytes: size,
                attempts: 0,
            },
        );
        drop(inner);
        self.wake.notify_one();
        Ok(())
    }

    /// Wakes the replayer (a store was queued, or the server may be back).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The waiting stores of `ws`, in order.
    fn waiting(&self, ws: &str) -> Vec<u64> {
        self.inner
            .lock()
            .queue
            .iter()
            .filter(|(_, e)| e.workspace == ws)
            .map(|(seq, _)| *seq)
            .collect()
    }

    /// The workspaces with waiting stores.
    fn workspaces(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .inner
            .lock()
            .queue
            .values()
            .map(|e| e.workspace.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// A waiting store, read from its file (`None`: not queued). One whose file is gone
    /// or unreadable is resolved as dropped (its task's receipt then says so, and stops
    /// waiting for it): `Err` with what became of it.
    fn load(&self, seq: u64) -> Option<Result<Queued, Done>> {
        let id = self.inner.lock().queue.get(&seq)?.store_id.clone();
        let path = self.paths.spool_entry(seq, &id);
        let why = match std::fs::read(&path).map(|b| serde_json::from_slice::<Queued>(&b)) {
            Ok(Ok(q)) => return Some(Ok(q)),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::error!(file = %path.display(), error = %why, "a queued store's file is gone or unreadable; it is dropped");
        let reason = format!(
            "this host could not read it back from its queue ({why}); it was dropped unsent: store it again"
        );
        self.resolve(seq, Resolution::Dropped { reason }).map(Err)
    }

    /// Notes a try that failed for now.
    fn attempted(&self, seq: u64, error: &str) {
        let mut inner = self.inner.lock();
        if let Some(e) = inner.queue.get_mut(&seq) {
            e.attempts += 1;
        }
        inner.last_error = Some(error.to_owned());
    }

    /// Ends a waiting store: its record goes to `done/` (on disk first), its file away.
    fn resolve(&self, seq: u64, result: Resolution) -> Option<Done> {
        let entry = self.inner.lock().queue.get(&seq).cloned()?;
        let done = Done {
            store_id: entry.store_id.clone(),
            workspace: entry.workspace,
            task_id: entry.task_id,
            prepared_at: entry.prepared_at,
            queued_at: entry.queued_at,
            resolved_at: Timestamp::now(),
            attempts: entry.attempts + u32::from(!matches!(result, Resolution::Dropped { .. })),
            result,
        };
        let record = serde_json::to_vec(&done).expect("records serialize");
        if let Err(e) =
            crate::files::replace_durably(&self.paths.spool_done_entry(&done.store_id), &record)
        {
            tracing::warn!(store = %done.store_id, error = %e, "cannot keep what became of a queued store");
        }
        let path = self.paths.spool_entry(seq, &entry.store_id);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::error!(file = %path.display(), error = %e, "cannot remove a sent store's file; it would be sent again (the server answers it once)");
        }
        let mut inner = self.inner.lock();
        inner.queue.remove(&seq);
        match &done.result {
            Resolution::Stored { .. } | Resolution::Refused { .. } => {
                inner.sent += 1;
                inner.last_error = None;
            }
            Resolution::Dropped { .. } => inner.dropped += 1,
        }
        if let Some(r) = refusal(&done) {
            inner.refused.insert(0, r);
            inner.refused.truncate(REFUSALS_SHOWN);
        }
        Some(done)
    }

    /// Drops the stores queued longer than `max_age`.
    fn expire(&self, max_age: Duration, now: Timestamp) -> Vec<Done> {
        let old: Vec<u64> = self
            .inner
            .lock()
            .queue
            .iter()
            .filter(|(_, e)| now.duration_since(e.queued_at).unsigned_abs() > max_age)
            .map(|(seq, _)| *seq)
            .collect();
        old.into_iter()
            .filter_map(|seq| {
                self.resolve(
                    seq,
                    Resolution::Dropped {
                        reason: format!(
                            "it waited longer than this host keeps stores ({} s, spool.max_age_secs) and was dropped unsent; store it again if it still holds",
                            max_age.as_secs()
                        ),
                    },
                )
            })
            .collect()
    }

    /// Removes records of stores resolved more than `days` ago.
    fn rotate_done(&self, days: u64) {
        let keep = Duration::from_secs(days.saturating_mul(86_400));
        for e in std::fs::read_dir(self.paths.spool_done())
            .into_iter()
            .flatten()
            .flatten()
        {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > keep));
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    fn read_done(&self, store_id: &str) -> Option<Done> {
        serde_json::from_slice(&std::fs::read(self.paths.spool_done_entry(store_id)).ok()?).ok()
    }

    /// Where the store `store_id` of the task `task_id` (prepared at `prepared_at`)
    /// stands; `None` for another task's store or one that was never queued.
    pub fn status(
        &self,
        store_id: &str,
        task_id: &str,
        prepared_at: Timestamp,
    ) -> Option<StoreStatus> {
        if !is_store_id(store_id) {
            return None;
        }
        let waiting = self
            .inner
            .lock()
            .queue
            .values()
            .find(|e| e.store_id == store_id)
            .cloned();
        if let Some(e) = waiting {
            if e.task_id != task_id || e.prepared_at != prepared_at {
                return None;
            }
            return Some(StoreStatus {
                store_id: e.store_id,
                state: "queued".into(),
                outcome: None,
                id: None,
                queued_at: e.queued_at,
                resolved_at: None,
                attempts: e.attempts,
                status: None,
                code: None,
                message: "it waits on this host until the card server takes it; nothing to do"
                    .into(),
            });
        }
        let done = self.read_done(store_id)?;
        (done.task_id == task_id && done.prepared_at == prepared_at).then(|| done.status())
    }

    /// The queue as `mopd status` and the metrics show it.
    pub fn info(&self, now: Timestamp) -> SpoolInfo {
        let inner = self.inner.lock();
        let oldest = inner.queue.values().map(|e| e.queued_at).min();
        SpoolInfo {
            queued: inner.queue.len(),
            bytes: inner.queue.values().map(|e| e.bytes).sum(),
            oldest_queued_at: oldest,
            oldest_age_secs: oldest.map_or(0, |t| now.duration_since(t).as_secs().max(0) as u64),
            sent: inner.sent,
            dropped: inner.dropped,
            last_error: inner.last_error.clone(),
            refused: inner.refused.clone(),
        }
    }
}

/// The receipt event of a resolved store.
fn note_in_receipt(receipts: &Receipts, done: &Done) {
    let (outcome, id, status, code) = match &done.result {
        Resolution::Stored { outcome, id, .. } => ((*outcome).into(), *id, None, None),
        Resolution::Refused { status, code, .. } => (
            StoreEventOutcome::Refused,
            None,
            Some(*status),
            code.clone(),
        ),
        Resolution::Dropped { .. } => (StoreEventOutcome::Dropped, None, None, None),
    };
    receipts.resolve_store(&done.task_id, done.prepared_at, &done.store_id, |e| {
        e.outcome = outcome;
        e.id = id;
        e.status = status;
        e.code = code.clone();
    });
}

/// Longest the replayer sleeps with nothing queued before it looks for old records again.
const IDLE: Duration = Duration::from_secs(60);

/// Sends the queued stores: each workspace's in order, one at a time; on a failure that
/// may pass, it waits (doubling from one second up to `spool.retry_max_secs`, or what a
/// 429 asks) and tries again. Also drops stores older than `spool.max_age_secs`.
pub async fn replayer(
    state: Arc<State>,
    spool: Arc<Spool>,
    receipts: Arc<Receipts>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let config = state.config();
        let limits = config.spool.clone();
        for done in spool.expire(Duration::from_secs(limits.max_age_secs), Timestamp::now()) {
            tracing::warn!(store = %done.store_id, task = %done.task_id, workspace = %done.workspace,
                attempts = done.attempts, max_age_secs = limits.max_age_secs,
                "a queued store was dropped unsent: older than spool.max_age_secs");
            state.metrics.store_replay("dropped");
            note_in_receipt(&receipts, &done);
        }
        let s = spool.clone();
        let _ = tokio::task::spawn_blocking(move || s.rotate_done(limits.keep_done_days)).await;
        let client = state.client();
        let mut wait = None;
        'workspaces: for ws in spool.workspaces() {
            for seq in spool.waiting(&ws) {
                if *stop.borrow() {
                    return;
                }
                let q = match spool.load(seq) {
                    Some(Ok(q)) => q,
                    Some(Err(done)) => {
                        state.metrics.store_replay("dropped");
                        note_in_receipt(&receipts, &done);
                        continue;
                    }
                    None => continue,
                };
                let result = match client.store(&q.workspace, &q.request, &q.store_id).await {
                    Ok(r) => Resolution::Stored {
                        outcome: r.outcome,
                        id: r.id,
                        note: r.note,
                    },
                    Err(e) if e.is_transient() => {
                        tracing::warn!(store = %q.store_id, workspace = %ws, error = %e, "the server cannot take queued stores yet; trying again with backoff");
                        state.metrics.store_replay("retry");
                        spool.attempted(seq, &e.to_string());
                        // A 429's Retry-After, no longer than the longest configured wait
                        // (a proxy must not park the queue).
                        let asked = match &e {
                            ClientError::Status {
                                retry_after: Some(s),
                                ..
                            } => Duration::from_secs((*s).min(limits.retry_max_secs)),
                            _ => Duration::ZERO,
                        };
                        wait = Some(backoff.max(asked));
                        backoff = (backoff * 2).min(Duration::from_secs(limits.retry_max_secs));
                        // Later workspaces are tried too: one that fails need not hold back
                        // the others, but this one keeps its order.
                        continue 'workspaces;
                    }
                    Err(ClientError::Status {
                        status,
                        code,
                        message,
                        ..
                    }) => Resolution::Refused {
                        status,
                        code,
                        message,
                    },
                    Err(e) => unreachable!("every other error is transient: {e}"),
                };
                let s = spool.clone();
                let Ok(Some(done)) =
                    tokio::task::spawn_blocking(move || s.resolve(seq, result)).await
                else {
                    continue;
                };
                match &done.result {
                    Resolution::Stored { outcome, id, .. } => {
                        tracing::info!(store = %done.store_id, task = %done.task_id, workspace = %done.workspace,
                            outcome = outcome.word(), card = ?id, attempts = done.attempts, "queued store sent");
                        state.metrics.store_replay(outcome.word());
                    }
                    Resolution::Refused { status, code, .. } => {
                        tracing::warn!(store = %done.store_id, task = %done.task_id, workspace = %done.workspace,
                            status, code = code.as_deref().unwrap_or("-"), "the server refused a queued store; see mopd status");
                        state.metrics.store_replay("refused");
                    }
                    Resolution::Dropped { .. } => {}
                }
                note_in_receipt(&receipts, &done);
                backoff = Duration::from_secs(1);
            }
        }
        let sleep = match wait {
            Some(w) => w,
            None => IDLE,
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = spool.wake.notified(), if wait.is_none() => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> SpoolSection {
        SpoolSection {
            max_per_task: 2,
            max_bytes_per_task: 1 << 20,
            max_stores: 3,
            max_bytes: 1 << 20,
            ..SpoolSection::default()
        }
    }

    fn queued(task: &str, n: u32) -> Queued {
        Queued {
            store_id: uuid::Uuid::new_v4().to_string(),
            workspace: "acme".into(),
            task_id: task.into(),
            prepared_at: "2026-12-04T10:00:00Z".parse().unwrap(),
            queued_at: Timestamp::now(),
            request: serde_json::from_value(serde_json::json!({
                "provenance": {"task_id": task, "user_id": "alice"},
                "card": {"type": "fact", "title": format!("lesson {n}"), "body": "text\n"}
            }))
            .unwrap(),
        }
    }

    #[test]
    fn queued_stores_survive_a_restart_in_order_and_bounds_hold() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::under(dir.path());
        let spool = Spool::open(&paths).unwrap();
        let (a, b, c) = (queued("t1", 1), queued("t1", 2), queued("t2", 3));
        spool.enqueue(&a, &limits()).unwrap();
        spool.enqueue(&b, &limits()).unwrap();
        // Per task: a third store of t1 is refused, naming the limit.
        let err = spool.enqueue(&queued("t1", 4), &limits()).unwrap_err();
        assert!(err.to_string().contains("spool.max_per_task"), "{err}");
        spool.enqueue(&c, &limits()).unwrap();
        // Per host.
        let err = spool.enqueue(&queued("t3", 5), &limits()).unwrap_err();
        assert!(err.to_string().contains("spool.max_stores"), "{err}");
        // A new process finds them all, in the order they were queued.
        let again = Spool::open(&paths).unwrap();
        let order: Vec<String> = again
            .waiting("acme")
            .into_iter()
            .map(|s| again.load(s).unwrap().unwrap().store_id)
            .collect();
        assert_eq!(
            order,
            [a.store_id.clone(), b.store_id.clone(), c.store_id.clone()]
        );
        assert!(again.has_waiting("acme") && !again.has_waiting("other"));
        // Resolved: the record keeps no text, the file goes, and the status says so.
        let first = again.waiting("acme")[0];
        let done = again
            .resolve(
                first,
                Resolution::Refused {
                    status: 422,
                    code: Some("credential".into()),
                    message: "the card carries 1 credential(s)".into(),
                },
            )
            .unwrap();
        let record = std::fs::read_to_string(paths.spool_done_entry(&a.store_id)).unwrap();
        assert!(!record.contains("lesson 1"), "{record}");
        assert_eq!(done.status().state, "refused");
        let s = again.status(&a.store_id, "t1", a.prepared_at).unwrap();
        assert_eq!((s.state.as_str(), s.status), ("refused", Some(422)));
        assert_eq!(
            again
                .status(&b.store_id, "t1", b.prepared_at)
                .unwrap()
                .state,
            "queued"
        );
        // Another task cannot follow it.
        assert!(again.status(&b.store_id, "t2", b.prepared_at).is_none());
        assert_eq!(again.info(Timestamp::now()).queued, 2);
        assert_eq!(again.info(Timestamp::now()).refused.len(), 1);
    }

    #[test]
    fn stores_past_the_age_are_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::under(dir.path());
        let spool = Spool::open(&paths).unwrap();
        let mut old = queued("t1", 1);
        old.queued_at = Timestamp::now() - jiff::SignedDuration::from_hours(2);
        spool.enqueue(&old, &limits()).unwrap();
        spool.enqueue(&queued("t2", 2), &limits()).unwrap();
        let dropped = spool.expire(Duration::from_secs(3600), Timestamp::now());
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].store_id, old.store_id);
        let info = spool.info(Timestamp::now());
        assert_eq!((info.queued, info.dropped), (1, 1));
        assert_eq!(
            spool
                .status(&old.store_id, "t1", old.prepared_at)
                .unwrap()
                .state,
            "dropped"
        );
    }

    #[test]
    fn only_uuids_name_stores() {
        assert!(is_store_id("1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7"));
        assert!(!is_store_id("../../etc/passwd"));
        assert!(!is_store_id("1528FA6D-2786-4C33-9E4E-A2E4E84CA7D7"));
    }
}
