//! `mopd run`: start-up in the order the parts need (leases recovered before any pool is
//! collected), reloads (SIGHUP or a change of the config file), systemd notifications, the
//! periodic scrub, and an explicit shutdown (a watch signal stops every loop; the socket
//! is removed).
//!
//! Orchestration only: what each part does is in its own module.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sd_notify::NotifyState;
use tokio::sync::{mpsc, watch};

use crate::client::{CardServer, ServerClient, read_token};
use crate::config::MopdConfig;
use crate::files::make_dir;
use crate::receipts::Receipts;
use crate::sockets::agent::AgentServer;
use crate::sockets::control::ControlState;
use crate::state::State;
use crate::tasks::Tasks;
use crate::workspaces::Workspaces;

/// Creates the cache, state and runtime directories (0750). With a group `mop`, they get
/// that group and the setgid bit, so everything below (objects, views, agent sockets) is
/// readable by runners in group `mop` whatever the daemon's own primary group is.
fn prepare_dirs(config: &MopdConfig) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mop = nix::unistd::Group::from_name("mop").ok().flatten();
    let paths = config.layout();
    for dir in [paths.cache_dir(), paths.state_dir(), paths.runtime_dir()] {
        make_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        if let Some(group) = &mop {
            match nix::unistd::chown(dir, None, Some(group.gid)) {
                Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o2750))
                    .with_context(|| format!("cannot set the mode of {}", dir.display()))?,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot set group mop; runners may not read task views")
                }
            }
        }
    }
    Ok(())
}

fn client_for(config: &MopdConfig) -> anyhow::Result<Arc<dyn CardServer>> {
    let token = read_token(&config.server.token_file).map_err(anyhow::Error::msg)?;
    let client = ServerClient::for_config(&config.server, token).map_err(anyhow::Error::msg)?;
    Ok(Arc::new(client))
}

/// Re-reads the config file; a bad file is logged and the running config kept.
async fn reload(state: &Arc<State>, workspaces: &Workspaces, why: &str) {
    let path = state.config_path.clone();
    let loaded = MopdConfig::load(&path)
        .map_err(anyhow::Error::from)
        .and_then(|c| {
            let client = client_for(&c)?;
            Ok((c, client))
        });
    match loaded {
        Ok((mut config, client)) => {
            let old = state.config();
            if config.paths != old.paths {
                tracing::warn!(
                    "[paths] changed in {}: restart mopd to move the pool; other changes apply now",
                    path.display()
                );
            }
            config.paths = old.paths.clone();
            let server_changed = config.server != old.server;
            state.replace(config, client);
            // The model is loaded again, off the async workers' work: its files may have
            // been installed, fixed or replaced at the same path.
            let loading = state.clone();
            let _ = tokio::task::spawn_blocking(move || {
                loading.embedding.forget();
                loading.embedding_model();
            })
            .await;
            tracing::info!(config = %path.display(), why, server_changed, "configuration reloaded");
            workspaces.reconcile().await;
            if server_changed {
                workspaces.server_changed();
            }
        }
        Err(e) => {
            tracing::error!(config = %path.display(), error = %format!("{e:#}"), why, "new configuration refused; keeping the running one")
        }
    }
}

/// Runs the daemon in the foreground until SIGTERM or SIGINT.
pub async fn run(config_path: PathBuf) -> anyhow::Result<()> {
    let config = MopdConfig::load(&config_path)?;
    let config_path = std::fs::canonicalize(&config_path).unwrap_or(config_path);
    let client = client_for(&config)?;
    prepare_dirs(&config)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;

    let socket = config.socket_path();
    let listener = crate::sockets::control::bind(&socket).await?;
    let metrics_listener = crate::sockets::metrics::bind(&config).await?;
    let state = Arc::new(State::new(config, client, config_path.clone()));
    // The embedding model, if configured, loads once before the first build needs it.
    let loading = state.clone();
    tokio::task::spawn_blocking(move || loading.embedding_model()).await?;
    let receipts = Arc::new(Receipts::open(state.paths()).with_context(|| {
        format!(
            "cannot open the receipts directory {}",
            state.paths().receipts().display()
        )
    })?);
    let spool = Arc::new(crate::spool::Spool::open(state.paths()).with_context(|| {
        format!(
            "cannot read the queue of stores under {}",
            state.paths().spool_queue().display()
        )
    })?);
    let tasks = Arc::new(Tasks::new(state.clone(), receipts.clone(), spool.clone()));
    let agents = AgentServer::new(tasks.clone());
    // Leases first: their generations must be pinned before any pool is collected.
    tasks.recover(&agents);
    let workspaces = Arc::new(Workspaces::new(state.clone()));
    workspaces.reconcile().await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let control_state = ControlState {
        state: state.clone(),
        tasks: tasks.clone(),
        workspaces: workspaces.clone(),
        agents,
        stopping: stop_rx.clone(),
    };
    tracing::info!(socket = %socket.display(), config = %config_path.display(), "mopd started");

    let mut http_stop = stop_rx.clone();
    let reaper = tokio::spawn(crate::tasks::reaper(tasks.clone(), stop_rx.clone()));
    let warmer = tokio::spawn(crate::tasks::warmer(tasks.clone(), stop_rx.clone()));
    let reporter = tokio::spawn(crate::receipts::reporter(
        state.clone(),
        receipts.clone(),
        stop_rx.clone(),
    ));
    let replayer = tokio::spawn(crate::spool::replayer(
        state.clone(),
        spool,
        receipts.clone(),
        stop_rx.clone(),
    ));
    let flusher = tokio::spawn(crate::receipts::flusher(receipts, stop_rx.clone()));
    let control = tokio::spawn(mop_serve::serve(
        listener,
        crate::sockets::control::router(control_state),
        state.config().socket_limits(false),
        async move {
            let _ = http_stop.changed().await;
        },
    ));

    // Config file changes: watch the directory (editors replace files) and reload.
    let (file_tx, mut file_rx) = mpsc::channel::<()>(4);
    let _watcher = watch_file(&config_path, file_tx);

    let notifier = tokio::spawn(notify_systemd(
        state.clone(),
        tasks.clone(),
        workspaces.clone(),
        stop_rx.clone(),
    ));
    let scrubber = tokio::spawn(scrub(state.clone(), workspaces.clone(), stop_rx.clone()));
    let metrics = metrics_listener.map(|l| {
        tokio::spawn(crate::sockets::metrics::serve(
            l,
            tasks.clone(),
            stop_rx.clone(),
        ))
    });

    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM received"); break; }
            _ = int.recv() => { tracing::info!("SIGINT received"); break; }
            _ = hup.recv() => reload(&state, &workspaces, "SIGHUP").await,
            Some(()) = file_rx.recv() => {
                // Let an editor finish writing before reading.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while file_rx.try_recv().is_ok() {}
                reload(&state, &workspaces, "config file changed").await;
            }
        }
    }

    let _ = sd_notify::notify(&[NotifyState::Stopping]);
    tasks.begin_shutdown();
    let _ = stop_tx.send(true);
    workspaces.stop_all().await;
    let _ = control.await;
    let _ = reaper.await;
    let _ = warmer.await;
    let _ = reporter.await;
    let _ = replayer.await;
    let _ = flusher.await;
    let _ = notifier.await;
    let _ = scrubber.await;
    if let Some(m) = metrics {
        let _ = m.await;
    }
    let _ = std::fs::remove_file(&socket);
    tracing::info!("mopd stopped");
    Ok(())
}

fn watch_file(path: &Path, tx: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    use notify::{RecursiveMode, Watcher};
    let file_name = path.file_name()?.to_owned();
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(e) = event
            && e.paths.iter().any(|p| p.file_name() == Some(&file_name))
            && !e.kind.is_access()
        {
            let _ = tx.try_send(());
        }
    })
    .map_err(|e| tracing::warn!(error = %e, "cannot watch the config file; SIGHUP still reloads"))
    .ok()?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config directory; SIGHUP still reloads"))
        .ok()?;
    Some(watcher)
}

/// READY once every workspace has a usable pool (a generation, or a finished first
/// attempt), STATUS with the one-line summary, WATCHDOG when systemd asks for it.
async fn notify_systemd(
    state: Arc<State>,
    tasks: Arc<Tasks>,
    workspaces: Arc<Workspaces>,
    mut stop: watch::Receiver<bool>,
) {
    let watchdog = sd_notify::watchdog_enabled();
    let steady = watchdog.map_or(Duration::from_secs(2), |w| {
        (w / 2).min(Duration::from_secs(2))
    });
    let mut ready = false;
    let mut last_summary = String::new();
    loop {
        if !ready && workspaces.all_ready() {
            ready = true;
            let _ = sd_notify::notify(&[NotifyState::Ready]);
            tracing::info!("pool usable: notified systemd READY");
        }
        let summary = crate::status::report(&state, &tasks).summary;
        if summary != last_summary {
            let _ = sd_notify::notify(&[NotifyState::Status(&summary)]);
            last_summary = summary;
        }
        if watchdog.is_some() {
            let _ = sd_notify::notify(&[NotifyState::Watchdog]);
        }
        // Look often until ready, so READY follows the first usable pool closely.
        let tick = if ready {
            steady
        } else {
            Duration::from_millis(100)
        };
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Re-hashes every pool at `pool.verify_interval_secs`, repairing what it finds.
async fn scrub(state: Arc<State>, workspaces: Arc<Workspaces>, mut stop: watch::Receiver<bool>) {
    loop {
        let every = state.config().pool.verify_interval_secs;
        let wait = if every == 0 {
            Duration::from_secs(3600)
        } else {
            Duration::from_secs(every)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        if every == 0 {
            continue;
        }
        let configured = workspaces.syncers();
        let names: Vec<String> = configured.iter().map(|s| s.ws.clone()).collect();
        let mut all = state.syncers.inherited_only(&names);
        all.extend(configured);
        // Workspaces that inherit others last: their repair links the inherited pools'
        // objects, which must be whole by then.
        all.sort_by_key(|s| !s.status.lock().inherits.is_empty());
        for syncer in all {
            match syncer.verify(true).await {
                Ok((report, _)) if report.is_clean() => {}
                Ok((report, repaired)) => tracing::warn!(
                    workspace = %syncer.ws,
                    bad = report.bad_objects.len(),
                    missing = report.missing_objects.len(),
                    damaged = report.damaged_files.len(),
                    repaired = repaired.is_some(),
                    "scrub found damage"
                ),
                Err(f) => {
                    tracing::warn!(workspace = %syncer.ws, error = %f.message, "scrub could not repair")
                }
            }
        }
    }
}
