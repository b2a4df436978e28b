//! The curation API (admin tokens): card listings with provenance, reinforcements and
//! usage; one card's details and history; the review queue with each entry's nearest
//! cards; search; the staleness report. The review actions themselves are card actions
//! (`admin::state`).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use mop_cards::Trust;
use mop_proto::curation::{
    CardDetails, CardPage, CredentialCard, DEFAULT_PAGE, ListQuery, MAX_PAGE, Nearest, PageQuery,
    Rejection, ReviewItem, ReviewQueue, SearchHit, SearchResults, StaleQuery, StaleReport,
};

use super::admin::admin_on;
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
    admin_on(&state, &caller, &ws, None)?;
    if q.q.is_some() {
        return Err(ApiError::bad_request(
            "q is the text of a search: send it to /v1/workspaces/{ws}/search",
        ));
    }
    let store = state.store.clone();
    Ok(Json(blocking(move || store.list_cards(&ws, &q)).await?))
}

pub(crate) async fn details(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Json<CardDetails>, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    let store = state.store.clone();
    Ok(Json(blocking(move || store.card_details(&ws, &id)).await?))
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
    let (counts, cards) = blocking(move || store.review_queue(&ws2, offset, limit)).await?;
    let index = index(state, &ws).await?;
    let mut items = Vec::with_capacity(cards.len());
    for (card, text) in cards {
        let s = &card.summary;
        // What the card is about: its summary, not its body (a long body would drown
        // the title's words).
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
        let id = s.id;
        let hits = index.search(&about, NEAREST, |c, archived| {
            c.id != id && c.is_live() && !archived
        })?;
        let nearest = hits
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
            .collect();
        let unshown = mop_cards::unshown(&text)
            .iter()
            .map(ToString::to_string)
            .collect();
        items.push(ReviewItem {
            card,
            text,
            nearest,
            unshown,
        });
    }
    Ok(ReviewQueue {
        total: counts.total(),
        offset: page.offset.unwrap_or(0),
        items,
        counts,
    })
}

pub(crate) async fn search(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(filters): Query<ListQuery>,
) -> Result<Json<SearchResults>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    Ok(Json(search_cards(&state, ws, filters).await?))
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
    let (store, ws2) = (state.store.clone(), ws.clone());
    let mut matching = blocking(move || store.matching_cards(&ws2, &filters)).await?;
    let index = index(state, &ws).await?;
    // The filters chose the cards (archived ones only with `archived`).
    let hits = index.search(&text, limit, |c, _| matching.contains_key(&c.id))?;
    let searched = matching.len();
    let hits = hits
        .into_iter()
        .filter_map(|(ord, score)| {
            let card = matching.remove(&index.cards[ord].id)?;
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
