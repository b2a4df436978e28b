//! The dense ranker's model (`[selection] embedding_model`): loaded at start and at each
//! reload (off the async workers), then shared by every generation build and every loaded
//! generation. A model that cannot be loaded leaves the daemon on BM25 alone, with the
//! reason kept for `mopd status`; nothing is ever fetched.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mop_embed::Model;
use parking_lot::Mutex;

/// The configured model, or why there is none.
pub type Loaded = Result<Arc<Model>, String>;

/// The model last loaded, by directory.
#[derive(Default)]
pub struct Embedding {
    cached: Mutex<Option<(PathBuf, Loaded)>>,
}

impl Embedding {
    /// The model in `dir` (None when no model is configured). A reload of the config that
    /// names another directory loads that one; a failed load is retried only then, so a
    /// broken model costs one attempt, not one per generation.
    pub fn model(&self, dir: Option<&Path>) -> Option<Loaded> {
        let dir = dir?;
        let mut cached = self.cached.lock();
        if let Some((path, loaded)) = cached.as_ref()
            && path == dir
        {
            return Some(loaded.clone());
        }
        let loaded = Model::load(dir).map(Arc::new).map_err(|e| e.to_string());
        match &loaded {
            Ok(m) => {
                tracing::info!(model = %m.fingerprint(), "embedding model loaded: hybrid retrieval on")
            }
            Err(e) => tracing::warn!(error = %e, "embedding model unusable: BM25 alone"),
        }
        *cached = Some((dir.to_owned(), loaded.clone()));
        Some(loaded)
    }

    /// What [`Embedding::model`] would answer, without loading anything: `None` also
    /// when the configured directory has not been loaded yet.
    pub fn peek(&self, dir: Option<&Path>) -> Option<Loaded> {
        let dir = dir?;
        let cached = self.cached.lock();
        cached
            .as_ref()
            .filter(|(path, _)| path == dir)
            .map(|(_, loaded)| loaded.clone())
    }

    /// Forgets the loaded model, so the next use loads the configured one again (after a
    /// reload: the files may have been installed or replaced at the same path).
    pub fn forget(&self) {
        *self.cached.lock() = None;
    }

    /// The model if one is configured and loads.
    pub fn usable(&self, dir: Option<&Path>) -> Option<Arc<Model>> {
        self.model(dir).and_then(Result::ok)
    }
}
