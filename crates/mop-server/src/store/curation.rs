//! What curators read and do: cards with their provenance, reinforcements and usage; the
//! review actions (verify with edits, reject, merge); the staleness report. Every action is
//! one transaction with its audit rows, conditional on the card's version when the caller
//! sends one ([`Expect`]).

use std::collections::{BTreeMap, HashMap};

use super::db::{Tx, params};
use jiff::{Timestamp, ToSpan};
use mop_cards::{CardId, CardSummary, CardType, Trust, parse_card, render_card};
use mop_proto::curation::{
    CardChange, CardDetails, CardInfo, CardPage, CardProvenance, Chain, DEFAULT_PAGE, ListQuery,
    MAX_PAGE, ReviewCounts, StaleCard, StaleReport, card_etag,
};
use mop_proto::time::Stamp;

use super::cards::{CardState, Expect, audit, current_revision, load_row, screen_admin};
use super::{Result, Store, StoreError};

/// Longest reason a rejection may give.
const MAX_REASON: usize = 500;
/// Longest staleness window, in days (ten years; longer ones are taken as this).
const MAX_DAYS: u32 = 3650;

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
            && q.unverified.is_none_or(|u| u == unverified)
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
        let mut origins: HashMap<String, (String, Stamp)> = HashMap::new();
        {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT card_id, action, actor, at FROM history
                     WHERE workspace = ?1 AND action IN ('reinforce', 'store') ORDER BY seq",
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
                if action == "reinforce" {
                    *reinforced.entry(id).or_default() += 1;
                } else {
                    origins.entry(id).or_insert((actor, at));
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
                    summary,
                },
                created_at,
            });
        }
        Ok(out)
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

    /// Every live card's text, for the server's search index of `ws`: (id, title,
    /// description, labels, body, live).
    pub fn searchable_cards(&self, ws: &str) -> Result<(u64, Vec<(CardSummary, String)>)> {
        self.read(|tx| {
            let e = self.err("read cards for search");
            let revision = current_revision(tx, ws).map_err(&e)?;
            let mut stmt = tx
                .prepare(
                    "SELECT c.summary, o.body FROM cards c
                     JOIN objects o ON o.workspace = c.workspace AND o.sha256 = c.sha256
                     WHERE c.workspace = ?1 AND c.archived_at IS NULL ORDER BY c.id",
                )
                .map_err(&e)?;
            let rows = stmt
                .query_map(params![ws], |r| {
                    Ok((r.get::<String>(0)?, r.get::<Vec<u8>>(1)?))
                })
                .map_err(&e)?;
            let mut out = Vec::new();
            for row in rows {
                let (summary, raw) = row.map_err(&e)?;
                let summary: CardSummary = serde_json::from_str(&summary).map_err(|err| {
                    StoreError::Invalid(format!("stored summary unreadable: {err}"))
                })?;
                let body = mop_cards::card_body(&raw)
                    .map(str::to_owned)
                    .unwrap_or_default();
                out.push((summary, body));
            }
            Ok((revision, out))
        })
    }

    /// Verifies a card, after replacing its text with `edited` when given (the edit must
    /// keep the card's id). One audit row says both. A card whose text carries a credential
    /// is refused (a verify would send it to every task) unless `allow_credentials`.
    pub fn verify(
        &self,
        ws: &str,
        id: &CardId,
        edited: Option<&[u8]>,
        actor: &str,
        expect: Expect<'_>,
        allow_credentials: bool,
    ) -> Result<CardChange> {
        let allow: &[CardId] = if allow_credentials {
            std::slice::from_ref(id)
        } else {
            &[]
        };
        let Some(raw) = edited else {
            // The text screened is the text verified: one transaction.
            return self.write(|tx| {
                let e = self.err("verify");
                let row = load_row(tx, ws, id)
                    .map_err(&e)?
                    .ok_or_else(|| not_found(ws, id))?;
                let current = super::cards::load_object(tx, ws, &row.sha256).map_err(&e)?;
                let allowed = screen_admin(&current, id, allow)?;
                self.set_state_in(
                    tx,
                    ws,
                    id,
                    CardState::Verify,
                    actor,
                    expect,
                    allowed.as_deref(),
                )
            });
        };
        let mut card = parse_card(raw)
            .map_err(|e| StoreError::Invalid(format!("edited card is not valid OKF: {e}")))?;
        if card.summary.id != *id {
            return Err(StoreError::Invalid(format!(
                "the edited text has id {} but the request names {id}; keep the id",
                card.summary.id
            )));
        }
        card.summary.trust = Trust::Verified;
        let new_raw = render_card(&card).into_bytes();
        let detail = match screen_admin(&new_raw, id, allow)? {
            Some(allowed) => format!("with edits; {allowed}"),
            None => "with edits".to_owned(),
        };
        self.replace_text(
            ws,
            &card,
            &new_raw,
            actor,
            expect,
            ("verify", Some(&detail)),
        )
    }

    /// Rejects a card: archives it (out of every task now, purged after the archive
    /// retention) with the curator's reason in its history, and keeps a tombstone of its
    /// lesson (fingerprint, reason, curator; no text) that outlives the purge: a later store
    /// of the same lesson is refused with the reason (or queued marked, as configured).
    pub fn reject(
        &self,
        ws: &str,
        id: &CardId,
        reason: &str,
        actor: &str,
        expect: Expect<'_>,
    ) -> Result<CardChange> {
        let reason = reason.trim();
        if reason.is_empty()
            || reason.chars().count() > MAX_REASON
            || reason.chars().any(char::is_control)
        {
            return Err(invalid(
                "reason",
                &format!(
                    "must be 1 to {MAX_REASON} characters on one line (say why the card is rejected)"
                ),
            ));
        }
        let detail = format!("reason={reason}");
        self.write(|tx| {
            let e = self.err("keep tombstone");
            let row = load_row(tx, ws, id)
                .map_err(&e)?
                .ok_or_else(|| not_found(ws, id))?;
            let change =
                self.set_state_in(tx, ws, id, CardState::Reject, actor, expect, Some(&detail))?;
            if change.changed {
                super::intake::bury(tx, ws, id, &row.summary, reason, actor).map_err(&e)?;
            }
            Ok(change)
        })
    }

    /// Merges card `id` into `into`: `id` is superseded by `into`, and `into` takes over
    /// its counters (occurrence added, the later last-seen kept). Both cards' histories
    /// record it.
    pub fn merge(
        &self,
        ws: &str,
        id: &CardId,
        into: &CardId,
        actor: &str,
        expect: Expect<'_>,
    ) -> Result<CardChange> {
        if id == into {
            return Err(invalid(
                "into",
                "must name another card, not the card itself",
            ));
        }
        self.write(|tx| {
            let e = self.err("merge cards");
            let from = load_row(tx, ws, id).map_err(&e)?.ok_or_else(|| not_found(ws, id))?;
            let target = load_row(tx, ws, into).map_err(&e)?.ok_or_else(|| {
                StoreError::Invalid(format!("into: card {into} not found in workspace {ws}"))
            })?;
            // Counters move once: a card merged (or superseded, or archived) already has
            // nothing left to give, and a retry must not count it twice.
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
            // What reached everyone must not end up where fewer tasks see it. (An
            // unverified card reached only its author's tasks: folding it into a curated
            // card is what merging is for.)
            let (f, t) = (&from.summary, &target.summary);
            if f.trust == Trust::Verified && t.trust == Trust::Unverified {
                return Err(invalid(
                    "into",
                    &format!("names an unverified card; verify {into} first, then merge the verified card {id} into it"),
                ));
            }
            let narrower = |a: &Option<String>, b: &Option<String>| b.is_some() && a != b;
            if f.trust == Trust::Verified
                && (narrower(&f.scope.user_id, &t.scope.user_id)
                    || narrower(&f.scope.asset_id, &t.scope.asset_id))
            {
                return Err(invalid(
                    "into",
                    &format!("names a card with a narrower scope than {id} (another or an extra user or asset binding); its tasks would lose the card"),
                ));
            }
            let pending: (i64, Option<String>) = tx
                .query_row(
                    "SELECT pending_occurrence, pending_last_seen FROM cards WHERE workspace = ?1 AND id = ?2",
                    params![ws, id.to_string()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(&e)?;
            let detail = format!("merged into {into}");
            let result = self.set_state_in(tx, ws, id, CardState::Supersede(*into), actor, expect, Some(&detail))?;
            let last_seen = match (&target.last_seen, &from.last_seen) {
                (Some(a), Some(b)) => Some(a.max(b).clone()),
                (a, b) => a.clone().or_else(|| b.clone()),
            };
            let occurrence = target.occurrence + from.occurrence;
            let rev = result.revision;
            tx.execute(
                "UPDATE cards SET occurrence = ?3, last_seen = ?4, rev = ?5,
                    pending_occurrence = pending_occurrence + ?6,
                    pending_last_seen = CASE WHEN COALESCE(pending_last_seen, '') > COALESCE(?7, '')
                        THEN COALESCE(pending_last_seen, '') ELSE COALESCE(?7, '') END
                 WHERE workspace = ?1 AND id = ?2",
                params![ws, into.to_string(), occurrence as i64, last_seen, rev as i64, pending.0, pending.1],
            )
            .map_err(&e)?;
            tx.execute(
                "UPDATE cards SET pending_occurrence = 0, pending_last_seen = NULL WHERE workspace = ?1 AND id = ?2",
                params![ws, id.to_string()],
            )
            .map_err(&e)?;
            audit(
                tx,
                ws,
                Some(into),
                rev,
                actor,
                "merge",
                Some(&target.sha256),
                Some(&target.sha256),
                None,
                Some(&format!("merged {id} in: occurrence {} + {} = {occurrence}", target.occurrence, from.occurrence)),
            )
            .map_err(&e)?;
            Ok(result)
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
