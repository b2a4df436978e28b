//! `/metrics` on the loopback port or Unix socket `[metrics]` names (off by default). On
//! a port, a scrape must send the bearer token of `metrics.token_file`: sandboxed tasks
//! that share the host's network reach every loopback port.

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::State as AxumState;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mop_proto::routes;
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use crate::tasks::Tasks;

/// What a scrape is answered from: the tasks, and the token a scrape must send (if any).
#[derive(Clone)]
struct Scrape {
    tasks: Arc<Tasks>,
    token: Option<Arc<str>>,
}

async fn scrape(AxumState(s): AxumState<Scrape>, headers: HeaderMap) -> Response {
    if let Some(token) = &s.token {
        let sent = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // Compared in time that does not depend on where the two differ.
        if !bool::from(sent.trim().as_bytes().ct_eq(token.as_bytes())) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "send the bearer token of metrics.token_file\n",
            )
                .into_response();
        }
    }
    let queue = s.tasks.spool().info(jiff::Timestamp::now());
    let text = s.tasks.state().metrics.encode(s.tasks.list().len(), &queue);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

fn router(tasks: Arc<Tasks>, token: Option<Arc<str>>) -> Router {
    Router::new()
        .route(routes::METRICS.template(), get(scrape))
        .with_state(Scrape { tasks, token })
}

/// Where `/metrics` is served.
#[derive(Debug)]
pub enum MetricsListener {
    /// A loopback port, and the token a scrape must send.
    Tcp(tokio::net::TcpListener, Arc<str>),
    /// A Unix socket, removed at the end.
    Unix(tokio::net::UnixListener, std::path::PathBuf),
}

/// Binds what `[metrics]` names (at start, so a taken port fails the start, not later):
/// nothing when it names neither a port nor a socket.
pub async fn bind(config: &crate::config::MopdConfig) -> anyhow::Result<Option<MetricsListener>> {
    use anyhow::Context;
    if let Some(addr) = config.metrics.listen {
        let file = config
            .metrics
            .token_file
            .as_deref()
            .context("metrics.listen needs metrics.token_file")?;
        let token = crate::client::read_token(file)
            .map_err(|e| anyhow::anyhow!("metrics.token_file: {e}"))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on metrics.listen = {addr}"))?;
        return Ok(Some(MetricsListener::Tcp(listener, token.into())));
    }
    if let Some(path) = &config.metrics.socket {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)
            .with_context(|| format!("cannot bind metrics.socket = {}", path.display()))?;
        set_mode(path, 0o660)?;
        return Ok(Some(MetricsListener::Unix(listener, path.clone())));
    }
    Ok(None)
}

/// Serves `/metrics` on `listener` until stopped.
pub async fn serve(listener: MetricsListener, tasks: Arc<Tasks>, mut stop: watch::Receiver<bool>) {
    let limits = tasks.state().config().socket_limits(false);
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    match listener {
        MetricsListener::Tcp(l, token) => {
            if let Ok(addr) = l.local_addr() {
                tracing::info!(%addr, "metrics served");
            }
            mop_serve::serve(l, router(tasks, Some(token)), limits, stopped).await;
        }
        MetricsListener::Unix(l, path) => {
            tracing::info!(socket = %path.display(), "metrics served");
            mop_serve::serve(l, router(tasks, None), limits, stopped).await;
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| anyhow::anyhow!("cannot set the mode of {}: {e}", path.display()))
}
