//! What the server keeps in memory: each workspace's revision (so `If-None-Match` is
//! answered without touching the database), the token table, and the last full manifest of
//! each workspace, serialized and compressed once per revision.
//!
//! Changes made by this process update the caches directly; changes made by another
//! process on the same database (the `token` and `import` commands, other replicas) are
//! noticed through the store's `data_version` within a second.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use bytes::Bytes;

use crate::config::ServerConfig;
use crate::rate::Buckets;
use crate::search::SearchCache;
use crate::store::{Store, TokenInfo};

/// A full manifest ready to send.
#[derive(Debug)]
pub struct CachedManifest {
    /// The revision it describes.
    pub revision: u64,
    /// How many cards it lists.
    pub cards: usize,
    /// JSON.
    pub json: Bytes,
    /// The same in gzip and in zstd, each compressed when first asked for.
    gzip: std::sync::OnceLock<Bytes>,
    zstd: std::sync::OnceLock<Bytes>,
}

impl CachedManifest {
    /// A manifest's JSON, of `revision` with `cards` cards.
    pub fn new(revision: u64, cards: usize, json: Bytes) -> CachedManifest {
        CachedManifest {
            revision,
            cards,
            json,
            gzip: Default::default(),
            zstd: Default::default(),
        }
    }

    /// The body in `coding` (compressed once per coding and revision).
    pub fn body(&self, coding: crate::encoding::Coding) -> Bytes {
        use crate::encoding::Coding;
        match coding {
            Coding::Identity => self.json.clone(),
            Coding::Gzip => self.gzip.get_or_init(|| coding.encode(&self.json)).clone(),
            Coding::Zstd => self.zstd.get_or_init(|| coding.encode(&self.json)).clone(),
        }
    }
}

/// Which store rate a store met, with the seconds until the next store would be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreRate {
    /// The task's share (`limits.stores_per_task_per_minute`).
    Task(u64),
    /// The token's, a whole host's (`limits.stores_per_token_per_minute`).
    Token(u64),
}

/// Shared server state.
#[derive(Debug)]
pub struct AppState {
    /// The database.
    pub store: Arc<Store>,
    /// The config in force.
    pub config: ServerConfig,
    revisions: RwLock<HashMap<String, u64>>,
    tokens: RwLock<HashMap<String, Arc<TokenInfo>>>,
    manifests: Mutex<HashMap<String, Arc<CachedManifest>>>,
    /// One full-manifest build per workspace at a time (see `api::sync`).
    builds: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    data_version: Mutex<Option<i64>>,
    /// Store budget per token id (`limits.stores_per_token_per_minute`): a host's share.
    token_stores: Buckets<String>,
    /// Store budget per (token id, task id) (`limits.stores_per_task_per_minute`): each
    /// task's share, taken before the host's, so one task cannot spend all of it.
    task_stores: Buckets<(String, String)>,
    /// Last use of each token since the last flush to the database.
    token_uses: Mutex<HashMap<String, jiff::Timestamp>>,
    /// The curation search indexes.
    pub search: SearchCache,
    /// Prometheus metrics.
    pub metrics: crate::metrics::Metrics,
}

impl AppState {
    /// Loads the caches from the store.
    pub fn new(store: Arc<Store>, config: ServerConfig) -> crate::store::Result<AppState> {
        let state = AppState {
            store,
            revisions: RwLock::default(),
            tokens: RwLock::default(),
            manifests: Mutex::default(),
            builds: Mutex::default(),
            data_version: Mutex::default(),
            token_stores: Buckets::new(config.limits.stores_per_token_per_minute),
            task_stores: Buckets::new(config.limits.stores_per_task_per_minute),
            token_uses: Mutex::default(),
            metrics: crate::metrics::Metrics::new(),
            search: SearchCache::new(
                config
                    .server
                    .db
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(std::path::Path::new("."))
                    .join("curation-index"),
            ),
            config,
        };
        state.reload()?;
        Ok(state)
    }

    /// Re-reads revisions and tokens from the database.
    pub fn reload(&self) -> crate::store::Result<()> {
        let revisions: HashMap<String, u64> = self
            .store
            .revisions()?
            .into_iter()
            .map(|(ws, rev, _)| (ws, rev))
            .collect();
        let tokens: HashMap<String, Arc<TokenInfo>> = self
            .store
            .token_table()?
            .into_iter()
            .map(|(h, t)| (h, Arc::new(t)))
            .collect();
        {
            // A reload that read the database just before a write of this process
            // committed must not undo that write's `note_revision`: within a process a
            // revision only grows (else the next poll would get a stale 304).
            let mut map = self.revisions.write();
            let merged = revisions
                .into_iter()
                .map(|(ws, rev)| {
                    let known = map.get(&ws).copied().unwrap_or(0);
                    (ws, rev.max(known))
                })
                .collect();
            *map = merged;
        }
        *self.tokens.write() = tokens;
        Ok(())
    }

    /// Reloads the caches if another connection committed since the last look. Cheap when
    /// nothing changed (one `PRAGMA data_version`), so a cache miss can afford it.
    pub fn refresh_if_changed(&self) -> crate::store::Result<bool> {
        // Called from async handlers too (a token or workspace not in the cache). Waiting
        // for another caller's reload, or for the database, must not hold up the other
        // requests of this worker thread: they are handed to other threads meanwhile.
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.refresh_now())
            }
            _ => self.refresh_now(),
        }
    }

    fn refresh_now(&self) -> crate::store::Result<bool> {
        // One reload at a time; a caller that waited sees the reload that ran meanwhile.
        let mut last = self.data_version.lock();
        let version = self.store.data_version()?;
        if *last == Some(version) {
            return Ok(false);
        }
        self.reload()?;
        tracing::debug!(
            version,
            tokens = self.tokens.read().len(),
            "caches reloaded"
        );
        *last = Some(version);
        Ok(true)
    }

    /// The token with this hash.
    pub fn token(&self, hash: &str) -> Option<Arc<TokenInfo>> {
        self.tokens.read().get(hash).cloned()
    }

    /// A workspace's current revision, if it exists.
    pub fn revision(&self, ws: &str) -> Option<u64> {
        self.revisions.read().get(ws).copied()
    }

    /// Records a revision this process just committed (never moves backwards).
    pub fn note_revision(&self, ws: &str, revision: u64) {
        let mut map = self.revisions.write();
        let slot = map.entry(ws.to_owned()).or_insert(revision);
        *slot = (*slot).max(revision);
    }

    /// The cached full manifest of a workspace, if it is for `revision`.
    pub fn cached_manifest(&self, ws: &str, revision: u64) -> Option<Arc<CachedManifest>> {
        let map = self.manifests.lock();
        map.get(ws).filter(|m| m.revision == revision).cloned()
    }

    /// The newest full manifest cached for `ws`, whatever its revision.
    pub fn latest_manifest(&self, ws: &str) -> Option<Arc<CachedManifest>> {
        let map = self.manifests.lock();
        map.get(ws).cloned()
    }

    /// Takes one store from the task's per-minute share, then from its token's (the
    /// host's) budget. `Err` names the limit met and the seconds until the next store
    /// would be allowed; the host's budget is untouched when the task's share is spent.
    pub fn take_store_budget(&self, token_id: &str, task_id: &str) -> Result<(), StoreRate> {
        self.task_stores
            .take(&(token_id.to_owned(), task_id.to_owned()))
            .map_err(StoreRate::Task)?;
        self.token_stores
            .take(&token_id.to_owned())
            .map_err(StoreRate::Token)
    }

    /// Notes that a token was used now (written to the database by [`AppState::take_token_uses`]'s
    /// caller, at most once a minute, so polls stay free of writes).
    pub fn note_token_use(&self, token_id: &str) {
        let now = jiff::Timestamp::now();
        let mut uses = self.token_uses.lock();
        match uses.get_mut(token_id) {
            Some(at) => *at = now,
            None => {
                uses.insert(token_id.to_owned(), now);
            }
        }
    }

    /// The token uses noted since the last call.
    pub fn take_token_uses(&self) -> Vec<(String, jiff::Timestamp)> {
        std::mem::take(&mut *self.token_uses.lock())
            .into_iter()
            .collect()
    }

    /// The lock a full-manifest build of `ws` holds.
    pub fn build_lock(&self, ws: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.builds.lock();
        map.entry(ws.to_owned()).or_default().clone()
    }

    /// Keeps a full manifest unless a newer one is cached already.
    pub fn cache_manifest(&self, ws: &str, manifest: Arc<CachedManifest>) {
        let mut map = self.manifests.lock();
        match map.get(ws) {
            Some(m) if m.revision >= manifest.revision => {}
            _ => {
                map.insert(ws.to_owned(), manifest);
            }
        }
    }
}
