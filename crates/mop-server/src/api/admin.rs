//! Admin endpoints (admin tokens only): create, read, update, state changes and review
//! actions, history, hard delete, and publishing counters on demand.
//!
//! A card's text is answered with its version tag (`ETag`); every change takes it back in
//! `If-Match` and answers 412 when the card changed meanwhile. Without `If-Match` a change
//! is unconditional.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mop_cards::CardId;
use mop_proto::curation::{
    ListQuery, MergeRequest, RejectRequest, RevertRequest, SupersedeRequest, card_etag,
};
use serde::Deserialize;

use super::{ApiError, Caller, blocking, json, read_body};
use crate::service::curation::{self, CardState};
use crate::state::AppState;
use crate::store::{CardChange, Expect, HistoryRow};

/// The `If-Match` header, if any.
pub(crate) fn if_match(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    headers
        .get(header::IF_MATCH)
        .map(|v| {
            v.to_str().map(str::to_owned).map_err(|_| {
                ApiError::bad_request("If-Match must be a card version tag as ETag gave it")
            })
        })
        .transpose()
}

/// [`Expect`] from an `If-Match` value.
pub(crate) fn expect(tag: &Option<String>) -> Expect<'_> {
    tag.as_deref().map_or(Expect::Any, Expect::IfMatch)
}

fn card_id(id: &str) -> Result<CardId, ApiError> {
    CardId::parse(id).map_err(|e| ApiError::bad_request(format!("card id: {e}")))
}

/// Checks role and scope; returns the card id.
pub(crate) fn admin_on(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    id: Option<&str>,
) -> Result<Option<CardId>, ApiError> {
    caller.workspace(state, ws)?;
    caller.admin()?;
    id.map(card_id).transpose()
}

/// Like [`admin_on`], for the reads a curator may make of a workspace their own inherits
/// (server.toml `[inheritance]`): what its tasks inherit, its verified cards (their text
/// and details, listings, search and export). Its cards waiting for review and every
/// card's history stay its own curators'; every change needs [`admin_on`].
pub(crate) fn admin_reads(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    id: Option<&str>,
) -> Result<Reading, ApiError> {
    caller.reads(state, ws)?;
    caller.admin()?;
    Ok(Reading {
        id: id.map(card_id).transpose()?,
        inherited: !caller.owns(ws),
    })
}

/// A read [`admin_reads`] allowed.
pub(crate) struct Reading {
    /// The card, when one was named.
    pub id: Option<CardId>,
    /// The workspace is one the caller's inherits, not its own.
    pub inherited: bool,
}

impl Reading {
    /// The card named.
    pub fn card(&self) -> CardId {
        self.id.expect("the route names a card")
    }

    /// Narrows a listing's filters to what the caller may read: of an inherited
    /// workspace, its verified cards.
    pub fn narrow(&self, mut q: ListQuery) -> Result<ListQuery, ApiError> {
        if self.inherited {
            if q.unverified == Some(true) {
                return Err(ApiError::not_found(
                    "an inherited workspace's cards waiting for review are its own curators'",
                ));
            }
            q.unverified = Some(false);
        }
        Ok(q)
    }

    /// Leaves out of a card of an inherited workspace what tells of its cards waiting for
    /// review or of its curators' decisions: the cards merged into it, its duplicate
    /// group, a rejection it matches.
    pub fn redact(&self, info: &mut mop_proto::curation::CardInfo) {
        if self.inherited {
            info.merged.clear();
            info.duplicate_group = None;
            info.previously_rejected = None;
        }
    }

    /// Refuses one card of an inherited workspace that its tasks do not inherit (an
    /// unverified one) as not found, like a card that does not exist.
    pub fn check(&self, ws: &str, summary: &mop_cards::CardSummary) -> Result<(), ApiError> {
        if self.inherited && summary.is_unverified() {
            return Err(ApiError::not_found(format!(
                "card {} not found in workspace {ws}",
                summary.id
            )));
        }
        Ok(())
    }
}

fn changed(state: &AppState, ws: &str, change: &CardChange, what: &str, caller: &Caller) {
    state.note_revision(ws, change.revision);
    if change.changed {
        tracing::info!(workspace = %ws, card = %change.id, revision = change.revision,
            token = %caller.0.id, action = what, "card changed");
    }
}

/// `?allow_credentials=true` on a create, update or verify: the curator keeps credentials
/// in this one card deliberately (audited with their kinds). Without it such a card is
/// refused with 422 naming each credential's kind and place.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteQuery {
    #[serde(default)]
    pub allow_credentials: bool,
}

pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<CardChange>), ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    // Fields as JSON (the server gives the id), or a card's OKF text (its own id).
    let fields = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.to_ascii_lowercase().starts_with("application/json"));
    let raw = read_body(&state, &headers, body).await?;
    let fields = if fields {
        Some(json::<mop_proto::sync::NewCard>(&raw)?)
    } else {
        None
    };
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.clone());
    let allow = q.allow_credentials;
    let others = state.config.inheritance.composed_with(&ws);
    let change = blocking(move || match fields {
        Some(f) => curation::create_from_fields(&store, &ws2, f, &actor, allow),
        None => curation::create_card(&store, &ws2, &raw, &actor, allow, &others),
    })
    .await?;
    changed(&state, &ws, &change, "create", &caller);
    Ok((StatusCode::CREATED, Json(change)))
}

pub(crate) async fn read(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let reading = admin_reads(&state, &caller, &ws, Some(&id))?;
    let (store, id, ws2) = (state.store.clone(), reading.card(), ws.clone());
    let (raw, archived) = blocking(move || store.card_text(&ws2, &id)).await?;
    if reading.inherited {
        let card = mop_cards::parse_card(&raw).map_err(ApiError::internal)?;
        reading.check(&ws, &card.summary)?;
    }
    let etag = card_etag(&mop_cards::sha256_hex(&raw), archived.is_some());
    let mut response = Response::new(Body::from(raw));
    let h = response.headers_mut();
    if let Ok(tag) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, tag);
    }
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
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<CardChange>, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    let tag = if_match(&headers)?;
    let raw = read_body(&state, &headers, body).await?;
    Ok(Json(
        update_text(&state, &caller, &ws, id, raw, tag, q.allow_credentials).await?,
    ))
}

/// Replaces a card's text, conditional on the version `tag` when given (the caller checked
/// role and scope).
pub(crate) async fn update_text(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    id: CardId,
    raw: bytes::Bytes,
    tag: Option<String>,
    allow_credentials: bool,
) -> Result<CardChange, ApiError> {
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.to_owned());
    let change = blocking(move || {
        curation::update_card(
            &store,
            &ws2,
            &id,
            &raw,
            &actor,
            expect(&tag),
            allow_credentials,
        )
    })
    .await?;
    changed(state, ws, &change, "update", caller);
    Ok(change)
}

/// `GET /v1/workspaces/{ws}/export`: the cards the listing's filters match (every match,
/// no paging), as a gzipped tarball of OKF files at their pillar paths.
pub(crate) async fn export(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(q): Query<mop_proto::curation::ListQuery>,
) -> Result<Response, ApiError> {
    let q = admin_reads(&state, &caller, &ws, None)?.narrow(q)?;
    let (bytes, cards) = export_tarball(&state, &ws, q).await?;
    tracing::info!(workspace = %ws, cards, bytes = bytes.len(), token = %caller.0.id, "export");
    Ok(tarball_response(bytes, &ws))
}

/// The tarball of the cards `q` matches, and how many (the console's export shares it).
pub(crate) async fn export_tarball(
    state: &AppState,
    ws: &str,
    q: mop_proto::curation::ListQuery,
) -> Result<(Vec<u8>, usize), ApiError> {
    let (store, ws) = (state.store.clone(), ws.to_owned());
    blocking(move || {
        let files = store.export_matching(&ws, &q)?;
        let now = jiff::Timestamp::now().as_second().max(0) as u64;
        let bytes = crate::transfer::tar_gz(&files, now).map_err(|e| {
            crate::store::StoreError::Invalid(format!("cannot build the export tarball: {e}"))
        })?;
        Ok((bytes, files.len()))
    })
    .await
}

/// A tarball download named after the workspace.
pub(crate) fn tarball_response(bytes: Vec<u8>, ws: &str) -> Response {
    let name = format!("attachment; filename=\"{ws}-cards.tar.gz\"");
    let mut r = bytes.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/gzip"),
    );
    if let Ok(v) = HeaderValue::from_str(&name) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

/// `POST /v1/workspaces/{ws}/bulk`: a preview of what a filter matches, or one action on
/// each (see `mop_proto::curation::BulkRequest`).
pub(crate) async fn bulk(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<mop_proto::curation::BulkAnswer>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let req = json::<mop_proto::curation::BulkRequest>(&read_body(&state, &headers, body).await?)?;
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.clone());
    let answer = blocking(move || curation::bulk(&store, &ws2, &req, &actor)).await?;
    if let Some(revision) = answer.revision {
        state.note_revision(&ws, revision);
        tracing::info!(workspace = %ws, cards = answer.cards.len(), revision,
            token = %caller.0.id, "bulk action");
    }
    Ok(Json(answer))
}

/// `POST /v1/workspaces/{ws}/import`: memory files become cards waiting for review (or,
/// with `dry_run`, the answer says which would).
pub(crate) async fn import(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<mop_proto::curation::ImportAnswer>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let req =
        json::<mop_proto::curation::ImportRequest>(&read_body(&state, &headers, body).await?)?;
    Ok(Json(import_files(&state, &caller, &ws, req).await?))
}

/// Imports files as `caller` (the console's import shares it).
pub(crate) async fn import_files(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    req: mop_proto::curation::ImportRequest,
) -> Result<mop_proto::curation::ImportAnswer, ApiError> {
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.to_owned());
    let name = caller.0.name.clone().unwrap_or_else(|| caller.0.id.clone());
    let files = req.files.len();
    let others = state.config.inheritance.composed_with(ws);
    let answer = blocking(move || {
        let by = crate::service::import::Importer {
            name: &name,
            actor: &actor,
            composed_with: &others,
        };
        crate::service::import::import(&store, &ws2, &req, by)
    })
    .await?;
    if let Some(revision) = answer.revision {
        state.note_revision(ws, revision);
    }
    tracing::info!(workspace = %ws, files, cards = answer.cards.len(),
        skipped = answer.skipped.len(), done = answer.done, token = %caller.0.id, "import");
    Ok(answer)
}

/// `POST /v1/workspaces/{ws}/groups/{group}/combine`: a duplicate group becomes one card.
pub(crate) async fn combine(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, group)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<CardChange>, ApiError> {
    admin_on(&state, &caller, &ws, None)?;
    let req =
        json::<mop_proto::curation::CombineRequest>(&read_body(&state, &headers, body).await?)?;
    Ok(Json(combine_group(&state, &caller, &ws, group, req).await?))
}

/// Combines a group (the caller checked role and scope): the API's and the console's.
pub(crate) async fn combine_group(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    group: String,
    req: mop_proto::curation::CombineRequest,
) -> Result<CardChange, ApiError> {
    let (store, actor, ws2, g) = (
        state.store.clone(),
        caller.actor(),
        ws.to_owned(),
        group.clone(),
    );
    let merged = req.variants.iter().filter(|v| **v != req.into).count();
    let change = blocking(move || curation::combine(&store, &ws2, &g, &req, &actor)).await?;
    state.note_revision(ws, change.revision);
    tracing::info!(workspace = %ws, group = %group, card = %change.id, merged,
        revision = change.revision, token = %caller.0.id, "group combined");
    Ok(change)
}

/// What a `POST …/cards/{id}/{action}` does.
pub(crate) enum Action {
    /// A state change, with why when the curator said.
    State(CardState, Option<String>),
    /// Verify, replacing the text first when a body (OKF text) is sent; true when the
    /// curator allows credentials in it.
    Verify(Option<bytes::Bytes>, bool),
    Reject(String),
    /// Merge into this card, verifying it in the same action at this version of it.
    Merge(CardId, Option<String>),
    /// Restore the text of this history row (its `seq`).
    Revert(i64),
    /// Set fields, keeping the text.
    Fields(mop_proto::curation::FieldsRequest),
    /// Keep a card agents flagged as it is, with why when the curator said.
    Keep(Option<String>),
}

pub(crate) async fn state(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id, action)): Path<(String, String, String)>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<CardChange>, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    let tag = if_match(&headers)?;
    let body = read_body(&state, &headers, body).await?;
    let what = match action.as_str() {
        "disable" | "enable" | "archive" | "unarchive" => {
            let reason = if body.is_empty() {
                None
            } else {
                json::<mop_proto::curation::StateRequest>(&body)?.reason
            };
            let s = match action.as_str() {
                "disable" => CardState::Disable,
                "enable" => CardState::Enable,
                "archive" => CardState::Archive,
                _ => CardState::Unarchive,
            };
            Action::State(s, reason)
        }
        "verify" => Action::Verify((!body.is_empty()).then_some(body), q.allow_credentials),
        "supersede" => Action::State(
            CardState::Supersede(json::<SupersedeRequest>(&body)?.by),
            None,
        ),
        "reject" => Action::Reject(json::<RejectRequest>(&body)?.reason),
        "merge" => {
            let m = json::<MergeRequest>(&body)?;
            if m.verify && m.into_version.is_none() {
                return Err(ApiError::bad_request(format!(
                    "verify needs into_version: the version (ETag) of card {} you read",
                    m.into
                )));
            }
            Action::Merge(m.into, m.into_version.filter(|_| m.verify))
        }
        "revert" => Action::Revert(json::<RevertRequest>(&body)?.seq),
        "keep" => Action::Keep(if body.is_empty() {
            None
        } else {
            json::<mop_proto::curation::StateRequest>(&body)?.reason
        }),
        "fields" => Action::Fields(json(&body)?),
        other => {
            return Err(ApiError::not_found(format!(
                "no card action {other:?}; actions: verify, reject, merge, revert, fields, keep, supersede, disable, enable, archive, unarchive"
            )));
        }
    };
    Ok(Json(
        act(&state, &caller, &ws, id, what, tag, &action).await?,
    ))
}

/// Does a card action, conditional on the version `tag` when given (the caller checked
/// role and scope); `name` is what the log calls it.
pub(crate) async fn act(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    id: CardId,
    what: Action,
    tag: Option<String>,
    name: &str,
) -> Result<CardChange, ApiError> {
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.to_owned());
    let result = blocking(move || {
        let expect = expect(&tag);
        match what {
            Action::State(s, why) => {
                curation::set_state(&store, &ws2, &id, s, why.as_deref(), &actor, expect)
            }
            Action::Verify(edited, allow) => {
                curation::verify(&store, &ws2, &id, edited.as_deref(), &actor, expect, allow)
            }
            Action::Reject(reason) => curation::reject(&store, &ws2, &id, &reason, &actor, expect),
            Action::Merge(into, verify) => {
                let verify = verify.as_deref();
                curation::merge(&store, &ws2, &id, &into, verify, &actor, expect)
            }
            Action::Revert(seq) => curation::revert(&store, &ws2, &id, seq, &actor, expect),
            Action::Fields(req) => curation::set_fields(&store, &ws2, &id, &req, &actor, expect),
            Action::Keep(why) => curation::keep(&store, &ws2, &id, why.as_deref(), &actor, expect),
        }
    })
    .await?;
    changed(state, ws, &result, name, caller);
    Ok(result)
}

pub(crate) async fn history(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Json<Vec<HistoryRow>>, ApiError> {
    // Earlier texts, reasons and curators' names stay the workspace's own.
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

/// `?reason=…` on a hard delete: why, for the audit row.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeleteQuery {
    #[serde(default)]
    pub reason: Option<String>,
}

pub(crate) async fn hard_delete(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, id)): Path<(String, String)>,
    Query(q): Query<DeleteQuery>,
) -> Result<Json<CardChange>, ApiError> {
    let id = admin_on(&state, &caller, &ws, Some(&id))?.expect("id given");
    Ok(Json(delete_card(&state, &caller, &ws, id, q.reason).await?))
}

/// Deletes a card and its content for good (the caller checked role and scope): what the
/// API, `mop-curate delete` and the console's delete share.
pub(crate) async fn delete_card(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    id: CardId,
    reason: Option<String>,
) -> Result<CardChange, ApiError> {
    let (store, actor, ws2) = (state.store.clone(), caller.actor(), ws.to_owned());
    let change = blocking(move || store.hard_delete(&ws2, &id, &actor, reason.as_deref())).await?;
    state.search.forget(Some(ws));
    changed(state, ws, &change, "hard_delete", caller);
    Ok(change)
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
