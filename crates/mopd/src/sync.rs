//! Keeping one workspace's pool in step with the server (DESIGN.md "Protocol", client side).
//!
//! Each poll is a conditional, delta-capable manifest request. A new manifest is checked
//! (entries well-formed, same epoch never going backwards, a new epoch accepted with a
//! warning), the missing objects are fetched and verified, a new generation is built and
//! published, and old ones are collected. Unchanged polls cost one 304. Errors back off
//! exponentially with jitter; an unreachable server is re-checked at its own interval,
//! while tasks keep being served from the last good generation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use mop_cards::{Manifest, ManifestEntry};
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::{ClientError, ManifestFetch};
use crate::pool::{Pool, PoolError, VerifyReport};
use crate::shared::Shared;
use crate::status::{ErrorKind, ErrorRecord, SyncRecord, SyncResult, WorkspaceStatus};

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
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let (kind, http_status, reached) = match &e {
            ClientError::Unreachable(_) => (ErrorKind::Unreachable, None, false),
            ClientError::Status { status: 401, .. } => (ErrorKind::Unauthorized, Some(401), true),
            ClientError::Status { status: 404, .. } => (ErrorKind::NotFound, Some(404), true),
            ClientError::Status { status, .. } => (ErrorKind::Server, Some(*status), true),
            ClientError::BadResponse(_) => (ErrorKind::BadResponse, None, true),
            ClientError::Pool(PoolError::Verify { .. }) => (ErrorKind::BadResponse, None, true),
            ClientError::Pool(_) => (ErrorKind::Local, None, true),
        };
        Failure {
            kind,
            message: e.to_string(),
            http_status,
            reached,
        }
    }
}

impl From<PoolError> for Failure {
    fn from(e: PoolError) -> Failure {
        Failure {
            kind: ErrorKind::Local,
            message: e.to_string(),
            http_status: None,
            reached: true,
        }
    }
}

fn local(message: String) -> Failure {
    Failure {
        kind: ErrorKind::Local,
        message,
        http_status: None,
        reached: true,
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
    pub shared: Arc<Shared>,
    /// The held version, keyed by the current generation's name. Generations are
    /// immutable and names are never reused, so an unchanged poll costs one readlink
    /// instead of parsing the current manifest (34 ms at 10k cards before this cache).
    held: Arc<Mutex<Option<(String, mop_cards::Version)>>>,
}

/// Where a workspace's status is persisted.
pub fn status_file(state_dir: &Path, ws: &str) -> PathBuf {
    state_dir.join("workspaces").join(ws).join("status.json")
}

/// Loads a persisted status (or a fresh one).
pub fn load_status(state_dir: &Path, ws: &str) -> WorkspaceStatus {
    std::fs::read(status_file(state_dir, ws))
        .ok()
        .and_then(|b| serde_json::from_slice::<WorkspaceStatus>(&b).ok())
        .map(|mut s| {
            s.stats = Default::default();
            s
        })
        .unwrap_or_else(|| WorkspaceStatus {
            workspace: ws.to_owned(),
            ..Default::default()
        })
}

fn save_status(state_dir: &Path, status: &WorkspaceStatus) {
    let path = status_file(state_dir, &status.workspace);
    let result = (|| -> std::io::Result<()> {
        let dir = path.parent().expect("status files have a directory");
        crate::pool::make_dir(dir).map_err(std::io::Error::other)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(
            &mut tmp,
            &serde_json::to_vec_pretty(status).expect("status serializes"),
        )?;
        tmp.persist(&path).map_err(|e| e.error)?;
        Ok(())
    })();
    if let Err(e) = result {
        tracing::warn!(workspace = %status.workspace, path = %path.display(), error = %e, "cannot save sync status");
    }
}

/// Applies a delta to the manifest it was computed from.
fn apply_delta(base: &Manifest, delta: Manifest) -> Manifest {
    let mut by_id: BTreeMap<_, ManifestEntry> = base
        .cards
        .iter()
        .map(|c| (c.summary.id, c.clone()))
        .collect();
    for id in &delta.removed {
        by_id.remove(id);
    }
    for c in delta.cards {
        by_id.insert(c.summary.id, c);
    }
    Manifest {
        epoch: delta.epoch,
        revision: delta.revision,
        generated_at: delta.generated_at,
        since: None,
        cards: by_id.into_values().collect(),
        removed: Vec::new(),
    }
}

impl Syncer {
    /// The sync machinery of one workspace.
    pub fn new(
        ws: String,
        pool: Pool,
        status: Arc<Mutex<WorkspaceStatus>>,
        shared: Arc<Shared>,
    ) -> Syncer {
        Syncer {
            ws,
            pool,
            status,
            shared,
            held: Arc::default(),
        }
    }

    /// The version of the current generation, if there is one.
    async fn held_version(&self) -> Result<Option<mop_cards::Version>, Failure> {
        let Some(name) = self.pool.current_name() else {
            return Ok(None);
        };
        if let Some((cached, version)) = &*self.held.lock().unwrap_or_else(|p| p.into_inner())
            && *cached == name
        {
            return Ok(Some(version.clone()));
        }
        let pool = self.pool.clone();
        let generation = blocking(move || pool.generation(&name)).await?;
        let version = generation.manifest.version();
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((generation.name, version.clone()));
        Ok(Some(version))
    }

    fn update(&self, f: impl FnOnce(&mut WorkspaceStatus)) -> WorkspaceStatus {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s);
        s.clone()
    }

    /// Reads the current generation into the status (at start, and after changes).
    pub async fn refresh_current(&self) {
        let pool = self.pool.clone();
        let current = blocking(move || pool.current()).await;
        let pool = self.pool.clone();
        let usage = tokio::task::spawn_blocking(move || pool.usage())
            .await
            .unwrap_or(0);
        self.update(|s| {
            s.pool_bytes = usage;
            match current {
                Ok(Some(g)) => {
                    s.epoch = Some(g.manifest.epoch.clone());
                    s.revision = Some(g.manifest.revision);
                    s.cards = g.manifest.cards.len();
                    s.generation = Some(g.name);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(workspace = %self.ws, error = %e.message, "current generation unreadable"),
            }
        });
    }

    /// One poll. Records the outcome in the status and returns it.
    pub async fn sync_once(&self) -> Result<SyncResult, Failure> {
        let outcome = self.try_sync().await;
        let now = Timestamp::now();
        let config = self.shared.config();
        let status = self.update(|s| {
            s.stats.polls += 1;
            match &outcome {
                Ok((result, code)) => {
                    if s.consecutive_failures > 0 {
                        tracing::info!(workspace = %s.workspace, "sync recovered after {} failures", s.consecutive_failures);
                    }
                    s.consecutive_failures = 0;
                    s.last_reached = Some(now);
                    s.last_sync = Some(SyncRecord { at: now, result: *result, http_status: *code });
                    match result {
                        SyncResult::NotModified => s.stats.not_modified += 1,
                        SyncResult::Modified => s.stats.generations += 1,
                        SyncResult::Failed => {}
                    }
                }
                Err(f) => {
                    let repeated = s.last_error.as_ref().is_some_and(|e| e.message == f.message) && s.consecutive_failures > 0;
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
                    s.last_sync = Some(SyncRecord { at: now, result: SyncResult::Failed, http_status: f.http_status });
                    s.last_error = Some(ErrorRecord { at: now, kind: f.kind, message: f.message.clone() });
                }
            }
        });
        save_status(&config.paths.state_dir, &status);
        outcome.map(|(r, _)| r)
    }

    async fn try_sync(&self) -> Result<(SyncResult, Option<u16>), Failure> {
        let pool = self.pool.clone();
        if blocking(move || pool.ensure_layout()).await? {
            // With no `current` left, the held version is none: everything is fetched again.
            tracing::warn!(workspace = %self.ws, pool = %self.pool.root().display(), "pool directory was missing or incomplete; recreated it and syncing in full");
        }
        let client = self.shared.client();
        let held = self.held_version().await?;
        let fetched = client.manifest(&self.ws, held.as_ref()).await?;
        let incoming = match fetched {
            ManifestFetch::NotModified => return Ok((SyncResult::NotModified, Some(304))),
            ManifestFetch::Manifest(m) => *m,
        };
        // Loaded only now that something came: a delta is checked against it below, so a
        // generation published in between (a repair) cannot be mixed up with `held`.
        let pool = self.pool.clone();
        let current = blocking(move || pool.current()).await?;
        let bad = |m: String| Failure {
            kind: ErrorKind::BadResponse,
            message: m,
            http_status: Some(200),
            reached: true,
        };
        // The epoch names a directory of the pool: anything but a UUID is refused before
        // it can name a path (`../../x`).
        if !mop_cards::is_epoch(&incoming.epoch) {
            return Err(bad(format!(
                "manifest refused: its epoch {:?} is not a UUID",
                incoming.epoch.chars().take(80).collect::<String>()
            )));
        }
        for e in &incoming.cards {
            e.validate()
                .map_err(|err| bad(format!("manifest entry refused: {err}")))?;
        }
        let mut full = match (incoming.since, &current) {
            (None, _) => incoming,
            (Some(since), Some(cur))
                if cur.manifest.epoch == incoming.epoch && cur.manifest.revision == since =>
            {
                apply_delta(&cur.manifest, incoming)
            }
            (Some(since), _) => {
                return Err(bad(format!(
                    "delta from revision {since} does not apply to the held version {}",
                    held.map_or_else(|| "(none)".into(), |v| v.to_string())
                )));
            }
        };
        full.cards.sort_by_key(|c| c.summary.id);
        if let Some(w) = full
            .cards
            .windows(2)
            .find(|w| w[0].summary.id == w[1].summary.id)
        {
            return Err(bad(format!(
                "manifest lists card {} twice",
                w[0].summary.id
            )));
        }

        if let Some(cur) = &current {
            if cur.manifest.epoch == full.epoch {
                if full.revision < cur.manifest.revision {
                    return Err(Failure {
                        kind: ErrorKind::Rollback,
                        message: format!(
                            "refused revision {} of epoch {}: revision {} is already held (rollback)",
                            full.revision, full.epoch, cur.manifest.revision
                        ),
                        http_status: Some(200),
                        reached: true,
                    });
                }
                if full.revision == cur.manifest.revision {
                    return Ok((SyncResult::NotModified, Some(200)));
                }
            } else {
                let warning = format!(
                    "server database epoch changed from {} to {} at {}: the server was restored or rebuilt, and its cards replaced the pool's",
                    cur.manifest.epoch,
                    full.epoch,
                    Timestamp::now()
                );
                tracing::warn!(workspace = %self.ws, old = %cur.manifest.epoch, new = %full.epoch, "new server epoch accepted");
                self.update(|s| s.epoch_warning = Some(warning));
            }
        }

        // Objects: each missing one fetched once, verified while it streams.
        let mut seen = BTreeSet::new();
        let missing: Vec<(String, u64)> = full
            .cards
            .iter()
            .filter(|e| seen.insert(e.sha256.clone()) && !self.pool.has_object(&e.sha256, e.size))
            .map(|e| (e.sha256.clone(), e.size))
            .collect();
        let need: u64 = missing.iter().map(|(_, s)| *s).sum();
        let config = self.shared.config();
        let used = self.shared.pool_usage();
        if used + need > config.pool.max_bytes {
            let msg = format!(
                "pool quota: syncing needs {} more bytes but the pools already use {} of pool.max_bytes = {}",
                need, used, config.pool.max_bytes
            );
            tracing::error!(workspace = %self.ws, need, used, max = config.pool.max_bytes, "{msg}");
            return Err(Failure {
                kind: ErrorKind::Quota,
                message: msg,
                http_status: Some(200),
                reached: true,
            });
        }
        let received = client.fetch_objects(&self.ws, &self.pool, &missing).await?;
        self.update(|s| {
            s.stats.objects_fetched += missing.len() as u64;
            s.stats.object_bytes += received;
        });

        let pool = self.pool.clone();
        let pins = self.shared.pinned(&self.ws);
        let manifest = full;
        let (name, cards, usage) = blocking(move || {
            let name = pool.build_generation(&manifest)?;
            pool.publish(&name)?;
            pool.collect(&pins)?;
            Ok((name, manifest.cards.len(), pool.usage()))
        })
        .await?;
        tracing::info!(workspace = %self.ws, generation = %name, cards, objects = missing.len(), bytes = received, "published a new generation");
        let _ = self.shared.published.send((self.ws.clone(), name.clone()));
        self.update(|s| {
            let (epoch, rev) = name
                .rsplit_once('-')
                .map(|(e, r)| (e.to_owned(), r))
                .unwrap_or_default();
            s.epoch = Some(epoch);
            s.revision = rev.split('~').next().and_then(|r| r.parse().ok());
            s.generation = Some(name.clone());
            s.cards = cards;
            s.pool_bytes = usage;
        });
        Ok((SyncResult::Modified, Some(200)))
    }

    /// Re-hashes the pool; with a client, fetches what is missing or bad again and
    /// publishes a rebuilt generation (new files, new links, one rename).
    pub async fn verify(&self, repair: bool) -> Result<(VerifyReport, Option<String>), Failure> {
        let pool = self.pool.clone();
        let pins = self.shared.pinned(&self.ws);
        let report = blocking(move || pool.verify(&pins)).await?;
        if !report.bad_objects.is_empty() {
            self.update(|s| s.stats.objects_quarantined += report.bad_objects.len() as u64);
        }
        if report.is_clean() || !repair {
            return Ok((report, None));
        }
        let pool = self.pool.clone();
        let Some(current) = blocking(move || pool.current()).await? else {
            return Ok((report, None));
        };
        let missing: Vec<(String, u64)> = {
            let mut seen = BTreeSet::new();
            current
                .manifest
                .cards
                .iter()
                .filter(|e| {
                    seen.insert(e.sha256.clone()) && !self.pool.has_object(&e.sha256, e.size)
                })
                .map(|e| (e.sha256.clone(), e.size))
                .collect()
        };
        let client = self.shared.client();
        client.fetch_objects(&self.ws, &self.pool, &missing).await?;
        let pool = self.pool.clone();
        let pins = self.shared.pinned(&self.ws);
        let name = blocking(move || {
            let name = pool.build_generation(&current.manifest)?;
            pool.publish(&name)?;
            pool.collect(&pins)?;
            Ok(name)
        })
        .await?;
        tracing::info!(workspace = %self.ws, generation = %name, refetched = missing.len(), "pool repaired");
        self.refresh_current().await;
        Ok((report, Some(name)))
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
    if syncer
        .status
        .lock()
        .map(|s| s.generation.is_some())
        .unwrap_or(false)
    {
        let _ = ready.send(true);
    }
    let mut waiting: Vec<Trigger> = Vec::new();
    loop {
        let result = syncer.sync_once().await;
        let _ = ready.send(true);
        for t in waiting.drain(..) {
            let _ = t.send(result.clone());
        }
        let failures = syncer
            .status
            .lock()
            .map(|s| s.consecutive_failures)
            .unwrap_or(0);
        let delay = next_delay(&syncer.shared.config(), &result, failures);
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
