//! What the write path keeps beside each card, and the tables it decides with: the card's
//! same-lesson fingerprint and band keys and the credentials found in its text
//! (`card_intake`, `lesson_bands`, made by [`record`] whenever a card's text is written),
//! duplicate groups, rejection tombstones, and each store's first answer by its
//! idempotency key.
//!
//! The rules themselves are `mop-intake`'s; this module only keeps their results and
//! looks them up inside the caller's transaction, so a decision and the change it leads to
//! commit together.

use std::collections::HashMap;
use std::sync::Arc;

use mop_embed::Model;

use mop_cards::{Card, CardId};
use mop_intake::lesson::{Lesson, Thresholds};
use mop_intake::secrets::{Finding, Screen};
use mop_proto::curation::{CardInfo, CredentialCard, DuplicateGroup, Rejection};
use mop_proto::sync::{CredentialFinding, RejectionNote, StoreResponse};
use mop_proto::time::Stamp;

use super::db::{self, OptionalExtension, Tx, params};
use super::{Result, Store, StoreError, now};

/// What a store that matches a rejected lesson gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRejected {
    /// Refused, with the date and reason of the rejection.
    #[default]
    Refuse,
    /// Created as usual, marked "previously rejected" for the curator.
    Queue,
}

/// The write path's settings (the server's `[intake]` configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntakePolicy {
    /// When two lessons are the same.
    pub same_lesson: Thresholds,
    /// What a store of a rejected lesson gets.
    pub on_rejected: OnRejected,
    /// Distinct users whose agents must call a verified card wrong or outdated before it
    /// enters the review queue as a flag item (at least 1).
    pub flag_min_users: u64,
}

impl Default for IntakePolicy {
    fn default() -> Self {
        IntakePolicy {
            same_lesson: Thresholds::default(),
            on_rejected: OnRejected::default(),
            flag_min_users: 2,
        }
    }
}

/// The embedding model the same-lesson rule reads meaning with (`[intake]
/// embedding_model`), for the whole process: every card written gets its vector, and the
/// rows of cards written before (or with another model) are made again at start.
static MODEL: parking_lot::RwLock<Option<Arc<Model>>> = parking_lot::RwLock::new(None);

/// Sets the process's embedding model (the server does, from its configuration, before it
/// opens the database).
pub fn set_embedding_model(model: Option<Arc<Model>>) {
    *MODEL.write() = model;
}

fn model() -> Option<Arc<Model>> {
    MODEL.read().clone()
}

/// The version of what `card_intake` holds: the fingerprint format, the screening rules
/// and the embedding model. A row of another version is made again at start.
pub(crate) fn intake_version() -> String {
    format!(
        "lesson{}-screen{}-dense{}",
        mop_intake::lesson::VERSION,
        mop_intake::secrets::rules_fingerprint(),
        model().map_or_else(
            || "none".to_owned(),
            |m| m.fingerprint().sha256[..16].to_owned()
        )
    )
}

/// The lesson of a title and body: its fingerprint, and its vector when a model is set.
pub(crate) fn lesson(title: &str, body: &str) -> Lesson {
    let l = Lesson::of(title, body);
    match model().and_then(|m| m.embed(&mop_intake::lesson::embedding_text(title, body))) {
        Some(v) => l.with_vector(&v),
        None => l,
    }
}

/// A finding as the wire carries it.
pub(crate) fn wire(f: Finding) -> CredentialFinding {
    CredentialFinding {
        kind: f.kind,
        field: f.field,
        line: f.line,
        column: f.column,
    }
}

/// The credentials in a card file, as the wire carries them.
pub(crate) fn screen_card_file(raw: &[u8]) -> Vec<CredentialFinding> {
    Screen::builtin()
        .scan_card_file(&String::from_utf8_lossy(raw))
        .into_iter()
        .map(wire)
        .collect()
}

/// Refuses text with credentials: the error lists kinds and places, never values.
pub(crate) fn refuse_credentials(findings: Vec<CredentialFinding>, what: &str) -> Result<()> {
    if findings.is_empty() {
        Ok(())
    } else {
        Err(StoreError::Credential {
            what: what.to_owned(),
            findings,
        })
    }
}

/// The lesson of a card: its title and body.
pub(crate) fn lesson_of(card: &Card) -> Lesson {
    lesson(&card.summary.title, &card.body)
}

/// Records what intake derives from a card's text (object `sha`), unless it is there
/// already for this object and version. Every write of a card's text calls it.
pub(crate) fn record(tx: &Tx<'_>, ws: &str, card: &Card, raw: &[u8], sha: &str) -> db::Result<()> {
    let id = card.summary.id.to_string();
    let version = intake_version();
    let current: Option<(String, String)> = tx
        .query_row(
            "SELECT sha256, version FROM card_intake WHERE workspace = ?1 AND card_id = ?2",
            params![ws, id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if current.is_some_and(|(s, v)| s == sha && v == version) {
        return Ok(());
    }
    let lesson = lesson_of(card);
    let findings = screen_card_file(raw);
    let credentials = (!findings.is_empty())
        .then(|| serde_json::to_string(&findings).expect("findings serialize"));
    tx.execute(
        "INSERT INTO card_intake (workspace, card_id, sha256, version, exact, signature, words, numbers, credentials, vector)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (workspace, card_id) DO UPDATE SET
            sha256 = excluded.sha256, version = excluded.version, exact = excluded.exact,
            signature = excluded.signature, words = excluded.words, numbers = excluded.numbers,
            credentials = excluded.credentials, vector = excluded.vector",
        params![
            ws,
            id,
            sha,
            version,
            lesson.exact,
            lesson.signature_bytes(),
            i64::from(lesson.words),
            lesson.numbers_bytes(),
            credentials,
            lesson.vector_bytes()
        ],
    )?;
    tx.execute(
        "DELETE FROM lesson_bands WHERE workspace = ?1 AND card_id = ?2",
        params![ws, id],
    )?;
    let mut bands = lesson.bands().to_vec();
    bands.sort_unstable();
    bands.dedup();
    for band in bands {
        tx.execute(
            "INSERT INTO lesson_bands (workspace, band, card_id) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
            params![ws, band, id],
        )?;
    }
    Ok(())
}

/// Forgets what intake kept of a removed card (its group membership too). Its rejection
/// tombstone, if any, stays: it holds no text.
pub(crate) fn forget(tx: &Tx<'_>, ws: &str, id: &str) -> db::Result<()> {
    for sql in [
        "DELETE FROM card_intake WHERE workspace = ?1 AND card_id = ?2",
        "DELETE FROM lesson_bands WHERE workspace = ?1 AND card_id = ?2",
        "DELETE FROM duplicate_groups WHERE workspace = ?1 AND card_id = ?2",
    ] {
        tx.execute(sql, params![ws, id])?;
    }
    Ok(())
}

/// A stored fingerprint: exact, signature, words, numbers, vector.
type Stored = (String, Vec<u8>, i64, Vec<u8>, Option<Vec<u8>>);

fn stored_lesson((exact, signature, words, numbers, vector): Stored) -> Option<Lesson> {
    Lesson::from_stored(
        exact,
        &signature,
        words.clamp(0, i64::from(u32::MAX)) as u32,
        &numbers,
    )
    .map(|l| l.with_stored_vector(vector))
}

fn read_stored(r: &db::Row<'_>, from: usize) -> db::Result<Stored> {
    Ok((
        r.get(from)?,
        r.get(from + 1)?,
        r.get(from + 2)?,
        r.get(from + 3)?,
        r.get(from + 4)?,
    ))
}

/// How many cards a store compares its lesson with, at most: those sharing the most band
/// keys with it (a card of the same lesson shares about three of twenty, an unrelated one
/// rarely more than one), and any with the same normalised text.
const MAX_CANDIDATES: usize = 64;

/// The cards whose lesson may be the same as `lesson`: equal normalised text, or the
/// [`MAX_CANDIDATES`] that share the most band keys with it. The caller applies the rule.
pub(crate) fn candidates(
    tx: &Tx<'_>,
    ws: &str,
    lesson: &Lesson,
) -> db::Result<Vec<(CardId, Lesson)>> {
    // Key lookups only: first the ids (by band key, and by the exact text), then each
    // one's row by its primary key. (No DISTINCT: it makes SQLite walk the by-card index
    // of the whole workspace instead of looking the band keys up.)
    let bands = lesson.bands();
    let placeholders: Vec<String> = (0..bands.len()).map(|i| format!("?{}", i + 2)).collect();
    let sql = format!(
        "SELECT card_id FROM lesson_bands WHERE workspace = ?1 AND band IN ({})",
        placeholders.join(", ")
    );
    let mut values: Vec<&dyn db::ToValue> = vec![&ws];
    values.extend(bands.iter().map(|b| b as &dyn db::ToValue));
    let mut hits: HashMap<String, u32> = HashMap::new();
    for id in tx
        .prepare_cached(&sql)?
        .query_map(&values, |r| r.get::<String>(0))?
    {
        *hits.entry(id?).or_default() += 1;
    }
    let mut ranked: Vec<(String, u32)> = hits.into_iter().collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut ids: Vec<String> = ranked
        .into_iter()
        .take(MAX_CANDIDATES)
        .map(|(id, _)| id)
        .collect();
    let exact: Vec<String> = tx
        .prepare_cached("SELECT card_id FROM card_intake WHERE workspace = ?1 AND exact = ?2")?
        .query_map(params![ws, lesson.exact], |r| r.get::<String>(0))?
        .collect::<db::Result<_>>()?;
    ids.extend(exact);
    ids.sort_unstable();
    ids.dedup();
    let mut stmt = tx.prepare_cached(
        "SELECT exact, signature, words, numbers, vector FROM card_intake WHERE workspace = ?1 AND card_id = ?2",
    )?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let row = stmt
            .query_row(params![ws, id], |r| read_stored(r, 0))
            .optional()?;
        if let (Ok(card), Some(l)) = (CardId::parse(&id), row.and_then(stored_lesson)) {
            out.push((card, l));
        }
    }
    Ok(out)
}

/// A card's stored lesson.
pub(crate) fn lesson_of_card(tx: &Tx<'_>, ws: &str, id: &CardId) -> db::Result<Option<Lesson>> {
    Ok(tx
        .query_row(
            "SELECT exact, signature, words, numbers, vector FROM card_intake WHERE workspace = ?1 AND card_id = ?2",
            params![ws, id.to_string()],
            |r| read_stored(r, 0),
        )
        .optional()?
        .and_then(stored_lesson))
}

/// Who could see a rejected card, as its tombstone keeps it: a refusal names the
/// rejection only to a task that could have seen the card (another task learns nothing
/// of someone else's rejected lesson; its store is created and marked for the curators).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Seen {
    /// The card's user binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The card's asset binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset: Option<String>,
    /// The card's project binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The card's agent binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// For an unverified card, its author (`Some(None)`: no author, nobody).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<Option<String>>,
}

impl Seen {
    fn of(s: &mop_cards::CardSummary) -> Seen {
        Seen {
            user: s.scope.user_id.clone(),
            asset: s.scope.asset_id.clone(),
            project: s.scope.project_id.clone(),
            agent: s.scope.agent.clone(),
            author: (s.trust == mop_cards::Trust::Unverified)
                .then(|| s.restricted_to_author().map(str::to_owned)),
        }
    }

    /// Whether the task `who` could have seen the card.
    pub fn by(&self, who: &mop_cards::Viewer<'_>) -> bool {
        let ok = |card: &Option<String>, task: Option<&str>| {
            card.as_deref().is_none_or(|c| task == Some(c))
        };
        ok(&self.user, who.user)
            && ok(&self.asset, who.asset)
            && ok(&self.project, who.project)
            && ok(&self.agent, who.agent)
            && self
                .author
                .as_ref()
                .is_none_or(|a| a.is_some() && a.as_deref() == who.user)
    }
}

/// A live rejection tombstone.
#[derive(Debug, Clone)]
pub(crate) struct Tombstone {
    pub note: RejectionNote,
    pub card_id: String,
    pub lesson: Lesson,
    /// Who could see the rejected card.
    pub seen: Seen,
}

/// The workspace's live (not lifted) tombstones.
pub(crate) fn tombstones(tx: &Tx<'_>, ws: &str) -> db::Result<Vec<Tombstone>> {
    let mut stmt = tx.prepare_cached(
        "SELECT id, card_id, reason, at, scope, exact, signature, words, numbers, vector FROM rejections
         WHERE workspace = ?1 AND lifted_at IS NULL ORDER BY at, id",
    )?;
    let rows = stmt.query_map(params![ws], |r| {
        Ok((
            r.get::<String>(0)?,
            r.get::<String>(1)?,
            r.get::<String>(2)?,
            r.get::<String>(3)?,
            r.get::<String>(4)?,
            read_stored(r, 5)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, card_id, reason, at, scope, stored) = row?;
        // Unreadable: nobody is named the rejection (the store is marked instead).
        let seen = serde_json::from_str(&scope).unwrap_or(Seen {
            author: Some(None),
            ..Seen::default()
        });
        if let Some(lesson) = stored_lesson(stored) {
            out.push(Tombstone {
                note: RejectionNote { id, at, reason },
                card_id,
                lesson,
                seen,
            });
        }
    }
    Ok(out)
}

/// The first tombstone whose lesson is the same as `lesson`.
pub(crate) fn matching_tombstone<'a>(
    stones: &'a [Tombstone],
    lesson: &Lesson,
    t: &Thresholds,
) -> Option<&'a Tombstone> {
    stones
        .iter()
        .find(|s| s.lesson.same_as(lesson, t).is_some())
}

/// Keeps a tombstone of a rejected card: its fingerprint, who could see it, the reason
/// and the curator.
pub(crate) fn bury(
    tx: &Tx<'_>,
    ws: &str,
    card: &CardId,
    summary: &mop_cards::CardSummary,
    reason: &str,
    actor: &str,
) -> db::Result<()> {
    let Some(lesson) = lesson_of_card(tx, ws, card)? else {
        return Ok(());
    };
    let seen = serde_json::to_string(&Seen::of(summary)).expect("scopes serialize");
    tx.execute(
        "INSERT INTO rejections (workspace, id, card_id, exact, signature, words, numbers, reason, actor, at, vector, scope)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            ws,
            uuid::Uuid::new_v4().to_string(),
            card.to_string(),
            lesson.exact,
            lesson.signature_bytes(),
            i64::from(lesson.words),
            lesson.numbers_bytes(),
            reason,
            actor,
            now(),
            lesson.vector_bytes(),
            seen
        ],
    )?;
    Ok(())
}

/// The group a card belongs to: its id and members, oldest first.
pub(crate) fn group_of(
    tx: &Tx<'_>,
    ws: &str,
    card: &CardId,
) -> db::Result<Option<(String, Vec<CardId>)>> {
    let group: Option<String> = tx
        .query_row(
            "SELECT group_id FROM duplicate_groups WHERE workspace = ?1 AND card_id = ?2",
            params![ws, card.to_string()],
            |r| r.get(0),
        )
        .optional()?;
    let Some(group) = group else { return Ok(None) };
    let members = group_members(tx, ws, &group)?;
    Ok(Some((group, members)))
}

/// Puts `new` in the duplicate group of `existing` (making the group when `existing` has
/// none yet).
pub(crate) fn join_group(tx: &Tx<'_>, ws: &str, new: &CardId, existing: &CardId) -> db::Result<()> {
    let group = match group_of(tx, ws, existing)? {
        Some((g, _)) => g,
        None => {
            let g = existing.to_string();
            tx.execute(
                "INSERT INTO duplicate_groups (workspace, card_id, group_id, at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT DO NOTHING",
                params![ws, g, g, now()],
            )?;
            g
        }
    };
    tx.execute(
        "INSERT INTO duplicate_groups (workspace, card_id, group_id, at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (workspace, card_id) DO UPDATE SET group_id = excluded.group_id",
        params![ws, new.to_string(), group, now()],
    )?;
    Ok(())
}

/// The first answer given to a store with this key, and the task that store was of.
pub(crate) fn first_answer(
    tx: &Tx<'_>,
    ws: &str,
    actor: &str,
    key: &str,
) -> db::Result<Option<(String, Option<StoreResponse>)>> {
    Ok(tx
        .query_row(
            "SELECT task_id, answer FROM store_answers WHERE workspace = ?1 AND actor = ?2 AND key = ?3",
            params![ws, actor, key],
            |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?)),
        )
        .optional()?
        .map(|(task, answer)| (task, serde_json::from_str(&answer).ok())))
}

/// Keeps a store's answer under its key.
pub(crate) fn keep_answer(
    tx: &Tx<'_>,
    ws: &str,
    actor: &str,
    key: &str,
    task: &str,
    answer: &StoreResponse,
) -> db::Result<()> {
    tx.execute(
        "INSERT INTO store_answers (workspace, actor, key, task_id, answer, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            ws,
            actor,
            key,
            task,
            serde_json::to_string(answer).expect("answers serialize"),
            now()
        ],
    )?;
    Ok(())
}

/// The credentials found in a card's text (none: empty).
pub(crate) fn credentials_of(
    tx: &Tx<'_>,
    ws: &str,
    card: &str,
) -> db::Result<Vec<CredentialFinding>> {
    let json: Option<Option<String>> = tx
        .query_row(
            "SELECT credentials FROM card_intake WHERE workspace = ?1 AND card_id = ?2",
            params![ws, card],
            |r| r.get(0),
        )
        .optional()?;
    Ok(json
        .flatten()
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_default())
}

/// The duplicate group a card is in, with its members oldest first.
pub(crate) fn duplicate_group(
    tx: &Tx<'_>,
    ws: &str,
    card: &CardId,
) -> db::Result<Option<DuplicateGroup>> {
    Ok(group_of(tx, ws, card)?.map(|(id, members)| DuplicateGroup { id, members }))
}

/// A group's members, oldest first (empty: no such group).
pub(crate) fn group_members(tx: &Tx<'_>, ws: &str, group: &str) -> db::Result<Vec<CardId>> {
    let mut stmt = tx.prepare_cached(
        "SELECT card_id FROM duplicate_groups WHERE workspace = ?1 AND group_id = ?2 ORDER BY at, card_id",
    )?;
    Ok(stmt
        .query_map(params![ws, group], |r| r.get::<String>(0))?
        .collect::<db::Result<Vec<_>>>()?
        .into_iter()
        .filter_map(|m| CardId::parse(&m).ok())
        .collect())
}

impl Store {
    /// Puts card `new` in the duplicate group of `existing` (a curator's import of the
    /// same lesson).
    pub(crate) fn group_with(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        new: &CardId,
        existing: &CardId,
    ) -> Result<()> {
        join_group(tx, ws, new, existing).map_err(self.err("group a duplicate"))
    }

    /// Marks each card whose lesson matches a live tombstone as previously rejected.
    pub(crate) fn mark_rejected(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        cards: &mut [&mut CardInfo],
    ) -> Result<()> {
        let e = self.err("match tombstones");
        let stones = tombstones(tx, ws).map_err(&e)?;
        if stones.is_empty() {
            return Ok(());
        }
        for card in cards.iter_mut() {
            let id = card.summary.id;
            let Some(lesson) = lesson_of_card(tx, ws, &id).map_err(&e)? else {
                continue;
            };
            card.previously_rejected = stones
                .iter()
                .filter(|s| s.card_id != id.to_string())
                .find(|s| {
                    s.lesson
                        .same_as(&lesson, &self.intake.same_lesson)
                        .is_some()
                })
                .map(|s| s.note.clone());
        }
        Ok(())
    }

    /// Every rejection tombstone of `ws`, newest first (lifted ones too).
    pub fn rejections(&self, ws: &str) -> Result<Vec<Rejection>> {
        self.read(|tx| {
            let e = self.err("read rejections");
            let mut stmt = tx
                .prepare(
                    "SELECT r.id, r.card_id, r.reason, r.actor, t.name, r.at, r.lifted_at, r.lifted_by
                     FROM rejections r LEFT JOIN tokens t ON r.actor = 'token:' || t.id
                     WHERE r.workspace = ?1 ORDER BY r.at DESC, r.id",
                )
                .map_err(&e)?;
            let rows = stmt
                .query_map(params![ws], |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<String>(1)?,
                        r.get::<String>(2)?,
                        r.get::<String>(3)?,
                        r.get::<Option<String>>(4)?,
                        r.get::<Stamp>(5)?,
                        r.get::<Option<Stamp>>(6)?,
                        r.get::<Option<String>>(7)?,
                    ))
                })
                .map_err(&e)?;
            let mut out = Vec::new();
            for row in rows {
                let (id, card, reason, actor, actor_name, at, lifted_at, lifted_by) = row.map_err(&e)?;
                let Ok(card_id) = CardId::parse(&card) else { continue };
                out.push(Rejection { id, card_id, reason, actor, actor_name, at, lifted_at, lifted_by });
            }
            Ok(out)
        })
    }

    /// Forgets store answers kept longer than `secs` (their daemons stopped replaying long
    /// ago). Returns how many.
    pub fn forget_store_answers(&self, secs: u64) -> Result<usize> {
        let cut = jiff::Timestamp::now()
            .checked_sub(jiff::SignedDuration::from_secs(
                secs.min(i64::MAX as u64 / 2) as i64,
            ))
            .map_or_else(|_| "0000".to_owned(), super::stamp);
        self.write(|tx| {
            tx.execute("DELETE FROM store_answers WHERE at < ?1", params![cut])
                .map_err(self.err("forget store answers"))
        })
    }

    /// Lifts a rejection tombstone: later stores of its lesson are no longer refused. The
    /// rejected card's history records who lifted it.
    pub fn lift_rejection(&self, ws: &str, id: &str, actor: &str) -> Result<Rejection> {
        self.write(|tx| {
            let e = self.err("lift rejection");
            let row: Option<(String, Option<String>)> = tx
                .query_row(
                    "SELECT card_id, lifted_at FROM rejections WHERE workspace = ?1 AND id = ?2",
                    params![ws, id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(&e)?;
            let Some((card, lifted)) = row else {
                return Err(StoreError::NotFound(format!("rejection {id} not found in workspace {ws}")));
            };
            if lifted.is_none() {
                let at = now();
                tx.execute(
                    "UPDATE rejections SET lifted_at = ?3, lifted_by = ?4 WHERE workspace = ?1 AND id = ?2",
                    params![ws, id, at, actor],
                )
                .map_err(&e)?;
                let card_id = CardId::parse(&card).ok();
                let revision = super::cards::current_revision(tx, ws).map_err(&e)?;
                super::cards::audit(tx, ws, card_id.as_ref(), revision, actor, "lift-rejection", None, None, None, Some(&format!("rejection={id}")))
                    .map_err(&e)?;
            }
            Ok(())
        })?;
        self.rejections(ws)?
            .into_iter()
            .find(|r| r.id == id)
            .ok_or_else(|| {
                StoreError::NotFound(format!("rejection {id} not found in workspace {ws}"))
            })
    }

    /// Makes the intake rows of cards that have none, or one of another version or object
    /// (a database from before intake, or new rules): in batches, each its own transaction.
    /// Returns how many were made.
    pub fn refresh_intake(&self) -> Result<usize> {
        let version = intake_version();
        let mut made = 0;
        loop {
            let batch = self.write(|tx| {
                let e = self.err("refresh intake");
                let todo: Vec<(String, String, String)> = {
                    let mut stmt = tx
                        .prepare(
                            "SELECT c.workspace, c.id, c.sha256 FROM cards c
                             LEFT JOIN card_intake i ON i.workspace = c.workspace AND i.card_id = c.id
                             WHERE i.card_id IS NULL OR i.version <> ?1 OR i.sha256 <> c.sha256
                             ORDER BY c.workspace, c.id LIMIT 500",
                        )
                        .map_err(&e)?;
                    stmt.query_map(params![version], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                        .map_err(&e)?
                        .collect::<db::Result<_>>()
                        .map_err(&e)?
                };
                for (ws, id, sha) in &todo {
                    let raw = super::cards::load_object(tx, ws, sha).map_err(&e)?;
                    match mop_cards::parse_card(&raw) {
                        Ok(card) => record(tx, ws, &card, &raw, sha).map_err(&e)?,
                        Err(err) => {
                            // Stored text is valid by construction; one that is not must not
                            // stop the rest (and is skipped again next time).
                            tracing::warn!(workspace = %ws, card = %id, error = %err, "stored card unreadable; no intake facts for it");
                        }
                    }
                }
                Ok(todo.len())
            })?;
            made += batch;
            if batch < 500 {
                return Ok(made);
            }
            tracing::info!(cards = made, "intake facts made for existing cards");
        }
    }

    /// Every card of `ws` (archived ones too) that carries a credential, by id: findings
    /// only, never text.
    pub fn credential_cards(&self, ws: &str) -> Result<Vec<CredentialCard>> {
        self.read(|tx| {
            let e = self.err("read credentials");
            let mut stmt = tx
                .prepare(
                    "SELECT i.card_id, i.credentials, c.archived_at FROM card_intake i
                     JOIN cards c ON c.workspace = i.workspace AND c.id = i.card_id
                     WHERE i.workspace = ?1 AND i.credentials IS NOT NULL ORDER BY i.card_id",
                )
                .map_err(&e)?;
            let rows = stmt
                .query_map(params![ws], |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<String>(1)?,
                        r.get::<Option<Stamp>>(2)?,
                    ))
                })
                .map_err(&e)?;
            let mut out = Vec::new();
            for row in rows {
                let (id, json, archived_at) = row.map_err(&e)?;
                if let (Ok(id), Ok(findings)) = (CardId::parse(&id), serde_json::from_str(&json)) {
                    out.push(CredentialCard {
                        id,
                        archived_at,
                        findings,
                    });
                }
            }
            Ok(out)
        })
    }
}
