//! The control socket: HTTP/1.1 + JSON over `<runtime_dir>/mopd.sock` (0660, group `mop`
//! when it exists). Peers in another user namespace are refused at accept: a sandboxed
//! process that somehow reached the socket cannot talk to the daemon.
//!
//! Also the client side, used by `mopd status` and `mop`.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use tokio::net::{UnixListener, UnixStream};

use crate::daemon::Daemon;

/// The inode of a process's user namespace.
fn userns_of(pid: &str) -> io::Result<u64> {
    Ok(std::fs::metadata(format!("/proc/{pid}/ns/user"))?.ino())
}

/// A Unix listener that drops connections from peers in another user namespace.
pub struct CheckedListener {
    inner: UnixListener,
    own_userns: u64,
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
        })
    }

    fn allowed(&self, stream: &UnixStream) -> bool {
        let Ok(cred) = stream.peer_cred() else {
            return false;
        };
        let Some(pid) = cred.pid() else { return false };
        match userns_of(&pid.to_string()) {
            Ok(ns) if ns == self.own_userns => true,
            Ok(_) => {
                tracing::warn!(
                    pid,
                    uid = cred.uid(),
                    "refused a control connection from another user namespace"
                );
                false
            }
            Err(_) => false,
        }
    }
}

impl axum::serve::Listener for CheckedListener {
    type Io = UnixStream;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    if self.allowed(&stream) {
                        return (stream, addr);
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
        self.inner.local_addr()
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": status.canonical_reason(), "message": message.into() })),
    )
        .into_response()
}

/// The control API.
pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/workspaces/{ws}/sync", post(sync_now))
        .route("/v1/workspaces/{ws}/ack-epoch", post(ack_epoch))
        .route("/v1/workspaces/{ws}/verify", post(verify))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .with_state(daemon)
}

async fn status(State(d): State<Arc<Daemon>>) -> Response {
    Json(d.report()).into_response()
}

async fn sync_now(State(d): State<Arc<Daemon>>, UrlPath(ws): UrlPath<String>) -> Response {
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

async fn ack_epoch(State(d): State<Arc<Daemon>>, UrlPath(ws): UrlPath<String>) -> Response {
    if d.ack_epoch(&ws) {
        Json(serde_json::json!({ "workspace": ws, "acknowledged": true })).into_response()
    } else {
        error(
            StatusCode::NOT_FOUND,
            format!("workspace {ws} is not configured"),
        )
    }
}

/// Why the daemon could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket file does not exist: the daemon is not running.
    #[error(
        "mopd is not running: the socket {0} does not exist → systemctl start mopd (or: mopd run)"
    )]
    Missing(PathBuf),
    /// The socket exists but nothing accepts connections.
    #[error(
        "mopd is not answering: the socket {0} exists but refuses connections → systemctl restart mopd"
    )]
    Refused(PathBuf),
    /// The caller may not use the socket.
    #[error("permission denied on {0} → run as root or as a member of group mop")]
    Denied(PathBuf),
    /// Anything else.
    #[error("control socket {path}: {message}")]
    Other {
        /// The socket.
        path: PathBuf,
        /// What happened.
        message: String,
    },
}

/// One request to the daemon: returns the status code and body.
pub async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<(u16, Vec<u8>), ControlError> {
    let stream = match UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e) => {
            return Err(match e.kind() {
                io::ErrorKind::NotFound => ControlError::Missing(socket.to_owned()),
                io::ErrorKind::ConnectionRefused => ControlError::Refused(socket.to_owned()),
                io::ErrorKind::PermissionDenied => ControlError::Denied(socket.to_owned()),
                _ => ControlError::Other {
                    path: socket.to_owned(),
                    message: e.to_string(),
                },
            });
        }
    };
    let other = |m: String| ControlError::Other {
        path: socket.to_owned(),
        message: m,
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| other(e.to_string()))?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "mopd")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.unwrap_or_default(),
        )))
        .map_err(|e| other(e.to_string()))?;
    let response = sender
        .send_request(req)
        .await
        .map_err(|e| other(e.to_string()))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| other(e.to_string()))?
        .to_bytes();
    Ok((status, body.to_vec()))
}
