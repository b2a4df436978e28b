//! `POST /v1/workspaces/{ws}/receipts` (node tokens): receipts of ended tasks, counted once
//! each into per-card usage (see `store::usage`).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use mop_proto::receipts::{MAX_BATCH, ReceiptBatch, ReceiptBatchResponse};

use super::{ApiError, Caller, blocking, json, read_body};
use crate::state::AppState;

pub(crate) async fn report(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ReceiptBatchResponse>, ApiError> {
    caller.workspace(&state, &ws)?;
    caller.node()?;
    let raw = read_body(&state, &headers, body).await?;
    let batch: ReceiptBatch = json(&raw)?;
    if batch.receipts.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "a batch holds at most {MAX_BATCH} receipts, this one {}",
            batch.receipts.len()
        )));
    }
    let (store, actor, ws2) = (state.store.clone(), caller.0.id.clone(), ws.clone());
    let answer = blocking(move || store.ingest_receipts(&ws2, &actor, &batch.receipts)).await?;
    tracing::info!(workspace = %ws, token = %caller.0.id, accepted = answer.accepted,
        duplicates = answer.duplicates, too_old = answer.too_old, "receipts counted");
    Ok(Json(answer))
}
