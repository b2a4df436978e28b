//! Usage from task receipts: each receipt a daemon reports is counted once (a row per
//! task, keyed by workspace, task id and prepare time), into per-card counters per day,
//! the hosts that saw each card, and when a task last named each asset. Nothing per
//! delivery is kept, and no card or query text ever arrives here.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::db::{OptionalExtension, Tx, params};
use jiff::{Timestamp, ToSpan};
use mop_proto::curation::Usage;
use mop_proto::receipts::{Receipt, ReceiptBatchResponse};

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
    for table in ["card_usage_days", "card_usage", "card_hosts"] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE workspace = ?1 AND card_id = ?2"),
            params![ws, id],
        )?;
    }
    Ok(())
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
    days: BTreeMap<(String, String), (i64, i64)>,
    hosts: BTreeMap<(String, String), String>,
    delivered_at: BTreeMap<String, String>,
    assets: BTreeMap<String, String>,
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
        let mut seen = |id: String, delivered: i64, retrieved: i64| {
            let slot = self.days.entry((id.clone(), d.clone())).or_default();
            slot.0 += delivered;
            slot.1 += retrieved;
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
    }

    /// Writes the sums. Only cards of this workspace count: ids of no card here change
    /// nothing.
    fn write(self, tx: &Tx<'_>, ws: &str) -> db::Result<()> {
        let mut known = BTreeSet::new();
        for ((id, d), (delivered, retrieved)) in &self.days {
            let counted = tx.execute(
                "INSERT INTO card_usage_days (workspace, card_id, day, delivered, retrieved)
                 SELECT ?1, ?2, ?3, CAST(?4 AS BIGINT), CAST(?5 AS BIGINT)
                 WHERE EXISTS (SELECT 1 FROM cards WHERE workspace = ?1 AND id = ?2)
                 ON CONFLICT (workspace, card_id, day) DO UPDATE SET
                    delivered = card_usage_days.delivered + excluded.delivered,
                    retrieved = card_usage_days.retrieved + excluded.retrieved",
                params![ws, id, d, delivered, retrieved],
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
