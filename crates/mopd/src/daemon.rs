//! `mopd run`: start-up, the workspaces' sync tasks, the control socket, reloads (SIGHUP
//! or a change of the config file), systemd notifications, and an explicit shutdown (a
//! watch signal stops every task; the socket is removed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use jiff::Timestamp;
use sd_notify::NotifyState;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::client::{ServerClient, read_token};
use crate::config::MopdConfig;
use crate::control::{CheckedListener, router};
use crate::pool::{Pool, make_dir};
use crate::shared::Shared;
use crate::status::{DaemonInfo, SandboxInfo, StatusReport, find_bwrap, judge};
use crate::sync::{self, Failure, Syncer, Trigger};

/// Sets group `mop` on a path when that group exists (best effort: it needs root or
/// membership, which the packaged service has).
pub fn chgrp_mop(path: &Path) {
    if let Ok(Some(group)) = nix::unistd::Group::from_name("mop")
        && let Err(e) = nix::unistd::chown(path, None, Some(group.gid))
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot set group mop");
    }
}

/// Creates the cache, state and runtime directories (0750). With a group `mop`, they get
/// that group and the setgid bit, so everything below (objects, views, agent sockets) is
/// readable by runners in group `mop` whatever the daemon's own primary group is.
fn prepare_dirs(config: &MopdConfig) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mop = nix::unistd::Group::from_name("mop").ok().flatten();
    for dir in [
        &config.paths.cache_dir,
        &config.paths.state_dir,
        &config.paths.runtime_dir,
    ] {
        make_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        if let Some(group) = &mop {
            match nix::unistd::chown(dir.as_path(), None, Some(group.gid)) {
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

fn client_for(config: &MopdConfig) -> anyhow::Result<ServerClient> {
    let token = read_token(&config.server.token_file).map_err(anyhow::Error::msg)?;
    ServerClient::new(
        &config.server.url,
        token,
        Duration::from_secs(config.server.timeout_secs),
    )
    .map_err(anyhow::Error::msg)
}

struct Handle {
    syncer: Syncer,
    trigger: mpsc::Sender<Trigger>,
    stop: watch::Sender<bool>,
    ready: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

/// The running daemon.
pub struct Daemon {
    /// Shared state.
    pub shared: Arc<Shared>,
    /// Set to true when the daemon stops.
    stopping: watch::Receiver<bool>,
    /// Live tasks.
    pub tasks: Arc<crate::tasks::Tasks>,
    workspaces: Mutex<BTreeMap<String, Handle>>,
}

impl Daemon {
    fn start_workspace(&self, ws: &str) -> anyhow::Result<()> {
        let config = self.shared.config();
        let pool = Pool::open(&config.paths.cache_dir, ws)
            .with_context(|| format!("cannot open the pool of workspace {ws}"))?;
        // Leftovers of an interrupted run: partial generations, downloads in tmp/.
        if let Err(e) = pool.collect(&self.shared.pinned(ws)) {
            tracing::warn!(workspace = ws, error = %e, "cannot collect leftovers");
        }
        let status = Arc::new(Mutex::new(sync::load_status(&config.paths.state_dir, ws)));
        self.shared.set_status(ws, Some(status.clone()));
        let syncer = Syncer::new(ws.to_owned(), pool, status, self.shared.clone());
        let (trigger, triggers) = mpsc::channel(16);
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready) = watch::channel(false);
        let task = tokio::spawn(sync::run(syncer.clone(), triggers, stop_rx, ready_tx));
        self.workspaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                ws.to_owned(),
                Handle {
                    syncer,
                    trigger,
                    stop,
                    ready,
                    task,
                },
            );
        tracing::info!(workspace = ws, "workspace sync started");
        Ok(())
    }

    async fn stop_workspace(&self, ws: &str, remove_pool: bool) {
        let handle = self
            .workspaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(ws);
        if let Some(h) = handle {
            let _ = h.stop.send(true);
            let _ = h.task.await;
        }
        self.shared.set_status(ws, None);
        if remove_pool {
            let config = self.shared.config();
            match Pool::remove(&config.paths.cache_dir, ws) {
                Ok(()) => tracing::info!(
                    workspace = ws,
                    "workspace left the config; its pool was removed"
                ),
                Err(e) => tracing::warn!(workspace = ws, error = %e, "cannot remove the pool"),
            }
            let _ = std::fs::remove_dir_all(
                sync::status_file(&config.paths.state_dir, ws)
                    .parent()
                    .expect("dir"),
            );
        }
    }

    /// Starts and stops workspaces to match the config in force; pools of workspaces no
    /// longer configured are removed (also those left by an earlier run).
    async fn reconcile(&self) {
        let config = self.shared.config();
        let wanted: Vec<String> = config.sync.workspaces.clone();
        let running: Vec<String> = self
            .workspaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for ws in &running {
            if !wanted.contains(ws) {
                self.stop_workspace(ws, true).await;
            }
        }
        for ws in &wanted {
            if !running.contains(ws)
                && let Err(e) = self.start_workspace(ws)
            {
                tracing::error!(workspace = %ws, error = %format!("{e:#}"), "cannot start workspace");
            }
        }
        let pools = config.paths.cache_dir.join("pools");
        if let Ok(entries) = std::fs::read_dir(&pools) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !wanted.contains(&name) {
                    self.stop_workspace(&name, true).await;
                }
            }
        }
    }

    /// Syncs a workspace now and waits for the result.
    pub async fn trigger(&self, ws: &str) -> Option<Result<crate::status::SyncResult, Failure>> {
        let sender = self
            .workspaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(ws)
            .map(|h| h.trigger.clone())?;
        let (tx, rx) = oneshot::channel();
        sender.send(tx).await.ok()?;
        rx.await.ok()
    }

    /// Clears a workspace's new-epoch warning.
    pub fn ack_epoch(&self, ws: &str) -> bool {
        let map = self.workspaces.lock().unwrap_or_else(|p| p.into_inner());
        let Some(h) = map.get(ws) else { return false };
        h.syncer
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .epoch_warning = None;
        true
    }

    fn all_ready(&self) -> bool {
        self.workspaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .all(|h| *h.ready.borrow())
    }

    /// A receiver of the stop signal.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.clone()
    }

    /// The syncer of one workspace.
    pub fn syncer(&self, ws: &str) -> Option<Syncer> {
        self.workspaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(ws)
            .map(|h| h.syncer.clone())
    }

    fn syncers(&self) -> Vec<Syncer> {
        self.workspaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|h| h.syncer.clone())
            .collect()
    }

    /// The status report.
    pub fn report(&self) -> StatusReport {
        let config = self.shared.config();
        let now = Timestamp::now();
        let workspaces = self.shared.statuses();
        let stale_after = Duration::from_secs(
            3 * config
                .sync
                .interval_secs
                .max(config.sync.offline_recheck_secs)
                + 60,
        );
        let (problems, warnings) = judge(
            &workspaces,
            now,
            stale_after,
            &config.server.url,
            &config.server.token_file.display().to_string(),
        );
        let healthy = problems.is_empty();
        let tasks: Vec<crate::status::TaskInfo> = self
            .tasks
            .list()
            .into_iter()
            .map(|t| crate::status::TaskInfo {
                lease: match (&t.lease.pid, &t.lease.expires_at) {
                    (Some(pid), _) => format!("lives with mop run pid {pid}"),
                    (_, Some(at)) => format!("expires {at}"),
                    _ => t.lease.kind.clone(),
                },
                task_id: t.task_id,
                workspace: t.workspace,
                generation: t.generation,
            })
            .collect();
        let in_sync = workspaces.len()
            - problems
                .iter()
                .filter_map(|p| p.workspace.as_ref())
                .collect::<std::collections::BTreeSet<_>>()
                .len();
        let summary = if healthy {
            format!("{} workspace(s) in sync, 0 active tasks", workspaces.len())
        } else {
            format!(
                "{in_sync} of {} workspace(s) in sync, {} problem(s)",
                workspaces.len(),
                problems.len()
            )
        };
        StatusReport {
            schema: crate::status::STATUS_SCHEMA,
            healthy,
            summary,
            daemon: DaemonInfo {
                version: env!("CARGO_PKG_VERSION").into(),
                pid: std::process::id(),
                started_at: self.shared.started_at,
                uptime_secs: (now.as_second() - self.shared.started_at.as_second()).max(0) as u64,
                config_path: self.shared.config_path.display().to_string(),
                server_url: config.server.url.clone(),
            },
            workspaces,
            tasks,
            sandbox: SandboxInfo {
                bwrap: find_bwrap(),
            },
            problems,
            warnings,
        }
    }

    /// Re-reads the config file; a bad file is logged and the running config kept.
    async fn reload(&self, why: &str) {
        let path = self.shared.config_path.clone();
        let loaded = MopdConfig::load(&path)
            .map_err(anyhow::Error::from)
            .and_then(|c| {
                let client = client_for(&c)?;
                Ok((c, client))
            });
        match loaded {
            Ok((config, client)) => {
                let old = self.shared.config();
                if config.paths != old.paths {
                    tracing::warn!(
                        "[paths] changed in {}: restart mopd to move the pool; other changes apply now",
                        path.display()
                    );
                }
                let mut config = config;
                config.paths = old.paths.clone();
                self.shared.replace(config, client);
                tracing::info!(config = %path.display(), why, "configuration reloaded");
                self.reconcile().await;
            }
            Err(e) => {
                tracing::error!(config = %path.display(), error = %format!("{e:#}"), why, "new configuration refused; keeping the running one")
            }
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
    let listener = CheckedListener::bind(&socket).await?;
    let shared = Arc::new(Shared::new(config, client, config_path.clone()));
    let tasks = Arc::new(crate::tasks::Tasks::new(shared.clone()));
    // Leases first: their generations must be pinned before any pool is collected.
    tasks.recover().await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let daemon = Arc::new(Daemon {
        shared: shared.clone(),
        stopping: stop_rx.clone(),
        tasks: tasks.clone(),
        workspaces: Mutex::default(),
    });
    daemon.reconcile().await;
    tracing::info!(socket = %socket.display(), config = %config_path.display(), "mopd started");

    let mut http_stop = stop_rx.clone();
    let reaper = tokio::spawn(crate::tasks::reaper(tasks.clone(), stop_rx.clone()));
    let warmer = tokio::spawn(crate::tasks::warmer(tasks.clone(), stop_rx.clone()));
    let control = tokio::spawn(mop_serve::serve(
        listener,
        router(daemon.clone()),
        shared.config().socket_limits(false),
        async move {
            let _ = http_stop.changed().await;
        },
    ));

    // Config file changes: watch the directory (editors replace files) and reload.
    let (file_tx, mut file_rx) = mpsc::channel::<()>(4);
    let _watcher = watch_file(&config_path, file_tx);

    let notifier = tokio::spawn(notify_systemd(daemon.clone(), stop_rx.clone()));
    let scrubber = tokio::spawn(scrub(daemon.clone(), stop_rx.clone()));

    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM received"); break; }
            _ = int.recv() => { tracing::info!("SIGINT received"); break; }
            _ = hup.recv() => daemon.reload("SIGHUP").await,
            Some(()) = file_rx.recv() => {
                // Let an editor finish writing before reading.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while file_rx.try_recv().is_ok() {}
                daemon.reload("config file changed").await;
            }
        }
    }

    let _ = sd_notify::notify(&[NotifyState::Stopping]);
    tasks.begin_shutdown();
    let _ = stop_tx.send(true);
    let names: Vec<String> = daemon
        .workspaces
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .cloned()
        .collect();
    for ws in names {
        daemon.stop_workspace(&ws, false).await;
    }
    let _ = control.await;
    let _ = reaper.await;
    let _ = warmer.await;
    let _ = notifier.await;
    let _ = scrubber.await;
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
async fn notify_systemd(daemon: Arc<Daemon>, mut stop: watch::Receiver<bool>) {
    let watchdog = sd_notify::watchdog_enabled();
    let steady = watchdog.map_or(Duration::from_secs(2), |w| {
        (w / 2).min(Duration::from_secs(2))
    });
    let mut ready = false;
    let mut last_summary = String::new();
    loop {
        if !ready && daemon.all_ready() {
            ready = true;
            let _ = sd_notify::notify(&[NotifyState::Ready]);
            tracing::info!("pool usable: notified systemd READY");
        }
        let summary = daemon.report().summary;
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
async fn scrub(daemon: Arc<Daemon>, mut stop: watch::Receiver<bool>) {
    loop {
        let every = daemon.shared.config().pool.verify_interval_secs;
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
        for syncer in daemon.syncers() {
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
