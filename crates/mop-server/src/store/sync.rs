//! What daemons read: manifests (full and delta), objects, and the per-workspace revisions
//! the server keeps in memory to answer `If-None-Match` without touching the database.
//! Also the batched publication of counter-only changes.

use super::db::{OptionalExtension, Tx, params};
use jiff::Timestamp;
use mop_cards::{CardId, CardSummary, Manifest, ManifestEntry, card_path};

use super::{Result, Store, StoreError, bump, db};

/// Full or delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestKind {
    /// Every live card.
    Full,
    /// Changes after the given revision.
    Delta(u64),
}

/// A manifest and the revision it describes (read in the same snapshot).
#[derive(Debug, Clone)]
pub struct BuiltManifest {
    /// The manifest.
    pub manifest: Manifest,
}

impl Store {
    /// Every workspace with its revision and delta floor.
    pub fn revisions(&self) -> Result<Vec<(String, u64, u64)>> {
        self.read(|tx| {
            let e = self.err("read revisions");
            let mut stmt = tx
                .prepare("SELECT name, revision, history_floor FROM workspaces")
                .map_err(&e)?;
            stmt.query_map(params![], |r| {
                Ok((r.get(0)?, r.get::<i64>(1)? as u64, r.get::<i64>(2)? as u64))
            })
            .map_err(&e)?
            .collect::<db::Result<Vec<_>>>()
            .map_err(&e)
        })
    }

    /// Builds a manifest in one snapshot. A delta is answered when [`Store::delta`] gives
    /// one (with no size limit); otherwise the full manifest is returned and the caller
    /// sees `since: None`.
    pub fn manifest(&self, ws: &str, kind: ManifestKind) -> Result<BuiltManifest> {
        if let ManifestKind::Delta(since) = kind
            && let Some(delta) = self.delta(ws, since, None)?
        {
            return Ok(delta);
        }
        self.read(|tx| {
            let e = self.err("build manifest");
            let (revision, _) = workspace_revision(tx, ws).map_err(&e)??;
            Ok(BuiltManifest {
                manifest: Manifest {
                    epoch: self.epoch.clone(),
                    revision,
                    generated_at: Timestamp::now(),
                    since: None,
                    cards: entries(tx, ws, None).map_err(&e)?.0,
                    removed: Vec::new(),
                    inherited: Vec::new(),
                },
            })
        })
    }

    /// The changes since revision `since`, in one snapshot; `None` when `since` is outside
    /// the kept history (below the floor, or ahead of the workspace), or when more than
    /// `max_changed` cards changed: a caller with a cached full manifest sends that rather
    /// than a large delta built per request. Counting stops at the limit (an index range).
    pub fn delta(
        &self,
        ws: &str,
        since: u64,
        max_changed: Option<usize>,
    ) -> Result<Option<BuiltManifest>> {
        self.read(|tx| {
            let e = self.err("build delta manifest");
            let (revision, floor) = workspace_revision(tx, ws).map_err(&e)??;
            if since < floor || since > revision {
                return Ok(None);
            }
            if let Some(max) = max_changed {
                let changed: i64 = tx
                    .query_row(
                        "SELECT count(*) FROM
                           (SELECT 1 FROM cards WHERE workspace = ?1 AND rev > ?2 LIMIT ?3) AS changed",
                        params![ws, since as i64, max as i64 + 1],
                        |r| r.get(0),
                    )
                    .map_err(&e)?;
                if changed as usize > max {
                    return Ok(None);
                }
            }
            let (cards, mut removed) = entries(tx, ws, Some(since)).map_err(&e)?;
            let mut stmt = tx
                .prepare("SELECT id FROM tombstones WHERE workspace = ?1 AND rev > ?2")
                .map_err(&e)?;
            let gone = stmt
                .query_map(params![ws, since as i64], |r| r.get::<String>(0))
                .map_err(&e)?;
            for id in gone {
                if let Ok(id) = CardId::parse(&id.map_err(&e)?) {
                    removed.push(id);
                }
            }
            removed.sort();
            removed.dedup();
            Ok(Some(BuiltManifest {
                manifest: Manifest {
                    epoch: self.epoch.clone(),
                    revision,
                    generated_at: Timestamp::now(),
                    since: Some(since),
                    cards,
                    removed,
                    inherited: Vec::new(),
                },
            }))
        })
    }

    /// One object's bytes, if the workspace has it.
    pub fn object(&self, ws: &str, sha: &str) -> Result<Option<Vec<u8>>> {
        self.read(|tx| {
            tx.query_row(
                "SELECT body FROM objects WHERE workspace = ?1 AND sha256 = ?2",
                params![ws, sha],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err("read object"))
        })
    }

    /// Several objects in one snapshot; `None` for each one the workspace lacks.
    pub fn objects(&self, ws: &str, shas: &[String]) -> Result<Vec<(String, Option<Vec<u8>>)>> {
        self.read(|tx| {
            let e = self.err("read objects");
            let mut stmt = tx
                .prepare_cached("SELECT body FROM objects WHERE workspace = ?1 AND sha256 = ?2")
                .map_err(&e)?;
            shas.iter()
                .map(|sha| {
                    let body = stmt
                        .query_row(params![ws, sha], |r| r.get(0))
                        .optional()
                        .map_err(&e)?;
                    Ok((sha.clone(), body))
                })
                .collect()
        })
    }

    /// Publishes pending counter changes: for every workspace with reinforcements waiting,
    /// one revision carries all of them. Returns the workspaces published and their new
    /// revisions.
    pub fn publish_counters(&self, only: Option<&str>) -> Result<Vec<(String, u64)>> {
        self.write(|tx| {
            let e = self.err("publish counters");
            let dirty: Vec<String> = {
                let mut stmt = tx
                    .prepare("SELECT name FROM workspaces WHERE counters_dirty = 1 AND (CAST(?1 AS TEXT) IS NULL OR name = ?1)")
                    .map_err(&e)?;
                stmt.query_map(params![only], |r| r.get(0))
                    .map_err(&e)?
                    .collect::<db::Result<_>>()
                    .map_err(&e)?
            };
            let mut out = Vec::new();
            for ws in dirty {
                let rev = bump(tx, &ws).map_err(&e)?;
                let n = tx
                    .execute(
                        "UPDATE cards SET occurrence = occurrence + pending_occurrence,
                            last_seen = CASE WHEN pending_last_seen IS NOT NULL
                                              AND (last_seen IS NULL OR pending_last_seen > last_seen)
                                             THEN pending_last_seen ELSE last_seen END,
                            pending_occurrence = 0, pending_last_seen = NULL,
                            rev = CASE WHEN live = 1 THEN ?2 ELSE rev END
                         WHERE workspace = ?1 AND (pending_occurrence > 0 OR pending_last_seen IS NOT NULL)",
                        params![ws, rev as i64],
                    )
                    .map_err(&e)?;
                tx.execute("UPDATE workspaces SET counters_dirty = 0 WHERE name = ?1", params![ws])
                    .map_err(&e)?;
                super::cards::audit(
                    tx,
                    &ws,
                    None,
                    rev,
                    "server:counters",
                    "publish_counters",
                    None,
                    None,
                    None,
                    Some(&format!("cards={n}")),
                )
                .map_err(&e)?;
                out.push((ws, rev));
            }
            Ok(out)
        })
    }
}

/// Live entries (full manifest), or every card changed after `since` (delta), whose
/// non-live ones come back as removed ids.
fn entries(
    tx: &Tx<'_>,
    ws: &str,
    since: Option<u64>,
) -> db::Result<(Vec<ManifestEntry>, Vec<CardId>)> {
    macro_rules! select {
        ($where:literal) => {
            concat!(
                "SELECT summary, sha256, size, occurrence, last_seen, live FROM cards ",
                $where
            )
        };
    }
    let read = |r: &db::Row<'_>| {
        Ok((
            r.get::<String>(0)?,
            r.get::<String>(1)?,
            r.get::<i64>(2)?,
            r.get::<i64>(3)?,
            r.get::<Option<String>>(4)?,
            r.get::<bool>(5)?,
        ))
    };
    let rows = match since {
        None => tx.query_map(
            select!("WHERE workspace = ?1 AND live = 1 ORDER BY id"),
            params![ws],
            read,
        )?,
        Some(since) => tx.query_map(
            select!("WHERE workspace = ?1 AND rev > ?2 ORDER BY id"),
            params![ws, since as i64],
            read,
        )?,
    };
    let mut cards = Vec::new();
    let mut removed = Vec::new();
    for row in rows {
        let (summary, sha256, size, occurrence, last_seen, live) = row;
        let summary: CardSummary =
            serde_json::from_str(&summary).map_err(|e| super::db::DbError::decode(0, e))?;
        if !live {
            removed.push(summary.id);
            continue;
        }
        cards.push(ManifestEntry {
            path: card_path(summary.card_type, &summary.id),
            summary,
            sha256,
            size: size as u64,
            occurrence: occurrence as u64,
            last_seen: last_seen.and_then(|t| t.parse().ok()),
            inherited_from: None,
        });
    }
    Ok((cards, removed))
}

/// A workspace's revision and history floor; `Err(NotFound)` inside when it is unknown.
fn workspace_revision(tx: &Tx<'_>, ws: &str) -> db::Result<Result<(u64, u64)>> {
    Ok(tx
        .query_row(
            "SELECT revision, history_floor FROM workspaces WHERE name = ?1",
            params![ws],
            |r| Ok((r.get::<i64>(0)? as u64, r.get::<i64>(1)? as u64)),
        )
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("workspace {ws} not found"))))
}
