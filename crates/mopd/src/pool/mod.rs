//! The cache pool of one workspace (DESIGN.md "Cache pool rules"): its layout is in
//! [`crate::paths::PoolPaths`].
//!
//! - [`objects`]: verified, content-addressed objects, written once through
//!   [`ObjectWriter`] and linked into task views with [`objects::Linker`];
//! - [`generations`]: building a generation beside the current one and publishing it by
//!   one `rename(2)` of the `current` link;
//! - [`earlier`]: what a new generation takes from the one before it (its index, whole
//!   or in part);
//! - [`collect`]: garbage collection and re-hashing.
//!
//! A crash at any point leaves the previous generation intact; leftovers are collected at
//! the next start. The pool knows nothing of the network or of tasks: objects arrive
//! through [`Pool::new_object`], and tasks pin generations by name.

pub mod collect;
pub mod earlier;
pub mod generations;
pub mod objects;

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub use collect::GcReport;
pub use generations::{Arrived, Building, Claim, Feed, Generation};
pub use objects::ObjectWriter;

use crate::paths::{GenerationName, Paths, PoolPaths};
use mop_proto::sync::Version;

/// Why a pool operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// File-system error, with the path.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// A downloaded object did not hash to its name.
    #[error("object {sha256} failed verification: {problem}")]
    Verify {
        /// The expected hash.
        sha256: String,
        /// What was wrong.
        problem: String,
    },
    /// A generation needs an object the pool lacks.
    #[error("object {0} is missing from the pool")]
    MissingObject(String),
    /// The search index could not be built.
    #[error("search index: {0}")]
    Index(#[from] mop_search::SearchError),
    /// A generation's manifest is unreadable.
    #[error("generation {name}: manifest unreadable: {problem}")]
    BadGeneration {
        /// The generation.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

impl PoolError {
    /// The I/O error underneath, if this is one (for classifying by kind: a full or
    /// read-only file system).
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            PoolError::Io { source, .. } => Some(source.kind()),
            PoolError::Index(mop_search::SearchError::Io { source, .. }) => Some(source.kind()),
            _ => None,
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PoolError + '_ {
    move |source| PoolError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Creates a directory (and parents) of the pool ([`crate::files::make_dir`]).
pub(crate) fn make_dir(path: &Path) -> Result<(), PoolError> {
    crate::files::make_dir(path).map_err(io_err(path))
}

/// One workspace's pool.
#[derive(Debug, Clone)]
pub struct Pool {
    ws: String,
    paths: PoolPaths,
}

impl Pool {
    /// Opens (creating) the pool of `ws`.
    pub fn open(paths: &Paths, ws: &str) -> Result<Pool, PoolError> {
        let pool = Pool::existing(paths, ws);
        pool.ensure_layout()?;
        Ok(pool)
    }

    /// The pool of `ws` without creating anything (it exists once a sync ran).
    pub fn existing(paths: &Paths, ws: &str) -> Pool {
        Pool {
            ws: ws.to_owned(),
            paths: paths.pool(ws),
        }
    }

    /// Creates whatever of the pool's directories and lock file is missing; true when
    /// anything was (someone deleted the cache under a running daemon).
    pub fn ensure_layout(&self) -> Result<bool, PoolError> {
        let p = &self.paths;
        let lock = p.lock();
        if lock.is_file() && [p.objects(), p.gens(), p.tmp()].iter().all(|d| d.is_dir()) {
            return Ok(false);
        }
        for dir in [p.objects(), p.gens(), p.tmp(), p.quarantine()] {
            make_dir(&dir)?;
        }
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o640)
            .open(&lock)
            .map_err(io_err(&lock))?;
        Ok(true)
    }

    /// Removes a workspace's pool entirely (the workspace left the config).
    pub fn remove(paths: &Paths, ws: &str) -> Result<(), PoolError> {
        let pool = paths.pool(ws);
        match fs::remove_dir_all(pool.root()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(pool.root())(e)),
            _ => Ok(()),
        }
    }

    /// The workspace.
    pub fn workspace(&self) -> &str {
        &self.ws
    }

    /// Its paths.
    pub fn paths(&self) -> &PoolPaths {
        &self.paths
    }

    /// The pool directory.
    pub fn root(&self) -> &Path {
        self.paths.root()
    }

    /// Takes the pool lock: exclusive to publish or collect, shared to read a consistent
    /// `current`. Released when the file is dropped.
    pub fn lock(&self, exclusive: bool) -> Result<File, PoolError> {
        let path = self.paths.lock();
        let f = File::open(&path).map_err(io_err(&path))?;
        if exclusive { f.lock() } else { f.lock_shared() }.map_err(io_err(&path))?;
        Ok(f)
    }

    /// The name of the current generation, if any.
    pub fn current_name(&self) -> Option<String> {
        let target = fs::read_link(self.paths.current()).ok()?;
        Some(target.file_name()?.to_string_lossy().into_owned())
    }

    /// The current generation, if one was ever published.
    pub fn current(&self) -> Result<Option<Generation>, PoolError> {
        match self.current_name() {
            None => Ok(None),
            Some(name) => self.generation(&name).map(Some),
        }
    }

    /// A generation by name.
    pub fn generation(&self, name: &str) -> Result<Generation, PoolError> {
        Generation::load(self.paths.generation(name), name)
    }

    /// The name a new generation of this version gets: never one already used (it may be
    /// current, pinned, or a leftover that collection will remove).
    pub fn fresh_name(&self, epoch: &str, revision: u64) -> GenerationName {
        let mut name = GenerationName::new(Version {
            epoch: epoch.to_owned(),
            revision,
        });
        while self.paths.generation(&name.to_string()).dir().exists() {
            name = name.next();
        }
        name
    }

    /// Bytes used by the pool (hardlinked files counted once).
    pub fn usage(&self) -> u64 {
        let mut seen = BTreeSet::new();
        let mut total = 0;
        let mut stack = vec![self.root().to_owned()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(meta) = entry.path().symlink_metadata() else {
                    continue;
                };
                if meta.is_dir() {
                    stack.push(entry.path());
                } else if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                    total += meta.len();
                }
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn paths(dir: &Path) -> Paths {
        Paths::under(dir)
    }

    /// A pool holding `n` example-like cards written as objects, and their manifest.
    pub(crate) fn pool_with_cards(dir: &std::path::Path, n: u32) -> (Pool, mop_cards::Manifest) {
        let pool = Pool::open(&paths(dir), "acme").unwrap();
        let mut cards = Vec::new();
        for i in 0..n {
            let raw = format!(
                "---\nid: 00000000-0000-4000-8000-{i:012}\ntype: fact\ntitle: Card {i}\n---\nBody {i}.\n"
            );
            let card = mop_cards::parse_card(raw.as_bytes()).unwrap();
            let e = mop_cards::ManifestEntry::for_card(&card, raw.as_bytes());
            let mut w = pool.new_object(&e.sha256, e.size).unwrap();
            w.write(raw.as_bytes()).unwrap();
            w.finish().unwrap();
            cards.push(e);
        }
        let manifest = mop_cards::Manifest {
            epoch: "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e".into(),
            revision: 1,
            generated_at: "2026-11-29T00:00:00Z".parse().unwrap(),
            since: None,
            cards,
            removed: vec![],
            inherited: Vec::new(),
        };
        (pool, manifest)
    }

    #[test]
    fn a_deleted_layout_is_recreated_and_names_are_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::open(&paths(dir.path()), "acme").unwrap();
        assert!(!pool.ensure_layout().unwrap(), "complete after open");
        fs::remove_dir_all(pool.paths().objects()).unwrap();
        assert!(pool.ensure_layout().unwrap());
        let epoch = "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e";
        let first = pool.fresh_name(epoch, 3);
        assert_eq!(first.to_string(), format!("{epoch}-3"));
        make_dir(pool.paths().generation(&first.to_string()).dir()).unwrap();
        assert_eq!(
            pool.fresh_name(epoch, 3).to_string(),
            format!("{epoch}-3~1")
        );
    }
}
