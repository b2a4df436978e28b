//! Stores from agent tasks (`POST /memories`): the one place that decides what an agent's
//! card does to the workspace.
//!
//! The daemon asserts the task's provenance; the server records it, with the node token as
//! actor, and refuses a card bound to any other user or asset. Then, in order:
//! - a card that carries a credential is refused (kinds and places named, never values);
//! - a store whose idempotency key was seen gets that store's first answer, and nothing
//!   changes (a daemon replaying a queued store, or retrying one that timed out);
//! - a lesson a curator rejected is refused with the reason (or created marked, as
//!   `[intake] on_rejected` says);
//! - the same lesson (`mop_intake::lesson`) as a card the task can see *reinforces* that
//!   card: counters only, published in the next batch, once per task (a repeat answers
//!   `unchanged`). A card merged away counts as the card it was merged into. The answer
//!   says whether a person verified the card;
//! - otherwise a new unverified card is *created*. When it repeats a card the task cannot
//!   see (another author's unverified card), it joins that card's duplicate group for the
//!   curators, and the answer reveals nothing of the other card.
//!
//! Agent text never rewrites a verified card. Stores are bounded: a task without a user is
//! nobody's author and its stores are refused; each (node token, task) may store at most
//! `limits.stores_per_task` times. A refusal changes nothing. Every answer says who will
//! see the card and what to do next.

use super::db::{Tx, params};
use jiff::Timestamp;
use mop_cards::{
    Card, CardId, CardSummary, Counters, Extra, Provenance, Trust, is_scope_id, is_task_id,
    render_card,
};
use mop_intake::lesson::Lesson;
use mop_intake::secrets::Screen;
use mop_proto::sync::{RejectionNote, StoreOutcome, StoreRequest, StoreResponse};

use super::cards::{Kept, Row, audit, current_revision, load_row, write_card};
use super::intake::{self, OnRejected};
use super::{Result, Store, StoreError, bump, db, ensure_workspace, stamp};

/// Records that a task (a node token's task id) contributed to a card: created or
/// reinforced it. False when it had already, so its repeat counts for nothing.
fn note_contribution(
    tx: &Tx<'_>,
    ws: &str,
    actor: &str,
    task_id: &str,
    card: &CardId,
    at: Timestamp,
) -> db::Result<bool> {
    let inserted = tx.execute(
        "INSERT INTO task_reinforcements (workspace, actor, task_id, card_id, at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
        params![ws, actor, task_id, card.to_string(), stamp(at)],
    )?;
    Ok(inserted == 1)
}

/// Bounds on agent stores that the store itself enforces (the per-token rate is kept in
/// memory by the API, which sees every request first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most stores one task (one node token and task id) may make.
    pub stores_per_task: u64,
}

/// What to tell an agent whose store repeated card `id`.
fn repeat_note(id: &CardId, verified: bool) -> String {
    if verified {
        format!(
            "A verified card already covers this lesson: read it with `mop memory get {id}` (MCP: memory_get) and store only what it does not say."
        )
    } else {
        format!(
            "Card {id}, which your tasks stored before, says the same; a curator has not verified it yet. Read it with `mop memory get {id}` and store only what is new."
        )
    }
}

/// A store checked, screened and fingerprinted ([`Store::prepare_store`]), ready for the
/// transaction.
#[derive(Debug, Clone)]
pub struct PreparedStore {
    req: StoreRequest,
    key: Option<String>,
    new_card: Card,
    lesson: Lesson,
    now: Timestamp,
}

/// Whether the store's lesson matches a rejection tombstone, and whose.
enum Rejected {
    No,
    /// A rejected card the task could have seen: the task is told (refused, or created
    /// marked under `on_rejected = "queue"`).
    Theirs(RejectionNote),
    /// Another user's or asset's rejected card: the store goes on as if there were none;
    /// only the curators see the mark.
    Elsewhere(RejectionNote),
}

/// A live card the lesson matched: where a merged-away card leads, and how close it was.
struct Match {
    row: Row,
    score: f32,
}

impl Store {
    /// The first answer to a store of task `task` with idempotency key `key` from `actor`,
    /// if any (read only: the API asks before it spends the token's store budget on a
    /// replay). A key another task's store used is refused, never answered.
    pub fn first_store_answer(
        &self,
        ws: &str,
        actor: &str,
        key: &str,
        task: &str,
    ) -> Result<Option<StoreResponse>> {
        self.read(|tx| self.answer_for(tx, ws, actor, key, task))
    }

    fn answer_for(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        actor: &str,
        key: &str,
        task: &str,
    ) -> Result<Option<StoreResponse>> {
        match intake::first_answer(tx, ws, actor, key).map_err(self.err("read store answer"))? {
            None => Ok(None),
            Some((owner, _)) if owner != task => Err(StoreError::Conflict(
                "the Idempotency-Key was used by another task's store; nothing was stored (send each store with a key of its own)".into(),
            )),
            Some((_, answer)) => Ok(answer),
        }
    }

    /// The live cards whose lesson is the same as `lesson`, best first; a card merged away
    /// is replaced by the card it was merged into.
    fn same_lesson_cards(&self, tx: &Tx<'_>, ws: &str, lesson: &Lesson) -> Result<Vec<Match>> {
        let e = self.err("find the same lesson");
        let t = &self.intake.same_lesson;
        let mut out: Vec<Match> = Vec::new();
        for (id, other) in intake::candidates(tx, ws, lesson).map_err(&e)? {
            let Some(same) = lesson.same_as(&other, t) else {
                continue;
            };
            let Some(mut row) = load_row(tx, ws, &id).map_err(&e)? else {
                continue;
            };
            // A merge supersedes the merged card by its target: follow the chain.
            for _ in 0..16 {
                let Some(next) = row.summary.superseded_by else {
                    break;
                };
                match load_row(tx, ws, &next).map_err(&e)? {
                    Some(r) => row = r,
                    None => break,
                }
            }
            if !row.summary.is_live() || row.archived_at.is_some() {
                continue;
            }
            match out.iter_mut().find(|m| m.row.summary.id == row.summary.id) {
                Some(m) => m.score = m.score.max(same.score()),
                None => out.push(Match {
                    row,
                    score: same.score(),
                }),
            }
        }
        // Verified cards first (what the agent should read), then the closest, then by id.
        out.sort_by(|a, b| {
            (a.row.summary.trust != Trust::Verified)
                .cmp(&(b.row.summary.trust != Trust::Verified))
                .then(b.score.total_cmp(&a.score))
                .then(a.row.summary.id.cmp(&b.row.summary.id))
        });
        Ok(out)
    }

    /// Stores a card from a task. `actor` is the node token's id; `key` the store's
    /// idempotency key, when the daemon sent one.
    pub fn store_memory(
        &self,
        ws: &str,
        req: &StoreRequest,
        actor: &str,
        limits: StoreLimits,
        key: Option<&str>,
    ) -> Result<StoreResponse> {
        let prepared = Store::prepare_store(req, key)?;
        self.store_prepared(ws, &prepared, actor, limits)
    }

    /// What a store can be judged on without the database: its fields checked, its text
    /// screened for credentials, its lesson fingerprinted. A refusal here costs no write
    /// (the API checks this before it spends the token's store budget).
    pub fn prepare_store(req: &StoreRequest, key: Option<&str>) -> Result<PreparedStore> {
        let p = &req.provenance;
        let c = &req.card;
        if !is_task_id(&p.task_id) {
            return Err(StoreError::Invalid(
                "provenance.task_id must be 1 to 64 characters of [A-Za-z0-9._-] starting with a letter or digit".into(),
            ));
        }
        if key.is_some_and(|k| {
            k.is_empty() || k.len() > 128 || !k.bytes().all(|b| b.is_ascii_graphic())
        }) {
            return Err(StoreError::Invalid(
                "the Idempotency-Key header must be 1 to 128 visible ASCII characters".into(),
            ));
        }
        for (key, value) in [
            ("provenance.user_id", &p.user_id),
            ("provenance.asset_id", &p.asset_id),
        ] {
            if value.as_deref().is_some_and(|v| !is_scope_id(v)) {
                return Err(StoreError::Invalid(format!(
                    "{key} must be 1 to 128 characters with no control characters and no outer spaces"
                )));
            }
        }
        p.binds(&c.scope)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let now_ts = Timestamp::now();
        let summary = CardSummary {
            id: CardId::from_uuid(uuid::Uuid::new_v4()),
            card_type: c.card_type,
            title: c.title.clone(),
            description: c.description.clone(),
            labels: c.labels.clone(),
            scope: c.scope.clone(),
            error_codes: c.error_codes.clone(),
            stacks: c.stacks.clone(),
            importance: mop_cards::DEFAULT_IMPORTANCE,
            created_at: Some(now_ts),
            updated_at: None,
            enabled: true,
            superseded_by: None,
            trust: Trust::Unverified,
            provenance: Some(Provenance {
                task_id: Some(p.task_id.clone()),
                user_id: p.user_id.clone(),
                asset_id: p.asset_id.clone(),
            }),
        };
        let new_card = Card {
            summary,
            counters: Counters {
                occurrence: 1,
                last_seen: Some(now_ts),
            },
            extra: Extra::default(),
            body: c.body.clone(),
        };
        new_card
            .validate()
            .map_err(|e| StoreError::Invalid(format!("card: {e}")))?;
        p.author()
            .map_err(|e| StoreError::Forbidden(e.to_string()))?;
        let fields = c.text_fields();
        let findings: Vec<_> = Screen::builtin()
            .scan_fields(fields.iter().map(|(name, text)| (*name, text.as_str())))
            .into_iter()
            .map(intake::wire)
            .collect();
        intake::refuse_credentials(findings, "the card")?;
        let lesson = intake::lesson(&c.title, &c.body);
        Ok(PreparedStore {
            req: req.clone(),
            key: key.map(str::to_owned),
            new_card,
            lesson,
            now: now_ts,
        })
    }

    /// Stores a prepared store: the idempotency key, the quota, rejections, and the same
    /// lesson, in one transaction.
    pub fn store_prepared(
        &self,
        ws: &str,
        prepared: &PreparedStore,
        actor: &str,
        limits: StoreLimits,
    ) -> Result<StoreResponse> {
        let PreparedStore {
            req,
            key,
            new_card,
            lesson,
            now: now_ts,
        } = prepared;
        let (key, now_ts) = (key.as_deref(), *now_ts);
        let p = &req.provenance;
        let detail = format!("task={}", p.task_id);

        self.write(|tx| {
            let e = self.err("store memory");
            ensure_workspace(tx, ws).map_err(&e)?;
            if let Some(k) = key
                && let Some(first) = self.answer_for(tx, ws, actor, k, &p.task_id)?
            {
                return Ok(first);
            }
            // Count this store first; over the limit, the error rolls the whole
            // transaction back, so a refused store changes nothing.
            let stores: i64 = tx
                .query_row(
                    "INSERT INTO task_stores (workspace, actor, task_id, stores, last_at) VALUES (?1, ?2, ?3, 1, ?4)
                     ON CONFLICT (workspace, actor, task_id) DO UPDATE SET stores = task_stores.stores + 1, last_at = ?4
                     RETURNING stores",
                    params![ws, actor, p.task_id, stamp(now_ts)],
                    |r| r.get(0),
                )
                .map_err(&e)?;
            if stores as u64 > limits.stores_per_task {
                return Err(StoreError::Limit(format!(
                    "task {} has made {} stores, the most one task may make (limits.stores_per_task on the server); \
                     nothing was stored. Fold what is left into fewer, fuller cards, or ask a curator",
                    p.task_id,
                    limits.stores_per_task
                )));
            }
            let stones = intake::tombstones(tx, ws).map_err(&e)?;
            let mut rejected = Rejected::No;
            if let Some(stone) = intake::matching_tombstone(&stones, lesson, &self.intake.same_lesson) {
                // Named only to a task that could have seen the rejected card: another
                // user's rejected lesson is not theirs to learn of (the curators still see
                // the mark).
                let theirs = stone.seen.by(p.user_id.as_deref(), p.asset_id.as_deref());
                match (self.intake.on_rejected, theirs) {
                    (OnRejected::Refuse, true) => {
                        return Err(StoreError::Rejected { note: stone.note.clone() });
                    }
                    (OnRejected::Queue, true) => rejected = Rejected::Theirs(stone.note.clone()),
                    (_, false) => rejected = Rejected::Elsewhere(stone.note.clone()),
                }
            }
            let answer = self.decide(tx, ws, actor, req, new_card, lesson, &detail, now_ts, rejected)?;
            if let Some(k) = key {
                intake::keep_answer(tx, ws, actor, k, &p.task_id, &answer).map_err(&e)?;
            }
            Ok(answer)
        })
    }

    /// Reinforce or create (see the module's comment), inside the store's transaction.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        actor: &str,
        req: &StoreRequest,
        new_card: &Card,
        lesson: &Lesson,
        detail: &str,
        now_ts: Timestamp,
        rejected: Rejected,
    ) -> Result<StoreResponse> {
        let e = self.err("store memory");
        let p = &req.provenance;
        let visible =
            |s: &CardSummary| s.is_visible_to(p.user_id.as_deref(), p.asset_id.as_deref());
        let matches = if let Rejected::Theirs(_) = rejected {
            // A lesson a curator turned down is not more evidence for anything: it goes to
            // the queue as itself.
            Vec::new()
        } else {
            // A rejection elsewhere changes nothing the task can observe (the answer would
            // otherwise tell it that someone's rejected lesson matches its guess).
            self.same_lesson_cards(tx, ws, lesson)?
        };
        if let Some(m) = matches.iter().find(|m| visible(&m.row.summary)) {
            return self.reinforce(tx, ws, actor, &p.task_id, m, detail, now_ts);
        }

        let raw = render_card(new_card).into_bytes();
        let rev = bump(tx, ws).map_err(&e)?;
        let seen = stamp(now_ts);
        let sha = write_card(
            tx,
            ws,
            new_card,
            &raw,
            rev,
            Kept {
                occurrence: 1,
                last_seen: Some(&seen),
                archived_at: None,
            },
        )
        .map_err(&e)?;
        let id = new_card.summary.id;
        let mut audit_detail = detail.to_owned();
        // The same lesson as cards the task cannot see: grouped for the curators, never
        // named to the agent.
        if let Some(other) = matches.first() {
            intake::join_group(tx, ws, &id, &other.row.summary.id).map_err(&e)?;
            audit_detail.push_str(&format!(" duplicate_of={}", other.row.summary.id));
        }
        if let Rejected::Theirs(r) | Rejected::Elsewhere(r) = &rejected {
            audit_detail.push_str(&format!(" previously_rejected={}", r.id));
        }
        audit(
            tx,
            ws,
            Some(&id),
            rev,
            actor,
            "store",
            None,
            Some(&sha),
            Some(&raw),
            Some(&audit_detail),
        )
        .map_err(&e)?;
        note_contribution(tx, ws, actor, &p.task_id, &id, now_ts).map_err(&e)?;
        let previously_rejected = match rejected {
            Rejected::Theirs(r) => Some(r),
            Rejected::No | Rejected::Elsewhere(_) => None,
        };
        let note = match &previously_rejected {
            Some(r) => format!(
                "A curator rejected this lesson on {}: {}. It waits for review marked \"previously rejected\"; unless the situation changed, do not rely on it.",
                r.at, r.reason
            ),
            None => String::new(),
        };
        Ok(StoreResponse {
            outcome: StoreOutcome::Created,
            id: Some(id),
            revision: rev,
            audience: new_card.summary.audience_sentence(),
            verified: None,
            note,
            store_id: None,
            previously_rejected,
        })
    }

    /// A store of a lesson the task can already see in card `m`: counted once per task
    /// as more evidence for it, and answered with that card.
    #[allow(clippy::too_many_arguments)]
    fn reinforce(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        actor: &str,
        task_id: &str,
        m: &Match,
        detail: &str,
        now_ts: Timestamp,
    ) -> Result<StoreResponse> {
        let e = self.err("store memory");
        let s = &m.row.summary;
        let verified = s.trust == Trust::Verified;
        let revision = current_revision(tx, ws).map_err(&e)?;
        let answer = |outcome| StoreResponse {
            outcome,
            id: Some(s.id),
            revision,
            audience: s.audience_sentence(),
            verified: Some(verified),
            note: repeat_note(&s.id, verified),
            store_id: None,
            previously_rejected: None,
        };
        // One reinforcement per (task, card): a task repeating itself (or repeating the
        // card it stored) is not more evidence.
        if !note_contribution(tx, ws, actor, task_id, &s.id, now_ts).map_err(&e)? {
            return Ok(answer(StoreOutcome::Unchanged));
        }
        tx.execute(
            "UPDATE cards SET pending_occurrence = pending_occurrence + 1, pending_last_seen = ?3
             WHERE workspace = ?1 AND id = ?2",
            params![ws, s.id.to_string(), stamp(now_ts)],
        )
        .map_err(&e)?;
        tx.execute(
            "UPDATE workspaces SET counters_dirty = 1 WHERE name = ?1",
            params![ws],
        )
        .map_err(&e)?;
        let sha = &m.row.sha256;
        audit(
            tx,
            ws,
            Some(&s.id),
            revision,
            actor,
            "reinforce",
            Some(sha),
            Some(sha),
            None,
            Some(&format!("{detail} score={:.2}", m.score)),
        )
        .map_err(&e)?;
        Ok(answer(StoreOutcome::Reinforced))
    }
}
