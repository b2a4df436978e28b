//! `POST /v1/workspaces/{ws}/memories`: a store from an agent task, forwarded by its host
//! daemon with the task's provenance.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use mop_cards::{StoreOutcome, StoreRequest, StoreResponse};

use super::{ApiError, Caller, blocking, json, read_body};
use crate::state::AppState;

pub(crate) async fn store(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<StoreResponse>), ApiError> {
    caller.workspace(&state, &ws)?;
    let body = read_body(&state, &headers, body).await?;
    let req: StoreRequest = json(&body)?;
    let store = state.store.clone();
    let actor = caller.actor();
    let ws2 = ws.clone();
    let response = blocking(move || store.store_memory(&ws2, &req, &actor)).await?;
    state.note_revision(&ws, response.revision);
    tracing::info!(workspace = %ws, card = %response.id, outcome = ?response.outcome,
        token = %caller.0.id, revision = response.revision, "memory stored");
    let status = match response.outcome {
        StoreOutcome::Created => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok((status, Json(response)))
}
