//! What curators read: cards with their provenance, reinforcements and usage; the review
//! queue; the staleness report. (What curators do is decided in `service::curation`.)

use std::collections::{BTreeMap, HashMap};

use super::db::{Tx, params};
use jiff::{Timestamp, ToSpan};
use mop_cards::{CardId, CardSummary, CardType, Trust};
use mop_proto::curation::{
    CardDetails, CardInfo, CardPage, CardProvenance, Chain, DEFAULT_PAGE, ListQuery, MAX_PAGE,
    ReviewCounts, StaleCard, StaleReport, card_etag,
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
}

/// A card row with what curators see of it.
struct Full {
    info: CardInfo,
    /// When the card was made: its `created_at`, else when the server first had it.
    created_at: Stamp,
}

fn invalid(field: &str, rule: &str) -> StoreError {
    StoreError::Invalid(format!("{field} {rule}"))
}

/// The listing filters, checked.
struct Filter<'a> {
    q: &'a ListQuery,
    card_type: Option<CardType>,
    stale_before: Option<Timestamp>,
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
            stale_before: q
                .stale_days
                .map(|d| Timestamp::now() - (i64::from(d.min(MAX_DAYS)) * 24).hours()),
        })
    }

    fn keeps(&self, f: &Full) -> bool {
        let s = &f.info.summary;
        let q = self.q;
        let unverified = s.trust == Trust::Unverified;
        (q.archived == Some(true) || f.info.archived_at.is_none())
            && q.unverified.is_none_or(|u| {
                if u {
                    f.info.awaits_review()
                } else {
                    !unverified
                }
            })
            && self.card_type.is_none_or(|t| t == s.card_type)
            && q.label.as_ref().is_none_or(|l| s.labels.contains(l))
            && q.asset
                .as_ref()
                .is_none_or(|a| s.scope.asset_id.as_ref() == Some(a))
            && q.user.as_ref().is_none_or(|u| {
                s.scope.user_id.as_ref() == Some(u)
                    || (unverified
                        && s.provenance.as_ref().and_then(|p| p.user_id.as_ref()) == Some(u))
            })
            && self.stale_before.is_none_or(|cut| {
                f.info.usage.last_delivered_at.is_none_or(|t| t < cut) && f.created_at < Stamp(cut)
            })
    }
}

/// Counts queue entries by type and by age (from when each card was made).
fn count_queue(queue: &[Full], now: Timestamp) -> ReviewCounts {
    let cut = |days: i64| Stamp(now - (days * 24).hours());
    let (d1, d7, d30) = (cut(1), cut(7), cut(30));
    let mut counts = ReviewCounts::default();
    for f in queue {
        *counts
            .by_type
            .entry(f.info.summary.card_type.as_str().to_owned())
            .or_default() += 1;
        let made = &f.created_at;
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

impl Store {
    /// Every card of `ws` with its server facts, usage and provenance.
    fn full_cards(&self, tx: &Tx<'_>, ws: &str) -> Result<Vec<Full>> {
        let e = self.err("read cards");
        let mut usage = self.usage_map(tx, ws)?;
        let mut credentials = super::intake::credentials_by_card(tx, ws).map_err(&e)?;
        let mut groups = super::intake::groups_by_card(tx, ws).map_err(&e)?;
        let mut reinforced: HashMap<String, u64> = HashMap::new();
        // Whether the card's last archive action was a rejection (an unarchive clears it).
        let mut rejected: HashMap<String, bool> = HashMap::new();
        let mut origins: HashMap<String, (String, Stamp)> = HashMap::new();
        {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT card_id, action, actor, at FROM history
                     WHERE workspace = ?1
                       AND action IN ('reinforce', 'store', 'reject', 'archive', 'unarchive')
                     ORDER BY seq",
                )
                .map_err(&e)?;
            let rows = stmt
                .query_map(params![ws], |r| {
                    Ok((
                        r.get::<Option<String>>(0)?,
                        r.get::<String>(1)?,
                        r.get::<String>(2)?,
                        r.get::<Stamp>(3)?,
                    ))
                })
                .map_err(&e)?;
            for row in rows {
                let (Some(id), action, actor, at) = row.map_err(&e)? else {
                    continue;
                };
                match action.as_str() {
                    "reinforce" => *reinforced.entry(id).or_default() += 1,
                    "store" => {
                        origins.entry(id).or_insert((actor, at));
                    }
                    _ => {
                        rejected.insert(id, action == "reject");
                    }
                }
            }
        }
        let mut stmt = tx
            .prepare_cached(
                "SELECT summary, sha256, occurrence, last_seen, archived_at, created_at
                 FROM cards WHERE workspace = ?1",
            )
            .map_err(&e)?;
        let rows = stmt
            .query_map(params![ws], |r| {
                Ok((
                    r.get::<String>(0)?,
                    r.get::<String>(1)?,
                    r.get::<i64>(2)?,
                    r.get::<Option<Stamp>>(3)?,
                    r.get::<Option<Stamp>>(4)?,
                    r.get::<Stamp>(5)?,
                ))
            })
            .map_err(&e)?;
        let mut out = Vec::new();
        for row in rows {
            let (summary, sha, occurrence, last_seen, archived_at, created_at) = row.map_err(&e)?;
            let summary: CardSummary = serde_json::from_str(&summary)
                .map_err(|err| StoreError::Invalid(format!("stored summary unreadable: {err}")))?;
            let id = summary.id.to_string();
            let origin = origins.remove(&id);
            let provenance = (summary.provenance.is_some() || origin.is_some()).then(|| {
                let p = summary.provenance.clone().unwrap_or_default();
                let (node_token, stored_at) = match origin {
                    Some((actor, at)) => (
                        Some(actor.strip_prefix("token:").unwrap_or(&actor).to_owned()),
                        Some(at),
                    ),
                    None => (None, None),
                };
                CardProvenance {
                    source: p,
                    node_token,
                    stored_at,
                }
            });
            let created_at = summary.created_at.map(Stamp).unwrap_or(created_at);
            let was_rejected = archived_at.is_some() && rejected.remove(&id).unwrap_or(false);
            out.push(Full {
                info: CardInfo {
                    etag: card_etag(&sha, archived_at.is_some()),
                    archived_at,
                    occurrence: occurrence as u64,
                    last_seen,
                    reinforcements: reinforced.remove(&id).unwrap_or(0),
                    provenance,
                    usage: usage.remove(&id).unwrap_or_default(),
                    credentials: credentials.remove(&id).unwrap_or_default(),
                    duplicate_group: groups.remove(&id),
                    previously_rejected: None,
                    rejected: was_rejected,
                    summary,
                },
                created_at,
            });
        }
        Ok(out)
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
                out.push(QueueStats {
                    workspace,
                    items,
                    groups,
                    oldest,
                });
            }
            Ok(out)
        })
    }

    /// One card as curators see it.
    pub fn card_info(&self, ws: &str, id: &CardId) -> Result<CardInfo> {
        self.read(|tx| {
            self.full_cards(tx, ws)?
                .into_iter()
                .find(|f| f.info.summary.id == *id)
                .map(|f| f.info)
                .ok_or_else(|| not_found(ws, id))
        })
    }

    /// A page of the cards matching `q`, ordered by type, title and id.
    pub fn list_cards(&self, ws: &str, q: &ListQuery) -> Result<CardPage> {
        let filter = Filter::new(q)?;
        let (offset, limit) = page_of(q.offset, q.limit);
        self.read(|tx| {
            let mut cards: Vec<CardInfo> = self
                .full_cards(tx, ws)?
                .into_iter()
                .filter(|f| filter.keeps(f))
                .map(|f| f.info)
                .collect();
            cards.sort_by(|a, b| {
                (a.summary.card_type.as_str(), &a.summary.title, a.summary.id).cmp(&(
                    b.summary.card_type.as_str(),
                    &b.summary.title,
                    b.summary.id,
                ))
            });
            let total = cards.len();
            Ok(CardPage {
                total,
                offset,
                cards: cards.into_iter().skip(offset).take(limit).collect(),
            })
        })
    }

    /// Every card matching `q` (no paging), by id: what a search filters its hits with.
    pub fn matching_cards(&self, ws: &str, q: &ListQuery) -> Result<HashMap<CardId, CardInfo>> {
        let filter = Filter::new(q)?;
        self.read(|tx| {
            Ok(self
                .full_cards(tx, ws)?
                .into_iter()
                .filter(|f| filter.keeps(f))
                .map(|f| (f.info.summary.id, f.info))
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
        let mut out: Vec<CardInfo> = self
            .full_cards(tx, ws)?
            .into_iter()
            .filter(|f| filter.keeps(f))
            .map(|f| f.info)
            .collect();
        out.sort_by_key(|c| c.summary.id);
        Ok(out)
    }

    /// Unverified live cards, oldest first, each with its text: the review queue (without
    /// the nearest cards, which need the workspace's search index), and the whole queue
    /// counted by type and age.
    pub fn review_queue(
        &self,
        ws: &str,
        offset: Option<usize>,
        limit: Option<usize>,
    ) -> Result<(ReviewCounts, Vec<(CardInfo, String)>)> {
        let (offset, limit) = page_of(offset, limit);
        self.read(|tx| {
            let mut queue: Vec<Full> = self
                .full_cards(tx, ws)?
                .into_iter()
                .filter(|f| {
                    f.info.summary.trust == Trust::Unverified
                        && f.info.summary.is_live()
                        && f.info.archived_at.is_none()
                })
                .collect();
            queue.sort_by(|a, b| {
                (&a.created_at, a.info.summary.id).cmp(&(&b.created_at, b.info.summary.id))
            });
            let counts = count_queue(&queue, Timestamp::now());
            let mut page = queue
                .into_iter()
                .skip(offset)
                .take(limit)
                .map(|f| {
                    let text = self.text_of(tx, ws, &f.info.summary.id)?;
                    Ok((f.info, text))
                })
                .collect::<Result<Vec<_>>>()?;
            self.mark_rejected(
                tx,
                ws,
                &mut page.iter_mut().map(|(c, _)| c).collect::<Vec<_>>(),
            )?;
            Ok((counts, page))
        })
    }

    /// A card, its text, its server facts and its whole history, read in one snapshot
    /// (so the text is the version the tag names).
    pub fn card_details(&self, ws: &str, id: &CardId) -> Result<CardDetails> {
        self.read(|tx| {
            let mut card = self
                .full_cards(tx, ws)?
                .into_iter()
                .find(|f| f.info.summary.id == *id)
                .map(|f| f.info)
                .ok_or_else(|| not_found(ws, id))?;
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

    /// The staleness report over a window of `days`.
    pub fn stale(&self, ws: &str, days: u32, chain: usize) -> Result<StaleReport> {
        let days = days.min(MAX_DAYS);
        let cut = Timestamp::now() - (i64::from(days) * 24).hours();
        let cut_stamp = Stamp(cut);
        self.read(|tx| {
            let cards = self.full_cards(tx, ws)?;
            let named = self.assets_named(tx, ws)?;
            let stale = |f: &Full| StaleCard {
                id: f.info.summary.id,
                card_type: f.info.summary.card_type,
                title: f.info.summary.title.clone(),
                unverified: f.info.summary.trust == Trust::Unverified,
                asset_id: f.info.summary.scope.asset_id.clone(),
                created_at: f.created_at,
                last_delivered_at: f.info.usage.last_delivered_at,
                asset_last_named_at: f
                    .info
                    .summary
                    .scope
                    .asset_id
                    .as_ref()
                    .and_then(|a| named.get(a).copied()),
            };
            let live: Vec<&Full> = cards
                .iter()
                .filter(|f| f.info.summary.is_live() && f.info.archived_at.is_none())
                .collect();
            let old = |f: &&&Full| f.created_at < cut_stamp;
            let undelivered = live
                .iter()
                .filter(old)
                .filter(|f| f.info.usage.last_delivered_at.is_none_or(|t| t < cut))
                .map(|f| stale(f))
                .collect();
            let unnamed_assets = live
                .iter()
                .filter(old)
                .filter(|f| {
                    f.info
                        .summary
                        .scope
                        .asset_id
                        .as_ref()
                        .is_some_and(|a| named.get(a).is_none_or(|t| *t < cut))
                })
                .map(|f| stale(f))
                .collect();
            let old_unverified = live
                .iter()
                .filter(old)
                .filter(|f| f.info.summary.trust == Trust::Unverified)
                .map(|f| stale(f))
                .collect();
            Ok(StaleReport {
                days,
                chain,
                undelivered,
                unnamed_assets,
                long_chains: chains(&cards, chain),
                old_unverified,
            })
        })
    }
}

/// Supersede chains longer than `longer_than`, each from its oldest card to the card
/// that ends it, ordered by the end card's id.
fn chains(cards: &[Full], longer_than: usize) -> Vec<Chain> {
    let by_id: HashMap<CardId, &Full> = cards.iter().map(|f| (f.info.summary.id, f)).collect();
    let next: HashMap<CardId, CardId> = cards
        .iter()
        .filter_map(|f| Some((f.info.summary.id, f.info.summary.superseded_by?)))
        .collect();
    let has_older: std::collections::HashSet<CardId> = next.values().copied().collect();
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
            let title = by_id
                .get(&at)
                .map(|f| f.info.summary.title.clone())
                .unwrap_or_default();
            out.insert(at, Chain { ids, title });
        }
    }
    out.into_values().collect()
}

fn not_found(ws: &str, id: &CardId) -> StoreError {
    StoreError::NotFound(format!("card {id} not found in workspace {ws}"))
}
