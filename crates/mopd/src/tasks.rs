//! Task projection (DESIGN.md "Task projection rules").
//!
//! A prepare selects the task's cards from the workspace's current generation (which it
//! pins), builds `<cache_dir>/tasks/<task>/view/` — hardlinks of the selected cards at their
//! OKF paths plus the task's MEMORY.md, all read-only — opens the task's agent socket in
//! `<runtime_dir>/t/<task>/`, and persists the lease in `<state_dir>/leases/`. The view is a
//! snapshot: later syncs publish new generations and never touch it.
//!
//! Leases of `mop run` live as long as the runner process (pid and start time are
//! checked every second); bare prepares have a TTL. Leases survive a daemon restart: the
//! generations they pin are pinned again before anything is collected, and their agent
//! sockets are opened again in the same directories.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use mop_cards::{CardId, Catalog, Rules, TaskContext, Tier, render_memory_md};
use mop_proto::{LeaseInfo, LeaseRequest, Plan, PlanCard, PrepareRequest, Profile, TaskSummary};
use mop_search::{SearchIndex, select_for_task};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::pool::{Pool, make_dir};
use crate::shared::Shared;

/// Why a task request failed; each maps to an HTTP status on the control socket.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// Malformed request.
    #[error("{0}")]
    Invalid(String),
    /// No such task or workspace.
    #[error("{0}")]
    NotFound(String),
    /// A live task has that id.
    #[error("{0}")]
    Conflict(String),
    /// Not this caller's task.
    #[error("{0}")]
    Forbidden(String),
    /// The workspace has no generation yet, or too many tasks.
    #[error("{0}")]
    Unavailable(String),
    /// Local failure.
    #[error("{0}")]
    Internal(String),
}

fn internal(e: impl std::fmt::Display) -> TaskError {
    TaskError::Internal(e.to_string())
}

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
    fn info(&self) -> LeaseInfo {
        match &self.kind {
            LeaseKind::Run { pid, .. } => LeaseInfo {
                kind: "run".into(),
                pid: Some(*pid),
                expires_at: None,
            },
            LeaseKind::Ttl { expires_at } => LeaseInfo {
                kind: "ttl".into(),
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
            memory_md: self.view_dir.join("MEMORY.md"),
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

/// The agent socket's file name inside its directory.
pub const AGENT_SOCKET: &str = "agent.sock";

/// A generation loaded for selection and retrieval: catalog and open index.
pub struct Loaded {
    /// The generation's card tree.
    pub tree: std::path::PathBuf,
    /// Its catalog, which owns the manifest (one copy: at 10k cards it is ~10 MiB).
    pub catalog: Catalog,
    /// Its search index.
    pub index: SearchIndex,
    /// The selection rules it was loaded with.
    pub rules: Rules,
}

/// A task between [`Tasks::reserve`] and [`Tasks::fill`].
pub struct Reserved {
    task: TaskContext,
    kind: LeaseKind,
    owner_uid: u32,
    profile: Profile,
    generation: String,
    task_dir: PathBuf,
    view_dir: PathBuf,
    socket_dir: PathBuf,
    started: std::time::Instant,
}

impl Reserved {
    /// What the runner gets first.
    pub fn reservation(&self) -> mop_proto::Reservation {
        mop_proto::Reservation {
            task_id: self.task.task_id.clone(),
            view_dir: self.view_dir.clone(),
            agent_socket_dir: self.socket_dir.clone(),
            profile: self.profile.clone(),
        }
    }
}

/// A live task.
pub struct Task {
    /// Its lease.
    pub lease: Mutex<Lease>,
    /// Its generation, loaded (lazily after a restart).
    loaded: Mutex<Option<Arc<Loaded>>>,
    stop_agent: watch::Sender<bool>,
}

impl Task {
    /// A snapshot of the lease.
    pub fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What `/proc` says of a runner process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// It runs, started at this time (clock ticks since boot).
    Running(u64),
    /// It is provably gone: no such process.
    Gone,
    /// Its status could not be read (out of descriptors, say): nothing is known, and a
    /// lease never ends on that.
    Unknown,
}

/// The state of a process, from `/proc/<pid>/stat` (field 22 is its start time).
pub fn runner_state(pid: u32) -> Runner {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => parse_start_time(&stat).map_or(Runner::Unknown, Runner::Running),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Runner::Gone,
        // ESRCH: it exited between open and read.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Runner::Gone,
        Err(_) => Runner::Unknown,
    }
}

/// Start time of a running process, if `/proc` can tell.
pub fn process_start_time(pid: u32) -> Option<u64> {
    match runner_state(pid) {
        Runner::Running(t) => Some(t),
        _ => None,
    }
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse().ok()
}

/// Whether a run lease has ended: only when its runner is provably gone (no such
/// process, or the pid now belongs to a process started at another time).
fn run_lease_ended(start_time: u64, state: Runner) -> bool {
    match state {
        Runner::Gone => true,
        Runner::Running(t) => t != start_time,
        Runner::Unknown => false,
    }
}

/// The files of a released task: its view, agent socket directory and lease file. Their
/// removal is retried until it succeeds, so a lease file never outlives its release (it
/// would bring the task back after a restart).
struct Leftovers {
    task_id: String,
    paths: Vec<PathBuf>,
}

impl Leftovers {
    fn remove(&self) -> std::io::Result<()> {
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

/// All live tasks of the daemon.
pub struct Tasks {
    shared: Arc<Shared>,
    reserving: Mutex<std::collections::BTreeSet<String>>,
    shutting_down: std::sync::atomic::AtomicBool,
    tasks: Mutex<BTreeMap<String, Arc<Task>>>,
    loaded: Mutex<HashMap<(String, String), Arc<Loaded>>>,
    leftovers: Mutex<Vec<Leftovers>>,
}

impl Tasks {
    /// No tasks yet.
    pub fn new(shared: Arc<Shared>) -> Tasks {
        Tasks {
            shared,
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            reserving: Mutex::default(),
            tasks: Mutex::default(),
            loaded: Mutex::default(),
            leftovers: Mutex::default(),
        }
    }

    /// From now on, leases outlive their connections (the daemon is stopping).
    pub fn begin_shutdown(&self) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// True once the daemon is stopping.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The server client in force.
    pub fn client(&self) -> Arc<crate::client::ServerClient> {
        self.shared.client()
    }

    /// The connection limits of an agent socket.
    pub fn socket_limits(&self) -> mop_serve::Limits {
        self.shared.config().socket_limits(true)
    }

    fn leases_dir(&self) -> PathBuf {
        self.shared.config().paths.state_dir.join("leases")
    }

    /// A live task.
    pub fn get(&self, id: &str) -> Option<Arc<Task>> {
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Every live task.
    pub fn list(&self) -> Vec<TaskSummary> {
        let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks
            .values()
            .map(|t| {
                let l = t.lease();
                TaskSummary {
                    task_id: l.task.task_id.clone(),
                    workspace: l.task.workspace.clone(),
                    generation: l.generation.clone(),
                    revision: l.revision,
                    lease: l.info(),
                    created_at: l.created_at,
                    owner_uid: l.owner_uid,
                }
            })
            .collect()
    }

    /// The loaded generation of a task (loading it after a restart).
    pub async fn loaded_for(&self, task: &Task) -> Result<Arc<Loaded>, TaskError> {
        if let Some(l) = task
            .loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(l);
        }
        let lease = task.lease();
        let loaded = self.load(&lease.task.workspace, &lease.generation).await?;
        *task.loaded.lock().unwrap_or_else(|p| p.into_inner()) = Some(loaded.clone());
        Ok(loaded)
    }

    async fn load(&self, ws: &str, generation: &str) -> Result<Arc<Loaded>, TaskError> {
        let key = (ws.to_owned(), generation.to_owned());
        if let Some(l) = self
            .loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(l.clone());
        }
        let config = self.shared.config();
        let pool = Pool::open(&config.paths.cache_dir, ws).map_err(internal)?;
        let name = generation.to_owned();
        let selection = config.selection.clone();
        let loaded = tokio::task::spawn_blocking(move || -> Result<Loaded, TaskError> {
            let g = pool.generation(&name).map_err(internal)?;
            let rules = Rules::new(selection).map_err(internal)?;
            let index = SearchIndex::open(&g.dir.join(crate::pool::INDEX)).map_err(internal)?;
            let tree = g.tree();
            let catalog = Catalog::new(g.manifest, &rules).map_err(internal)?;
            Ok(Loaded {
                tree,
                catalog,
                index,
                rules,
            })
        })
        .await
        .map_err(internal)??;
        let loaded = Arc::new(loaded);
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, loaded.clone());
        Ok(loaded)
    }

    /// Forgets loaded generations no task pins and that are not current.
    fn prune_loaded(&self) {
        let config = self.shared.config();
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        loaded.retain(|(ws, g), _| {
            let current = Pool::open(&config.paths.cache_dir, ws)
                .ok()
                .and_then(|p| p.current_name());
            current.as_deref() == Some(g.as_str()) || self.shared.pinned(ws).contains(g)
        });
    }

    /// Prepares a task in one go: reservation, selection, view, agent socket, lease.
    pub async fn prepare(
        self: &Arc<Self>,
        req: PrepareRequest,
        peer_uid: u32,
        peer_pid: Option<i32>,
    ) -> Result<Plan, TaskError> {
        let reserved = self.reserve(req, peer_uid, peer_pid)?;
        self.fill(reserved).await
    }

    /// First half of a prepare: checks the request, pins the current generation, and
    /// creates the task's (empty) view and agent socket directories. Cheap, so a runner
    /// can start setting up its sandbox while [`Tasks::fill`] does the rest.
    pub fn reserve(
        self: &Arc<Self>,
        req: PrepareRequest,
        peer_uid: u32,
        peer_pid: Option<i32>,
    ) -> Result<Reserved, TaskError> {
        let started = std::time::Instant::now();
        let task = req.task;
        task.validate()
            .map_err(|e| TaskError::Invalid(e.to_string()))?;
        let config = self.shared.config();
        let ws = task.workspace.clone();
        if !config.sync.workspaces.contains(&ws) {
            return Err(TaskError::NotFound(format!(
                "workspace {ws} is not configured on this host (sync.workspaces)"
            )));
        }
        let kind = match req.lease {
            LeaseRequest::Run { pid, .. } => {
                if peer_pid != Some(pid as i32) {
                    return Err(TaskError::Invalid(format!(
                        "a run lease must name the caller's own pid ({}), not {pid}",
                        peer_pid.map_or_else(|| "unknown".into(), |p| p.to_string())
                    )));
                }
                let start_time = process_start_time(pid)
                    .ok_or_else(|| TaskError::Invalid(format!("process {pid} is not running")))?;
                LeaseKind::Run { pid, start_time }
            }
            LeaseRequest::Ttl { ttl_secs } => LeaseKind::Ttl {
                expires_at: expiry(ttl_secs.unwrap_or(config.tasks.lease_ttl_secs))?,
            },
        };
        let profile_name = req
            .profile
            .unwrap_or_else(|| config.tasks.default_profile.clone());
        let profile = Profile::load(&profile_name, &config.tasks.profile_dirs)
            .map_err(|e| TaskError::Invalid(e.to_string()))?;
        let protected = config.protected_dirs(&self.shared.config_path);
        profile
            .check(&protected)
            .map_err(|e| TaskError::Invalid(e.to_string()))?;
        // The working directory is bound read-write into the sandbox: one that holds (or
        // lies in) the pool, the state or the sockets would hand them to the agent.
        if let Some(workdir) = &req.workdir
            && let Some(guard) = mop_proto::exposed_by(workdir, &protected)
        {
            return Err(TaskError::Forbidden(format!(
                "working directory {} would expose {}, which belongs to mopd; run the task in a \
                 directory outside mop's cache, state, runtime and config directories",
                workdir.display(),
                guard.display()
            )));
        }
        {
            // Live tasks and reservations in progress share the id space.
            let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
            let mut reserving = self.reserving.lock().unwrap_or_else(|p| p.into_inner());
            if tasks.contains_key(&task.task_id) || reserving.contains(&task.task_id) {
                return Err(TaskError::Conflict(format!(
                    "task {} is already live; release it first (mop release --task-id {})",
                    task.task_id, task.task_id
                )));
            }
            if tasks.len() + reserving.len() >= config.tasks.max_tasks {
                return Err(TaskError::Unavailable(format!(
                    "{} tasks are live, the most tasks.max_tasks allows",
                    tasks.len()
                )));
            }
            reserving.insert(task.task_id.clone());
        }
        // On failure reserve_dirs gives the id back.
        self.reserve_dirs(task, kind, peer_uid, profile, &config, started)
    }

    fn reserve_dirs(
        &self,
        task: TaskContext,
        kind: LeaseKind,
        owner_uid: u32,
        profile: Profile,
        config: &crate::config::MopdConfig,
        started: std::time::Instant,
    ) -> Result<Reserved, TaskError> {
        let ws = task.workspace.clone();
        let id = task.task_id.clone();
        let give_back = |e: TaskError| {
            self.reserving
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            e
        };
        // Pin the current generation under the pool's shared lock, so collection cannot
        // remove it between reading the link and pinning.
        let pool = Pool::existing(&config.paths.cache_dir, &ws);
        let generation = {
            let pending = || {
                TaskError::Unavailable(if self.shared.has_published(&ws) {
                    // It had a generation: the pool went away under the daemon.
                    format!(
                        "the pool of workspace {ws} is missing from {} (was the cache directory deleted?); the next sync fetches it again, or now: mopd sync {ws}",
                        pool.root().display()
                    )
                } else {
                    format!(
                        "workspace {ws} has no cards on this host yet (first sync pending); see: mopd status"
                    )
                })
            };
            let _lock = pool.lock(false).map_err(|_| give_back(pending()))?;
            let name = pool.current_name().ok_or_else(|| give_back(pending()))?;
            self.shared.pin(&ws, &name);
            name
        };
        let task_dir = config.paths.cache_dir.join("tasks").join(&id);
        let view_dir = task_dir.join("view");
        let socket_dir = config.paths.runtime_dir.join("t").join(&id);
        // A leftover with this id: nothing leases it (checked above). A pending retry
        // must not remove the new task's files later.
        self.leftovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| l.task_id != id);
        let _ = std::fs::remove_dir_all(&task_dir);
        let _ = std::fs::remove_dir_all(&socket_dir);
        if let Err(e) = make_dir(&view_dir).and_then(|_| make_dir(&socket_dir)) {
            self.shared.unpin(&ws, &generation);
            return Err(give_back(internal(e)));
        }
        Ok(Reserved {
            task,
            kind,
            owner_uid,
            profile,
            generation,
            task_dir,
            view_dir,
            socket_dir,
            started,
        })
    }

    /// Second half of a prepare: selection, MEMORY.md, the view's files, the agent socket
    /// and the persisted lease. On failure everything the reservation made is undone.
    pub async fn fill(self: &Arc<Self>, r: Reserved) -> Result<Plan, TaskError> {
        let id = r.task.task_id.clone();
        let (ws, generation, task_dir, socket_dir) = (
            r.task.workspace.clone(),
            r.generation.clone(),
            r.task_dir.clone(),
            r.socket_dir.clone(),
        );
        let started = r.started;
        let result = self.fill_inner(r).await;
        self.reserving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        match &result {
            Ok(plan) => tracing::info!(
                task = %plan.task_id, workspace = %ws, generation = %generation, mounted = plan.cards.len(),
                selected = plan.selected.iter().sum::<usize>(), micros = started.elapsed().as_micros() as u64,
                "task prepared"
            ),
            Err(e) => {
                tracing::warn!(task = %id, error = %e, "prepare failed");
                let _ = std::fs::remove_dir_all(&task_dir);
                let _ = std::fs::remove_dir_all(&socket_dir);
                self.shared.unpin(&ws, &generation);
            }
        }
        result
    }

    async fn fill_inner(self: &Arc<Self>, r: Reserved) -> Result<Plan, TaskError> {
        let Reserved {
            task,
            kind,
            owner_uid,
            profile,
            generation,
            view_dir,
            socket_dir,
            ..
        } = r;
        let ws = task.workspace.clone();
        let loaded = self.load(&ws, &generation).await?;
        let config = self.shared.config();
        let lease_path = self.leases_dir().join(format!("{}.json", task.task_id));
        let gen_dir = config
            .paths
            .cache_dir
            .join("pools")
            .join(&ws)
            .join("gens")
            .join(&generation);
        // Selection and the view take about a millisecond of CPU and file system work at
        // 10k cards. On the blocking pool they run beside the async workers, so the
        // runner's reservation goes out at once (the view is filled while bwrap sets up).
        let (selection, cards) = {
            let loaded = loaded.clone();
            let task = task.clone();
            let view_dir = view_dir.clone();
            tokio::task::spawn_blocking(move || -> Result<_, TaskError> {
                let selection =
                    select_for_task(&loaded.catalog, &loaded.index, &task, &loaded.rules)
                        .map_err(internal)?;
                let md = render_memory_md(&loaded.catalog, &selection, &task, &loaded.rules.config);
                build_view(&view_dir, &gen_dir, &loaded.catalog, &selection.cards, &md)
                    .map_err(internal)?;
                let cards = selection
                    .cards
                    .iter()
                    .map(|s| {
                        let e = loaded.catalog.entry(s.ord);
                        PlanCard {
                            id: e.summary.id,
                            tier: s.tier.as_str().into(),
                            path: e.summary.path(),
                        }
                    })
                    .collect::<Vec<_>>();
                Ok((selection, cards))
            })
            .await
            .map_err(internal)??
        };
        let lease = Lease {
            epoch: loaded.catalog.epoch().to_owned(),
            revision: loaded.catalog.revision(),
            task,
            generation,
            kind,
            owner_uid,
            created_at: Timestamp::now(),
            view_dir,
            socket_dir,
            profile,
            cards,
            selected: selection.selected.0,
            left_out: selection.left_out.0,
        };
        let (stop_agent, stop_rx) = watch::channel(false);
        let entry = Arc::new(Task {
            lease: Mutex::new(lease.clone()),
            loaded: Mutex::new(Some(loaded)),
            stop_agent,
        });
        crate::agent::serve(self.clone(), entry.clone(), stop_rx)
            .await
            .map_err(internal)?;
        if let Err(e) = save_lease(&lease_path, &lease) {
            let _ = entry.stop_agent.send(true);
            return Err(internal(e));
        }
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease.task.task_id.clone(), entry);
        Ok(lease.plan())
    }

    /// Releases a task: its view, agent socket, lease and pin go.
    pub fn release(&self, id: &str, caller_uid: Option<u32>, why: &str) -> Result<(), TaskError> {
        let task = {
            let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
            let Some(task) = tasks.get(id) else {
                return Err(TaskError::NotFound(format!("no live task {id}")));
            };
            let owner = task.lease().owner_uid;
            if let Some(uid) = caller_uid
                && uid != 0
                && uid != owner
            {
                return Err(TaskError::Forbidden(format!(
                    "task {id} belongs to uid {owner}"
                )));
            }
            tasks.remove(id).expect("present")
        };
        let lease = task.lease();
        let _ = task.stop_agent.send(true);
        let config = self.shared.config();
        let leftovers = Leftovers {
            task_id: id.to_owned(),
            paths: vec![
                config.paths.cache_dir.join("tasks").join(id),
                lease.socket_dir.clone(),
                self.leases_dir().join(format!("{id}.json")),
            ],
        };
        self.shared.unpin(&lease.task.workspace, &lease.generation);
        self.prune_loaded();
        tracing::info!(task = id, workspace = %lease.task.workspace, why, "task released");
        if let Err(e) = leftovers.remove() {
            tracing::warn!(task = id, error = %e, "cannot remove the released task's files yet; retrying every second");
            self.leftovers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(leftovers);
        }
        Ok(())
    }

    /// Retries removing the files of released tasks that could not be removed at once.
    fn retry_leftovers(&self) {
        let pending =
            std::mem::take(&mut *self.leftovers.lock().unwrap_or_else(|p| p.into_inner()));
        for l in pending {
            match l.remove() {
                Ok(()) => tracing::info!(task = %l.task_id, "released task's files removed"),
                Err(e) => {
                    tracing::debug!(task = %l.task_id, error = %e, "released task's files still not removable");
                    self.leftovers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(l);
                }
            }
        }
    }

    /// Extends a TTL lease.
    pub fn renew(
        &self,
        id: &str,
        caller_uid: u32,
        ttl_secs: Option<u64>,
    ) -> Result<LeaseInfo, TaskError> {
        let task = self
            .get(id)
            .ok_or_else(|| TaskError::NotFound(format!("no live task {id}")))?;
        let config = self.shared.config();
        let lease = {
            let mut lease = task.lease.lock().unwrap_or_else(|p| p.into_inner());
            if caller_uid != 0 && caller_uid != lease.owner_uid {
                return Err(TaskError::Forbidden(format!(
                    "task {id} belongs to uid {}",
                    lease.owner_uid
                )));
            }
            match &mut lease.kind {
                LeaseKind::Ttl { expires_at } => {
                    *expires_at = expiry(ttl_secs.unwrap_or(config.tasks.lease_ttl_secs))?
                }
                LeaseKind::Run { .. } => {
                    return Err(TaskError::Invalid(format!(
                        "task {id} lives as long as its mop run; it has no TTL to renew"
                    )));
                }
            }
            lease.clone()
        };
        save_lease(&self.leases_dir().join(format!("{id}.json")), &lease).map_err(internal)?;
        Ok(lease.info())
    }

    /// Releases leases whose runner exited or whose TTL passed, and retries removing
    /// what earlier releases could not.
    pub fn reap(&self) {
        self.retry_leftovers();
        let now = Timestamp::now();
        let ended: Vec<(String, String)> = {
            let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
            tasks
                .iter()
                .filter_map(|(id, t)| {
                    let why = match &t.lease().kind {
                        LeaseKind::Run { pid, start_time } => {
                            run_lease_ended(*start_time, runner_state(*pid))
                                .then(|| format!("runner pid {pid} exited"))
                        }
                        LeaseKind::Ttl { expires_at } => {
                            (*expires_at <= now).then(|| "lease expired".to_owned())
                        }
                    }?;
                    Some((id.clone(), why))
                })
                .collect()
        };
        for (id, why) in ended {
            if let Err(e) = self.release(&id, None, &why) {
                tracing::warn!(task = %id, error = %e, "cannot release an ended task");
            }
        }
    }

    /// After a restart: takes back persisted leases (pinning their generations before any
    /// collection runs) and removes task directories nothing leases.
    pub async fn recover(self: &Arc<Self>) {
        let config = self.shared.config();
        let dir = self.leases_dir();
        let _ = make_dir(&dir);
        let mut live = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let path = e.path();
                let lease: Lease = match std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                {
                    Some(l) => l,
                    None => {
                        tracing::warn!(path = %path.display(), "unreadable lease removed");
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                };
                let gen_dir = config
                    .paths
                    .cache_dir
                    .join("pools")
                    .join(&lease.task.workspace)
                    .join("gens")
                    .join(&lease.generation);
                if !gen_dir.is_dir()
                    || !lease.view_dir.is_dir()
                    || !config.sync.workspaces.contains(&lease.task.workspace)
                {
                    tracing::warn!(task = %lease.task.task_id, "lease lost its generation or view; dropped");
                    let _ = std::fs::remove_file(&path);
                    let _ = std::fs::remove_dir_all(
                        config
                            .paths
                            .cache_dir
                            .join("tasks")
                            .join(&lease.task.task_id),
                    );
                    continue;
                }
                self.shared.pin(&lease.task.workspace, &lease.generation);
                let (stop_agent, stop_rx) = watch::channel(false);
                let id = lease.task.task_id.clone();
                let entry = Arc::new(Task {
                    lease: Mutex::new(lease),
                    loaded: Mutex::new(None),
                    stop_agent,
                });
                if let Err(e) = crate::agent::serve(self.clone(), entry.clone(), stop_rx).await {
                    tracing::warn!(task = %id, error = %e, "cannot reopen the agent socket");
                }
                self.tasks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.clone(), entry);
                live.push(id);
            }
        }
        if let Ok(entries) = std::fs::read_dir(config.paths.cache_dir.join("tasks")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !live.contains(&name) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        if !live.is_empty() {
            tracing::info!(tasks = live.len(), "task leases recovered");
        }
        self.reap();
    }
}

fn expiry(secs: u64) -> Result<Timestamp, TaskError> {
    let secs =
        i64::try_from(secs).map_err(|_| TaskError::Invalid("ttl_secs is too large".into()))?;
    Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .map_err(|_| TaskError::Invalid("ttl_secs is too large".into()))
}

fn save_lease(path: &Path, lease: &Lease) -> std::io::Result<()> {
    let dir = path.parent().expect("lease files have a directory");
    make_dir(dir).map_err(std::io::Error::other)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(
        &mut tmp,
        &serde_json::to_vec_pretty(lease).expect("leases serialize"),
    )?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Fills a task's (reserved, empty) view: hardlinks of the selected cards from the
/// generation's tree, and the task's MEMORY.md, all read-only.
fn build_view(
    view: &Path,
    gen_dir: &Path,
    catalog: &Catalog,
    cards: &[mop_cards::Selected],
    memory_md: &str,
) -> Result<(), crate::pool::PoolError> {
    use std::os::unix::fs::PermissionsExt;
    let tree = gen_dir.join(crate::pool::TREE);
    let mut made = std::collections::BTreeSet::new();
    for s in cards {
        let rel = catalog.entry(s.ord).summary.path();
        let target = view.join(&rel);
        let parent = target.parent().expect("card paths have a pillar");
        if made.insert(parent.to_owned()) {
            make_dir(parent)?;
        }
        std::fs::hard_link(tree.join(&rel), &target).map_err(|e| crate::pool::PoolError::Io {
            path: target.display().to_string(),
            source: e,
        })?;
    }
    let md_path = view.join("MEMORY.md");
    std::fs::write(&md_path, memory_md)
        .and_then(|_| std::fs::set_permissions(&md_path, std::fs::Permissions::from_mode(0o440)))
        .map_err(|e| crate::pool::PoolError::Io {
            path: md_path.display().to_string(),
            source: e,
        })?;
    Ok(())
}

/// Tier of a card in a lease.
pub fn tier_of(lease: &Lease, id: &CardId) -> Option<Tier> {
    lease
        .cards
        .iter()
        .find(|c| &c.id == id)
        .map(|c| match c.tier.as_str() {
            "L1" => Tier::L1,
            "L2" => Tier::L2,
            _ => Tier::L0,
        })
}

/// Loads each newly published generation (and the current ones at start) so the first
/// prepare after a sync does not pay for it, and forgets generations nobody needs.
pub async fn warmer(tasks: Arc<Tasks>, mut stop: watch::Receiver<bool>) {
    let mut published = tasks.shared.published.subscribe();
    let config = tasks.shared.config();
    for ws in &config.sync.workspaces {
        if let Some(g) = Pool::open(&config.paths.cache_dir, ws)
            .ok()
            .and_then(|p| p.current_name())
        {
            let _ = tasks.load(ws, &g).await;
        }
    }
    let _ = tokio::task::spawn_blocking(crate::pool::release_freed_memory).await;
    loop {
        tokio::select! {
            msg = published.recv() => match msg {
                Ok((ws, g)) => {
                    let _ = tasks.load(&ws, &g).await;
                    tasks.prune_loaded();
                    let _ = tokio::task::spawn_blocking(crate::pool::release_freed_memory).await;
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            },
            _ = stop.changed() => return,
        }
    }
}

/// Reaps leases every second until stopped.
pub async fn reaper(tasks: Arc<Tasks>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return,
        }
        let t = tasks.clone();
        let _ = tokio::task::spawn_blocking(move || t.reap()).await;
    }
}

#[cfg(test)]
mod reaper_tests {
    use super::*;

    #[test]
    fn a_lease_ends_only_when_its_runner_is_provably_gone() {
        assert!(run_lease_ended(100, Runner::Gone));
        assert!(run_lease_ended(100, Runner::Running(101)), "pid reused");
        assert!(!run_lease_ended(100, Runner::Running(100)));
        assert!(
            !run_lease_ended(100, Runner::Unknown),
            "an unreadable /proc never ends a lease"
        );
    }

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
    fn start_times_parse_and_this_process_runs() {
        let stat = "42 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19";
        assert_eq!(parse_start_time(stat), Some(777));
        assert_eq!(parse_start_time("garbage"), None);
        assert!(matches!(
            runner_state(std::process::id()),
            Runner::Running(_)
        ));
        // No pid is this large on Linux (pid_max ≤ 2^22).
        assert_eq!(runner_state(u32::MAX - 1), Runner::Gone);
    }
}
