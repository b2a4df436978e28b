//! The cache pool of one workspace (DESIGN.md "Cache pool rules").
//!
//! ```text
//! <cache_dir>/pools/<ws>/
//!   objects/ab/<sha256>   verified card files, 0440, written once, never reopened
//!   gens/<epoch>-<rev>/   tree/<pillar>/<id>.md (hardlinks), manifest.json, index/
//!   current -> gens/…     swapped by one rename(2) under the exclusive lock
//!   lock                  flock: exclusive to publish or collect, shared to read
//!   tmp/                  objects being downloaded (nothing unverified is renamed out)
//!   quarantine/           objects that failed a re-hash
//! ```
//!
//! A generation is built beside the current one, flushed with one `syncfs(2)`, then
//! published by renaming a new `current` link over the old one. A crash at any point
//! leaves the previous generation intact; leftovers are collected at the next start.

use std::collections::BTreeSet;
use std::fs::{self, DirBuilder, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use mop_cards::{Manifest, card_body, card_path};
use mop_search::{IndexDoc, build_index};
use sha2::{Digest, Sha256};

/// Directory inside a generation holding the card tree.
pub const TREE: &str = "tree";
/// The manifest file inside a generation.
pub const MANIFEST: &str = "manifest.json";
/// The search index directory inside a generation.
pub const INDEX: &str = "index";

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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PoolError + '_ {
    move |source| PoolError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Creates a directory (and parents) with mode 0750.
pub fn make_dir(path: &Path) -> Result<(), PoolError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(path)
        .map_err(io_err(path))
}

/// One workspace's pool.
#[derive(Debug, Clone)]
pub struct Pool {
    ws: String,
    root: PathBuf,
}

/// A published (or pinned) generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Directory name under `gens/`.
    pub name: String,
    /// Its path.
    pub dir: PathBuf,
    /// Its manifest (a full one, cards sorted by id).
    pub manifest: Manifest,
}

impl Generation {
    /// Loads a generation's manifest.
    pub fn load(dir: &Path) -> Result<Generation, PoolError> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let path = dir.join(MANIFEST);
        let bytes = fs::read(&path).map_err(io_err(&path))?;
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| PoolError::BadGeneration {
                name: name.clone(),
                problem: e.to_string(),
            })?;
        Ok(Generation {
            name,
            dir: dir.to_owned(),
            manifest,
        })
    }

    /// The card tree.
    pub fn tree(&self) -> PathBuf {
        self.dir.join(TREE)
    }
}

/// What garbage collection removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Generations removed.
    pub generations: usize,
    /// Objects removed.
    pub objects: usize,
}

/// What a re-hash found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VerifyReport {
    /// Objects hashed.
    pub objects_checked: usize,
    /// Objects whose content did not match their name (now in quarantine/).
    pub bad_objects: Vec<String>,
    /// Objects the current generation needs that the pool lacks.
    pub missing_objects: Vec<String>,
    /// Generation files whose content does not match the manifest.
    pub damaged_files: Vec<String>,
    /// The current generation.
    pub current: Option<String>,
}

impl VerifyReport {
    /// True when nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.bad_objects.is_empty()
            && self.missing_objects.is_empty()
            && self.damaged_files.is_empty()
    }
}

/// Writes one downloaded object: hashed while it streams, renamed into place only once
/// size and hash match. Dropping it unfinished leaves nothing behind.
pub struct ObjectWriter {
    tmp: tempfile::NamedTempFile,
    hasher: Sha256,
    written: u64,
    sha256: String,
    size: u64,
    dest: PathBuf,
}

impl ObjectWriter {
    /// Appends bytes; refuses more than the announced size.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), PoolError> {
        self.written += chunk.len() as u64;
        if self.written > self.size {
            return Err(PoolError::Verify {
                sha256: self.sha256.clone(),
                problem: format!("more than the announced {} bytes", self.size),
            });
        }
        self.hasher.update(chunk);
        self.tmp.write_all(chunk).map_err(io_err(self.tmp.path()))
    }

    /// Verifies and renames into place (0440).
    pub fn finish(self) -> Result<(), PoolError> {
        if self.written != self.size {
            return Err(PoolError::Verify {
                sha256: self.sha256,
                problem: format!("{} bytes instead of {}", self.written, self.size),
            });
        }
        let got = hex(&self.hasher.finalize());
        if got != self.sha256 {
            return Err(PoolError::Verify {
                sha256: self.sha256,
                problem: format!("content hashes to {got}"),
            });
        }
        let file = self.tmp.as_file();
        file.set_permissions(fs::Permissions::from_mode(0o440))
            .map_err(io_err(self.tmp.path()))?;
        let parent = self
            .dest
            .parent()
            .expect("objects have a fan-out directory");
        make_dir(parent)?;
        match self.tmp.persist_noclobber(&self.dest) {
            Ok(_) => Ok(()),
            // Already there (fetched twice): the existing copy has the same name, hence content.
            Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(PoolError::Io {
                path: self.dest.display().to_string(),
                source: e.error,
            }),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// SHA-256 of a file, streamed.
pub fn hash_file(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

impl Pool {
    /// Opens (creating) the pool of `ws` under `cache_dir`.
    pub fn open(cache_dir: &Path, ws: &str) -> Result<Pool, PoolError> {
        let pool = Pool::existing(cache_dir, ws);
        pool.ensure_layout()?;
        Ok(pool)
    }

    /// Creates whatever of the pool's directories and lock file is missing; true when
    /// anything was (someone deleted the cache under a running daemon).
    pub fn ensure_layout(&self) -> Result<bool, PoolError> {
        let lock = self.root.join("lock");
        if lock.is_file()
            && ["objects", "gens", "tmp"]
                .iter()
                .all(|d| self.root.join(d).is_dir())
        {
            return Ok(false);
        }
        for sub in ["objects", "gens", "tmp", "quarantine"] {
            make_dir(&self.root.join(sub))?;
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

    /// The pool of `ws` without creating anything (it exists once a sync ran).
    pub fn existing(cache_dir: &Path, ws: &str) -> Pool {
        Pool {
            ws: ws.to_owned(),
            root: cache_dir.join("pools").join(ws),
        }
    }

    /// Removes a workspace's pool entirely (the workspace left the config).
    pub fn remove(cache_dir: &Path, ws: &str) -> Result<(), PoolError> {
        let root = cache_dir.join("pools").join(ws);
        match fs::remove_dir_all(&root) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&root)(e)),
            _ => Ok(()),
        }
    }

    /// The workspace.
    pub fn workspace(&self) -> &str {
        &self.ws
    }

    /// The pool directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where an object lives.
    pub fn object_path(&self, sha256: &str) -> PathBuf {
        self.root.join("objects").join(&sha256[..2]).join(sha256)
    }

    /// True when the object is present with the expected size (its content is trusted:
    /// it was verified when written, and re-hashed by `verify`).
    pub fn has_object(&self, sha256: &str, size: u64) -> bool {
        fs::metadata(self.object_path(sha256)).is_ok_and(|m| m.is_file() && m.len() == size)
    }

    /// Starts writing a downloaded object.
    pub fn new_object(&self, sha256: &str, size: u64) -> Result<ObjectWriter, PoolError> {
        let tmp_dir = self.root.join("tmp");
        let tmp = tempfile::Builder::new()
            .prefix("obj-")
            .tempfile_in(&tmp_dir)
            .map_err(io_err(&tmp_dir))?;
        Ok(ObjectWriter {
            tmp,
            hasher: Sha256::new(),
            written: 0,
            sha256: sha256.to_owned(),
            size,
            dest: self.object_path(sha256),
        })
    }

    /// Takes the pool lock: exclusive to publish or collect, shared to read a consistent
    /// `current`. Released when the file is dropped.
    pub fn lock(&self, exclusive: bool) -> Result<File, PoolError> {
        let path = self.root.join("lock");
        let f = File::open(&path).map_err(io_err(&path))?;
        if exclusive { f.lock() } else { f.lock_shared() }.map_err(io_err(&path))?;
        Ok(f)
    }

    /// The name of the current generation, if any.
    pub fn current_name(&self) -> Option<String> {
        let target = fs::read_link(self.root.join("current")).ok()?;
        Some(target.file_name()?.to_string_lossy().into_owned())
    }

    /// The current generation, if one was ever published.
    pub fn current(&self) -> Result<Option<Generation>, PoolError> {
        match self.current_name() {
            None => Ok(None),
            Some(name) => Generation::load(&self.root.join("gens").join(name)).map(Some),
        }
    }

    /// A generation by name.
    pub fn generation(&self, name: &str) -> Result<Generation, PoolError> {
        Generation::load(&self.root.join("gens").join(name))
    }

    /// Builds a generation for a full manifest (cards sorted by id) beside the current one:
    /// the hardlink tree, the manifest and the search index. Every object must be present.
    /// Not visible until [`Pool::publish`].
    pub fn build_generation(&self, manifest: &Manifest) -> Result<String, PoolError> {
        // One build at a time across workspaces: an index build holds tens of MiB of
        // buffers, and five at once after a cold start peaked at 415 MiB. On two cores
        // parallel builds gain little time.
        static ONE_BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _building = ONE_BUILD.lock().unwrap_or_else(|p| p.into_inner());
        let gens = self.root.join("gens");
        if !mop_cards::is_epoch(&manifest.epoch) {
            return Err(PoolError::Io {
                path: gens.display().to_string(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a generation's epoch must be a UUID",
                ),
            });
        }
        let base = format!("{}-{}", manifest.epoch, manifest.revision);
        // Never reuse a directory: an existing one may be current or pinned by a task, or a
        // leftover of an interrupted build that garbage collection will remove.
        let mut name = base.clone();
        let mut n = 1;
        while gens.join(&name).exists() {
            name = format!("{base}~{n}");
            n += 1;
        }
        let dir = gens.join(&name);
        let tree = dir.join(TREE);
        make_dir(&tree)?;
        let mut made = BTreeSet::new();
        for e in &manifest.cards {
            let object = self.object_path(&e.sha256);
            let meta =
                fs::metadata(&object).map_err(|_| PoolError::MissingObject(e.sha256.clone()))?;
            if meta.len() != e.size {
                return Err(PoolError::MissingObject(e.sha256.clone()));
            }
            let rel = card_path(e.summary.card_type, &e.summary.id);
            let target = tree.join(&rel);
            let parent = target.parent().expect("card paths have a pillar directory");
            if made.insert(parent.to_owned()) {
                make_dir(parent)?;
            }
            fs::hard_link(&object, &target).map_err(io_err(&target))?;
        }
        let manifest_path = dir.join(MANIFEST);
        let json = serde_json::to_vec(manifest).expect("manifests serialize");
        fs::write(&manifest_path, json).map_err(io_err(&manifest_path))?;
        fs::set_permissions(&manifest_path, fs::Permissions::from_mode(0o440))
            .map_err(io_err(&manifest_path))?;

        let index = dir.join(INDEX);
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
        build_index(&index, docs)?;
        if let Some(err) = unreadable.into_inner() {
            return Err(err);
        }
        release_freed_memory();
        for f in fs::read_dir(&index).map_err(io_err(&index))? {
            let p = f.map_err(io_err(&index))?.path();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o440)).map_err(io_err(&p))?;
        }
        Ok(name)
    }

    /// Makes a built generation current: one `syncfs(2)` flushes it (and the objects it
    /// links), then one `rename(2)` swaps the `current` link under the exclusive lock.
    pub fn publish(&self, name: &str) -> Result<(), PoolError> {
        let root = File::open(&self.root).map_err(io_err(&self.root))?;
        nix::unistd::syncfs(&root).map_err(|e| io_err(&self.root)(io::Error::from(e)))?;
        let _lock = self.lock(true)?;
        let tmp_link = self
            .root
            .join("tmp")
            .join(format!("current.{}", std::process::id()));
        let _ = fs::remove_file(&tmp_link);
        std::os::unix::fs::symlink(Path::new("gens").join(name), &tmp_link)
            .map_err(io_err(&tmp_link))?;
        let current = self.root.join("current");
        fs::rename(&tmp_link, &current).map_err(io_err(&current))?;
        Ok(())
    }

    /// Removes generations that are neither current nor pinned, objects no remaining
    /// generation references, and leftovers in `tmp/`.
    pub fn collect(&self, pinned: &BTreeSet<String>) -> Result<GcReport, PoolError> {
        let _lock = self.lock(true)?;
        let mut report = GcReport::default();
        let current = self.current_name();
        let gens = self.root.join("gens");
        let mut keep = Vec::new();
        for entry in fs::read_dir(&gens).map_err(io_err(&gens))? {
            let entry = entry.map_err(io_err(&gens))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if Some(&name) == current.as_ref() || pinned.contains(&name) {
                keep.push(name);
            } else {
                let p = entry.path();
                fs::remove_dir_all(&p).map_err(io_err(&p))?;
                report.generations += 1;
            }
        }
        let mut referenced = BTreeSet::new();
        for name in &keep {
            match self.generation(name) {
                Ok(g) => referenced.extend(g.manifest.cards.iter().map(|c| c.sha256.clone())),
                // A kept generation we cannot read: keep every object to be safe.
                Err(_) => return Ok(report),
            }
        }
        let objects = self.root.join("objects");
        for fan in fs::read_dir(&objects).map_err(io_err(&objects))? {
            let fan = fan.map_err(io_err(&objects))?.path();
            for obj in fs::read_dir(&fan).map_err(io_err(&fan))? {
                let obj = obj.map_err(io_err(&fan))?;
                let name = obj.file_name().to_string_lossy().into_owned();
                if !referenced.contains(&name) {
                    fs::remove_file(obj.path()).map_err(io_err(&obj.path()))?;
                    report.objects += 1;
                }
            }
        }
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(io_err(&tmp))? {
            let p = entry.map_err(io_err(&tmp))?.path();
            let _ = fs::remove_file(&p);
        }
        Ok(report)
    }

    /// Re-hashes every object (moving bad ones to `quarantine/`) and every file of the
    /// current and pinned generations.
    pub fn verify(&self, pinned: &BTreeSet<String>) -> Result<VerifyReport, PoolError> {
        let _lock = self.lock(true)?;
        let mut report = VerifyReport {
            current: self.current_name(),
            ..Default::default()
        };
        let objects = self.root.join("objects");
        for fan in fs::read_dir(&objects).map_err(io_err(&objects))? {
            let fan = fan.map_err(io_err(&objects))?.path();
            for obj in fs::read_dir(&fan).map_err(io_err(&fan))? {
                let obj = obj.map_err(io_err(&fan))?.path();
                let name = obj
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                report.objects_checked += 1;
                let ok = hash_file(&obj).is_ok_and(|h| h == name);
                if !ok {
                    let q = self.root.join("quarantine").join(format!(
                        "{name}.{}",
                        jiff::Timestamp::now().as_millisecond()
                    ));
                    fs::rename(&obj, &q).map_err(io_err(&obj))?;
                    tracing::warn!(workspace = %self.ws, object = %name, "object failed its re-hash; quarantined");
                    report.bad_objects.push(name);
                }
            }
        }
        let mut names: Vec<String> = pinned.iter().cloned().collect();
        names.extend(report.current.clone());
        names.sort();
        names.dedup();
        for name in names {
            let Ok(g) = self.generation(&name) else {
                report.damaged_files.push(format!("gens/{name}/{MANIFEST}"));
                continue;
            };
            for e in &g.manifest.cards {
                let rel = card_path(e.summary.card_type, &e.summary.id);
                let file = g.tree().join(&rel);
                if !hash_file(&file).is_ok_and(|h| h == e.sha256) {
                    report
                        .damaged_files
                        .push(format!("gens/{name}/{TREE}/{rel}"));
                }
                if Some(&name) == report.current.as_ref() && !self.has_object(&e.sha256, e.size) {
                    report.missing_objects.push(e.sha256.clone());
                }
            }
        }
        report.missing_objects.sort();
        report.missing_objects.dedup();
        Ok(report)
    }

    /// Bytes used by the pool (hardlinked files counted once).
    pub fn usage(&self) -> u64 {
        let mut seen = BTreeSet::new();
        let mut total = 0;
        let mut stack = vec![self.root.clone()];
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

/// Hands freed memory back to the OS: after a build (tantivy's queue and arena, the
/// bodies) and after a new generation is loaded for prepares (its manifest JSON). glibc keeps freed memory of its per-thread arenas for reuse, so without this the
/// daemon's RSS stays at the peak of its largest build (measured: 144 MiB instead of a
/// fraction of it at 10k cards).
#[allow(unsafe_code)] // One of two FFI calls of mopd; libc has no safe wrapper for it.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Caps glibc's malloc arenas at two, once at start. By default glibc gives busy threads
/// arenas of their own (up to eight per core), and memory freed in one arena is not reused
/// by threads of another; the daemon's builds and loads run on tokio's blocking threads,
/// so a long-running daemon held freed memory in many arenas. Measured with
/// `mop-bench memory` (5 × 10k cards, 100 prepares): VmRSS 146 MiB before, 105 MiB with
/// two arenas. The daemon allocates little in parallel, so contention is not a concern.
#[allow(unsafe_code)] // One of two FFI calls of mopd; libc has no safe wrapper for it.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any worker thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
