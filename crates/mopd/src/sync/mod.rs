//! Keeping one workspace's pool in step with the server (DESIGN.md "Protocol", client
//! side): each poll is a conditional, delta-capable manifest request; [`plan`] decides
//! what the answer means, [`fetch`] brings the missing objects into the pool, and the
//! pool builds and publishes the new generation. Unchanged polls cost one 304. Errors back
//! off exponentially with jitter; an unreachable server is re-checked at its own interval,
//! while tasks keep being served from the last good generation.
//!
//! Owns each workspace's sync loop and its status updates; must not touch task views.

pub mod fetch;
pub mod inherit;
pub mod plan;
pub mod record;

#[cfg(test)]
mod poll_tests;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use mop_proto::control::VerifyReport;
use mop_proto::status::{ErrorKind, LocalCause, SyncResult, WorkspaceStatus};
use mop_proto::sync::Version;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::{CardServer, ClientError, ManifestFetch};
use crate::pool::earlier::Earlier;
use crate::pool::generations::Generation;
use crate::pool::{Pool, PoolError};
use crate::state::State;
use fetch::FetchError;
use plan::Plan;

/// A failed sync, classified for status advice.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Kind.
    pub kind: ErrorKind,
    /// Message.
    pub message: String,
    /// HTTP status of the manifest answer, if there was one.
    pub http_status: Option<u16>,
    /// True when the server answered at all.
    pub reached: bool,
    /// For a local failure with a known fix, which one.
    pub cause: Option<LocalCause>,
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let (kind, http_status, reached) = match &e {
            ClientError::Unreachable(_) => (ErrorKind::Unreachable, None, false),
            ClientError::Status { status: 401, .. } => (ErrorKind::Unauthorized, Some(401), true),
            ClientError::Status { status: 404, .. } => (ErrorKind::NotFound, Some(404), true),
            ClientError::Status { status, .. } => (ErrorKind::Server, Some(*status), true),
            ClientError::BadResponse(_) => (ErrorKind::BadResponse, None, true),
        };
        Failure {
            kind,
            message: e.to_string(),
            http_status,
            reached,
            cause: None,
        }
    }
}

impl From<PoolError> for Failure {
    fn from(e: PoolError) -> Failure {
        let kind = match e {
            // An object that fails its hash came so from the network.
            PoolError::Verify { .. } => ErrorKind::BadResponse,
            _ => ErrorKind::Local,
        };
        let cause = match e.io_kind() {
            Some(std::io::ErrorKind::StorageFull) => Some(LocalCause::DiskFull),
            Some(std::io::ErrorKind::ReadOnlyFilesystem) => Some(LocalCause::ReadOnly),
            _ => None,
        };
        Failure {
            kind,
            message: e.to_string(),
            http_status: None,
            reached: true,
            cause,
        }
    }
}

impl From<FetchError> for Failure {
    fn from(e: FetchError) -> Failure {
        match e {
            FetchError::Client(c) => c.into(),
            FetchError::Pool(p) => p.into(),
            FetchError::Gone(_) => Failure {
                kind: ErrorKind::NotFound,
                message: e.to_string(),
                http_status: Some(404),
                reached: true,
                cause: None,
            },
            FetchError::Batch(_) | FetchError::Unexpected(_) => Failure {
                kind: ErrorKind::BadResponse,
                message: e.to_string(),
                http_status: None,
                reached: true,
                cause: None,
            },
        }
    }
}

fn local(message: String) -> Failure {
    Failure {
        kind: ErrorKind::Local,
        message,
        http_status: None,
        reached: true,
        cause: None,
    }
}

fn refused(r: plan::Refused) -> Failure {
    Failure {
        kind: if r.rollback {
            ErrorKind::Rollback
        } else {
            ErrorKind::BadResponse
        },
        message: r.message,
        http_status: Some(200),
        reached: true,
        cause: None,
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, PoolError> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| local(format!("pool task failed: {e}")))?
        .map_err(Failure::from)
}

/// One workspace's sync machinery.
#[derive(Clone)]
pub struct Syncer {
    /// Workspace.
    pub ws: String,
    /// Its pool.
    pub pool: Pool,
    /// Its status, shared with the control socket.
    pub status: Arc<Mutex<WorkspaceStatus>>,
    /// Daemon-wide state.
    pub state: Arc<State>,
    /// The current generation, parsed, as this syncer last published or read it, until
    /// the task side has built its catalog from it (see [`Syncer::current`],
    /// [`Syncer::release_parsed`]).
    current: Arc<Mutex<Option<Arc<Generation>>>>,
    /// Whether the pool is known to hold every object of the current generation (see
    /// [`plan::Checked`]).
    whole: Arc<Wholeness>,
    /// The current generation's version, by its name (kept when the parsed generation
    /// is let go).
    held: Arc<Mutex<Option<(String, Version)>>>,
    /// Older answers in a row from replicas that are behind (see [`MAX_BEHIND`]).
    behind: Arc<std::sync::atomic::AtomicU32>,
    /// The (generation, model hash or "") whose index was last found usable, so a poll
    /// reads no file to know (see [`Syncer::refresh_index`]).
    index_checked: Arc<Mutex<Option<(String, String)>>>,
    /// Held from reading the current generation to publishing the next one (a poll, a
    /// repair), so that a repair of the generation a poll is replacing cannot publish
    /// after it and bring the older cards back.
    pub publishing: Arc<tokio::sync::Mutex<()>>,
}

/// What is known of the pool's objects: whether it held every object of the current
/// generation when a sync last planned against it, counted against the damage found since
/// (a quarantine, a recreated layout). Unknown at start.
#[derive(Debug)]
struct Wholeness {
    /// Times damage was found.
    damage: std::sync::atomic::AtomicU64,
    /// The `damage` count at which the pool was last known whole (`u64::MAX`: never).
    whole_at: std::sync::atomic::AtomicU64,
}

impl Default for Wholeness {
    fn default() -> Wholeness {
        Wholeness {
            damage: Default::default(),
            whole_at: u64::MAX.into(),
        }
    }
}

impl Wholeness {
    /// Something may have taken objects away.
    fn damaged(&self) {
        self.damage
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// What a plan may assume now, and the count to hand to [`Wholeness::whole_as_of`].
    fn checked(&self) -> (plan::Checked, u64) {
        let now = self.damage.load(std::sync::atomic::Ordering::SeqCst);
        match self.whole_at.load(std::sync::atomic::Ordering::SeqCst) == now {
            true => (plan::Checked::Whole, now),
            false => (plan::Checked::Unknown, now),
        }
    }

    /// The generation planned at damage count `at` was published whole.
    fn whole_as_of(&self, at: u64) {
        self.whole_at.store(at, std::sync::atomic::Ordering::SeqCst);
    }
}

/// See [`Syncer::try_sync`].
static ONE_SYNC: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Older answers in a row (with no current answer between them) taken as a replica that
/// is behind before they count as a rollback: replicas of one database catch up within a
/// second or two, a server that keeps answering with the past does not.
const MAX_BEHIND: u32 = 5;

impl Syncer {
    /// The sync machinery of one workspace.
    pub fn new(
        ws: String,
        pool: Pool,
        status: Arc<Mutex<WorkspaceStatus>>,
        state: Arc<State>,
    ) -> Syncer {
        Syncer {
            ws,
            pool,
            status,
            state,
            current: Arc::default(),
            whole: Arc::default(),
            held: Arc::default(),
            behind: Arc::default(),
            index_checked: Arc::default(),
            publishing: Arc::default(),
        }
    }

    /// The version of the current generation, if there is one: an unchanged poll costs
    /// one readlink, not a parse of the manifest (34 ms at 10k cards).
    async fn held_version(&self) -> Result<Option<Version>, Failure> {
        let Some(name) = self.pool.current_name() else {
            return Ok(None);
        };
        if let Some((held, version)) = &*self.held.lock()
            && *held == name
        {
            return Ok(Some(version.clone()));
        }
        Ok(self.current().await?.map(|g| Version::of(&g.manifest)))
    }

    /// The current generation, read and parsed once per sync: the sync plans against it,
    /// the composition and collection use it, and the task side builds its catalog from
    /// the one it publishes ([`Syncer::cached`]) before it is let go. Each of them read and
    /// parsed the manifest again before (half of a sync's CPU at 10k cards). Generations are immutable, and a name is taken again only after its
    /// generation was collected, so the current name is the key.
    pub(crate) async fn current(&self) -> Result<Option<Arc<Generation>>, Failure> {
        let Some(name) = self.pool.current_name() else {
            return Ok(None);
        };
        if let Some(g) = self.cached(&name) {
            return Ok(Some(g));
        }
        let pool = self.pool.clone();
        let g = Arc::new(blocking(move || pool.generation(&name)).await?);
        // Kept only while it is current: a generation published meanwhile was kept by its
        // publisher (after its rename, under this same lock), and must not be replaced by
        // an older one whose name a later generation could take again.
        let mut kept = self.current.lock();
        if self.pool.current_name().as_deref() == Some(g.name.as_str()) {
            self.keep(&mut kept, g.clone());
        }
        Ok(Some(g))
    }

    /// Keeps `g` as the parsed current generation, and its version by name.
    fn keep(&self, slot: &mut Option<Arc<Generation>>, g: Arc<Generation>) {
        *self.held.lock() = Some((g.name.clone(), Version::of(&g.manifest)));
        *slot = Some(g);
    }

    /// Lets the parsed current generation go: the task side built its catalog from it, and
    /// keeping it would hold about 1.25 KiB per card for as long as nothing changes (the
    /// daemon's memory target; five 10k-card workspaces kept 104 MiB resident instead of
    /// 49). The next sync reads it once again.
    pub fn release_parsed(&self) {
        self.current.lock().take();
    }

    /// The generation `name`, parsed, if it is the one this syncer holds as current.
    pub fn cached(&self, name: &str) -> Option<Arc<Generation>> {
        self.current
            .lock()
            .as_ref()
            .filter(|g| g.name == name)
            .cloned()
    }

    fn update(&self, f: impl FnOnce(&mut WorkspaceStatus)) -> WorkspaceStatus {
        let mut s = self.status.lock();
        f(&mut s);
        s.clone()
    }

    /// Reads the current generation into the status (at start, and after changes).
    pub async fn refresh_current(&self) {
        let current = self.current().await;
        let pool = self.pool.clone();
        let usage = tokio::task::spawn_blocking(move || pool.usage())
            .await
            .unwrap_or(0);
        self.update(|s| {
            s.pool_bytes = usage;
            match current {
                Ok(Some(g)) => record_generation(
                    s,
                    &g.name,
                    g.manifest.epoch.clone(),
                    g.manifest.revision,
                    g.manifest.cards.len(),
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(workspace = %self.ws, error = %e.message, "current generation unreadable"),
            }
        });
    }

    /// One poll, while the caller holds this workspace's [`Syncer::publishing`] lock.
    /// Records the outcome in the status and returns it.
    pub async fn sync_once(
        &self,
        _publishing: &tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<SyncResult, Failure> {
        let Poll {
            server,
            outcome,
            inherits,
        } = self.poll().await;
        let now = Timestamp::now();
        if let Err(f) = &outcome
            && f.reached
        {
            // A server that answered with something refused is not asked first again.
            self.state.client().distrust_last_answer();
        }
        let status = self.update(|s| {
            record_sync(s, now, &outcome, server);
            if let Some(inherits) = inherits {
                if s.inherits != inherits {
                    tracing::info!(workspace = %s.workspace, inherits = ?inherits, "the server names the workspaces this one inherits");
                }
                s.inherits = inherits;
            }
        });
        let metrics = &self.state.metrics;
        let label = match &outcome {
            Ok(polled) => polled.label(),
            Err(f) => f.kind.as_str(),
        };
        metrics.sync(&self.ws, label);
        metrics.pool_bytes(&self.ws, status.pool_bytes);
        record::save(self.state.paths(), &status);
        outcome.map(|p| p.result().0)
    }

    /// One poll: readies the pool, asks the server, and applies its answer.
    async fn poll(&self) -> Poll {
        let held = match self.ready().await {
            Ok(held) => held,
            Err(f) => {
                return Poll {
                    server: None,
                    outcome: Err(f),
                    inherits: None,
                };
            }
        };
        // One workspace at a time from here to the published generation: each holds a
        // parsed manifest (about 11 MiB at 10k cards) for the whole sync, and five cold
        // syncs at once held them all while waiting for their index builds (peak 154 MiB).
        // An unchanged poll holds the permit for its 304 only.
        let _one = ONE_SYNC
            .acquire()
            .await
            .expect("the sync semaphore is never closed");
        let client = self.state.client();
        let fetched = client.manifest(&self.ws, held.as_ref()).await;
        let server = match &fetched {
            Err(e) if e.is_offline() => None,
            _ => Some(client.answered_by().to_owned()),
        };
        // An inherited pool's answer names nothing it inherits: inheritance is one level.
        let inherits = fetched.as_ref().ok().map(|f| {
            f.inherits()
                .iter()
                .filter(|w| **w != self.ws)
                .cloned()
                .collect::<Vec<_>>()
        });
        let outcome = match fetched {
            Err(e) => Err(e.into()),
            Ok(ManifestFetch::NotModified { .. }) => {
                self.behind.store(0, std::sync::atomic::Ordering::Relaxed);
                Ok(Polled::NotModified { http_status: 304 })
            }
            Ok(ManifestFetch::Manifest { manifest, .. }) => {
                let composing = inherits.clone().unwrap_or_default();
                self.apply(&*client, *manifest, &composing).await
            }
        };
        Poll {
            server,
            outcome,
            inherits,
        }
    }

    /// Before the server is asked: the pool's layout is complete, the current
    /// generation's index is one this build reads, and the held version is known.
    async fn ready(&self) -> Result<Option<Version>, Failure> {
        let pool = self.pool.clone();
        if blocking(move || pool.ensure_layout()).await? {
            self.whole.damaged();
            // With no `current` left, the held version is none: everything is fetched again.
            tracing::warn!(workspace = %self.ws, pool = %self.pool.root().display(), "pool directory was missing or incomplete; recreated it and syncing in full");
        }
        // A generation whose index this build cannot read is rebuilt from the pool alone,
        // so an upgraded daemon serves offline too.
        self.refresh_index().await?;
        self.held_version().await
    }

    /// Applies a manifest the server sent: plans it against the current generation's own
    /// cards, and builds and publishes what it describes, composed with the current cards
    /// of the workspaces it `inherits`.
    async fn apply(
        &self,
        client: &dyn CardServer,
        incoming: mop_proto::sync::Manifest,
        inherits: &[String],
    ) -> Result<Polled, Failure> {
        // Loaded only now that something came: a delta is checked against it, so a
        // generation published in between (a repair) cannot be mixed up with `held`.
        let current = self.current().await?;
        let pool = self.pool.clone();
        let held = current.as_ref().map(|g| inherit::own_part(&g.manifest));
        let (checked, as_of) = self.whole.checked();
        let planned = match plan::plan(incoming, held.as_deref(), checked, |sha, size| {
            pool.has_object(sha, size)
        }) {
            Ok(p) => p,
            // With replicas, an older revision is one that has not caught up yet: the
            // held generation stays (it is never rolled back) and the next poll asks
            // the next replica. Only a streak of them is reported as a rollback.
            Err(r)
                if r.rollback
                    && client.servers() > 1
                    && self
                        .behind
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                        < MAX_BEHIND =>
            {
                tracing::info!(workspace = %self.ws, server = %client.answered_by(), "a replica answered with an older revision than the held one (it is behind); kept the held generation");
                self.update(|s| s.stats.behind_answers += 1);
                client.distrust_last_answer();
                return Ok(Polled::Behind);
            }
            Err(r) => return Err(refused(r)),
        };
        self.behind.store(0, std::sync::atomic::Ordering::Relaxed);
        drop(held);
        let Plan::Publish {
            manifest,
            missing,
            replaces_epoch,
        } = planned
        else {
            return Ok(Polled::NotModified { http_status: 200 });
        };
        if let Some(old) = replaces_epoch {
            let warning = format!(
                "server database epoch changed from {old} to {} at {}: the server was restored or rebuilt, and its cards replaced the pool's",
                manifest.epoch,
                Timestamp::now()
            );
            tracing::warn!(workspace = %self.ws, old = %old, new = %manifest.epoch, "new server epoch accepted");
            self.update(|s| s.epoch_warning = Some(warning));
        }
        self.check_quota(&missing)?;
        let manifest = self.composed(manifest, inherits).await?;
        // Only the plan and this comparison need the held generation; the fetch and build
        // do not.
        let earlier = current.map(|g| Earlier::between(&g.name, &g.manifest, &manifest));
        let inherited = manifest.inherited.clone();
        let (epoch, revision, cards) = (
            manifest.epoch.clone(),
            manifest.revision,
            manifest.cards.len(),
        );
        let built = self
            .build_and_publish(client, manifest, &missing, earlier)
            .await?;
        // Every object of the new generation was found or fetched (unless something was
        // found damaged meanwhile).
        self.whole.whole_as_of(as_of);
        tracing::info!(workspace = %self.ws, generation = %built.name, cards, objects = missing.len(), bytes = built.received, fetch_ms = built.fetch_ms, build_ms = built.build_ms, flush_ms = built.flush_ms, collect_ms = built.collect_ms, build_cpu_ms = built.build_cpu_ms, "published a new generation");
        self.update(|s| {
            s.stats.objects_fetched += missing.len() as u64;
            s.stats.object_bytes += built.received;
            record_generation(s, &built.name, epoch, revision, cards);
            s.inherited = inherited;
            s.pool_bytes = built.usage;
        });
        Ok(Polled::Modified)
    }

    /// Rebuilds the current generation from its own manifest when its search index is of
    /// an earlier format (an upgrade: this build cannot read it) or, with a model
    /// configured, when its card vectors are not that model's (none, another model, other
    /// files of it): an installed or changed model then ranks from the next poll on,
    /// without waiting for a card to change. Checked once per generation and model.
    async fn refresh_index(&self) -> Result<(), Failure> {
        let Some(name) = self.pool.current_name() else {
            return Ok(());
        };
        let model = self.state.embedding_model();
        let model_hash = model.as_ref().map(|m| m.fingerprint().sha256.clone());
        let key = (name.clone(), model_hash.clone().unwrap_or_default());
        if self.index_checked.lock().as_ref() == Some(&key) {
            return Ok(());
        }
        // Checked once per generation and model, whatever the outcome: a rebuild that
        // fails (or stores no vectors) is not retried at every poll.
        *self.index_checked.lock() = Some(key.clone());
        let index = self.pool.paths().generation(&name).index();
        let checking = model.clone();
        let (format, vectors) = blocking(move || {
            let format = mop_search::index_format(&index);
            let vectors = checking.is_none_or(|m| mop_embed::usable(&index, &m));
            Ok((format, vectors))
        })
        .await?;
        let why = match (format, vectors) {
            (Some(mop_search::FORMAT), true) => return Ok(()),
            (Some(mop_search::FORMAT), false) => "with the configured model's card vectors",
            _ => "with this version's search index format",
        };
        let Some(current) = self.current().await? else {
            return Ok(());
        };
        let m = &current.manifest;
        let (epoch, revision, cards) = (m.epoch.clone(), m.revision, m.cards.len());
        let built = self
            .build_and_publish(&*self.state.client(), current.manifest.clone(), &[], None)
            .await?;
        let (name, usage) = (built.name, built.usage);
        let model = model
            .map(|m| m.fingerprint().to_string())
            .unwrap_or_default();
        tracing::info!(workspace = %self.ws, generation = %name, index_format = ?format, model = %model, "rebuilt the current generation {why}");
        self.update(|s| {
            record_generation(s, &name, epoch, revision, cards);
            s.pool_bytes = usage;
        });
        self.refresh_current().await;
        *self.index_checked.lock() = Some((name, key.1));
        Ok(())
    }

    /// Refuses a sync that would take the pools past `pool.max_bytes`.
    fn check_quota(&self, missing: &[(String, u64)]) -> Result<(), Failure> {
        let need: u64 = missing.iter().map(|(_, s)| *s).sum();
        let config = self.state.config();
        let used = self.state.pool_usage();
        if used + need <= config.pool.max_bytes {
            return Ok(());
        }
        let msg = format!(
            "pool quota: syncing needs {need} more bytes but the pools already use {used} of pool.max_bytes = {}",
            config.pool.max_bytes
        );
        tracing::error!(workspace = %self.ws, need, used, max = config.pool.max_bytes, "{msg}");
        Err(Failure {
            kind: ErrorKind::Quota,
            message: msg,
            http_status: Some(200),
            reached: true,
            cause: None,
        })
    }

    /// Builds a generation of `manifest` while its `missing` objects are fetched from
    /// `client` (the build reads the others from the pool), publishes and announces it,
    /// then collects what nothing needs. With `earlier`, the index is made from the
    /// previous generation's where it can be.
    async fn build_and_publish(
        &self,
        client: &dyn CardServer,
        manifest: mop_proto::sync::Manifest,
        missing: &[(String, u64)],
        earlier: Option<Earlier>,
    ) -> Result<Built, Failure> {
        // The generation this one replaces, parsed already: collection looks at its objects.
        let replaced = self.current().await.ok().flatten();
        let pool = self.pool.clone();
        let model = self.state.embedding_model();
        let arriving = missing.iter().map(|(sha, _)| sha.clone()).collect();
        let started = std::time::Instant::now();
        let manifest = Arc::new(manifest);
        let building_from = manifest.clone();
        let (building, feed) =
            blocking(move || pool.start_generation(building_from, arriving, earlier, model))
                .await?;
        let fetched = match missing {
            [] => Ok(0),
            _ => fetch::fetch(client, &self.pool, &self.ws, missing, &feed).await,
        };
        // A build still waiting for an object fails once the feed closes, and removes its
        // directory: it is waited for either way, so that nothing of it outlives the sync.
        drop(feed);
        let fetch_ms = started.elapsed().as_millis() as u64;
        let pool = self.pool.clone();
        let (state, ws) = (self.state.clone(), self.ws.clone());
        let finished = blocking(move || {
            // The claim keeps collection off the generation until it is current.
            let (claim, build_cpu) = building.finish()?;
            let name = claim.name().to_owned();
            let built = started.elapsed();
            pool.publish(&name)?;
            drop(claim);
            let flushed = started.elapsed();
            let replaced = replaced.as_deref().map(|g| (g.name.as_str(), &g.manifest));
            let report = pool.collect(&state.pinned(&ws), Some((&name, &manifest)), replaced)?;
            let usage = report.bytes.unwrap_or_else(|| pool.usage());
            // The build's thread has ended, so this is the one reference left.
            let manifest = Arc::try_unwrap(manifest).unwrap_or_else(|m| (*m).clone());
            let generation = Generation {
                paths: pool.paths().generation(&name),
                name,
                manifest,
            };
            Ok((
                generation,
                usage,
                built,
                flushed,
                started.elapsed(),
                build_cpu,
            ))
        });
        let received = match fetched {
            Ok(received) => received,
            Err(e) => {
                let _ = finished.await;
                return Err(e.into());
            }
        };
        let (generation, usage, built, flushed, collected, build_cpu) = finished.await?;
        self.state.metrics.built(started.elapsed());
        let name = generation.name.clone();
        self.keep(&mut self.current.lock(), Arc::new(generation));
        let _ = self.state.published.send((self.ws.clone(), name.clone()));
        Ok(Built {
            name,
            usage,
            received,
            fetch_ms,
            build_ms: (built.as_millis() as u64).saturating_sub(fetch_ms),
            flush_ms: (flushed - built).as_millis() as u64,
            collect_ms: (collected - flushed).as_millis() as u64,
            build_cpu_ms: build_cpu.as_millis() as u64,
        })
    }

    /// Re-hashes the pool; with `repair`, fetches what is missing or bad again and
    /// publishes a rebuilt generation (new files, new links, one rename).
    pub async fn verify(&self, repair: bool) -> Result<(VerifyReport, Option<String>), Failure> {
        let pool = self.pool.clone();
        let pins = self.state.pinned(&self.ws);
        let report = blocking(move || pool.verify(&pins)).await?;
        if !report.is_clean() {
            self.whole.damaged();
        }
        if !report.bad_objects.is_empty() {
            self.update(|s| s.stats.objects_quarantined += report.bad_objects.len() as u64);
        }
        if report.is_clean() || !repair {
            return Ok((report, None));
        }
        let repaired = self.repair().await?;
        if repaired.is_some() {
            // Workspaces that inherit this one left its damaged cards out of their
            // composition: compose them again from the repaired pool. (After this pool's
            // lock is released: an inheriting round takes its own lock, then this one's.)
            for s in self.state.syncers.inheriting(&self.ws) {
                if let Err(f) = s.recompose().await {
                    tracing::warn!(workspace = %s.ws, inherited = %self.ws, error = %f.message, "cannot compose again after a repair of an inherited pool");
                }
            }
        }
        Ok((report, repaired))
    }

    /// Builds and publishes the current generation again, fetching (or, for inherited
    /// cards, linking) what the pool lacks. Its name, when there is a current generation.
    async fn repair(&self) -> Result<Option<String>, Failure> {
        let _publishing = self.publishing.lock().await;
        let Some(current) = self.current().await? else {
            return Ok(None);
        };
        // Only the own cards come from this workspace's server; an inherited card's object
        // comes from its own pool again.
        let own = inherit::own_part(&current.manifest).into_owned();
        let missing = plan::missing_objects(plan::objects_of(&own), |sha, size| {
            self.pool.has_object(sha, size)
        });
        let inherits: Vec<String> = current
            .manifest
            .inherited
            .iter()
            .map(|i| i.workspace.clone())
            .collect();
        let manifest = self.composed(own, &inherits).await?;
        let name = self
            .build_and_publish(&*self.state.client(), manifest, &missing, None)
            .await?
            .name;
        tracing::info!(workspace = %self.ws, generation = %name, refetched = missing.len(), "pool repaired");
        self.refresh_current().await;
        Ok(Some(name))
    }
}

/// What a poll that went well did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polled {
    /// Nothing to do: a 304, or a 200 whose manifest is what the pool holds.
    NotModified {
        /// The manifest answer's status.
        http_status: u16,
    },
    /// A replica that is behind answered with an older revision; the held generation
    /// stays and the next poll starts at the next server.
    Behind,
    /// A new generation was published.
    Modified,
}

impl Polled {
    /// What the status records.
    fn result(self) -> (SyncResult, Option<u16>) {
        match self {
            Polled::NotModified { http_status } => (SyncResult::NotModified, Some(http_status)),
            Polled::Behind => (SyncResult::NotModified, Some(200)),
            Polled::Modified => (SyncResult::Modified, Some(200)),
        }
    }

    /// Its `mopd_syncs_total` result label.
    fn label(self) -> &'static str {
        match self {
            Polled::NotModified { .. } => "not_modified",
            Polled::Behind => "behind",
            Polled::Modified => "modified",
        }
    }
}

/// One poll: which server answered its manifest request (none when none was reached),
/// and what came of it.
struct Poll {
    server: Option<String>,
    outcome: Result<Polled, Failure>,
    /// The workspaces the answer said this one inherits (none: no answer).
    inherits: Option<Vec<String>>,
}

/// A published generation: its name, the pool's size after it, the bytes fetched for it,
/// and how long it took, for the log line that announces it: the fetch (the build runs
/// beside it), the build's remainder once the last object came, the flush and swap, and
/// the collection and measuring of the pool after it.
struct Built {
    name: String,
    usage: u64,
    received: u64,
    fetch_ms: u64,
    build_ms: u64,
    flush_ms: u64,
    collect_ms: u64,
    /// CPU time of the build's thread (it indexes every card while the fetch goes on).
    build_cpu_ms: u64,
}

/// Notes a generation in the status: its name and the version and size of its manifest.
fn record_generation(
    s: &mut WorkspaceStatus,
    name: &str,
    epoch: String,
    revision: u64,
    cards: usize,
) {
    s.epoch = Some(epoch);
    s.revision = Some(revision);
    s.cards = cards;
    s.generation = Some(name.to_owned());
}

/// Notes a poll's outcome in the status (logging a failure once, not at every retry).
fn record_sync(
    s: &mut WorkspaceStatus,
    now: Timestamp,
    outcome: &Result<Polled, Failure>,
    server: Option<String>,
) {
    use mop_proto::status::{ErrorRecord, SyncRecord};
    s.stats.polls += 1;
    match outcome.as_ref().map(|p| p.result()) {
        Ok((result, code)) => {
            if s.consecutive_failures > 0 {
                tracing::info!(workspace = %s.workspace, "sync recovered after {} failures", s.consecutive_failures);
            }
            s.consecutive_failures = 0;
            s.last_reached = Some(now);
            s.last_sync = Some(SyncRecord {
                at: now,
                result,
                http_status: code,
                server,
            });
            match result {
                SyncResult::NotModified => s.stats.not_modified += 1,
                SyncResult::Modified => s.stats.generations += 1,
                SyncResult::Failed => {}
            }
        }
        Err(f) => {
            let repeated = s
                .last_error
                .as_ref()
                .is_some_and(|e| e.message == f.message)
                && s.consecutive_failures > 0;
            if !repeated {
                tracing::warn!(workspace = %s.workspace, kind = ?f.kind, error = %f.message, "sync failed; serving the last good generation");
            }
            s.consecutive_failures += 1;
            s.stats.failures += 1;
            if f.kind == ErrorKind::Rollback {
                s.stats.rollbacks_refused += 1;
            }
            if f.reached {
                s.last_reached = Some(now);
            }
            s.last_sync = Some(SyncRecord {
                at: now,
                result: SyncResult::Failed,
                http_status: f.http_status,
                server,
            });
            s.last_error = Some(ErrorRecord {
                at: now,
                kind: f.kind,
                message: f.message.clone(),
                cause: f.cause,
            });
        }
    }
}

/// A request to sync now; answered after the sync.
pub type Trigger = oneshot::Sender<Result<SyncResult, Failure>>;

/// The delay before the next poll.
pub fn next_delay(
    config: &crate::config::MopdConfig,
    last: &Result<SyncResult, Failure>,
    failures: u32,
) -> Duration {
    let jitter = |d: Duration, lo: f64, hi: f64| d.mul_f64(lo + fastrand::f64() * (hi - lo));
    match last {
        Ok(_) => jitter(config.interval(), 0.8, 1.2),
        Err(f) if f.kind == ErrorKind::Unreachable => jitter(
            Duration::from_secs(config.sync.offline_recheck_secs),
            0.8,
            1.2,
        ),
        Err(_) => {
            let exp = 2u64.saturating_pow(failures.saturating_sub(1).min(30));
            let capped = exp.min(config.sync.backoff_max_secs);
            jitter(Duration::from_secs(capped), 0.5, 1.0)
        }
    }
}

/// The sync loop of one workspace: poll, wait (or be triggered), until stopped.
pub async fn run(
    syncer: Syncer,
    mut triggers: mpsc::Receiver<Trigger>,
    mut stop: watch::Receiver<bool>,
    ready: watch::Sender<bool>,
) {
    syncer.refresh_current().await;
    if syncer.status.lock().generation.is_some() {
        let _ = ready.send(true);
    }
    let mut waiting: Vec<Trigger> = Vec::new();
    loop {
        // A repair of this workspace may hold it for a while: stopping does not wait.
        let publishing = tokio::select! {
            held = syncer.publishing.lock() => held,
            _ = stop.changed() => return,
        };
        let result = syncer.sync_round(&publishing).await;
        drop(publishing);
        let _ = ready.send(true);
        for t in waiting.drain(..) {
            let _ = t.send(result.clone());
        }
        let failures = syncer.status.lock().consecutive_failures;
        let delay = next_delay(&syncer.state.config(), &result, failures);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            t = triggers.recv() => match t {
                Some(t) => waiting.push(t),
                None => return,
            },
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> crate::config::MopdConfig {
        toml::from_str(
            "[server]\nurl = \"http://x.invalid\"\n[sync]\nworkspaces = [\"a\"]\ninterval_secs = 30\noffline_recheck_secs = 10\nbackoff_max_secs = 60\n",
        )
        .unwrap()
    }

    fn failure(kind: ErrorKind) -> Result<SyncResult, Failure> {
        Err(Failure {
            kind,
            message: String::new(),
            http_status: None,
            reached: false,
            cause: None,
        })
    }

    #[test]
    fn delays_jitter_back_off_and_recheck_offline_servers_at_their_own_pace() {
        let c = config();
        for _ in 0..200 {
            let ok = next_delay(&c, &Ok(SyncResult::NotModified), 0).as_secs_f64();
            assert!((24.0..=36.0).contains(&ok), "{ok}");
            let offline = next_delay(&c, &failure(ErrorKind::Unreachable), 7).as_secs_f64();
            assert!((8.0..=12.0).contains(&offline), "{offline}");
            let first = next_delay(&c, &failure(ErrorKind::Server), 1).as_secs_f64();
            assert!((0.5..=1.0).contains(&first), "{first}");
            let fourth = next_delay(&c, &failure(ErrorKind::BadResponse), 4).as_secs_f64();
            assert!((4.0..=8.0).contains(&fourth), "{fourth}");
            let capped = next_delay(&c, &failure(ErrorKind::Server), 40).as_secs_f64();
            assert!((30.0..=60.0).contains(&capped), "{capped}");
        }
        // Jitter really varies.
        let a: Vec<u128> = (0..20)
            .map(|_| next_delay(&c, &Ok(SyncResult::Modified), 0).as_millis())
            .collect();
        assert!(a.iter().any(|x| *x != a[0]));
    }
}
