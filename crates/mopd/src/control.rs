//! The control socket: HTTP/1.1 + JSON over `<runtime_dir>/mopd.sock` (0660, group `mop`
//! when it exists). Peers in another user namespace, or in a nested pid namespace (every
//! sandbox has one), are refused at accept: a sandboxed process that somehow reached the
//! socket cannot talk to the daemon. The user namespace of another uid's process, whose
//! `ns/user` link mopd may not read, is told by its `uid_map`; and the peer is held by a
//! pidfd while `/proc` is read, so a recycled pid cannot pass for it.
//!
//! Runners (group `mop`) may read the status and prepare, list, renew and release their
//! own tasks. What changes the daemon for everyone — a forced sync, a repair, accepting a
//! new server epoch — needs root or the daemon's own user.
//!
//! The client side, used by `mopd status` and `mop`, is `mop_proto::client`.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{ConnectInfo, Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::{UnixListener, UnixStream};

use crate::daemon::Daemon;
use crate::http::error;

/// The inode of a process's user namespace. Reading it needs ptrace access to the
/// process, which an unprivileged mopd lacks for other users' processes.
fn userns_of(pid: &str) -> io::Result<u64> {
    Ok(std::fs::metadata(format!("/proc/{pid}/ns/user"))?.ino())
}

/// A process's uid map (world-readable): in the initial user namespace it is the identity
/// map; a process in a namespace of its own shows another one.
fn uid_map_of(pid: &str) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/uid_map"))
}

/// How deep a process's pid namespace is nested (the entries of `NSpid:` in its
/// world-readable status file). Every bwrap sandbox has a pid namespace of its own, so
/// a peer nested deeper than mopd is in a sandbox, whoever owns it.
fn pid_ns_depth(pid: &str) -> io::Result<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    nspid_depth(&status).ok_or_else(|| io::Error::other("no NSpid line"))
}

fn nspid_depth(status: &str) -> Option<usize> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|rest| rest.split_whitespace().count())
}

/// A Unix listener that drops connections from peers in another user namespace.
pub struct CheckedListener {
    inner: UnixListener,
    own_userns: u64,
    own_uid_map: String,
    own_pid_depth: usize,
}

impl CheckedListener {
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
        crate::daemon::chgrp_mop(path);
        Ok(CheckedListener {
            inner,
            own_userns: userns_of("self")?,
            own_uid_map: uid_map_of("self")?,
            own_pid_depth: pid_ns_depth("self")?,
        })
    }

    fn allowed(&self, stream: &UnixStream) -> bool {
        let Ok(cred) = stream.peer_cred() else {
            return false;
        };
        let Some(pid) = cred.pid() else { return false };
        // Hold the peer while /proc/<pid> is read. SO_PEERPIDFD names the very process that
        // connected; before Linux 6.5 a pidfd opened now at least fixes which process the
        // reads below see.
        let pidfd = match crate::sys::peer_pidfd(stream) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
                match crate::sys::pidfd_open(pid) {
                    Ok(fd) => fd,
                    Err(_) => return false,
                }
            }
            // ESRCH: the peer is gone already; its pid may belong to anyone now.
            Err(_) => return false,
        };
        let pid_s = pid.to_string();
        // The user namespace: its inode when we may read it (root, or the same user),
        // else the uid map, which anyone may read. The pid namespace depth always.
        let userns_ok = match userns_of(&pid_s) {
            Ok(ns) => ns == self.own_userns,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                uid_map_of(&pid_s).is_ok_and(|m| m == self.own_uid_map)
            }
            Err(_) => false,
        };
        let pidns_ok = pid_ns_depth(&pid_s).is_ok_and(|d| d == self.own_pid_depth);
        if crate::sys::pidfd_exited(&pidfd) {
            tracing::warn!(
                pid,
                "refused a control connection whose process exited while it was checked"
            );
            return false;
        }
        if !userns_ok {
            tracing::warn!(
                pid,
                uid = cred.uid(),
                "refused a control connection from another user namespace"
            );
        } else if !pidns_ok {
            tracing::warn!(
                pid,
                uid = cred.uid(),
                "refused a control connection from a nested pid namespace (a sandbox)"
            );
        }
        userns_ok && pidns_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_depth_counts_nesting() {
        assert_eq!(nspid_depth("Name:\tx\nNSpid:\t4242\n"), Some(1));
        assert_eq!(nspid_depth("Name:\tx\nNSpid:\t4242\t7\t1\n"), Some(3));
        assert_eq!(nspid_depth("Name:\tx\n"), None);
        // This process can read its own status.
        assert!(pid_ns_depth("self").unwrap() >= 1);
    }
}

/// Who is on the other end of a control connection.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// Its uid.
    pub uid: u32,
    /// Its pid.
    pub pid: Option<i32>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, CheckedListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, CheckedListener>) -> Self {
        *stream.remote_addr()
    }
}

impl axum::serve::Listener for CheckedListener {
    type Io = UnixStream;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, _)) => {
                    if self.allowed(&stream)
                        && let Ok(cred) = stream.peer_cred()
                    {
                        return (
                            stream,
                            Peer {
                                uid: cred.uid(),
                                pid: cred.pid(),
                            },
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "control socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(Peer {
            uid: nix::unistd::getuid().as_raw(),
            pid: Some(std::process::id() as i32),
        })
    }
}

/// The control API.
pub fn router(daemon: Arc<Daemon>) -> Router {
    crate::http::guarded(
        Router::new()
            .route("/v1/status", get(status))
            .route("/v1/workspaces/{ws}/sync", post(sync_now))
            .route("/v1/workspaces/{ws}/ack-epoch", post(ack_epoch))
            .route("/v1/workspaces/{ws}/verify", post(verify))
            .route("/v1/tasks", post(prepare).get(list_tasks))
            .route("/v1/tasks/{id}", axum::routing::delete(release))
            .route("/v1/tasks/{id}/renew", post(renew))
            .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") }),
    )
    .with_state(daemon)
}

fn task_error(e: crate::tasks::TaskError) -> Response {
    use crate::tasks::TaskError as E;
    let status = match &e {
        E::Invalid(_) => StatusCode::BAD_REQUEST,
        E::NotFound(_) => StatusCode::NOT_FOUND,
        E::Conflict(_) => StatusCode::CONFLICT,
        E::Forbidden(_) => StatusCode::FORBIDDEN,
        E::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        E::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

async fn prepare(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    body: axum::body::Bytes,
) -> Response {
    let req: mop_proto::PrepareRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid request: {e}")),
    };
    if !matches!(req.lease, mop_proto::LeaseRequest::Run { .. }) {
        return match d.tasks.prepare(req, peer.uid, peer.pid).await {
            Ok(plan) => (StatusCode::CREATED, Json(plan)).into_response(),
            Err(e) => task_error(e),
        };
    }
    // A `mop run` prepare is answered by a held stream of lines: the reservation at once
    // (so the runner can start bwrap), then the plan once the view is filled. The task
    // lives as long as this connection; when the runner goes away the body is dropped
    // and the task released. A daemon shutdown ends the body without releasing (the lease
    // is persisted and taken back after the restart).
    let reserved = match d.tasks.reserve(req, peer.uid, peer.pid) {
        Ok(r) => r,
        Err(e) => return task_error(e),
    };
    let id = reserved.reservation().task_id.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let line = |event: &mop_proto::PrepareEvent| {
        let mut b = serde_json::to_vec(event).expect("events serialize");
        b.push(b'\n');
        bytes::Bytes::from(b)
    };
    let _ = tx.send(line(&mop_proto::PrepareEvent::Reserved(Box::new(
        reserved.reservation(),
    ))));
    let tasks = d.tasks.clone();
    tokio::spawn(async move {
        let event = match tasks.fill(reserved).await {
            Ok(plan) => mop_proto::PrepareEvent::Ready(Box::new(plan)),
            Err(e) => mop_proto::PrepareEvent::Failed {
                message: e.to_string(),
            },
        };
        let _ = tx.send(line(&event));
    });
    let mut stop = d.stopping();
    let body = HoldBody {
        lines: rx,
        lines_done: false,
        stop: Box::pin(async move {
            let _ = stop.wait_for(|s| *s).await;
        }),
        guard: ReleaseOnDrop {
            tasks: d.tasks.clone(),
            id,
            armed: true,
        },
    };
    let mut response = Response::new(axum::body::Body::new(body));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json-seq"),
    );
    response
}

/// Releases a `mop run` task when its held response goes away.
struct ReleaseOnDrop {
    tasks: Arc<crate::tasks::Tasks>,
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

async fn list_tasks(State(d): State<Arc<Daemon>>) -> Response {
    Json(d.tasks.list()).into_response()
}

async fn release(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    match d
        .tasks
        .release(&id, Some(peer.uid), "released by its runner")
    {
        Ok(()) => Json(serde_json::json!({ "task_id": id, "released": true })).into_response(),
        Err(e) => task_error(e),
    }
}

async fn renew(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<String>,
    body: axum::body::Bytes,
) -> Response {
    let req: mop_proto::RenewRequest = if body.is_empty() {
        Default::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid request: {e}")),
        }
    };
    match d.tasks.renew(&id, peer.uid, req.ttl_secs) {
        Ok(info) => Json(info).into_response(),
        Err(e) => task_error(e),
    }
}

async fn status(State(d): State<Arc<Daemon>>) -> Response {
    Json(d.report()).into_response()
}

/// Refuses `what` unless the peer is root or the daemon's own user.
fn operator_only(peer: &Peer, what: &str) -> Result<(), Box<Response>> {
    let daemon_uid = nix::unistd::getuid().as_raw();
    if peer.uid == 0 || peer.uid == daemon_uid {
        return Ok(());
    }
    Err(Box::new(error(
        StatusCode::FORBIDDEN,
        format!(
            "{what} needs root or the daemon's user (uid {daemon_uid}), not uid {}: run it with sudo",
            peer.uid
        ),
    )))
}

async fn sync_now(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(ws): UrlPath<String>,
) -> Response {
    if let Err(r) = operator_only(&peer, "a forced sync (mopd sync)") {
        return *r;
    }
    match d.trigger(&ws).await {
        None => error(StatusCode::NOT_FOUND, format!("workspace {ws} is not configured")),
        Some(Ok(result)) => Json(serde_json::json!({ "workspace": ws, "result": result })).into_response(),
        Some(Err(f)) => (
            StatusCode::OK,
            Json(serde_json::json!({ "workspace": ws, "result": "failed", "kind": f.kind, "message": f.message })),
        )
            .into_response(),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyRequest {
    #[serde(default)]
    repair: bool,
}

async fn verify(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(ws): UrlPath<String>,
    body: axum::body::Bytes,
) -> Response {
    let req: VerifyRequest = if body.is_empty() {
        VerifyRequest { repair: false }
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid request: {e}")),
        }
    };
    if req.repair
        && let Err(r) = operator_only(&peer, "a repair (mopd verify --repair)")
    {
        return *r;
    }
    let Some(syncer) = d.syncer(&ws) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("workspace {ws} is not configured"),
        );
    };
    match syncer.verify(req.repair).await {
        Ok((report, repaired)) => Json(serde_json::json!({ "workspace": ws, "report": report, "repaired_generation": repaired })).into_response(),
        Err(f) => error(StatusCode::BAD_GATEWAY, format!("verify of {ws} could not finish: {}", f.message)),
    }
}

async fn ack_epoch(
    State(d): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    UrlPath(ws): UrlPath<String>,
) -> Response {
    if let Err(r) = operator_only(&peer, "accepting a new server epoch (mopd ack-epoch)") {
        return *r;
    }
    if d.ack_epoch(&ws) {
        Json(serde_json::json!({ "workspace": ws, "acknowledged": true })).into_response()
    } else {
        error(
            StatusCode::NOT_FOUND,
            format!("workspace {ws} is not configured"),
        )
    }
}

pub use mop_proto::client::{ControlError, request};
