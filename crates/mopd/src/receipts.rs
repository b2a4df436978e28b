//! Task receipts on the host: for each task, what it was delivered (generation, profile,
//! each selected card's id, hash, tier and rank) and what its agent did through its socket
//! (retrieves as keyed query hashes with the returned ids, gets, stores with their outcome).
//! Ids, hashes and counts only: never card text, never query text.
//!
//! A receipt lives in `receipts/live/` while its task runs, moves to `receipts/pending/`
//! when the task ends, and to `receipts/sent/` once the server has counted it (the
//! [`reporter`] sends batches, retries with backoff, and the server counts a receipt once
//! however often it arrives). What the server refuses goes to `receipts/refused/`, logged.
//! Reported receipts are kept for `mop receipt` up to `receipts.keep` of them and
//! `receipts.keep_days` days; receipts still unreported after `keep_days` are dropped
//! with a warning (the server would not count them any more).
//!
//! Must not decide what a task sees, nor fail a task: a receipt that cannot be written is
//! logged and the task goes on.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use mop_proto::receipts::{
    Activity, MAX_BATCH, MAX_BATCH_BYTES, Receipt, ReceiptBatch, StoreEvent, StoreEventOutcome,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use crate::client::ClientError;
use crate::paths::{Paths, ReceiptKind};
use crate::state::State;

/// A receipt as the host keeps it: with the uid of the runner that prepared the task,
/// which alone (besides root and the daemon's user) may read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalReceipt {
    /// The runner's uid.
    pub owner_uid: u32,
    /// The receipt, as reported.
    pub receipt: Receipt,
}

/// How reporting goes, for `mopd status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportState {
    /// The last report the server took.
    pub last_reported_at: Option<Timestamp>,
    /// The last report's failure, until one succeeds.
    pub last_error: Option<String>,
    /// Receipts dropped unreported (older than `receipts.keep_days`) since the start.
    pub dropped: u64,
}

/// How often at most a running task's receipt is written while its agent is busy; what
/// comes in between is written by the next flush or the task's end.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// How often running receipts with unwritten changes are written ([`flusher`]): a daemon
/// killed outright loses at most this much of a running task's receipt.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// A running task's receipt, as kept in memory. Its file is written under its own lock,
/// so writes of one receipt never overtake each other and tasks never wait for each other.
struct Live {
    local: LocalReceipt,
    /// Changes not written yet.
    dirty: bool,
    saved_at: Instant,
    /// Its task ended: the receipt moved to `pending/` and is not written here again.
    ended: bool,
    /// Its file in `live/` exists.
    saved_at_least_once: bool,
}

impl Live {
    fn new(local: LocalReceipt) -> Arc<Mutex<Live>> {
        Arc::new(Mutex::new(Live {
            local,
            dirty: false,
            saved_at: Instant::now(),
            ended: false,
            saved_at_least_once: false,
        }))
    }
}

/// The receipts of this host.
pub struct Receipts {
    paths: Paths,
    key: [u8; 32],
    /// Running tasks' receipts, by task id.
    live: Mutex<HashMap<String, Arc<Mutex<Live>>>>,
    ended: Notify,
    report: Mutex<ReportState>,
}

fn micros(t: Timestamp) -> i64 {
    t.as_microsecond()
}

fn write_json(path: &std::path::Path, value: &LocalReceipt) -> std::io::Result<()> {
    crate::files::replace_json(path, value, false)
}

fn read_json(path: &std::path::Path) -> Option<LocalReceipt> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The host's hashing key: made once (0600), so the same query gives the same hash on
/// this host and the server cannot try guesses against it. Made only when missing: a key
/// that cannot be read is an error, not a reason to change every hash silently.
fn load_key(paths: &Paths) -> std::io::Result<[u8; 32]> {
    let path = paths.receipt_key();
    match std::fs::read(&path) {
        Ok(bytes) => {
            return <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                std::io::Error::other(format!(
                    "{} is not a 32-byte key; remove it to make a new one (query hashes then change)",
                    path.display()
                ))
            });
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    crate::files::make_dir(&paths.receipts())?;
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&key)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(key)
}

impl Receipts {
    /// The receipts under the state directory (its key made on first use).
    pub fn open(paths: &Paths) -> std::io::Result<Receipts> {
        let key = load_key(paths)?;
        Ok(Receipts {
            paths: paths.clone(),
            key,
            live: Mutex::default(),
            ended: Notify::new(),
            report: Mutex::default(),
        })
    }

    /// The keyed hash of a query (hex).
    pub fn query_hash(&self, query: &str) -> String {
        let mut keyed = Vec::with_capacity(self.key.len() + 1 + query.len());
        keyed.extend_from_slice(&self.key);
        keyed.push(0);
        keyed.extend_from_slice(query.as_bytes());
        mop_cards::sha256_hex(&keyed)
    }

    /// Starts a task's receipt. It is written by the next [`Receipts::flush`] (within
    /// [`FLUSH_EVERY`]) or at the task's end, whichever comes first: a task that ends
    /// sooner never writes (nor deletes) a file for its running receipt, which is most of
    /// the file system work a receipt would cost a busy host.
    pub fn begin(&self, owner_uid: u32, receipt: Receipt) {
        let id = receipt.task_id.clone();
        let entry = Live::new(LocalReceipt { owner_uid, receipt });
        entry.lock().dirty = true;
        self.live.lock().insert(id, entry);
    }

    fn save_live(&self, local: &LocalReceipt) {
        let r = &local.receipt;
        let path = self.paths.receipt(ReceiptKind::Live, &r.task_id, 0);
        if let Err(e) = write_json(&path, local) {
            tracing::warn!(task = %r.task_id, path = %path.display(), error = %e, "cannot save the task's receipt");
        }
    }

    fn save(&self, entry: &mut Live) {
        self.save_live(&entry.local);
        entry.dirty = false;
        entry.saved_at = Instant::now();
        entry.saved_at_least_once = true;
    }

    fn entry(&self, task_id: &str) -> Option<Arc<Mutex<Live>>> {
        self.live.lock().get(task_id).cloned()
    }

    /// Adds what the agent of the task `task_id` prepared at `prepared_at` did (an agent
    /// still connected to an ended task cannot write into a new task of the same id). The
    /// receipt is written at most every [`SAVE_EVERY`], and not at all when the event was
    /// only counted (past [`MAX_EVENTS`]): a busy agent costs the disk almost nothing.
    pub fn record(&self, task_id: &str, prepared_at: Timestamp, f: impl FnOnce(&mut Activity)) {
        self.update(task_id, prepared_at, |r| f(&mut r.activity));
    }

    /// Changes the running receipt of the task `task_id` prepared at `prepared_at` (how it
    /// ended, what was captured), as [`Receipts::record`] does its activity.
    pub fn update(&self, task_id: &str, prepared_at: Timestamp, f: impl FnOnce(&mut Receipt)) {
        let Some(entry) = self.entry(task_id) else {
            return;
        };
        let mut entry = entry.lock();
        if entry.ended || entry.local.receipt.prepared_at != prepared_at {
            return;
        }
        let listed =
            |a: &Activity| a.retrieves.len() + a.gets.len() + a.stores.len() + a.feedback.len();
        let before = listed(&entry.local.receipt.activity);
        f(&mut entry.local.receipt);
        let grew = listed(&entry.local.receipt.activity) > before;
        entry.dirty = true;
        if grew && entry.saved_at.elapsed() >= SAVE_EVERY {
            self.save(&mut entry);
        }
    }

    /// Updates the event of a queued store (by its id) in the receipt of task `task_id`
    /// prepared at `prepared_at`, wherever that receipt is now: running, waiting to be
    /// reported, or already kept.
    pub fn resolve_store(
        &self,
        task_id: &str,
        prepared_at: Timestamp,
        store_id: &str,
        update: impl Fn(&mut StoreEvent),
    ) {
        let apply = |a: &mut Activity| -> bool {
            let mut found = false;
            for e in a
                .stores
                .iter_mut()
                .filter(|e| e.store_id.as_deref() == Some(store_id))
            {
                update(e);
                found = true;
            }
            found
        };
        if let Some(entry) = self.entry(task_id) {
            let mut entry = entry.lock();
            if !entry.ended && entry.local.receipt.prepared_at == prepared_at {
                if apply(&mut entry.local.receipt.activity) {
                    entry.dirty = true;
                }
                return;
            }
        }
        for kind in [
            ReceiptKind::Pending,
            ReceiptKind::Sent,
            ReceiptKind::Refused,
        ] {
            let path = self.paths.receipt(kind, task_id, micros(prepared_at));
            let Some(mut local) = read_json(&path) else {
                continue;
            };
            if apply(&mut local.receipt.activity) {
                if let Err(e) = write_json(&path, &local) {
                    tracing::warn!(task = task_id, path = %path.display(), error = %e, "cannot record what became of a queued store in the receipt");
                }
                if kind == ReceiptKind::Pending {
                    self.ended.notify_one();
                }
            }
            return;
        }
    }

    /// Writes the running receipts that changed since they were last written.
    pub fn flush(&self) {
        let entries: Vec<Arc<Mutex<Live>>> = self.live.lock().values().cloned().collect();
        for entry in entries {
            let mut entry = entry.lock();
            if entry.dirty && !entry.ended {
                self.save(&mut entry);
            }
        }
    }

    /// Ends the receipt of task `task_id` prepared at `prepared_at` (not a newer task of
    /// the same id): it waits in `pending/` for the next report.
    pub fn end(&self, task_id: &str, prepared_at: Timestamp, at: Timestamp) {
        let live_path = self.paths.receipt(ReceiptKind::Live, task_id, 0);
        let ours = |l: &LocalReceipt| l.receipt.prepared_at == prepared_at;
        // The live entry stays findable until the pending file is written (a runner asks
        // for the receipt the moment `mop run` returns); `find` waits on its lock meanwhile.
        let entry = self.entry(task_id).filter(|e| ours(&e.lock().local));
        let mut guard = entry.as_ref().map(|e| e.lock());
        let ended_at = |local: &LocalReceipt| Some(at.max(local.receipt.prepared_at));
        let local = match guard.as_deref_mut() {
            Some(live) => {
                live.ended = true;
                live.local.receipt.ended_at = ended_at(&live.local);
                Some(live.local.clone())
            }
            None => read_json(&live_path).filter(ours),
        };
        let forget = || {
            let mut map = self.live.lock();
            // Only this task's entry: a new task of the same id may have begun meanwhile.
            if let Some(e) = &entry
                && map.get(task_id).is_some_and(|m| Arc::ptr_eq(m, e))
            {
                map.remove(task_id);
            }
        };
        let Some(mut local) = local else {
            forget();
            return;
        };
        // Never written while it ran (a short task): nothing to remove afterwards.
        let had_file = guard.as_ref().is_none_or(|l| l.saved_at_least_once);
        local.receipt.ended_at = ended_at(&local);
        let r = &local.receipt;
        let path = self
            .paths
            .receipt(ReceiptKind::Pending, task_id, micros(r.prepared_at));
        match write_json(&path, &local) {
            Ok(()) => {
                // Unless a new task of the same id has saved its own there since.
                if had_file && read_json(&live_path).is_none_or(|l| ours(&l)) {
                    let _ = std::fs::remove_file(&live_path);
                }
                self.ended.notify_one();
            }
            Err(e) => {
                tracing::warn!(task = task_id, path = %path.display(), error = %e, "cannot queue the task's receipt for reporting")
            }
        }
        forget();
    }

    /// After a restart: the receipts of tasks still live are taken back, the others (their
    /// task ended while the daemon was down) are ended now (their end time is when the
    /// daemon noticed).
    pub fn recover(&self, live_tasks: &[String]) {
        let dir = self.paths.receipt_dir(ReceiptKind::Live);
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            let Some(local) = read_json(&path) else {
                tracing::warn!(path = %path.display(), "unreadable receipt removed");
                let _ = std::fs::remove_file(&path);
                continue;
            };
            let (id, prepared_at) = (local.receipt.task_id.clone(), local.receipt.prepared_at);
            if path != self.paths.receipt(ReceiptKind::Live, &id, 0) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let entry = Live::new(local);
            entry.lock().saved_at_least_once = true;
            self.live.lock().insert(id.clone(), entry);
            if !live_tasks.contains(&id) {
                self.end(&id, prepared_at, Timestamp::now());
            }
        }
    }

    /// A task's receipt: its live one, else the newest kept.
    pub fn find(&self, task_id: &str) -> Option<LocalReceipt> {
        if let Some(entry) = self.entry(task_id) {
            return Some(entry.lock().local.clone());
        }
        let mut newest: Option<(String, PathBuf)> = None;
        for kind in [
            ReceiptKind::Pending,
            ReceiptKind::Sent,
            ReceiptKind::Refused,
        ] {
            for e in std::fs::read_dir(self.paths.receipt_dir(kind))
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = e.file_name().to_string_lossy().into_owned();
                // `<20 digits>-<task id>.json`, the id exactly (`b` is not `a-b`).
                let is_it = name
                    .strip_suffix(".json")
                    .and_then(|n| n.split_at_checked(20))
                    .is_some_and(|(stamp, rest)| {
                        stamp.bytes().all(|b| b.is_ascii_digit())
                            && rest.strip_prefix('-') == Some(task_id)
                    });
                if is_it && newest.as_ref().is_none_or(|(n, _)| *n < name) {
                    newest = Some((name, e.path()));
                }
            }
        }
        read_json(&newest?.1)
    }

    /// Receipts waiting to be reported, oldest first; one with a store still queued on
    /// this host waits until that store is sent (so the server counts what it became).
    fn reportable(&self) -> Vec<(PathBuf, Receipt)> {
        self.pending()
            .into_iter()
            .filter(|(_, r)| {
                !r.activity
                    .stores
                    .iter()
                    .any(|e| e.outcome == StoreEventOutcome::Queued)
            })
            .collect()
    }

    /// Receipts waiting to be reported, oldest first.
    fn pending(&self) -> Vec<(PathBuf, Receipt)> {
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(self.paths.receipt_dir(ReceiptKind::Pending))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
        files.sort();
        files
            .into_iter()
            .filter_map(|p| match read_json(&p) {
                Some(l) => Some((p, l.receipt)),
                None => {
                    tracing::warn!(path = %p.display(), "unreadable receipt removed");
                    let _ = std::fs::remove_file(&p);
                    None
                }
            })
            .collect()
    }

    /// Moves a pending receipt on.
    fn mark(&self, path: &std::path::Path, kind: ReceiptKind) {
        let Some(name) = path.file_name() else { return };
        let dir = self.paths.receipt_dir(kind);
        let moved =
            crate::files::make_dir(&dir).and_then(|_| std::fs::rename(path, dir.join(name)));
        if let Err(e) = moved {
            tracing::warn!(path = %path.display(), error = %e, "cannot move a reported receipt");
        }
    }

    /// How many receipts wait, and how many the server refused.
    pub fn counts(&self) -> (usize, usize) {
        let count = |kind| {
            std::fs::read_dir(self.paths.receipt_dir(kind))
                .map(|d| d.flatten().count())
                .unwrap_or(0)
        };
        (count(ReceiptKind::Pending), count(ReceiptKind::Refused))
    }

    /// How reporting goes.
    pub fn report_state(&self) -> ReportState {
        self.report.lock().clone()
    }

    /// Removes the oldest receipts past `keep` (of each kind) or `keep_days`.
    pub fn rotate(&self, keep: usize, keep_days: u64) {
        let cutoff = micros(Timestamp::now()) - keep_days.min(100_000) as i64 * 86_400_000_000;
        for kind in [
            ReceiptKind::Sent,
            ReceiptKind::Pending,
            ReceiptKind::Refused,
        ] {
            let mut names: Vec<(String, PathBuf)> = std::fs::read_dir(self.paths.receipt_dir(kind))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect();
            names.sort();
            // Each kind is capped, waiting ones too: a server away for long cannot fill
            // the state directory.
            let over = names.len().saturating_sub(keep);
            for (i, (name, path)) in names.iter().enumerate() {
                let prepared: i64 = name
                    .split('-')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                if i < over || prepared < cutoff {
                    if kind == ReceiptKind::Pending {
                        self.report.lock().dropped += 1;
                        tracing::warn!(receipt = %name, keep, keep_days, "receipt dropped unreported: past receipts.keep or receipts.keep_days");
                    }
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }

    /// Sends every pending receipt, in batches per workspace (at most [`MAX_BATCH`]
    /// receipts and about [`MAX_BATCH_BYTES`] each). A workspace whose report fails for a
    /// reason that is not the receipts' own (the server away, the token refused) keeps its
    /// receipts for the next round; the others are still sent. The first such failure is
    /// returned.
    async fn report_once(&self, state: &State) -> Result<usize, ClientError> {
        let mut by_ws: BTreeMap<String, Vec<(PathBuf, Receipt)>> = BTreeMap::new();
        for (path, r) in self.reportable() {
            by_ws
                .entry(r.workspace.clone())
                .or_default()
                .push((path, r));
        }
        let client = state.client();
        let (mut sent, mut failure) = (0, None);
        for (ws, items) in by_ws {
            match self.report_workspace(&*client, &ws, &items).await {
                Ok(n) => sent += n,
                Err(e) => {
                    tracing::warn!(workspace = %ws, error = %e, "cannot report this workspace's receipts now");
                    failure.get_or_insert(e);
                }
            }
        }
        failure.map_or(Ok(sent), Err)
    }

    async fn report_workspace(
        &self,
        client: &dyn crate::client::CardServer,
        ws: &str,
        items: &[(PathBuf, Receipt)],
    ) -> Result<usize, ClientError> {
        let mut sent = 0;
        for chunk in batches(items) {
            let batch = ReceiptBatch {
                receipts: chunk.iter().map(|(_, r)| r.clone()).collect(),
            };
            match client.report_receipts(ws, &batch).await {
                Ok(answer) => {
                    tracing::info!(workspace = %ws, accepted = answer.accepted, duplicates = answer.duplicates,
                        too_old = answer.too_old, "receipts reported");
                    for (path, _) in chunk {
                        self.mark(path, ReceiptKind::Sent);
                    }
                    sent += chunk.len();
                }
                Err(e) if refused(&e) => {
                    // One bad receipt must not hold back the others: each alone.
                    for (path, r) in chunk {
                        let one = ReceiptBatch {
                            receipts: vec![r.clone()],
                        };
                        match client.report_receipts(ws, &one).await {
                            Ok(_) => {
                                self.mark(path, ReceiptKind::Sent);
                                sent += 1;
                            }
                            Err(e) if refused(&e) => {
                                tracing::warn!(workspace = %ws, task = %r.task_id, error = %e, "the server refused a receipt; kept in receipts/refused");
                                self.mark(path, ReceiptKind::Refused);
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }
}

/// Consecutive runs of at most [`MAX_BATCH`] receipts and about [`MAX_BATCH_BYTES`] (a
/// larger receipt goes alone).
fn batches(items: &[(PathBuf, Receipt)]) -> Vec<&[(PathBuf, Receipt)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (_, r)) in items.iter().enumerate() {
        let size = serde_json::to_vec(r).map_or(0, |v| v.len());
        if i > start && (i - start == MAX_BATCH || bytes + size > MAX_BATCH_BYTES) {
            out.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// The server answered that this receipt is at fault for good: too large (413), or
/// refused by its rules (422). A 400 (a body the server cannot read, as after a daemon
/// upgrade the server does not know yet) is tried again later.
fn refused(e: &ClientError) -> bool {
    matches!(e, ClientError::Status { status, .. } if matches!(status, 413 | 422))
}

/// Writes running receipts with unwritten changes every [`FLUSH_EVERY`], and once more
/// when the daemon stops.
pub async fn flusher(receipts: Arc<Receipts>, mut stop: watch::Receiver<bool>) {
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(FLUSH_EVERY) => false,
            _ = stop.changed() => true,
        };
        let r = receipts.clone();
        let _ = tokio::task::spawn_blocking(move || r.flush()).await;
        if stopping {
            return;
        }
    }
}

/// How long the reporter waits after a task ends for others to end too.
const GATHER: Duration = Duration::from_secs(1);
/// How often kept receipts are rotated (a directory scan each).
const ROTATE_EVERY: Duration = Duration::from_secs(60);

/// Reports ended tasks' receipts: shortly after a task ends and every
/// `receipts.report_interval_secs`, with exponential backoff (up to ten minutes) while
/// reports fail. Also rotates the kept receipts.
pub async fn reporter(state: Arc<State>, receipts: Arc<Receipts>, mut stop: watch::Receiver<bool>) {
    let mut failures = 0u32;
    let mut last_rotation = None;
    loop {
        let config = state.config();
        let interval = config.receipts.report_interval_secs.max(1);
        let wait = if failures == 0 {
            interval
        } else {
            interval.saturating_mul(1 << failures.min(10)).min(600)
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(wait)) => {}
            _ = receipts.ended.notified(), if failures == 0 => {
                // Tasks end in bursts on a busy host: gather them into one report.
                tokio::select! {
                    _ = tokio::time::sleep(GATHER) => {}
                    _ = stop.changed() => return,
                }
            }
            _ = stop.changed() => return,
        }
        let (keep, keep_days) = (config.receipts.keep, config.receipts.keep_days);
        let r = receipts.clone();
        let rotate = last_rotation.is_none_or(|t: Instant| t.elapsed() >= ROTATE_EVERY);
        if rotate {
            last_rotation = Some(Instant::now());
        }
        if rotate {
            let _ = tokio::task::spawn_blocking(move || r.rotate(keep, keep_days)).await;
        }
        match receipts.report_once(&state).await {
            Ok(sent) => {
                failures = 0;
                let mut report = receipts.report.lock();
                report.last_error = None;
                if sent > 0 {
                    report.last_reported_at = Some(Timestamp::now());
                }
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, failures, "cannot report receipts now; retrying with backoff");
                receipts.report.lock().last_error = Some(e.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mop_proto::receipts::{GetEvent, RECEIPT_SCHEMA};

    fn receipt(task: &str, prepared_at: Timestamp) -> Receipt {
        Receipt {
            schema: RECEIPT_SCHEMA.into(),
            task_id: task.into(),
            workspace: "acme".into(),
            host: "h".into(),
            generation: "g".into(),
            profile: "default".into(),
            user_id: None,
            asset_id: None,
            project_id: None,
            agent: None,
            prepared_at,
            ended_at: None,
            cards: vec![],
            cards_unlisted: 0,
            left_out: [0; 3],
            activity: Activity::default(),
            outcome: None,
            exit_code: None,
            capture: None,
        }
    }

    #[test]
    fn a_receipt_moves_from_live_to_pending_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::under(dir.path());
        let receipts = Receipts::open(&paths).unwrap();
        let t0 = Timestamp::now();
        receipts.begin(1000, receipt("t1", t0));
        receipts.begin(1000, receipt("t2", t0));
        receipts.record("t1", t0, |a| {
            a.gets.push(GetEvent {
                at: t0,
                id: mop_cards::CardId::from_uuid(mop_cards::Uuid::nil()),
                found: false,
            })
        });
        // Written at the next flush, not at once (a task that ends first never writes one).
        let on_disk = |id: &str| read_json(&paths.receipt(ReceiptKind::Live, id, 0));
        assert!(on_disk("t1").is_none());
        receipts.flush();
        assert_eq!(on_disk("t1").unwrap().receipt.activity.gets.len(), 1);
        // An agent of an ended task cannot write into a new task that reuses its id.
        receipts.record("t1", t0 - jiff::SignedDuration::from_secs(1), |a| {
            a.unlisted += 1
        });
        assert_eq!(receipts.find("t1").unwrap().receipt.activity.unlisted, 0);
        // A restart: t1 still runs, t2 ended while the daemon was down.
        let again = Receipts::open(&paths).unwrap();
        assert_eq!(again.key, receipts.key, "the key is kept");
        again.recover(&["t1".to_owned()]);
        assert_eq!(again.find("t1").unwrap().receipt.activity.gets.len(), 1);
        assert_eq!(again.counts(), (1, 0));
        let t2 = again.find("t2").unwrap();
        assert!(t2.receipt.ended_at.is_some());
        // Ending another task of the same id (prepared at another time) ends nothing.
        again.end(
            "t1",
            t0 - jiff::SignedDuration::from_secs(1),
            Timestamp::now(),
        );
        assert_eq!(again.counts(), (1, 0));
        assert!(again.find("t1").unwrap().receipt.ended_at.is_none());
        again.end("t1", t0, Timestamp::now());
        assert_eq!(again.counts(), (2, 0));
        let pending = again.pending();
        assert_eq!(pending.len(), 2);
        again.mark(&pending[0].0, ReceiptKind::Sent);
        assert_eq!(again.counts(), (1, 0));
        assert!(
            again.find(&pending[0].1.task_id).is_some(),
            "a sent receipt is still shown"
        );
    }

    #[test]
    fn rotation_keeps_the_newest_sent_and_drops_old_pending() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::under(dir.path());
        let receipts = Receipts::open(&paths).unwrap();
        let now = Timestamp::now();
        for i in 0..5 {
            let at = now - jiff::SignedDuration::from_secs(60 * (5 - i));
            receipts.begin(0, receipt(&format!("s{i}"), at));
            receipts.end(&format!("s{i}"), at, now);
        }
        for (p, _) in receipts.pending() {
            receipts.mark(&p, ReceiptKind::Sent);
        }
        let old = now - jiff::SignedDuration::from_hours(24 * 40);
        receipts.begin(0, receipt("old", old));
        receipts.end("old", old, now);
        receipts.rotate(3, 30);
        assert!(receipts.find("s0").is_none() && receipts.find("s1").is_none());
        assert!(receipts.find("s4").is_some());
        assert!(receipts.find("old").is_none());
        assert_eq!(receipts.report_state().dropped, 1);
    }

    #[test]
    fn query_hashes_are_keyed_and_never_the_query() {
        let dir = tempfile::tempdir().unwrap();
        let a = Receipts::open(&Paths::under(&dir.path().join("a"))).unwrap();
        let b = Receipts::open(&Paths::under(&dir.path().join("b"))).unwrap();
        let q = "ORA-01555 on the ledger";
        assert_eq!(a.query_hash(q), a.query_hash(q));
        assert_ne!(
            a.query_hash(q),
            b.query_hash(q),
            "another host, another key"
        );
        assert_ne!(a.query_hash(q), mop_cards::sha256_hex(q.as_bytes()));
        assert_eq!(a.query_hash(q).len(), 64);
    }
}
