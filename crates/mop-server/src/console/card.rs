//! One card: its page (rendered Markdown, provenance, usage, versions, actions), the
//! editor with live preview and a conditional save, its history with diffs, and the
//! actions. Every change is sent with the version the curator saw; a card that changed
//! meanwhile gets a 412 page showing what changed, and nothing typed is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};
use mop_cards::CardId;
use mop_proto::curation::{CardDetails, CardInfo, HistoryRow};
use serde::Deserialize;

use super::Console;
use super::auth::{Ctx, Posted};
use super::layout::{ago, api_error, badges, csrf, error_page, page, pager, respond};
use super::markdown::{self, shown};
use super::queue::flash;
use crate::api::admin::{Action, act as api_act, delete_card, update_text};
use crate::api::curation::lift_rejection;
use crate::api::{ApiError, blocking};
use crate::service::curation::CardState;

/// History rows per page (each may carry a diff of a long card).
const HISTORY_PAGE: usize = 20;
/// The most time one page's diffs may take; past it they are coarser, not slower.
const DIFF_BUDGET: Duration = Duration::from_millis(500);

fn parse_id(ctx: &Ctx, ws: &str, id: &str) -> Result<CardId, Response> {
    CardId::parse(id).map_err(|e| {
        api_error(
            ctx,
            Some(ws),
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{id:?} is not a card id: {e}"),
            ),
        )
    })
}

async fn details(
    console: &Console,
    ctx: &Ctx,
    ws: &str,
    id: CardId,
) -> Result<CardDetails, Response> {
    let (store, ws2) = (console.app.store.clone(), ws.to_owned());
    blocking(move || store.card_details(&ws2, &id))
        .await
        .map_err(|e| api_error(ctx, Some(ws), e))
}

/// A card page's common start: the workspace in scope, the id well formed, the card read.
async fn load(
    console: &Console,
    ctx: &Ctx,
    ws: &str,
    id: &str,
) -> Result<(CardId, CardDetails), Response> {
    ctx.workspace(console, ws)?;
    let id = parse_id(ctx, ws, id)?;
    Ok((id, details(console, ctx, ws, id).await?))
}

fn body_of(text: &str) -> &str {
    mop_cards::card_body(text.as_bytes()).unwrap_or(text)
}

fn facts(card: &CardInfo) -> Markup {
    let s = &card.summary;
    let p = card.provenance.as_ref();
    let u = &card.usage;
    html! {
        dl.facts {
            dt { "id" } dd { code { (s.id) } }
            @if let Some(d) = &s.description { dt { "description" } dd { (shown(d)) } }
            @if !s.labels.is_empty() { dt { "labels" } dd { ul.labels { @for l in &s.labels { li { (l) } } } } }
            dt { "audience" } dd { (s.audience_sentence()) }
            @for (axis, name) in s.scope.bindings() { dt { (axis) } dd { code { (shown(name)) } } }
            @if !s.error_codes.is_empty() { dt { "error codes" } dd { @for c in &s.error_codes { code { (c) } " " } } }
            @if !s.stacks.is_empty() { dt { "stacks" } dd { @for c in &s.stacks { code { (c) } " " } } }
            dt { "importance" } dd { (s.importance) }
            @if let Some(t) = s.created_at { dt { "created" } dd { (t) } }
            @if let Some(t) = s.updated_at { dt { "updated" } dd { (t) } }
            @if let Some(by) = s.superseded_by { dt { "superseded by" } dd { code { (by) } } }
            @if let Some(at) = &card.archived_at { dt { "archived" } dd { (at) } }
            @if let Some(p) = p {
                dt { "provenance" }
                dd {
                    @if let Some(t) = &p.source.task_id { "task " code { (shown(t)) } " " }
                    @if let Some(u) = &p.source.user_id { "by " code { (shown(u)) } " " }
                    @if let Some(a) = &p.source.asset_id { "on " code { (shown(a)) } " " }
                    @if let Some(x) = &p.source.project_id { "in project " code { (shown(x)) } " " }
                    @if let Some(n) = &p.node_token { "via node token " code { (n) } " " }
                    @if let Some(at) = &p.stored_at { "at " (at) }
                }
            }
            dt { "counters" } dd { "seen " (card.occurrence) "× · stored again " (card.reinforcements) "×"
                @if let Some(l) = &card.last_seen { " · last seen " (l) } }
            dt { "usage" } dd {
                "delivered " (u.delivered_7d) " (7 d) / " (u.delivered_30d) " (30 d) · retrieved "
                (u.retrieved_7d) " / " (u.retrieved_30d)
                @if let Some(t) = u.last_delivered_at { " · last delivered " (t) }
                @if !u.hosts.is_empty() { " · hosts: " @for h in &u.hosts { code { (shown(h)) } " " } }
            }
            dt { "task outcomes" } dd.outcomes { (outcomes(u)) }
            dt { "agents' verdicts" } dd.feedback { (feedback(&u.feedback)) }
            dt { "version" } dd { code.etag { (card.etag) } }
        }
    }
}

/// "Delivered to N tasks: X succeeded, Y failed, Z unknown", over 30 days.
pub(super) fn outcomes(u: &mop_proto::curation::Usage) -> Markup {
    let o = &u.outcomes_30d;
    html! {
        "delivered to " (u.delivered_30d) " tasks in 30 days: " (o.succeeded) " succeeded, "
        (o.failed) " failed, " (o.unknown) " unknown (a correlation, not a cause)"
    }
}

/// Agents' verdicts: counts over 7 and 30 days, from how many users and hosts, and the
/// latest notes.
pub(super) fn feedback(f: &mop_proto::curation::FeedbackCounts) -> Markup {
    html! {
        "helped " (f.helped_7d) " / " (f.helped_30d) " · wrong " (f.wrong_7d) " / " (f.wrong_30d)
        " · outdated " (f.outdated_7d) " / " (f.outdated_30d) " (7 d / 30 d), from "
        (f.users_30d) " users on " (f.hosts_30d) " hosts"
        @if f.flagged { " " span.badge.flagged { "flagged by " (f.against_users) " users" } }
        @if !f.notes.is_empty() {
            ul.notes {
                @for n in &f.notes {
                    li {
                        span.badge { (n.verdict.as_str()) } " "
                        @if let Some(u) = &n.user_id { span.user { (shown(u)) } " " }
                        (n.at) ": " q { (shown(&n.note)) }
                    }
                }
            }
        }
    }
}

/// What a curator must know before acting: credentials in the text, a rejected lesson
/// coming back, the other cards stored as the same lesson.
fn warnings(ctx: &Ctx, base: &str, ws: &str, card: &CardInfo) -> Markup {
    html! {
        @if !card.credentials.is_empty() {
            div.notice.danger role="alert" {
                p { strong { "This card carries " (card.credentials.len()) " credential(s)." }
                    " Verifying it would send them to every task of the workspace. Delete the card for good (below), or edit the credential out." }
                ul { @for f in &card.credentials { li { code { (f.kind) } " in " (f.field) ", line " (f.line) ", column " (f.column) } } }
            }
        }
        @if let Some(r) = &card.previously_rejected {
            div.notice.danger role="alert" {
                p { strong { "Previously rejected." } " A curator rejected this lesson on " (r.at) ": " (shown(&r.reason)) }
                (action_form(ctx, base, "lift", &card.etag, "Lift that rejection", html! {
                    input type="hidden" name="rejection" value=(r.id);
                }))
            }
        }
        @if let Some(g) = card.duplicate_group.as_ref().filter(|g| g.members.len() > 1) {
            div.notice {
                p { "Tasks stored this lesson " (g.members.len()) " times (they could not see each other's cards):" }
                ul { @for m in &g.members {
                    li { @if *m == card.summary.id { code { (m) } " (this card)" } @else { a href={ "/console/w/" (ws) "/cards/" (m) } { code { (m) } } } }
                } }
            }
        }
    }
}

fn action_form(
    ctx: &Ctx,
    base: &str,
    action: &str,
    etag: &str,
    label: &str,
    extra: Markup,
) -> Markup {
    html! {
        form.action method="post" action={ (base) "/do/" (action) } {
            (csrf(ctx))
            input type="hidden" name="etag" value=(etag);
            input type="hidden" name="back" value=(base);
            (extra)
            button type="submit" { (label) }
        }
    }
}

fn actions(ctx: &Ctx, base: &str, card: &CardInfo) -> Markup {
    let s = &card.summary;
    let e = &card.etag;
    let none = html! {};
    html! {
        div.actions {
            a.button href={ (base) "/edit" } { "Edit" }
            a.button href={ (base) "/history" } { "History" }
            @if s.is_unverified() && card.archived_at.is_none() {
                @if card.credentials.is_empty() {
                    (action_form(ctx, base, "verify", e, "Verify", none.clone()))
                } @else {
                    (action_form(ctx, base, "verify", e, "Verify anyway", html! {
                        label { input type="checkbox" name="allow_credentials" value="yes" required; " keep its credentials (audited)" }
                    }))
                }
                (action_form(ctx, base, "reject", e, "Reject", html! {
                    input type="text" name="reason" required maxlength="500" placeholder="why" aria-label="Reason to reject";
                }))
            }
            @if card.archived_at.is_none() {
                (action_form(ctx, base, "merge", e, "Merge into", html! {
                    input type="text" name="into" required placeholder="card id" aria-label="Merge into card id" size="36";
                }))
                (action_form(ctx, base, "supersede", e, "Superseded by", html! {
                    input type="text" name="by" required placeholder="card id" aria-label="Superseding card id" size="36";
                }))
                @if s.enabled { (action_form(ctx, base, "disable", e, "Disable", html! {
                    input type="text" name="reason" required maxlength="500" placeholder="why (kept in the history)" aria-label="Reason to disable";
                    label { input type="checkbox" name="confirm" value="yes" required; " out of every task until enabled" }
                })) }
                @else { (action_form(ctx, base, "enable", e, "Enable", none.clone())) }
                (action_form(ctx, base, "archive", e, "Archive", html! {
                    input type="text" name="reason" required maxlength="500" placeholder="why (kept in the history)" aria-label="Reason to archive";
                    label { input type="checkbox" name="confirm" value="yes" required; " out of every task; purged after the retention" }
                }))
            } @else {
                (action_form(ctx, base, "unarchive", e, "Unarchive", none.clone()))
            }
            @if card.archived_at.is_none() { (fields_form(ctx, base, card)) }
            (action_form(ctx, base, "delete", e, "Delete for good", html! {
                input type="text" name="reason" required maxlength="500" placeholder="why (kept in the audit)" aria-label="Reason to delete";
                label { input type="checkbox" name="confirm" value="yes" required; " its text, objects and history text go; this cannot be undone" }
            }))
        }
    }
}

/// The card's fields as a form: type, labels, scope and importance, set without YAML.
fn fields_form(ctx: &Ctx, base: &str, card: &CardInfo) -> Markup {
    let s = &card.summary;
    html! {
        details.fields {
            summary { "Fields" }
            (action_form(ctx, base, "fields", &card.etag, "Save fields", html! {
                label { "Type " select name="card_type" {
                    @for t in mop_cards::CardType::ALL {
                        option value=(t.as_str()) selected[t == s.card_type] { (t.as_str()) }
                    }
                } }
                label { "Labels " input type="text" name="labels" value=(s.labels.join(", ")) placeholder="go, backend" size="30"; }
                label { "User " input type="text" name="user" value=(s.scope.user_id.as_deref().unwrap_or("")) placeholder="whole workspace" size="16"; }
                label { "Asset " input type="text" name="asset" value=(s.scope.asset_id.as_deref().unwrap_or("")) placeholder="any asset" size="16"; }
                label { "Project " input type="text" name="project" value=(s.scope.project_id.as_deref().unwrap_or("")) placeholder="any project" size="16"; }
                label { "Agent " input type="text" name="agent" value=(s.scope.agent.as_deref().unwrap_or("")) placeholder="any agent" size="10"; }
                label { "Importance " input type="number" name="importance" min="0" max="1" step="any" value=(s.importance); }
            }))
        }
    }
}

/// `GET /console/w/{ws}/cards/{id}`.
pub(super) async fn show(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Response, Response> {
    let (id, d) = load(&console, &ctx, &ws, &id).await?;
    let base = format!("/console/w/{ws}/cards/{id}");
    let recent: Vec<&HistoryRow> = d.history.iter().rev().take(5).collect();
    let rendered = markdown::render(body_of(&d.text));
    // The whole file's gaps (its frontmatter's too), not only the body's.
    let unshown: Vec<String> = mop_cards::unshown(&d.text)
        .iter()
        .map(ToString::to_string)
        .collect();
    let read_raw = d.card.summary.is_unverified() || !unshown.is_empty();
    let body = html! {
        @if let Some(f) = flash(&console, &ctx, &ws) { (f) }
        article.card {
            h1 { (shown(&d.card.summary.title)) }
            p.meta { (badges(&d.card)) }
            (warnings(&ctx, &base, &ws, &d.card))
            (actions(&ctx, &base, &d.card))
            (markdown::unshown_notice(&unshown))
            div.body.markdown { (maud::PreEscaped(&rendered.html)) }
            details.raw open[read_raw] {
                summary { "The card file (what agents read)" }
                pre { (shown(&d.text)) }
            }
            h2 { "Facts" }
            (facts(&d.card))
            h2 { "Recent versions" }
            (history_table(&recent))
            p { a href={ (base) "/history" } { "Whole history with diffs (" (d.history.len()) " entries)" } }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), &shown(&d.card.summary.title), body),
    ))
}

fn actor(row: &HistoryRow) -> Markup {
    html! {
        @if let Some(n) = &row.actor_name { span.actor { (shown(n)) } " " span.muted { "(" (row.actor) ")" } }
        @else { span.actor { (row.actor) } }
    }
}

fn history_table(rows: &[&HistoryRow]) -> Markup {
    html! {
        div.scroll {
            table.history {
                thead { tr { th { "when" } th { "who" } th { "what" } th { "detail" } } }
                tbody {
                    @for r in rows {
                        tr {
                            td { span title=(r.at) { (ago(&r.at)) } }
                            td { (actor(r)) }
                            td { (r.action) }
                            td { @if let Some(d) = &r.detail { (shown(d)) } }
                        }
                    }
                }
            }
        }
    }
}

#[derive(Deserialize)]
pub(super) struct OffsetQuery {
    #[serde(default)]
    offset: usize,
}

/// `GET /console/w/{ws}/cards/{id}/history`: newest first, each change with its diff.
pub(super) async fn history(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path((ws, id)): Path<(String, String)>,
    Query(q): Query<OffsetQuery>,
) -> Result<Response, Response> {
    let (id, d) = load(&console, &ctx, &ws, &id).await?;
    // Diffs are CPU work: off the async workers, and within one budget per page.
    tokio::task::spawn_blocking(move || history_page(&ctx, &ws, id, &d, q.offset))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "history page panicked");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        })
}

fn history_page(ctx: &Ctx, ws: &str, id: CardId, d: &CardDetails, offset: usize) -> Response {
    // Each row's text before it: the content of the last earlier row that had one.
    let mut before: Vec<Option<&str>> = Vec::with_capacity(d.history.len());
    let mut last: Option<&str> = None;
    for row in &d.history {
        before.push(last);
        if let Some(c) = &row.content {
            last = Some(c);
        }
    }
    let total = d.history.len();
    let rows: Vec<usize> = (0..total).rev().skip(offset).take(HISTORY_PAGE).collect();
    // A version can be restored while the card is not archived, unless it is the text the
    // card has now.
    let current = d.text.as_str();
    let revertible = |row: &HistoryRow| {
        d.card.archived_at.is_none()
            && !row.redacted
            && row.content.as_deref().is_some_and(|c| c != current)
    };
    let deadline = Instant::now() + DIFF_BUDGET;
    let base = format!("/console/w/{ws}/cards/{id}");
    let body = html! {
        h1 { "History of " a href=(base) { (shown(&d.card.summary.title)) } }
        ol.history {
            @for &i in &rows {
                @let row = &d.history[i];
                li {
                    p.meta {
                        strong { (row.action) } " by " (actor(row)) " · " span title=(row.at) { (row.at) }
                        " · revision " (row.revision)
                    }
                    @if let Some(detail) = &row.detail { p.detail { (shown(detail)) } }
                    @if row.redacted { p.muted { "Content removed (purged or deleted)." } }
                    @else if let Some(after) = &row.content {
                        @match before[i] {
                            Some(prev) => (markdown::diff(prev, after, deadline)),
                            None => details { summary { "Text (first version)" } pre { (shown(after)) } },
                        }
                    }
                    @if revertible(row) {
                        (action_form(ctx, &base, "revert", &d.card.etag, "Revert to this version", html! {
                            input type="hidden" name="seq" value=(row.seq);
                        }))
                    }
                }
            }
        }
        (pager(&format!("{base}/history"), offset, rows.len(), total, HISTORY_PAGE))
    };
    respond(StatusCode::OK, page(Some(ctx), Some(ws), "History", body))
}

/// The card editor. `offer_override`: the last save was refused for credentials, so the
/// curator may keep them deliberately (audited).
fn editor(
    ctx: &Ctx,
    ws: &str,
    base: &str,
    text: &str,
    etag: &str,
    unverified: bool,
    offer_override: bool,
) -> Markup {
    html! {
        form.editor method="post" action={ (base) "/edit" } data-preview={ "/console/w/" (ws) "/preview" } {
            (csrf(ctx))
            input type="hidden" name="etag" value=(etag);
            div.panes {
                label.pane {
                    span { "Card file (frontmatter and Markdown body)" }
                    textarea name="text" rows="24" spellcheck="false" { (text) }
                }
                div.pane {
                    span { "Preview" }
                    div #preview .markdown aria-live="polite" { (markdown::render(body_of(text)).markup()) }
                }
            }
            @if offer_override {
                label.override { input type="checkbox" name="allow_credentials" value="yes"; " Keep the credentials in this card anyway (the audit records their kinds)" }
            }
            div.actions {
                button type="submit" name="then" value="save" { "Save" }
                @if unverified { button type="submit" name="then" value="verify" { "Save and verify" } }
                a.button href=(base) { "Cancel" }
            }
        }
    }
}

/// `GET /console/w/{ws}/cards/{id}/edit`.
pub(super) async fn edit_page(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Response, Response> {
    let (id, d) = load(&console, &ctx, &ws, &id).await?;
    let base = format!("/console/w/{ws}/cards/{id}");
    let body = html! {
        h1 { "Edit " a href=(base) { (shown(&d.card.summary.title)) } }
        (editor(&ctx, &ws, &base, &d.text, &d.card.etag, d.card.summary.is_unverified(), false))
    };
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), "Edit", body),
    ))
}

#[derive(Deserialize)]
pub(super) struct SaveForm {
    text: String,
    etag: String,
    then: Option<String>,
    allow_credentials: Option<String>,
}

/// `POST /console/w/{ws}/cards/{id}/edit`.
pub(super) async fn save(
    State(console): State<Arc<Console>>,
    Path((ws, id)): Path<(String, String)>,
    Posted(ctx, form): Posted<SaveForm>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let id = parse_id(&ctx, &ws, &id)?;
    // A browser sends a textarea's lines with CRLF; cards are written with LF.
    let text = form.text.replace("\r\n", "\n");
    let verify = form.then.as_deref() == Some("verify");
    let allow = form.allow_credentials.as_deref() == Some("yes");
    let tag = Some(form.etag.clone());
    let raw = bytes::Bytes::from(text.clone().into_bytes());
    let result = if verify {
        api_act(
            &console.app,
            &ctx.caller,
            &ws,
            id,
            Action::Verify(Some(raw), allow),
            tag,
            "verify",
        )
        .await
    } else {
        update_text(&console.app, &ctx.caller, &ws, id, raw, tag, allow).await
    };
    let base = format!("/console/w/{ws}/cards/{id}");
    match result {
        Ok(_) => {
            let done = if verify { "verify" } else { "save" };
            console
                .sessions
                .set_flash(&ctx.session.key, done, &id.to_string());
            Ok(Redirect::to(&base).into_response())
        }
        Err(e) if e.status() == StatusCode::PRECONDITION_FAILED => {
            Err(changed_meanwhile(&console, &ctx, &ws, id, &form.etag, Some(&text)).await)
        }
        Err(e)
            if e.status() == StatusCode::UNPROCESSABLE_ENTITY
                || e.status() == StatusCode::BAD_REQUEST =>
        {
            // "Save and verify" is offered again to whoever chose it (the card was unverified).
            let unverified = verify;
            let credentials = e.code() == mop_proto::sync::store_errors::CREDENTIAL;
            let body = html! {
                h1 { "Edit " a href=(base) { "card " (id) } }
                p.notice role="alert" { "Not saved: " (e.message()) ". Your text is below; correct it and save again." }
                (editor(&ctx, &ws, &base, &text, &form.etag, unverified, credentials))
            };
            Err(respond(
                StatusCode::UNPROCESSABLE_ENTITY,
                page(Some(&ctx), Some(&ws), "Edit", body),
            ))
        }
        Err(e) => Err(api_error(&ctx, Some(&ws), e)),
    }
}

/// The 412 page: the card changed since the curator loaded `seen_etag`. Shows who changed
/// it and how (a diff from the seen version to the current one); with `yours`, the
/// curator's text in an editor set to the current version, to save over it knowingly.
async fn changed_meanwhile(
    console: &Console,
    ctx: &Ctx,
    ws: &str,
    id: CardId,
    seen_etag: &str,
    yours: Option<&str>,
) -> Response {
    let d = match details(console, ctx, ws, id).await {
        Ok(d) => d,
        Err(page) => return page,
    };
    let seen_sha = seen_etag.trim_matches('"').trim_end_matches(".archived");
    let seen = d
        .history
        .iter()
        .rev()
        .find(|r| r.sha256_after.as_deref() == Some(seen_sha))
        .and_then(|r| r.content.as_deref());
    let seen_at = d
        .history
        .iter()
        .position(|r| r.sha256_after.as_deref() == Some(seen_sha));
    let since: Vec<&HistoryRow> = match seen_at {
        Some(i) => d.history[i + 1..].iter().collect(),
        None => d.history.iter().rev().take(3).collect(),
    };
    let base = format!("/console/w/{ws}/cards/{id}");
    let body = html! {
        section.error {
            h1 { "This card changed while you were working on it" }
            p.what {
                "Nothing was saved: the card is no longer the version you opened. "
                "Read what changed, then act again on the current version."
            }
            h2 { "Changes since your version" }
            (history_table(&since))
            @match seen {
                Some(old) => (markdown::diff(old, &d.text, Instant::now() + DIFF_BUDGET)),
                None => p.muted { "The version you opened is no longer in the history; the current text is below." },
            }
        }
        @if let Some(yours) = yours {
            h2 { "Your text" }
            p { "Still here. Saving it now replaces the current version shown above." }
            (editor(ctx, ws, &base, yours, &d.card.etag, d.card.summary.is_unverified(), false))
        } @else {
            p { a.button href=(base) { "Open the current version" } }
        }
    };
    respond(
        StatusCode::PRECONDITION_FAILED,
        page(Some(ctx), Some(ws), "Changed meanwhile", body),
    )
}

#[derive(Deserialize)]
pub(super) struct ActForm {
    etag: Option<String>,
    back: Option<String>,
    reason: Option<String>,
    into: Option<String>,
    by: Option<String>,
    allow_credentials: Option<String>,
    confirm: Option<String>,
    rejection: Option<String>,
    seq: Option<String>,
    card_type: Option<String>,
    labels: Option<String>,
    user: Option<String>,
    asset: Option<String>,
    project: Option<String>,
    agent: Option<String>,
    importance: Option<String>,
}

impl ActForm {
    /// A reason given and the confirmation ticked (what taking a card out needs).
    fn confirmed(&self) -> bool {
        self.confirm.as_deref() == Some("yes")
            && self.reason.as_deref().is_some_and(|r| !r.trim().is_empty())
    }

    /// The fields form as a request: every field it shows is set (empty: none).
    fn fields(&self) -> Result<mop_proto::curation::FieldsRequest, String> {
        let card_type = match self.card_type.as_deref().map(str::trim) {
            Some(t) if !t.is_empty() => Some(
                mop_cards::CardType::parse(t)
                    .ok_or_else(|| format!("type: {t:?} is not a card type"))?,
            ),
            _ => None,
        };
        let labels = self.labels.as_deref().map(|l| {
            l.split(',')
                .map(|x| x.trim().to_lowercase())
                .filter(|x| !x.is_empty())
                .collect()
        });
        let id = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let importance = match self.importance.as_deref().map(str::trim) {
            Some(i) if !i.is_empty() => Some(
                i.parse::<f64>()
                    .map_err(|_| format!("importance: {i:?} is not a number from 0 to 1"))?,
            ),
            _ => None,
        };
        Ok(mop_proto::curation::FieldsRequest {
            card_type,
            labels,
            scope: Some(mop_cards::Scope {
                user_id: id(&self.user),
                asset_id: id(&self.asset),
                project_id: id(&self.project),
                agent: id(&self.agent),
            }),
            importance,
        })
    }
}

/// `POST /console/w/{ws}/cards/{id}/do/{action}`.
pub(super) async fn act(
    State(console): State<Arc<Console>>,
    Path((ws, id, action)): Path<(String, String, String)>,
    Posted(ctx, form): Posted<ActForm>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let id = parse_id(&ctx, &ws, &id)?;
    let other = |field: &str, value: Option<&str>| -> Result<CardId, Response> {
        let v = value.unwrap_or("").trim();
        CardId::parse(v).map_err(|e| {
            api_error(
                &ctx,
                Some(&ws),
                ApiError::bad_request(format!("{field}: {v:?} is not a card id ({e})")),
            )
        })
    };
    // Deleting for good and lifting a rejection are not version-bound card actions.
    match action.as_str() {
        "delete" => {
            let reason = form.reason.clone().unwrap_or_default();
            if !form.confirmed() {
                let why = "to delete a card for good, give a reason and tick the confirmation";
                return Err(api_error(&ctx, Some(&ws), ApiError::bad_request(why)));
            }
            return match delete_card(&console.app, &ctx.caller, &ws, id, Some(reason)).await {
                Ok(_) => {
                    console
                        .sessions
                        .set_flash(&ctx.session.key, "delete", &id.to_string());
                    Ok(Redirect::to(&format!("/console/w/{ws}")).into_response())
                }
                Err(e) => Err(api_error(&ctx, Some(&ws), e)),
            };
        }
        "lift" => {
            let rejection = form.rejection.clone().unwrap_or_default();
            return match lift_rejection(&console.app, &ctx.caller, &ws, rejection).await {
                Ok(_) => {
                    console
                        .sessions
                        .set_flash(&ctx.session.key, "lift", &id.to_string());
                    Ok(Redirect::to(&format!("/console/w/{ws}/cards/{id}")).into_response())
                }
                Err(e) => Err(api_error(&ctx, Some(&ws), e)),
            };
        }
        _ => {}
    }
    let reason = || form.reason.clone().filter(|r| !r.trim().is_empty());
    let what = match action.as_str() {
        "verify" => Action::Verify(None, form.allow_credentials.as_deref() == Some("yes")),
        "reject" => Action::Reject(form.reason.clone().unwrap_or_default()),
        // Verifying the card merged into needs its text read first: its own page does it.
        "merge" => Action::Merge(other("merge into", form.into.as_deref())?, None),
        "revert" => Action::Revert(
            form.seq
                .as_deref()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| {
                    error_page(
                        Some(&ctx),
                        Some(&ws),
                        StatusCode::BAD_REQUEST,
                        "Which version?",
                        html! { "Use a version's button on the card's history page." },
                    )
                })?,
        ),
        "supersede" => Action::State(
            CardState::Supersede(other("superseded by", form.by.as_deref())?),
            None,
        ),
        "fields" => Action::Fields(
            form.fields()
                .map_err(|m| api_error(&ctx, Some(&ws), ApiError::bad_request(m)))?,
        ),
        "disable" | "archive" if !form.confirmed() => {
            let why = format!("to {action} a card, give a reason and tick the confirmation");
            return Err(api_error(&ctx, Some(&ws), ApiError::bad_request(why)));
        }
        "disable" => Action::State(CardState::Disable, reason()),
        "enable" => Action::State(CardState::Enable, reason()),
        "archive" => Action::State(CardState::Archive, reason()),
        "unarchive" => Action::State(CardState::Unarchive, reason()),
        "keep" => Action::Keep(reason()),
        _ => {
            return Err(error_page(
                Some(&ctx),
                Some(&ws),
                StatusCode::NOT_FOUND,
                "There is no such card action.",
                html! { "Use the buttons on the card's page." },
            ));
        }
    };
    let tag = form.etag.clone().filter(|t| !t.is_empty());
    match api_act(&console.app, &ctx.caller, &ws, id, what, tag, &action).await {
        Ok(_) => {
            let back = form
                .back
                .as_deref()
                .filter(|b| {
                    b.starts_with(&format!("/console/w/{ws}"))
                        && !b.contains("//")
                        && !b.contains('\\')
                })
                .map_or_else(|| format!("/console/w/{ws}"), str::to_owned);
            console
                .sessions
                .set_flash(&ctx.session.key, &action, &id.to_string());
            Ok(Redirect::to(&back).into_response())
        }
        Err(e) if e.status() == StatusCode::PRECONDITION_FAILED => {
            let seen = form.etag.unwrap_or_default();
            Err(changed_meanwhile(&console, &ctx, &ws, id, &seen, None).await)
        }
        Err(e) => Err(api_error(&ctx, Some(&ws), e)),
    }
}

#[derive(Deserialize)]
pub(super) struct PreviewForm {
    text: String,
}

/// `POST /console/w/{ws}/preview`: the editor's live preview, as an HTML fragment.
pub(super) async fn preview(
    State(console): State<Arc<Console>>,
    Path(ws): Path<String>,
    Posted(ctx, form): Posted<PreviewForm>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let text = form.text.replace("\r\n", "\n");
    let largest = mop_cards::MAX_FRONTMATTER_BYTES + mop_cards::MAX_BODY_BYTES;
    if text.len() > largest {
        let note = html! {
            p.notice role="alert" {
                "The text is " (text.len()) " bytes; a card holds at most " (largest)
                " (frontmatter and body). Shorten it: saving would be refused."
            }
        };
        return Ok(Html(note.into_string()).into_response());
    }
    let fragment = tokio::task::spawn_blocking(move || {
        let problem = mop_cards::parse_card(text.as_bytes()).err();
        html! {
            @if let Some(p) = problem { p.notice role="alert" { "Not a valid card yet: " (p) } }
            (markdown::render(body_of(&text)).markup())
        }
    })
    .await
    .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())?;
    Ok(Html(fragment.into_string()).into_response())
}
