//! The curation API (admin tokens): card listings with provenance, reinforcements and
//! usage; one card's details and history; the review queue with each entry's nearest
//! cards; search; the staleness report. The review actions themselves are card actions
//! (`admin::state`).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use mop_cards::{CardId, Trust};
use mop_proto::curation::{
    CardDetails, CardInfo, CardPage, CredentialCard, DEFAULT_PAGE, ListQuery, MAX_PAGE, Nearest,
    PageQuery, Rejection, ReviewItem, ReviewQueue, SearchHit, SearchResults, StaleQuery,
    StaleReport, Variant,
};

use super::admin::{admin_on, admin_reads};
use super::{ApiError, Caller, blocking};
use crate::search::WorkspaceIndex;
use crate::state::AppState;

/// Nearest cards shown per review entry.
const NEAREST: usize = 5;
/// Default staleness window, in days.
const STALE_DAYS: u32 = 30;
/// Default supersede chain length reported as long.
const STALE_CHAIN: usize = 3;

pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<CardPage>, ApiError> {
    let reading = admin_reads(&state, &caller, &ws, None)?;
    let q = reading.narrow(q)?;
    if q.q.is_some() {
        return Err(ApiError::bad_request(
            "q is the text of a search: send it to /v1/workspaces/{ws}/search",
        ));
    }
    let store = state.store.clone();
    let mut page = blocking(move || store.list_cards(&ws, &q)).await?;
    page.cards.iter_mut().for_each(|c| reading.redact(c));
    Ok(Json(page))
}

pub(crate) async fn details(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Json<CardDetails>, ApiError> {
    let reading = admin_reads(&state, &caller, &ws, Some(&id))?;
    let (store, id, ws2) = (state.store.clone(), reading.card(), ws.clone());
    let mut details = blocking(move || store.card_details(&ws2, &id)).await?;
    reading.check(&ws, &details.card.summary)?;
    reading.redact(&mut details.card);
    if reading.inherited {
        // Earlier texts, reasons and curators' names stay the workspace's own.
        details.history.clear();
    }
    Ok(Json(details))
}

/// The workspace's search index at its current revision.
async fn index(state: &Arc<AppState>, ws: &str) -> Result<Arc<WorkspaceIndex>, ApiError> {
    let revision = state.revision(ws).unwrap_or_default();
    Ok(state.search.get(&state.store, ws, revision).await?)
}

pub(crate) async fn review(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(page): Query<PageQuery>,
) -> Result<Json<ReviewQueue>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    Ok(Json(review_page(&state, ws, &page).await?))
}

/// A page of the review queue with each entry's nearest cards (the caller checked scope).
pub(crate) async fn review_page(
    state: &Arc<AppState>,
    ws: String,
    page: &PageQuery,
) -> Result<ReviewQueue, ApiError> {
    let (store, ws2, offset, limit) = (state.store.clone(), ws.clone(), page.offset, page.limit);
    let queue = blocking(move || store.review_queue(&ws2, offset, limit)).await?;
    let index = index(state, &ws).await?;
    let mut items = Vec::with_capacity(queue.page.len());
    for (group, cards) in queue.page {
        items.extend(item(&index, group, cards)?);
    }
    only_live_nearest(state, &ws, &mut items).await?;
    Ok(ReviewQueue {
        total: queue.entries,
        cards: queue.cards,
        offset: page.offset.unwrap_or(0),
        items,
        counts: queue.counts,
    })
}

/// One review entry: the cards of a lone card or a group (oldest first), with the live
/// cards nearest the first; `None` when no card is left.
fn item(
    index: &WorkspaceIndex,
    group: Option<String>,
    cards: Vec<(CardInfo, String)>,
) -> Result<Option<ReviewItem>, ApiError> {
    let mut cards = cards.into_iter();
    let Some((card, text)) = cards.next() else {
        return Ok(None);
    };
    let variants: Vec<Variant> = cards
        .map(|(card, text)| Variant {
            unshown: unshown(&text),
            card,
            text,
        })
        .collect();
    let mut skip: Vec<CardId> = variants.iter().map(|v| v.card.summary.id).collect();
    skip.push(card.summary.id);
    let nearest = nearest(index, &card, &skip)?;
    // The queue holds unverified cards and, verified, only the ones agents flagged.
    let flagged = card.summary.trust == mop_cards::Trust::Verified;
    Ok(Some(ReviewItem {
        flagged,
        unshown: unshown(&text),
        card,
        text,
        nearest,
        group,
        variants,
    }))
}

/// `GET /v1/workspaces/{ws}/groups/{group}`: a duplicate group's waiting cards as one
/// review entry (404 when none waits).
pub(crate) async fn group(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, group)): Path<(String, String)>,
) -> Result<Json<ReviewItem>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    Ok(Json(group_item(&state, ws, group).await?))
}

/// A duplicate group as one review entry (the caller checked scope).
pub(crate) async fn group_item(
    state: &Arc<AppState>,
    ws: String,
    group: String,
) -> Result<ReviewItem, ApiError> {
    let (store, ws2, g) = (state.store.clone(), ws.clone(), group.clone());
    let cards = blocking(move || store.group_entry(&ws2, &g)).await?;
    let index = index(state, &ws).await?;
    let found = item(&index, Some(group.clone()), cards)?.ok_or_else(|| {
        ApiError::not_found(format!(
            "no card of group {group} waits for review in workspace {ws}"
        ))
    })?;
    let mut items = vec![found];
    only_live_nearest(state, &ws, &mut items).await?;
    Ok(items.pop().expect("one item"))
}

/// Leaves out of each entry's nearest cards those no longer live: the index may be behind
/// the rows (rebuilt in the background, or on another server), and a card deleted for
/// good must not be named from it.
async fn only_live_nearest(
    state: &Arc<AppState>,
    ws: &str,
    items: &mut [ReviewItem],
) -> Result<(), ApiError> {
    let ids: Vec<CardId> = items
        .iter()
        .flat_map(|i| i.nearest.iter().map(|n| n.id))
        .collect();
    let (store, ws) = (state.store.clone(), ws.to_owned());
    let live = blocking(move || store.live_ids(&ws, &ids)).await?;
    for i in items {
        i.nearest.retain(|n| live.contains(&n.id));
    }
    Ok(())
}

/// What a rendering of `text` leaves out, in words.
fn unshown(text: &str) -> Vec<String> {
    mop_cards::unshown(text)
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The live cards closest to `card` by what it is about, leaving out `skip` (the entry's
/// own cards).
fn nearest(
    index: &WorkspaceIndex,
    card: &CardInfo,
    skip: &[CardId],
) -> Result<Vec<Nearest>, ApiError> {
    let s = &card.summary;
    // What the card is about: its summary, not its body (a long body would drown the
    // title's words).
    let mut about = format!(
        "{}\n{}\n{}",
        s.title,
        s.description.as_deref().unwrap_or(""),
        s.labels.join(" ")
    );
    for code in &s.error_codes {
        about.push(' ');
        about.push_str(code);
    }
    let hits = index.nearest(s.id, &about, NEAREST, |c, archived| {
        !skip.contains(&c.id) && c.is_live() && !archived
    })?;
    Ok(hits
        .into_iter()
        .map(|(ord, score)| {
            let c = &index.cards[ord];
            Nearest {
                id: c.id,
                card_type: c.card_type,
                title: c.title.clone(),
                unverified: c.trust == Trust::Unverified,
                score,
            }
        })
        .collect())
}

pub(crate) async fn search(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(filters): Query<ListQuery>,
) -> Result<Json<SearchResults>, ApiError> {
    let reading = admin_reads(&state, &caller, &ws, None)?;
    let filters = reading.narrow(filters)?;
    let mut results = search_cards(&state, ws, filters).await?;
    results
        .hits
        .iter_mut()
        .for_each(|h| reading.redact(&mut h.card));
    Ok(Json(results))
}

/// Searches the cards matching `filters` for `filters.q` (the caller checked scope).
pub(crate) async fn search_cards(
    state: &Arc<AppState>,
    ws: String,
    filters: ListQuery,
) -> Result<SearchResults, ApiError> {
    let text = filters.q.clone().unwrap_or_default();
    if text.trim().is_empty() || text.len() > 4096 {
        return Err(ApiError::bad_request("q must be 1 to 4096 bytes of text"));
    }
    let limit = filters.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let index = index(state, &ws).await?;
    // The filters choose the cards (archived ones only with `archived`): on the index's own
    // summaries when they can, else by the rows.
    let (hits, searched) = match crate::store::summary_filter(&filters)? {
        Some(keep) => (index.search(&text, limit, &keep)?, index.count(&keep)),
        None => {
            let (store, ws2, filters) = (state.store.clone(), ws.clone(), filters.clone());
            let matching = blocking(move || store.matching_cards(&ws2, &filters)).await?;
            let hits = index.search(&text, limit, |c, _| matching.contains(&c.id))?;
            (hits, matching.len())
        }
    };
    // Only the hits are read in full.
    let ids: Vec<CardId> = hits.iter().map(|(ord, _)| index.cards[*ord].id).collect();
    let store = state.store.clone();
    let mut cards: std::collections::HashMap<CardId, CardInfo> =
        blocking(move || store.cards_info(&ws, &ids))
            .await?
            .into_iter()
            .map(|c| (c.summary.id, c))
            .collect();
    // A card removed since the index was read is left out.
    let hits = hits
        .into_iter()
        .filter_map(|(ord, score)| {
            let card = cards.remove(&index.cards[ord].id)?;
            Some(SearchHit { card, score })
        })
        .collect();
    Ok(SearchResults { hits, searched })
}

pub(crate) async fn stale(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(q): Query<StaleQuery>,
) -> Result<Json<StaleReport>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let days = q.days.unwrap_or(STALE_DAYS);
    let chain = q.chain.unwrap_or(STALE_CHAIN);
    let store = state.store.clone();
    Ok(Json(blocking(move || store.stale(&ws, days, chain)).await?))
}

/// `GET /v1/workspaces/{ws}/credentials`: every card (archived ones too) whose text
/// carries a credential, by id, with each finding's kind and place; never a title or text.
pub(crate) async fn credentials(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
) -> Result<Json<Vec<CredentialCard>>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let store = state.store.clone();
    Ok(Json(blocking(move || store.credential_cards(&ws)).await?))
}

/// `GET /v1/workspaces/{ws}/rejections`: the rejection tombstones, newest first.
pub(crate) async fn rejections(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
) -> Result<Json<Vec<Rejection>>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let store = state.store.clone();
    Ok(Json(blocking(move || store.rejections(&ws)).await?))
}

/// `POST /v1/workspaces/{ws}/rejections/{id}/lift`: later stores of that lesson are no
/// longer refused (audited in the rejected card's history).
pub(crate) async fn lift(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Json<Rejection>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    Ok(Json(lift_rejection(&state, &caller, &ws, id).await?))
}

/// Lifts a tombstone (the caller checked role and scope): the API's and the console's.
pub(crate) async fn lift_rejection(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    id: String,
) -> Result<Rejection, ApiError> {
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.to_owned());
    let lifted = blocking(move || store.lift_rejection(&ws2, &id, &actor)).await?;
    tracing::info!(workspace = %ws, rejection = %lifted.id, token = %caller.0.id, "rejection lifted");
    Ok(lifted)
}
