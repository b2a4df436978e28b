//! `POST /v1/workspaces/{ws}/memories`: a store from an agent task, forwarded by its host
//! daemon with the task's provenance.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use mop_proto::sync::{StoreOutcome, StoreRequest, StoreResponse};

use super::{ApiError, Caller, blocking, json, read_body};
use crate::state::AppState;
use crate::store::StoreLimits;

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
    if let Err(retry_after) = state.take_store_budget(&caller.0.id) {
        tracing::warn!(workspace = %ws, token = %caller.0.id, "store refused: token over its store rate");
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            format!(
                "this token made more than {} stores in the last minute (limits.stores_per_token_per_minute); \
                 nothing was stored; try again in {retry_after} s",
                state.config.limits.stores_per_token_per_minute
            ),
        )
        .retry_after(retry_after));
    }
    let store = state.store.clone();
    let actor = caller.actor();
    let ws2 = ws.clone();
    let limits = StoreLimits {
        stores_per_task: state.config.limits.stores_per_task,
    };
    let response = blocking(move || store.store_memory(&ws2, &req, &actor, limits)).await?;
    state.note_revision(&ws, response.revision);
    tracing::info!(workspace = %ws, card = %response.id, outcome = ?response.outcome,
        token = %caller.0.id, revision = response.revision, "memory stored");
    state.metrics.store(response.outcome.word());
    let status = match response.outcome {
        StoreOutcome::Created => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok((status, Json(response)))
}
