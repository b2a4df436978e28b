//! `mop mcp`: a task's memory as an MCP server over stdio.
//!
//! It runs inside the task's sandbox: every tool is one call on the task's agent socket
//! and the resources are the files of the task's read-only view. The protocol itself
//! (JSON-RPC framing, version negotiation, schemas) is the `rmcp` SDK's.
//!
//! - Tools: `memory_retrieve`, `memory_get`, `memory_list`, `memory_store`,
//!   `memory_feedback`. Each answers
//!   in text for the model, ending with a line on what the task's memory covers, and in
//!   structured JSON (the agent socket's own answer) for programs.
//! - Resources: `MEMORY.md` and each mounted card, as `mop://memory/<path in the view>`.
//!
//! Card text is data: it only ever travels inside JSON strings, and nothing here logs it.
//! What the server reaches is behind [`Memory`], so the JSON-RPC side is fuzzed and unit
//! tested without a daemon.

mod sandbox;
mod server;

pub use sandbox::SandboxMemory;
pub use server::{MemoryServer, TaskScope, URI_PREFIX};

use std::future::Future;
use std::pin::Pin;

use mop_cards::CardId;
use mop_proto::client::ControlError;
use mop_proto::{
    AgentStoreRequest, AgentStoreResponse, FeedbackRequest, FeedbackResponse, ListResponse,
    RetrieveRequest, RetrieveResponse,
};

/// A boxed future, as [`Memory`]'s methods return.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the MCP server reaches: the task's agent socket and its view.
pub trait Memory: Send + Sync + 'static {
    /// Searches every card the task may see.
    fn retrieve(&self, req: RetrieveRequest) -> Fut<'_, Result<RetrieveResponse, ControlError>>;
    /// One card's file.
    fn get(&self, id: CardId) -> Fut<'_, Result<Vec<u8>, ControlError>>;
    /// The mounted cards.
    fn list(&self) -> Fut<'_, Result<ListResponse, ControlError>>;
    /// Proposes a card.
    fn store(&self, req: AgentStoreRequest) -> Fut<'_, Result<AgentStoreResponse, ControlError>>;
    /// The agent's verdict on a card.
    fn feedback(&self, req: FeedbackRequest) -> Fut<'_, Result<FeedbackResponse, ControlError>>;
    /// A file of the view, by its path relative to the view's top (already checked to be
    /// `MEMORY.md` or a mounted card's path).
    fn read_view(&self, rel: &str) -> Fut<'_, std::io::Result<Vec<u8>>>;
}

/// Serves `memory` over stdin and stdout until the client closes stdin.
pub async fn serve_stdio<M: Memory>(memory: M, scope: TaskScope) -> Result<(), String> {
    use rmcp::ServiceExt;
    let running = MemoryServer::new(memory, scope)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("MCP session did not start: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| format!("MCP session ended abnormally: {e}"))?;
    Ok(())
}
