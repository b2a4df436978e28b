//! Stores from agent tasks (`POST /memories`), with save-time dedup.
//!
//! The daemon asserts the task's provenance; the server records it, with the node token as
//! actor, and refuses a card bound to any other user or asset. Dedup compares only with
//! cards that task could see (the same hard exclusions as task selection):
//! - an equal card (same type, title and body, ignoring case and spacing of the title and
//!   spacing of the body) is *reinforced*: counters only, published in the next batch;
//! - otherwise the author's own unverified card with the same type and title is *extended*
//!   with the new text;
//! - otherwise a new unverified card is *created*. Agent text never rewrites a verified card.
//!
//! Stores are bounded: a task without a user is nobody's author and its stores are
//! refused; each (node token, task) may store at most `limits.stores_per_task` times; and a
//! task reinforces a card at most once (a repeat is answered `unchanged`). A refusal
//! changes nothing. Every answer says who will see the card.

use super::db::{Tx, params};
use jiff::Timestamp;
use mop_cards::{
    Card, CardId, CardSummary, Counters, Extra, Provenance, Trust, is_scope_id, is_task_id,
    parse_card, render_card,
};
use mop_proto::sync::{StoreOutcome, StoreRequest, StoreResponse};

use super::cards::{Kept, audit, current_revision, load_object, title_key, write_card};
use super::{Result, Store, StoreError, bump, db, ensure_workspace, stamp};

fn body_key(body: &str) -> String {
    body.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Records that a task (a node token's task id) contributed to a card: created, extended
/// or reinforced it. False when it had already, so its repeat counts for nothing.
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

fn merge(into: &mut Vec<String>, from: &[String]) {
    for item in from {
        if !into.contains(item) {
            into.push(item.clone());
        }
    }
}

/// Bounds on agent stores that the store itself enforces (the per-token rate is kept in
/// memory by the API, which sees every request first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most stores one task (one node token and task id) may make.
    pub stores_per_task: u64,
}

impl Store {
    /// Stores a card from a task. `actor` is the node token's id.
    pub fn store_memory(
        &self,
        ws: &str,
        req: &StoreRequest,
        actor: &str,
        limits: StoreLimits,
    ) -> Result<StoreResponse> {
        let p = &req.provenance;
        let c = &req.card;
        if !is_task_id(&p.task_id) {
            return Err(StoreError::Invalid(
                "provenance.task_id must be 1 to 64 characters of [A-Za-z0-9._-] starting with a letter or digit".into(),
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
        if c.scope.user_id.is_some() && c.scope.user_id != p.user_id {
            return Err(StoreError::Invalid(
                "card.scope.user_id names another user than the task's provenance; a task may bind a card only to its own user".into(),
            ));
        }
        if c.scope.asset_id.is_some() && c.scope.asset_id != p.asset_id {
            return Err(StoreError::Invalid(
                "card.scope.asset_id names another asset than the task's provenance; a task may bind a card only to its own asset".into(),
            ));
        }
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
        if p.user_id.is_none() {
            return Err(StoreError::Forbidden(format!(
                "task {} names no user, so nobody is the author of what it stores and no task could \
                 ever see the card; stores from tasks without a user are refused. Start the task \
                 with a user (mop run --user NAME) to let its agent store memory",
                p.task_id
            )));
        }
        let key = title_key(&c.title);
        let detail = format!("task={}", p.task_id);

        self.write(|tx| {
            let e = self.err("store memory");
            ensure_workspace(tx, ws).map_err(&e)?;
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
            // Live cards of the same type and title that this task could see.
            let candidates: Vec<(CardSummary, String)> = {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT summary, sha256 FROM cards
                         WHERE workspace = ?1 AND card_type = ?2 AND title_key = ?3 AND live = 1 ORDER BY id",
                    )
                    .map_err(&e)?;
                let rows = stmt
                    .query_map(params![ws, c.card_type.as_str(), key], |r| {
                        Ok((r.get::<String>(0)?, r.get::<String>(1)?))
                    })
                    .map_err(&e)?;
                let mut out = Vec::new();
                for row in rows {
                    let (summary, sha) = row.map_err(&e)?;
                    let summary: CardSummary = serde_json::from_str(&summary)
                        .map_err(|err| StoreError::Invalid(format!("stored summary unreadable: {err}")))?;
                    if summary.is_visible_to(p.user_id.as_deref(), p.asset_id.as_deref()) {
                        out.push((summary, sha));
                    }
                }
                out
            };

            let new_body = body_key(&c.body);
            let mut own_unverified = None;
            for (summary, sha) in &candidates {
                let raw = load_object(tx, ws, sha).map_err(&e)?;
                let existing = parse_card(&raw)
                    .map_err(|err| StoreError::Invalid(format!("stored card {} unreadable: {err}", summary.id)))?;
                if body_key(&existing.body) == new_body {
                    let audience = summary.audience_sentence();
                    let revision = current_revision(tx, ws).map_err(&e)?;
                    // One reinforcement per (task, card): a task repeating itself (or
                    // repeating the card it stored) is not more evidence.
                    if !note_contribution(tx, ws, actor, &p.task_id, &summary.id, now_ts).map_err(&e)? {
                        return Ok(StoreResponse { outcome: StoreOutcome::Unchanged, id: summary.id, revision, audience });
                    }
                    // Reinforce: counters only, published with the next batch.
                    tx.execute(
                        "UPDATE cards SET pending_occurrence = pending_occurrence + 1, pending_last_seen = ?3
                         WHERE workspace = ?1 AND id = ?2",
                        params![ws, summary.id.to_string(), stamp(now_ts)],
                    )
                    .map_err(&e)?;
                    tx.execute("UPDATE workspaces SET counters_dirty = 1 WHERE name = ?1", params![ws])
                        .map_err(&e)?;
                    audit(tx, ws, Some(&summary.id), revision, actor, "reinforce", Some(sha), Some(sha), None, Some(&detail))
                        .map_err(&e)?;
                    return Ok(StoreResponse { outcome: StoreOutcome::Reinforced, id: summary.id, revision, audience });
                }
                let author = summary.restricted_to_author();
                if own_unverified.is_none() && author.is_some() && author == p.user_id.as_deref() {
                    own_unverified = Some((existing, sha.clone()));
                }
            }

            if let Some((mut existing, old_sha)) = own_unverified {
                // Extend the author's own unverified card with the new specifics.
                let old_row: (i64, Option<String>) = tx
                    .query_row(
                        "SELECT occurrence, last_seen FROM cards WHERE workspace = ?1 AND id = ?2",
                        params![ws, existing.summary.id.to_string()],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .map_err(&e)?;
                if !existing.body.ends_with('\n') {
                    existing.body.push('\n');
                }
                existing.body.push('\n');
                existing.body.push_str(&c.body);
                merge(&mut existing.summary.labels, &c.labels);
                merge(&mut existing.summary.error_codes, &c.error_codes);
                merge(&mut existing.summary.stacks, &c.stacks);
                if existing.summary.description.is_none() {
                    existing.summary.description = c.description.clone();
                }
                existing.summary.updated_at = Some(now_ts);
                existing
                    .validate()
                    .map_err(|err| StoreError::Invalid(format!("extended card would be invalid: {err}")))?;
                let raw = render_card(&existing).into_bytes();
                let rev = bump(tx, ws).map_err(&e)?;
                let sha = write_card(tx, ws, &existing, &raw, rev, Kept { occurrence: old_row.0 as u64, last_seen: old_row.1.as_deref(), archived_at: None })
                    .map_err(&e)?;
                audit(tx, ws, Some(&existing.summary.id), rev, actor, "extend", Some(&old_sha), Some(&sha), Some(&raw), Some(&detail))
                    .map_err(&e)?;
                note_contribution(tx, ws, actor, &p.task_id, &existing.summary.id, now_ts).map_err(&e)?;
                return Ok(StoreResponse {
                    outcome: StoreOutcome::Extended,
                    id: existing.summary.id,
                    revision: rev,
                    audience: existing.summary.audience_sentence(),
                });
            }

            let raw = render_card(&new_card).into_bytes();
            let rev = bump(tx, ws).map_err(&e)?;
            let seen = stamp(now_ts);
            let sha = write_card(tx, ws, &new_card, &raw, rev, Kept { occurrence: 1, last_seen: Some(&seen), archived_at: None }).map_err(&e)?;
            audit(tx, ws, Some(&new_card.summary.id), rev, actor, "store", None, Some(&sha), Some(&raw), Some(&detail))
                .map_err(&e)?;
            note_contribution(tx, ws, actor, &p.task_id, &new_card.summary.id, now_ts).map_err(&e)?;
            Ok(StoreResponse {
                outcome: StoreOutcome::Created,
                id: new_card.summary.id,
                revision: rev,
                audience: new_card.summary.audience_sentence(),
            })
        })
    }
}
