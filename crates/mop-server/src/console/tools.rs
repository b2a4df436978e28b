//! The curator's workspace tools in the console, over the same calls as the API: create a
//! card from fields, one action on every card a filter matches (a preview with the count
//! first, then only those cards), import memory files (uploaded; a dry run first if asked)
//! and export the cards a filter matches as a tarball.

use std::sync::Arc;

use axum::extract::{Multipart, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use mop_cards::{CardId, CardType, Scope};
use mop_proto::curation::{
    BulkAction, BulkAnswer, BulkRequest, ImportAnswer, ImportFile, ImportOutcome, ImportRequest,
    ListQuery,
};
use mop_proto::sync::NewCard;
use serde::Deserialize;

use super::Console;
use super::auth::{Ctx, Posted, check_upload};
use super::layout::{api_error, csrf, page, respond, type_and_trust};
use super::markdown::shown;
use crate::api::admin::{export_tarball, import_files, tarball_response};
use crate::api::{ApiError, blocking};
use crate::service::curation;

fn opt(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// The filters every tool's form shares, as the listing takes them.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct FilterForm {
    #[serde(rename = "type")]
    card_type: String,
    /// "", "yes" (waiting for review) or "no" (verified).
    unverified: String,
    label: String,
    asset: String,
    project: String,
    user: String,
    older_than_days: String,
    group: String,
    /// "on": archived cards too.
    archived: String,
}

impl FilterForm {
    fn query(&self) -> Result<ListQuery, ApiError> {
        let older_than_days = match self.older_than_days.trim() {
            "" => None,
            d => Some(d.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "older than (days) must be a whole number, not {d:?}"
                ))
            })?),
        };
        Ok(ListQuery {
            unverified: match self.unverified.as_str() {
                "yes" => Some(true),
                "no" => Some(false),
                _ => None,
            },
            card_type: opt(&self.card_type),
            label: opt(&self.label),
            asset: opt(&self.asset),
            project: opt(&self.project),
            user: opt(&self.user),
            older_than_days,
            group: opt(&self.group),
            archived: (self.archived == "on").then_some(true),
            ..ListQuery::default()
        })
    }

    fn fields(&self) -> Markup {
        html! {
            (type_and_trust(&self.card_type, &self.unverified))
            input type="text" name="label" value=(self.label) placeholder="label" aria-label="Label";
            input type="text" name="user" value=(self.user) placeholder="author or user" aria-label="User";
            input type="text" name="asset" value=(self.asset) placeholder="asset" aria-label="Asset";
            input type="text" name="project" value=(self.project) placeholder="project" aria-label="Project";
            input type="number" name="older_than_days" min="0" value=(self.older_than_days) placeholder="older than (days)" aria-label="Older than (days)";
            input type="text" name="group" value=(self.group) placeholder="duplicate group" aria-label="Group";
            label.check { input type="checkbox" name="archived" checked[self.archived == "on"]; " archived too" }
        }
    }
}

/// `GET /console/w/{ws}/tools`: the forms.
pub(super) async fn show(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path(ws): Path<String>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let base = format!("/console/w/{ws}");
    let none = FilterForm::default();
    let body = html! {
        h1 { "Tools" }
        section #create {
            h2 { "Create a card" }
            p.muted { "The server gives it its id. A card you write is verified." }
            form.tool method="post" action={ (base) "/create" } {
                (csrf(&ctx))
                label { "Type " select name="card_type" required {
                    @for t in CardType::NAMES { option value=(t) { (t) } }
                } }
                label { "Title " input type="text" name="title" required maxlength="200" size="60"; }
                label { "Description " input type="text" name="description" maxlength="300" size="60"; }
                label { "Labels " input type="text" name="labels" placeholder="go, backend"; }
                label { "User " input type="text" name="user" placeholder="whole workspace"; }
                label { "Asset " input type="text" name="asset" placeholder="any asset"; }
                label { "Project " input type="text" name="project" placeholder="any project"; }
                label { "Agent " input type="text" name="agent" placeholder="any agent (claude, codex …)"; }
                label.wide { "Text (Markdown) " textarea name="body" rows="8" required {} }
                button type="submit" { "Create" }
            }
        }
        section #bulk {
            h2 { "One action on every card a filter matches" }
            p.muted { "You see the cards and their count first; the action then applies to exactly those." }
            form.tool method="post" action={ (base) "/bulk" } {
                (csrf(&ctx))
                (none.fields())
                select name="action" aria-label="Action" {
                    option value="verify" { "verify" }
                    option value="reject" { "reject" }
                    option value="label" { "add a label" }
                }
                input type="text" name="reason" maxlength="500" placeholder="why (to reject)" aria-label="Reason";
                input type="text" name="add_label" placeholder="label (to add)" aria-label="Label to add";
                button type="submit" { "Preview" }
            }
        }
        section #import {
            h2 { "Import memory files" }
            p.muted {
                "OKF cards; CLAUDE.md, .claude/rules/*.md, AGENTS.md; Claude Code auto-memory and Codex memories directories. "
                "Each section becomes an unverified card waiting for review, its heading the title."
            }
            form.tool method="post" action={ (base) "/import" } enctype="multipart/form-data" {
                (csrf(&ctx))
                label { "Files " input type="file" name="files" multiple accept=".md,text/markdown"; }
                label { "or a directory " input type="file" name="files" webkitdirectory; }
                label { "Bind user memories to " input type="text" name="user" placeholder="user (optional)"; }
                label.check { input type="checkbox" name="dry_run" value="yes" checked; " dry run: show what would be created" }
                button type="submit" { "Import" }
            }
        }
        section #export {
            h2 { "Export" }
            form.tool method="get" action={ (base) "/export" } {
                (none.fields())
                button type="submit" { "Download .tar.gz" }
            }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), "Tools", body),
    ))
}

#[derive(Deserialize)]
pub(super) struct CreateForm {
    card_type: String,
    title: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    labels: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    asset: String,
    #[serde(default)]
    project: String,
    #[serde(default)]
    agent: String,
    body: String,
}

/// `POST /console/w/{ws}/create`: a verified card from the form; its page next.
pub(super) async fn create(
    State(console): State<Arc<Console>>,
    Path(ws): Path<String>,
    Posted(ctx, form): Posted<CreateForm>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let fail = |e: ApiError| api_error(&ctx, Some(&ws), e);
    let card_type = CardType::parse(form.card_type.trim()).ok_or_else(|| {
        fail(ApiError::bad_request(format!(
            "type: {:?} is not a card type",
            form.card_type
        )))
    })?;
    let fields = NewCard {
        card_type,
        title: form.title.trim().to_owned(),
        description: opt(&form.description),
        labels: form
            .labels
            .split(',')
            .map(|l| l.trim().to_lowercase())
            .filter(|l| !l.is_empty())
            .collect(),
        error_codes: Vec::new(),
        stacks: Vec::new(),
        scope: Scope {
            user_id: opt(&form.user),
            asset_id: opt(&form.asset),
            project_id: opt(&form.project),
            agent: opt(&form.agent),
        },
        body: form.body.replace("\r\n", "\n"),
    };
    let (store, actor, ws2) = (console.app.store.clone(), ctx.caller.actor(), ws.clone());
    let change =
        blocking(move || curation::create_from_fields(&store, &ws2, fields, &actor, false))
            .await
            .map_err(fail)?;
    console.app.note_revision(&ws, change.revision);
    tracing::info!(workspace = %ws, card = %change.id, token = %ctx.caller.0.id, "console create");
    console
        .sessions
        .set_flash(&ctx.session.key, "create", &change.id.to_string());
    Ok(Redirect::to(&format!("/console/w/{ws}/cards/{}", change.id)).into_response())
}

#[derive(Deserialize)]
pub(super) struct BulkForm {
    #[serde(flatten)]
    filter: FilterForm,
    action: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    add_label: String,
    /// The ids the preview showed, comma-separated: present, the action runs.
    #[serde(default)]
    confirm: String,
}

/// `POST /console/w/{ws}/bulk`: without `confirm`, the cards the filter matches and their
/// count with a button that acts on exactly those; with it, the action.
pub(super) async fn bulk(
    State(console): State<Arc<Console>>,
    Path(ws): Path<String>,
    Posted(ctx, form): Posted<BulkForm>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let fail = |e: ApiError| api_error(&ctx, Some(&ws), e);
    let action = match form.action.as_str() {
        "verify" => BulkAction::Verify,
        "reject" => BulkAction::Reject,
        "label" => BulkAction::Label,
        other => {
            return Err(fail(ApiError::bad_request(format!(
                "no bulk action {other:?}"
            ))));
        }
    };
    let confirm = match form.confirm.trim() {
        "" => None,
        ids => Some(
            ids.split(',')
                .map(|i| CardId::parse(i.trim()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| fail(ApiError::bad_request(format!("confirm: {e}"))))?,
        ),
    };
    let req = BulkRequest {
        filter: form.filter.query().map_err(fail)?,
        action,
        reason: opt(&form.reason),
        label: opt(&form.add_label),
        confirm,
    };
    let (store, actor, ws2) = (console.app.store.clone(), ctx.caller.actor(), ws.clone());
    let answer = blocking(move || curation::bulk(&store, &ws2, &req, &actor))
        .await
        .map_err(fail)?;
    if let Some(revision) = answer.revision {
        console.app.note_revision(&ws, revision);
        tracing::info!(workspace = %ws, cards = answer.cards.len(), revision,
            token = %ctx.caller.0.id, "console bulk action");
    }
    let body = bulk_page(&ctx, &ws, &form, &answer);
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), "Bulk action", body),
    ))
}

fn bulk_page(ctx: &Ctx, ws: &str, form: &BulkForm, a: &BulkAnswer) -> Markup {
    let ids: Vec<String> = a.cards.iter().map(|c| c.id.to_string()).collect();
    let f = &form.filter;
    html! {
        h1 { "Bulk " (form.action) }
        @if a.done {
            p.flash role="status" { "Done: " (form.action) " applied to " (a.cards.len()) " card(s); each card's history names you." }
        } @else {
            p #bulk-count { strong { (a.cards.len()) } " card(s) match. Nothing has changed yet." }
        }
        div.scroll {
            table.cards {
                thead { tr { th { "card" } th { "type" } } }
                tbody {
                    @for c in &a.cards {
                        tr {
                            td { a href={ "/console/w/" (ws) "/cards/" (c.id) } { (shown(&c.title)) } }
                            td { (c.card_type.as_str()) }
                        }
                    }
                }
            }
        }
        @if !a.done && !a.cards.is_empty() {
            form.tool method="post" action={ "/console/w/" (ws) "/bulk" } {
                (csrf(ctx))
                @for (name, value) in [("type", &f.card_type), ("unverified", &f.unverified), ("label", &f.label),
                    ("asset", &f.asset), ("project", &f.project), ("user", &f.user), ("older_than_days", &f.older_than_days),
                    ("group", &f.group), ("archived", &f.archived), ("action", &form.action),
                    ("reason", &form.reason), ("add_label", &form.add_label)] {
                    input type="hidden" name=(name) value=(value);
                }
                input type="hidden" name="confirm" value=(ids.join(","));
                button #bulk-apply type="submit" { (form.action) " these " (a.cards.len()) " card(s)" }
            }
        }
        p { a href={ "/console/w/" (ws) "/tools#bulk" } { "Back to the tools" } }
    }
}

/// `POST /console/w/{ws}/import`: uploaded files (multipart), imported or dry-run.
pub(super) async fn import(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path(ws): Path<String>,
    headers: HeaderMap,
    mut upload: Multipart,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let fail = |e: ApiError| api_error(&ctx, Some(&ws), e);
    let limit = console.app.config.server.max_body_bytes;
    let (mut token, mut files, mut user, mut dry_run) = (String::new(), Vec::new(), None, false);
    let mut size = 0usize;
    while let Some(field) = upload.next_field().await.map_err(|e| {
        fail(ApiError::bad_request(format!(
            "the upload could not be read: {e}"
        )))
    })? {
        let name = field.name().unwrap_or_default().to_owned();
        let file = field.file_name().map(|f| f.replace('\\', "/"));
        let bytes = field
            .bytes()
            .await
            .map_err(|e| fail(ApiError::bad_request(format!("the upload broke off: {e}"))))?;
        size += bytes.len();
        if size > limit {
            return Err(fail(ApiError::bad_request(format!(
                "the files are larger than {limit} bytes in all (server.max_body_bytes): import fewer at a time"
            ))));
        }
        let text = || String::from_utf8_lossy(&bytes).into_owned();
        match (name.as_str(), file) {
            ("_csrf", _) => token = text(),
            ("user", _) => user = opt(&text()),
            ("dry_run", _) => dry_run = text() == "yes",
            ("files", Some(path)) if !path.is_empty() => {
                let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
                    fail(ApiError::bad_request(format!("{path} is not UTF-8 text")))
                })?;
                files.push(ImportFile { path, text });
            }
            _ => {}
        }
    }
    check_upload(&ctx, &headers, &token)?;
    if files.is_empty() {
        return Err(fail(ApiError::bad_request("choose the files to import")));
    }
    let req = ImportRequest {
        files,
        dry_run,
        user,
    };
    let answer = import_files(&console.app, &ctx.caller, &ws, req)
        .await
        .map_err(fail)?;
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), "Import", import_page(&ws, &answer)),
    ))
}

fn import_page(ws: &str, a: &ImportAnswer) -> Markup {
    html! {
        h1 { "Import" }
        @if a.done {
            p.flash role="status" { "Imported " (a.cards.len()) " card(s); " (a.skipped.len()) " left out. Sections wait in the review queue, unverified." }
        } @else {
            p #import-count { "Dry run: " strong { (a.cards.len()) } " card(s) would be created; " (a.skipped.len()) " left out. Nothing has changed." }
        }
        div.scroll {
            table.cards {
                thead { tr { th { "card" } th { "type" } th { "from" } th { "" } } }
                tbody {
                    @for c in &a.cards {
                        tr {
                            td { @if a.done { a href={ "/console/w/" (ws) "/cards/" (c.id) } { (shown(&c.title)) } } @else { (shown(&c.title)) } }
                            td { (c.card_type.as_str()) }
                            td { code { (shown(&c.file)) } }
                            td { @if c.outcome == ImportOutcome::Grouped { "same lesson as another card: grouped" } }
                        }
                    }
                }
            }
        }
        @if !a.skipped.is_empty() {
            h2 { "Left out" }
            ul {
                @for s in &a.skipped {
                    li { code { (shown(&s.file)) } @if let Some(t) = &s.title { " “" (shown(t)) "”" } ": " (shown(&s.reason)) }
                }
            }
        }
        p { a href={ "/console/w/" (ws) "/tools#import" } { "Back to the tools" } }
    }
}

/// `GET /console/w/{ws}/export`: the cards the filter matches as a tarball download.
pub(super) async fn export(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path(ws): Path<String>,
    Query(f): Query<FilterForm>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let fail = |e: ApiError| api_error(&ctx, Some(&ws), e);
    let q = f.query().map_err(fail)?;
    let (bytes, cards) = export_tarball(&console.app, &ws, q).await.map_err(fail)?;
    tracing::info!(workspace = %ws, cards, bytes = bytes.len(), token = %ctx.caller.0.id, "console export");
    Ok(tarball_response(bytes, &ws))
}
