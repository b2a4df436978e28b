//! The control socket's requests and answers, typed, and [`Control`]: the client `mop`
//! and `mopd`'s own commands use, so that no caller reads an answer as loose JSON.
//!
//! | request | answer |
//! |---|---|
//! | `GET /v1/status` | [`StatusReport`] |
//! | `POST /v1/workspaces/{ws}/sync` | [`SyncReply`] |
//! | `POST /v1/workspaces/{ws}/verify` [`VerifyRequest`] | [`VerifyReply`] |
//! | `POST /v1/workspaces/{ws}/ack-epoch` | [`AckEpochReply`] |
//! | `POST /v1/tasks` [`PrepareRequest`] | [`Plan`], or for a `mop run` lease a held answer of [`PrepareEvent`]s ([`HELD_PREPARE_TYPE`]) |
//! | `GET /v1/tasks` | `[`[`TaskSummary`]`]` |
//! | `DELETE /v1/tasks/{id}` | [`ReleaseReply`] |
//! | `POST /v1/tasks/{id}/renew` [`RenewRequest`] | [`LeaseInfo`] |
//! | `POST /v1/tasks/{id}/finish` [`FinishRequest`] | [`FinishReply`] |
//!
//! Errors are `{"error": <reason>, "message": …}` with an HTTP status; [`Control`] turns
//! them into [`ControlError::Answered`].

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use crate::client::ControlError;
use crate::client::{Hold, request_held, request_json};
use crate::receipts::Receipt;
use crate::routes::control as routes;
use crate::status::{ErrorKind, StatusReport, SyncResult};
use crate::tasks::{LeaseInfo, Plan, PrepareEvent, PrepareRequest, RenewRequest, TaskSummary};

/// The content type of the held answer to a `mop run` prepare: one JSON document per
/// line (newline-delimited JSON).
pub const HELD_PREPARE_TYPE: &str = "application/x-ndjson";

/// The answer to a forced sync.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncReply {
    /// The workspace.
    pub workspace: String,
    /// What the sync did.
    pub result: SyncResult,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
    /// The failure, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `POST /v1/workspaces/{ws}/verify`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    /// Fetch bad or missing objects again and publish a rebuilt generation.
    #[serde(default)]
    pub repair: bool,
}

/// What a re-hash of a pool found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Objects hashed.
    pub objects_checked: usize,
    /// Objects whose content did not match their name (now in quarantine/).
    pub bad_objects: Vec<String>,
    /// Objects the current generation needs that the pool lacks.
    pub missing_objects: Vec<String>,
    /// Generation files whose content does not match the manifest.
    pub damaged_files: Vec<String>,
    /// The current generation.
    pub current: Option<String>,
}

impl VerifyReport {
    /// True when nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.bad_objects.is_empty()
            && self.missing_objects.is_empty()
            && self.damaged_files.is_empty()
    }
}

/// The answer to a verify.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReply {
    /// The workspace.
    pub workspace: String,
    /// What the re-hash found.
    pub report: VerifyReport,
    /// The generation a repair published, if it did.
    pub repaired_generation: Option<String>,
}

/// The answer to an ack-epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckEpochReply {
    /// The workspace.
    pub workspace: String,
    /// Always true in a success answer.
    pub acknowledged: bool,
}

/// The answer to a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReply {
    /// The task.
    pub task_id: String,
    /// Always true in a success answer.
    pub released: bool,
}

/// `POST /v1/tasks/{id}/finish`, by the task's runner before it releases the task: how
/// the task ended, and what `mop run` captured of the agent CLI's own memory and of the
/// working directory's memory files. The captured cards become stores of the task, on the
/// same path as the agent's own (`mop memory store`): the lease's provenance, the quota,
/// screening, the same-lesson rule and the tombstones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishRequest {
    /// How the task ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<crate::receipts::Outcome>,
    /// The agent's exit status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// What was captured, when `mop run` ran a primed agent CLI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<crate::receipts::Capture>,
    /// The captured cards, to store (at most [`MAX_CAPTURED`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cards: Vec<CapturedCard>,
}

/// Most cards one finish stores: what a task's quota allows is the server's to say, this
/// only keeps one request bounded.
pub const MAX_CAPTURED: usize = 100;

/// A card `mop run` captured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapturedCard {
    /// The card (its scope empty: `personal` binds it).
    pub card: crate::sync::NewCard,
    /// Bound to the task's user (a Claude Code memory of type `user`).
    #[serde(default)]
    pub personal: bool,
}

/// The answer to a finish: what became of each captured card, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishReply {
    /// The task.
    pub task_id: String,
    /// One event per captured card, as the receipt records it.
    pub stores: Vec<crate::receipts::StoreEvent>,
}

/// A held `mop run` prepare: the reservation, then the plan. The task lives as long as
/// this value (or the process) does.
pub struct HeldPrepare(Hold);

impl HeldPrepare {
    /// The next event, or `None` when the daemon ended the answer.
    pub async fn next(&mut self) -> Result<Option<PrepareEvent>, ControlError> {
        let Some(line) = self.0.next().await? else {
            return Ok(None);
        };
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| ControlError::Unreadable(format!("a prepare event does not parse: {e}")))
    }
}

/// The control socket's client.
#[derive(Debug, Clone)]
pub struct Control {
    socket: PathBuf,
}

impl Control {
    /// A client of the daemon listening on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Control {
        Control {
            socket: socket.into(),
        }
    }

    /// The socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ControlError> {
        request_json(&self.socket, method, path, body).await
    }

    fn json(body: &impl Serialize) -> Option<Vec<u8>> {
        Some(serde_json::to_vec(body).expect("requests serialize"))
    }

    /// The status report.
    pub async fn status(&self) -> Result<StatusReport, ControlError> {
        self.call("GET", &routes::STATUS.path(&[]), None).await
    }

    /// Syncs a workspace now and waits for the result.
    pub async fn sync(&self, ws: &str) -> Result<SyncReply, ControlError> {
        self.call("POST", &routes::SYNC.path(&[ws]), None).await
    }

    /// Re-hashes a workspace's pool, repairing it when asked.
    pub async fn verify(&self, ws: &str, repair: bool) -> Result<VerifyReply, ControlError> {
        self.call(
            "POST",
            &routes::VERIFY.path(&[ws]),
            Self::json(&VerifyRequest { repair }),
        )
        .await
    }

    /// Clears a workspace's new-epoch warning.
    pub async fn ack_epoch(&self, ws: &str) -> Result<AckEpochReply, ControlError> {
        self.call("POST", &routes::ACK_EPOCH.path(&[ws]), None)
            .await
    }

    /// Prepares a task with a TTL lease (`mop prepare`).
    pub async fn prepare(&self, req: &PrepareRequest) -> Result<Plan, ControlError> {
        self.call("POST", &routes::TASKS.path(&[]), Self::json(req))
            .await
    }

    /// Prepares a task with a run lease (`mop run`): the answer is held open.
    pub async fn prepare_held(&self, req: &PrepareRequest) -> Result<HeldPrepare, ControlError> {
        let (code, answer, hold) = request_held(
            &self.socket,
            "POST",
            &routes::TASKS.path(&[]),
            Self::json(req),
        )
        .await?;
        match hold {
            Some(h) if (200..300).contains(&code) => Ok(HeldPrepare(h)),
            _ => Err(ControlError::answered(code, &answer)),
        }
    }

    /// The live tasks.
    pub async fn tasks(&self) -> Result<Vec<TaskSummary>, ControlError> {
        self.call("GET", &routes::TASKS.path(&[]), None).await
    }

    /// Releases a task.
    pub async fn release(&self, task_id: &str) -> Result<ReleaseReply, ControlError> {
        self.call("DELETE", &routes::TASK.path(&[task_id]), None)
            .await
    }

    /// A task's receipt: what it was delivered and what its agent did (the live one while
    /// it runs, else the newest kept). Its runner, root and the daemon's user may read it.
    pub async fn receipt(&self, task_id: &str) -> Result<Receipt, ControlError> {
        self.call("GET", &routes::TASK_RECEIPT.path(&[task_id]), None)
            .await
    }

    /// Records how a task ended and stores what was captured at its end.
    pub async fn finish(
        &self,
        task_id: &str,
        req: &FinishRequest,
    ) -> Result<FinishReply, ControlError> {
        self.call(
            "POST",
            &routes::TASK_FINISH.path(&[task_id]),
            Self::json(req),
        )
        .await
    }

    /// Extends a TTL lease.
    pub async fn renew(
        &self,
        task_id: &str,
        ttl_secs: Option<u64>,
    ) -> Result<LeaseInfo, ControlError> {
        self.call(
            "POST",
            &routes::TASK_RENEW.path(&[task_id]),
            Self::json(&RenewRequest { ttl_secs }),
        )
        .await
    }
}
