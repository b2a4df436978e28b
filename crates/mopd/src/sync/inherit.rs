//! Workspaces that inherit others (the server's `[inheritance]`, which each manifest answer
//! names in its `Mop-Inherits` header): each inherited workspace has a pool of its own,
//! synced with its own ETag, and a task of the inheriting workspace is served from a
//! generation composed of both ([`mop_cards::compose`]), so that selection, ranking and
//! retrieve's statistics run over the combined set.
//!
//! An inherited pool that is not configured itself has no sync loop: each round of an
//! inheriting workspace polls it first (one 304 when unchanged), then its own manifest,
//! then recomposes its current generation if an inherited one moved. Locks are taken in
//! one direction only, from an inheriting workspace to the pools it inherits, and an
//! inherited-only pool follows nothing itself, so no two rounds wait on each other.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use mop_proto::sync::Manifest;
use parking_lot::Mutex;

use super::{Failure, Syncer, blocking, local};
use crate::pool::Pool;
use crate::pool::earlier::Earlier;
use crate::pool::generations::Generation;
use crate::state::State;

/// Every workspace's syncer on this host: the configured ones and the inherited pools.
#[derive(Default)]
pub struct Registry {
    syncers: Mutex<BTreeMap<String, Syncer>>,
}

impl Registry {
    /// The syncer of `ws`, if it has one.
    pub fn get(&self, ws: &str) -> Option<Syncer> {
        self.syncers.lock().get(ws).cloned()
    }

    /// Registers a workspace's syncer (replacing an earlier one).
    pub fn insert(&self, syncer: Syncer) {
        self.syncers.lock().insert(syncer.ws.clone(), syncer);
    }

    /// The syncers of inherited pools that are not among `configured` (those have no
    /// loop of their own; the scrub still re-hashes them).
    pub fn inherited_only(&self, configured: &[String]) -> Vec<Syncer> {
        self.syncers
            .lock()
            .values()
            .filter(|s| !configured.contains(&s.ws))
            .cloned()
            .collect()
    }

    /// The syncers of the workspaces that inherit `ws`.
    pub fn inheriting(&self, ws: &str) -> Vec<Syncer> {
        self.syncers
            .lock()
            .values()
            .filter(|s| s.status.lock().inherits.iter().any(|w| w == ws))
            .cloned()
            .collect()
    }

    /// Forgets a workspace's syncer.
    pub fn remove(&self, ws: &str) {
        self.syncers.lock().remove(ws);
    }

    /// The syncer of `ws`, opening its pool (an inherited one) when it has none yet.
    pub fn get_or_open(&self, state: &Arc<State>, ws: &str) -> Result<Syncer, Failure> {
        if let Some(s) = self.get(ws) {
            return Ok(s);
        }
        let syncer = Syncer::open(state, ws).map_err(|e| {
            local(format!(
                "cannot open the pool of inherited workspace {ws}: {e}"
            ))
        })?;
        let mut map = self.syncers.lock();
        Ok(map.entry(ws.to_owned()).or_insert(syncer).clone())
    }
}

impl Syncer {
    /// The syncer of `ws` with its pool opened (leftovers of an interrupted run collected)
    /// and its last status loaded and registered.
    pub fn open(state: &Arc<State>, ws: &str) -> anyhow::Result<Syncer> {
        use anyhow::Context;
        let paths = state.paths();
        let pool = Pool::open(paths, ws)
            .with_context(|| format!("cannot open the pool of workspace {ws}"))?;
        if let Err(e) = pool.collect(&state.pinned(ws), None, None) {
            tracing::warn!(workspace = ws, error = %e, "cannot collect leftovers");
        }
        let status = Arc::new(Mutex::new(super::record::load(paths, ws)));
        state.set_status(ws, Some(status.clone()));
        Ok(Syncer::new(ws.to_owned(), pool, status, state.clone()))
    }

    /// One round of a configured workspace: the inherited pools it knows of, its own
    /// manifest, the pools its server newly named, and a new composition if an inherited
    /// generation moved. The result is its own poll's.
    pub async fn sync_round(
        &self,
        publishing: &tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<mop_proto::status::SyncResult, Failure> {
        let known = self.status.lock().inherits.clone();
        self.poll_inherited(&known).await;
        let result = self.sync_once(publishing).await;
        let inherits = self.status.lock().inherits.clone();
        if inherits != known {
            let new: Vec<String> = inherits
                .iter()
                .filter(|w| !known.contains(w))
                .cloned()
                .collect();
            self.poll_inherited(&new).await;
        }
        if let Err(f) = self.recompose_if_moved(&inherits).await {
            tracing::warn!(workspace = %self.ws, error = %f.message, "cannot compose the inherited workspaces' cards; serving the last good generation");
        }
        result
    }

    /// Polls each inherited pool that has no sync loop of its own (a configured workspace
    /// keeps itself fresh). A failure stays in that pool's status; this workspace's tasks
    /// keep its last good generation.
    async fn poll_inherited(&self, inherits: &[String]) {
        let configured = self.state.config().sync.workspaces.clone();
        for ws in inherits {
            if *ws == self.ws || configured.contains(ws) {
                continue;
            }
            let syncer = match self.state.syncers.get_or_open(&self.state, ws) {
                Ok(s) => s,
                Err(f) => {
                    tracing::warn!(workspace = %self.ws, inherited = %ws, error = %f.message, "cannot open an inherited pool");
                    continue;
                }
            };
            {
                let mut s = syncer.status.lock();
                if !s.inherited_by.contains(&self.ws) {
                    s.inherited_by.push(self.ws.clone());
                    s.inherited_by.sort();
                }
            }
            let publishing = syncer.publishing.lock().await;
            let _ = syncer.sync_once(&publishing).await;
        }
    }

    /// `own` with the cards of `inherits` (each pool's current generation; a pool with none
    /// yet is left out until it has one), their objects linked into this pool. `own`
    /// itself when this workspace inherits nothing.
    pub(super) async fn composed(
        &self,
        own: Manifest,
        inherits: &[String],
    ) -> Result<Manifest, Failure> {
        if inherits.is_empty() {
            return Ok(own);
        }
        let mut parts: Vec<(String, Pool, Arc<Generation>)> = Vec::new();
        for ws in inherits.iter().filter(|w| **w != self.ws) {
            let syncer = self.state.syncers.get_or_open(&self.state, ws)?;
            if let Some(g) = syncer.current().await? {
                parts.push((ws.clone(), syncer.pool.clone(), g));
            }
        }
        let target = self.pool.clone();
        blocking(move || {
            let named: Vec<(&str, &Manifest)> = parts
                .iter()
                .map(|(w, _, g)| (w.as_str(), &g.manifest))
                .collect();
            let mut composed = mop_cards::compose(own, &named).map_err(|e| {
                crate::pool::PoolError::BadGeneration {
                    name: "(composition)".into(),
                    problem: e.to_string(),
                }
            })?;
            for (ws, pool, _) in &parts {
                let entries: Vec<&mop_cards::ManifestEntry> = composed
                    .cards
                    .iter()
                    .filter(|e| e.inherited_from.as_deref() == Some(ws.as_str()))
                    .collect();
                let damaged = target.import_objects(pool, &entries)?;
                if damaged.is_empty() {
                    continue;
                }
                // Left out rather than failing the composition: the workspace's own changes
                // (a curator disabling a card) must still reach its tasks meanwhile.
                tracing::warn!(inherited = %ws, objects = damaged.len(), "objects of an inherited pool are damaged; their cards are left out until its scrub repairs them");
                composed.cards.retain(|e| {
                    e.inherited_from.as_deref() != Some(ws.as_str())
                        || !damaged.contains(&e.sha256)
                });
                if let Some(v) = composed.inherited.iter_mut().find(|v| v.workspace == *ws) {
                    v.cards -= damaged.len().min(v.cards);
                }
            }
            Ok(composed)
        })
        .await
    }

    /// Composes the current generation's own cards with the inherited pools as they are
    /// now, whether or not their versions moved (one of them was repaired).
    pub async fn recompose(&self) -> Result<(), Failure> {
        let _publishing = self.publishing.lock().await;
        let inherits = self.status.lock().inherits.clone();
        self.compose_again(&inherits, true).await
    }

    /// Builds and publishes a new composition of the current generation's own cards when
    /// an inherited pool's current version is not the one it was composed with (or the
    /// set of inherited workspaces changed).
    async fn recompose_if_moved(&self, inherits: &[String]) -> Result<(), Failure> {
        self.compose_again(inherits, false).await
    }

    /// [`Syncer::recompose_if_moved`], or (`always`) regardless of versions. The caller
    /// holds this workspace's publishing lock.
    async fn compose_again(&self, inherits: &[String], always: bool) -> Result<(), Failure> {
        let mut now = Vec::new();
        for ws in inherits.iter().filter(|w| **w != self.ws) {
            if let Some(v) = self.state.syncers.get(ws).and_then(|s| {
                let st = s.status.lock();
                Some((ws.clone(), st.epoch.clone()?, st.revision?))
            }) {
                now.push(v);
            }
        }
        let versions = |inherited: &[mop_cards::InheritedVersion]| -> Vec<(String, String, u64)> {
            inherited
                .iter()
                .map(|i| (i.workspace.clone(), i.epoch.clone(), i.revision))
                .collect()
        };
        // What the status says the current generation was composed with: when that is
        // what the inherited pools hold now, nothing is read (every round of every
        // workspace asks). The manifest decides otherwise.
        if !always && versions(&self.status.lock().inherited) == now {
            return Ok(());
        }
        let Some(current) = self.current().await? else {
            return Ok(());
        };
        let held = versions(&current.manifest.inherited);
        if held == now && !always {
            return Ok(());
        }
        let own = own_part(&current.manifest).into_owned();
        let composed = self.composed(own, inherits).await?;
        let inherited = composed.inherited.clone();
        let (epoch, revision, cards) = (
            composed.epoch.clone(),
            composed.revision,
            composed.cards.len(),
        );
        // After a repair (`always`) the index is built again from the repaired objects.
        let earlier =
            (!always).then(|| Earlier::between(&current.name, &current.manifest, &composed));
        drop(current);
        let built = self
            .build_and_publish(&*self.state.client(), composed, &[], earlier)
            .await?;
        tracing::info!(workspace = %self.ws, generation = %built.name, inherited = ?inherited.iter().map(|i| format!("{}@{}", i.workspace, i.revision)).collect::<Vec<_>>(), "composed the inherited workspaces' cards into a new generation");
        self.update(|s| {
            super::record_generation(s, &built.name, epoch, revision, cards);
            s.inherited = inherited;
            s.pool_bytes = built.usage;
        });
        Ok(())
    }
}

/// The own part of a held manifest: itself when it is not composed (no copy).
pub(super) fn own_part(m: &Manifest) -> Cow<'_, Manifest> {
    if m.is_composed() {
        Cow::Owned(m.own())
    } else {
        Cow::Borrowed(m)
    }
}
