//! What the daemon's two HTTP APIs (the control socket and each task's agent socket) share:
//! JSON error bodies, the request size limit applied before a body is buffered, and the
//! agent sockets' listener that takes connections from one uid only.

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The largest request body either socket accepts. A prepare, a store or a retrieve is a
/// few KiB; anything near this is a mistake or an attack, refused before it is buffered.
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;

/// A JSON error: `{"error": <reason phrase>, "message": …}`.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": status.canonical_reason(), "message": message.into() })),
    )
        .into_response()
}

/// Applies the size limit, and turns the plain-text rejections of axum's extractors
/// (an oversized or unreadable body) into JSON errors like every other answer.
pub fn guarded<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .layer(axum::middleware::map_response(json_rejections))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
}

async fn json_rejections(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return error(
            status,
            format!(
                "the request body is over the {} KiB limit",
                MAX_REQUEST_BYTES / 1024
            ),
        );
    }
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    error(status, String::from_utf8_lossy(&body).trim().to_owned())
}

/// A Unix listener that takes connections from one uid only (a task's owner): a peer of
/// another uid is closed at once, before it can send a byte.
pub struct OwnerListener {
    inner: tokio::net::UnixListener,
    uid: u32,
    refused: u64,
}

impl OwnerListener {
    /// Wraps a bound listener.
    pub fn new(inner: tokio::net::UnixListener, uid: u32) -> OwnerListener {
        OwnerListener {
            inner,
            uid,
            refused: 0,
        }
    }
}

impl axum::serve::Listener for OwnerListener {
    type Io = tokio::net::UnixStream;
    type Addr = Option<u32>;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, _)) => {
                    let uid = stream.peer_cred().ok().map(|c| c.uid());
                    if uid == Some(self.uid) {
                        return (stream, uid);
                    }
                    // Logged once per hundred, so that a flood cannot flood the journal.
                    if self.refused.is_multiple_of(100) {
                        tracing::warn!(
                            peer_uid = ?uid,
                            owner_uid = self.uid,
                            refused = self.refused + 1,
                            "refused an agent socket connection from another uid than the task's owner"
                        );
                    }
                    self.refused += 1;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "agent socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Some(self.uid))
    }
}
