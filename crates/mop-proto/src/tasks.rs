//! Runner ↔ daemon over the control socket: a task's prepare request, the reservation
//! and plan it is answered with, leases, and the task list.

use std::path::PathBuf;

use jiff::Timestamp;
use mop_cards::{CardId, TaskContext, Tier, TierCounts};
use serde::{Deserialize, Serialize};

use crate::profile::Profile;

/// How long a task's view lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LeaseRequest {
    /// As long as the runner process (`mop run`): identified by pid and start time, so a
    /// recycled pid does not keep a dead task's view alive.
    Run {
        /// The runner's pid.
        pid: u32,
        /// Its start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`).
        start_time: u64,
    },
    /// A bare `mop prepare`: until released or expired; `mop renew` extends it.
    Ttl {
        /// Seconds from now; the daemon's default (24 h) when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_secs: Option<u64>,
    },
}

/// `POST /v1/tasks` on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepareRequest {
    /// What the task is about.
    pub task: TaskContext,
    /// How long its view lives.
    pub lease: LeaseRequest,
    /// Sandbox profile name; the daemon's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The working directory `mop run` will bind into the sandbox (canonical): the
    /// daemon refuses one that holds or lies inside its own directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
}

/// `POST /v1/tasks/{id}/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// Seconds from now; the daemon's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
}

/// How a task's lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseKind {
    /// When its runner (`mop run`) is gone.
    Run,
    /// When its time to live passes, unless renewed or released first.
    Ttl,
}

impl LeaseKind {
    /// `run` or `ttl`, as the wire spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Run => "run",
            LeaseKind::Ttl => "ttl",
        }
    }
}

impl std::fmt::Display for LeaseKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lease as the daemon holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// How it ends.
    pub kind: LeaseKind,
    /// The runner pid of a `run` lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Expiry of a `ttl` lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
}

/// One card in a task's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanCard {
    /// Card id.
    pub id: CardId,
    /// Its tier.
    pub tier: Tier,
    /// Path inside the view.
    pub path: String,
}

/// What a prepare returns: everything a runner needs to start the sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Task id.
    pub task_id: String,
    /// Workspace.
    pub workspace: String,
    /// Server epoch of the generation the view was built from.
    pub epoch: String,
    /// Its revision.
    pub revision: u64,
    /// Its directory name (pinned while the task lives).
    pub generation: String,
    /// The task's view: MEMORY.md and the selected cards (read-only, host path).
    pub view_dir: PathBuf,
    /// The task's MEMORY.md (host path).
    pub memory_md: PathBuf,
    /// Directory holding the task's agent socket (bound into the sandbox).
    pub agent_socket_dir: PathBuf,
    /// The agent socket (host path).
    pub agent_socket: PathBuf,
    /// Lease.
    pub lease: LeaseInfo,
    /// Expiry of a `ttl` lease (also in `lease`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// The resolved sandbox profile.
    pub profile: Profile,
    /// Mounted cards, best first.
    pub cards: Vec<PlanCard>,
    /// Selected cards per tier (mounted or not).
    pub selected: [usize; 3],
    /// Selected cards the mount cap left out, per tier.
    pub left_out: [usize; 3],
}

impl Plan {
    /// Counts as [`TierCounts`].
    pub fn selected_counts(&self) -> TierCounts {
        TierCounts(self.selected)
    }
}

/// The first document of a `mop run` prepare: where the task's view and agent socket
/// will be, sent before the cards are selected, so the runner can start setting up the
/// sandbox while the daemon fills the view. The sandboxed command must not start before
/// the [`Plan`] (the second document) arrives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    /// Task id.
    pub task_id: String,
    /// The (still empty) view directory.
    pub view_dir: PathBuf,
    /// Directory of the agent socket.
    pub agent_socket_dir: PathBuf,
    /// The resolved sandbox profile.
    pub profile: Profile,
}

/// A line of a held prepare answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrepareEvent {
    /// Directories reserved.
    Reserved(Box<Reservation>),
    /// The view is complete.
    Ready(Box<Plan>),
    /// Preparing failed after the reservation.
    Failed {
        /// Why.
        message: String,
    },
}

/// A task in `GET /v1/tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSummary {
    /// Task id.
    pub task_id: String,
    /// Workspace.
    pub workspace: String,
    /// Generation pinned.
    pub generation: String,
    /// Revision.
    pub revision: u64,
    /// Lease.
    pub lease: LeaseInfo,
    /// When it was prepared.
    pub created_at: Timestamp,
    /// Uid of the runner that prepared it.
    pub owner_uid: u32,
}
