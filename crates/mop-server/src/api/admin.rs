//! Admin endpoints (admin tokens only): create, read, update, state changes, history, hard
//! delete, and publishing counters on demand.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mop_cards::CardId;
use serde::Deserialize;

use super::{ApiError, Caller, blocking, json, read_body};
use crate::state::AppState;
use crate::store::{CardChange, CardState, HistoryRow};

fn card_id(id: &str) -> Result<CardId, ApiError> {
    CardId::parse(id).map_err(|e| ApiError::bad_request(format!("card id: {e}")))
}

/// Checks role and scope; returns the card id.
fn admin_on(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    id: Option<&str>,
) -> Result<Option<CardId>, ApiError> {
    caller.workspace(state, ws)?;
    caller.admin()?;
    id.map(card_id).transpose()
}

fn changed(state: &AppState, ws: &str, change: &CardChange, what: &str, caller: &Caller) {
    state.note_revision(ws, change.revision);
    if change.changed {
        tracing::info!(workspace = %ws, card = %change.id, revision = change.revision,
            token = %caller.0.id, "card {what}");
    }
}

pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<CardChange>), ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let raw = read_body(&state, &headers, body).await?;
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.clone());
    let change = blocking(move || store.create_card(&ws2, &raw, &actor)).await?;
    changed(&state, &ws, &change, "created", &caller);
    Ok((StatusCode::CREATED, Json(change)))
}

pub(crate) async fn read(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    let store = state.store.clone();
    let (raw, archived) = blocking(move || store.card_text(&ws, &id)).await?;
    let mut response = Response::new(Body::from(raw));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/markdown; charset=utf-8"),
    );
    if let Some(at) = archived.and_then(|a| HeaderValue::from_str(&a).ok()) {
        h.insert("x-mop-archived-at", at);
    }
    Ok(response)
}

pub(crate) async fn update(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<CardChange>, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    let raw = read_body(&state, &headers, body).await?;
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.clone());
    let change = blocking(move || store.update_card(&ws2, &id, &raw, &actor)).await?;
    changed(&state, &ws, &change, "updated", &caller);
    Ok(Json(change))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SupersedeBody {
    by: CardId,
}

pub(crate) async fn state(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id, action)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<CardChange>, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    let change = match action.as_str() {
        "disable" => CardState::Disable,
        "enable" => CardState::Enable,
        "verify" => CardState::Verify,
        "archive" => CardState::Archive,
        "unarchive" => CardState::Unarchive,
        "supersede" => {
            let body = read_body(&state, &headers, body).await?;
            let req: SupersedeBody = json(&body)?;
            CardState::Supersede(req.by)
        }
        other => {
            return Err(ApiError::not_found(format!(
                "no card action {other:?}; actions: disable, enable, verify, supersede, archive, unarchive"
            )));
        }
    };
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.clone());
    let result = blocking(move || store.set_state(&ws2, &id, change, &actor)).await?;
    changed(&state, &ws, &result, &format!("{action}d"), &caller);
    Ok(Json(result))
}

pub(crate) async fn history(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Json<Vec<HistoryRow>>, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    let store = state.store.clone();
    Ok(Json(blocking(move || store.history(&ws, &id)).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryQuery {
    #[serde(default)]
    after: i64,
}

pub(crate) async fn workspace_history(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<Vec<HistoryRow>>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let store = state.store.clone();
    Ok(Json(
        blocking(move || store.workspace_history(&ws, q.after)).await?,
    ))
}

pub(crate) async fn hard_delete(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Json<CardChange>, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.clone());
    let change = blocking(move || store.hard_delete(&ws2, &id, &actor)).await?;
    changed(&state, &ws, &change, "hard-deleted", &caller);
    Ok(Json(change))
}

pub(crate) async fn publish_counters(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
) -> Result<Response, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let (store, ws2) = (state.store.clone(), ws.clone());
    let published = blocking(move || store.publish_counters(Some(&ws2))).await?;
    for (w, rev) in &published {
        state.note_revision(w, *rev);
    }
    let revision = state.revision(&ws).unwrap_or_default();
    Ok(
        Json(serde_json::json!({ "revision": revision, "published": published.len() }))
            .into_response(),
    )
}
