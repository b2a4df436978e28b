//! The real [`Memory`]: the task's agent socket and its view directory, as `mop run`
//! mounts them.

use std::path::{Component, Path, PathBuf};

use mop_cards::CardId;
use mop_proto::client::ControlError;
use mop_proto::{
    Agent, AgentStoreRequest, AgentStoreResponse, ListResponse, RetrieveRequest, RetrieveResponse,
};

use super::{Fut, Memory};

/// The agent socket and the view of the task this process runs in.
pub struct SandboxMemory {
    agent: Agent,
    view: PathBuf,
}

impl SandboxMemory {
    /// The socket at `socket` and the view at `view`.
    pub fn new(socket: impl Into<PathBuf>, view: impl Into<PathBuf>) -> SandboxMemory {
        SandboxMemory {
            agent: Agent::new(socket),
            view: view.into(),
        }
    }
}

impl Memory for SandboxMemory {
    fn retrieve(&self, req: RetrieveRequest) -> Fut<'_, Result<RetrieveResponse, ControlError>> {
        Box::pin(async move { self.agent.retrieve(&req).await })
    }

    fn get(&self, id: CardId) -> Fut<'_, Result<Vec<u8>, ControlError>> {
        Box::pin(async move { self.agent.get(&id).await })
    }

    fn list(&self) -> Fut<'_, Result<ListResponse, ControlError>> {
        Box::pin(self.agent.list())
    }

    fn store(&self, req: AgentStoreRequest) -> Fut<'_, Result<AgentStoreResponse, ControlError>> {
        Box::pin(async move { self.agent.store(&req).await })
    }

    fn feedback(
        &self,
        req: mop_proto::FeedbackRequest,
    ) -> Fut<'_, Result<mop_proto::FeedbackResponse, ControlError>> {
        Box::pin(async move { self.agent.feedback(&req).await })
    }

    fn read_view(&self, rel: &str) -> Fut<'_, std::io::Result<Vec<u8>>> {
        let rel = rel.to_owned();
        Box::pin(async move {
            // The server passes only paths the daemon listed; this keeps that true even
            // if a caller forgets.
            if !Path::new(&rel)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
            {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a path inside the view",
                ));
            }
            tokio::fs::read(self.view.join(rel)).await
        })
    }
}
