//! The control socket: HTTP/1.1 + JSON over `<runtime_dir>/mopd.sock` (0660, group `mop`
//! when it exists), with the requests and answers of `mop_proto::control`. Peers in
//! another user namespace, or in a nested pid namespace (every sandbox has one), are
//! refused at accept ([`super::Admit::Host`]): a sandboxed process that somehow reached
//! the socket cannot talk to the daemon.
//!
//! Runners (group `mop`) may read the status and prepare, list, renew and release their
//! own tasks. What changes the daemon for everyone — a forced sync, a repair, accepting a
//! new server epoch — needs root or the daemon's own user.
//!
//! Must not decide anything about tasks or workspaces itself: it checks who asks, then
//! calls [`crate::tasks`] and [`crate::workspaces`].

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{ConnectInfo, Path as UrlPath, State as AxumState};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use mop_proto::control::{
    AckEpochReply, FinishReply, FinishRequest, HELD_PREPARE_TYPE, MAX_CAPTURED, ReleaseReply,
    SyncReply, VerifyReply, VerifyRequest,
};
use mop_proto::routes::control;
use mop_proto::{LeaseRequest, PrepareEvent, PrepareRequest, RenewRequest};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use super::agent::AgentServer;
use super::{Admit, CheckedListener, HostIdentity, Peer, error, guarded, json_body, json_required};
use crate::state::State;
use crate::tasks::{TaskError, Tasks};
use crate::workspaces::Workspaces;

/// What the control API works on.
#[derive(Clone)]
pub struct ControlState {
    /// The daemon's state.
    pub state: Arc<State>,
    /// Live tasks.
    pub tasks: Arc<Tasks>,
    /// The workspaces' sync loops.
    pub workspaces: Arc<Workspaces>,
    /// Opens the agent sockets of prepared tasks.
    pub agents: AgentServer,
    /// Changes to true when the daemon stops.
    pub stopping: watch::Receiver<bool>,
}

/// Binds the control socket: refuses to start when another daemon answers on it,
/// replaces a stale socket file, and sets mode 0660 and group `mop`.
pub async fn bind(path: &Path) -> anyhow::Result<CheckedListener> {
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            anyhow::bail!("another mopd is already listening on {}", path.display());
        }
        std::fs::remove_file(path).map_err(|e| {
            anyhow::anyhow!("cannot remove the stale socket {}: {e}", path.display())
        })?;
    }
    let inner = UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    crate::sys::chgrp_mop(path);
    Ok(CheckedListener::new(
        inner,
        Admit::Host(HostIdentity::own()?),
    ))
}

/// The control API.
pub fn router(state: ControlState) -> Router {
    guarded(
        Router::new()
            .route(control::STATUS.template(), get(status))
            .route(control::SYNC.template(), post(sync_now))
            .route(control::ACK_EPOCH.template(), post(ack_epoch))
            .route(control::VERIFY.template(), post(verify))
            .route(control::TASKS.template(), post(prepare).get(list_tasks))
            .route(control::TASK.template(), delete(release))
            .route(control::TASK_RENEW.template(), post(renew))
            .route(control::TASK_RECEIPT.template(), get(receipt))
            .route(control::TASK_FINISH.template(), post(finish))
            .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") }),
    )
    .with_state(state)
}

fn task_error(e: TaskError) -> Response {
    let status = match &e {
        TaskError::Invalid(_) => StatusCode::BAD_REQUEST,
        TaskError::NotFound(_) => StatusCode::NOT_FOUND,
        TaskError::Conflict(_) => StatusCode::CONFLICT,
        TaskError::Forbidden(_) => StatusCode::FORBIDDEN,
        TaskError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        TaskError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

fn not_configured(ws: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("workspace {ws} is not configured"),
    )
}

async fn prepare(
    AxumState(c): AxumState<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    body: axum::body::Bytes,
) -> Response {
    let started = std::time::Instant::now();
    let req: PrepareRequest = match json_required(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if !matches!(req.lease, LeaseRequest::Run { .. }) {
        return match c.tasks.prepare(req, peer.uid, peer.pid, &c.agents).await {
            Ok(plan) => {
                c.state.metrics.prepared(started.elapsed());
                (StatusCode::CREATED, Json(plan)).into_response()
            }
            Err(e) => task_error(e),
        };
    }
    // A `mop run` prepare is answered by a held stream of lines: the reservation at once
    // (so the runner can start bwrap), then the plan once the view is filled. The task
    // lives as long as this connection; when the runner goes away the body is dropped
    // and the task released. A daemon shutdown ends the body without releasing (the lease
    // is persisted and taken back after the restart).
    let reserved = match c.tasks.reserve(req, peer.uid, peer.pid) {
        Ok(r) => r,
        Err(e) => return task_error(e),
    };
    let id = reserved.task_id().to_owned();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let line = |event: &PrepareEvent| {
        let mut b = serde_json::to_vec(event).expect("events serialize");
        b.push(b'\n');
        bytes::Bytes::from(b)
    };
    let _ = tx.send(line(&PrepareEvent::Reserved(Box::new(
        c.tasks.reservation(&reserved),
    ))));
    let (tasks, agents) = (c.tasks.clone(), c.agents.clone());
    tokio::spawn(async move {
        let event = match tasks.fill(reserved, &agents).await {
            Ok(plan) => {
                tasks.state().metrics.prepared(started.elapsed());
                PrepareEvent::Ready(Box::new(plan))
            }
            Err(e) => PrepareEvent::Failed {
                message: e.to_string(),
            },
        };
        let _ = tx.send(line(&event));
    });
    let mut stop = c.stopping.clone();
    let body = HoldBody {
        lines: rx,
        lines_done: false,
        stop: Box::pin(async move {
            let _ = stop.wait_for(|s| *s).await;
        }),
        guard: ReleaseOnDrop {
            tasks: c.tasks.clone(),
            id,
            armed: true,
        },
    };
    let mut response = Response::new(axum::body::Body::new(body));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(HELD_PREPARE_TYPE),
    );
    response
}

/// Releases a `mop run` task when its held response goes away.
struct ReleaseOnDrop {
    tasks: Arc<Tasks>,
    id: String,
    armed: bool,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if self.armed && !self.tasks.shutting_down() {
            // Removing the view is file system work: keep it off the async workers.
            let (tasks, id) = (self.tasks.clone(), std::mem::take(&mut self.id));
            let release = move || {
                let _ = tasks.release(&id, None, "runner connection closed");
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(release)),
                Err(_) => release(),
            }
        }
    }
}

/// The body of a held prepare answer: its lines, then nothing until shutdown.
struct HoldBody {
    lines: tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes>,
    lines_done: bool,
    stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    guard: ReleaseOnDrop,
}

impl http_body::Body for HoldBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        if !self.lines_done {
            match self.lines.poll_recv(cx) {
                Poll::Ready(Some(b)) => return Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
                Poll::Ready(None) => self.lines_done = true,
                Poll::Pending => {}
            }
        }
        match self.stop.as_mut().poll(cx) {
            Poll::Ready(()) => {
                // Shutting down: end the body, keep the lease.
                self.guard.armed = false;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

async fn list_tasks(AxumState(c): AxumState<ControlState>) -> Response {
    Json(c.tasks.list()).into_response()
}

async fn release(
    AxumState(c): AxumState<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    match c
        .tasks
        .release(&id, Some(peer.uid), "released by its runner")
    {
        Ok(()) => Json(ReleaseReply {
            task_id: id,
            released: true,
        })
        .into_response(),
        Err(e) => task_error(e),
    }
}

/// `POST /v1/tasks/{id}/finish`: the task's runner says how it ended and hands over
/// what it captured, before it releases the task.
async fn finish(
    AxumState(c): AxumState<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<String>,
    body: axum::body::Bytes,
) -> Response {
    let req: FinishRequest = match json_body(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if req.cards.len() > MAX_CAPTURED {
        return error(
            StatusCode::BAD_REQUEST,
            format!("a finish carries at most {MAX_CAPTURED} captured cards"),
        );
    }
    let task = match c.tasks.owned(&id, peer.uid) {
        Ok(t) => t,
        Err(e) => return task_error(e),
    };
    let memory = crate::agent::TaskMemory::for_capture(c.tasks.clone(), task);
    let stores = memory.finish(req).await;
    Json(FinishReply {
        task_id: id,
        stores,
    })
    .into_response()
}

async fn renew(
    AxumState(c): AxumState<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<String>,
    body: axum::body::Bytes,
) -> Response {
    let req: RenewRequest = match json_body(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    match c.tasks.renew(&id, peer.uid, req.ttl_secs) {
        Ok(info) => Json(info).into_response(),
        Err(e) => task_error(e),
    }
}

async fn receipt(
    AxumState(c): AxumState<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let Some(local) = c.tasks.receipts().find(&id) else {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "no receipt for task {id} on this host (receipts are kept receipts.keep_days days)"
            ),
        );
    };
    // A receipt names the cards a runner's task got (its user's personal ones among them).
    let daemon_uid = nix::unistd::getuid().as_raw();
    if ![0, daemon_uid, local.owner_uid].contains(&peer.uid) {
        return error(
            StatusCode::FORBIDDEN,
            format!(
                "the receipt of task {id} belongs to uid {}; its runner, root or the daemon's user may read it",
                local.owner_uid
            ),
        );
    }
    Json(local.receipt).into_response()
}

async fn status(AxumState(c): AxumState<ControlState>) -> Response {
    Json(crate::status::report(&c.state, &c.tasks)).into_response()
}

/// Refuses `what` unless the peer is root or the daemon's own user.
#[allow(clippy::result_large_err)]
fn operator_only(peer: &Peer, what: &str) -> Result<(), Response> {
    let daemon_uid = nix::unistd::getuid().as_raw();
    if peer.uid == 0 || peer.uid == daemon_uid {
        return Ok(());
    }
    Err(error(
        StatusCode::FORBIDDEN,
        format!(
            "{what} needs root or the daemon's user (uid {daemon_uid}), not uid {}: run it with sudo",
            peer.uid
        ),
    ))
}

async fn sync_now(
    AxumState(c): AxumState<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(ws): UrlPath<String>,
) -> Response {
    if let Err(r) = operator_only(&peer, "a forced sync (mopd sync)") {
        return r;
    }
    let reply = match c.workspaces.trigger(&ws).await {
        None => return not_configured(&ws),
        Some(Ok(result)) => SyncReply {
            workspace: ws,
            result,
            kind: None,
            message: None,
        },
        Some(Err(f)) => SyncReply {
            workspace: ws,
            result: mop_proto::status::SyncResult::Failed,
            kind: Some(f.kind),
            message: Some(f.message),
        },
    };
    Json(reply).into_response()
}

async fn verify(
    AxumState(c): AxumState<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(ws): UrlPath<String>,
    body: axum::body::Bytes,
) -> Response {
    let req: VerifyRequest = match json_body(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if req.repair
        && let Err(r) = operator_only(&peer, "a repair (mopd verify --repair)")
    {
        return r;
    }
    // A configured workspace, or a pool one of them inherits.
    let Some(syncer) = c
        .workspaces
        .syncer(&ws)
        .or_else(|| c.state.syncers.get(&ws))
    else {
        return not_configured(&ws);
    };
    match syncer.verify(req.repair).await {
        Ok((report, repaired_generation)) => Json(VerifyReply {
            workspace: ws,
            report,
            repaired_generation,
        })
        .into_response(),
        Err(f) => error(
            StatusCode::BAD_GATEWAY,
            format!("verify of {ws} could not finish: {}", f.message),
        ),
    }
}

async fn ack_epoch(
    AxumState(c): AxumState<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(ws): UrlPath<String>,
) -> Response {
    if let Err(r) = operator_only(&peer, "accepting a new server epoch (mopd ack-epoch)") {
        return r;
    }
    if c.workspaces.ack_epoch(&ws) {
        Json(AckEpochReply {
            workspace: ws,
            acknowledged: true,
        })
        .into_response()
    } else {
        not_configured(&ws)
    }
}
