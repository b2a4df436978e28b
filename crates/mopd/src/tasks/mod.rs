//! Task projection (DESIGN.md "Task projection rules").
//!
//! A prepare selects the task's cards from the workspace's current generation (which it
//! pins), builds the task's view ([`views`]), has its agent socket opened (through
//! [`AgentSockets`], which the socket layer implements), and persists its lease
//! ([`leases`]). The view is a snapshot: later syncs publish new generations and never
//! touch it.
//!
//! Leases of `mop run` live as long as the runner process (pid and start time, checked
//! every second by [`reaper`]); bare prepares have a TTL. Leases survive a daemon restart:
//! the generations they pin are pinned again before anything is collected, and their agent
//! sockets are opened again in the same directories.
//!
//! Owns the task directories, the lease files and the pins. Must not touch a pool's
//! generations (it reads them) nor speak HTTP (the socket layer does).

pub mod leases;
pub mod reaper;
pub mod views;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use mop_cards::{TaskContext, render_memory_md};
use mop_proto::receipts::{MAX_RECEIPT_CARDS, RECEIPT_SCHEMA, Receipt, ReceiptCard};
use mop_proto::sync::Version;
use mop_proto::{
    LeaseInfo, LeaseRequest, Plan, PlanCard, PrepareRequest, Profile, Reservation, TaskSummary,
};
use mop_search::select_for_task;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::files::make_dir;
use crate::pool::Pool;
use crate::receipts::Receipts;
use crate::spool::Spool;
use crate::state::State;
pub use leases::{Lease, LeaseKind};
use leases::{Leftovers, expiry};
use reaper::{ProcFs, Processes};
pub use views::Loaded;
use views::{LoadedGenerations, build_view};

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

pub(crate) fn internal(e: impl std::fmt::Display) -> TaskError {
    TaskError::Internal(e.to_string())
}

/// Opens a task's agent socket (in its lease's socket directory) and serves it until the
/// task's [`Task::stopped`] fires. The socket layer implements it; passing it in keeps
/// tasks from depending on HTTP.
pub trait AgentSockets: Send + Sync {
    /// Opens the socket of `task`.
    fn open(&self, task: Arc<Task>) -> std::io::Result<()>;
}

/// A task between [`Tasks::reserve`] and [`Tasks::fill`].
pub struct Reserved {
    task: TaskContext,
    kind: LeaseKind,
    owner_uid: u32,
    profile: Profile,
    generation: String,
    /// The agent socket directory, under a random name (see [`crate::paths::Paths::agent_dir`]).
    socket_dir: PathBuf,
    started: Instant,
}

impl Reserved {
    /// The task's id.
    pub fn task_id(&self) -> &str {
        &self.task.task_id
    }
}

/// A live task.
pub struct Task {
    lease: Mutex<Lease>,
    /// Its generation, loaded (lazily after a restart).
    loaded: Mutex<Option<Arc<Loaded>>>,
    stop_agent: watch::Sender<bool>,
}

impl Task {
    fn new(lease: Lease, loaded: Option<Arc<Loaded>>) -> Arc<Task> {
        Arc::new(Task {
            lease: Mutex::new(lease),
            loaded: Mutex::new(loaded),
            stop_agent: watch::channel(false).0,
        })
    }

    /// A snapshot of the lease.
    pub fn lease(&self) -> Lease {
        self.lease.lock().clone()
    }

    /// Changes to true when the task is released: its agent socket closes.
    pub fn stopped(&self) -> watch::Receiver<bool> {
        self.stop_agent.subscribe()
    }
}

/// All live tasks of the daemon.
pub struct Tasks {
    state: Arc<State>,
    receipts: Arc<Receipts>,
    spool: Arc<Spool>,
    processes: Box<dyn Processes + Send + Sync>,
    /// Task ids being prepared, with the uid of the runner preparing each.
    reserving: Mutex<BTreeMap<String, u32>>,
    shutting_down: AtomicBool,
    tasks: Mutex<BTreeMap<String, Arc<Task>>>,
    loaded: LoadedGenerations,
    leftovers: Mutex<Vec<Leftovers>>,
}

impl Tasks {
    /// No tasks yet; runners are looked up in `/proc`. Each task's receipt goes to
    /// `receipts`; stores the server cannot take wait in `spool`.
    pub fn new(state: Arc<State>, receipts: Arc<Receipts>, spool: Arc<Spool>) -> Tasks {
        Tasks {
            loaded: LoadedGenerations::new(state.clone()),
            state,
            receipts,
            spool,
            processes: Box::new(ProcFs),
            shutting_down: AtomicBool::new(false),
            reserving: Mutex::default(),
            tasks: Mutex::default(),
            leftovers: Mutex::default(),
        }
    }

    /// From now on, leases outlive their connections (the daemon is stopping).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// True once the daemon is stopping.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// The daemon's state.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// Each loaded generation's dense ranker state (see [`views::LoadedGenerations`]).
    pub fn dense_states(&self) -> Vec<(String, String, mop_search::DenseState)> {
        self.loaded.dense_states()
    }

    /// The host's queue of stores the server could not take yet.
    pub fn spool(&self) -> &Arc<Spool> {
        &self.spool
    }

    /// The host's task receipts.
    pub fn receipts(&self) -> &Arc<Receipts> {
        &self.receipts
    }

    /// A live task.
    pub fn get(&self, id: &str) -> Option<Arc<Task>> {
        self.tasks.lock().get(id).cloned()
    }

    /// Every live task.
    pub fn list(&self) -> Vec<TaskSummary> {
        let tasks = self.tasks.lock();
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
        if let Some(l) = task.loaded.lock().clone() {
            return Ok(l);
        }
        let lease = task.lease();
        let loaded = self
            .loaded
            .load(&lease.task.workspace, &lease.generation)
            .await?;
        *task.loaded.lock() = Some(loaded.clone());
        Ok(loaded)
    }

    /// Prepares a task in one go: reservation, selection, view, agent socket, lease.
    pub async fn prepare(
        &self,
        req: PrepareRequest,
        peer_uid: u32,
        peer_pid: Option<i32>,
        sockets: &dyn AgentSockets,
    ) -> Result<Plan, TaskError> {
        let reserved = self.reserve(req, peer_uid, peer_pid)?;
        self.fill(reserved, sockets).await
    }

    /// The lease a request asks for, checked against the caller.
    fn lease_kind(
        &self,
        req: &LeaseRequest,
        peer_pid: Option<i32>,
    ) -> Result<LeaseKind, TaskError> {
        match *req {
            LeaseRequest::Run { pid, start_time } => {
                if peer_pid != Some(pid as i32) {
                    return Err(TaskError::Invalid(format!(
                        "a run lease must name the caller's own pid ({}), not {pid}",
                        peer_pid.map_or_else(|| "unknown".into(), |p| p.to_string())
                    )));
                }
                match self.processes.runner(pid) {
                    reaper::Runner::Running(t) if t == start_time => {
                        Ok(LeaseKind::Run { pid, start_time })
                    }
                    reaper::Runner::Running(t) => Err(TaskError::Invalid(format!(
                        "a run lease must name the runner's start time: process {pid} started at \
                         {t}, not {start_time} (clock ticks since boot, field 22 of /proc/{pid}/stat)"
                    ))),
                    _ => Err(TaskError::Invalid(format!("process {pid} is not running"))),
                }
            }
            LeaseRequest::Ttl { ttl_secs } => Ok(LeaseKind::Ttl {
                expires_at: expiry(ttl_secs.unwrap_or(self.state.config().tasks.lease_ttl_secs))?,
            }),
        }
    }

    /// First half of a prepare: checks the request, pins the current generation, and
    /// creates the task's (empty) view and agent socket directories. Cheap, so a runner
    /// can start setting up its sandbox while [`Tasks::fill`] does the rest.
    pub fn reserve(
        &self,
        req: PrepareRequest,
        peer_uid: u32,
        peer_pid: Option<i32>,
    ) -> Result<Reserved, TaskError> {
        let started = Instant::now();
        let mut task = req.task;
        task.validate()
            .map_err(|e| TaskError::Invalid(e.to_string()))?;
        let config = self.state.config();
        let ws = task.workspace.clone();
        if !config.sync.workspaces.contains(&ws) {
            return Err(TaskError::NotFound(format!(
                "workspace {ws} is not configured on this host (sync.workspaces)"
            )));
        }
        let kind = self.lease_kind(&req.lease, peer_pid)?;
        let profile_name = req
            .profile
            .unwrap_or_else(|| config.tasks.default_profile.clone());
        let profile = Profile::load(&profile_name, &config.tasks.profile_dirs)
            .map_err(|e| TaskError::Invalid(e.to_string()))?;
        let protected = config.protected_dirs(&self.state.config_path);
        profile
            .check(&protected)
            .map_err(|e| TaskError::Invalid(e.to_string()))?;
        // A task that names no agent runs the profile's: agent-bound cards follow it.
        if task.agent.is_none() {
            task.agent = Some(profile.agent.name().to_owned());
        }
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
            let tasks = self.tasks.lock();
            let mut reserving = self.reserving.lock();
            if tasks.contains_key(&task.task_id) || reserving.contains_key(&task.task_id) {
                return Err(TaskError::Conflict(format!(
                    "task {} is already live; release it first (mop release --task-id {})",
                    task.task_id, task.task_id
                )));
            }
            // One runner's share first, so that it cannot take every slot of the host.
            let theirs = tasks
                .values()
                .filter(|t| t.lease.lock().owner_uid == peer_uid)
                .count()
                + reserving.values().filter(|&&uid| uid == peer_uid).count();
            if theirs >= config.tasks.max_tasks_per_uid {
                return Err(TaskError::Unavailable(format!(
                    "uid {peer_uid} has {theirs} live tasks, the most tasks.max_tasks_per_uid allows; \
                     release some (mop tasks, mop release --task-id …) or end their runs"
                )));
            }
            if tasks.len() + reserving.len() >= config.tasks.max_tasks {
                return Err(TaskError::Unavailable(format!(
                    "{} tasks are live, the most tasks.max_tasks allows",
                    tasks.len()
                )));
            }
            reserving.insert(task.task_id.clone(), peer_uid);
        }
        let id = task.task_id.clone();
        self.reserve_dirs(task, kind, peer_uid, profile, started)
            .inspect_err(|_| {
                self.reserving.lock().remove(&id);
            })
    }

    fn reserve_dirs(
        &self,
        task: TaskContext,
        kind: LeaseKind,
        owner_uid: u32,
        profile: Profile,
        started: Instant,
    ) -> Result<Reserved, TaskError> {
        let ws = task.workspace.clone();
        let id = task.task_id.clone();
        let paths = self.state.paths();
        // Pin the current generation under the pool's shared lock, so collection cannot
        // remove it between reading the link and pinning.
        let pool = Pool::existing(paths, &ws);
        let generation = {
            let pending = || {
                TaskError::Unavailable(if self.state.has_published(&ws) {
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
            let _lock = pool.lock(false).map_err(|_| pending())?;
            let name = pool.current_name().ok_or_else(pending)?;
            self.state.pin(&ws, &name);
            name
        };
        // A leftover with this id: nothing leases it (checked above). A pending retry
        // must not remove the new task's files later.
        self.leftovers.lock().retain(|l| l.task_id != id);
        let _ = std::fs::remove_dir_all(paths.task(&id));
        let socket_dir = paths.agent_dir(&crate::paths::agent_dir_name());
        if let Err(e) = make_dir(&paths.view(&id)).and_then(|_| make_dir(&socket_dir)) {
            let _ = std::fs::remove_dir_all(paths.task(&id));
            self.state.unpin(&ws, &generation);
            return Err(internal(e));
        }
        Ok(Reserved {
            task,
            kind,
            owner_uid,
            profile,
            generation,
            socket_dir,
            started,
        })
    }

    /// What the runner gets first: where the view and the agent socket will be.
    pub fn reservation(&self, r: &Reserved) -> Reservation {
        let paths = self.state.paths();
        Reservation {
            task_id: r.task.task_id.clone(),
            view_dir: paths.view(&r.task.task_id),
            agent_socket_dir: r.socket_dir.clone(),
            profile: r.profile.clone(),
        }
    }

    /// Second half of a prepare: selection, MEMORY.md, the view's files, the agent socket
    /// and the persisted lease. On failure everything the reservation made is undone.
    pub async fn fill(&self, r: Reserved, sockets: &dyn AgentSockets) -> Result<Plan, TaskError> {
        let id = r.task.task_id.clone();
        let (ws, generation, started) = (r.task.workspace.clone(), r.generation.clone(), r.started);
        let socket_dir = r.socket_dir.clone();
        let result = self.fill_inner(r, sockets).await;
        self.reserving.lock().remove(&id);
        match &result {
            Ok(plan) => tracing::info!(
                task = %plan.task_id, workspace = %ws, generation = %generation, mounted = plan.cards.len(),
                selected = plan.selected.iter().sum::<usize>(), micros = started.elapsed().as_micros() as u64,
                "task prepared"
            ),
            Err(e) => {
                tracing::warn!(task = %id, error = %e, "prepare failed");
                let paths = self.state.paths();
                let _ = std::fs::remove_dir_all(paths.task(&id));
                let _ = std::fs::remove_dir_all(&socket_dir);
                self.state.unpin(&ws, &generation);
            }
        }
        result
    }

    async fn fill_inner(&self, r: Reserved, sockets: &dyn AgentSockets) -> Result<Plan, TaskError> {
        let Reserved {
            task,
            kind,
            owner_uid,
            profile,
            generation,
            socket_dir,
            ..
        } = r;
        let paths = self.state.paths();
        let view_dir = paths.view(&task.task_id);
        let loaded = self.loaded.load(&task.workspace, &generation).await?;
        // Selection and the view take about a millisecond of CPU and file system work at
        // 10k cards. On the blocking pool they run beside the async workers, so the
        // runner's reservation goes out at once (the view is filled while bwrap sets up).
        let (selection, cards, receipt_cards) = {
            let loaded = loaded.clone();
            let task = task.clone();
            let view_dir = view_dir.clone();
            tokio::task::spawn_blocking(move || -> Result<_, TaskError> {
                let selection =
                    select_for_task(&loaded.catalog, &loaded.index, &task, &loaded.rules)
                        .map_err(internal)?;
                let md = render_memory_md(&loaded.catalog, &selection, &task, &loaded.rules.config);
                build_view(
                    &view_dir,
                    &loaded.pool,
                    &loaded.catalog,
                    &selection.cards,
                    &md,
                )
                .map_err(internal)?;
                let cards = selection
                    .cards
                    .iter()
                    .map(|s| {
                        let c = loaded.catalog.card(s.ord);
                        PlanCard {
                            id: c.id,
                            tier: s.tier,
                            path: c.path(),
                        }
                    })
                    .collect::<Vec<_>>();
                let receipt_cards =
                    receipt_cards(&loaded.catalog, &selection, &loaded.rules.config);
                Ok((selection, cards, receipt_cards))
            })
            .await
            .map_err(internal)??
        };
        let lease = Lease {
            epoch: loaded.catalog.epoch().to_owned(),
            revision: loaded.catalog.revision(),
            socket_dir,
            task,
            generation,
            kind,
            owner_uid,
            created_at: Timestamp::now(),
            view_dir,
            profile,
            cards,
            selected: selection.selected.0,
            left_out: selection.left_out.0,
        };
        let entry = Task::new(lease.clone(), Some(loaded));
        sockets.open(entry.clone()).map_err(internal)?;
        if let Err(e) = leases::save(paths, &lease) {
            let _ = entry.stop_agent.send_replace(true);
            return Err(internal(e));
        }
        self.receipts.begin(
            lease.owner_uid,
            Receipt {
                schema: RECEIPT_SCHEMA.into(),
                task_id: lease.task.task_id.clone(),
                workspace: lease.task.workspace.clone(),
                host: crate::sys::host_name(),
                generation: Version {
                    epoch: lease.epoch.clone(),
                    revision: lease.revision,
                }
                .to_string(),
                profile: lease.profile.name.clone(),
                user_id: lease.task.origin_user_id.clone(),
                asset_id: lease.task.asset_id.clone(),
                project_id: lease.task.project_id.clone(),
                agent: lease.task.agent.clone(),
                prepared_at: lease.created_at,
                ended_at: None,
                cards_unlisted: receipt_cards.len().saturating_sub(MAX_RECEIPT_CARDS),
                cards: receipt_cards.into_iter().take(MAX_RECEIPT_CARDS).collect(),
                left_out: lease.left_out,
                activity: Default::default(),
                outcome: None,
                exit_code: None,
                capture: None,
            },
        );
        self.tasks.lock().insert(lease.task.task_id.clone(), entry);
        Ok(lease.plan())
    }

    /// Releases a task: its view, agent socket, lease and pin go.
    pub fn release(&self, id: &str, caller_uid: Option<u32>, why: &str) -> Result<(), TaskError> {
        let task = {
            let mut tasks = self.tasks.lock();
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
        let _ = task.stop_agent.send_replace(true);
        let leftovers = Leftovers::of(self.state.paths(), id, &lease.socket_dir);
        self.state.unpin(&lease.task.workspace, &lease.generation);
        self.loaded.prune();
        self.receipts.end(id, lease.created_at, Timestamp::now());
        tracing::info!(task = id, workspace = %lease.task.workspace, why, "task released");
        if let Err(e) = leftovers.remove() {
            tracing::warn!(task = id, error = %e, "cannot remove the released task's files yet; retrying every second");
            self.leftovers.lock().push(leftovers);
        }
        Ok(())
    }

    /// Retries removing the files of released tasks that could not be removed at once.
    fn retry_leftovers(&self) {
        let pending = std::mem::take(&mut *self.leftovers.lock());
        for l in pending {
            match l.remove() {
                Ok(()) => tracing::info!(task = %l.task_id, "released task's files removed"),
                Err(e) => {
                    tracing::debug!(task = %l.task_id, error = %e, "released task's files still not removable");
                    self.leftovers.lock().push(l);
                }
            }
        }
    }

    /// The live task `id`, if `caller_uid` may act for it (its runner, or root).
    pub fn owned(&self, id: &str, caller_uid: u32) -> Result<Arc<Task>, TaskError> {
        let task = self
            .get(id)
            .ok_or_else(|| TaskError::NotFound(format!("no live task {id}")))?;
        let owner = task.lease().owner_uid;
        if caller_uid != 0 && caller_uid != owner {
            return Err(TaskError::Forbidden(format!(
                "task {id} belongs to uid {owner}"
            )));
        }
        Ok(task)
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
        let default_ttl = self.state.config().tasks.lease_ttl_secs;
        let lease = {
            let mut lease = task.lease.lock();
            if caller_uid != 0 && caller_uid != lease.owner_uid {
                return Err(TaskError::Forbidden(format!(
                    "task {id} belongs to uid {}",
                    lease.owner_uid
                )));
            }
            match &mut lease.kind {
                LeaseKind::Ttl { expires_at } => {
                    *expires_at = expiry(ttl_secs.unwrap_or(default_ttl))?
                }
                LeaseKind::Run { .. } => {
                    return Err(TaskError::Invalid(format!(
                        "task {id} lives as long as its mop run; it has no TTL to renew"
                    )));
                }
            }
            lease.clone()
        };
        leases::save(self.state.paths(), &lease).map_err(internal)?;
        Ok(lease.info())
    }

    /// Releases leases whose runner exited or whose TTL passed, and retries removing
    /// what earlier releases could not.
    pub fn reap(&self) {
        self.retry_leftovers();
        let kinds: Vec<(String, LeaseKind)> = self
            .tasks
            .lock()
            .iter()
            .map(|(id, t)| (id.clone(), t.lease.lock().kind.clone()))
            .collect();
        let ended = reaper::ended(
            kinds.iter().map(|(id, k)| (id.as_str(), k)),
            self.processes.as_ref(),
            Timestamp::now(),
        );
        for (id, why) in ended {
            if let Err(e) = self.release(&id, None, &why) {
                tracing::warn!(task = %id, error = %e, "cannot release an ended task");
            }
        }
    }

    /// After a restart: takes back persisted leases (pinning their generations before any
    /// collection runs) and removes task directories nothing leases.
    pub fn recover(&self, sockets: &dyn AgentSockets) {
        let config = self.state.config();
        let paths = self.state.paths();
        let mut live = Vec::new();
        for (file, lease) in leases::load_all(paths) {
            let id = lease.task.task_id.clone();
            let ws = &lease.task.workspace;
            if !paths.pool(ws).generation(&lease.generation).dir().is_dir()
                || !lease.view_dir.is_dir()
                || !config.sync.workspaces.contains(ws)
            {
                tracing::warn!(task = %id, "lease lost its generation or view; dropped");
                let _ = std::fs::remove_file(&file);
                let _ = std::fs::remove_dir_all(paths.task(&id));
                continue;
            }
            self.state.pin(ws, &lease.generation);
            let entry = Task::new(lease, None);
            if let Err(e) = sockets.open(entry.clone()) {
                tracing::warn!(task = %id, error = %e, "cannot reopen the agent socket");
            }
            self.tasks.lock().insert(id.clone(), entry);
            live.push(id);
        }
        for e in std::fs::read_dir(paths.tasks())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if !live.contains(&name) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        // Agent socket directories no live lease names: a dropped lease's, a killed
        // prepare's.
        let sockets_in_use: Vec<PathBuf> = self
            .tasks
            .lock()
            .values()
            .map(|t| t.lease.lock().socket_dir.clone())
            .collect();
        for e in std::fs::read_dir(paths.agent_dirs())
            .into_iter()
            .flatten()
            .flatten()
        {
            if !sockets_in_use.contains(&e.path()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        if !live.is_empty() {
            tracing::info!(tasks = live.len(), "task leases recovered");
        }
        self.receipts.recover(&live);
        self.reap();
    }
}

/// What a receipt lists of a selection: every mounted card with its hash, tier and rank,
/// and whether MEMORY.md names it (Primary Anchors or the recommendations table).
fn receipt_cards(
    catalog: &mop_cards::Catalog,
    selection: &mop_cards::Selection,
    config: &mop_cards::SelectionConfig,
) -> Vec<ReceiptCard> {
    selection
        .cards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let c = catalog.card(s.ord);
            ReceiptCard {
                id: c.id,
                sha256: c.sha256.to_owned(),
                tier: s.tier,
                rank: i as u32 + 1,
                mounted: true,
                listed: i < config.table_rows || c.is_primary_anchor(),
                workspace: c.from.map(str::to_owned),
            }
        })
        .collect()
}

/// Loads each newly published generation (and the current ones at start) so the first
/// prepare after a sync does not pay for it, and forgets generations nobody needs.
pub async fn warmer(tasks: Arc<Tasks>, mut stop: watch::Receiver<bool>) {
    let mut published = tasks.state.published.subscribe();
    let config = tasks.state.config();
    for ws in &config.sync.workspaces {
        if let Some(g) = Pool::existing(tasks.state.paths(), ws).current_name() {
            let _ = tasks.loaded.load(ws, &g).await;
            if let Some(s) = tasks.state.syncers.get(ws) {
                s.release_parsed();
            }
        }
    }
    let _ = tokio::task::spawn_blocking(crate::sys::release_freed_memory).await;
    loop {
        tokio::select! {
            msg = published.recv() => match msg {
                // An inherited pool's generations serve no task themselves: its cards
                // reach tasks through the compositions built from it.
                Ok((ws, _)) if !tasks.state.config().sync.workspaces.contains(&ws) => {
                    if let Some(s) = tasks.state.syncers.get(&ws) {
                        s.release_parsed();
                    }
                }
                Ok((ws, g)) => {
                    let _ = tasks.loaded.load(&ws, &g).await;
                    // The catalog is built: the parsed manifest it came from can go.
                    if let Some(s) = tasks.state.syncers.get(&ws) {
                        s.release_parsed();
                    }
                    tasks.loaded.prune();
                    let _ = tokio::task::spawn_blocking(crate::sys::release_freed_memory).await;
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
