//! What curators read: cards with their provenance, reinforcements and usage; the review
//! queue; the staleness report. (What curators do is decided in `service::curation`.)

use std::collections::{BTreeMap, HashMap, HashSet};

use super::db::{OptionalExtension, Tx, params};
use jiff::{Timestamp, ToSpan};
use mop_cards::{CardId, CardSummary, CardType, Trust};
use mop_proto::curation::{
    CardDetails, CardInfo, CardPage, CardProvenance, Chain, DEFAULT_PAGE, ListQuery, MAX_PAGE,
    MergedCard, ReviewCounts, StaleCard, StaleReport, card_etag,
};
use mop_proto::time::Stamp;

use super::cards::{current_revision, load_row};
use super::{Result, Store, StoreError};

/// Longest staleness window, in days (ten years; longer ones are taken as this).
const MAX_DAYS: u32 = 3650;

/// One workspace's review queue in numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// The workspace.
    pub workspace: String,
    /// Cards waiting for review (live and unverified).
    pub items: u64,
    /// Duplicate groups with a card waiting among them.
    pub groups: u64,
    /// When the card waiting longest reached the server.
    pub oldest: Option<Stamp>,
    /// Verified cards agents flagged, in the queue as flag items.
    pub flagged: u64,
}

/// A card row with the facts its own columns hold: what listings filter and sort on
/// before anything else about the card is read.
struct Row {
    summary: CardSummary,
    sha: String,
    occurrence: i64,
    last_seen: Option<Stamp>,
    archived_at: Option<Stamp>,
    /// When the card was made: its `created_at`, else when the server first had it.
    made: Stamp,
    last_delivered_at: Option<Timestamp>,
}

impl Row {
    /// When the card was made.
    fn made(&self) -> Stamp {
        self.made
    }

    /// Live and unverified: what the review queue holds (`CardInfo::awaits_review`).
    fn awaits_review(&self) -> bool {
        self.archived_at.is_none()
            && self.summary.is_live()
            && self.summary.trust == Trust::Unverified
    }
}

/// The columns [`read_rows`] reads, from `cards c` with its usage row `u`.
const ROW_SQL: &str = "SELECT c.summary, c.sha256, c.occurrence, c.last_seen, c.archived_at,
            COALESCE(c.made_at, c.created_at), u.last_delivered_at
     FROM cards c LEFT JOIN card_usage u ON u.workspace = c.workspace AND u.card_id = c.id
     WHERE c.workspace = ?1";

/// The card rows of `ws` that `and` (an SQL condition on `c`, with `?2`… for `extra`)
/// keeps, in the order `order` names.
fn read_rows(
    store: &Store,
    tx: &Tx<'_>,
    ws: &str,
    and: &str,
    extra: &[&dyn super::db::ToValue],
    order: &str,
) -> Result<Vec<Row>> {
    let e = store.err("read cards");
    let sql = format!("{ROW_SQL} {and} {order}");
    let mut values: Vec<&dyn super::db::ToValue> = vec![&ws];
    values.extend_from_slice(extra);
    let rows = tx
        .query_map(&sql, &values, |r| {
            Ok((
                r.get::<String>(0)?,
                r.get::<String>(1)?,
                r.get::<i64>(2)?,
                r.get::<Option<Stamp>>(3)?,
                r.get::<Option<Stamp>>(4)?,
                r.get::<Stamp>(5)?,
                r.get::<Option<String>>(6)?,
            ))
        })
        .map_err(&e)?;
    rows.into_iter()
        .map(
            |(summary, sha, occurrence, last_seen, archived_at, made, delivered)| {
                Ok(Row {
                    summary: serde_json::from_str(&summary).map_err(|err| {
                        StoreError::Invalid(format!("stored summary unreadable: {err}"))
                    })?,
                    sha,
                    occurrence,
                    last_seen,
                    archived_at,
                    made,
                    last_delivered_at: delivered.and_then(|t| t.parse().ok()),
                })
            },
        )
        .collect()
}

fn invalid(field: &str, rule: &str) -> StoreError {
    StoreError::Invalid(format!("{field} {rule}"))
}

/// The listing filters, checked.
struct Filter<'a> {
    q: &'a ListQuery,
    card_type: Option<CardType>,
    stale_before: Option<Timestamp>,
    made_before: Option<Timestamp>,
}

impl<'a> Filter<'a> {
    fn new(q: &'a ListQuery) -> Result<Filter<'a>> {
        let card_type = match q.card_type.as_deref() {
            None => None,
            Some(t) => Some(CardType::parse(t).ok_or_else(|| {
                invalid(
                    "type",
                    &format!("must be one of: {}", CardType::NAMES.join(", ")),
                )
            })?),
        };
        Ok(Filter {
            q,
            card_type,
            stale_before: q.stale_days.map(days_ago),
            made_before: q.older_than_days.map(days_ago),
        })
    }

    /// The rows the filters keep, read with what the indexed columns can say in SQL
    /// (type, archived, waiting for review) and the rest checked on each row's summary.
    fn rows(&self, store: &Store, tx: &Tx<'_>, ws: &str) -> Result<Vec<Row>> {
        self.rows_paged(store, tx, ws, None)
    }

    /// The rows the filters keep; with `page` (offset, limit), only that page of them and,
    /// first, how many there are in all, both in SQL when [`Filter::in_sql`].
    fn rows_paged(
        &self,
        store: &Store,
        tx: &Tx<'_>,
        ws: &str,
        page: Option<(usize, usize)>,
    ) -> Result<Vec<Row>> {
        let mut and = String::new();
        let type_name = self.card_type.map(|t| t.as_str());
        let made_before = self.made_before.map(|t| Stamp(t).to_string());
        let mut extra: Vec<&dyn super::db::ToValue> = Vec::new();
        if let Some(t) = &type_name {
            extra.push(t);
            and.push_str(&format!(" AND c.card_type = ?{}", extra.len() + 1));
        }
        if let Some(g) = &self.q.group {
            extra.push(g);
            and.push_str(&format!(
                " AND c.id IN (SELECT card_id FROM duplicate_groups WHERE workspace = ?1 AND group_id = ?{})",
                extra.len() + 1
            ));
        }
        if let Some(cut) = &made_before {
            extra.push(cut);
            and.push_str(&format!(
                " AND COALESCE(c.made_at, c.created_at) < ?{}",
                extra.len() + 1
            ));
        }
        if self.q.archived != Some(true) {
            and.push_str(" AND c.archived_at IS NULL");
        }
        if self.q.unverified == Some(true) {
            and.push_str(" AND c.awaiting = 1");
        }
        let order = "ORDER BY c.card_type, c.title_key, c.id";
        let page = page.map(|(offset, limit)| {
            let clamp = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            (clamp(offset), clamp(limit))
        });
        match &page {
            Some((offset, limit)) if self.in_sql() => {
                // Bound, not written into the SQL: one prepared statement for every page.
                extra.push(limit);
                extra.push(offset);
                let n = extra.len();
                let order = format!("{order} LIMIT ?{} OFFSET ?{}", n, n + 1);
                read_rows(store, tx, ws, &and, &extra, &order)
            }
            _ => {
                let mut rows = read_rows(store, tx, ws, &and, &extra, order)?;
                rows.retain(|r| self.keeps(r));
                Ok(rows)
            }
        }
    }

    /// Whether SQL alone applies every filter (on indexed columns), so a page can be read
    /// without the rows before it.
    fn in_sql(&self) -> bool {
        let q = self.q;
        q.label.is_none()
            && q.asset.is_none()
            && q.project.is_none()
            && q.agent.is_none()
            && q.user.is_none()
            && q.stale_days.is_none()
            && q.unverified != Some(false)
    }

    /// How many rows the filters keep, counted in SQL ([`Filter::in_sql`] must hold).
    fn count_in_sql(&self, store: &Store, tx: &Tx<'_>, ws: &str) -> Result<usize> {
        let type_name = self.card_type.map(|t| t.as_str());
        let made_before = self.made_before.map(|t| Stamp(t).to_string());
        let mut sql = String::from("SELECT COUNT(*) FROM cards c WHERE c.workspace = ?1");
        let mut values: Vec<&dyn super::db::ToValue> = vec![&ws];
        if let Some(t) = &type_name {
            values.push(t);
            sql.push_str(&format!(" AND c.card_type = ?{}", values.len()));
        }
        if let Some(g) = &self.q.group {
            values.push(g);
            sql.push_str(&format!(
                " AND c.id IN (SELECT card_id FROM duplicate_groups WHERE workspace = ?1 AND group_id = ?{})",
                values.len()
            ));
        }
        if let Some(cut) = &made_before {
            values.push(cut);
            sql.push_str(&format!(
                " AND COALESCE(c.made_at, c.created_at) < ?{}",
                values.len()
            ));
        }
        if self.q.archived != Some(true) {
            sql.push_str(" AND c.archived_at IS NULL");
        }
        if self.q.unverified == Some(true) {
            sql.push_str(" AND c.awaiting = 1");
        }
        let n: u64 = tx
            .query_row(&sql, &values, |r| r.get(0))
            .map_err(store.err("count cards"))?;
        Ok(n as usize)
    }

    fn keeps(&self, f: &Row) -> bool {
        self.keeps_summary(&f.summary, f.archived_at.is_some())
            && self.stale_before.is_none_or(|cut| {
                f.last_delivered_at.is_none_or(|t| t < cut) && f.made() < Stamp(cut)
            })
            && self.made_before.is_none_or(|cut| f.made() < Stamp(cut))
    }

    /// Whether a card passes the filters its summary (and whether it is archived) decide:
    /// all but usage, age and group.
    fn keeps_summary(&self, s: &CardSummary, archived: bool) -> bool {
        let q = self.q;
        let unverified = s.trust == Trust::Unverified;
        let awaits_review = !archived && s.is_live() && unverified;
        (q.archived == Some(true) || !archived)
            && q.unverified
                .is_none_or(|u| if u { awaits_review } else { !unverified })
            && self.card_type.is_none_or(|t| t == s.card_type)
            && q.label.as_ref().is_none_or(|l| s.labels.contains(l))
            && q.asset
                .as_ref()
                .is_none_or(|a| s.scope.asset_id.as_ref() == Some(a))
            && q.project
                .as_ref()
                .is_none_or(|p| s.scope.project_id.as_ref() == Some(p))
            && q.agent
                .as_ref()
                .is_none_or(|a| s.scope.agent.as_ref() == Some(a))
            && q.user.as_ref().is_none_or(|u| {
                s.scope.user_id.as_ref() == Some(u)
                    || (unverified
                        && s.provenance.as_ref().and_then(|p| p.user_id.as_ref()) == Some(u))
            })
    }
}

/// The listing filters as a test on a card's summary, for a caller that holds every
/// summary already (the search index): `None` when the filters need what only the rows
/// hold (usage, age, group), so the caller asks [`Store::matching_cards`] instead.
pub fn summary_filter(q: &ListQuery) -> Result<Option<impl Fn(&CardSummary, bool) -> bool + '_>> {
    let filter = Filter::new(q)?;
    if q.stale_days.is_some() || q.older_than_days.is_some() || q.group.is_some() {
        return Ok(None);
    }
    Ok(Some(move |s: &CardSummary, archived: bool| {
        filter.keeps_summary(s, archived)
    }))
}

/// The moment `days` days ago (at most [`MAX_DAYS`]).
/// The fewest deliveries in a window before the staleness report calls a card's tasks
/// mostly failing: below it, a few unlucky tasks would decide.
const FAILING_MIN_TASKS: i64 = 5;

fn days_ago(days: u32) -> Timestamp {
    Timestamp::now() - (i64::from(days.min(MAX_DAYS)) * 24).hours()
}

/// One entry of the queue: a lone card, or a duplicate group's waiting cards.
struct Entry {
    /// The group, when the cards are one.
    group: Option<String>,
    /// Its cards, oldest first.
    cards: Vec<CardId>,
    /// Its oldest card's type and when it was made.
    card_type: String,
    since: Stamp,
    /// A verified card agents flagged (its flag's first verdict is `since`).
    flagged: bool,
}

/// Counts queue entries by type and by age (from when each entry's oldest card was made).
fn count_queue(queue: &[Entry], now: Timestamp) -> ReviewCounts {
    let cut = |days: i64| Stamp(now - (days * 24).hours());
    let (d1, d7, d30) = (cut(1), cut(7), cut(30));
    let mut counts = ReviewCounts::default();
    for entry in queue {
        *counts.by_type.entry(entry.card_type.clone()).or_default() += 1;
        counts.flagged += usize::from(entry.flagged);
        let made = &entry.since;
        if *made >= d1 {
            counts.under_1d += 1;
        } else if *made >= d7 {
            counts.under_7d += 1;
        } else if *made >= d30 {
            counts.under_30d += 1;
        } else {
            counts.older += 1;
        }
    }
    counts
}

fn page_of(offset: Option<usize>, limit: Option<usize>) -> (usize, usize) {
    (
        offset.unwrap_or(0),
        limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE),
    )
}

/// A card as curators see it, with its whole text.
pub type CardText = (CardInfo, String);

/// A page of the review queue: the whole queue counted, and this page's entries, each its
/// cards with their text.
pub struct QueuePage {
    /// Entries in all.
    pub entries: usize,
    /// Waiting cards in all.
    pub cards: usize,
    /// The entries counted by type and age.
    pub counts: ReviewCounts,
    /// This page: each entry's group and its cards (oldest first), with their text.
    pub page: Vec<(Option<String>, Vec<CardText>)>,
}

impl Store {
    /// What curators see of one card row: its own facts, and what its keys find in the
    /// history, usage, intake and group tables (per card, never a scan).
    fn info_of(&self, tx: &Tx<'_>, ws: &str, row: Row) -> Result<CardInfo> {
        let e = self.err("read card facts");
        let id = row.summary.id.to_string();
        let events = tx
            .query_map(
                "SELECT action, actor, at FROM history
                 WHERE workspace = ?1 AND card_id = ?2
                   AND action IN ('reinforce', 'store', 'reject', 'archive', 'unarchive')
                 ORDER BY seq",
                params![ws, id],
                |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?, r.get::<Stamp>(2)?)),
            )
            .map_err(&e)?;
        let mut reinforcements = 0;
        let mut origin: Option<(String, Stamp)> = None;
        // Whether its last archive action was a rejection (an unarchive clears it).
        let mut rejected = false;
        for (action, actor, at) in events {
            match action.as_str() {
                "reinforce" => reinforcements += 1,
                "store" => {
                    origin.get_or_insert((actor, at));
                }
                _ => rejected = action == "reject",
            }
        }
        let summary = row.summary;
        let provenance = (summary.provenance.is_some() || origin.is_some()).then(|| {
            let (node_token, stored_at) = match origin {
                Some((actor, at)) => (
                    Some(actor.strip_prefix("token:").unwrap_or(&actor).to_owned()),
                    Some(at),
                ),
                None => (None, None),
            };
            CardProvenance {
                source: summary.provenance.clone().unwrap_or_default(),
                node_token,
                stored_at,
            }
        });
        let replaced = tx
            .query_map(
                // The ids by their index first: SQLite would otherwise range over the
                // workspace's primary key (its planner cannot tell that few cards share a
                // superseder).
                "SELECT c.summary FROM cards c WHERE c.workspace = ?1 AND c.id IN
                   (SELECT s.id FROM cards s WHERE s.workspace = ?1 AND s.superseded_by = ?2)
                 ORDER BY c.created_at, c.id",
                params![ws, id],
                |r| r.get::<String>(0),
            )
            .map_err(&e)?;
        let merged = replaced
            .iter()
            .filter_map(|json| serde_json::from_str::<CardSummary>(json).ok())
            .map(|s| MergedCard {
                id: s.id,
                provenance: s.provenance,
            })
            .collect();
        let mut usage = self.usage_of(tx, ws, &id)?;
        // The review queue's rule (`flagged_cards`): verified, live, enough users against.
        usage.feedback.flagged = summary.trust == Trust::Verified
            && row.archived_at.is_none()
            && usage.feedback.against_users >= self.intake_policy().flag_min_users.max(1);
        Ok(CardInfo {
            etag: card_etag(&row.sha, row.archived_at.is_some()),
            rejected: row.archived_at.is_some() && rejected,
            archived_at: row.archived_at,
            occurrence: row.occurrence as u64,
            last_seen: row.last_seen,
            reinforcements,
            provenance,
            usage,
            credentials: super::intake::credentials_of(tx, ws, &id).map_err(&e)?,
            duplicate_group: super::intake::duplicate_group(tx, ws, &summary.id).map_err(&e)?,
            previously_rejected: None,
            merged,
            summary,
        })
    }

    /// The rows of the cards `ids` that exist, in that order.
    fn rows_of(&self, tx: &Tx<'_>, ws: &str, ids: &[CardId]) -> Result<Vec<Row>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let id = id.to_string();
            out.extend(read_rows(self, tx, ws, "AND c.id = ?2", &[&id], "")?);
        }
        Ok(out)
    }

    /// The waiting cards (live, unverified) of duplicate group `group`, oldest first;
    /// `None` when `ws` has no such group.
    pub(crate) fn group_waiting(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        group: &str,
    ) -> Result<Option<Vec<CardId>>> {
        let e = self.err("read duplicate group");
        let members = super::intake::group_members(tx, ws, group).map_err(&e)?;
        if members.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            self.rows_of(tx, ws, &members)?
                .into_iter()
                .filter(Row::awaits_review)
                .map(|r| r.summary.id)
                .collect(),
        ))
    }

    /// The cards `ids` as curators see them (ids not in `ws` are left out), in that order.
    pub fn cards_info(&self, ws: &str, ids: &[CardId]) -> Result<Vec<CardInfo>> {
        self.read(|tx| {
            self.rows_of(tx, ws, ids)?
                .into_iter()
                .map(|r| self.info_of(tx, ws, r))
                .collect()
        })
    }

    /// Every workspace's review queue in numbers, read from the per-row flag's index (no
    /// card is parsed): what the metrics report at each scrape.
    pub fn queue_stats(&self) -> Result<Vec<QueueStats>> {
        self.read(|tx| {
            let e = self.err("count the review queue");
            let mut names = Vec::new();
            {
                let mut stmt = tx
                    .prepare_cached("SELECT name FROM workspaces ORDER BY name")
                    .map_err(&e)?;
                for row in stmt.query_map(params![], |r| r.get::<String>(0)).map_err(&e)? {
                    names.push(row.map_err(&e)?);
                }
            }
            let mut out = Vec::with_capacity(names.len());
            for workspace in names {
                let (items, oldest) = tx
                    .query_row(
                        "SELECT COUNT(*), MIN(created_at) FROM cards WHERE workspace = ?1 AND awaiting = 1",
                        params![workspace],
                        |r| Ok((r.get::<u64>(0)?, r.get::<Option<Stamp>>(1)?)),
                    )
                    .map_err(&e)?;
                let groups = tx
                    .query_row(
                        "SELECT COUNT(DISTINCT g.group_id) FROM duplicate_groups g
                         JOIN cards c ON c.workspace = g.workspace AND c.id = g.card_id
                         WHERE g.workspace = ?1 AND c.awaiting = 1",
                        params![workspace],
                        |r| r.get::<u64>(0),
                    )
                    .map_err(&e)?;
                let min_users = self.intake_policy().flag_min_users.max(1);
                let flagged = self.flagged_cards(tx, &workspace, min_users)?.len() as u64;
                out.push(QueueStats {
                    workspace,
                    items,
                    groups,
                    oldest,
                    flagged,
                });
            }
            Ok(out)
        })
    }

    /// One card as curators see it.
    pub fn card_info(&self, ws: &str, id: &CardId) -> Result<CardInfo> {
        self.read(|tx| {
            let row = self
                .rows_of(tx, ws, std::slice::from_ref(id))?
                .pop()
                .ok_or_else(|| not_found(ws, id))?;
            self.info_of(tx, ws, row)
        })
    }

    /// A page of the cards matching `q`, ordered by type, folded title and id.
    pub fn list_cards(&self, ws: &str, q: &ListQuery) -> Result<CardPage> {
        let filter = Filter::new(q)?;
        let (offset, limit) = page_of(q.offset, q.limit);
        self.read(|tx| {
            // A page of what SQL filters alone is read as that page; the rest reads the
            // candidates and filters each.
            let (total, rows) = if filter.in_sql() {
                let total = filter.count_in_sql(self, tx, ws)?;
                (
                    total,
                    filter.rows_paged(self, tx, ws, Some((offset, limit)))?,
                )
            } else {
                let rows = filter.rows(self, tx, ws)?;
                let total = rows.len();
                (total, rows.into_iter().skip(offset).take(limit).collect())
            };
            let cards = rows
                .into_iter()
                .map(|r| self.info_of(tx, ws, r))
                .collect::<Result<Vec<_>>>()?;
            Ok(CardPage {
                total,
                offset,
                cards,
            })
        })
    }

    /// Which of `ids` are live cards (enabled, not superseded, not archived) now.
    pub fn live_ids(&self, ws: &str, ids: &[CardId]) -> Result<HashSet<CardId>> {
        self.read(|tx| {
            let mut live = HashSet::new();
            for id in ids {
                let found = tx
                    .query_row(
                        "SELECT 1 FROM cards WHERE workspace = ?1 AND id = ?2 AND live = 1 AND archived_at IS NULL",
                        params![ws, id.to_string()],
                        |r| r.get::<i64>(0),
                    )
                    .optional()
                    .map_err(self.err("read cards"))?;
                if found.is_some() {
                    live.insert(*id);
                }
            }
            Ok(live)
        })
    }

    /// The files of the cards the filters match (paging ignored: every match), each at
    /// its OKF path, byte for byte as stored: an export.
    pub fn export_matching(&self, ws: &str, q: &ListQuery) -> Result<Vec<(String, Vec<u8>)>> {
        let filter = Filter::new(q)?;
        self.read(|tx| {
            let e = self.err("export");
            let rows = filter.rows(self, tx, ws)?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                let body = super::cards::load_object(tx, ws, &r.sha).map_err(&e)?;
                out.push((r.summary.path(), body));
            }
            Ok(out)
        })
    }

    /// Every card matching `q` (no paging), by id: what a search filters its hits with.
    pub fn matching_cards(&self, ws: &str, q: &ListQuery) -> Result<HashSet<CardId>> {
        let filter = Filter::new(q)?;
        self.read(|tx| {
            Ok(filter
                .rows(self, tx, ws)?
                .into_iter()
                .map(|r| r.summary.id)
                .collect())
        })
    }

    /// The cards matching `q`, inside the caller's transaction, by id.
    pub(crate) fn matching_in(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        q: &ListQuery,
    ) -> Result<Vec<CardInfo>> {
        let filter = Filter::new(q)?;
        let mut out = filter
            .rows(self, tx, ws)?
            .into_iter()
            .map(|r| self.info_of(tx, ws, r))
            .collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|c| c.summary.id);
        Ok(out)
    }

    /// The review queue: unverified live cards, a duplicate group's waiting cards as one
    /// entry, oldest entry first, read from the per-row flag's index; the whole queue
    /// counted, and one page of entries with each card's text (without the nearest cards,
    /// which need the workspace's search index).
    pub fn review_queue(
        &self,
        ws: &str,
        offset: Option<usize>,
        limit: Option<usize>,
    ) -> Result<QueuePage> {
        let (offset, limit) = page_of(offset, limit);
        self.read(|tx| {
            let e = self.err("read the review queue");
            let waiting = tx
                .query_map(
                    "SELECT c.id, c.card_type, COALESCE(c.made_at, c.created_at) AS made, g.group_id
                     FROM cards c
                     LEFT JOIN duplicate_groups g ON g.workspace = c.workspace AND g.card_id = c.id
                     WHERE c.workspace = ?1 AND c.awaiting = 1
                     ORDER BY made, c.id",
                    params![ws],
                    |r| {
                        Ok((
                            r.get::<String>(0)?,
                            r.get::<String>(1)?,
                            r.get::<Stamp>(2)?,
                            r.get::<Option<String>>(3)?,
                        ))
                    },
                )
                .map_err(&e)?;
            let cards = waiting.len();
            let mut queue: Vec<Entry> = Vec::new();
            let mut of_group: HashMap<String, usize> = HashMap::new();
            for (id, card_type, since, group) in waiting {
                let Ok(id) = CardId::parse(&id) else { continue };
                if let Some(g) = &group
                    && let Some(&at) = of_group.get(g)
                {
                    queue[at].cards.push(id);
                    continue;
                }
                if let Some(g) = &group {
                    of_group.insert(g.clone(), queue.len());
                }
                queue.push(Entry {
                    group,
                    cards: vec![id],
                    card_type,
                    since,
                    flagged: false,
                });
            }
            let min_users = self.intake_policy().flag_min_users.max(1);
            for (id, card_type, since) in self.flagged_cards(tx, ws, min_users)? {
                let Ok(id) = CardId::parse(&id) else { continue };
                queue.push(Entry {
                    group: None,
                    cards: vec![id],
                    card_type,
                    since,
                    flagged: true,
                });
            }
            // Oldest first, flag items among the rest by their first verdict.
            queue.sort_by_key(|e| e.since);
            let counts = count_queue(&queue, Timestamp::now());
            let entries = queue.len();
            let mut page = Vec::new();
            for entry in queue.into_iter().skip(offset).take(limit) {
                page.push((entry.group, self.with_text(tx, ws, &entry.cards)?));
            }
            Ok(QueuePage {
                entries,
                cards,
                counts,
                page,
            })
        })
    }

    /// The cards `ids` as a curator decides on them: their facts (a rejected lesson marked)
    /// and each one's whole text.
    fn with_text(&self, tx: &Tx<'_>, ws: &str, ids: &[CardId]) -> Result<Vec<(CardInfo, String)>> {
        let mut infos = self
            .rows_of(tx, ws, ids)?
            .into_iter()
            .map(|r| self.info_of(tx, ws, r))
            .collect::<Result<Vec<_>>>()?;
        self.mark_rejected(tx, ws, &mut infos.iter_mut().collect::<Vec<_>>())?;
        infos
            .into_iter()
            .map(|c| {
                let text = self.text_of(tx, ws, &c.summary.id)?;
                Ok((c, text))
            })
            .collect()
    }

    /// A duplicate group's waiting cards (oldest first) with their text: the group as one
    /// review entry, empty when none waits.
    pub fn group_entry(&self, ws: &str, group: &str) -> Result<Vec<(CardInfo, String)>> {
        self.read(|tx| {
            let waiting = self.group_waiting(tx, ws, group)?.ok_or_else(|| {
                StoreError::NotFound(format!("group {group} not found in workspace {ws}"))
            })?;
            self.with_text(tx, ws, &waiting)
        })
    }

    /// A card, its text, its server facts and its whole history, read in one snapshot
    /// (so the text is the version the tag names).
    pub fn card_details(&self, ws: &str, id: &CardId) -> Result<CardDetails> {
        self.read(|tx| {
            let row = self
                .rows_of(tx, ws, std::slice::from_ref(id))?
                .pop()
                .ok_or_else(|| not_found(ws, id))?;
            let mut card = self.info_of(tx, ws, row)?;
            self.mark_rejected(tx, ws, &mut [&mut card])?;
            let text = self.text_of(tx, ws, id)?;
            let history = self.history_in(tx, ws, id)?;
            Ok(CardDetails {
                card,
                text,
                history,
            })
        })
    }

    /// A card's stored text, as UTF-8 (cards are UTF-8 by the parser's rules).
    fn text_of(&self, tx: &Tx<'_>, ws: &str, id: &CardId) -> Result<String> {
        let e = self.err("read card");
        let row = load_row(tx, ws, id)
            .map_err(&e)?
            .ok_or_else(|| not_found(ws, id))?;
        let raw = super::cards::load_object(tx, ws, &row.sha256).map_err(&e)?;
        Ok(String::from_utf8_lossy(&raw).into_owned())
    }

    /// Every card's summary and body, and whether it is archived, for the server's search
    /// index of `ws`, with the revision they are at.
    #[allow(clippy::type_complexity)]
    pub fn searchable_cards(&self, ws: &str) -> Result<(u64, Vec<(CardSummary, String, bool)>)> {
        self.read(|tx| {
            let e = self.err("read cards for search");
            let revision = current_revision(tx, ws).map_err(&e)?;
            let mut stmt = tx
                .prepare(
                    "SELECT c.summary, o.body, c.archived_at IS NOT NULL FROM cards c
                     JOIN objects o ON o.workspace = c.workspace AND o.sha256 = c.sha256
                     WHERE c.workspace = ?1 ORDER BY c.id",
                )
                .map_err(&e)?;
            let rows = stmt
                .query_map(params![ws], |r| {
                    Ok((r.get::<String>(0)?, r.get::<Vec<u8>>(1)?, r.get::<bool>(2)?))
                })
                .map_err(&e)?;
            let mut out = Vec::new();
            for row in rows {
                let (summary, raw, archived) = row.map_err(&e)?;
                let summary: CardSummary = serde_json::from_str(&summary).map_err(|err| {
                    StoreError::Invalid(format!("stored summary unreadable: {err}"))
                })?;
                let body = mop_cards::card_body(&raw)
                    .map(str::to_owned)
                    .unwrap_or_default();
                out.push((summary, body, archived));
            }
            Ok((revision, out))
        })
    }

    /// The staleness report over a window of `days`: each list read by its own query
    /// (live cards made before the window with no delivery in it, asset cards whose asset
    /// went unnamed, old unverified cards, chains by the per-row superseder).
    pub fn stale(&self, ws: &str, days: u32, chain: usize) -> Result<StaleReport> {
        let days = days.min(MAX_DAYS);
        let cut = Timestamp::now() - (i64::from(days) * 24).hours();
        let cut_stamp = Stamp(cut);
        let cut_text = cut_stamp.to_string();
        self.read(|tx| {
            let named = self.assets_named(tx, ws)?;
            let stale = |f: &Row| StaleCard {
                id: f.summary.id,
                card_type: f.summary.card_type,
                title: f.summary.title.clone(),
                unverified: f.summary.trust == Trust::Unverified,
                asset_id: f.summary.scope.asset_id.clone(),
                created_at: f.made(),
                last_delivered_at: f.last_delivered_at,
                asset_last_named_at: f
                    .summary
                    .scope
                    .asset_id
                    .as_ref()
                    .and_then(|a| named.get(a).copied()),
            };
            // Live cards made before the window, by the index on when each was made.
            let old = read_rows(
                self,
                tx,
                ws,
                "AND c.live = 1 AND c.made_at < ?2",
                &[&cut_text],
                "ORDER BY c.id",
            )?;
            let undelivered = old
                .iter()
                .filter(|f| f.last_delivered_at.is_none_or(|t| t < cut))
                .map(&stale)
                .collect();
            let unnamed_assets = old
                .iter()
                .filter(|f| {
                    f.summary
                        .scope
                        .asset_id
                        .as_ref()
                        .is_some_and(|a| named.get(a).is_none_or(|t| *t < cut))
                })
                .map(&stale)
                .collect();
            let old_unverified = old
                .iter()
                .filter(|f| f.summary.trust == Trust::Unverified)
                .map(&stale)
                .collect();
            let failing = self
                .failing(tx, ws, &cut_text[..10])?
                .into_iter()
                .map(
                    |(row, delivered, outcomes)| mop_proto::curation::FailingCard {
                        card: stale(&row),
                        delivered,
                        outcomes,
                    },
                )
                .collect();
            Ok(StaleReport {
                days,
                chain,
                undelivered,
                unnamed_assets,
                long_chains: self.chains(tx, ws, chain)?,
                old_unverified,
                failing,
            })
        })
    }

    /// Live cards delivered to at least [`FAILING_MIN_TASKS`] tasks since `day`, more than
    /// half of which failed, most failures first.
    fn failing(
        &self,
        tx: &Tx<'_>,
        ws: &str,
        day: &str,
    ) -> Result<Vec<(Row, u64, mop_proto::curation::OutcomeCounts)>> {
        let sums = tx
            .query_map(
                "SELECT d.card_id, CAST(SUM(d.delivered) AS BIGINT), CAST(SUM(d.succeeded) AS BIGINT),
                        CAST(SUM(d.failed) AS BIGINT)
                 FROM card_usage_days d
                 JOIN cards c ON c.workspace = d.workspace AND c.id = d.card_id
                 WHERE d.workspace = ?1 AND d.day >= ?2 AND c.live = 1
                 GROUP BY d.card_id
                 HAVING CAST(SUM(d.delivered) AS BIGINT) >= ?3 AND SUM(d.failed) * 2 > SUM(d.delivered)
                 ORDER BY SUM(d.failed) DESC, d.card_id",
                params![ws, day, FAILING_MIN_TASKS],
                |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<i64>(1)? as u64,
                        r.get::<i64>(2)? as u64,
                        r.get::<i64>(3)? as u64,
                    ))
                },
            )
            .map_err(self.err("read cards delivered to failing tasks"))?;
        let mut out = Vec::new();
        for (id, delivered, succeeded, failed) in sums {
            let Ok(id) = CardId::parse(&id) else { continue };
            if let Some(row) = self.rows_of(tx, ws, &[id])?.pop() {
                let outcomes = mop_proto::curation::OutcomeCounts {
                    succeeded,
                    failed,
                    unknown: delivered.saturating_sub(succeeded + failed),
                };
                out.push((row, delivered, outcomes));
            }
        }
        Ok(out)
    }

    /// Supersede chains longer than `longer_than`, each from its oldest card to the card
    /// that ends it, ordered by the end card's id: read from the per-row superseder.
    fn chains(&self, tx: &Tx<'_>, ws: &str, longer_than: usize) -> Result<Vec<Chain>> {
        let e = self.err("read supersede chains");
        let links = tx
            .query_map(
                "SELECT id, superseded_by FROM cards WHERE workspace = ?1 AND superseded_by IS NOT NULL",
                params![ws],
                |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?)),
            )
            .map_err(&e)?;
        let next: HashMap<CardId, CardId> = links
            .iter()
            .filter_map(|(a, b)| Some((CardId::parse(a).ok()?, CardId::parse(b).ok()?)))
            .collect();
        let mut found = chains(&next, longer_than);
        for chain in &mut found {
            let end = chain.ids.last().expect("a chain has cards");
            chain.title = self
                .rows_of(tx, ws, std::slice::from_ref(end))?
                .pop()
                .map(|r| r.summary.title)
                .unwrap_or_default();
        }
        Ok(found)
    }
}

/// Supersede chains longer than `longer_than` in the links `next` (card → its
/// superseder), each from its oldest card to the card that ends it (titles left empty),
/// ordered by the end card's id.
fn chains(next: &HashMap<CardId, CardId>, longer_than: usize) -> Vec<Chain> {
    let has_older: HashSet<CardId> = next.values().copied().collect();
    let mut out: BTreeMap<CardId, Chain> = BTreeMap::new();
    for start in next.keys().filter(|id| !has_older.contains(id)) {
        let mut ids = vec![*start];
        let mut at = *start;
        // A loop (which the server never writes) ends the walk.
        while let Some(n) = next.get(&at) {
            if ids.contains(n) {
                break;
            }
            ids.push(*n);
            at = *n;
        }
        let longer = out.get(&at).is_none_or(|c| c.ids.len() < ids.len());
        if ids.len() > longer_than && longer {
            out.insert(
                at,
                Chain {
                    ids,
                    title: String::new(),
                },
            );
        }
    }
    out.into_values().collect()
}

fn not_found(ws: &str, id: &CardId) -> StoreError {
    StoreError::NotFound(format!("card {id} not found in workspace {ws}"))
}
