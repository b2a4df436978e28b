//! The versioned report `mopd status` shows, as the control socket serves it (`GET
//! /v1/status`): the daemon, each workspace's sync state, live tasks, the sandbox tool, and
//! what is wrong with the next command to run. mopd also persists [`WorkspaceStatus`] in
//! its state directory.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Version of the JSON report; bumped when a field changes meaning or disappears.
pub const STATUS_SCHEMA: u32 = 1;

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// [`STATUS_SCHEMA`].
    pub schema: u32,
    /// True when no workspace is stale or failing.
    pub healthy: bool,
    /// One line, also sent to systemd as STATUS=.
    pub summary: String,
    /// The daemon itself.
    pub daemon: DaemonInfo,
    /// Each configured workspace.
    pub workspaces: Vec<WorkspaceStatus>,
    /// Tasks with live views.
    pub tasks: Vec<TaskInfo>,
    /// The sandbox tool.
    pub sandbox: SandboxInfo,
    /// What is wrong, with the next command to run.
    pub problems: Vec<Problem>,
    /// Things to know that do not make the daemon degraded (a new server epoch, …).
    pub warnings: Vec<Problem>,
    /// Task receipts waiting to be reported (absent from older daemons' reports).
    #[serde(default)]
    pub receipts: ReceiptsInfo,
    /// Agents' stores kept on this host until the server takes them (absent from older
    /// daemons' reports).
    #[serde(default)]
    pub stores: SpoolInfo,
}

/// The host's queue of stores the server could not take yet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpoolInfo {
    /// Stores waiting.
    pub queued: usize,
    /// Their bytes on disk.
    pub bytes: u64,
    /// When the oldest waiting one was queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_queued_at: Option<Timestamp>,
    /// Its age, in seconds.
    #[serde(default)]
    pub oldest_age_secs: u64,
    /// Stores sent from the queue since the daemon started.
    #[serde(default)]
    pub sent: u64,
    /// Stores dropped unsent since the daemon started (older than `spool.max_age_secs`).
    #[serde(default)]
    pub dropped: u64,
    /// Why the last replay failed, until one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Stores the server refused when they were replayed (newest first, at most 20 of
    /// those still kept on the host).
    #[serde(default)]
    pub refused: Vec<RefusedStore>,
}

/// A queued store the server refused on replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedStore {
    /// The store's id.
    pub store_id: String,
    /// Its workspace.
    pub workspace: String,
    /// Its task.
    pub task_id: String,
    /// The HTTP status.
    pub status: u16,
    /// The error code (`credential`, `rejected`, `store_quota`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// When.
    pub at: Timestamp,
}

/// How task receipts are being reported to the server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReceiptsInfo {
    /// Receipts of ended tasks not reported yet.
    pub pending: usize,
    /// Receipts the server refused (kept under the state directory, `receipts/refused`).
    pub refused: usize,
    /// Receipts dropped unreported since the daemon started (older than
    /// `receipts.keep_days`).
    pub dropped: u64,
    /// The last report the server took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reported_at: Option<Timestamp>,
    /// Why the last report failed, until one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The daemon process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonInfo {
    /// mopd version.
    pub version: String,
    /// Process id.
    pub pid: u32,
    /// When it started.
    pub started_at: Timestamp,
    /// Seconds since then.
    pub uptime_secs: u64,
    /// The config file in force.
    pub config_path: String,
    /// The server it syncs from (the first of `server_urls`).
    pub server_url: String,
    /// Every server it may sync from, in the order tried.
    #[serde(default)]
    pub server_urls: Vec<String>,
}

/// A task with a live view (filled in by task projection).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// Task id.
    pub task_id: String,
    /// Workspace.
    pub workspace: String,
    /// Generation its view was built from.
    pub generation: String,
    /// Lease kind and expiry.
    pub lease: String,
}

/// Whether bubblewrap is installed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// The `bwrap` `mop run` would trust (`host::find_bwrap`), if there is one.
    pub bwrap: Option<String>,
}

/// One problem or warning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// The workspace concerned, if one.
    pub workspace: Option<String>,
    /// What is wrong.
    pub message: String,
    /// The next command to run.
    pub next: String,
}

/// What the last sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncResult {
    /// A new generation was published (HTTP 200).
    Modified,
    /// Nothing changed (HTTP 304, or a 200 for the version already held).
    NotModified,
    /// The sync failed; see `last_error`.
    Failed,
}

/// The kind of the last error, which decides the advice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The server was not reached.
    Unreachable,
    /// The token was refused (401).
    Unauthorized,
    /// The workspace is not in the token's scope, or does not exist (404).
    NotFound,
    /// The server answered something the protocol does not allow.
    BadResponse,
    /// The manifest's revision is lower than the one held (rollback refused).
    Rollback,
    /// The pool quota would be exceeded.
    Quota,
    /// Local file-system trouble.
    Local,
    /// Any other server error status.
    Server,
}

impl ErrorKind {
    /// Its name on the wire (the status JSON) and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::NotFound => "not_found",
            ErrorKind::BadResponse => "bad_response",
            ErrorKind::Rollback => "rollback",
            ErrorKind::Quota => "quota",
            ErrorKind::Local => "local",
            ErrorKind::Server => "server",
        }
    }
}

/// One sync attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// When it finished.
    pub at: Timestamp,
    /// What it did.
    pub result: SyncResult,
    /// The manifest request's HTTP status, when one was answered.
    pub http_status: Option<u16>,
    /// The server that answered the manifest request; none when no server was reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

/// The last error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// When.
    pub at: Timestamp,
    /// Kind.
    pub kind: ErrorKind,
    /// Text (never card content or tokens).
    pub message: String,
    /// For a local failure an operator can fix at once, which one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<LocalCause>,
}

/// A local failure with a known fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalCause {
    /// The cache file system is full (ENOSPC).
    DiskFull,
    /// The cache file system is mounted read-only (EROFS).
    ReadOnly,
}

/// Counters since the daemon started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncStats {
    /// Manifest requests made.
    pub polls: u64,
    /// 304 answers.
    pub not_modified: u64,
    /// Generations published.
    pub generations: u64,
    /// Failed attempts.
    pub failures: u64,
    /// Manifests refused for a lower revision within the epoch.
    pub rollbacks_refused: u64,
    /// Answers from a replica behind the held generation (kept the held one, asked again).
    #[serde(default)]
    pub behind_answers: u64,
    /// Objects downloaded.
    pub objects_fetched: u64,
    /// Object bytes downloaded.
    pub object_bytes: u64,
    /// Bad objects found by re-hashing.
    pub objects_quarantined: u64,
}

/// One workspace's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceStatus {
    /// Name.
    pub workspace: String,
    /// Server database epoch of the current generation.
    pub epoch: Option<String>,
    /// Revision of the current generation.
    pub revision: Option<u64>,
    /// Current generation directory name.
    pub generation: Option<String>,
    /// Cards in it.
    pub cards: usize,
    /// Bytes the pool uses on disk.
    pub pool_bytes: u64,
    /// Last sync attempt.
    pub last_sync: Option<SyncRecord>,
    /// Last error (kept after recovery, for the record).
    pub last_error: Option<ErrorRecord>,
    /// Last time the server answered anything.
    pub last_reached: Option<Timestamp>,
    /// Failures since the last success.
    pub consecutive_failures: u32,
    /// Set when a new server epoch was accepted.
    pub epoch_warning: Option<String>,
    /// Counters.
    #[serde(default)]
    pub stats: SyncStats,
    /// The workspaces this one inherits, as its server said at the last poll (server.toml
    /// `[inheritance]`); its tasks get their cards too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherits: Vec<String>,
    /// The inherited workspaces' versions in the current generation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherited: Vec<mop_cards::InheritedVersion>,
    /// For an inherited pool: the configured workspaces that inherit it (it is synced for
    /// them, and no task of its own is served).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherited_by: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kind_names_are_their_wire_names() {
        for kind in [
            ErrorKind::Unreachable,
            ErrorKind::Unauthorized,
            ErrorKind::NotFound,
            ErrorKind::BadResponse,
            ErrorKind::Rollback,
            ErrorKind::Quota,
            ErrorKind::Local,
            ErrorKind::Server,
        ] {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::from(kind.as_str())
            );
        }
    }
}
