//! A task's agent socket: HTTP in front of the task's memory ([`crate::agent`], where every
//! decision is made). The handlers parse requests, call it, and turn its answers and
//! [`AgentError`]s into responses.
//!
//! The socket lives in `<runtime_dir>/t/<random>/`; the sandbox binds that directory, so
//! after a daemon restart the socket is simply created again in the same place. It takes
//! connections from the task owner's uid only (the sandboxed agent runs as its runner), and
//! at most `sockets.agent_max_connections` of them: an agent that opens thousands only
//! closes its own idle ones.
//!
//! Must not decide anything about memory: [`crate::agent`] does.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use mop_proto::routes::agent;
use mop_proto::sync::StoreOutcome;
use mop_proto::{AgentStoreRequest, FeedbackRequest, RetrieveRequest};
use tokio::net::UnixListener;

use super::{Admit, CheckedListener, error, error_with_code, guarded, json_required};
use crate::agent::{AgentError, TaskMemory};
use crate::files::make_dir;
use crate::paths::AGENT_SOCKET;
use crate::tasks::{AgentSockets, Task, Tasks};

/// Opens and serves the agent sockets of tasks.
#[derive(Clone)]
pub struct AgentServer {
    tasks: Arc<Tasks>,
}

impl AgentServer {
    /// Serves the sockets of `tasks`' tasks.
    pub fn new(tasks: Arc<Tasks>) -> AgentServer {
        AgentServer { tasks }
    }
}

impl AgentSockets for AgentServer {
    fn open(&self, task: Arc<Task>) -> std::io::Result<()> {
        let lease = task.lease();
        make_dir(&lease.socket_dir)?;
        let path = lease.socket_dir.join(AGENT_SOCKET);
        let _ = std::fs::remove_file(&path);
        let listener =
            CheckedListener::new(UnixListener::bind(&path)?, Admit::Owner(lease.owner_uid));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))?;
        let limits = self.tasks.state().config().socket_limits(true);
        let mut stop = task.stopped();
        let memory = Arc::new(TaskMemory::new(self.tasks.clone(), task));
        let app = guarded(
            Router::new()
                .route(agent::CARDS.template(), get(list))
                .route(agent::CARD.template(), get(card))
                .route(agent::RETRIEVE.template(), post(retrieve))
                .route(agent::STORE.template(), post(store))
                .route(agent::STORE_STATUS.template(), get(store_status))
                .route(agent::FEEDBACK.template(), post(feedback))
                .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") }),
        )
        .with_state(memory);
        tokio::spawn(mop_serve::serve(listener, app, limits, async move {
            let _ = stop.wait_for(|s| *s).await;
        }));
        Ok(())
    }
}

type Memory = State<Arc<TaskMemory>>;

/// The answer to an [`AgentError`].
fn refusal(e: AgentError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    error_with_code(status, e.code(), e.to_string())
}

/// `GET /v1/cards`.
async fn list(State(m): Memory) -> Response {
    m.list()
        .await
        .map_or_else(refusal, |r| Json(r).into_response())
}

/// `GET /v1/cards/{id}`: the card file.
async fn card(State(m): Memory, UrlPath(id): UrlPath<String>) -> Response {
    match m.card(&id).await {
        Ok(bytes) => {
            let mut r = Response::new(axum::body::Body::from(bytes));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/markdown; charset=utf-8"),
            );
            r
        }
        Err(e) => refusal(e),
    }
}

/// `POST /v1/retrieve`.
async fn retrieve(State(m): Memory, body: Bytes) -> Response {
    let req: RetrieveRequest = match json_required(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    m.retrieve(req)
        .await
        .map_or_else(refusal, |r| Json(r).into_response())
}

/// `POST /v1/store`: 200 with the server's answer, or 202 when the host queued it.
async fn store(State(m): Memory, body: Bytes) -> Response {
    let req: AgentStoreRequest = match json_required(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    match m.store(req).await {
        Ok(r) if r.outcome == StoreOutcome::Queued => {
            (StatusCode::ACCEPTED, Json(r)).into_response()
        }
        Ok(r) => Json(r).into_response(),
        Err(e) => refusal(e),
    }
}

/// `GET /v1/stores/{id}`: where one of this task's queued stores stands.
async fn store_status(State(m): Memory, UrlPath(id): UrlPath<String>) -> Response {
    m.store_status(id)
        .await
        .map_or_else(refusal, |r| Json(r).into_response())
}

/// `POST /v1/feedback`.
async fn feedback(State(m): Memory, body: Bytes) -> Response {
    let req: FeedbackRequest = match json_required(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    m.feedback(req)
        .await
        .map_or_else(refusal, |r| Json(r).into_response())
}
