//! Task views and the generations they are cut from: [`Loaded`] (a generation's catalog
//! and open search index, cached while a task pins it or it is current) and
//! [`build_view`], which fills a task's view with hardlinks of its selected cards and its
//! MEMORY.md.
//!
//! Reads the pool's generations, never changes them; a view, once built, is never touched
//! again until its task is released.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use mop_cards::{Catalog, Rules, Selected};
use mop_search::{DenseState, SearchIndex};
use parking_lot::Mutex;

use super::{TaskError, internal};
use crate::paths::{MEMORY_MD, PoolPaths};
use crate::pool::objects::Linker;
use crate::pool::{Pool, PoolError, io_err};
use crate::state::State;

/// A generation loaded for selection and retrieval: catalog and open index.
pub struct Loaded {
    /// The pool whose objects are its cards' files.
    pub pool: PoolPaths,
    /// Its catalog, which owns the manifest (one copy: at 10k cards it is ~10 MiB).
    pub catalog: Catalog,
    /// Its search index.
    pub index: SearchIndex,
    /// The selection rules it was loaded with.
    pub rules: Arc<Rules>,
    /// Whether its searches fuse the dense ranking in, and if not, why.
    pub dense: DenseState,
    /// The hash of the model it was loaded with.
    pub model: Option<String>,
}

/// The loaded generations, by (workspace, generation).
pub struct LoadedGenerations {
    state: Arc<State>,
    map: Mutex<HashMap<(String, String), Arc<Loaded>>>,
    /// The rules of the last load, shared by every generation loaded with the same
    /// settings: each compiled pattern set keeps its own match caches, which grow with use.
    rules: Mutex<Option<Arc<Rules>>>,
}

impl LoadedGenerations {
    /// None loaded yet.
    pub fn new(state: Arc<State>) -> LoadedGenerations {
        LoadedGenerations {
            state,
            map: Mutex::default(),
            rules: Mutex::default(),
        }
    }

    /// A generation, loaded once (off the async workers) and then shared.
    pub async fn load(&self, ws: &str, generation: &str) -> Result<Arc<Loaded>, TaskError> {
        let key = (ws.to_owned(), generation.to_owned());
        let model = self.state.embedding_model();
        let model_hash = model.as_ref().map(|m| m.fingerprint().sha256.clone());
        // A generation loaded with another model (or none) is loaded again with this one.
        if let Some(l) = self.map.lock().get(&key)
            && l.model == model_hash
        {
            return Ok(l.clone());
        }
        let pool = Pool::open(self.state.paths(), ws).map_err(internal)?;
        let name = generation.to_owned();
        // The current generation is parsed already (the syncer keeps it); an older one a
        // task pins is read again.
        let cached = (self.state.syncers.get(ws)).and_then(|s| s.cached(generation));
        let selection = self.state.config().selection.clone();
        let shared = self.rules.lock().clone();
        let loaded = tokio::task::spawn_blocking(move || -> Result<Loaded, TaskError> {
            let g = match cached {
                Some(g) => g,
                None => Arc::new(pool.generation(&name).map_err(internal)?),
            };
            let rules = match shared {
                Some(rules) if rules.config == selection => rules,
                _ => Arc::new(Rules::new(selection).map_err(internal)?),
            };
            let (index, dense) = SearchIndex::open_with(
                &g.paths.index(),
                model.as_ref(),
                rules.config.dense_min_similarity,
            )
            .map_err(internal)?;
            if let DenseState::FailedClosed(why) = &dense {
                tracing::warn!(workspace = %pool.workspace(), generation = %name, reason = %why, "dense ranker off for this generation: BM25 alone");
            }
            let catalog = Catalog::of(&g.manifest, &rules).map_err(internal)?;
            Ok(Loaded {
                pool: pool.paths().clone(),
                catalog,
                index,
                rules,
                dense,
                model: model_hash,
            })
        })
        .await
        .map_err(internal)??;
        let loaded = Arc::new(loaded);
        *self.rules.lock() = Some(loaded.rules.clone());
        self.map.lock().insert(key, loaded.clone());
        Ok(loaded)
    }

    /// Forgets generations no task pins and that are not current.
    pub fn prune(&self) {
        let paths = self.state.paths();
        self.map.lock().retain(|(ws, g), _| {
            let current = Pool::existing(paths, ws).current_name();
            current.as_deref() == Some(g.as_str()) || self.state.pinned(ws).contains(g)
        });
    }

    /// Each loaded generation's dense ranker state, by workspace and generation.
    pub fn dense_states(&self) -> Vec<(String, String, DenseState)> {
        let mut states: Vec<_> = self
            .map
            .lock()
            .iter()
            .map(|((ws, g), l)| (ws.clone(), g.clone(), l.dense.clone()))
            .collect();
        states.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        states
    }
}

/// Fills a task's (reserved, empty) view: hardlinks of the selected cards' objects from
/// `pool` at their OKF paths, and the task's MEMORY.md, all read-only.
pub fn build_view(
    view: &Path,
    pool: &PoolPaths,
    catalog: &Catalog,
    cards: &[Selected],
    memory_md: &str,
) -> Result<(), PoolError> {
    let mut linker = Linker::new(view);
    for s in cards {
        let card = catalog.card(s.ord);
        linker.link(&pool.object(card.sha256), &card.path())?;
    }
    let md_path = view.join(MEMORY_MD);
    std::fs::write(&md_path, memory_md)
        .and_then(|_| std::fs::set_permissions(&md_path, std::fs::Permissions::from_mode(0o440)))
        .map_err(io_err(&md_path))
}
