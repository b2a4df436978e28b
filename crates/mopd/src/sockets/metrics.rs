//! `/metrics` on the loopback port or Unix socket `[metrics]` names (off by default).

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::State as AxumState;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

use crate::tasks::Tasks;

async fn scrape(AxumState(tasks): AxumState<Arc<Tasks>>) -> impl IntoResponse {
    let queue = tasks.spool().info(jiff::Timestamp::now());
    let text = tasks.state().metrics.encode(tasks.list().len(), &queue);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
}

fn router(tasks: Arc<Tasks>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(tasks)
}

/// Where `/metrics` is served.
#[derive(Debug)]
pub enum MetricsListener {
    /// A loopback port.
    Tcp(tokio::net::TcpListener),
    /// A Unix socket, removed at the end.
    Unix(tokio::net::UnixListener, std::path::PathBuf),
}

/// Binds what `[metrics]` names (at start, so a taken port fails the start, not later):
/// nothing when it names neither a port nor a socket.
pub async fn bind(config: &crate::config::MopdConfig) -> anyhow::Result<Option<MetricsListener>> {
    use anyhow::Context;
    if let Some(addr) = config.metrics.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on metrics.listen = {addr}"))?;
        return Ok(Some(MetricsListener::Tcp(listener)));
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
        MetricsListener::Tcp(l) => {
            if let Ok(addr) = l.local_addr() {
                tracing::info!(%addr, "metrics served");
            }
            mop_serve::serve(l, router(tasks), limits, stopped).await;
        }
        MetricsListener::Unix(l, path) => {
            tracing::info!(socket = %path.display(), "metrics served");
            mop_serve::serve(l, router(tasks), limits, stopped).await;
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| anyhow::anyhow!("cannot set the mode of {}: {e}", path.display()))
}
