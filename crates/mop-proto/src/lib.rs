//! What mop's processes say to each other, defined once:
//!
//! - runner → daemon (control socket): [`PrepareRequest`] and the [`Plan`] it returns,
//!   leases, task lists;
//! - agent → daemon (the task's agent socket): retrieve, get, list, store;
//! - sandbox [`profile`]s: how a task's sandbox looks, loaded and checked by the daemon
//!   (which knows the directories a profile must never expose) and applied by the runner.

pub mod client;
pub mod profile;

use std::path::PathBuf;

use jiff::Timestamp;
use mop_cards::{CardId, CardType, NewCard, StoreResponse, TaskContext, TierCounts};
use serde::{Deserialize, Serialize};

pub use profile::{Bind, Limits, Profile, ProfileError, exposed_by};

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

/// A lease as the daemon holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// `run` or `ttl`.
    pub kind: String,
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
    /// `L0`, `L1` or `L2`.
    pub tier: String,
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

/// `POST /v1/retrieve` on an agent socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrieveRequest {
    /// Free text.
    pub query: String,
    /// Most hits (default 10, at most 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// A card as the agent commands show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCard {
    /// Id.
    pub id: CardId,
    /// Type.
    #[serde(rename = "type")]
    pub card_type: CardType,
    /// Title.
    pub title: String,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// True when the card is unverified.
    pub unverified: bool,
    /// Path inside the memory directory when mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mounted_at: Option<String>,
    /// BM25 score, for retrieval hits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f32>,
}

/// The answer to a retrieve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrieveResponse {
    /// Hits, best first.
    pub hits: Vec<AgentCard>,
    /// Cards the task may see (what was searched).
    pub searched: usize,
    /// Of those, how many are mounted.
    pub mounted: usize,
    /// One sentence on what was searched, and what to try when nothing matched.
    pub coverage: String,
}

/// The answer to a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListResponse {
    /// The mounted cards, best first.
    pub cards: Vec<AgentCard>,
    /// Cards the task may see in all.
    pub visible: usize,
}

/// `POST /v1/store` on an agent socket: the daemon adds the task's provenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStoreRequest {
    /// The card.
    pub card: NewCard,
}

/// The answer to a store, as the agent sees it.
pub type AgentStoreResponse = StoreResponse;
