//! Card rows and their changes: import, insert, rewrite (text, state or archive), counters
//! moved by a merge, history, hard delete, purge and garbage collection, export.
//!
//! Each change writes the card, bumps the workspace revision when the manifest changes, and
//! adds an audit row, in the caller's transaction: a failure anywhere rolls all of it back.
//! Which change a curator's action makes is decided in `service::curation`.

use std::collections::HashMap;

use super::db::{OptionalExtension, Tx, params};
use mop_cards::{Card, CardId, CardSummary, CardType, parse_card, sha256_hex};
use mop_proto::curation::card_etag;
pub use mop_proto::curation::{CardChange, HistoryRow};
use mop_proto::time::Stamp;
use serde::Serialize;

use super::{Result, Store, StoreError, bump, db, ensure_workspace, now, stamp};

/// A file an import did not take, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejected {
    /// Path relative to the import directory.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    /// New cards.
    pub created: usize,
    /// Cards whose bytes changed.
    pub updated: usize,
    /// Cards already present with the same bytes.
    pub unchanged: usize,
    /// Files not imported.
    pub rejected: Vec<Rejected>,
    /// Workspace revision after the import.
    pub revision: u64,
}

/// A card row, as mutations need it.
pub(crate) struct Row {
    pub summary: CardSummary,
    pub sha256: String,
    pub occurrence: u64,
    pub last_seen: Option<String>,
    pub archived_at: Option<String>,
}

pub(crate) fn load_row(tx: &Tx<'_>, ws: &str, id: &CardId) -> db::Result<Option<Row>> {
    tx.query_row(
        "SELECT summary, sha256, occurrence, last_seen, archived_at FROM cards WHERE workspace = ?1 AND id = ?2",
        params![ws, id.to_string()],
        |r| {
            let summary: String = r.get(0)?;
            Ok(Row {
                summary: serde_json::from_str(&summary).map_err(|e| {
                    super::db::DbError::decode(0, e)
                })?,
                sha256: r.get(1)?,
                occurrence: r.get::<i64>(2)? as u64,
                last_seen: r.get(3)?,
                archived_at: r.get(4)?,
            })
        },
    )
    .optional()
}

pub(crate) fn load_object(tx: &Tx<'_>, ws: &str, sha: &str) -> db::Result<Vec<u8>> {
    tx.query_row(
        "SELECT body FROM objects WHERE workspace = ?1 AND sha256 = ?2",
        params![ws, sha],
        |r| r.get(0),
    )
}

/// Case- and whitespace-folded title: two stores titled "Lock  wait" and "lock wait" are
/// the same card for dedup.
pub(crate) fn title_key(title: &str) -> String {
    title
        .split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Server-side facts a card row carries besides its text.
pub(crate) struct Kept<'a> {
    /// Server counter.
    pub occurrence: u64,
    /// Server counter.
    pub last_seen: Option<&'a str>,
    /// Set while archived.
    pub archived_at: Option<&'a str>,
}

/// Writes a card row and its object; releases the previous object if nothing else uses it.
pub(crate) fn write_card(
    tx: &Tx<'_>,
    ws: &str,
    card: &Card,
    raw: &[u8],
    rev: u64,
    kept: Kept<'_>,
) -> db::Result<String> {
    let Kept {
        occurrence,
        last_seen,
        archived_at,
    } = kept;
    let sha = sha256_hex(raw);
    tx.execute(
        "INSERT INTO objects (workspace, sha256, body) VALUES (?1, ?2, ?3)
         ON CONFLICT (workspace, sha256) DO UPDATE SET released_at = NULL",
        params![ws, sha, raw],
    )?;
    let id = card.summary.id.to_string();
    let previous: Option<String> = tx
        .query_row(
            "SELECT sha256 FROM cards WHERE workspace = ?1 AND id = ?2",
            params![ws, id],
            |r| r.get(0),
        )
        .optional()?;
    let live = card.summary.is_live() && archived_at.is_none();
    // What the review queue holds (`CardInfo::awaits_review`), kept per row for its index.
    let awaiting = live && card.summary.trust == mop_cards::Trust::Unverified;
    tx.execute(
        "INSERT INTO cards (workspace, id, card_type, title_key, summary, sha256, size, occurrence,
                            last_seen, live, archived_at, rev, created_at, awaiting, superseded_by,
                            made_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, COALESCE(?16, ?13))
         ON CONFLICT (workspace, id) DO UPDATE SET
            card_type = excluded.card_type, title_key = excluded.title_key,
            summary = excluded.summary, sha256 = excluded.sha256, size = excluded.size,
            occurrence = excluded.occurrence, last_seen = excluded.last_seen,
            live = excluded.live, archived_at = excluded.archived_at, rev = excluded.rev,
            awaiting = excluded.awaiting, superseded_by = excluded.superseded_by,
            made_at = COALESCE(?16, cards.made_at)",
        params![
            ws,
            id,
            card.summary.card_type.as_str(),
            title_key(&card.summary.title),
            serde_json::to_string(&card.summary).expect("summaries serialize"),
            sha,
            raw.len() as i64,
            occurrence as i64,
            last_seen,
            live,
            archived_at,
            rev as i64,
            now(),
            awaiting,
            card.summary.superseded_by.map(|b| b.to_string()),
            card.summary.created_at.map(|t| Stamp(t).to_string()),
        ],
    )?;
    if let Some(prev) = previous
        && prev != sha
    {
        release_if_unused(tx, ws, &prev)?;
    }
    super::intake::record(tx, ws, card, raw, &sha)?;
    Ok(sha)
}

/// Marks an object released when no card uses it, starting its retention window.
pub(crate) fn release_if_unused(tx: &Tx<'_>, ws: &str, sha: &str) -> db::Result<()> {
    tx.execute(
        "UPDATE objects SET released_at = ?3
         WHERE workspace = ?1 AND sha256 = ?2 AND released_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM cards WHERE workspace = ?1 AND sha256 = ?2)",
        params![ws, sha, now()],
    )?;
    Ok(())
}

/// One audit row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn audit(
    tx: &Tx<'_>,
    ws: &str,
    card_id: Option<&CardId>,
    revision: u64,
    actor: &str,
    action: &str,
    before: Option<&str>,
    after: Option<&str>,
    content: Option<&[u8]>,
    detail: Option<&str>,
) -> db::Result<()> {
    tx.execute(
        "INSERT INTO history (workspace, card_id, revision, at, actor, action, sha256_before,
                              sha256_after, content, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            ws,
            card_id.map(ToString::to_string),
            revision as i64,
            now(),
            actor,
            action,
            before,
            after,
            content.map(|c| String::from_utf8_lossy(c).into_owned()),
            detail,
        ],
    )?;
    Ok(())
}

pub(super) fn current_revision(tx: &Tx<'_>, ws: &str) -> db::Result<u64> {
    tx.query_row(
        "SELECT revision FROM workspaces WHERE name = ?1",
        params![ws],
        |r| r.get::<i64>(0).map(|v| v as u64),
    )
    .optional()
    .map(Option::unwrap_or_default)
}

/// A change's answer; the version tag follows from the hash and the archive state.
pub(crate) fn change(
    id: CardId,
    revision: u64,
    sha256: Option<String>,
    archived: bool,
    changed: bool,
) -> CardChange {
    CardChange {
        id,
        revision,
        etag: sha256.as_deref().map(|sha| card_etag(sha, archived)),
        sha256,
        changed,
    }
}

/// What an `If-Match` header asks: any version (`*`), or one of the listed tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expect<'a> {
    /// No condition.
    #[default]
    Any,
    /// The header's value: `*` or a comma-separated list of entity tags.
    IfMatch(&'a str),
}

impl Expect<'_> {
    /// Refuses the change when the card is no longer at an expected version.
    pub(crate) fn check(self, id: &CardId, row: &Row) -> Result<()> {
        let Expect::IfMatch(header) = self else {
            return Ok(());
        };
        let current = card_etag(&row.sha256, row.archived_at.is_some());
        let matches = header
            .split(',')
            .map(str::trim)
            .any(|tag| tag == "*" || tag == current);
        if matches {
            Ok(())
        } else {
            Err(StoreError::Precondition { id: *id, current })
        }
    }
}

fn not_found(ws: &str, id: &CardId) -> StoreError {
    StoreError::NotFound(format!("card {id} not found in workspace {ws}"))
}

/// Screens an admin write of card `id` (its file `raw`): refused when it carries a
/// credential, unless the curator allowed this card deliberately; then the audit detail
/// names the kinds allowed (never the values).
pub(crate) fn screen_admin(raw: &[u8], id: &CardId, allow: &[CardId]) -> Result<Option<String>> {
    let findings = super::intake::screen_card_file(raw);
    if findings.is_empty() {
        return Ok(None);
    }
    if allow.contains(id) {
        let mut kinds: Vec<&str> = findings.iter().map(|f| f.kind.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        return Ok(Some(format!(
            "credentials allowed by the curator: {} ({} finding(s))",
            kinds.join(", "),
            findings.len()
        )));
    }
    Err(StoreError::Credential {
        what: format!("card {id}"),
        findings,
    })
}

impl Store {
    /// Imports card files (paths relative to the import directory). Each bad file is
    /// reported and skipped; the rest go in together in one transaction and one revision.
    /// A card that carries a credential is reported and skipped, unless its id is in
    /// `allow_credentials` (a curator's deliberate override, audited).
    pub fn import(
        &self,
        ws: &str,
        files: Vec<(String, Vec<u8>)>,
        actor: &str,
        allow_credentials: &[CardId],
        composed_with: &[String],
    ) -> Result<ImportReport> {
        let mut report = ImportReport::default();
        let mut valid: Vec<(Card, Vec<u8>, Option<String>)> = Vec::new();
        let mut seen: HashMap<CardId, String> = HashMap::new();
        for (path, bytes) in files {
            let card = match parse_card(&bytes) {
                Ok(c) => c,
                Err(e) => {
                    report.rejected.push(Rejected {
                        path,
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            let expected = card.path();
            if path != expected {
                report.rejected.push(Rejected {
                    reason: format!("its type and id place it at {expected}; move the file there"),
                    path,
                });
                continue;
            }
            if let Some(first) = seen.get(&card.summary.id) {
                report.rejected.push(Rejected {
                    reason: format!("id {} is already used by {first}", card.summary.id),
                    path,
                });
                continue;
            }
            let allowed = match screen_admin(&bytes, &card.summary.id, allow_credentials) {
                Ok(allowed) => allowed,
                Err(e) => {
                    report.rejected.push(Rejected {
                        reason: format!(
                            "{e}; or import it with --allow-credentials {} if it must keep them",
                            card.summary.id
                        ),
                        path,
                    });
                    continue;
                }
            };
            seen.insert(card.summary.id, path);
            valid.push((card, bytes, allowed));
        }
        self.write(|tx| {
            let e = self.err("import");
            ensure_workspace(tx, ws).map_err(&e)?;
            let mut changes = Vec::new();
            for (card, bytes, allowed) in &valid {
                match load_row(tx, ws, &card.summary.id).map_err(&e)? {
                    Some(row) if row.sha256 == sha256_hex(bytes) => report.unchanged += 1,
                    Some(row) => changes.push((card, bytes, allowed, Some(row.sha256))),
                    None => match self.id_held_in(tx, composed_with, &card.summary.id)? {
                        Some(other) => report.rejected.push(Rejected {
                            path: seen[&card.summary.id].clone(),
                            reason: id_taken(&card.summary.id, &other).to_string(),
                        }),
                        None => changes.push((card, bytes, allowed, None)),
                    },
                }
            }
            report.revision = if changes.is_empty() {
                current_revision(tx, ws).map_err(&e)?
            } else {
                bump(tx, ws).map_err(&e)?
            };
            for (card, bytes, allowed, before) in changes {
                let last_seen = card.counters.last_seen.map(stamp);
                let sha = write_card(
                    tx,
                    ws,
                    card,
                    bytes,
                    report.revision,
                    Kept {
                        occurrence: card.counters.occurrence,
                        last_seen: last_seen.as_deref(),
                        archived_at: None,
                    },
                )
                .map_err(&e)?;
                let action = if before.is_some() {
                    "import-update"
                } else {
                    "import-create"
                };
                audit(
                    tx,
                    ws,
                    Some(&card.summary.id),
                    report.revision,
                    actor,
                    action,
                    before.as_deref(),
                    Some(&sha),
                    Some(bytes),
                    allowed.as_deref(),
                )
                .map_err(&e)?;
                if before.is_some() {
                    report.updated += 1;
                } else {
                    report.created += 1;
                }
            }
            Ok(())
        })?;
        Ok(report)
    }

    /// Every card's file, at its OKF path, byte for byte as stored. Archived cards are left
    /// out unless asked for.
    pub fn export(
        &self,
        ws: &str,
        include_archived: bool,
    ) -> Result<Vec<crate::transfer::CardFile>> {
        self.read(|tx| {
            let e = self.err("export");
            let mut stmt = tx
                .prepare(
                    "SELECT c.id, c.card_type, o.body FROM cards c
                     JOIN objects o ON o.workspace = c.workspace AND o.sha256 = c.sha256
                     WHERE c.workspace = ?1 AND (?2 OR c.archived_at IS NULL) ORDER BY c.id",
                )
                .map_err(&e)?;
            let rows = stmt
                .query_map(params![ws, include_archived], |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<String>(1)?,
                        r.get::<Vec<u8>>(2)?,
                    ))
                })
                .map_err(&e)?;
            let mut out = Vec::new();
            for row in rows {
                let (id, card_type, body) = row.map_err(&e)?;
                let (Ok(id), Some(t)) = (CardId::parse(&id), CardType::parse(&card_type)) else {
                    return Err(StoreError::Invalid(format!(
                        "stored card {id:?} has an invalid id or type"
                    )));
                };
                out.push((mop_cards::card_path(t, &id), body));
            }
            Ok(out)
        })
    }

    /// The row of card `id`; not found is an error that names the card and workspace.
    pub(crate) fn card_row(&self, tx: &Tx<'_>, ws: &str, id: &CardId) -> Result<Row> {
        self.find_row(tx, ws, id)?.ok_or_else(|| not_found(ws, id))
    }

    /// The row of card `id`, when there is one.
    pub(crate) fn find_row(&self, tx: &Tx<'_>, ws: &str, id: &CardId) -> Result<Option<Row>> {
        load_row(tx, ws, id).map_err(self.err("read card"))
    }

    /// The first of `workspaces` that holds a card `id` (in any state): a card of that id
    /// made here would hide it, or be hidden, in a generation that composes the two.
    pub(crate) fn id_held_in(
        &self,
        tx: &Tx<'_>,
        workspaces: &[String],
        id: &CardId,
    ) -> Result<Option<String>> {
        for ws in workspaces {
            if self.find_row(tx, ws, id)?.is_some() {
                return Ok(Some(ws.clone()));
            }
        }
        Ok(None)
    }

    /// The stored text of a card row.
    pub(crate) fn card_object(&self, tx: &Tx<'_>, ws: &str, row: &Row) -> Result<Vec<u8>> {
        load_object(tx, ws, &row.sha256).map_err(self.err("read card"))
    }

    /// Adds a new card (its text `raw`) with the counters its text carries, and one audit
    /// row `create` with `detail`. A card of the same id already there is a conflict.
    pub(crate) fn insert_card(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        card: &Card,
        raw: &[u8],
        actor: &str,
        (action, detail): (&str, Option<&str>),
    ) -> Result<CardChange> {
        let e = self.err("create card");
        let id = card.summary.id;
        if load_row(tx, ws, &id).map_err(&e)?.is_some() {
            return Err(StoreError::Conflict(format!(
                "card {id} already exists in workspace {ws}; use PUT to update it"
            )));
        }
        let rev = bump(tx, ws).map_err(&e)?;
        let last_seen = card.counters.last_seen.map(stamp);
        let kept = Kept {
            occurrence: card.counters.occurrence,
            last_seen: last_seen.as_deref(),
            archived_at: None,
        };
        let sha = write_card(tx, ws, card, raw, rev, kept).map_err(&e)?;
        audit(
            tx,
            ws,
            Some(&id),
            rev,
            actor,
            action,
            None,
            Some(&sha),
            Some(raw),
            detail,
        )
        .map_err(&e)?;
        Ok(change(id, rev, Some(sha), false, true))
    }

    /// Writes `card` (its text `raw`) over the card's `row`, keeping the server counters,
    /// archived since `archived_at` (or not), with one audit row `(action, detail)`. The
    /// same bytes and archive state change nothing and answer the current revision.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rewrite_card(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        row: &Row,
        card: &Card,
        raw: &[u8],
        archived_at: Option<&str>,
        actor: &str,
        (action, detail): (&str, Option<&str>),
    ) -> Result<CardChange> {
        let e = self.err("change card");
        let id = &card.summary.id;
        if row.sha256 == sha256_hex(raw) && archived_at == row.archived_at.as_deref() {
            let revision = current_revision(tx, ws).map_err(&e)?;
            let archived = row.archived_at.is_some();
            return Ok(change(
                *id,
                revision,
                Some(row.sha256.clone()),
                archived,
                false,
            ));
        }
        let rev = bump(tx, ws).map_err(&e)?;
        let kept = Kept {
            occurrence: row.occurrence,
            last_seen: row.last_seen.as_deref(),
            archived_at,
        };
        let sha = write_card(tx, ws, card, raw, rev, kept).map_err(&e)?;
        audit(
            tx,
            ws,
            Some(id),
            rev,
            actor,
            action,
            Some(&row.sha256),
            Some(&sha),
            Some(raw),
            detail,
        )
        .map_err(&e)?;
        Ok(change(*id, rev, Some(sha), archived_at.is_some(), true))
    }

    /// The text history row `seq` of card `id` kept, if any (`None` inside when the row
    /// kept none or a purge redacted it); `None` when card `id` has no row `seq`.
    pub(crate) fn version_text(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        id: &CardId,
        seq: i64,
    ) -> Result<Option<Option<String>>> {
        tx.query_row(
            "SELECT content, redacted FROM history WHERE workspace = ?1 AND card_id = ?2 AND seq = ?3",
            params![ws, id.to_string(), seq],
            |r| {
                let content: Option<String> = r.get(0)?;
                let redacted: bool = r.get(1)?;
                Ok(content.filter(|_| !redacted))
            },
        )
        .optional()
        .map_err(self.err("read card history"))
    }

    /// Keeps the tombstone of a rejected card's lesson ([`super::intake::bury`]).
    pub(crate) fn keep_tombstone(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        id: &CardId,
        summary: &CardSummary,
        reason: &str,
        actor: &str,
    ) -> Result<()> {
        super::intake::bury(tx, ws, id, summary, reason, actor).map_err(self.err("keep tombstone"))
    }

    /// Moves card `from`'s counters onto `into` at revision `rev` (occurrence added, the
    /// later last-seen kept, counts not yet published carried along), with an audit row on
    /// `into`. Answers `into`'s new occurrence.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn move_counters(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        (id, from): (&CardId, &Row),
        (into, target): (&CardId, &Row),
        rev: u64,
        actor: &str,
    ) -> Result<u64> {
        let e = self.err("merge cards");
        let pending: (i64, Option<String>) = tx
            .query_row(
                "SELECT pending_occurrence, pending_last_seen FROM cards WHERE workspace = ?1 AND id = ?2",
                params![ws, id.to_string()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(&e)?;
        let last_seen = match (&target.last_seen, &from.last_seen) {
            (Some(a), Some(b)) => Some(a.max(b).clone()),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        let occurrence = target.occurrence + from.occurrence;
        tx.execute(
            "UPDATE cards SET occurrence = ?3, last_seen = ?4, rev = ?5,
                pending_occurrence = pending_occurrence + ?6,
                pending_last_seen = CASE WHEN COALESCE(pending_last_seen, '') > COALESCE(?7, '')
                    THEN COALESCE(pending_last_seen, '') ELSE COALESCE(?7, '') END
             WHERE workspace = ?1 AND id = ?2",
            params![
                ws,
                into.to_string(),
                occurrence as i64,
                last_seen,
                rev as i64,
                pending.0,
                pending.1
            ],
        )
        .map_err(&e)?;
        tx.execute(
            "UPDATE cards SET pending_occurrence = 0, pending_last_seen = NULL WHERE workspace = ?1 AND id = ?2",
            params![ws, id.to_string()],
        )
        .map_err(&e)?;
        let detail = format!(
            "merged {id} in: occurrence {} + {} = {occurrence}",
            target.occurrence, from.occurrence
        );
        audit(
            tx,
            ws,
            Some(into),
            rev,
            actor,
            "merge",
            Some(&target.sha256),
            Some(&target.sha256),
            None,
            Some(&detail),
        )
        .map_err(&e)?;
        Ok(occurrence)
    }

    /// A card's stored text and whether it is archived (admin).
    pub fn card_text(&self, ws: &str, id: &CardId) -> Result<(Vec<u8>, Option<String>)> {
        self.read(|tx| {
            let e = self.err("read card");
            let row = load_row(tx, ws, id)
                .map_err(&e)?
                .ok_or_else(|| not_found(ws, id))?;
            Ok((
                load_object(tx, ws, &row.sha256).map_err(&e)?,
                row.archived_at,
            ))
        })
    }

    /// A card's audit history, oldest first (admin). Works for deleted cards too.
    pub fn history(&self, ws: &str, id: &CardId) -> Result<Vec<HistoryRow>> {
        self.read(|tx| self.history_in(tx, ws, id))
    }

    /// [`Store::history`] inside a read transaction.
    pub(crate) fn history_in(&self, tx: &Tx<'_>, ws: &str, id: &CardId) -> Result<Vec<HistoryRow>> {
        {
            let e = self.err("read history");
            let mut stmt = tx
                .prepare(
                    "SELECT h.seq, h.card_id, h.revision, h.at, h.actor, h.action, h.sha256_before,
                            h.sha256_after, h.content, h.redacted, h.detail, t.name
                     FROM history h LEFT JOIN tokens t ON h.actor = 'token:' || t.id
                     WHERE h.workspace = ?1 AND h.card_id = ?2 ORDER BY h.seq",
                )
                .map_err(&e)?;
            let rows = stmt
                .query_map(params![ws, id.to_string()], history_row)
                .map_err(&e)?
                .collect::<db::Result<Vec<_>>>()
                .map_err(&e)?;
            if rows.is_empty() {
                return Err(not_found(ws, id));
            }
            Ok(rows)
        }
    }

    /// Every audit row of a workspace from `after_seq` on (admin, and tests).
    pub fn workspace_history(&self, ws: &str, after_seq: i64) -> Result<Vec<HistoryRow>> {
        self.read(|tx| {
            let e = self.err("read history");
            let mut stmt = tx
                .prepare(
                    "SELECT h.seq, h.card_id, h.revision, h.at, h.actor, h.action, h.sha256_before,
                            h.sha256_after, h.content, h.redacted, h.detail, t.name
                     FROM history h LEFT JOIN tokens t ON h.actor = 'token:' || t.id
                     WHERE h.workspace = ?1 AND h.seq > ?2 ORDER BY h.seq",
                )
                .map_err(&e)?;
            stmt.query_map(params![ws, after_seq], history_row)
                .map_err(&e)?
                .collect::<db::Result<Vec<_>>>()
                .map_err(&e)
        })
    }

    /// Removes a card and its content at once, for personal data or a credential: the
    /// object is deleted (no retention) unless another card shares it, and the card's
    /// history is redacted, keeping hashes. `reason` goes into the audit row.
    pub fn hard_delete(
        &self,
        ws: &str,
        id: &CardId,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<CardChange> {
        let reason = match reason.map(str::trim) {
            None | Some("") => None,
            Some(r) if r.chars().count() > 500 || r.chars().any(char::is_control) => {
                return Err(StoreError::Invalid(
                    "reason must be at most 500 characters on one line".into(),
                ));
            }
            Some(r) => Some(r),
        };
        self.write(|tx| {
            let e = self.err("hard delete");
            let row = load_row(tx, ws, id)
                .map_err(&e)?
                .ok_or_else(|| not_found(ws, id))?;
            let rev = bump(tx, ws).map_err(&e)?;
            // Every version the card ever had, not only the current one: earlier objects
            // wait out the retention window otherwise.
            let versions: Vec<String> = {
                let mut stmt = tx
                    .prepare(
                        "SELECT sha256_before FROM history WHERE workspace = ?1 AND card_id = ?2 AND sha256_before IS NOT NULL
                         UNION SELECT sha256_after FROM history WHERE workspace = ?1 AND card_id = ?2 AND sha256_after IS NOT NULL",
                    )
                    .map_err(&e)?;
                stmt.query_map(params![ws, id.to_string()], |r| r.get(0))
                    .map_err(&e)?
                    .collect::<db::Result<_>>()
                    .map_err(&e)?
            };
            remove_card(tx, ws, id, &row.sha256, rev).map_err(&e)?;
            // For good means its rejection tombstone too: its hashes of the normalised text
            // and of the words with digits could confirm guesses of what it said.
            tx.execute(
                "DELETE FROM rejections WHERE workspace = ?1 AND card_id = ?2",
                params![ws, id.to_string()],
            )
            .map_err(&e)?;
            for sha in &versions {
                tx.execute(
                    "DELETE FROM objects WHERE workspace = ?1 AND sha256 = ?2
                       AND NOT EXISTS (SELECT 1 FROM cards WHERE workspace = ?1 AND sha256 = ?2)",
                    params![ws, sha],
                )
                .map_err(&e)?;
            }
            audit(
                tx,
                ws,
                Some(id),
                rev,
                actor,
                "hard_delete",
                Some(&row.sha256),
                None,
                None,
                Some(&match reason {
                    Some(r) => format!("purged {} object version(s); reason={r}", versions.len().max(1)),
                    None => format!("purged {} object version(s)", versions.len().max(1)),
                }),
            )
            .map_err(&e)?;
            Ok(change(*id, rev, None, false, true))
        })
        .and_then(|change| {
            // The deleted pages are zeroed in the file (secure_delete); the WAL still
            // holds older images of them until a checkpoint.
            if !self.checkpoint_truncate()? {
                tracing::warn!(workspace = ws, card = %id, "hard delete: the WAL checkpoint did not complete (busy readers); it completes at a later checkpoint");
            }
            Ok(change)
        })
    }

    /// Purges archived cards past `archive_secs`, deletes released objects past
    /// `object_secs`, and forgets tombstones past `delta_secs` (raising the delta floor).
    /// Returns (cards purged, objects deleted).
    pub fn collect_garbage(
        &self,
        archive_secs: u64,
        object_secs: u64,
        delta_secs: u64,
    ) -> Result<(usize, usize)> {
        let cutoff = |secs: u64| {
            jiff::Timestamp::now()
                .checked_sub(jiff::SignedDuration::from_secs(
                    secs.min(i64::MAX as u64 / 2) as i64,
                ))
                .map_or_else(|_| "0000".to_owned(), stamp)
        };
        let (archive_cut, object_cut, delta_cut) = (
            cutoff(archive_secs),
            cutoff(object_secs),
            cutoff(delta_secs),
        );
        self.write(|tx| {
            let e = self.err("collect garbage");
            let expired: Vec<(String, String, String, i64)> = {
                let mut stmt = tx
                    .prepare("SELECT workspace, id, sha256, rev FROM cards WHERE archived_at IS NOT NULL AND archived_at < ?1")
                    .map_err(&e)?;
                stmt.query_map(params![archive_cut], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .map_err(&e)?
                    .collect::<db::Result<_>>()
                    .map_err(&e)?
            };
            for (ws, id, sha, rev) in &expired {
                let Ok(card_id) = CardId::parse(id) else { continue };
                // The card left the manifest when it was archived, at `rev`.
                remove_card(tx, ws, &card_id, sha, *rev as u64).map_err(&e)?;
                let current = current_revision(tx, ws).map_err(&e)?;
                audit(tx, ws, Some(&card_id), current, "server:gc", "purge", Some(sha), None, None, None).map_err(&e)?;
            }
            let objects = tx
                .execute("DELETE FROM objects WHERE released_at IS NOT NULL AND released_at < ?1", params![object_cut])
                .map_err(&e)?;
            tx.execute(
                "UPDATE workspaces SET history_floor =
                    (SELECT COALESCE(MAX(rev), 0) FROM tombstones t
                     WHERE t.workspace = workspaces.name AND t.created_at < ?1)
                 WHERE history_floor < (SELECT COALESCE(MAX(rev), 0) FROM tombstones t
                     WHERE t.workspace = workspaces.name AND t.created_at < ?1)",
                params![delta_cut],
            )
            .map_err(&e)?;
            tx.execute("DELETE FROM tombstones WHERE created_at < ?1", params![delta_cut]).map_err(&e)?;
            self.prune_usage(tx)?;
            Ok((expired.len(), objects))
        })
    }
}

/// Deletes a card row, leaves a tombstone for deltas, deletes its object if unshared and
/// redacts the card's history.
fn remove_card(tx: &Tx<'_>, ws: &str, id: &CardId, sha: &str, rev: u64) -> db::Result<()> {
    let id_s = id.to_string();
    tx.execute(
        "DELETE FROM cards WHERE workspace = ?1 AND id = ?2",
        params![ws, id_s],
    )?;
    tx.execute(
        "INSERT INTO tombstones (workspace, id, rev, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (workspace, id) DO UPDATE SET rev = excluded.rev, created_at = excluded.created_at",
        params![ws, id_s, rev as i64, now()],
    )?;
    tx.execute(
        "DELETE FROM objects WHERE workspace = ?1 AND sha256 = ?2
           AND NOT EXISTS (SELECT 1 FROM cards WHERE workspace = ?1 AND sha256 = ?2)",
        params![ws, sha],
    )?;
    tx.execute(
        "UPDATE history SET content = NULL, redacted = 1 WHERE workspace = ?1 AND card_id = ?2",
        params![ws, id_s],
    )?;
    super::usage::forget_card(tx, ws, &id_s)?;
    super::intake::forget(tx, ws, &id_s)?;
    Ok(())
}

pub(crate) fn history_row(r: &db::Row<'_>) -> db::Result<HistoryRow> {
    Ok(HistoryRow {
        seq: r.get(0)?,
        card_id: r.get(1)?,
        revision: r.get::<i64>(2)? as u64,
        at: r.get(3)?,
        actor: r.get(4)?,
        action: r.get(5)?,
        sha256_before: r.get(6)?,
        sha256_after: r.get(7)?,
        content: r.get(8)?,
        redacted: r.get(9)?,
        detail: r.get(10)?,
        actor_name: r.get(11)?,
    })
}

/// Card `id` exists in `other`, a workspace composed with this one (server.toml
/// `[inheritance]`): one card would hide the other in the tasks that get both.
pub(crate) fn id_taken(id: &CardId, other: &str) -> StoreError {
    StoreError::Conflict(format!(
        "card {id} exists in workspace {other}, which tasks get together with this one (server.toml [inheritance]): give the new card another id, and to replace {other}'s card name it under `supersedes`"
    ))
}
