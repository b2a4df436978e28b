//! The review queue, the console's landing page: unverified cards oldest first, a page at
//! a time, each with its text, where it came from and the cards closest to it, and the
//! actions a curator takes from the keyboard (j/k move, v verify, r reject, m merge,
//! e edit; the script is `assets/console.js`).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use mop_cards::CardId;
use mop_proto::curation::{PageQuery, ReviewCounts, ReviewItem};
use serde::Deserialize;

use super::auth::Ctx;
use super::layout::{ago, api_error, badges, csrf, page, pager, respond};
use super::markdown::{self, shown};
use super::{Console, group};
use crate::api::curation::review_page;

/// Entries per page: enough to work through, few enough that a queue of long cards stays
/// a page a browser shows at once.
const PAGE: usize = 20;

/// The most of a card's body an entry shows. A longer card is verified from its own page,
/// where all of it is shown: a verify makes the whole text workspace memory.
const EXCERPT: usize = 4096;

/// The body up to [`EXCERPT`] bytes, cut at a line end; `None` when it is shown whole.
fn excerpt(body: &str) -> Option<&str> {
    if body.len() <= EXCERPT {
        return None;
    }
    let mut end = EXCERPT;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    let cut = body[..end].rfind('\n').map_or(end, |i| i + 1);
    Some(&body[..cut])
}

#[derive(Deserialize)]
pub(super) struct QueueQuery {
    #[serde(default)]
    offset: usize,
}

/// The one-line note after an action (left in the session by the action), from the fixed
/// set of actions only.
pub(super) fn flash(console: &Console, ctx: &Ctx, ws: &str) -> Option<Markup> {
    let (done, card) = console.sessions.take_flash(&ctx.session.key)?;
    let word = match done.as_str() {
        "verify" => "verified",
        "reject" => "rejected and archived",
        "merge" => "merged",
        "supersede" => "superseded",
        "disable" => "disabled",
        "enable" => "enabled",
        "archive" => "archived",
        "unarchive" => "unarchived",
        "keep" => "kept as it is (the agents' verdicts so far no longer flag it)",
        "save" => "saved",
        "delete" => "deleted for good (its text, objects and history text are gone)",
        "lift" => "no longer refused as previously rejected (the rejection is lifted)",
        "revert" => "reverted to the version you chose",
        "fields" => "has the fields you set",
        "create" => "created, verified",
        "combine" => {
            "now holds its group's lesson, verified (the group's other cards are merged into it)"
        }
        _ => return None,
    };
    let id = CardId::parse(&card).ok()?;
    Some(html! {
        p.flash role="status" {
            "Card " a href={ "/console/w/" (ws) "/cards/" (id) } { (id) } " " (word) "."
        }
    })
}

fn counts(c: &ReviewCounts) -> Markup {
    html! {
        div.counts {
            p.total { strong { (c.total()) } " waiting for review"
                @if c.flagged > 0 { " (" (c.flagged) " flagged by agents)" } }
            @if c.total() > 0 {
                ul.chips {
                    @for (t, n) in &c.by_type { li { (t) ": " strong { (n) } } }
                }
                ul.chips.age {
                    li { "under a day: " strong { (c.under_1d) } }
                    li { "1–7 days: " strong { (c.under_7d) } }
                    li { "7–30 days: " strong { (c.under_30d) } }
                    li { "older: " strong { (c.older) } }
                }
            }
        }
    }
}

fn entry(ctx: &Ctx, ws: &str, item: &ReviewItem, back: &str) -> Markup {
    let grouped = !item.variants.is_empty();
    let card = &item.card;
    let s = &card.summary;
    let base = format!("/console/w/{ws}/cards/{}", s.id);
    let body = mop_cards::card_body(item.text.as_bytes()).unwrap_or(&item.text);
    let p = card.provenance.as_ref();
    let part = excerpt(body);
    let rendered = markdown::render(part.unwrap_or(body));
    // Verified from the queue only when the entry shows all there is to read: the whole
    // body, and nothing in the file that a rendering leaves out.
    let whole = part.is_none() && item.unshown.is_empty();
    html! {
        article.entry #{ "entry-" (s.id) } data-id=(s.id) data-edit={ (base) "/edit" } data-open=(base)
            data-whole=(if whole { "yes" } else { "no" }) tabindex="-1" {
            h2 { a href=(base) { (shown(&s.title)) } }
            p.meta {
                (badges(card))
                @if let Some(at) = p.and_then(|p| p.stored_at.as_ref()) { " stored " (ago(at)) }
                @if let Some(u) = p.and_then(|p| p.source.user_id.as_deref()) { " by " span.user { (shown(u)) } }
                @if let Some(t) = p.and_then(|p| p.source.task_id.as_deref()) { " in task " code { (shown(t)) } }
                @if let Some(a) = s.scope.asset_id.as_deref() { " · asset " code { (shown(a)) } }
                @if card.reinforcements > 0 { " · stored again " (card.reinforcements) "×" }
                " · delivered " (card.usage.delivered_30d) " / retrieved " (card.usage.retrieved_30d) " (30 d)"
            }
            @if let Some(d) = &s.description { p.description { (shown(d)) } }
            @if item.flagged {
                div.flag {
                    strong { "Flagged: verified memory agents called wrong or outdated. " }
                    (super::card::feedback(&card.usage.feedback)) br;
                    (super::card::outcomes(&card.usage))
                }
            }
            @if !s.labels.is_empty() {
                ul.labels { @for l in &s.labels { li { (l) } } }
            }
            @if !s.error_codes.is_empty() || !s.stacks.is_empty() {
                p.meta {
                    @if !s.error_codes.is_empty() { "error codes: " @for c in &s.error_codes { code { (shown(c)) } " " } }
                    @if !s.stacks.is_empty() { "stacks: " @for t in &s.stacks { code { (t) } " " } }
                }
            }
            (markdown::unshown_notice(&item.unshown))
            @if grouped {
                (group::section(ctx, ws, item, back))
            } @else {
                div.body.markdown { (maud::PreEscaped(&rendered.html)) }
            }
            @if let Some(part) = part {
                p.notice {
                    "Shown: the first " (part.len()) " of " (body.len()) " bytes. "
                    a href=(base) { "Open the card to read it all and verify it" } " (" kbd { "v" } " opens it)."
                }
            }
            @if !item.nearest.is_empty() {
                div.nearest {
                    "Closest cards: "
                    ul {
                        @for n in &item.nearest {
                            li {
                                a href={ "/console/w/" (ws) "/cards/" (n.id) } { (shown(&n.title)) }
                                " " span.badge.type { (n.card_type.as_str()) }
                                @if n.unverified { " " span.badge.unverified { "unverified" } }
                            }
                        }
                    }
                }
            }
            @if item.flagged {
                div.actions {
                    form.keep method="post" action={ (base) "/do/keep" } {
                        (csrf(ctx))
                        input type="hidden" name="etag" value=(card.etag);
                        input type="hidden" name="back" value=(back);
                        input.reason type="text" name="reason" maxlength="500"
                            placeholder="why it still holds" aria-label="Why keep it";
                        button type="submit" { "Keep as it is" }
                    }
                    a.button.edit href={ (base) "/edit" } { "Edit" kbd { "e" } }
                    a.button href=(base) { "Open to archive or disable" }
                }
            } @else {
            div.actions {
                @if whole {
                    form.verify method="post" action={ (base) "/do/verify" } {
                        (csrf(ctx))
                        input type="hidden" name="etag" value=(card.etag);
                        input type="hidden" name="back" value=(back);
                        button type="submit" title="v" { "Verify" kbd { "v" } }
                    }
                } @else {
                    a.button href=(base) { "Read all to verify" kbd { "v" } }
                }
                form.reject method="post" action={ (base) "/do/reject" } {
                    (csrf(ctx))
                    input type="hidden" name="etag" value=(card.etag);
                    input type="hidden" name="back" value=(back);
                    input.reason type="text" name="reason" required maxlength="500"
                        placeholder="why reject (r)" aria-label="Reason to reject";
                    button type="submit" { "Reject" kbd { "r" } }
                }
                @if !item.nearest.is_empty() && !grouped {
                    form.merge method="post" action={ (base) "/do/merge" } {
                        (csrf(ctx))
                        input type="hidden" name="etag" value=(card.etag);
                        input type="hidden" name="back" value=(back);
                        select name="into" aria-label="Merge into" {
                            @for n in &item.nearest {
                                option value=(n.id) { (shown(&n.title)) }
                            }
                        }
                        button type="submit" { "Merge" kbd { "m" } }
                    }
                }
                a.button.edit href={ (base) "/edit" } { "Edit" kbd { "e" } }
            }
            }
        }
    }
}

/// `GET /console/w/{ws}`.
pub(super) async fn show(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path(ws): Path<String>,
    Query(q): Query<QueueQuery>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let query = PageQuery {
        offset: Some(q.offset),
        limit: Some(PAGE),
    };
    let queue = review_page(&console.app, ws.clone(), &query)
        .await
        .map_err(|e| api_error(&ctx, Some(&ws), e))?;
    let back = if q.offset > 0 {
        format!("/console/w/{ws}?offset={}", q.offset)
    } else {
        format!("/console/w/{ws}")
    };
    let body = html! {
        h1 { "Review queue" }
        @if let Some(f) = flash(&console, &ctx, &ws) { (f) }
        (counts(&queue.counts))
        p.keys {
            "Keys: " kbd { "j" } "/" kbd { "k" } " move · " kbd { "v" } " verify · "
            kbd { "r" } " reject (type the reason, Enter) · " kbd { "m" } " merge (pick, Enter) · "
            kbd { "e" } " edit · " kbd { "c" } " combine a group"
        }
        div #queue {
            @for (i, item) in queue.items.iter().enumerate() {
                // After an action the queue comes back with the next entry selected.
                @let next = queue.items.get(i + 1).map_or_else(
                    || back.clone(),
                    |n| format!("{back}#entry-{}", n.card.summary.id),
                );
                (entry(&ctx, &ws, item, &next))
            }
        }
        (pager(&format!("/console/w/{ws}"), queue.offset, queue.items.len(), queue.total, PAGE))
    };
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), "Review queue", body),
    ))
}
