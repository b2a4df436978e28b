//! A pool's generations: the hardlink tree of one manifest, the manifest itself and the
//! search index built for it, all immutable. A generation is built beside the current
//! one, flushed with one `syncfs(2)`, and published by renaming a new `current` link over
//! the old one under the pool's exclusive lock.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;

use mop_cards::{Manifest, card_body, card_path};
use mop_search::{IndexDoc, build_index_with};

use super::objects::Linker;
use super::{Pool, PoolError, io_err, make_dir};
use crate::paths::{GenerationPaths, PoolPaths};

/// A published (or pinned) generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Directory name under `gens/`.
    pub name: String,
    /// Its paths.
    pub paths: GenerationPaths,
    /// Its manifest (a full one, cards sorted by id).
    pub manifest: Manifest,
}

impl Generation {
    /// Loads a generation's manifest.
    pub fn load(paths: GenerationPaths, name: &str) -> Result<Generation, PoolError> {
        let path = paths.manifest();
        let bytes = fs::read(&path).map_err(io_err(&path))?;
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| PoolError::BadGeneration {
                name: name.to_owned(),
                problem: e.to_string(),
            })?;
        Ok(Generation {
            name: name.to_owned(),
            paths,
            manifest,
        })
    }

    /// The card tree.
    pub fn tree(&self) -> std::path::PathBuf {
        self.paths.tree()
    }
}

impl Pool {
    /// Builds a generation for a full manifest (cards sorted by id) beside the current one:
    /// the hardlink tree, the manifest and the search index (with a model, the card
    /// vectors too). Every object must be present.
    /// Not visible until [`Pool::publish`].
    pub fn build_generation(
        &self,
        manifest: &Manifest,
        model: Option<&mop_embed::Model>,
    ) -> Result<String, PoolError> {
        // One build at a time across workspaces: an index build holds tens of MiB of
        // buffers, and five at once after a cold start peaked at 415 MiB. On two cores
        // parallel builds gain little time.
        static ONE_BUILD: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
        let _building = ONE_BUILD.lock();
        if !mop_cards::is_epoch(&manifest.epoch) {
            return Err(PoolError::Io {
                path: self.paths().gens().display().to_string(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a generation's epoch must be a UUID",
                ),
            });
        }
        let name = self
            .fresh_name(&manifest.epoch, manifest.revision)
            .to_string();
        let paths = self.paths().generation(&name);
        let tree = paths.tree();
        make_dir(&tree)?;
        let mut linker = Linker::new(&tree);
        for e in &manifest.cards {
            let object = self.object_path(&e.sha256);
            let meta =
                fs::metadata(&object).map_err(|_| PoolError::MissingObject(e.sha256.clone()))?;
            if meta.len() != e.size {
                return Err(PoolError::MissingObject(e.sha256.clone()));
            }
            linker.link(&object, &card_path(e.summary.card_type, &e.summary.id))?;
        }
        let manifest_path = paths.manifest();
        let json = serde_json::to_vec(manifest).expect("manifests serialize");
        fs::write(&manifest_path, json).map_err(io_err(&manifest_path))?;
        fs::set_permissions(&manifest_path, fs::Permissions::from_mode(0o440))
            .map_err(io_err(&manifest_path))?;

        let index = paths.index();
        make_dir(&index)?;
        // Bodies are read one at a time as the index asks for them: holding them all
        // would cost the whole workspace's size in memory for the length of the build.
        let unreadable = std::cell::RefCell::new(None);
        let docs = manifest.cards.iter().enumerate().map(|(ord, e)| {
            let object = self.object_path(&e.sha256);
            let body = match fs::read(&object) {
                Ok(raw) => card_body(&raw).unwrap_or("").to_owned(),
                Err(err) => {
                    unreadable.borrow_mut().get_or_insert(io_err(&object)(err));
                    String::new()
                }
            };
            IndexDoc {
                ord: ord as u32,
                title: &e.summary.title,
                description: e.summary.description.as_deref().unwrap_or(""),
                labels: &e.summary.labels,
                body: body.into(),
                open: e.summary.is_open(),
            }
        });
        let report = build_index_with(&index, docs, model)?;
        if let Some(why) = report.vectors_error {
            tracing::warn!(workspace = %self.workspace(), generation = %name, error = %why, "card vectors not stored: this generation ranks by BM25 alone");
        }
        if let Some(err) = unreadable.into_inner() {
            return Err(err);
        }
        crate::sys::release_freed_memory();
        for f in fs::read_dir(&index).map_err(io_err(&index))? {
            let p = f.map_err(io_err(&index))?.path();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o440)).map_err(io_err(&p))?;
        }
        Ok(name)
    }

    /// Makes a built generation current: one `syncfs(2)` flushes it (and the objects it
    /// links), then one `rename(2)` swaps the `current` link under the exclusive lock.
    pub fn publish(&self, name: &str) -> Result<(), PoolError> {
        let root = File::open(self.root()).map_err(io_err(self.root()))?;
        nix::unistd::syncfs(&root).map_err(|e| io_err(self.root())(io::Error::from(e)))?;
        let _lock = self.lock(true)?;
        let tmp_link = self
            .paths()
            .tmp()
            .join(format!("current.{}", std::process::id()));
        let _ = fs::remove_file(&tmp_link);
        std::os::unix::fs::symlink(PoolPaths::current_target(name), &tmp_link)
            .map_err(io_err(&tmp_link))?;
        let current = self.paths().current();
        fs::rename(&tmp_link, &current).map_err(io_err(&current))?;
        Ok(())
    }
}
