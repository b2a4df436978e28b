//! The curators' alerts, as rows: an outbox the webhook drains.
//!
//! A check ([`Store::scan_alerts`]) finds what curators should hear of and was not yet
//! announced: a duplicate group with a card waiting (`new_group`), and a queue entry (a
//! lone card, or a group) waiting longer than the configured age (`item_aged`). Each
//! becomes one row, keyed by workspace, kind and subject, so it is announced once however
//! often the check runs (it reads only what has no row yet), and it stays until the
//! webhook took it: a restart or a receiver that is down loses nothing. The body is made once, so every attempt sends (and signs)
//! the same bytes. Stores never touch this table: the check reads the queue on its own
//! schedule.
//!
//! Delivery takes due rows ([`Store::due_alerts`]), claims each for a while so a second
//! server on the same database does not send it too, and records the outcome.

use jiff::{Timestamp, ToSpan};
use mop_proto::time::Stamp;
use serde::Serialize;

use super::db::params;
use super::{Result, Store, stamp};

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A duplicate group entered the review queue.
    NewGroup,
    /// A queue entry has waited longer than `alerts.item_age_secs`.
    ItemAged,
}

impl AlertKind {
    fn as_str(self) -> &'static str {
        match self {
            AlertKind::NewGroup => "new_group",
            AlertKind::ItemAged => "item_aged",
        }
    }
}

/// The JSON an alert's webhook receives: ids and counts, never card text.
#[derive(Debug, Clone, Serialize)]
struct Body<'a> {
    /// Unique per event: receivers drop a repeat (delivery is at least once).
    id: String,
    event: AlertKind,
    workspace: &'a str,
    /// The group, for a group.
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<&'a str>,
    /// The card, for a lone card.
    #[serde(skip_serializing_if = "Option::is_none")]
    card: Option<&'a str>,
    /// Cards waiting in the entry.
    waiting: u64,
    /// When the entry's oldest card was made.
    since: &'a str,
    /// When the event was found.
    at: String,
}

/// An alert waiting for delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// Its workspace.
    pub workspace: String,
    /// `new_group` or `item_aged`.
    pub kind: String,
    /// The group or card it is about.
    pub subject: String,
    /// The JSON body, as signed and sent.
    pub body: String,
    /// Attempts made so far.
    pub attempts: u32,
    /// When it is due (the claim compares it).
    pub next_at: String,
}

/// Alerts by state, for the gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlertCounts {
    /// Waiting for delivery.
    pub pending: u64,
    /// Delivered.
    pub delivered: u64,
    /// Given up after the most attempts.
    pub failed: u64,
}

/// A queue entry found by the check.
struct Found {
    workspace: String,
    group: Option<String>,
    card: String,
    waiting: u64,
    since: String,
}

impl Store {
    /// Queues an alert for each new group and each entry older than `age_secs` that was
    /// not announced yet, while fewer than `max_pending` wait. Answers how many it queued.
    pub fn scan_alerts(&self, age_secs: u64, max_pending: u64) -> Result<usize> {
        let now = Timestamp::now();
        let cut = stamp(now - (age_secs.min(100 * 365 * 86_400) as i64).seconds());
        self.write(|tx| {
            let e = self.err("check for alerts");
            let pending: u64 = tx
                .query_row(
                    "SELECT COUNT(*) FROM alerts WHERE delivered_at IS NULL AND failed_at IS NULL",
                    params![],
                    |r| r.get(0),
                )
                .map_err(&e)?;
            // Groups with a card waiting, oldest card first.
            let groups = tx
                .query_map(
                    "SELECT g.workspace, g.group_id, MIN(c.id), COUNT(*), MIN(COALESCE(c.made_at, c.created_at))
                     FROM duplicate_groups g
                     JOIN cards c ON c.workspace = g.workspace AND c.id = g.card_id
                     WHERE c.awaiting = 1
                       AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.workspace = g.workspace
                                       AND a.kind = 'new_group' AND a.subject = g.group_id)
                     GROUP BY g.workspace, g.group_id",
                    params![],
                    |r| {
                        Ok(Found {
                            workspace: r.get(0)?,
                            group: Some(r.get(1)?),
                            card: r.get(2)?,
                            waiting: r.get(3)?,
                            since: r.get(4)?,
                        })
                    },
                )
                .map_err(&e)?;
            // Waiting cards older than the cut, each with its group if it has one.
            let aged = tx
                .query_map(
                    "SELECT c.workspace, g.group_id, c.id, COALESCE(c.made_at, c.created_at)
                     FROM cards c
                     LEFT JOIN duplicate_groups g ON g.workspace = c.workspace AND g.card_id = c.id
                     WHERE c.awaiting = 1 AND COALESCE(c.made_at, c.created_at) < ?1
                       AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.workspace = c.workspace
                                       AND a.kind = 'item_aged'
                                       AND a.subject = COALESCE(g.group_id, c.id))",
                    params![cut],
                    |r| {
                        Ok(Found {
                            workspace: r.get(0)?,
                            group: r.get(1)?,
                            card: r.get(2)?,
                            waiting: 1,
                            since: r.get(3)?,
                        })
                    },
                )
                .map_err(&e)?;
            // Waiting cards per group not yet announced, for an aged group's event.
            let group_sizes: std::collections::HashMap<(&str, &str), u64> = groups
                .iter()
                .filter_map(|f| Some(((f.workspace.as_str(), f.group.as_deref()?), f.waiting)))
                .collect();
            let mut room = max_pending.saturating_sub(pending);
            let mut queued = 0;
            let found = groups
                .iter()
                .map(|f| (AlertKind::NewGroup, f))
                .chain(aged.iter().map(|f| (AlertKind::ItemAged, f)));
            for (kind, f) in found {
                if room == 0 {
                    break;
                }
                let subject = f.group.as_deref().unwrap_or(&f.card);
                let waiting = match &f.group {
                    Some(g) => match group_sizes.get(&(f.workspace.as_str(), g.as_str())) {
                        Some(n) => *n,
                        None => tx
                            .query_row(
                                "SELECT COUNT(*) FROM duplicate_groups g
                                 JOIN cards c ON c.workspace = g.workspace AND c.id = g.card_id
                                 WHERE g.workspace = ?1 AND g.group_id = ?2 AND c.awaiting = 1",
                                params![f.workspace, g],
                                |r| r.get(0),
                            )
                            .map_err(&e)?,
                    },
                    None => f.waiting,
                };
                let body = Body {
                    id: format!("{}:{}:{subject}", f.workspace, kind.as_str()),
                    event: kind,
                    workspace: &f.workspace,
                    group: f.group.as_deref(),
                    card: f.group.is_none().then_some(f.card.as_str()),
                    waiting,
                    since: &f.since,
                    at: stamp(now),
                };
                let body = serde_json::to_string(&body).expect("an alert body serialises");
                let added = tx
                    .execute(
                        "INSERT INTO alerts (workspace, kind, subject, body, created_at, next_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?5) ON CONFLICT DO NOTHING",
                        params![f.workspace, kind.as_str(), subject, body, stamp(now)],
                    )
                    .map_err(&e)?;
                if added > 0 {
                    queued += 1;
                    room -= 1;
                }
            }
            Ok(queued)
        })
    }

    /// Up to `limit` alerts due now, oldest first.
    pub fn due_alerts(&self, limit: usize) -> Result<Vec<Alert>> {
        let now = stamp(Timestamp::now());
        let limit = limit as i64;
        self.read(|tx| {
            tx.query_map(
                "SELECT workspace, kind, subject, body, attempts, next_at FROM alerts
                 WHERE delivered_at IS NULL AND failed_at IS NULL AND next_at <= ?1
                 ORDER BY next_at, created_at LIMIT ?2",
                params![now, limit],
                |r| {
                    Ok(Alert {
                        workspace: r.get(0)?,
                        kind: r.get(1)?,
                        subject: r.get(2)?,
                        body: r.get(3)?,
                        attempts: r.get::<i64>(4)?.clamp(0, i64::from(u32::MAX)) as u32,
                        next_at: r.get(5)?,
                    })
                },
            )
            .map_err(self.err("read due alerts"))
        })
    }

    /// Claims `a` for `secs` seconds: false when another server claimed or sent it first.
    pub fn claim_alert(&self, a: &Alert, secs: i64) -> Result<bool> {
        let until = stamp(Timestamp::now() + secs.seconds());
        self.write(|tx| {
            let n = tx
                .execute(
                    "UPDATE alerts SET next_at = ?5
                     WHERE workspace = ?1 AND kind = ?2 AND subject = ?3 AND next_at = ?4
                       AND delivered_at IS NULL AND failed_at IS NULL",
                    params![a.workspace, a.kind, a.subject, a.next_at, until],
                )
                .map_err(self.err("claim an alert"))?;
            Ok(n == 1)
        })
    }

    /// Records an attempt: delivered, or failed with `error` (a kind, never a body) and
    /// due again at `retry`, or given up when `retry` is `None`.
    pub fn alert_attempted(
        &self,
        a: &Alert,
        outcome: std::result::Result<(), (&str, Option<Stamp>)>,
    ) -> Result<()> {
        let now = stamp(Timestamp::now());
        let attempts = i64::from(a.attempts) + 1;
        self.write(|tx| {
            let e = self.err("record an alert's delivery");
            match outcome {
                Ok(()) => tx.execute(
                    "UPDATE alerts SET delivered_at = ?4, attempts = ?5, last_error = NULL
                     WHERE workspace = ?1 AND kind = ?2 AND subject = ?3",
                    params![a.workspace, a.kind, a.subject, now, attempts],
                ),
                Err((error, Some(retry))) => tx.execute(
                    "UPDATE alerts SET next_at = ?4, attempts = ?5, last_error = ?6
                     WHERE workspace = ?1 AND kind = ?2 AND subject = ?3",
                    params![
                        a.workspace,
                        a.kind,
                        a.subject,
                        stamp(retry.0),
                        attempts,
                        error
                    ],
                ),
                Err((error, None)) => tx.execute(
                    "UPDATE alerts SET failed_at = ?4, attempts = ?5, last_error = ?6
                     WHERE workspace = ?1 AND kind = ?2 AND subject = ?3",
                    params![a.workspace, a.kind, a.subject, now, attempts, error],
                ),
            }
            .map_err(&e)?;
            Ok(())
        })
    }

    /// Alerts by state.
    pub fn alert_counts(&self) -> Result<AlertCounts> {
        self.read(|tx| {
            tx.query_row(
                "SELECT
                   COALESCE(SUM(CASE WHEN delivered_at IS NULL AND failed_at IS NULL THEN 1 ELSE 0 END), 0),
                   COALESCE(SUM(CASE WHEN delivered_at IS NOT NULL THEN 1 ELSE 0 END), 0),
                   COALESCE(SUM(CASE WHEN failed_at IS NOT NULL THEN 1 ELSE 0 END), 0)
                 FROM alerts",
                params![],
                |r| {
                    Ok(AlertCounts {
                        pending: r.get::<i64>(0)?.max(0) as u64,
                        delivered: r.get::<i64>(1)?.max(0) as u64,
                        failed: r.get::<i64>(2)?.max(0) as u64,
                    })
                },
            )
            .map_err(self.err("count alerts"))
        })
    }
}
