//! A pool's generations: one manifest and the search index built for it, both immutable.
//! A generation is built beside the current one (on a thread of its own, while a sync is
//! still fetching its objects) under a [`Claim`] that keeps collection away from it,
//! flushed with one `syncfs(2)`, and published by renaming a new `current` link over the
//! old one under the pool's exclusive lock.
//!
//! A generation has no card tree of its own: a card's file is its object, which the
//! manifest names by hash, and a task's view links the objects of its cards. A tree of
//! hardlinks per generation made an edit of one card cost a link per card of the
//! workspace to build it and an unlink per card to collect it.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use mop_cards::{Manifest, ManifestEntry};
use mop_search::IndexBuilder;

use super::earlier::{Earlier, index_doc};
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
}

/// A verified object, just named in the pool, with its bytes: how a generation being
/// built gets the objects a sync fetches, without reading them back from disk.
#[derive(Debug)]
pub struct Arrived {
    /// Its name.
    pub sha256: String,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// Where the fetcher hands over the [`Arrived`] objects of a generation being built, a
/// few at a time (those of one network read).
pub struct Feed {
    tx: tokio::sync::mpsc::UnboundedSender<Handover>,
    room: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed").finish_non_exhaustive()
    }
}

impl Feed {
    /// Hands `arrived` (objects just named in the pool) to the build. A build that has
    /// stopped (it failed, and says why when it is finished) takes nothing more.
    pub async fn hand_over(&self, arrived: Vec<Arrived>) -> Result<(), PoolError> {
        if arrived.is_empty() {
            return Ok(());
        }
        let kib: usize = arrived.iter().map(|a| a.bytes.len().div_ceil(1024)).sum();
        let kib = (kib as u32).clamp(1, FEED_KIB);
        let room = self.room.clone().acquire_many_owned(kib).await;
        if let Ok(room) = room {
            let _ = self.tx.send(Handover { arrived, room });
        }
        Ok(())
    }
}

/// Objects handed over together, holding their share of the feed's room until they are
/// indexed.
struct Handover {
    arrived: Vec<Arrived>,
    room: tokio::sync::OwnedSemaphorePermit,
}

/// A build waits for every arriving object and then indexes from the pool (in two halves
/// at once, or from the earlier generation's index) when fewer than one card in this many
/// has its object arriving, or is new to the index (an incremental sync).
const FEW_ARRIVING: usize = 4;

/// Bytes of bodies (in KiB) handed over and not yet indexed, at most: the fetch waits for
/// the build beyond this, so a build slower than the network never holds a workspace's
/// worth of bodies. A few MiB let each go at its own pace: with 32 handovers at most
/// (about 100 KiB) the fetch kept waiting for the build and then the build for the fetch
/// (three alternating cold syncs of 10k cards on two cores: 939-978 ms, against 766-965
/// ms with no bound).
const FEED_KIB: u32 = 16 * 1024;

/// A generation directory a live build holds: collection leaves it alone while this
/// lives, whoever collects (a sync publishing meanwhile, a repair, `mopd verify` from
/// another process). It is an `flock(2)` on the directory, which the kernel drops with
/// the process, so what a killed daemon left half-built is collected at the next start.
/// Keep it until the generation is published: from then on it is current.
#[derive(Debug)]
pub struct Claim {
    name: String,
    _dir: File,
}

impl Claim {
    /// The generation's name (its directory under `gens/`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A generation being built on a thread of its own (see [`Pool::start_generation`]).
#[derive(Debug)]
pub struct Building {
    claim: Claim,
    thread: std::thread::JoinHandle<Result<std::time::Duration, PoolError>>,
}

impl Building {
    /// The generation's name (its directory under `gens/` exists from the start).
    pub fn name(&self) -> &str {
        self.claim.name()
    }

    /// Waits for the build to end; returns the generation's claim and the CPU time the
    /// build's thread took. Drop the feed first: a build still waiting for an object
    /// fails when the feed closes, and then removes what it had written.
    pub fn finish(self) -> Result<(Claim, std::time::Duration), PoolError> {
        match self.thread.join() {
            Ok(Ok(cpu)) => Ok((self.claim, cpu)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(PoolError::Io {
                path: self.claim.name,
                source: io::Error::other("the generation build panicked"),
            }),
        }
    }
}

/// Waits until every object in `arriving` has been handed over (they are then in the
/// pool).
fn wait_for_all(
    arriving: &[String],
    arrivals: &mut tokio::sync::mpsc::UnboundedReceiver<Handover>,
) -> Result<(), PoolError> {
    let mut got = 0;
    while got < arriving.len() {
        let Some(h) = arrivals.blocking_recv() else {
            return Err(PoolError::MissingObject(arriving[got].clone()));
        };
        got += h.arrived.len();
    }
    Ok(())
}

/// Makes a written index's files read-only, as every file of a generation is.
fn finish_index(index_dir: &std::path::Path) -> Result<(), PoolError> {
    for f in fs::read_dir(index_dir).map_err(io_err(index_dir))? {
        let p = f.map_err(io_err(index_dir))?.path();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o440)).map_err(io_err(&p))?;
    }
    Ok(())
}

/// One build at a time across workspaces: a build holds its index's tables (tens of MiB
/// at 100k cards), and five at once after a cold start peaked at 415 MiB. On two cores
/// parallel builds gain little time.
static ONE_BUILD: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

impl Pool {
    /// Builds a generation for a full manifest (cards sorted by id) beside the current one
    /// from objects already in the pool: the manifest and the search index (with a model,
    /// the card vectors too). Not visible until [`Pool::publish`].
    pub fn build_generation(
        &self,
        manifest: Arc<Manifest>,
        model: Option<Arc<mop_embed::Model>>,
    ) -> Result<String, PoolError> {
        let (building, feed) = self.start_generation(manifest, Vec::new(), None, model)?;
        drop(feed);
        Ok(building.finish()?.0.name)
    }

    /// Starts building a generation for a full manifest (cards sorted by id) beside the
    /// current one, on a thread of its own, while the objects in `arriving` (each once, in
    /// the order of the first card that names it) are still being fetched: each comes
    /// through the returned [`Feed`] once it is verified and named in the pool, and every
    /// other object is read from the pool. Cards are indexed in ordinal order as they
    /// come, so the index and the card vectors are built while the network is still busy.
    /// With `earlier`, the index is made from the previous generation's when it can be
    /// ([`Earlier`]). Not visible until [`Pool::publish`].
    pub fn start_generation(
        &self,
        manifest: Arc<Manifest>,
        arriving: Vec<String>,
        earlier: Option<Earlier>,
        model: Option<Arc<mop_embed::Model>>,
    ) -> Result<(Building, Feed), PoolError> {
        if !mop_cards::is_epoch(&manifest.epoch) {
            return Err(PoolError::Io {
                path: self.paths().gens().display().to_string(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a generation's epoch must be a UUID",
                ),
            });
        }
        let claim = self.claim(&manifest.epoch, manifest.revision)?;
        let name = claim.name().to_owned();
        let (tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
        let feed = Feed {
            tx,
            room: Arc::new(tokio::sync::Semaphore::new(FEED_KIB as usize)),
        };
        let pool = self.clone();
        let building = name.clone();
        let thread = std::thread::Builder::new()
            .name("mopd-build".into())
            .spawn(move || {
                let built = pool
                    .build_into(&building, &manifest, &arriving, arrivals, earlier, model)
                    .map(|()| crate::sys::thread_cpu_time());
                if built.is_err() {
                    let dir = pool.paths().generation(&building);
                    let _ = fs::remove_dir_all(dir.dir());
                }
                built
            })
            .map_err(io_err(self.paths().gens().as_path()))?;
        Ok((Building { claim, thread }, feed))
    }

    /// Makes and claims the directory of a new generation of this version: its name is
    /// never one already used (it may be current, pinned, a leftover that collection
    /// will remove, or another build's), since making the directory is what reserves it.
    /// The pool's shared lock is held meanwhile, so that no collection (which takes the
    /// exclusive one) comes between making the directory and claiming it.
    fn claim(&self, epoch: &str, revision: u64) -> Result<Claim, PoolError> {
        use std::os::unix::fs::DirBuilderExt;
        let _no_collection = self.lock(false)?;
        let mut name = self.fresh_name(epoch, revision);
        loop {
            let dir = self.paths().generation(&name.to_string());
            match fs::DirBuilder::new().mode(0o750).create(dir.dir()) {
                Ok(()) => {
                    let held = File::open(dir.dir()).map_err(io_err(dir.dir()))?;
                    held.lock().map_err(io_err(dir.dir()))?;
                    let name = name.to_string();
                    return Ok(Claim { name, _dir: held });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => name = name.next(),
                Err(e) => return Err(io_err(dir.dir())(e)),
            }
        }
    }

    /// The work of [`Pool::start_generation`]'s thread.
    fn build_into(
        &self,
        name: &str,
        manifest: &Manifest,
        arriving: &[String],
        arrivals: tokio::sync::mpsc::UnboundedReceiver<Handover>,
        earlier: Option<Earlier>,
        model: Option<Arc<mop_embed::Model>>,
    ) -> Result<(), PoolError> {
        let _building = ONE_BUILD.lock();
        let paths = self.paths().generation(name);
        // The manifest is known before any object comes: it is written on a thread of its
        // own while the index is made (at 10k cards each takes about 15 ms after an edit).
        std::thread::scope(|s| {
            let written = s.spawn(|| {
                let manifest_path = paths.manifest();
                let json = serde_json::to_vec(manifest).expect("manifests serialize");
                fs::write(&manifest_path, json).map_err(io_err(&manifest_path))?;
                fs::set_permissions(&manifest_path, fs::Permissions::from_mode(0o440))
                    .map_err(io_err(&manifest_path))
            });
            let indexed = self.index_into(&paths, manifest, arriving, arrivals, earlier, model);
            let written = written.join().expect("writing a manifest does not panic");
            indexed.and(written)
        })
    }

    /// The index of [`Pool::build_into`].
    fn index_into(
        &self,
        paths: &GenerationPaths,
        manifest: &Manifest,
        arriving: &[String],
        mut arrivals: tokio::sync::mpsc::UnboundedReceiver<Handover>,
        earlier: Option<Earlier>,
        model: Option<Arc<mop_embed::Model>>,
    ) -> Result<(), PoolError> {
        let cards = &manifest.cards;
        let model = model.as_deref();
        let mut all_in = false;
        if let Some(earlier) = &earlier {
            let merge = model.is_none() && earlier.new_cards() * FEW_ARRIVING <= cards.len();
            if earlier.unchanged() || merge {
                // Every object first, even when the index is taken whole: a fetch that
                // failed must fail the build, or the generation would name an object the
                // pool lacks.
                all_in = true;
                wait_for_all(arriving, &mut arrivals)?;
            }
            if earlier.unchanged() && self.take_index(earlier, paths, model) {
                return Ok(());
            }
            if merge && self.merge_index(earlier, paths, manifest) {
                return finish_index(&paths.index());
            }
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let index = if all_in || arriving.len() * FEW_ARRIVING <= cards.len() {
            // Few objects arrive (an incremental sync, a rebuild): once they are all in,
            // the cards are read from the pool, with two cores in two halves at once.
            if !all_in {
                wait_for_all(arriving, &mut arrivals)?;
            }
            let from_pool = |e: &ManifestEntry| self.read_object(e);
            if cores < 2 || cards.len() < mop_search::PARALLEL_MIN {
                self.index_cards(cards, 0, from_pool, model)?
            } else {
                let half = cards.len() / 2;
                let (mut first, later) = std::thread::scope(|s| {
                    let later =
                        s.spawn(|| self.index_cards(&cards[half..], half, from_pool, model));
                    let first = self.index_cards(&cards[..half], 0, from_pool, model);
                    let later = later.join().expect("indexing does not panic");
                    first.and_then(|f| Ok((f, later?)))
                })?;
                first.append(later)?;
                first
            }
        } else {
            let mut next = arriving.iter().peekable();
            let mut waiting = std::collections::VecDeque::new();
            // The room of the handover being indexed, given back with the next one.
            let mut _held = None;
            let source = |e: &ManifestEntry| {
                if next.peek() != Some(&&e.sha256) {
                    return self.read_object(e);
                }
                next.next();
                let missing = || PoolError::MissingObject(e.sha256.clone());
                if waiting.is_empty() {
                    // The fetch ended (failed) before this object came.
                    let next = arrivals.blocking_recv().ok_or_else(missing)?;
                    _held = Some(next.room);
                    waiting.extend(next.arrived);
                }
                let got: Arrived = waiting.pop_front().ok_or_else(missing)?;
                if got.sha256 != e.sha256 {
                    return Err(PoolError::Io {
                        path: self.object_path(&e.sha256).display().to_string(),
                        source: io::Error::other(format!(
                            "object {} arrived where {} was due",
                            got.sha256, e.sha256
                        )),
                    });
                }
                Ok(got.bytes)
            };
            self.index_cards(cards, 0, source, model)?
        };
        let index_dir = paths.index();
        make_dir(&index_dir)?;
        let report = index.write(&index_dir)?;
        if let Some(why) = report.vectors_error {
            tracing::warn!(workspace = %self.workspace(), generation = %paths.dir().display(), error = %why, "card vectors not stored: this generation ranks by BM25 alone");
        }
        crate::sys::release_freed_memory();
        finish_index(&index_dir)
    }

    /// Indexes `cards` (those from ordinal `first` on), each object's bytes from `source`.
    fn index_cards<'m>(
        &self,
        cards: &[ManifestEntry],
        first: usize,
        mut source: impl FnMut(&ManifestEntry) -> Result<Vec<u8>, PoolError>,
        model: Option<&'m mop_embed::Model>,
    ) -> Result<IndexBuilder<'m>, PoolError> {
        let mut index = IndexBuilder::starting_at(first as u32, model);
        for (ord, e) in (first..).zip(cards) {
            let raw = source(e)?;
            if raw.len() as u64 != e.size {
                return Err(PoolError::MissingObject(e.sha256.clone()));
            }
            index.add(index_doc(ord as u32, e, &raw))?;
        }
        Ok(index)
    }

    /// An object's bytes, read from the pool.
    pub(super) fn read_object(&self, e: &ManifestEntry) -> Result<Vec<u8>, PoolError> {
        fs::read(self.object_path(&e.sha256))
            .map_err(|_| PoolError::MissingObject(e.sha256.clone()))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The two ways a generation is built, streaming the objects as they arrive (a cold
    /// sync) or reading them from the pool in two halves at once (few arriving), make the
    /// same index, byte for byte.
    #[test]
    fn streamed_and_two_half_builds_are_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let n = mop_search::PARALLEL_MIN as u32 + 7;
        let (pool, manifest) = super::super::tests::pool_with_cards(dir.path(), n);
        let manifest = Arc::new(manifest);
        let halves = pool.build_generation(manifest.clone(), None).unwrap();
        // Every object "arrives", a few at a time, as a fetch would hand them over.
        let shas: Vec<String> = manifest.cards.iter().map(|c| c.sha256.clone()).collect();
        let (building, feed) = pool
            .start_generation(manifest.clone(), shas, None, None)
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for chunk in manifest.cards.chunks(37) {
            let arrived = chunk
                .iter()
                .map(|c| Arrived {
                    sha256: c.sha256.clone(),
                    bytes: fs::read(pool.object_path(&c.sha256)).unwrap(),
                })
                .collect();
            rt.block_on(feed.hand_over(arrived)).unwrap();
        }
        drop(feed);
        let streamed = building.finish().unwrap().0.name;
        let index = |name: &str| {
            fs::read(pool.paths().generation(name).index().join("postings.mop")).unwrap()
        };
        assert_eq!(index(&halves), index(&streamed));
        // A fetch that ends early fails the build, and nothing of it is left.
        let shas: Vec<String> = manifest.cards.iter().map(|c| c.sha256.clone()).collect();
        let (building, feed) = pool
            .start_generation(manifest.clone(), shas, None, None)
            .unwrap();
        let name = building.name().to_owned();
        drop(feed);
        assert!(matches!(
            building.finish(),
            Err(PoolError::MissingObject(_))
        ));
        assert!(!pool.paths().generation(&name).dir().exists());
    }
}
