//! Tokens: list, create (with a name and an expiry), revoke. A curator sees and manages
//! only tokens whose every workspace is in their own token's scope, and creates tokens for
//! those workspaces only, expiring no later than their own, so the console never widens
//! anyone's reach in space or time. The audit names the curator who created or revoked.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use jiff::ToSpan;
use maud::html;
use mop_proto::curation::TokenRow;
use serde::Deserialize;

use super::Console;
use super::auth::{Ctx, Posted};
use super::layout::{api_error, csrf, minute, page, respond};
use super::markdown::shown;
use crate::api::{ApiError, blocking};
use crate::store::{NewToken, Role};

/// Longest expiry the form offers, in days.
const MAX_DAYS: i64 = 3650;

fn in_scope(ctx: &Ctx, row: &TokenRow) -> bool {
    !row.workspaces.is_empty() && row.workspaces.iter().all(|w| ctx.workspaces().contains(w))
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    revoked: Option<String>,
}

async fn rows(console: &Console, ctx: &Ctx) -> Result<Vec<TokenRow>, Response> {
    let store = console.app.store.clone();
    let all = blocking(move || store.list_tokens())
        .await
        .map_err(|e| api_error(ctx, None, e))?;
    Ok(all.into_iter().filter(|r| in_scope(ctx, r)).collect())
}

fn list_page(ctx: &Ctx, rows: &[TokenRow], notice: Option<maud::Markup>) -> Response {
    let body = html! {
        h1 { "Tokens" }
        @if let Some(n) = notice { (n) }
        div.scroll {
            table.tokens {
                thead { tr { th { "id" } th { "role" } th { "name / note" } th { "workspaces" } th { "created" } th { "expires" } th { "last used" } th { "" } } }
                tbody {
                    @for r in rows {
                        tr.revoked[r.revoked_at.is_some()] {
                            td { code { (r.id) } @if r.id == ctx.caller.0.id { " (this session)" } }
                            td { (r.role) }
                            td { @if let Some(n) = &r.name { (shown(n)) } @if let Some(n) = &r.note { br; span.muted { (shown(n)) } } }
                            td { (r.workspaces.join(", ")) }
                            td { span title=(r.created_at) { (minute(&r.created_at)) } }
                            td { @if let Some(e) = &r.expires_at { span title=(e) { (minute(e)) } } @else { "never" } }
                            td { @if let Some(u) = &r.last_used_at { span title=(u) { (minute(u)) } } @else { "never" } }
                            td {
                                @if let Some(at) = &r.revoked_at { "revoked " span title=(at) { (minute(at)) } }
                                @else {
                                    form method="post" action={ "/console/tokens/" (r.id) "/revoke" } {
                                        (csrf(ctx))
                                        button.danger type="submit" { "Revoke" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Create a token" }
        form.create method="post" action="/console/tokens" {
            (csrf(ctx))
            label { "Role "
                select name="role" {
                    option value="admin" { "admin (a curator)" }
                    option value="node" { "node (a host daemon)" }
                }
            }
            label { "Name " input type="text" name="name" maxlength="128" placeholder="who uses it (required for admin)"; }
            label { "Note " input type="text" name="note" maxlength="500" placeholder="what it is for"; }
            label { "Expires in (days) " input type="number" name="expires_days" required min="1" max=(MAX_DAYS) value="90"; }
            @if let Some(own) = ctx.caller.0.expires_at {
                span.muted { "(not later than your own token: " (own) ")" }
            }
            fieldset {
                legend { "Workspaces" }
                @for ws in ctx.workspaces() {
                    label.check { input type="checkbox" name="workspace" value=(ws) checked; " " (ws) }
                }
            }
            button type="submit" { "Create" }
        }
    };
    respond(StatusCode::OK, page(Some(ctx), None, "Tokens", body))
}

/// `GET /console/tokens`.
pub(super) async fn list(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Query(q): Query<ListQuery>,
) -> Result<Response, Response> {
    let rows = rows(&console, &ctx).await?;
    let notice = q
        .revoked
        .filter(|id| rows.iter().any(|r| &r.id == id && r.revoked_at.is_some()))
        .map(|id| html! { p.flash role="status" { "Token " code { (id) } " revoked; its sessions have ended." } });
    Ok(list_page(&ctx, &rows, notice))
}

/// `POST /console/tokens`: creates a token and shows it, once.
pub(super) async fn create(
    State(console): State<Arc<Console>>,
    Posted(ctx, fields): Posted<Vec<(String, String)>>,
) -> Result<Response, Response> {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let fail = |e: ApiError| api_error(&ctx, None, e);
    let role = match field("role").as_deref() {
        Some("admin") => Role::Admin,
        Some("node") => Role::Node,
        _ => return Err(fail(ApiError::bad_request("role must be admin or node"))),
    };
    let workspaces: Vec<String> = fields
        .iter()
        .filter(|(k, _)| k == "workspace")
        .map(|(_, v)| v.clone())
        .collect();
    if workspaces.is_empty() {
        return Err(fail(ApiError::bad_request("tick at least one workspace")));
    }
    if let Some(w) = workspaces.iter().find(|w| !ctx.workspaces().contains(w)) {
        return Err(fail(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "workspace {w:?} is outside your token's scope; you can create tokens only for your own workspaces"
            ),
        )));
    }
    // Every token made here expires, and no later than the token making it: a curator
    // cannot outlast their own access through a token they minted.
    let days = field("expires_days").unwrap_or_default();
    let days = match days.parse::<i64>() {
        Ok(n) if (1..=MAX_DAYS).contains(&n) => n,
        _ => {
            return Err(fail(ApiError::bad_request(format!(
                "expires in (days) must be a whole number from 1 to {MAX_DAYS}, not {days:?}"
            ))));
        }
    };
    let mut expires_at = jiff::Timestamp::now() + (days * 24).hours();
    if let Some(own) = ctx.caller.0.expires_at
        && own < expires_at
    {
        expires_at = own;
    }
    let (name, note) = (field("name"), field("note"));
    if note.as_ref().is_some_and(|n| n.chars().count() > 500) {
        return Err(fail(ApiError::bad_request(
            "the note is longer than 500 characters",
        )));
    }
    let store = console.app.store.clone();
    let ws2 = workspaces.clone();
    let actor = ctx.caller.actor();
    let (id, token) = blocking(move || {
        store.create_token(&NewToken {
            role,
            workspaces: &ws2,
            note: note.as_deref(),
            name: name.as_deref(),
            expires_at: Some(expires_at),
            actor: &actor,
        })
    })
    .await
    .map_err(fail)?;
    console.app.reload().map_err(|e| fail(e.into()))?;
    tracing::info!(token = %ctx.caller.0.id, created = %id, role = %role, "console created a token");
    let rows = rows(&console, &ctx).await?;
    let notice = html! {
        div.flash.secret role="status" {
            p { "Token " code { (id) } " created. Copy it now: it is shown only this once." }
            input.secret type="text" readonly value=(token) aria-label="The new token";
        }
    };
    Ok(list_page(&ctx, &rows, Some(notice)))
}

/// `POST /console/tokens/{id}/revoke`.
pub(super) async fn revoke(
    State(console): State<Arc<Console>>,
    Path(id): Path<String>,
    Posted(ctx, _): Posted<Vec<(String, String)>>,
) -> Result<Response, Response> {
    let rows = rows(&console, &ctx).await?;
    if !rows.iter().any(|r| r.id == id) {
        return Err(api_error(
            &ctx,
            None,
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no token {id:?} within your workspaces"),
            ),
        ));
    }
    let (store, id2, actor) = (console.app.store.clone(), id.clone(), ctx.caller.actor());
    blocking(move || store.revoke_token(&id2, &actor))
        .await
        .map_err(|e| api_error(&ctx, None, e))?;
    console
        .app
        .reload()
        .map_err(|e| api_error(&ctx, None, e.into()))?;
    tracing::info!(token = %ctx.caller.0.id, revoked = %id, "console revoked a token");
    Ok(Redirect::to(&format!("/console/tokens?revoked={id}")).into_response())
}
