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
//!
//! The rows are the store's ([`crate::store`]); the per-token and per-task rates, kept in
//! memory, are the API's, which sees every request first.

use jiff::Timestamp;
use mop_cards::{Card, CardId, CardSummary, Provenance, Trust, is_scope_id};
use mop_intake::lesson::Lesson;
use mop_intake::secrets::Screen;
use mop_proto::sync::{RejectionNote, StoreOutcome, StoreRequest, StoreResponse};

use crate::store::db::Tx;
use crate::store::intake::{self, OnRejected, Tombstone};
use crate::store::memories::{Match, Storer};
use crate::store::{Result, Store, StoreError};

/// Bounds on agent stores that the store itself enforces (the per-token rate is kept in
/// memory by the API, which sees every request first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most stores one task (one node token and task id) may make.
    pub stores_per_task: u64,
}

/// A store checked, screened and fingerprinted ([`prepare`]), ready for its transaction.
#[derive(Debug, Clone)]
pub struct PreparedStore {
    req: StoreRequest,
    key: Option<String>,
    new_card: Card,
    lesson: Lesson,
    now: Timestamp,
}

impl PreparedStore {
    /// The storing task (checked by [`prepare`]).
    pub fn task(&self) -> &str {
        self.req.provenance.task_id.as_deref().unwrap_or_default()
    }
}

/// A store as it arrives ([`admit`]).
#[derive(Debug)]
pub enum Admission {
    /// Its idempotency key was seen: the first store's answer, and nothing changes.
    Repeat(StoreResponse),
    /// A store to make.
    Fresh(Box<PreparedStore>),
}

/// A store as it arrives, read only: the first answer again when its key was seen,
/// else the store checked, screened and fingerprinted. A refusal here costs no write (the
/// API asks this before it spends the token's store budget).
pub fn admit(
    store: &Store,
    ws: &str,
    actor: &str,
    req: &StoreRequest,
    key: Option<&str>,
) -> Result<Admission> {
    let task = req.provenance.task().map_err(invalid)?;
    if let Some(k) = key {
        let by = Storer { actor, task };
        if let Some(first) = store.read(|tx| first_answer(store, tx, ws, by, k))? {
            return Ok(Admission::Repeat(first));
        }
    }
    prepare(req, key).map(|p| Admission::Fresh(Box::new(p)))
}

/// Stores a card from a task, with no API in front: [`admit`], then [`commit`]. `actor` is
/// the node token's id; `key` the store's idempotency key, when the daemon sent one.
pub fn store_memory(
    store: &Store,
    ws: &str,
    req: &StoreRequest,
    actor: &str,
    limits: StoreLimits,
    key: Option<&str>,
) -> Result<StoreResponse> {
    match admit(store, ws, actor, req, key)? {
        Admission::Repeat(first) => Ok(first),
        Admission::Fresh(prepared) => commit(store, ws, &prepared, actor, limits),
    }
}

fn invalid(e: impl ToString) -> StoreError {
    StoreError::Invalid(e.to_string())
}

/// The answer kept under `key`; a key another task's store used is refused, never
/// answered.
fn first_answer(
    store: &Store,
    tx: &Tx<'_>,
    ws: &str,
    by: Storer<'_>,
    key: &str,
) -> Result<Option<StoreResponse>> {
    match store.kept_answer(tx, ws, by.actor, key)? {
        None => Ok(None),
        Some((owner, _)) if owner != by.task => Err(StoreError::Conflict(
            "the Idempotency-Key was used by another task's store; nothing was stored (send each store with a key of its own)".into(),
        )),
        Some((_, answer)) => Ok(answer),
    }
}

/// What a store can be judged on without the database: its fields checked, its text
/// screened for credentials, its lesson fingerprinted.
pub fn prepare(req: &StoreRequest, key: Option<&str>) -> Result<PreparedStore> {
    let p = &req.provenance;
    let c = &req.card;
    p.task().map_err(invalid)?;
    if key
        .is_some_and(|k| k.is_empty() || k.len() > 128 || !k.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(invalid(
            "the Idempotency-Key header must be 1 to 128 visible ASCII characters",
        ));
    }
    for (key, value) in [
        ("provenance.user_id", &p.user_id),
        ("provenance.asset_id", &p.asset_id),
        ("provenance.project_id", &p.project_id),
    ] {
        if value.as_deref().is_some_and(|v| !is_scope_id(v)) {
            return Err(invalid(format!(
                "{key} must be 1 to 128 characters with no control characters and no outer spaces"
            )));
        }
    }
    if p.imported_by.is_some() || p.imported_from.is_some() {
        // Only a curator's import names an importer; a host cannot claim one.
        return Err(invalid(
            "provenance.imported_by and imported_from are set by a curator's import, never by a store",
        ));
    }
    p.binds(&c.scope).map_err(invalid)?;
    let now = Timestamp::now();
    let new_card = new_card(req, now);
    new_card
        .validate()
        .map_err(|e| invalid(format!("card: {e}")))?;
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
        now,
    })
}

/// The card a store would create: a new id, unverified, with the task's provenance.
fn new_card(req: &StoreRequest, now: Timestamp) -> Card {
    let provenance = Some(req.provenance.clone());
    req.card
        .clone()
        .into_card(Trust::Unverified, provenance, now)
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

/// What a tombstone the lesson matched means for a store of task `p`.
fn judge_rejection(
    stone: Option<Tombstone>,
    p: &Provenance,
    on_rejected: OnRejected,
) -> Result<Rejected> {
    let Some(stone) = stone else {
        return Ok(Rejected::No);
    };
    // Named only to a task that could have seen the rejected card: another user's
    // rejected lesson is not theirs to learn of (the curators still see the mark).
    let theirs = stone.seen.by(&p.viewer());
    match (on_rejected, theirs) {
        (OnRejected::Refuse, true) => Err(StoreError::Rejected { note: stone.note }),
        (OnRejected::Queue, true) => Ok(Rejected::Theirs(stone.note)),
        (_, false) => Ok(Rejected::Elsewhere(stone.note)),
    }
}

/// Stores a prepared store: the idempotency key, the quota, rejections, and the same
/// lesson, in one transaction.
pub fn commit(
    store: &Store,
    ws: &str,
    prepared: &PreparedStore,
    actor: &str,
    limits: StoreLimits,
) -> Result<StoreResponse> {
    let by = Storer {
        actor,
        task: prepared.task(),
    };
    store.write(|tx| {
        store.open_workspace(tx, ws)?;
        if let Some(k) = prepared.key.as_deref()
            && let Some(first) = first_answer(store, tx, ws, by, k)?
        {
            return Ok(first);
        }
        // Count this store first; over the limit, the error rolls the whole transaction
        // back, so a refused store changes nothing.
        if store.count_store(tx, ws, by, prepared.now)? > limits.stores_per_task {
            return Err(StoreError::Limit(format!(
                "task {} has made {} stores, the most one task may make (limits.stores_per_task on the server); \
                 nothing was stored. Fold what is left into fewer, fuller cards, or ask a curator",
                by.task, limits.stores_per_task
            )));
        }
        let stone = store.rejected_lesson(tx, ws, &prepared.lesson)?;
        let on_rejected = store.intake_policy().on_rejected;
        let rejected = judge_rejection(stone, &prepared.req.provenance, on_rejected)?;
        let answer = decide(store, tx, ws, by, prepared, rejected)?;
        if let Some(k) = prepared.key.as_deref() {
            store.keep_answer(tx, ws, by, k, &answer)?;
        }
        Ok(answer)
    })
}

/// Verified cards first (what the agent should read), then the closest, then by id.
fn rank(matches: &mut [Match]) {
    matches.sort_by(|a, b| {
        (a.row.summary.trust != Trust::Verified)
            .cmp(&(b.row.summary.trust != Trust::Verified))
            .then(b.score.total_cmp(&a.score))
            .then(a.row.summary.id.cmp(&b.row.summary.id))
    });
}

/// Reinforce or create (see the module's comment), inside the store's transaction.
fn decide(
    store: &Store,
    tx: &Tx<'_>,
    ws: &str,
    by: Storer<'_>,
    prepared: &PreparedStore,
    rejected: Rejected,
) -> Result<StoreResponse> {
    let p = &prepared.req.provenance;
    let detail = format!("task={}", by.task);
    let mut matches = if let Rejected::Theirs(_) = rejected {
        // A lesson a curator turned down is not more evidence for anything: it goes to
        // the queue as itself.
        Vec::new()
    } else {
        // A rejection elsewhere changes nothing the task can observe (the answer would
        // otherwise tell it that someone's rejected lesson matches its guess).
        store.same_lesson_cards(tx, ws, &prepared.lesson)?
    };
    rank(&mut matches);
    let visible = |s: &CardSummary| s.is_visible_to(&p.viewer());
    if let Some(m) = matches.iter().find(|m| visible(&m.row.summary)) {
        return reinforce(store, tx, ws, by, m, &detail, prepared.now);
    }
    // The same lesson as cards the task cannot see: grouped for the curators, never named
    // to the agent.
    let group_with = matches.first().map(|m| m.row.summary.id);
    let mut audit_detail = detail;
    if let Some(other) = group_with {
        audit_detail.push_str(&format!(" duplicate_of={other}"));
    }
    if let Rejected::Theirs(r) | Rejected::Elsewhere(r) = &rejected {
        audit_detail.push_str(&format!(" previously_rejected={}", r.id));
    }
    let card = &prepared.new_card;
    let rev = store.insert_stored(
        tx,
        ws,
        by,
        card,
        group_with.as_ref(),
        &audit_detail,
        prepared.now,
    )?;
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
        id: Some(card.summary.id),
        revision: rev,
        audience: card.summary.audience_sentence(),
        verified: None,
        note,
        store_id: None,
        previously_rejected,
    })
}

/// A store of a lesson the task can already see in card `m`: counted once per task as
/// more evidence for it (a task repeating itself, or the card it stored, is not more
/// evidence), and answered with that card.
fn reinforce(
    store: &Store,
    tx: &Tx<'_>,
    ws: &str,
    by: Storer<'_>,
    m: &Match,
    detail: &str,
    now: Timestamp,
) -> Result<StoreResponse> {
    let s = &m.row.summary;
    let verified = s.trust == Trust::Verified;
    let revision = store.revision_in(tx, ws)?;
    let detail = format!("{detail} score={:.2}", m.score);
    let outcome = if store.add_evidence(tx, ws, by, m, &detail, now)? {
        StoreOutcome::Reinforced
    } else {
        StoreOutcome::Unchanged
    };
    Ok(StoreResponse {
        outcome,
        id: Some(s.id),
        revision,
        audience: s.audience_sentence(),
        verified: Some(verified),
        note: repeat_note(&s.id, verified),
        store_id: None,
        previously_rejected: None,
    })
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
