//! `mop-server serve`: bind, serve until SIGTERM or SIGINT, and run the background work —
//! noticing changes made by other processes, publishing counters in batches, and collecting
//! garbage. Shutdown is explicit: a watch signal stops the background tasks, the HTTP
//! server drains its connections, and pending counters are published once more.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::api;
use crate::config::ServerConfig;
use crate::state::AppState;
use crate::store::Store;

/// How often the database is checked for changes made by other processes.
const REFRESH_EVERY: Duration = Duration::from_millis(500);
/// How often garbage is collected.
const GC_EVERY: Duration = Duration::from_secs(60);
/// How often tokens' last use is written to the database.
const TOKEN_USE_EVERY: Duration = Duration::from_secs(60);

/// Opens the store and serves until SIGTERM or SIGINT. `on_ready` gets the bound address.
pub async fn serve(config: ServerConfig, on_ready: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    // Handlers first: a signal that arrives as soon as we report ready must shut us down
    // cleanly, not kill us.
    let signals = shutdown_signal()?;
    // `systemctl reload` sends SIGHUP, whose default action would end the server: it is
    // caught from the start (a reload while the database opens must not kill us).
    use tokio::signal::unix::{SignalKind, signal};
    let hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    serve_with(config, on_ready, signals, Some(hup)).await
}

/// Opens the store and serves until `shutdown` resolves; for embedding the server in
/// another program (`mopd demo`), which owns the signals (with TLS, SIGHUP reloads the
/// certificate).
pub async fn serve_until(
    config: ServerConfig,
    on_ready: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let hup = match config.server.tls_cert {
        Some(_) => Some(
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .context("cannot handle SIGHUP")?,
        ),
        None => None,
    };
    serve_with(config, on_ready, shutdown, hup).await
}

async fn serve_with(
    config: ServerConfig,
    on_ready: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    hup: Option<tokio::signal::unix::Signal>,
) -> anyhow::Result<()> {
    let hook = crate::alerts::Webhook::from_config(&config.alerts)?.map(Arc::new);
    let store = Arc::new(open_store(&config).await?);
    let state = Arc::new(AppState::new(store.clone(), config.clone())?);
    let tls = match (&config.server.tls_cert, &config.server.tls_key) {
        (Some(cert), Some(key)) => Some(
            mop_serve::tls::Tls::load(cert, key)
                .context("cannot use server.tls_cert and server.tls_key")?,
        ),
        _ => None,
    };
    let listener = TcpListener::bind(config.server.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (server.listen / --listen)",
                config.server.listen
            )
        })?;
    let addr = listener.local_addr()?;
    let unix = match &config.server.socket {
        Some(path) => Some((bind_socket(path).await?, path.clone())),
        None => None,
    };
    tracing::info!(%addr, db = %store.shown(), epoch = store.epoch(), "mop-server listening");
    if let Some(path) = &config.server.socket {
        tracing::info!(socket = %path.display(), "mop-server listening on its Unix socket too");
    }
    on_ready(addr);

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tasks.spawn(refresher(state.clone(), stop_rx.clone()));
    tasks.spawn(counter_publisher(state.clone(), stop_rx.clone()));
    tasks.spawn(garbage_collector(state.clone(), stop_rx.clone()));
    tasks.spawn(token_use_recorder(state.clone(), stop_rx.clone()));
    if let Some(hook) = hook {
        tracing::info!(scan_secs = config.alerts.scan_secs, "alert webhook on");
        tasks.spawn(crate::alerts::run(state.clone(), hook, stop_rx.clone()));
    }
    if let Some(hup) = hup {
        tasks.spawn(on_sighup(hup, tls.clone(), stop_rx.clone()));
    }

    let mut app = api::router(state.clone()).merge(crate::console::router(state.clone()));
    // Counting and timing every request (the 304 polls among them) costs only when the
    // counts are served.
    if config.metrics.enabled {
        app = app.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            api::track,
        ));
    }
    let mut http_stop = stop_rx.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let limits = config.connection_limits();
    tracing::info!(
        max_connections = limits.max_connections,
        header_timeout_secs = limits.header_timeout.as_secs(),
        idle_timeout_secs = limits.idle_timeout.as_secs(),
        "connection limits"
    );
    let mut unix_stop = http_stop.clone();
    let stopped = async move {
        let _ = http_stop.wait_for(|stop| *stop).await;
    };
    let on_socket = {
        let app = app.clone();
        async move {
            if let Some((listener, path)) = unix {
                let stopped = async move {
                    let _ = unix_stop.wait_for(|stop| *stop).await;
                };
                mop_serve::serve(listener, app, limits, stopped).await;
                let _ = std::fs::remove_file(&path);
            }
        }
    };
    let on_port = async move {
        match tls {
            Some(tls) => {
                let listener = tls
                    .listener(
                        listener,
                        limits.header_timeout,
                        mop_serve::tls::MAX_PENDING_HANDSHAKES.min(limits.max_connections),
                    )
                    .context("cannot start the TLS listener")?;
                mop_serve::serve(listener, app, limits, stopped).await;
            }
            None => mop_serve::serve(listener, app, limits, stopped).await,
        }
        anyhow::Ok(())
    };
    let (served, ()) = tokio::join!(on_port, on_socket);
    served?;
    drain(tasks, &state).await?;
    tracing::info!("mop-server stopped");
    Ok(())
}

/// Opens the database with the intake policy, after compiling the credential rules and
/// loading the same-lesson rule's embedding model when one is configured (off the async
/// workers: both take a while).
async fn open_store(config: &ServerConfig) -> anyhow::Result<Store> {
    let db = config.database();
    let shown = db.shown();
    let policy = config.intake.policy();
    let model_dir = config.intake.embedding_model.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Store> {
        // The credential rules compile once, here, rather than on the first store.
        mop_intake::secrets::Screen::builtin();
        if let Some(dir) = &model_dir {
            let model = mop_embed::Model::load(dir).with_context(|| {
                format!(
                    "intake.embedding_model {}: cannot load the model (install it with install-model.sh, or remove the key)",
                    dir.display()
                )
            })?;
            tracing::info!(model = %model.fingerprint(), "the same-lesson rule compares meaning too");
            crate::store::set_embedding_model(Some(std::sync::Arc::new(model)));
        }
        Ok(Store::connect(&db)
            .with_context(|| format!("cannot open database {shown}"))?
            .with_intake(policy))
    })
    .await?
}

/// After serving: waits for the background tasks (told to stop), then records what they
/// left: token uses and pending counters.
async fn drain(mut tasks: JoinSet<()>, state: &Arc<AppState>) -> anyhow::Result<()> {
    tracing::info!("shutting down: draining background tasks");
    while tasks.join_next().await.is_some() {}
    record_token_uses(state).await;
    let store = state.store.clone();
    match tokio::task::spawn_blocking(move || store.publish_counters(None)).await? {
        Ok(p) if !p.is_empty() => {
            tracing::info!(workspaces = p.len(), "published pending counters")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not publish pending counters at shutdown"),
    }
    Ok(())
}

/// Binds `server.socket`: refuses to start when another server answers on it, replaces a
/// stale socket (never another kind of file), and lets every local user connect (mode
/// 0666; the API asks for a token as on the port). Who may create the socket is what
/// proves it is the server: its directory must be mop-server's own.
async fn bind_socket(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "server.socket {} exists and is not a socket; remove it or name another path",
                path.display()
            );
        }
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            anyhow::bail!(
                "another mop-server is already listening on {} (server.socket)",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path).with_context(|| {
        format!(
            "cannot listen on {} (server.socket); does its directory exist and belong to mop-server?",
            path.display()
        )
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    Ok(listener)
}

/// At each SIGHUP until stopped: reloads the TLS certificate and key (keeping the pair in
/// force when the new files are bad), or says there is nothing to reload.
async fn on_sighup(
    mut hup: tokio::signal::unix::Signal,
    tls: Option<mop_serve::tls::Tls>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = hup.recv() => match &tls {
                Some(tls) => match tls.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: TLS certificate not reloaded; the one in force stays"),
                },
                None => tracing::info!("SIGHUP: nothing to reload (no server.tls_cert; other settings need a restart)"),
            },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Installs SIGTERM and SIGINT handlers now; the returned future resolves on either.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

/// Runs `tick` every `every` until stopped.
async fn every<F, Fut>(every: Duration, mut stop: watch::Receiver<bool>, mut tick: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => tick().await,
            _ = stop.changed() => return,
        }
    }
}

async fn refresher(state: Arc<AppState>, stop: watch::Receiver<bool>) {
    every(REFRESH_EVERY, stop, || {
        let state = state.clone();
        async move {
            match tokio::task::spawn_blocking(move || state.refresh_if_changed()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not check the database for changes")
                }
                Err(e) => tracing::warn!(error = %e, "change check panicked"),
            }
        }
    })
    .await;
}

async fn counter_publisher(state: Arc<AppState>, stop: watch::Receiver<bool>) {
    let period = state.config.counter_publish();
    every(period, stop, || {
        let state = state.clone();
        async move {
            let s = state.clone();
            match tokio::task::spawn_blocking(move || s.store.publish_counters(None)).await {
                Ok(Ok(published)) => {
                    for (ws, rev) in published {
                        tracing::info!(workspace = %ws, revision = rev, "published counters");
                        state.note_revision(&ws, rev);
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "could not publish counters"),
                Err(e) => tracing::warn!(error = %e, "counter publication panicked"),
            }
        }
    })
    .await;
}

async fn token_use_recorder(state: Arc<AppState>, stop: watch::Receiver<bool>) {
    every(TOKEN_USE_EVERY, stop, || record_token_uses(&state)).await;
}

async fn record_token_uses(state: &Arc<AppState>) {
    let uses = state.take_token_uses();
    if uses.is_empty() {
        return;
    }
    let store = state.store.clone();
    match tokio::task::spawn_blocking(move || store.record_token_uses(&uses)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not record when tokens were last used"),
        Err(e) => tracing::warn!(error = %e, "recording token use panicked"),
    }
}

async fn garbage_collector(state: Arc<AppState>, stop: watch::Receiver<bool>) {
    every(GC_EVERY, stop, || {
        let state = state.clone();
        async move {
            let r = state.config.retention.clone();
            let answer_days = state.config.intake.store_answer_days;
            let s = state.clone();
            let result = tokio::task::spawn_blocking(move || {
                s.store.forget_store_answers(answer_days * 86_400)?;
                s.store.collect_garbage(
                    r.archive_days * 86_400,
                    r.object_secs,
                    r.delta_history_days * 86_400,
                )
            })
            .await;
            match result {
                Ok(Ok((0, 0))) => {}
                Ok(Ok((cards, objects))) => {
                    if cards > 0 {
                        // Purged cards' text must leave the curation index too.
                        state.search.forget(None);
                    }
                    tracing::info!(cards, objects, "garbage collected")
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "garbage collection failed"),
                Err(e) => tracing::warn!(error = %e, "garbage collection panicked"),
            }
        }
    })
    .await;
}
