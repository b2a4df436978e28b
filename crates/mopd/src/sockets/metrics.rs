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
    let text = tasks.state().metrics.encode(tasks.list().len());
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

/// Serves `/metrics` where `[metrics]` says, until stopped; nothing when it names neither
/// a port nor a socket.
pub async fn serve(tasks: Arc<Tasks>, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    use anyhow::Context;
    let config = tasks.state().config();
    let limits = config.socket_limits(false);
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Some(addr) = config.metrics.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on metrics.listen = {addr}"))?;
        tracing::info!(%addr, "metrics served");
        mop_serve::serve(listener, router(tasks), limits, stopped).await;
    } else if let Some(path) = &config.metrics.socket {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)
            .with_context(|| format!("cannot bind metrics.socket = {}", path.display()))?;
        set_mode(path, 0o660)?;
        tracing::info!(socket = %path.display(), "metrics served");
        mop_serve::serve(listener, router(tasks), limits, stopped).await;
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| anyhow::anyhow!("cannot set the mode of {}: {e}", path.display()))
}
