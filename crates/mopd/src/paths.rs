//! Every path under the daemon's cache, state and runtime directories, built here and
//! nowhere else, and the name of a generation (`<epoch>-<revision>[~n]`), formatted and
//! parsed here and nowhere else.
//!
//! ```text
//! <cache_dir>/pools/<ws>/                     one workspace's pool (the pool module)
//!   objects/ab/<sha256>  gens/<name>/{manifest.json,index}  current  lock  tmp/  quarantine/
//! <cache_dir>/tasks/<task>/view/              a task's view (MEMORY.md + hardlinks)
//! <state_dir>/leases/<task>.json              a task's lease
//! <state_dir>/workspaces/<ws>/status.json     a workspace's last sync status
//! <state_dir>/receipts/{live,pending,sent,refused}/  task receipts (the receipts module)
//! <state_dir>/receipts/key                    the key of the query hashes in receipts
//! <state_dir>/spool/queue/<seq>-<store>.json   a store waiting for the server (the spool)
//! <state_dir>/spool/done/<store>.json         what became of a queued store (no text)
//! <runtime_dir>/mopd.sock                     the control socket
//! <runtime_dir>/t/<random>/agent.sock         a task's agent socket (named by no task id)
//! ```
//!
//! Must not touch the file system: it only names things.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use mop_proto::sync::Version;

pub use mop_proto::inside::{AGENT_SOCKET_NAME as AGENT_SOCKET, MEMORY_MD_NAME as MEMORY_MD};

/// The daemon's three directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    cache: PathBuf,
    state: PathBuf,
    runtime: PathBuf,
}

impl Paths {
    /// The layout under these three directories (a config's `[paths]`).
    pub fn new(cache: &Path, state: &Path, runtime: &Path) -> Paths {
        Paths {
            cache: cache.to_owned(),
            state: state.to_owned(),
            runtime: runtime.to_owned(),
        }
    }

    /// The layout under one directory (`cache/`, `state/`, `run/`), for tests.
    #[cfg(test)]
    pub fn under(dir: &Path) -> Paths {
        Paths::new(&dir.join("cache"), &dir.join("state"), &dir.join("run"))
    }

    /// The cache directory.
    pub fn cache_dir(&self) -> &Path {
        &self.cache
    }

    /// The state directory.
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The runtime directory.
    pub fn runtime_dir(&self) -> &Path {
        &self.runtime
    }

    /// Where the pools are, one directory per workspace.
    pub fn pools(&self) -> PathBuf {
        self.cache.join("pools")
    }

    /// One workspace's pool.
    pub fn pool(&self, ws: &str) -> PoolPaths {
        PoolPaths {
            root: self.pools().join(ws),
        }
    }

    /// Where task views are, one directory per task.
    pub fn tasks(&self) -> PathBuf {
        self.cache.join("tasks")
    }

    /// A task's directory (its view is inside).
    pub fn task(&self, id: &str) -> PathBuf {
        self.tasks().join(id)
    }

    /// A task's view.
    pub fn view(&self, id: &str) -> PathBuf {
        self.task(id).join("view")
    }

    /// Where leases are persisted.
    pub fn leases(&self) -> PathBuf {
        self.state.join("leases")
    }

    /// A task's persisted lease.
    pub fn lease(&self, id: &str) -> PathBuf {
        self.leases().join(format!("{id}.json"))
    }

    /// Task receipts.
    pub fn receipts(&self) -> PathBuf {
        self.state.join("receipts")
    }

    /// Receipts of one kind: `live` (running tasks), `pending` (ended, not reported yet),
    /// `sent` (reported) or `refused` (the server would not take them).
    pub fn receipt_dir(&self, kind: ReceiptKind) -> PathBuf {
        self.receipts().join(kind.dir())
    }

    /// The file of a receipt: a running task's by its id; an ended task's by when it was
    /// prepared, then its id (task ids can be used again once a task has ended).
    pub fn receipt(&self, kind: ReceiptKind, task_id: &str, prepared_micros: i64) -> PathBuf {
        match kind {
            ReceiptKind::Live => self.receipt_dir(kind).join(format!("{task_id}.json")),
            _ => self
                .receipt_dir(kind)
                .join(format!("{prepared_micros:020}-{task_id}.json")),
        }
    }

    /// The key the query hashes of this host's receipts are made with.
    pub fn receipt_key(&self) -> PathBuf {
        self.receipts().join("key")
    }

    /// The stores waiting for the server, one file each.
    pub fn spool_queue(&self) -> PathBuf {
        self.state.join("spool").join("queue")
    }

    /// A waiting store's file: its place in the queue, then its id.
    pub fn spool_entry(&self, seq: u64, store_id: &str) -> PathBuf {
        self.spool_queue()
            .join(format!("{seq:020}-{store_id}.json"))
    }

    /// What became of queued stores, one file each.
    pub fn spool_done(&self) -> PathBuf {
        self.state.join("spool").join("done")
    }

    /// What became of one queued store.
    pub fn spool_done_entry(&self, store_id: &str) -> PathBuf {
        self.spool_done().join(format!("{store_id}.json"))
    }

    /// A workspace's state directory.
    pub fn workspace_state(&self, ws: &str) -> PathBuf {
        self.state.join("workspaces").join(ws)
    }

    /// A workspace's persisted sync status.
    pub fn status_file(&self, ws: &str) -> PathBuf {
        self.workspace_state(ws).join("status.json")
    }

    /// The control socket.
    pub fn control_socket(&self) -> PathBuf {
        self.runtime.join("mopd.sock")
    }

    /// Where the tasks' agent socket directories are.
    pub fn agent_dirs(&self) -> PathBuf {
        self.runtime.join("t")
    }

    /// A task's agent socket directory (bound into its sandbox), named by `name`: a random
    /// name a reservation draws ([`agent_dir_name`]), never the task id. Why: every process
    /// sharing the host's network namespace reads bound socket paths in `/proc/net/unix`,
    /// and a task id can say what the task is about (`INC-4711-payroll-breach`).
    pub fn agent_dir(&self, name: &str) -> PathBuf {
        self.agent_dirs().join(name)
    }
}

/// A new random name for a task's agent socket directory: 24 hex digits (96 bits), short
/// enough for the 108-byte socket path limit under any runtime directory mopd accepts.
pub fn agent_dir_name() -> String {
    let mut buf = [0u8; 12];
    getrandom::fill(&mut buf).expect("the OS random source works");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a receipt is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiptKind {
    /// Its task runs.
    Live,
    /// Its task ended; not reported yet.
    Pending,
    /// Reported to the server.
    Sent,
    /// The server refused it.
    Refused,
}

impl ReceiptKind {
    fn dir(self) -> &'static str {
        match self {
            ReceiptKind::Live => "live",
            ReceiptKind::Pending => "pending",
            ReceiptKind::Sent => "sent",
            ReceiptKind::Refused => "refused",
        }
    }
}

/// The paths of one workspace's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPaths {
    root: PathBuf,
}

impl PoolPaths {
    /// The pool directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Verified objects, fanned out by their first two hex digits.
    pub fn objects(&self) -> PathBuf {
        self.root.join("objects")
    }

    /// Where an object lives.
    pub fn object(&self, sha256: &str) -> PathBuf {
        self.objects().join(&sha256[..2]).join(sha256)
    }

    /// The generations.
    pub fn gens(&self) -> PathBuf {
        self.root.join("gens")
    }

    /// One generation.
    pub fn generation(&self, name: &str) -> GenerationPaths {
        GenerationPaths {
            dir: self.gens().join(name),
        }
    }

    /// The link naming the current generation.
    pub fn current(&self) -> PathBuf {
        self.root.join("current")
    }

    /// What the `current` link holds for generation `name`: a path relative to the pool,
    /// so the pool can be moved or bound elsewhere whole.
    pub fn current_target(name: &str) -> PathBuf {
        Path::new("gens").join(name)
    }

    /// The lock file.
    pub fn lock(&self) -> PathBuf {
        self.root.join("lock")
    }

    /// Downloads in progress and the next `current` link.
    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Objects that failed a re-hash.
    pub fn quarantine(&self) -> PathBuf {
        self.root.join("quarantine")
    }
}

/// The paths inside one generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationPaths {
    dir: PathBuf,
}

impl GenerationPaths {
    /// The generation directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its manifest.
    pub fn manifest(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }

    /// Its search index.
    pub fn index(&self) -> PathBuf {
        self.dir.join("index")
    }
}

/// A generation's directory name: the version it holds, and a counter when a version was
/// built more than once (a repair): `<epoch>-<revision>` or `<epoch>-<revision>~<n>`.
/// The version part is `mop_proto::sync::Version`'s own text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GenerationName {
    /// The version the generation holds.
    pub version: Version,
    /// 0 for the first build of this version.
    pub rebuild: u32,
}

impl GenerationName {
    /// The first name for a version.
    pub fn new(version: Version) -> GenerationName {
        GenerationName {
            version,
            rebuild: 0,
        }
    }

    /// The same version's next rebuild.
    pub fn next(&self) -> GenerationName {
        GenerationName {
            rebuild: self.rebuild + 1,
            ..self.clone()
        }
    }
}

impl fmt::Display for GenerationName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.version)?;
        if self.rebuild > 0 {
            write!(f, "~{}", self.rebuild)?;
        }
        Ok(())
    }
}

/// Why a directory name is not a generation's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a generation name (<epoch>-<revision>[~n])")]
pub struct GenerationNameError(String);

impl FromStr for GenerationName {
    type Err = GenerationNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || GenerationNameError(s.chars().take(100).collect());
        let (version, rebuild) = match s.split_once('~') {
            Some((v, n)) => (v, n.parse::<u32>().map_err(|_| bad())?),
            None => (s, 0),
        };
        Ok(GenerationName {
            version: version.parse().map_err(|_| bad())?,
            rebuild,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH: &str = "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e";

    #[test]
    fn generation_names_round_trip() {
        let first = GenerationName::new(Version {
            epoch: EPOCH.into(),
            revision: 42,
        });
        assert_eq!(first.to_string(), format!("{EPOCH}-42"));
        assert_eq!(first.next().to_string(), format!("{EPOCH}-42~1"));
        for name in [first.clone(), first.next(), first.next().next()] {
            assert_eq!(name.to_string().parse::<GenerationName>().unwrap(), name);
        }
        for bad in [
            "",
            "42",
            "../../x-1",
            &format!("{EPOCH}-"),
            &format!("{EPOCH}-4x"),
            &format!("{EPOCH}-4~x"),
        ] {
            assert!(bad.parse::<GenerationName>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_layout() {
        let p = Paths::new(Path::new("/c"), Path::new("/s"), Path::new("/r"));
        assert_eq!(
            p.pool("acme").object(&"ab".repeat(32)),
            Path::new("/c/pools/acme/objects/ab").join("ab".repeat(32))
        );
        assert_eq!(
            p.pool("acme").generation("g").index(),
            Path::new("/c/pools/acme/gens/g/index")
        );
        assert_eq!(p.view("t-1"), Path::new("/c/tasks/t-1/view"));
        assert_eq!(p.lease("t-1"), Path::new("/s/leases/t-1.json"));
        assert_eq!(p.agent_dir("0a1b"), Path::new("/r/t/0a1b"));
        let (a, b) = (agent_dir_name(), agent_dir_name());
        assert!(a.len() == 24 && a.bytes().all(|c| c.is_ascii_hexdigit()) && a != b);
        assert_eq!(p.control_socket(), Path::new("/r/mopd.sock"));
        assert_eq!(
            p.status_file("acme"),
            Path::new("/s/workspaces/acme/status.json")
        );
    }
}
