//! The daemon's one state: the config and server client in force (swapped on reload), the
//! directory layout (fixed at start), each workspace's status, the generations pinned by
//! live tasks, and the news of published generations.
//!
//! Every other module reads and updates the daemon through this; none of them holds a
//! copy of the config. Must not do I/O itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use jiff::Timestamp;

use mop_proto::status::WorkspaceStatus;

use crate::client::CardServer;
use crate::config::MopdConfig;
use crate::paths::Paths;

/// Daemon-wide state.
pub struct State {
    config: RwLock<Arc<MopdConfig>>,
    client: RwLock<Arc<dyn CardServer>>,
    paths: Paths,
    /// The config file.
    pub config_path: PathBuf,
    /// When the daemon started.
    pub started_at: Timestamp,
    statuses: Mutex<BTreeMap<String, Arc<Mutex<WorkspaceStatus>>>>,
    pins: Mutex<BTreeMap<String, BTreeMap<String, usize>>>,
    /// (workspace, generation) each time a generation is published, so task projection
    /// can load it before the first prepare needs it.
    pub published: tokio::sync::broadcast::Sender<(String, String)>,
    /// Prometheus metrics.
    pub metrics: crate::metrics::Metrics,
    /// The dense ranker's model, if configured.
    pub embedding: crate::embedding::Embedding,
    /// Every workspace's syncer: the configured ones and the pools they inherit.
    pub syncers: crate::sync::inherit::Registry,
}

impl State {
    /// New state.
    pub fn new(config: MopdConfig, client: Arc<dyn CardServer>, config_path: PathBuf) -> State {
        State {
            paths: config.layout(),
            config: RwLock::new(Arc::new(config)),
            client: RwLock::new(client),
            config_path,
            started_at: Timestamp::now(),
            statuses: Mutex::default(),
            pins: Mutex::default(),
            published: tokio::sync::broadcast::channel(64).0,
            metrics: crate::metrics::Metrics::new(),
            embedding: Default::default(),
            syncers: Default::default(),
        }
    }

    /// The config in force.
    pub fn config(&self) -> Arc<MopdConfig> {
        self.config.read().clone()
    }

    /// The configured embedding model, if it loads (see [`crate::embedding`]).
    pub fn embedding_model(&self) -> Option<Arc<mop_embed::Model>> {
        self.embedding
            .usable(self.config().selection.embedding_model.as_deref())
    }

    /// The directory layout (a change of `[paths]` needs a restart).
    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    /// The server client in force.
    pub fn client(&self) -> Arc<dyn CardServer> {
        self.client.read().clone()
    }

    /// Swaps in a new config and client (reload).
    pub fn replace(&self, config: MopdConfig, client: Arc<dyn CardServer>) {
        *self.config.write() = Arc::new(config);
        *self.client.write() = client;
    }

    /// Registers (or forgets, with `None`) a workspace's status.
    pub fn set_status(&self, ws: &str, status: Option<Arc<Mutex<WorkspaceStatus>>>) {
        let mut map = self.statuses.lock();
        match status {
            Some(s) => map.insert(ws.to_owned(), s),
            None => map.remove(ws),
        };
    }

    /// Snapshots of every workspace's status, by name.
    pub fn statuses(&self) -> Vec<WorkspaceStatus> {
        let map = self.statuses.lock();
        map.values().map(|s| s.lock().clone()).collect()
    }

    /// Whether `ws` has had a generation since the daemon started (its status names one).
    pub fn has_published(&self, ws: &str) -> bool {
        let map = self.statuses.lock();
        map.get(ws).is_some_and(|s| s.lock().generation.is_some())
    }

    /// Bytes all pools use, as last measured.
    pub fn pool_usage(&self) -> u64 {
        self.statuses().iter().map(|s| s.pool_bytes).sum()
    }

    /// Generations of `ws` pinned by live tasks.
    pub fn pinned(&self, ws: &str) -> BTreeSet<String> {
        let pins = self.pins.lock();
        pins.get(ws)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Pins a generation for a task.
    pub fn pin(&self, ws: &str, generation: &str) {
        let mut pins = self.pins.lock();
        *pins
            .entry(ws.to_owned())
            .or_default()
            .entry(generation.to_owned())
            .or_default() += 1;
    }

    /// Releases one pin.
    pub fn unpin(&self, ws: &str, generation: &str) {
        let mut pins = self.pins.lock();
        if let Some(m) = pins.get_mut(ws)
            && let Some(n) = m.get_mut(generation)
        {
            *n -= 1;
            if *n == 0 {
                m.remove(generation);
            }
        }
    }
}
