//! The configured workspaces, each with its sync loop: started and stopped to match the
//! config in force ([`Workspaces::reconcile`]), forced to sync, verified, told to accept a
//! new epoch. A workspace that leaves the config loses its pool and its state, and so does
//! an inherited pool (see [`crate::sync::inherit`]) that no configured workspace inherits.
//!
//! Owns the sync loops' handles. Syncing itself is [`crate::sync`]'s; the pool's files are
//! [`crate::pool`]'s.

use std::collections::BTreeMap;
use std::sync::Arc;

use mop_proto::status::SyncResult;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::pool::Pool;
use crate::state::State;
use crate::sync::{self, Failure, Syncer, Trigger};

struct Handle {
    syncer: Syncer,
    trigger: mpsc::Sender<Trigger>,
    stop: watch::Sender<bool>,
    ready: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

/// The running workspaces.
pub struct Workspaces {
    state: Arc<State>,
    handles: Mutex<BTreeMap<String, Handle>>,
}

impl Workspaces {
    /// None running yet.
    pub fn new(state: Arc<State>) -> Workspaces {
        Workspaces {
            state,
            handles: Mutex::default(),
        }
    }

    fn start(&self, ws: &str) -> anyhow::Result<()> {
        // Leftovers of an interrupted run (partial generations, downloads in tmp/) are
        // collected as the pool opens.
        // An inherited pool that is now configured itself keeps its syncer, so that one
        // lock still guards what it publishes.
        let syncer = match self.state.syncers.get(ws) {
            Some(known) => known,
            None => {
                let opened = Syncer::open(&self.state, ws)?;
                self.state.syncers.insert(opened.clone());
                opened
            }
        };
        let (trigger, triggers) = mpsc::channel(16);
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready) = watch::channel(false);
        let task = tokio::spawn(sync::run(syncer.clone(), triggers, stop_rx, ready_tx));
        self.handles.lock().insert(
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

    /// Stops a workspace's sync loop (waiting for it), and removes its pool and state
    /// when it left the config.
    pub async fn stop(&self, ws: &str, remove_pool: bool) {
        let handle = self.handles.lock().remove(ws);
        let mut _publishing = None;
        if let Some(h) = handle {
            let _ = h.stop.send(true);
            let _ = h.task.await;
            if remove_pool {
                // A repair under way ends before its pool goes.
                _publishing = Some(h.syncer.publishing.clone().lock_owned().await);
            }
        }
        self.state.set_status(ws, None);
        self.state.syncers.remove(ws);
        if remove_pool {
            let paths = self.state.paths();
            match Pool::remove(paths, ws) {
                Ok(()) => tracing::info!(
                    workspace = ws,
                    "workspace left the config; its pool was removed"
                ),
                Err(e) => tracing::warn!(workspace = ws, error = %e, "cannot remove the pool"),
            }
            let _ = std::fs::remove_dir_all(paths.workspace_state(ws));
        }
    }

    /// Stops every sync loop, keeping the pools (the daemon is stopping).
    pub async fn stop_all(&self) {
        let names: Vec<String> = self.handles.lock().keys().cloned().collect();
        for ws in names {
            self.stop(&ws, false).await;
        }
    }

    /// Starts and stops workspaces to match the config in force; pools of workspaces no
    /// longer configured are removed (also those left by an earlier run).
    pub async fn reconcile(&self) {
        let wanted = self.state.config().sync.workspaces.clone();
        let running: Vec<String> = self.handles.lock().keys().cloned().collect();
        for ws in &running {
            if !wanted.contains(ws) {
                self.stop(ws, true).await;
            }
        }
        // Pools the configured workspaces inherit stay, synced by their rounds.
        let inherited: Vec<String> = wanted
            .iter()
            .flat_map(|ws| crate::sync::record::load(self.state.paths(), ws).inherits)
            .filter(|ws| !wanted.contains(ws))
            .collect();
        for ws in &wanted {
            if !running.contains(ws)
                && let Err(e) = self.start(ws)
            {
                tracing::error!(workspace = %ws, error = %format!("{e:#}"), "cannot start workspace");
            }
        }
        let pools = self.state.paths().pools();
        for e in std::fs::read_dir(&pools).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !wanted.contains(&name) && !inherited.contains(&name) {
                self.stop(&name, true).await;
            }
        }
        for ws in &inherited {
            if let Err(f) = self.state.syncers.get_or_open(&self.state, ws) {
                tracing::warn!(workspace = %ws, error = %f.message, "cannot open an inherited pool");
            }
        }
    }

    /// After a reload that changed the card server: every workspace forgets the old
    /// server's error (its advice was about that server) and polls the new one now,
    /// without waiting for the answers.
    pub fn server_changed(&self) {
        for h in self.handles.lock().values() {
            {
                let mut status = h.syncer.status.lock();
                status.last_error = None;
                status.consecutive_failures = 0;
            }
            let (tx, _answer) = oneshot::channel();
            // A full queue already has a poll coming.
            let _ = h.trigger.try_send(tx);
        }
    }

    /// Syncs a workspace now and waits for the result; `None` when it is not configured.
    pub async fn trigger(&self, ws: &str) -> Option<Result<SyncResult, Failure>> {
        let sender = self.handles.lock().get(ws).map(|h| h.trigger.clone())?;
        let (tx, rx) = oneshot::channel();
        sender.send(tx).await.ok()?;
        rx.await.ok()
    }

    /// Clears a workspace's new-epoch warning; false when it is not configured.
    pub fn ack_epoch(&self, ws: &str) -> bool {
        let map = self.handles.lock();
        let Some(h) = map.get(ws) else { return false };
        h.syncer.status.lock().epoch_warning = None;
        true
    }

    /// True once every workspace has a usable pool or finished its first attempt.
    pub fn all_ready(&self) -> bool {
        self.handles.lock().values().all(|h| *h.ready.borrow())
    }

    /// The syncer of one workspace.
    pub fn syncer(&self, ws: &str) -> Option<Syncer> {
        self.handles.lock().get(ws).map(|h| h.syncer.clone())
    }

    /// Every workspace's syncer.
    pub fn syncers(&self) -> Vec<Syncer> {
        self.handles
            .lock()
            .values()
            .map(|h| h.syncer.clone())
            .collect()
    }
}
