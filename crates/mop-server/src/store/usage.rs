//! Usage from task receipts: each receipt a daemon reports is counted once (a row per
//! task, keyed by workspace, task id and prepare time), into per-card counters per day
//! (deliveries split by how the task ended), the hosts that saw each card, when a task
//! last named each asset, and each task's verdict on a card (with its note, screened for
//! credentials again here). Nothing else per delivery is kept, and no card or query text
//! ever arrives here.
//!
//! A verified card that agents of enough distinct users call wrong or outdated is a flag
//! item of the review queue until a curator keeps it ([`Store::keep_card`]) or changes
//! it; a verdict never changes what a task is given.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::db::{OptionalExtension, Tx, params};
use jiff::{Timestamp, ToSpan};
use mop_proto::curation::{FeedbackCounts, FeedbackNote, OutcomeCounts, Usage};
use mop_proto::receipts::{Outcome, Receipt, ReceiptBatchResponse, Verdict};

use mop_cards::CardId;
use mop_proto::time::Stamp;

use super::{Result, Store, StoreError, db, stamp};

/// Receipts older than this are not counted (their dedup rows are gone by then); the
/// daemon drops what it could not report in this time.
pub const RECEIPT_MAX_AGE_DAYS: i64 = 30;
/// Dedup rows live a little longer than the oldest receipt a daemon may still send.
const RECEIPT_KEEP_DAYS: i64 = RECEIPT_MAX_AGE_DAYS + 5;
/// Day counters and hosts are kept this long (the longest window reported is 30 days).
const DAYS_KEPT: i64 = 60;
/// When a task last named an asset is kept this long.
const ASSET_DAYS_KEPT: i64 = 400;
/// Most hosts a card's usage names (the most recent ones).
const MAX_HOSTS: usize = 20;

/// `YYYY-MM-DD` of a time, in UTC (a stored time starts with it).
fn day(t: Timestamp) -> String {
    stamp(t)[..10].to_owned()
}

/// Forgets a card's usage (it was removed for good).
pub(crate) fn forget_card(tx: &Tx<'_>, ws: &str, id: &str) -> db::Result<()> {
    for table in [
        "card_usage_days",
        "card_usage",
        "card_hosts",
        "card_feedback",
        "card_flags",
    ] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE workspace = ?1 AND card_id = ?2"),
            params![ws, id],
        )?;
    }
    Ok(())
}

/// The stored time `days` days ago.
fn stamp_days_ago(days: i64) -> String {
    stamp(Timestamp::now() - (days * 24).hours())
}

/// The day `days` days before today (UTC).
fn days_ago(days: i64) -> String {
    day(Timestamp::now() - (days * 24).hours())
}

impl Store {
    /// Counts a batch of receipts of `ws` reported by `actor` (a node token id). Each
    /// receipt counts once, however often it is sent; all of the batch or none of it is
    /// written.
    pub fn ingest_receipts(
        &self,
        ws: &str,
        actor: &str,
        receipts: &[Receipt],
    ) -> Result<ReceiptBatchResponse> {
        for r in receipts {
            r.validate()
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            if r.workspace != ws {
                return Err(StoreError::Invalid(format!(
                    "receipt {}: workspace {} is not the workspace of this request ({ws})",
                    r.task_id, r.workspace
                )));
            }
        }
        let now = Timestamp::now();
        let oldest = now - (RECEIPT_MAX_AGE_DAYS * 24).hours();
        // A receipt from the future would count in every window for good.
        let latest = now + 5.minutes();
        if let Some(r) = receipts.iter().find(|r| r.prepared_at > latest) {
            return Err(StoreError::Invalid(format!(
                "receipt {}: prepared_at lies in the future (check the host's clock)",
                r.task_id
            )));
        }
        self.write(|tx| {
            let e = self.err("count receipts");
            let mut answer = ReceiptBatchResponse::default();
            let mut tally = Tally::default();
            for r in receipts {
                if r.prepared_at < oldest {
                    answer.too_old += 1;
                    continue;
                }
                let inserted = tx
                    .execute(
                        "INSERT INTO receipts (workspace, task_id, prepared_at, actor, host, received_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
                        params![ws, r.task_id, stamp(r.prepared_at), actor, r.host, stamp(now)],
                    )
                    .map_err(&e)?;
                if inserted == 0 {
                    answer.duplicates += 1;
                    continue;
                }
                tally.add(r);
                answer.accepted += 1;
            }
            tally.write(tx, ws).map_err(&e)?;
            Ok(answer)
        })
    }

    /// One card's usage: its day counters, last delivery and the hosts that saw it lately,
    /// read by the card's keys (never a scan of the workspace).
    pub(crate) fn usage_of(&self, tx: &Tx<'_>, ws: &str, id: &str) -> Result<Usage> {
        let e = self.err("read usage");
        let mut u = Usage::default();
        let (week, month) = (days_ago(6), days_ago(29));
        let counts = tx
            .query_row(
                "SELECT CAST(COALESCE(SUM(CASE WHEN day >= ?3 THEN delivered ELSE 0 END), 0) AS BIGINT),
                        CAST(COALESCE(SUM(delivered), 0) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN day >= ?3 THEN retrieved ELSE 0 END), 0) AS BIGINT),
                        CAST(COALESCE(SUM(retrieved), 0) AS BIGINT)
                 FROM card_usage_days WHERE workspace = ?1 AND card_id = ?2 AND day >= ?4",
                params![ws, id, week, month],
                |r| {
                    Ok((
                        r.get::<i64>(0)? as u64,
                        r.get::<i64>(1)? as u64,
                        r.get::<i64>(2)? as u64,
                        r.get::<i64>(3)? as u64,
                    ))
                },
            )
            .map_err(&e)?;
        (
            u.delivered_7d,
            u.delivered_30d,
            u.retrieved_7d,
            u.retrieved_30d,
        ) = counts;
        let last: Option<Option<String>> = tx
            .query_row(
                "SELECT last_delivered_at FROM card_usage WHERE workspace = ?1 AND card_id = ?2",
                params![ws, id],
                |r| r.get(0),
            )
            .optional()
            .map_err(&e)?;
        u.last_delivered_at = last.flatten().and_then(|t| t.parse().ok());
        let (succeeded, failed) = tx
            .query_row(
                "SELECT CAST(COALESCE(SUM(succeeded), 0) AS BIGINT), CAST(COALESCE(SUM(failed), 0) AS BIGINT)
                 FROM card_usage_days WHERE workspace = ?1 AND card_id = ?2 AND day >= ?3",
                params![ws, id, month],
                |r| Ok((r.get::<i64>(0)? as u64, r.get::<i64>(1)? as u64)),
            )
            .map_err(&e)?;
        u.outcomes_30d = OutcomeCounts {
            succeeded,
            failed,
            unknown: u.delivered_30d.saturating_sub(succeeded + failed),
        };
        u.feedback = self.feedback_of(tx, ws, id)?;
        // The hosts that saw it lately, most recent first and at most MAX_HOSTS.
        let since = stamp(Timestamp::now() - (30 * 24).hours());
        let mut stmt = tx
            .prepare_cached(
                "SELECT host FROM card_hosts WHERE workspace = ?1 AND card_id = ?2 AND last_at >= ?3
                 ORDER BY last_at DESC, host",
            )
            .map_err(&e)?;
        for host in stmt
            .query_map(params![ws, id, since], |r| r.get::<String>(0))
            .map_err(&e)?
        {
            if u.hosts.len() < MAX_HOSTS {
                u.hosts.push(host.map_err(&e)?);
            }
        }
        Ok(u)
    }

    /// Agents' verdicts on one card: counts over 7 and 30 days, how many distinct users
    /// said it is wrong or outdated since a curator last kept it, and the latest notes.
    pub(crate) fn feedback_of(&self, tx: &Tx<'_>, ws: &str, id: &str) -> Result<FeedbackCounts> {
        let e = self.err("read feedback");
        let (week, month) = (stamp_days_ago(7), stamp_days_ago(30));
        let mut f = FeedbackCounts::default();
        let rows = tx
            .query_map(
                "SELECT verdict, CAST(COUNT(*) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN at >= ?3 THEN 1 ELSE 0 END), 0) AS BIGINT)
                 FROM card_feedback WHERE workspace = ?1 AND card_id = ?2 AND at >= ?4
                 GROUP BY verdict",
                params![ws, id, week, month],
                |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<i64>(1)? as u64,
                        r.get::<i64>(2)? as u64,
                    ))
                },
            )
            .map_err(&e)?;
        for (verdict, month_n, week_n) in rows {
            let (w, m) = match verdict.parse() {
                Ok(Verdict::Helped) => (&mut f.helped_7d, &mut f.helped_30d),
                Ok(Verdict::Wrong) => (&mut f.wrong_7d, &mut f.wrong_30d),
                Ok(Verdict::Outdated) => (&mut f.outdated_7d, &mut f.outdated_30d),
                Err(_) => continue,
            };
            (*w, *m) = (week_n, month_n);
        }
        (f.users_30d, f.hosts_30d) = tx
            .query_row(
                "SELECT CAST(COUNT(DISTINCT user_id) AS BIGINT), CAST(COUNT(DISTINCT host) AS BIGINT)
                 FROM card_feedback WHERE workspace = ?1 AND card_id = ?2 AND at >= ?3",
                params![ws, id, month],
                |r| Ok((r.get::<i64>(0)? as u64, r.get::<i64>(1)? as u64)),
            )
            .map_err(&e)?;
        let since = self.flag_since(tx, ws, id, &month)?;
        f.against_users = tx
            .query_row(
                "SELECT CAST(COUNT(DISTINCT user_id) AS BIGINT) FROM card_feedback
                 WHERE workspace = ?1 AND card_id = ?2 AND at > ?3 AND verdict <> 'helped'",
                params![ws, id, since],
                |r| r.get::<i64>(0),
            )
            .map_err(&e)? as u64;
        let notes = tx
            .query_map(
                "SELECT at, verdict, user_id, note FROM card_feedback
                 WHERE workspace = ?1 AND card_id = ?2 AND at > ?3 AND note IS NOT NULL
                 ORDER BY at DESC, task_id LIMIT 10",
                params![ws, id, since],
                |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<String>(1)?,
                        r.get::<Option<String>>(2)?,
                        r.get::<String>(3)?,
                    ))
                },
            )
            .map_err(&e)?;
        f.notes = notes
            .into_iter()
            .filter_map(|(at, verdict, user_id, note)| {
                Some(FeedbackNote {
                    at: at.parse().ok()?,
                    verdict: verdict.parse().ok()?,
                    user_id,
                    note,
                })
            })
            .collect();
        Ok(f)
    }

    /// Since when verdicts count toward a card's flag: the later of `floor` and when a
    /// curator last kept it.
    fn flag_since(&self, tx: &Tx<'_>, ws: &str, id: &str, floor: &str) -> Result<String> {
        let cleared: Option<String> = tx
            .query_row(
                "SELECT cleared_at FROM card_flags WHERE workspace = ?1 AND card_id = ?2",
                params![ws, id],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err("read a card's flag"))?;
        Ok(cleared
            .filter(|c| c.as_str() > floor)
            .unwrap_or_else(|| floor.to_owned()))
    }

    /// The verified live cards of `ws` that agents of at least `min_users` distinct users
    /// called wrong or outdated in the last 30 days since a curator last kept them, with
    /// their type and when the first of those verdicts came: the review queue's flag items.
    pub(crate) fn flagged_cards(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        min_users: u64,
    ) -> Result<Vec<(String, String, Stamp)>> {
        let month = stamp_days_ago(30);
        tx.query_map(
            "SELECT f.card_id, c.card_type, MIN(f.at)
             FROM card_feedback f
             JOIN cards c ON c.workspace = f.workspace AND c.id = f.card_id
             LEFT JOIN card_flags k ON k.workspace = f.workspace AND k.card_id = f.card_id
             WHERE f.workspace = ?1 AND f.at >= ?2 AND f.verdict <> 'helped'
               AND f.at > COALESCE(k.cleared_at, '') AND c.live = 1 AND c.awaiting = 0
             GROUP BY f.card_id, c.card_type
             HAVING COUNT(DISTINCT f.user_id) >= ?3
             ORDER BY MIN(f.at), f.card_id",
            params![ws, month, min_users as i64],
            |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?, r.get::<Stamp>(2)?)),
        )
        .map_err(self.err("read flagged cards"))
    }

    /// A curator keeps a card agents flagged, as it is: the verdicts given so far stop
    /// counting toward its flag (later ones count again). Audited as `keep`, with the
    /// curator's reason; the card and the workspace's revision stay as they are.
    pub fn keep_card(
        &self,
        ws: &str,
        id: &CardId,
        reason: Option<&str>,
        actor: &str,
        expect: super::cards::Expect<'_>,
    ) -> Result<mop_proto::curation::CardChange> {
        self.write(|tx| {
            let e = self.err("keep a flagged card");
            let row = super::cards::load_row(tx, ws, id)
                .map_err(&e)?
                .ok_or_else(|| {
                    StoreError::NotFound(format!("card {id} not found in workspace {ws}"))
                })?;
            expect.check(id, &row)?;
            tx.execute(
                "INSERT INTO card_flags (workspace, card_id, cleared_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (workspace, card_id) DO UPDATE SET cleared_at = excluded.cleared_at",
                params![ws, id.to_string(), stamp(Timestamp::now())],
            )
            .map_err(&e)?;
            let revision = super::cards::current_revision(tx, ws).map_err(&e)?;
            let sha = row.sha256.as_str();
            super::cards::audit(
                tx,
                ws,
                Some(id),
                revision,
                actor,
                "keep",
                Some(sha),
                Some(sha),
                None,
                reason,
            )
            .map_err(&e)?;
            Ok(mop_proto::curation::CardChange {
                id: *id,
                revision,
                sha256: Some(row.sha256.clone()),
                changed: false,
                etag: Some(mop_proto::curation::card_etag(
                    &row.sha256,
                    row.archived_at.is_some(),
                )),
            })
        })
    }

    /// When a task last named each asset of `ws`.
    pub(crate) fn assets_named(&self, tx: &Tx<'_>, ws: &str) -> Result<HashMap<String, Timestamp>> {
        let e = self.err("read asset usage");
        let mut stmt = tx
            .prepare_cached("SELECT asset_id, last_named_at FROM asset_usage WHERE workspace = ?1")
            .map_err(&e)?;
        let rows = stmt
            .query_map(params![ws], |r| {
                Ok((r.get::<String>(0)?, r.get::<String>(1)?))
            })
            .map_err(&e)?;
        let mut out = HashMap::new();
        for row in rows {
            let (asset, at) = row.map_err(&e)?;
            if let Ok(at) = at.parse() {
                out.insert(asset, at);
            }
        }
        Ok(out)
    }

    /// Forgets day counters and dedup rows nobody reads any more.
    pub(crate) fn prune_usage(&self, tx: &Tx<'_>) -> Result<()> {
        let e = self.err("prune usage");
        tx.execute(
            "DELETE FROM card_usage_days WHERE day < ?1",
            params![days_ago(DAYS_KEPT)],
        )
        .map_err(&e)?;
        let stamp_ago = |days: i64| stamp(Timestamp::now() - (days * 24).hours());
        tx.execute(
            "DELETE FROM receipts WHERE prepared_at < ?1",
            params![stamp_ago(RECEIPT_KEEP_DAYS)],
        )
        .map_err(&e)?;
        tx.execute(
            "DELETE FROM card_hosts WHERE last_at < ?1",
            params![stamp_ago(DAYS_KEPT)],
        )
        .map_err(&e)?;
        tx.execute(
            "DELETE FROM card_feedback WHERE at < ?1",
            params![stamp_ago(DAYS_KEPT)],
        )
        .map_err(&e)?;
        tx.execute(
            "DELETE FROM asset_usage WHERE last_named_at < ?1",
            params![stamp_ago(ASSET_DAYS_KEPT)],
        )
        .map_err(&e)?;
        Ok(())
    }
}

/// What a batch of new receipts adds, summed per card and day, per card and host, per
/// asset, so a batch of many tasks that were given the same cards costs one write per
/// card rather than one per task and card.
#[derive(Default)]
struct Tally {
    /// Per card and day: delivered, retrieved, delivered to tasks that succeeded, failed.
    days: BTreeMap<(String, String), [i64; 4]>,
    feedback: Vec<FeedbackRow>,
    hosts: BTreeMap<(String, String), String>,
    delivered_at: BTreeMap<String, String>,
    assets: BTreeMap<String, String>,
}

/// One task's verdict on one card, as stored.
struct FeedbackRow {
    card_id: String,
    task_id: String,
    prepared_at: String,
    verdict: &'static str,
    user_id: Option<String>,
    host: String,
    note: Option<String>,
    at: String,
}

fn later(slot: &mut String, at: &str) {
    if slot.as_str() < at {
        *slot = at.to_owned();
    }
}

impl Tally {
    /// Adds one new receipt.
    fn add(&mut self, r: &Receipt) {
        let d = day(r.prepared_at);
        let at = stamp(r.prepared_at);
        let ended = |o: Outcome| i64::from(r.outcome == Some(o));
        let (succeeded, failed) = (ended(Outcome::Success), ended(Outcome::Failure));
        let mut seen = |id: String, delivered: i64, retrieved: i64| {
            let slot = self.days.entry((id.clone(), d.clone())).or_default();
            slot[0] += delivered;
            slot[1] += retrieved;
            slot[2] += delivered * succeeded;
            slot[3] += delivered * failed;
            later(self.hosts.entry((id, r.host.clone())).or_default(), &at);
        };
        let mounted: BTreeSet<String> = r
            .cards
            .iter()
            .filter(|c| c.mounted)
            .map(|c| c.id.to_string())
            .collect();
        for id in &mounted {
            seen(id.clone(), 1, 0);
        }
        for id in r.activity.retrieved() {
            seen(id.to_string(), 0, 1);
        }
        for id in mounted {
            later(self.delivered_at.entry(id).or_default(), &at);
        }
        if let Some(asset) = &r.asset_id {
            later(self.assets.entry(asset.clone()).or_default(), &at);
        }
        let screen = mop_intake::secrets::Screen::builtin();
        // A verdict counts only on a card the receipt says its task was given or met (a
        // receipt that lists only part of those can say so of none).
        let partial = r.cards_unlisted > 0;
        let given: BTreeSet<CardId> = r.cards.iter().map(|c| c.id).collect();
        for f in r
            .activity
            .feedback
            .iter()
            .filter(|f| partial || given.contains(&f.id) || r.activity.met(&f.id))
        {
            // The host screened the note; a note that still carries a credential (an old
            // or altered host) loses its text, never its verdict.
            let note = f.note.clone().filter(|n| {
                screen
                    .scan_fields(std::iter::once(("note", n.as_str())))
                    .is_empty()
            });
            self.feedback.push(FeedbackRow {
                card_id: f.id.to_string(),
                task_id: r.task_id.clone(),
                prepared_at: at.clone(),
                verdict: f.verdict.as_str(),
                user_id: r.user_id.clone(),
                host: r.host.clone(),
                note,
                at: stamp(f.at.min(Timestamp::now())),
            });
        }
    }

    /// Writes the sums. Only cards of this workspace count: ids of no card here change
    /// nothing.
    fn write(self, tx: &Tx<'_>, ws: &str) -> db::Result<()> {
        let mut known = BTreeSet::new();
        for ((id, d), [delivered, retrieved, succeeded, failed]) in &self.days {
            let counted = tx.execute(
                "INSERT INTO card_usage_days (workspace, card_id, day, delivered, retrieved, succeeded, failed)
                 SELECT ?1, ?2, ?3, CAST(?4 AS BIGINT), CAST(?5 AS BIGINT), CAST(?6 AS BIGINT), CAST(?7 AS BIGINT)
                 WHERE EXISTS (SELECT 1 FROM cards WHERE workspace = ?1 AND id = ?2)
                 ON CONFLICT (workspace, card_id, day) DO UPDATE SET
                    delivered = card_usage_days.delivered + excluded.delivered,
                    retrieved = card_usage_days.retrieved + excluded.retrieved,
                    succeeded = card_usage_days.succeeded + excluded.succeeded,
                    failed = card_usage_days.failed + excluded.failed",
                params![ws, id, d, delivered, retrieved, succeeded, failed],
            )?;
            if counted > 0 {
                known.insert(id.as_str());
            }
        }
        for ((id, host), at) in &self.hosts {
            if known.contains(id.as_str()) {
                tx.execute(
                    "INSERT INTO card_hosts (workspace, card_id, host, last_at) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (workspace, card_id, host) DO UPDATE SET
                        last_at = CASE WHEN card_hosts.last_at > excluded.last_at
                            THEN card_hosts.last_at ELSE excluded.last_at END",
                    params![ws, id, host, at],
                )?;
            }
        }
        for (id, at) in &self.delivered_at {
            if known.contains(id.as_str()) {
                tx.execute(
                    "INSERT INTO card_usage (workspace, card_id, last_delivered_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (workspace, card_id) DO UPDATE SET
                        last_delivered_at = CASE WHEN COALESCE(card_usage.last_delivered_at, '') > excluded.last_delivered_at
                            THEN card_usage.last_delivered_at ELSE excluded.last_delivered_at END",
                    params![ws, id, at],
                )?;
            }
        }
        for f in &self.feedback {
            tx.execute(
                "INSERT INTO card_feedback (workspace, card_id, task_id, prepared_at, verdict, user_id, host, note, at)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9
                 WHERE EXISTS (SELECT 1 FROM cards WHERE workspace = ?1 AND id = ?2)
                 ON CONFLICT (workspace, card_id, task_id, prepared_at) DO NOTHING",
                params![
                    ws,
                    f.card_id,
                    f.task_id,
                    f.prepared_at,
                    f.verdict,
                    f.user_id,
                    f.host,
                    f.note,
                    f.at
                ],
            )?;
        }
        for (asset, at) in &self.assets {
            tx.execute(
                "INSERT INTO asset_usage (workspace, asset_id, last_named_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (workspace, asset_id) DO UPDATE SET
                    last_named_at = CASE WHEN asset_usage.last_named_at > excluded.last_named_at
                        THEN asset_usage.last_named_at ELSE excluded.last_named_at END",
                params![ws, asset, at],
            )?;
        }
        Ok(())
    }
}
