//! The HTTP/1.1 JSON API: routing, authentication, JSON errors, body limits.
//!
//! Every error is JSON `{"error": <code>, "message": <text>}` naming the problem. A
//! workspace or card outside the caller's token scope answers 404 exactly like one that
//! does not exist.

pub(crate) mod admin;
pub(crate) mod curation;
mod memories;
mod receipts;
mod sync;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::state::AppState;
use crate::store::{Role, StoreError, TokenInfo, token_hash};
use mop_proto::routes::{self, server};
use mop_proto::sync::store_errors;

/// Builds the router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(server::HEALTH.template(), get(health))
        .route(server::HEALTHZ.template(), get(health))
        .route(server::READYZ.template(), get(ready))
        .route(routes::METRICS.template(), get(metrics))
        .route(server::MANIFEST.template(), get(sync::manifest))
        .route(server::OBJECT.template(), get(sync::object))
        .route(server::OBJECTS_BATCH.template(), post(sync::objects_batch))
        .route(server::MEMORIES.template(), post(memories::store))
        .route(server::RECEIPTS.template(), post(receipts::report))
        .route(
            server::CARDS.template(),
            post(admin::create).get(curation::list),
        )
        .route(server::REVIEW.template(), get(curation::review))
        .route(server::SEARCH.template(), get(curation::search))
        .route(server::STALE.template(), get(curation::stale))
        .route(server::CREDENTIALS.template(), get(curation::credentials))
        .route(server::REJECTIONS.template(), get(curation::rejections))
        .route(server::REJECTION_LIFT.template(), post(curation::lift))
        .route(server::CARD_DETAILS.template(), get(curation::details))
        .route(
            server::CARD.template(),
            get(admin::read)
                .put(admin::update)
                .delete(admin::hard_delete),
        )
        .route(server::CARD_HISTORY.template(), get(admin::history))
        .route(server::CARD_ACTION.template(), post(admin::state))
        .route(server::BULK.template(), post(admin::bulk))
        .route(server::IMPORT.template(), post(admin::import))
        .route(server::EXPORT.template(), get(admin::export))
        .route(server::GROUP.template(), get(curation::group))
        .route(server::GROUP_COMBINE.template(), post(admin::combine))
        .route(
            server::WORKSPACE_HISTORY.template(),
            get(admin::workspace_history),
        )
        .route(
            server::COUNTERS_PUBLISH.template(),
            post(admin::publish_counters),
        )
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such endpoint; see the API list in README.md",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method",
            )
        })
        .with_state(state)
}

/// Middleware (a route layer, so the route pattern is known): counts and times requests.
pub async fn track(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let start = std::time::Instant::now();
    let response = next.run(request).await;
    state.metrics.observe_request(
        route.as_deref(),
        &method,
        response.status().as_u16(),
        start.elapsed(),
    );
    response
}

/// `/v1/health` and `/healthz`: the process is alive and serving.
async fn health() -> impl IntoResponse {
    axum::Json(serde_json::json!({ "status": "ok" }))
}

/// `/metrics`: Prometheus metrics (OpenMetrics text), unless `metrics.enabled` is off.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if !state.config.metrics.enabled {
        return ApiError::not_found("metrics are off (metrics.enabled = false)").into_response();
    }
    let store = state.store.clone();
    // A database that cannot answer leaves the queue gauges out of this scrape (their
    // absence alerts), not the whole exposition.
    let read = blocking(move || Ok((store.queue_stats()?, store.alert_counts()?))).await;
    let (queues, alerts) = match read {
        Ok((q, a)) => (q, Some(a)),
        Err(e) => {
            let status = e.status().as_u16();
            tracing::warn!(status, "review queue gauges left out of this scrape");
            (Vec::new(), None)
        }
    };
    let names = state.config.metrics.workspace_names;
    let epoch = state.store.epoch();
    let text = state.metrics.encode(
        state.store.idle_readers(),
        &queues,
        alerts.filter(|_| state.config.alerts.webhook_url.is_some()),
        names,
        epoch,
    );
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `/readyz`: the database answers and the caches are loaded, so this replica can take
/// traffic; 503 naming the cause otherwise (a load balancer stops sending it requests).
async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let check = tokio::task::spawn_blocking(move || {
        state.store.ping()?;
        state.refresh_if_changed()
    })
    .await;
    match check {
        Ok(Ok(_)) => axum::Json(serde_json::json!({ "status": "ready" })).into_response(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "not ready: the database does not answer");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                "the database does not answer; see the server log",
            )
            .into_response()
        }
        Err(e) => ApiError::internal(e).into_response(),
    }
}

/// A JSON error response.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after: Option<u64>,
    /// More fields of the JSON body (a refused store's findings or rejection).
    extra: Option<(&'static str, serde_json::Value)>,
}

impl ApiError {
    /// An error with a status, a stable code and a message naming the problem.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
            extra: None,
        }
    }

    /// Adds a field to the JSON body.
    pub fn with(mut self, key: &'static str, value: serde_json::Value) -> Self {
        self.extra = Some((key, value));
        self
    }

    /// Adds a `Retry-After` header (seconds).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable error code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message naming the problem.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 503 with `Retry-After: 1`: the database is down or the connection broke; the log
    /// gets the cause (which names the database, never its password).
    fn database_down(e: &StoreError, code: &'static str, message: &str) -> Self {
        tracing::warn!(error = %e, code, "database unavailable");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message).retry_after(1)
    }

    fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "internal error");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal server error; see the server log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = mop_proto::error::ErrorBody::new(self.code, self.message);
        if let Some((key, value)) = self.extra {
            body.details.insert(key.into(), value);
        }
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(m) => ApiError::not_found(m),
            StoreError::Invalid(m) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", m),
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            StoreError::Forbidden(m) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", m),
            StoreError::Limit(m) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, store_errors::QUOTA, m)
            }
            StoreError::Credential { what, findings } => {
                let json = serde_json::json!(findings);
                let message = StoreError::Credential { what, findings }.to_string();
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    store_errors::CREDENTIAL,
                    message,
                )
                .with("findings", json)
            }
            StoreError::Rejected { note } => {
                let json = serde_json::json!(note);
                let message = StoreError::Rejected { note }.to_string();
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    store_errors::REJECTED,
                    message,
                )
                .with("rejection", json)
            }
            e @ StoreError::Unavailable { .. } => ApiError::database_down(
                &e,
                "unavailable",
                "the database cannot be reached now; nothing was changed: try again shortly",
            ),
            e @ StoreError::CommitUnknown { .. } => ApiError::database_down(
                &e,
                "outcome_unknown",
                "the database connection broke while the change was committed; it may or may not have been saved: read it back before trying again",
            ),
            e @ StoreError::Precondition { .. } => ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "precondition_failed",
                e.to_string(),
            ),
            other => ApiError::internal(other),
        }
    }
}

/// Runs blocking store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let busy = &*crate::metrics::DB_BUSY;
    busy.inc();
    let result = tokio::task::spawn_blocking(f).await;
    busy.dec();
    match result {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// The authenticated caller: its token's id, role and workspaces.
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<TokenInfo>);

impl Caller {
    /// Checks that `ws` is in scope and exists; both failures look the same (404).
    pub fn workspace(&self, state: &AppState, ws: &str) -> Result<u64, ApiError> {
        if !self.owns(ws) {
            return Err(ApiError::not_found(format!("workspace {ws} not found")));
        }
        Self::exists(state, ws)
    }

    /// Checks that `ws` may be read: in scope, or inherited by a workspace in scope
    /// (server.toml `[inheritance]`), and exists. Writes need [`Caller::workspace`].
    pub fn reads(&self, state: &AppState, ws: &str) -> Result<u64, ApiError> {
        if !state.config.inheritance.reaches(&self.0.workspaces, ws) {
            return Err(ApiError::not_found(format!("workspace {ws} not found")));
        }
        Self::exists(state, ws)
    }

    /// Checks that `ws`'s manifest and objects may be read: its own workspace (any role),
    /// or one it inherits for a node token, whose daemon composes them. An admin token
    /// reads an inherited workspace through the curation reads only (its verified cards,
    /// [`crate::api::admin::admin_reads`]): the manifest names every card.
    pub fn syncs(&self, state: &AppState, ws: &str) -> Result<u64, ApiError> {
        if self.owns(ws) || self.0.role == Role::Node {
            self.reads(state, ws)
        } else {
            Err(ApiError::not_found(format!("workspace {ws} not found")))
        }
    }

    /// True when `ws` is one of the token's own workspaces (not only inherited).
    pub fn owns(&self, ws: &str) -> bool {
        self.0.workspaces.iter().any(|w| w == ws)
    }

    fn exists(state: &AppState, ws: &str) -> Result<u64, ApiError> {
        let missing = || ApiError::not_found(format!("workspace {ws} not found"));
        if let Some(rev) = state.revision(ws) {
            return Ok(rev);
        }
        // Perhaps created a moment ago by another process (mop-server import).
        state.refresh_if_changed().map_err(ApiError::from)?;
        state.revision(ws).ok_or_else(missing)
    }

    /// Requires an admin token.
    pub fn admin(&self) -> Result<(), ApiError> {
        match self.0.role {
            Role::Admin => Ok(()),
            Role::Node => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this endpoint needs an admin token (mop-server token create --role admin)",
            )),
        }
    }

    /// Requires a node token (a host daemon).
    pub fn node(&self) -> Result<(), ApiError> {
        match self.0.role {
            Role::Node => Ok(()),
            Role::Admin => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this endpoint takes reports from host daemons: use a node token",
            )),
        }
    }

    /// The actor recorded in audit rows.
    pub fn actor(&self) -> String {
        format!("token:{}", self.0.id)
    }
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let value = parts.headers.get(header::AUTHORIZATION).ok_or_else(|| {
            unauthorized("missing bearer token: send Authorization: Bearer <token>")
        })?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("Authorization header must be: Bearer <token>"))?;
        let hash = token_hash(token);
        let info = match state.token(&hash) {
            Some(info) => Some(info),
            // Perhaps created a moment ago with `mop-server token create`, or through
            // another replica. Looked up again whatever the refresh says: a reload that ran
            // meanwhile may have brought it.
            None => {
                state.refresh_if_changed().map_err(ApiError::from)?;
                state.token(&hash)
            }
        }
        .ok_or_else(|| {
            unauthorized("token is not valid; create one with mop-server token create")
        })?;
        if info.revoked {
            return Err(unauthorized(
                "token has been revoked; ask an admin for a new one",
            ));
        }
        if info.expired(jiff::Timestamp::now()) {
            return Err(unauthorized(&format!(
                "token {} expired; ask an admin for a new one",
                info.id
            )));
        }
        state.note_token_use(&info.id);
        Ok(Caller(info))
    }
}

/// The request's `If-None-Match` and the coding it accepts, read without copying the
/// whole header map (this is the hot path of every unchanged poll).
#[derive(Debug, Default)]
pub struct Conditional {
    /// The `If-None-Match` value, if any.
    pub if_none_match: Option<axum::http::HeaderValue>,
    /// The coding to answer with.
    pub coding: crate::encoding::Coding,
}

impl<S: Send + Sync> FromRequestParts<S> for Conditional {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Conditional {
            if_none_match: parts.headers.get(header::IF_NONE_MATCH).cloned(),
            coding: crate::encoding::Coding::negotiate(&parts.headers),
        })
    }
}

/// Reads a request body up to the configured limit.
pub(crate) async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = state.config.server.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "request body is larger than the limit of {limit} bytes (server.max_body_bytes)"
            ),
        )
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if is_length_limit(&e) {
            too_large()
        } else {
            ApiError::bad_request(format!("could not read the request body: {e}"))
        }
    })
}

/// Whether a body read failed because the body went over its limit (a chunked body has
/// no Content-Length to refuse it by beforehand).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Decodes a JSON body; unknown fields and wrong types are errors naming the field.
pub(crate) fn json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let kind = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request"
        };
        ApiError::bad_request(format!("{kind}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_oversized_body_is_told_from_a_broken_one_by_type() {
        let over = axum::body::to_bytes(Body::from(vec![0u8; 100]), 10)
            .await
            .unwrap_err();
        assert!(is_length_limit(&over));
        let broken = Body::from_stream(futures_util::stream::iter([
            Ok::<_, std::io::Error>(Bytes::from_static(b"abc")),
            Err(std::io::Error::other("connection reset")),
        ]));
        let broken = axum::body::to_bytes(broken, 1000).await.unwrap_err();
        assert!(!is_length_limit(&broken));
    }
}
