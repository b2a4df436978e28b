//! A duplicate group in the review queue: its waiting cards side by side (author, task,
//! asset, usage, and the lines each has that the first lacks), and one form that makes the
//! group one card. The curator keeps one card as the base, edits its body or ticks lines
//! of the other variants to add, and submits; or searches for an existing card and merges
//! the whole group into it. The server does it in one transaction and refuses (409) when
//! the group changed since the page was drawn.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use mop_cards::CardId;
use mop_proto::curation::{CombineRequest, Differences, ListQuery, ReviewItem};
use serde::Deserialize;

use super::Console;
use super::auth::{Ctx, Posted};
use super::layout::{api_error, badges, csrf, page, respond};
use super::markdown::shown;
use crate::api::ApiError;
use crate::api::admin::combine_group;
use crate::api::curation::{group_item, search_cards};

/// Where the console's group pages live.
fn base(ws: &str, group: &str) -> String {
    format!("/console/w/{ws}/groups/{group}")
}

/// The body of a card text (the whole text when it is not a card).
fn body_of(text: &str) -> &str {
    mop_cards::card_body(text.as_bytes()).unwrap_or(text)
}

/// The group's cards side by side, and the form that combines them (inside a queue entry).
pub(super) fn section(ctx: &Ctx, ws: &str, item: &ReviewItem, back: &str) -> Markup {
    let Some(group) = item.group.as_deref().filter(|_| !item.variants.is_empty()) else {
        return html! {};
    };
    let action = format!("{}/combine", base(ws, group));
    let first = body_of(&item.text);
    html! {
        section.group aria-label="Duplicate group" {
            h3 { (item.variants.len() + 1) " cards of one lesson, from "
                (authors(item)) " author(s)" }
            form.combine method="post" action=(action) {
                (csrf(ctx))
                input type="hidden" name="back" value=(back);
                input type="hidden" name="original" value=(first);
                div.variants {
                    @for (i, (card, text)) in item.cards().enumerate() {
                        @let s = &card.summary;
                        @let p = card.provenance.as_ref().map(|p| &p.source);
                        @let d = Differences::between(&item.text, text);
                        div.variant {
                            input type="hidden" name="card" value=(s.id);
                            input type="hidden" name={ "etag:" (s.id) } value=(card.etag);
                            label.keep {
                                input type="radio" name="keep" value=(s.id) checked[i == 0];
                                " Keep " (i + 1) " as the base"
                            }
                            p.meta {
                                a href={ "/console/w/" (ws) "/cards/" (s.id) } { (shown(&s.title)) }
                                br;
                                (badges(card))
                                @if let Some(u) = p.and_then(|p| p.user_id.as_deref()) { " by " span.user { (shown(u)) } }
                                @if let Some(t) = p.and_then(|p| p.task_id.as_deref()) { " · task " code { (shown(t)) } }
                                @if let Some(a) = s.scope.asset_id.as_deref().or(p.and_then(|p| p.asset_id.as_deref())) {
                                    " · asset " code { (shown(a)) }
                                }
                                " · delivered " (card.usage.delivered_30d) " / retrieved " (card.usage.retrieved_30d) " (30 d)"
                            }
                            @if i == 0 {
                                pre.text { (shown(body_of(text))) }
                            } @else if d.is_empty() {
                                p.same { "Same text as 1." }
                            } @else {
                                ul.diff {
                                    @for l in &d.added {
                                        li.added {
                                            label {
                                                input type="checkbox" name="add" value=(l);
                                                " + " (shown(l))
                                            }
                                        }
                                    }
                                    @for l in &d.missing { li.missing { " − " (shown(l)) } }
                                }
                            }
                        }
                    }
                }
                label.body {
                    "Body of the card that stays (edit it, or leave it to keep the base's; ticked lines are added):"
                    textarea name="body" rows="6" { (first) }
                }
                button type="submit" { "Combine into one verified card" kbd { "c" } }
            }
            form.target method="get" action={ (base(ws, group)) "/target" } {
                input type="search" name="q" required maxlength="200"
                    placeholder="or find a card to merge the group into" aria-label="Find a card to merge the group into";
                button type="submit" { "Find" }
            }
        }
    }
}

/// How many different users stored the group's cards.
fn authors(item: &ReviewItem) -> usize {
    let mut users: Vec<&str> = item
        .cards()
        .filter_map(|(c, _)| c.provenance.as_ref()?.source.user_id.as_deref())
        .collect();
    users.sort_unstable();
    users.dedup();
    users.len()
}

/// `POST /console/w/{ws}/groups/{group}/combine`: the form's fields as pairs (`card`,
/// `add` and `etag:<id>` repeat).
pub(super) async fn combine(
    State(console): State<Arc<Console>>,
    Path((ws, group)): Path<(String, String)>,
    Posted(ctx, form): Posted<Vec<(String, String)>>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let err = |e: ApiError| api_error(&ctx, Some(&ws), e);
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.replace("\r\n", "\n"))
    };
    let all = |name: &str| -> Vec<String> {
        form.iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    };
    let keep = field("keep").unwrap_or_default();
    let into = CardId::parse(keep.trim()).map_err(|e| {
        err(ApiError::bad_request(format!(
            "keep: {keep:?} is not a card id ({e})"
        )))
    })?;
    let variants = all("card")
        .iter()
        .map(|v| CardId::parse(v.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(ApiError::bad_request(format!("card: not a card id ({e})"))))?;
    let into_version = field(&format!("etag:{into}")).ok_or_else(|| {
        err(ApiError::bad_request(format!(
            "no version of card {into} was sent: reload the queue and try again"
        )))
    })?;
    // The text of the card that stays: the base's, or the edited body, with ticked lines.
    let text = match field("body") {
        Some(body) => {
            let current = group_item(&console.app, ws.clone(), group.clone())
                .await
                .ok()
                .and_then(|item| {
                    item.cards()
                        .find(|(c, _)| c.summary.id == into)
                        .map(|(_, t)| t.to_owned())
                });
            match current {
                Some(base_text) => {
                    combined(&base_text, &body, field("original").as_deref(), &all("add"))
                }
                // The card that stays is not of the group (found by search): keep its text.
                None => None,
            }
        }
        None => None,
    };
    let req = CombineRequest {
        into,
        into_version,
        variants,
        text,
    };
    match combine_group(&console.app, &ctx.caller, &ws, group.clone(), req).await {
        Ok(_) => {
            console
                .sessions
                .set_flash(&ctx.session.key, "combine", &into.to_string());
            let back = field("back")
                .filter(|b| {
                    b.starts_with(&format!("/console/w/{ws}"))
                        && !b.contains("//")
                        && !b.contains('\\')
                })
                .unwrap_or_else(|| format!("/console/w/{ws}"));
            Ok(Redirect::to(&back).into_response())
        }
        Err(e) => Err(err(e)),
    }
}

/// The whole text of the card that stays: `base` with its body replaced by `body` when the
/// curator edited it (it differs from `original`, the body the form showed), and the
/// ticked lines `add` appended that it lacks. `None` when nothing changes.
fn combined(base: &str, body: &str, original: Option<&str>, add: &[String]) -> Option<String> {
    let base_body = body_of(base);
    let front = &base[..base.len() - base_body.len()];
    let edited = original.is_some_and(|o| o.replace("\r\n", "\n") != body);
    let mut out = if edited {
        body.to_owned()
    } else {
        base_body.to_owned()
    };
    for line in add {
        let line = line.trim();
        if line.is_empty() || out.lines().any(|l| l.trim() == line) {
            continue;
        }
        if !out.ends_with('\n') && !out.is_empty() {
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
    let text = format!("{front}{out}");
    (text != base).then_some(text)
}

#[derive(Deserialize)]
pub(super) struct TargetQuery {
    q: String,
}

/// `GET /console/w/{ws}/groups/{group}/target?q=…`: verified live cards matching `q`, each
/// with a button that merges the whole group into it.
pub(super) async fn target(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path((ws, group)): Path<(String, String)>,
    Query(q): Query<TargetQuery>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let err = |e: ApiError| api_error(&ctx, Some(&ws), e);
    let item = group_item(&console.app, ws.clone(), group.clone())
        .await
        .map_err(err)?;
    let filters = ListQuery {
        q: Some(q.q.clone()),
        unverified: Some(false),
        limit: Some(20),
        ..ListQuery::default()
    };
    let found = search_cards(&console.app, ws.clone(), filters)
        .await
        .map_err(err)?;
    let members: Vec<CardId> = item.cards().map(|(c, _)| c.summary.id).collect();
    let action = format!("{}/combine", base(&ws, &group));
    let body = html! {
        h1 { "Merge a group of " (members.len()) " cards" }
        p { "The group's first card: " strong { (shown(&item.card.summary.title)) } }
        p { "Verified cards matching " q { (q.q) } " (" (found.hits.len()) "):" }
        ul.results {
            @for hit in found.hits.iter().filter(|h| !members.contains(&h.card.summary.id) && h.card.summary.is_live()) {
                @let c = &hit.card;
                li {
                    a href={ "/console/w/" (ws) "/cards/" (c.summary.id) } { (shown(&c.summary.title)) }
                    " " (badges(c))
                    form.inline method="post" action=(action) {
                        (csrf(&ctx))
                        input type="hidden" name="keep" value=(c.summary.id);
                        input type="hidden" name={ "etag:" (c.summary.id) } value=(c.etag);
                        @for m in &members { input type="hidden" name="card" value=(m); }
                        input type="hidden" name="back" value={ "/console/w/" (ws) };
                        button type="submit" { "Merge the group into this card" }
                    }
                }
            }
        }
        p { a href={ "/console/w/" (ws) } { "Back to the queue" } }
    };
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), "Merge a group", body),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "---\nid: 1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7\ntype: fact\ntitle: T\n---\nRestart the pool.\n";

    #[test]
    fn ticked_lines_are_added_and_an_untouched_body_keeps_the_base() {
        let add = vec!["Use --force on db-1.".to_owned()];
        let text = combined(
            BASE,
            "Restart the pool.\n",
            Some("Restart the pool.\n"),
            &add,
        )
        .unwrap();
        assert!(
            text.ends_with("---\nRestart the pool.\nUse --force on db-1.\n"),
            "{text}"
        );
        // An edited body replaces the base's.
        let text = combined(BASE, "Drain first.\n", Some("Restart the pool.\n"), &[]).unwrap();
        assert!(text.ends_with("---\nDrain first.\n"), "{text}");
        // Control: nothing edited, nothing ticked: the text stays.
        assert_eq!(
            combined(
                BASE,
                "Restart the pool.\n",
                Some("Restart the pool.\n"),
                &[]
            ),
            None
        );
    }
}
