//! The page shell (head, navigation, logout), error pages, and the small pieces every page
//! shows the same way: a card's badges, times, paging links.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use mop_proto::curation::{CardInfo, Standing};
use mop_proto::time::Stamp;

use super::assets;
use super::auth::Ctx;
use crate::api::ApiError;

/// A whole page: `ctx` is the logged-in curator (none on the login page), `ws` the
/// workspace the page is about.
pub fn page(ctx: Option<&Ctx>, ws: Option<&str>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · mop console" }
                link rel="icon" href=(assets::icon_url());
                link rel="stylesheet" href=(assets::css_url());
                script src=(assets::js_url()) defer {}
            }
            body {
                header.top {
                    a.brand href="/console/" { "mop" }
                    @if let Some(ctx) = ctx {
                        nav {
                            @if let Some(ws) = ws {
                                a href={ "/console/w/" (ws) } { "Review" }
                                a href={ "/console/w/" (ws) "/search" } { "Search" }
                                a href={ "/console/w/" (ws) "/stale" } { "Stale" }
                                a href={ "/console/w/" (ws) "/tools" } { "Tools" }
                            }
                            a href="/console/tokens" { "Tokens" }
                            @if ctx.workspaces().len() > 1 {
                                a href="/console/" { "Workspaces" }
                            }
                        }
                        form.logout method="post" action="/console/logout" {
                            (csrf(ctx))
                            span.who { (ctx.name()) @if let Some(ws) = ws { " · " (ws) } }
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The hidden CSRF field every form of a session carries.
pub fn csrf(ctx: &Ctx) -> Markup {
    html! { input type="hidden" name="_csrf" value=(ctx.session.csrf); }
}

/// A page as a response.
pub fn respond(status: StatusCode, markup: Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

/// An error page: what happened and what to do.
pub fn error_page(
    ctx: Option<&Ctx>,
    ws: Option<&str>,
    status: StatusCode,
    what: &str,
    todo: Markup,
) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    respond(
        status,
        page(
            ctx,
            ws,
            title,
            html! {
                section.error {
                    h1 { (title) }
                    p.what { (what) }
                    div.todo { (todo) }
                }
            },
        ),
    )
}

/// An API error as a page, with the next step for its kind.
pub fn api_error(ctx: &Ctx, ws: Option<&str>, e: ApiError) -> Response {
    let back = ws.map(|w| format!("/console/w/{w}"));
    let todo = match e.code() {
        "not_found" => html! {
            "Check the link; the card may have been deleted or purged. "
            @if let Some(b) = &back { a href=(b) { "Back to the review queue" } }
        },
        "invalid" | "bad_request" => html! { "Correct the input and send it again." },
        "conflict" => html! { "Reload the card and decide again with its current state." },
        "precondition_failed" => html! {
            "Reload the card to see its current version, then act again."
        },
        "forbidden" => html! { "Log in with an admin token whose scope covers this workspace." },
        "too_many_requests" => html! { "Wait a moment and try again." },
        _ => html! { "Try again; if it keeps failing, the server log says why." },
    };
    error_page(Some(ctx), ws, e.status(), e.message(), todo)
}

/// A card's type, trust and state as badges.
pub fn badges(card: &CardInfo) -> Markup {
    let s = &card.summary;
    html! {
        span.badge.type { (s.card_type.as_str()) }
        // One word for where the card stands: a card merged away or rejected no longer
        // reads as waiting for review.
        @match card.standing() {
            Standing::Verified => span.badge.verified { "verified" },
            Standing::Unverified => span.badge.unverified { "unverified" },
            other => span.badge.off { (other.as_str()) },
        }
        @if !card.credentials.is_empty() {
            span.badge.danger title="Its text carries a credential: delete it for good, or edit the credential out" { "credential" }
        }
        @if card.previously_rejected.is_some() { span.badge.danger { "previously rejected" } }
        @if let Some(g) = &card.duplicate_group {
            @if g.members.len() > 1 { span.badge.type title="Tasks stored this lesson several times" { "duplicates: " (g.members.len()) } }
        }
    }
}

/// How long ago a stored time was, roughly.
pub fn ago(at: &Stamp) -> String {
    let secs = jiff::Timestamp::now().as_second() - at.0.as_second();
    match secs {
        s if s < 90 => "just now".into(),
        s if s < 90 * 60 => format!("{} min ago", s / 60),
        s if s < 36 * 3600 => format!("{} h ago", s / 3600),
        s => format!("{} days ago", s / 86400),
    }
}

/// A stored time to the minute (`2026-12-02 13:07`), for tables.
pub fn minute(at: &Stamp) -> String {
    at.0.strftime("%Y-%m-%d %H:%M").to_string()
}

/// "Previous / next" links for a paged list of `total` entries.
pub fn pager(base: &str, offset: usize, shown: usize, total: usize, limit: usize) -> Markup {
    let sep = if base.contains('?') { '&' } else { '?' };
    html! {
        nav.pager {
            @if total == 0 { span { "Nothing here." } }
            @else if shown == 0 { span { "No entries past " (offset) " of " (total) "." } }
            @else { span { (offset.saturating_add(1)) "–" (offset.saturating_add(shown)) " of " (total) } }
            @if offset > 0 {
                a rel="prev" href={ (base) (sep) "offset=" (offset.saturating_sub(limit).min(total.saturating_sub(1))) } { "← Previous" }
            }
            @if offset.saturating_add(shown) < total {
                a rel="next" href={ (base) (sep) "offset=" (offset.saturating_add(limit)) } { "Next →" }
            }
        }
    }
}

/// The type and trust choices of every card filter form (search, bulk, export), with
/// `card_type` and `unverified` ("", "yes" or "no") selected.
pub fn type_and_trust(card_type: &str, unverified: &str) -> Markup {
    html! {
        select name="type" aria-label="Type" {
            option value="" { "any type" }
            @for t in mop_cards::CardType::NAMES {
                option value=(t) selected[t == card_type] { (t) }
            }
        }
        select name="unverified" aria-label="Trust" {
            option value="" { "verified or not" }
            option value="yes" selected[unverified == "yes"] { "waiting for review" }
            option value="no" selected[unverified == "no"] { "verified only" }
        }
    }
}
