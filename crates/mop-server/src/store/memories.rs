//! The rows a store from an agent task reads and writes (`POST /memories`): each task's
//! store count and contributions, the first answer kept under an idempotency key, the live
//! cards a lesson matches, and the card a store creates or the evidence it adds.
//!
//! What a store *does* is decided in [`crate::service::memories`]; every method here runs
//! inside the transaction that decision opened, so a decision and the change it leads to
//! commit together.

use super::db::{Tx, params};
use jiff::Timestamp;
use mop_cards::{Card, CardId, render_card};
use mop_intake::lesson::Lesson;
use mop_proto::sync::StoreResponse;

use super::cards::{Kept, Row, audit, current_revision, load_row, write_card};
use super::intake::{self, IntakePolicy, Tombstone};
use super::{Result, Store, bump, db, ensure_workspace, stamp};

/// Records that a task (a node token's task id) contributed to a card: created or
/// reinforced it. False when it had already.
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

/// A live card a lesson matched (a merged-away card replaced by the card it leads to),
/// and how close it was.
pub(crate) struct Match {
    pub row: Row,
    pub score: f32,
}

/// Who made a store: the node token (`actor`) and the task it asserted.
#[derive(Clone, Copy)]
pub(crate) struct Storer<'a> {
    pub actor: &'a str,
    pub task: &'a str,
}

impl Store {
    /// The write path's settings (`[intake]`).
    pub(crate) fn intake_policy(&self) -> &IntakePolicy {
        &self.intake
    }

    /// Makes sure the workspace has its row: the first write of a store's transaction.
    pub(crate) fn open_workspace(&self, tx: &Tx<'_>, ws: &str) -> Result<()> {
        ensure_workspace(tx, ws).map_err(self.err("store memory"))
    }

    /// The answer kept under `key` for `actor`, and the task whose store it answered.
    pub(crate) fn kept_answer(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        actor: &str,
        key: &str,
    ) -> Result<Option<(String, Option<StoreResponse>)>> {
        intake::first_answer(tx, ws, actor, key).map_err(self.err("read store answer"))
    }

    /// Keeps a store's answer under its key.
    pub(crate) fn keep_answer(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        by: Storer<'_>,
        key: &str,
        answer: &StoreResponse,
    ) -> Result<()> {
        intake::keep_answer(tx, ws, by.actor, key, by.task, answer)
            .map_err(self.err("store memory"))
    }

    /// Counts one more store of the task, and answers how many it has made.
    pub(crate) fn count_store(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        by: Storer<'_>,
        now: Timestamp,
    ) -> Result<u64> {
        let stores: i64 = tx
            .query_row(
                "INSERT INTO task_stores (workspace, actor, task_id, stores, last_at) VALUES (?1, ?2, ?3, 1, ?4)
                 ON CONFLICT (workspace, actor, task_id) DO UPDATE SET stores = task_stores.stores + 1, last_at = ?4
                 RETURNING stores",
                params![ws, by.actor, by.task, stamp(now)],
                |r| r.get(0),
            )
            .map_err(self.err("store memory"))?;
        Ok(stores as u64)
    }

    /// The first live rejection tombstone whose lesson is `lesson`.
    pub(crate) fn rejected_lesson(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        lesson: &Lesson,
    ) -> Result<Option<Tombstone>> {
        let stones = intake::tombstones(tx, ws).map_err(self.err("store memory"))?;
        Ok(intake::matching_tombstone(&stones, lesson, &self.intake.same_lesson).cloned())
    }

    /// The live cards whose lesson is the same as `lesson`, once each with its best score;
    /// a card merged away is replaced by the card it was merged into.
    pub(crate) fn same_lesson_cards(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        lesson: &Lesson,
    ) -> Result<Vec<Match>> {
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
        Ok(out)
    }

    /// Writes a card a task stored as a new revision, with its audit row (`detail`) and
    /// the task's contribution; `group_with` puts it in that card's duplicate group.
    /// Answers the new revision.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert_stored(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        by: Storer<'_>,
        card: &Card,
        group_with: Option<&CardId>,
        detail: &str,
        now: Timestamp,
    ) -> Result<u64> {
        let e = self.err("store memory");
        let raw = render_card(card).into_bytes();
        let rev = bump(tx, ws).map_err(&e)?;
        let seen = stamp(now);
        let kept = Kept {
            occurrence: 1,
            last_seen: Some(&seen),
            archived_at: None,
        };
        let sha = write_card(tx, ws, card, &raw, rev, kept).map_err(&e)?;
        let id = card.summary.id;
        if let Some(other) = group_with {
            intake::join_group(tx, ws, &id, other).map_err(&e)?;
        }
        audit(
            tx,
            ws,
            Some(&id),
            rev,
            by.actor,
            "store",
            None,
            Some(&sha),
            Some(&raw),
            Some(detail),
        )
        .map_err(&e)?;
        note_contribution(tx, ws, by.actor, by.task, &id, now).map_err(&e)?;
        Ok(rev)
    }

    /// Counts a task's store as more evidence for card `m` (published with the next
    /// counter batch), with its audit row. False, changing nothing, when the task had
    /// contributed to the card already.
    pub(crate) fn add_evidence(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        by: Storer<'_>,
        m: &Match,
        detail: &str,
        now: Timestamp,
    ) -> Result<bool> {
        let e = self.err("store memory");
        let s = &m.row.summary;
        if !note_contribution(tx, ws, by.actor, by.task, &s.id, now).map_err(&e)? {
            return Ok(false);
        }
        tx.execute(
            "UPDATE cards SET pending_occurrence = pending_occurrence + 1, pending_last_seen = ?3
             WHERE workspace = ?1 AND id = ?2",
            params![ws, s.id.to_string(), stamp(now)],
        )
        .map_err(&e)?;
        tx.execute(
            "UPDATE workspaces SET counters_dirty = 1 WHERE name = ?1",
            params![ws],
        )
        .map_err(&e)?;
        let sha = &m.row.sha256;
        let revision = self.revision_in(tx, ws)?;
        audit(
            tx,
            ws,
            Some(&s.id),
            revision,
            by.actor,
            "reinforce",
            Some(sha),
            Some(sha),
            None,
            Some(detail),
        )
        .map_err(&e)?;
        Ok(true)
    }

    /// The workspace's revision now, inside a transaction.
    pub(crate) fn revision_in(&self, tx: &Tx<'_>, ws: &str) -> Result<u64> {
        current_revision(tx, ws).map_err(self.err("store memory"))
    }
}
