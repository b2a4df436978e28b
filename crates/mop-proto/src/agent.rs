//! Agent ↔ daemon over a task's agent socket: retrieve, get, list and store, as
//! `mop memory` (and later `mop mcp`) speaks them.

use mop_cards::{CardId, CardType};
use serde::{Deserialize, Serialize};

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
