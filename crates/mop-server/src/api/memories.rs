//! `POST /v1/workspaces/{ws}/memories`: a store from an agent task, forwarded by its host
//! daemon with the task's provenance and, when it may send the store again, an
//! idempotency key (`Idempotency-Key`): a key seen before gets its first answer, before
//! the token's store budget is spent, so a replay never counts twice.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use mop_proto::sync::{IDEMPOTENCY_KEY, StoreOutcome, StoreRequest, StoreResponse};

use super::{ApiError, Caller, blocking, json, read_body};
use crate::service::memories::{self, Admission, StoreLimits};
use crate::state::{AppState, StoreRate};

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
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| {
                    ApiError::bad_request("the Idempotency-Key header must be visible ASCII")
                })?
                .to_owned(),
        ),
    };
    let actor = caller.actor();
    // Checked and screened first (a replay gets its first answer): a store refused on its
    // own (a credential, a bad field) costs no write, so it does not spend the host's
    // store budget either.
    let admitted = {
        let (store, ws2, actor2, req2, key2) = (
            state.store.clone(),
            ws.clone(),
            actor.clone(),
            req.clone(),
            key.clone(),
        );
        blocking(move || memories::admit(&store, &ws2, &actor2, &req2, key2.as_deref())).await
    };
    let prepared = match admitted {
        Ok(Admission::Fresh(p)) => p,
        Ok(Admission::Repeat(first)) => {
            tracing::info!(workspace = %ws, token = %caller.0.id, outcome = first.outcome.word(), "store repeated: its first answer again");
            state.metrics.store("repeated");
            return Ok((StatusCode::OK, Json(first)));
        }
        Err(e) => {
            // Counts and kinds only: never the card's text or the credential.
            tracing::info!(workspace = %ws, token = %caller.0.id, code = e.code(), "store refused");
            state.metrics.store(e.code());
            return Err(e);
        }
    };
    if let Err(rate) = state.take_store_budget(&caller.0.id, prepared.task()) {
        let (retry_after, message) = match rate {
            StoreRate::Task(secs) => {
                tracing::warn!(workspace = %ws, token = %caller.0.id, "store refused: task over its store rate");
                (
                    secs,
                    format!(
                        "this task made more than {} stores in the last minute (limits.stores_per_task_per_minute); \
                         nothing was stored; store what is new in one card, and try again in {secs} s",
                        state.config.limits.stores_per_task_per_minute
                    ),
                )
            }
            StoreRate::Token(secs) => {
                tracing::warn!(workspace = %ws, token = %caller.0.id, "store refused: token over its store rate");
                (
                    secs,
                    format!(
                        "this token made more than {} stores in the last minute (limits.stores_per_token_per_minute); \
                         nothing was stored; try again in {secs} s",
                        state.config.limits.stores_per_token_per_minute
                    ),
                )
            }
        };
        state.metrics.store(mop_proto::sync::store_errors::RATE);
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            mop_proto::sync::store_errors::RATE,
            message,
        )
        .retry_after(retry_after));
    }
    let store = state.store.clone();
    let ws2 = ws.clone();
    let limits = StoreLimits {
        stores_per_task: state.config.limits.stores_per_task,
    };
    let result = blocking(move || memories::commit(&store, &ws2, &prepared, &actor, limits)).await;
    let mut response = match result {
        Ok(r) => r,
        Err(e) => {
            // Counts and kinds only: never the card's text or the credential.
            tracing::info!(workspace = %ws, token = %caller.0.id, code = e.code(), "store refused");
            state.metrics.store(e.code());
            return Err(e);
        }
    };
    response.store_id = key;
    state.note_revision(&ws, response.revision);
    tracing::info!(workspace = %ws, card = ?response.id, outcome = response.outcome.word(),
        token = %caller.0.id, revision = response.revision, "memory stored");
    state.metrics.store(response.outcome.word());
    let status = match response.outcome {
        StoreOutcome::Created => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok((status, Json(response)))
}
