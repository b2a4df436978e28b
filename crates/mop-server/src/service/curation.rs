//! What a curator's action does to a card: create and update from OKF text, the state
//! changes (disable, enable, verify, supersede, archive, unarchive), verify with edits,
//! reject and merge. The one place for their rules:
//! - text a curator writes is valid OKF, keeps the id it is sent to, and carries no
//!   credential unless the curator allowed this card (audited, kinds only);
//! - an archived card is unarchived before its text changes;
//! - a card is superseded only by another card that is itself live;
//! - a rejection says why, on one line, and leaves a tombstone of the lesson;
//! - a merge moves counters once (never from a card already merged or archived), the card
//!   that stays keeps the lesson with the tasks that had it, and a merge into an unverified
//!   card (which only its author's tasks see) verifies it in the same action or is refused;
//! - a duplicate group becomes one card only as the curator read it: the same waiting
//!   cards, the card that stays at the version read, verified, every merge checked as one;
//! - a revert restores a text the card's own history kept, screened as a curator's write,
//!   and leaves where the card stands (trust, enabled, superseded, provenance) as it is.
//!
//! Each action is one transaction (the store's), conditional on the card's version when the
//! caller sends one ([`Expect`]), with its audit rows; the rows are the store's.

use mop_cards::{Card, CardId, Trust, parse_card, render_card};
use mop_proto::curation::{
    BulkAction, BulkAnswer, BulkItem, BulkRequest, CardInfo, CombineRequest, FieldsRequest,
};
use mop_proto::sync::NewCard;

use crate::store::cards::{Row, screen_admin};
use crate::store::db::Tx;
use crate::store::{CardChange, Expect, Result, Store, StoreError, now};

/// Longest reason a rejection may give.
const MAX_REASON: usize = 500;

/// A state change a curator can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CardState {
    /// Take the card out of every task (`enabled: false`).
    Disable,
    /// Put a disabled card back.
    Enable,
    /// A person vouches for the card (`trust: verified`); it then reaches every task its
    /// scope allows, not only its author's.
    Verify,
    /// Replaced by a newer card.
    Supersede(CardId),
    /// Soft delete: out of the manifest now, purged after the archive retention.
    Archive,
    /// Undo an archive before the purge.
    Unarchive,
    /// A curator turns an (agent-written) card down: archived like [`CardState::Archive`],
    /// recorded as a rejection with its reason.
    Reject,
}

impl CardState {
    /// What the card's history calls it.
    fn action(self) -> &'static str {
        match self {
            CardState::Disable => "disable",
            CardState::Enable => "enable",
            CardState::Verify => "verify",
            CardState::Supersede(_) => "supersede",
            CardState::Archive => "archive",
            CardState::Unarchive => "unarchive",
            CardState::Reject => "reject",
        }
    }

    /// Whether the change is to the archive state only (the text stays byte for byte).
    fn archive_only(self) -> bool {
        matches!(
            self,
            CardState::Archive | CardState::Unarchive | CardState::Reject
        )
    }
}

fn invalid(field: &str, rule: &str) -> StoreError {
    StoreError::Invalid(format!("{field} {rule}"))
}

/// Curator text, parsed; `context` says which text in the error.
fn parse(raw: &[u8], context: &str) -> Result<Card> {
    parse_card(raw).map_err(|e| StoreError::Invalid(format!("{context} is not valid OKF: {e}")))
}

/// The card ids a curator allowed to carry credentials: this one, or none.
fn allowed(id: &CardId, allow_credentials: bool) -> &[CardId] {
    if allow_credentials {
        std::slice::from_ref(id)
    } else {
        &[]
    }
}

/// Text sent to card `id` must name `id`; `what` names the text, `then` what to do.
fn same_id(card: &Card, id: &CardId, what: &str, then: &str) -> Result<()> {
    if card.summary.id == *id {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "the {what} has id {} but the request names {id}{then}",
        card.summary.id
    )))
}

/// Creates a card from OKF text; the id comes from the text. A card that carries a
/// credential is refused unless `allow_credentials` (audited). An id that one of
/// `composed_with` holds (server.toml `[inheritance]`) is refused: in a generation that
/// composes the two workspaces one card would hide the other.
pub fn create_card(
    store: &Store,
    ws: &str,
    raw: &[u8],
    actor: &str,
    allow_credentials: bool,
    composed_with: &[String],
) -> Result<CardChange> {
    let card = parse(raw, "card")?;
    let id = card.summary.id;
    let detail = screen_admin(raw, &id, allowed(&id, allow_credentials))?;
    store.write(|tx| {
        if let Some(other) = store.id_held_in(tx, composed_with, &id)? {
            return Err(crate::store::cards::id_taken(&id, &other));
        }
        store.insert_card(tx, ws, &card, raw, actor, ("create", detail.as_deref()))
    })
}

/// Creates a card from fields (a curator's form or flags): the server gives it a new id;
/// a person wrote it, so it is verified. The fields are checked as its OKF text would be.
pub fn create_from_fields(
    store: &Store,
    ws: &str,
    fields: NewCard,
    actor: &str,
    allow_credentials: bool,
) -> Result<CardChange> {
    let card = fields.into_card(Trust::Verified, None, jiff::Timestamp::now());
    let raw = render_card(&card).into_bytes();
    // A new id: nothing else holds it.
    create_card(store, ws, &raw, actor, allow_credentials, &[])
}

/// Replaces a card's text; server counters are kept. Text that carries a credential is
/// refused unless `allow_credentials` (audited).
pub fn update_card(
    store: &Store,
    ws: &str,
    id: &CardId,
    raw: &[u8],
    actor: &str,
    expect: Expect<'_>,
    allow_credentials: bool,
) -> Result<CardChange> {
    let card = parse(raw, "card")?;
    same_id(&card, id, "card text", "")?;
    let detail = screen_admin(raw, id, allowed(id, allow_credentials))?;
    store.write(|tx| {
        replace_text(
            store,
            tx,
            ws,
            &card,
            raw,
            actor,
            expect,
            ("update", detail.as_deref()),
        )
    })
}

/// Writes curator text over a card that is not archived; what an update and a verify with
/// edits share.
#[allow(clippy::too_many_arguments)]
fn replace_text(
    store: &Store,
    tx: &Tx<'_>,
    ws: &str,
    card: &Card,
    raw: &[u8],
    actor: &str,
    expect: Expect<'_>,
    audit: (&str, Option<&str>),
) -> Result<CardChange> {
    let id = &card.summary.id;
    let row = store.card_row(tx, ws, id)?;
    expect.check(id, &row)?;
    if row.archived_at.is_some() {
        return Err(StoreError::Conflict(format!(
            "card {id} is archived; unarchive it before changing it"
        )));
    }
    store.rewrite_card(tx, ws, &row, card, raw, None, actor, audit)
}

/// Disables, enables, verifies, supersedes, archives or unarchives a card; `reason`, when
/// given, goes in its history.
pub fn set_state(
    store: &Store,
    ws: &str,
    id: &CardId,
    state: CardState,
    reason: Option<&str>,
    actor: &str,
    expect: Expect<'_>,
) -> Result<CardChange> {
    let reason = reason.map(check_reason).transpose()?;
    store.write(|tx| set_state_in(store, tx, ws, id, state, actor, expect, reason))
}

/// [`set_state`] inside a transaction, with an optional detail for the audit row (a
/// rejection's reason, say).
#[allow(clippy::too_many_arguments)]
fn set_state_in(
    store: &Store,
    tx: &Tx<'_>,
    ws: &str,
    id: &CardId,
    state: CardState,
    actor: &str,
    expect: Expect<'_>,
    reason: Option<&str>,
) -> Result<CardChange> {
    let row = store.card_row(tx, ws, id)?;
    expect.check(id, &row)?;
    let raw = store.card_object(tx, ws, &row)?;
    let mut card = parse(&raw, "the stored card")?;
    let mut archived_at = row.archived_at.clone();
    let mut detail = reason.map(str::to_owned);
    match state {
        CardState::Disable => card.summary.enabled = false,
        CardState::Enable => card.summary.enabled = true,
        CardState::Verify => card.summary.trust = Trust::Verified,
        CardState::Supersede(by) => {
            let newer = store.find_row(tx, ws, &by)?;
            check_superseder(ws, id, by, newer.as_ref())?;
            card.summary.superseded_by = Some(by);
            detail = Some(format!("superseded_by={by}"));
        }
        CardState::Archive | CardState::Reject => {
            archived_at = Some(row.archived_at.clone().unwrap_or_else(now))
        }
        CardState::Unarchive => archived_at = None,
    }
    let new_raw = if state.archive_only() {
        raw
    } else {
        render_card(&card).into_bytes()
    };
    store.rewrite_card(
        tx,
        ws,
        &row,
        &card,
        &new_raw,
        archived_at.as_deref(),
        actor,
        (state.action(), detail.as_deref()),
    )
}

/// A card is superseded only by another card (`newer`, the row of `by`) that is live.
fn check_superseder(ws: &str, id: &CardId, by: CardId, newer: Option<&Row>) -> Result<()> {
    if by == *id {
        return Err(StoreError::Invalid("a card cannot supersede itself".into()));
    }
    let newer = newer.ok_or_else(|| {
        StoreError::Invalid(format!("superseding card {by} not found in workspace {ws}"))
    })?;
    if !newer.summary.is_live() || newer.archived_at.is_some() {
        return Err(StoreError::Invalid(format!(
            "superseding card {by} is disabled, superseded or archived itself"
        )));
    }
    Ok(())
}

/// Verifies a card, after replacing its text with `edited` when given (the edit must keep
/// the card's id). One audit row says both. A card whose text carries a credential is
/// refused (a verify would send it to every task) unless `allow_credentials`.
pub fn verify(
    store: &Store,
    ws: &str,
    id: &CardId,
    edited: Option<&[u8]>,
    actor: &str,
    expect: Expect<'_>,
    allow_credentials: bool,
) -> Result<CardChange> {
    let allow = allowed(id, allow_credentials);
    let Some(raw) = edited else {
        return store.write(|tx| verify_in(store, tx, ws, id, allow, actor, expect, None));
    };
    let mut card = parse(raw, "edited card")?;
    same_id(&card, id, "edited text", "; keep the id")?;
    card.summary.trust = Trust::Verified;
    let new_raw = render_card(&card).into_bytes();
    let detail = match screen_admin(&new_raw, id, allow)? {
        Some(allowed) => format!("with edits; {allowed}"),
        None => "with edits".to_owned(),
    };
    store.write(|tx| {
        let audit = ("verify", Some(detail.as_str()));
        replace_text(store, tx, ws, &card, &new_raw, actor, expect, audit)
    })
}

/// Verifies card `id` as it stands, inside a transaction: the text screened (credentials
/// only where `allow` names the card) is the text verified; `why` starts the audit detail.
#[allow(clippy::too_many_arguments)]
fn verify_in(
    store: &Store,
    tx: &Tx<'_>,
    ws: &str,
    id: &CardId,
    allow: &[CardId],
    actor: &str,
    expect: Expect<'_>,
    why: Option<&str>,
) -> Result<CardChange> {
    let row = store.card_row(tx, ws, id)?;
    let current = store.card_object(tx, ws, &row)?;
    let allowed = screen_admin(&current, id, allow)?;
    let detail = match (why, allowed) {
        (Some(w), Some(a)) => Some(format!("{w}; {a}")),
        (w, a) => a.or(w.map(str::to_owned)),
    };
    let state = CardState::Verify;
    set_state_in(store, tx, ws, id, state, actor, expect, detail.as_deref())
}

/// Rejects card `id` inside a transaction with a checked `reason`: archived, the reason in
/// its history, and a tombstone of its lesson.
fn reject_in(
    store: &Store,
    tx: &Tx<'_>,
    ws: &str,
    id: &CardId,
    reason: &str,
    actor: &str,
    expect: Expect<'_>,
) -> Result<CardChange> {
    let row = store.card_row(tx, ws, id)?;
    let detail = format!("reason={reason}");
    let state = CardState::Reject;
    let change = set_state_in(store, tx, ws, id, state, actor, expect, Some(&detail))?;
    if change.changed {
        store.keep_tombstone(tx, ws, id, &row.summary, reason, actor)?;
    }
    Ok(change)
}

/// Keeps a card agents flagged as it is, with the curator's reason when given (checked as
/// a rejection's is), at the version the curator decided on.
pub fn keep(
    store: &Store,
    ws: &str,
    id: &CardId,
    reason: Option<&str>,
    actor: &str,
    expect: Expect<'_>,
) -> Result<CardChange> {
    let reason = reason.map(check_reason).transpose()?;
    store.keep_card(ws, id, reason, actor, expect)
}

/// A rejection's reason, trimmed: 1 to [`MAX_REASON`] characters on one line.
fn check_reason(reason: &str) -> Result<&str> {
    let reason = reason.trim();
    if reason.is_empty()
        || reason.chars().count() > MAX_REASON
        || reason.chars().any(char::is_control)
    {
        return Err(invalid(
            "reason",
            &format!("must be 1 to {MAX_REASON} characters on one line (say why)"),
        ));
    }
    Ok(reason)
}

/// Rejects a card: archives it (out of every task now, purged after the archive retention)
/// with the curator's reason in its history, and keeps a tombstone of its lesson
/// (fingerprint, reason, curator; no text) that outlives the purge: a later store of the
/// same lesson is refused with the reason (or queued marked, as configured).
pub fn reject(
    store: &Store,
    ws: &str,
    id: &CardId,
    reason: &str,
    actor: &str,
    expect: Expect<'_>,
) -> Result<CardChange> {
    let reason = check_reason(reason)?;
    store.write(|tx| reject_in(store, tx, ws, id, reason, actor, expect))
}

/// Reverts card `id` to the text its history row `seq` kept: one conditional write (a
/// concurrent edit answers 412 and changes nothing), audited as `revert` with the row.
pub fn revert(
    store: &Store,
    ws: &str,
    id: &CardId,
    seq: i64,
    actor: &str,
    expect: Expect<'_>,
) -> Result<CardChange> {
    store.write(|tx| {
        let text = store.version_text(tx, ws, id, seq)?.ok_or_else(|| {
            StoreError::NotFound(format!(
                "card {id} has no version {seq} in its history (mop-curate history {id} lists them)"
            ))
        })?;
        let text = text.ok_or_else(|| {
            invalid(
                "seq",
                &format!("{seq} kept no text of card {id} (an action without one, or purged); pick a version that shows text in its history"),
            )
        })?;
        let raw = text.into_bytes();
        let mut card = parse(&raw, "that version")?;
        same_id(&card, id, "text of that version", "")?;
        // A revert restores what the card says, not where it stands: its trust, whether it
        // is enabled or superseded and its provenance stay as they are (the state actions
        // and their rules decide those), and it may not take the card from tasks that
        // have it now.
        let row = store.card_row(tx, ws, id)?;
        let now = parse(&store.card_object(tx, ws, &row)?, "the stored card")?.summary;
        if !keeps_reach(&card.summary, &now) {
            return Err(invalid(
                "seq",
                &format!("{seq} binds card {id} to another user or asset than it has now, so tasks that have it would lose it; change its scope with an edit instead"),
            ));
        }
        let s = &card.summary;
        let same_standing = s.trust == now.trust
            && s.enabled == now.enabled
            && s.superseded_by == now.superseded_by
            && s.provenance == now.provenance;
        let raw = if same_standing {
            raw
        } else {
            card.summary.trust = now.trust;
            card.summary.enabled = now.enabled;
            card.summary.superseded_by = now.superseded_by;
            card.summary.provenance = now.provenance;
            render_card(&card).into_bytes()
        };
        let detail = match screen_admin(&raw, id, &[])? {
            Some(allowed) => format!("to version {seq}; {allowed}"),
            None => format!("to version {seq}"),
        };
        let audit = ("revert", Some(detail.as_str()));
        replace_text(store, tx, ws, &card, &raw, actor, expect, audit)
    })
}

/// Sets a card's fields (type, labels, scope, importance) and keeps its text: one
/// conditional write, audited as `fields` with the names of the fields that changed.
pub fn set_fields(
    store: &Store,
    ws: &str,
    id: &CardId,
    req: &FieldsRequest,
    actor: &str,
    expect: Expect<'_>,
) -> Result<CardChange> {
    store.write(|tx| {
        let row = store.card_row(tx, ws, id)?;
        let raw = store.card_object(tx, ws, &row)?;
        let mut card = parse(&raw, "the stored card")?;
        let s = &mut card.summary;
        let mut changed = Vec::new();
        if let Some(t) = req.card_type
            && t != s.card_type
        {
            s.card_type = t;
            changed.push("type");
        }
        if let Some(labels) = &req.labels {
            // Each label once, in the order given.
            let mut seen = std::collections::HashSet::new();
            let labels: Vec<String> = labels.iter().filter(|l| seen.insert(*l)).cloned().collect();
            if labels != s.labels {
                s.labels = labels;
                changed.push("labels");
            }
        }
        if let Some(scope) = &req.scope
            && *scope != s.scope
        {
            s.scope = scope.clone();
            changed.push("scope");
        }
        if let Some(i) = req.importance
            && i != s.importance
        {
            s.importance = i;
            changed.push("importance");
        }
        card.validate()
            .map_err(|e| StoreError::Invalid(format!("card {id}: {e}")))?;
        let raw = if changed.is_empty() {
            raw
        } else {
            render_card(&card).into_bytes()
        };
        let detail = changed.join(",");
        let audit = ("fields", Some(detail.as_str()));
        replace_text(store, tx, ws, &card, &raw, actor, expect, audit)
    })
}

/// A bulk action (see [`BulkRequest`]): the preview, or the action on every match in one
/// transaction, one audit row per card.
pub fn bulk(store: &Store, ws: &str, req: &BulkRequest, actor: &str) -> Result<BulkAnswer> {
    let reason = match req.action {
        BulkAction::Reject => Some(check_reason(req.reason.as_deref().unwrap_or(""))?),
        _ => None,
    };
    let label = match req.action {
        BulkAction::Label => Some(req.label.as_deref().map(str::trim).unwrap_or("")),
        _ => None,
    };
    if label.is_some_and(|l| !mop_cards::is_scope_id(l) || l.contains(char::is_whitespace)) {
        return Err(invalid(
            "label",
            "must be one word of 1 to 128 characters (what a card's labels hold)",
        ));
    }
    let f = &req.filter;
    if f.q.is_some() || f.offset.is_some() || f.limit.is_some() {
        return Err(invalid(
            "filter",
            "takes no search text (q) and no paging (offset, limit): a bulk action acts on every card the filters match",
        ));
    }
    let items = |matched: &[CardInfo]| -> Vec<BulkItem> {
        matched
            .iter()
            .map(|c| BulkItem {
                id: c.summary.id,
                card_type: c.summary.card_type,
                title: c.summary.title.clone(),
            })
            .collect()
    };
    let Some(confirm) = &req.confirm else {
        let cards = items(&store.read(|tx| store.matching_in(tx, ws, f))?);
        return Ok(BulkAnswer {
            cards,
            done: false,
            revision: None,
        });
    };
    let (cards, revision) = store.write(|tx| {
        // Matched again inside the transaction that acts: exactly the cards the curator
        // saw, or nothing.
        let cards = items(&store.matching_in(tx, ws, f)?);
        let now: Vec<CardId> = cards.iter().map(|c| c.id).collect();
        let mut seen = confirm.clone();
        seen.sort();
        if now != seen {
            return Err(StoreError::Conflict(format!(
                "{} card(s) match now, not the {} the preview showed; nothing was changed: preview again",
                now.len(),
                seen.len()
            )));
        }
        let mut revision = None;
        for c in &cards {
            let id = &c.id;
            let change = match req.action {
                BulkAction::Verify => verify_in(store, tx, ws, id, &[], actor, Expect::Any, None)?,
                BulkAction::Reject => {
                    let why = reason.unwrap_or_default();
                    reject_in(store, tx, ws, id, why, actor, Expect::Any)?
                }
                BulkAction::Label => {
                    let row = store.card_row(tx, ws, id)?;
                    let mut card = parse(&store.card_object(tx, ws, &row)?, "the stored card")?;
                    let label = label.unwrap_or_default().to_owned();
                    if !card.summary.labels.contains(&label) {
                        card.summary.labels.push(label);
                    }
                    let raw = render_card(&card).into_bytes();
                    // Checked as the card's OKF text would be.
                    let card = parse(&raw, "the labelled card")?;
                    let audit = ("update", Some("label added in bulk"));
                    replace_text(store, tx, ws, &card, &raw, actor, Expect::Any, audit)?
                }
            };
            revision = Some(change.revision);
        }
        Ok((cards, revision))
    })?;
    Ok(BulkAnswer {
        cards,
        done: true,
        revision,
    })
}

/// Whether merging card `f` into `t` keeps the lesson with the tasks that had it. A
/// verified card reached every task its scope binds, so `t` may bind no other user or
/// asset. An unverified draft reached only its author's tasks, so `t` must still reach the
/// author (another user's card would hide it from them); which asset the lesson belongs to
/// is the curator's call, as a verify with edits may bind a draft to one.
fn keeps_reach(t: &mop_cards::CardSummary, f: &mop_cards::CardSummary) -> bool {
    let author = f.provenance.as_ref().and_then(|p| p.user_id.as_ref());
    let draft = f.trust == Trust::Unverified;
    let f_user = f.scope.user_id.as_ref().or(author.filter(|_| draft));
    let user = t.scope.user_id.as_ref().is_none_or(|u| Some(u) == f_user);
    let asset = draft
        || t.scope
            .asset_id
            .as_ref()
            .is_none_or(|a| Some(a) == f.scope.asset_id.as_ref());
    user && asset
}

/// Whether card `id` (its row `from`) may be merged into `into` (its row `target`);
/// `verifying`: the curator verifies `into` in the same action.
fn check_merge(
    id: &CardId,
    from: &Row,
    into: &CardId,
    target: &Row,
    verifying: bool,
) -> Result<()> {
    // Counters move once: a card merged (or superseded, or archived) already has nothing
    // left to give, and a retry must not count it twice.
    if let Some(by) = from.summary.superseded_by {
        return Err(StoreError::Conflict(format!(
            "card {id} is already superseded by {by}; nothing was merged"
        )));
    }
    if from.archived_at.is_some() {
        return Err(StoreError::Conflict(format!(
            "card {id} is archived; unarchive it to merge it"
        )));
    }
    // An unverified card reaches only its author's tasks: folding a lesson into it would
    // hide the lesson from every other task that had it.
    let (f, t) = (&from.summary, &target.summary);
    if t.trust == Trust::Unverified && !verifying {
        return Err(invalid(
            "into",
            &format!(
                "names an unverified card, which only its author's tasks see; read and verify {into} first, or in the same action (mop-curate merge --verify), or merge into a verified card"
            ),
        ));
    }
    // The card that stays must keep the lesson with the tasks that had it.
    if !keeps_reach(t, f) {
        return Err(invalid(
            "into",
            &format!(
                "names a card with a narrower scope than {id} (another or an extra user or asset binding); its tasks would lose the card"
            ),
        ));
    }
    Ok(())
}

/// Merges card `id` into `into`: `id` is superseded by `into`, and `into` takes over its
/// counters (occurrence added, the later last-seen kept). Both cards' histories record it.
/// `verify`: an unverified `into` is verified in the same action, if it is still at the
/// version the curator read (`Some(tag)`; its text screened as a verify's), which a merge
/// into an unverified card needs.
pub fn merge(
    store: &Store,
    ws: &str,
    id: &CardId,
    into: &CardId,
    verify: Option<&str>,
    actor: &str,
    expect: Expect<'_>,
) -> Result<CardChange> {
    if id == into {
        return Err(invalid(
            "into",
            "must name another card, not the card itself",
        ));
    }
    store.write(|tx| {
        let from = store.card_row(tx, ws, id)?;
        let mut target = store.find_row(tx, ws, into)?.ok_or_else(|| {
            StoreError::Invalid(format!("into: card {into} not found in workspace {ws}"))
        })?;
        let verify = verify.filter(|_| target.summary.trust == Trust::Unverified);
        check_merge(id, &from, into, &target, verify.is_some())?;
        if let Some(tag) = verify {
            // What the curator read is what becomes workspace memory.
            Expect::IfMatch(tag).check(into, &target)?;
            let why = format!("in the merge of {id}");
            verify_in(store, tx, ws, into, &[], actor, Expect::Any, Some(&why))?;
            target = store.card_row(tx, ws, into)?;
        }
        let detail = format!("merged into {into}");
        let state = CardState::Supersede(*into);
        let result = set_state_in(store, tx, ws, id, state, actor, expect, Some(&detail))?;
        store.move_counters(tx, ws, (id, &from), (into, &target), result.revision, actor)?;
        Ok(result)
    })
}

/// Makes duplicate group `group` one card (see [`CombineRequest`]): `into` stays,
/// verified, with the curator's text when given, and every other waiting card of the group
/// is merged into it (counters moved once, each merged card's provenance kept on its row).
/// One transaction: a group whose waiting cards are no longer those the curator read, an
/// `into` at another version, or any merge that would narrow a card's reach changes
/// nothing.
pub fn combine(
    store: &Store,
    ws: &str,
    group: &str,
    req: &CombineRequest,
    actor: &str,
) -> Result<CardChange> {
    let into = &req.into;
    let why = format!("in the combination of group {group}");
    let edited = match &req.text {
        None => None,
        Some(text) => {
            let mut card = parse(text.as_bytes(), "the combined text")?;
            same_id(
                &card,
                into,
                "combined text",
                "; keep the id of the card that stays",
            )?;
            card.summary.trust = Trust::Verified;
            Some(card)
        }
    };
    store.write(|tx| {
        let mut waiting = store
            .group_waiting(tx, ws, group)?
            .ok_or_else(|| StoreError::NotFound(format!("group {group} not found in workspace {ws}")))?;
        let mut seen = req.variants.clone();
        seen.sort();
        seen.dedup();
        let mut sorted = waiting.clone();
        sorted.sort();
        if sorted != seen {
            return Err(StoreError::Conflict(format!(
                "group {group} changed since you read it: {} of its cards wait for review now, you saw {}; nothing changed: reload the group and decide again",
                sorted.len(),
                seen.len()
            )));
        }
        if waiting.is_empty() {
            return Err(StoreError::Conflict(format!(
                "group {group} has no card waiting for review; nothing to combine"
            )));
        }
        let target = store.find_row(tx, ws, into)?.ok_or_else(|| {
            StoreError::Invalid(format!("into: card {into} not found in workspace {ws}"))
        })?;
        Expect::IfMatch(&req.into_version).check(into, &target)?;
        if !target.summary.is_live() || target.archived_at.is_some() {
            return Err(invalid(
                "into",
                &format!("names card {into}, which is disabled, superseded or archived; pick a live card"),
            ));
        }
        let mut revision = match &edited {
            Some(card) => {
                let raw = render_card(card).into_bytes();
                let detail = match screen_admin(&raw, into, &[])? {
                    Some(allowed) => format!("with edits {why}; {allowed}"),
                    None => format!("with edits {why}"),
                };
                let action = if target.summary.trust == Trust::Unverified { "verify" } else { "update" };
                replace_text(store, tx, ws, card, &raw, actor, Expect::Any, (action, Some(&detail)))?
                    .revision
            }
            None if target.summary.trust == Trust::Unverified => {
                verify_in(store, tx, ws, into, &[], actor, Expect::Any, Some(&why))?.revision
            }
            None => 0,
        };
        waiting.retain(|id| id != into);
        for id in &waiting {
            let from = store.card_row(tx, ws, id)?;
            let target = store.card_row(tx, ws, into)?;
            check_merge(id, &from, into, &target, false)?;
            let detail = format!("merged into {into} {why}");
            let state = CardState::Supersede(*into);
            revision = set_state_in(store, tx, ws, id, state, actor, Expect::Any, Some(&detail))?
                .revision;
            store.move_counters(tx, ws, (id, &from), (into, &target), revision, actor)?;
        }
        let kept = store.card_row(tx, ws, into)?;
        Ok(crate::store::cards::change(*into, revision, Some(kept.sha256), false, true))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A card row of `id` with `trust` and optional user binding, as the store loads one.
    fn row(id: &str, extra: &str) -> Row {
        let text = format!("---\nid: {id}\ntype: fact\ntitle: T\n{extra}---\nBody.\n");
        let summary = parse_card(text.as_bytes())
            .expect("test card parses")
            .summary;
        Row {
            summary,
            sha256: "0".repeat(64),
            occurrence: 1,
            last_seen: None,
            archived_at: None,
        }
    }

    const A: &str = "1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7";
    const B: &str = "2528fa6d-2786-4c33-9e4e-a2e4e84ca7d7";

    fn id(s: &str) -> CardId {
        CardId::parse(s).unwrap()
    }

    #[test]
    fn the_card_that_stays_keeps_the_lesson_with_the_tasks_that_had_it() {
        let verified = row(A, "trust: verified\n");
        let curated = row(B, "trust: verified\n");
        // Control: verified into verified, same (workspace) scope.
        assert!(check_merge(&id(A), &verified, &id(B), &curated, false).is_ok());
        // Into a card bound to one user: the rest of the workspace would lose it.
        let bound = row(B, "trust: verified\nscope:\n  user_id: alice\n");
        let err = check_merge(&id(A), &verified, &id(B), &bound, false).unwrap_err();
        assert!(matches!(err, StoreError::Invalid(m) if m.contains("narrower scope")));
        // An agent's draft reached its author's tasks: a card bound to that author still
        // reaches them, one bound to another user does not.
        let alices = row(A, "trust: unverified\nprovenance:\n  user_id: alice\n");
        assert!(check_merge(&id(A), &alices, &id(B), &curated, false).is_ok());
        assert!(check_merge(&id(A), &alices, &id(B), &bound, false).is_ok());
        let bobs = row(B, "trust: verified\nscope:\n  user_id: bob\n");
        assert!(check_merge(&id(A), &alices, &id(B), &bobs, false).is_err());
        // A verified workspace card does not shrink to one asset's tasks; an agent's draft
        // may be placed on the asset it is about (the curator's call).
        let on_db1 = row(B, "trust: verified\nscope:\n  asset_id: db-1\n");
        assert!(check_merge(&id(A), &verified, &id(B), &on_db1, false).is_err());
        assert!(check_merge(&id(A), &alices, &id(B), &on_db1, false).is_ok());
    }

    #[test]
    fn a_merge_into_an_unverified_card_verifies_it_or_is_refused() {
        let alices = row(A, "trust: unverified\nprovenance:\n  user_id: alice\n");
        let bobs_draft = row(B, "trust: unverified\nprovenance:\n  user_id: bob\n");
        let err = check_merge(&id(A), &alices, &id(B), &bobs_draft, false).unwrap_err();
        assert!(matches!(err, StoreError::Invalid(m) if m.contains("verify")));
        // The curator verifies it in the same action: the merge goes through.
        assert!(check_merge(&id(A), &alices, &id(B), &bobs_draft, true).is_ok());
        let verified = row(A, "trust: verified\n");
        assert!(check_merge(&id(A), &verified, &id(B), &bobs_draft, false).is_err());
        assert!(check_merge(&id(A), &verified, &id(B), &bobs_draft, true).is_ok());
    }

    #[test]
    fn counters_move_once() {
        let target = row(B, "trust: verified\n");
        let mut archived = row(A, "");
        archived.archived_at = Some("2026-01-01T00:00:00.000000Z".into());
        let err = check_merge(&id(A), &archived, &id(B), &target, false).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)));
        let mut merged = row(A, "");
        merged.summary.superseded_by = Some(id(B));
        let err = check_merge(&id(A), &merged, &id(B), &target, false).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)));
    }

    #[test]
    fn only_a_live_card_supersedes() {
        let newer = row(B, "");
        assert!(check_superseder("w", &id(A), id(B), Some(&newer)).is_ok());
        assert!(check_superseder("w", &id(A), id(A), Some(&newer)).is_err());
        assert!(check_superseder("w", &id(A), id(B), None).is_err());
        let mut gone = row(B, "");
        gone.archived_at = Some("2026-01-01T00:00:00.000000Z".into());
        assert!(check_superseder("w", &id(A), id(B), Some(&gone)).is_err());
        let disabled = row(B, "enabled: false\n");
        assert!(check_superseder("w", &id(A), id(B), Some(&disabled)).is_err());
    }

    #[test]
    fn a_rejection_says_why_on_one_line() {
        assert_eq!(
            check_reason("  duplicate of the runbook ").unwrap(),
            "duplicate of the runbook"
        );
        assert!(check_reason("   ").is_err());
        assert!(check_reason("two\nlines").is_err());
        assert!(check_reason(&"x".repeat(MAX_REASON)).is_ok());
        assert!(check_reason(&"x".repeat(MAX_REASON + 1)).is_err());
    }
}
