//! Agent ↔ daemon over a task's agent socket: retrieve, get, list, store and feedback, and the
//! typed [`Agent`] client that `mop memory` and `mop mcp` both speak them through.

use std::path::{Path, PathBuf};

use mop_cards::{CardId, CardType};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::client::{ControlError, request_json, request_ok};
use crate::routes::agent as routes;
use crate::sync::{NewCard, StoreResponse};

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
    /// The inherited workspace it comes from; absent for the task's own workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Path inside the memory directory when mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mounted_at: Option<String>,
    /// BM25 score, for retrieval hits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f32>,
}

impl AgentCard {
    /// What a listing of the card says before its title (where no title can imitate or
    /// push it aside): `unverified`, and `from <workspace>` for an inherited card.
    pub fn marks(&self) -> Vec<String> {
        let mut marks = Vec::new();
        if self.unverified {
            marks.push("unverified".to_owned());
        }
        if let Some(w) = &self.workspace {
            marks.push(format!("from {w}"));
        }
        marks
    }
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

/// What binding a store asked for that its task cannot give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnboundScope {
    /// A personal card, in a task without a user.
    #[error("this task has no user")]
    NoUser,
    /// An asset card, in a task without an asset.
    #[error("this task has no asset")]
    NoAsset,
    /// A project card, in a task without a project.
    #[error("this task has no project")]
    NoProject,
}

/// Which of its task's own scopes a store binds its card to; each is the task's, never a
/// name the agent chooses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Binding {
    /// To the task's user: a personal card.
    pub personal: bool,
    /// To the task's asset.
    pub asset: bool,
    /// To the task's project.
    pub project: bool,
}

impl UnboundScope {
    /// The store's option that asked for it, as the MCP tool names it (`personal`,
    /// `asset`, `project`; `mop memory store` puts `--` before it).
    pub fn option(self) -> &'static str {
        match self {
            UnboundScope::NoUser => "personal",
            UnboundScope::NoAsset => "asset",
            UnboundScope::NoProject => "project",
        }
    }
}

impl AgentStoreRequest {
    /// The store of `card` bound as `want` asks to the scopes of `task`: how
    /// `mop memory store`, the MCP tool and native capture build one alike.
    pub fn bound(
        mut card: crate::sync::NewCard,
        want: Binding,
        task: &mop_cards::Viewer<'_>,
    ) -> Result<AgentStoreRequest, UnboundScope> {
        let pick = |wanted: bool, value: Option<&str>, missing: UnboundScope| match (wanted, value)
        {
            (false, _) => Ok(None),
            (true, Some(v)) => Ok(Some(v.to_owned())),
            (true, None) => Err(missing),
        };
        card.scope = mop_cards::Scope {
            user_id: pick(want.personal, task.user, UnboundScope::NoUser)?,
            asset_id: pick(want.asset, task.asset, UnboundScope::NoAsset)?,
            project_id: pick(want.project, task.project, UnboundScope::NoProject)?,
            agent: None,
        };
        Ok(AgentStoreRequest { card })
    }
}

/// The answer to a store, as the agent sees it.
pub type AgentStoreResponse = StoreResponse;

/// Where a store stands (`GET /v1/stores/{store_id}` on an agent socket; the task's own
/// stores only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStatus {
    /// The store's id.
    pub store_id: String,
    /// `queued` (waiting on this host for the server), `stored` (the server took it:
    /// see `outcome`), `refused` (the server would not take it: see `code` and
    /// `message`), or `dropped` (queued longer than the host keeps stores).
    pub state: String,
    /// What the server did, once stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<crate::sync::StoreOutcome>,
    /// The card, once stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CardId>,
    /// When it was queued.
    pub queued_at: jiff::Timestamp,
    /// When it was sent or given up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<jiff::Timestamp>,
    /// Tries so far.
    pub attempts: u32,
    /// A refusal's HTTP status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// A refusal's error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// What happened and what to do, in a sentence.
    pub message: String,
}

/// `POST /v1/feedback` on an agent socket: the agent's word on a card its task can see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    /// The card.
    pub id: CardId,
    /// Whether it helped, is wrong, or is outdated.
    pub verdict: crate::receipts::Verdict,
    /// What the agent found, in a sentence (at most
    /// [`crate::receipts::MAX_FEEDBACK_NOTE`] characters; screened for credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The answer to a feedback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackResponse {
    /// The card.
    pub id: CardId,
    /// The verdict recorded.
    pub verdict: crate::receipts::Verdict,
    /// True when it replaced this task's earlier verdict on the card.
    pub replaced: bool,
    /// What happens with it, in a sentence.
    pub note: String,
}

/// A task's agent socket, as seen from inside its sandbox.
#[derive(Debug, Clone)]
pub struct Agent {
    socket: PathBuf,
}

impl Agent {
    /// A client of the agent socket at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Agent {
        Agent {
            socket: socket.into(),
        }
    }

    /// The socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, ControlError> {
        request_ok(&self.socket, method, path, body).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ControlError> {
        request_json(&self.socket, method, path, body).await
    }

    /// Searches every card the task may see.
    pub async fn retrieve(&self, req: &RetrieveRequest) -> Result<RetrieveResponse, ControlError> {
        let body = serde_json::to_vec(req).expect("requests serialize");
        self.call("POST", &routes::RETRIEVE.path(&[]), Some(body))
            .await
    }

    /// One card's file (front matter and body), as Markdown bytes.
    pub async fn get(&self, id: &CardId) -> Result<Vec<u8>, ControlError> {
        self.raw("GET", &routes::CARD.path(&[&id.to_string()]), None)
            .await
    }

    /// The mounted cards, and how many the task may see.
    pub async fn list(&self) -> Result<ListResponse, ControlError> {
        self.call("GET", &routes::CARDS.path(&[]), None).await
    }

    /// Proposes a card; the daemon adds the task's provenance.
    pub async fn store(&self, req: &AgentStoreRequest) -> Result<AgentStoreResponse, ControlError> {
        let body = serde_json::to_vec(req).expect("requests serialize");
        self.call("POST", &routes::STORE.path(&[]), Some(body))
            .await
    }

    /// Says whether a card the task can see helped, is wrong or is outdated.
    pub async fn feedback(&self, req: &FeedbackRequest) -> Result<FeedbackResponse, ControlError> {
        let body = serde_json::to_vec(req).expect("requests serialize");
        self.call("POST", &routes::FEEDBACK.path(&[]), Some(body))
            .await
    }

    /// Where one of this task's stores stands (by the `store_id` its answer gave).
    pub async fn store_status(&self, store_id: &str) -> Result<StoreStatus, ControlError> {
        self.call("GET", &routes::STORE_STATUS.path(&[store_id]), None)
            .await
    }
}
