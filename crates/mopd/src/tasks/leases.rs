//! Leases: how long a task's view lives (with its runner process, or until a time), as
//! persisted in the state directory so they survive a daemon restart, and the files a
//! released task leaves to remove.

use std::path::{Path, PathBuf};

use jiff::Timestamp;
use mop_cards::TaskContext;
use mop_proto::{LeaseInfo, Plan, PlanCard, Profile};
use serde::{Deserialize, Serialize};

use super::TaskError;
use crate::paths::{AGENT_SOCKET, MEMORY_MD, Paths};

/// How a lease ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LeaseKind {
    /// With the runner process.
    Run {
        /// Runner pid.
        pid: u32,
        /// Its start time, so a recycled pid is not mistaken for it.
        start_time: u64,
    },
    /// At a time.
    Ttl {
        /// Expiry.
        expires_at: Timestamp,
    },
}

/// A lease as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lease {
    /// The task.
    pub task: TaskContext,
    /// Pinned generation.
    pub generation: String,
    /// Its epoch.
    pub epoch: String,
    /// Its revision.
    pub revision: u64,
    /// How it ends.
    pub kind: LeaseKind,
    /// Uid of the runner that prepared it; only it (or root) may release or renew.
    pub owner_uid: u32,
    /// When it was prepared.
    pub created_at: Timestamp,
    /// The view.
    pub view_dir: PathBuf,
    /// The agent socket's directory.
    pub socket_dir: PathBuf,
    /// The resolved profile.
    pub profile: Profile,
    /// Mounted cards, best first, with tiers.
    pub cards: Vec<PlanCard>,
    /// Selected per tier.
    pub selected: [usize; 3],
    /// Left out per tier.
    pub left_out: [usize; 3],
}

impl Lease {
    /// The lease as the control socket shows it.
    pub fn info(&self) -> LeaseInfo {
        match &self.kind {
            LeaseKind::Run { pid, .. } => LeaseInfo {
                kind: mop_proto::tasks::LeaseKind::Run,
                pid: Some(*pid),
                expires_at: None,
            },
            LeaseKind::Ttl { expires_at } => LeaseInfo {
                kind: mop_proto::tasks::LeaseKind::Ttl,
                pid: None,
                expires_at: Some(*expires_at),
            },
        }
    }

    /// The plan a runner gets for this lease.
    pub fn plan(&self) -> Plan {
        let info = self.info();
        Plan {
            task_id: self.task.task_id.clone(),
            workspace: self.task.workspace.clone(),
            epoch: self.epoch.clone(),
            revision: self.revision,
            generation: self.generation.clone(),
            memory_md: self.view_dir.join(MEMORY_MD),
            view_dir: self.view_dir.clone(),
            agent_socket: self.socket_dir.join(AGENT_SOCKET),
            agent_socket_dir: self.socket_dir.clone(),
            expires_at: info.expires_at,
            lease: info,
            profile: self.profile.clone(),
            cards: self.cards.clone(),
            selected: self.selected,
            left_out: self.left_out,
        }
    }
}

/// The expiry of a TTL lease `secs` from now.
pub fn expiry(secs: u64) -> Result<Timestamp, TaskError> {
    let secs =
        i64::try_from(secs).map_err(|_| TaskError::Invalid("ttl_secs is too large".into()))?;
    Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .map_err(|_| TaskError::Invalid("ttl_secs is too large".into()))
}

/// Persists a lease (beside, then renamed into place).
pub fn save(paths: &Paths, lease: &Lease) -> std::io::Result<()> {
    crate::files::replace_json(&paths.lease(&lease.task.task_id), lease, true)
}

/// Every persisted lease, with the file it was read from; unreadable files are removed
/// (and logged).
pub fn load_all(paths: &Paths) -> Vec<(PathBuf, Lease)> {
    let dir = paths.leases();
    let _ = crate::files::make_dir(&dir);
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = e.path();
        match std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Lease>(&b).ok())
            // Its task id names directories to remove: only a valid one is taken back.
            .filter(|l| l.task.validate().is_ok())
        {
            Some(l) => out.push((path, l)),
            None => {
                tracing::warn!(path = %path.display(), "unreadable lease removed");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out
}

/// The files of a released task: its view, agent socket directory and lease file. Their
/// removal is retried until it succeeds, so a lease file never outlives its release (it
/// would bring the task back after a restart).
pub struct Leftovers {
    /// The task.
    pub task_id: String,
    paths: Vec<PathBuf>,
}

impl Leftovers {
    /// The files task `id` (with its agent socket directory) leaves.
    pub fn of(paths: &Paths, id: &str, socket_dir: &Path) -> Leftovers {
        Leftovers {
            task_id: id.to_owned(),
            paths: vec![paths.task(id), socket_dir.to_owned(), paths.lease(id)],
        }
    }

    /// Removes them; the first failure (other than "already gone") names its path.
    pub fn remove(&self) -> std::io::Result<()> {
        let mut first_error = None;
        for p in &self.paths {
            let result = if p.is_dir() {
                std::fs::remove_dir_all(p)
            } else {
                std::fs::remove_file(p)
            };
            match result {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    first_error.get_or_insert(std::io::Error::new(
                        e.kind(),
                        format!("{}: {e}", p.display()),
                    ));
                }
                _ => {}
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_that_cannot_be_removed_are_reported_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let view = dir.path().join("view");
        std::fs::create_dir_all(view.join("facts")).unwrap();
        let lease = dir.path().join("t.json");
        std::fs::write(&lease, "{}").unwrap();
        let ok = Leftovers {
            task_id: "t".into(),
            paths: vec![view.clone(), lease.clone(), dir.path().join("never-was")],
        };
        ok.remove().unwrap();
        assert!(!view.exists() && !lease.exists());
        // /proc entries cannot be removed, whoever asks: the error names the path.
        let stuck = Leftovers {
            task_id: "t".into(),
            paths: vec![PathBuf::from("/proc/self/status")],
        };
        let err = stuck.remove().unwrap_err();
        assert!(err.to_string().contains("/proc/self/status"), "{err}");
    }

    #[test]
    fn leases_persist_and_unreadable_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::under(dir.path());
        let lease = Lease {
            task: TaskContext {
                task_id: "t-1".into(),
                workspace: "acme".into(),
                origin_user_id: Some("alice".into()),
                asset_id: None,
                project_id: None,
                agent: None,
                title: "x".into(),
                description: String::new(),
                labels: vec![],
            },
            generation: "g".into(),
            epoch: "e".into(),
            revision: 1,
            kind: LeaseKind::Ttl {
                expires_at: expiry(60).unwrap(),
            },
            owner_uid: 1000,
            created_at: Timestamp::now(),
            view_dir: paths.view("t-1"),
            socket_dir: paths.agent_dir("t-1"),
            profile: Profile::parse("default", Path::new("d.toml"), "").unwrap(),
            cards: vec![],
            selected: [0; 3],
            left_out: [0; 3],
        };
        save(&paths, &lease).unwrap();
        std::fs::write(paths.leases().join("junk.json"), "not json").unwrap();
        // A lease whose task id would name a directory elsewhere is dropped too.
        let mut evil = lease.clone();
        evil.task.task_id = "../../etc".into();
        std::fs::write(
            paths.leases().join("evil.json"),
            serde_json::to_vec(&evil).unwrap(),
        )
        .unwrap();
        let loaded = load_all(&paths);
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].0, paths.lease("t-1"));
        assert_eq!(loaded[0].1.plan(), lease.plan());
        assert!(!paths.leases().join("junk.json").exists());
        assert!(!paths.leases().join("evil.json").exists());
        assert!(expiry(u64::MAX).is_err());
    }
}
