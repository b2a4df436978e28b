//! Search and listing with the CLI's filters (`mop-curate list` / `search`), and the
//! staleness report, each a page at a time.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use mop_proto::curation::{CardInfo, ListQuery, StaleCard};
use serde::{Deserialize, Serialize};

use super::Console;
use super::auth::Ctx;
use super::layout::{api_error, badges, page, pager, respond, type_and_trust};
use super::markdown::shown;
use crate::api::curation::search_cards;
use crate::api::{ApiError, blocking};

/// Rows per page.
const PAGE: usize = 50;

/// The search form as a browser sends it: every field a string, empty when unset.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub(super) struct SearchForm {
    q: String,
    #[serde(rename = "type")]
    card_type: String,
    label: String,
    asset: String,
    project: String,
    user: String,
    /// "", "yes" or "no".
    unverified: String,
    /// Days.
    stale_days: String,
    /// "on" to include archived cards.
    archived: String,
    #[serde(skip_serializing)]
    offset: usize,
}

fn opt(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

impl SearchForm {
    fn query(&self) -> Result<ListQuery, ApiError> {
        let stale_days = match self.stale_days.trim() {
            "" => None,
            d => Some(number("not delivered in (days)", d, 0u32)?),
        };
        Ok(ListQuery {
            q: opt(&self.q),
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
            stale_days,
            archived: (self.archived == "on").then_some(true),
            offset: Some(self.offset),
            limit: Some(PAGE),
            ..ListQuery::default()
        })
    }
}

fn form(ws: &str, f: &SearchForm) -> Markup {
    html! {
        form.search method="get" action={ "/console/w/" (ws) "/search" } {
            input type="search" name="q" value=(f.q) placeholder="words, error codes…" aria-label="Search text";
            (type_and_trust(&f.card_type, &f.unverified))
            input type="text" name="label" value=(f.label) placeholder="label" aria-label="Label";
            input type="text" name="asset" value=(f.asset) placeholder="asset" aria-label="Asset";
            input type="text" name="project" value=(f.project) placeholder="project" aria-label="Project";
            input type="text" name="user" value=(f.user) placeholder="user" aria-label="User";
            input type="number" name="stale_days" min="0" value=(f.stale_days) placeholder="not delivered in (days)" aria-label="Not delivered in (days)";
            label.check { input type="checkbox" name="archived" checked[f.archived == "on"]; " archived too" }
            button type="submit" { "Search" }
        }
    }
}

fn rows(ws: &str, cards: &[(&CardInfo, Option<f32>)]) -> Markup {
    html! {
        div.scroll {
            table.cards {
                thead { tr { th { "card" } th { "bound to" } th { "delivered 30 d" } th { "score" } } }
                tbody {
                    @for (c, score) in cards {
                        @let s = &c.summary;
                        tr {
                            td {
                                a href={ "/console/w/" (ws) "/cards/" (s.id) } { (shown(&s.title)) }
                                br; (badges(c))
                            }
                            td {
                                @for (axis, name) in s.scope.bindings() { (axis) " " code { (shown(name)) } " " }
                            }
                            td { (c.usage.delivered_30d) }
                            td { @if let Some(x) = score { (format!("{x:.2}")) } }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /console/w/{ws}/search`: with text, the best matches; without, the listing.
pub(super) async fn search(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path(ws): Path<String>,
    Query(f): Query<SearchForm>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let fail = |e: ApiError| api_error(&ctx, Some(&ws), e);
    let query = f.query().map_err(fail)?;
    let keep = serde_urlencoded::to_string(&f).unwrap_or_default();
    let base = format!("/console/w/{ws}/search?{keep}");
    let results = if query.q.is_some() {
        let found = search_cards(&console.app, ws.clone(), query)
            .await
            .map_err(fail)?;
        html! {
            p { (found.hits.len()) " best matches among " (found.searched) " cards that pass the filters." }
            (rows(&ws, &found.hits.iter().map(|h| (&h.card, Some(h.score))).collect::<Vec<_>>()))
        }
    } else {
        let (store, ws2) = (console.app.store.clone(), ws.clone());
        let listed = blocking(move || store.list_cards(&ws2, &query))
            .await
            .map_err(fail)?;
        html! {
            (rows(&ws, &listed.cards.iter().map(|c| (c, None)).collect::<Vec<_>>()))
            (pager(&base, listed.offset, listed.cards.len(), listed.total, PAGE))
        }
    };
    let body = html! {
        h1 { "Search" }
        (form(&ws, &f))
        (results)
    };
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), "Search", body),
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct StaleForm {
    days: String,
    chain: String,
    offset: usize,
}

/// A whole number from a form field, its default when empty.
fn number<T: std::str::FromStr>(field: &str, value: &str, default: T) -> Result<T, ApiError> {
    match value.trim() {
        "" => Ok(default),
        v => v.parse().map_err(|_| {
            ApiError::bad_request(format!("{field} must be a whole number, not {v:?}"))
        }),
    }
}

fn stale_table(ws: &str, cards: &[StaleCard], offset: usize) -> Markup {
    let page_cards: Vec<&StaleCard> = cards.iter().skip(offset).take(PAGE).collect();
    html! {
        @if cards.is_empty() { p.muted { "None." } }
        @else {
            div.scroll {
                table.cards {
                    thead { tr { th { "card" } th { "asset" } th { "made" } th { "last delivered" } } }
                    tbody {
                        @for c in &page_cards {
                            tr {
                                td {
                                    a href={ "/console/w/" (ws) "/cards/" (c.id) } { (shown(&c.title)) }
                                    " " span.badge.type { (c.card_type.as_str()) }
                                    @if c.unverified { " " span.badge.unverified { "unverified" } }
                                }
                                td { @if let Some(a) = &c.asset_id { code { (shown(a)) } } }
                                td { (c.created_at) }
                                td { @if let Some(t) = c.last_delivered_at { (t) } @else { "never" } }
                            }
                        }
                    }
                }
            }
            @if cards.len() > page_cards.len() {
                p.muted { "Showing " (page_cards.len()) " of " (cards.len()) "." }
            }
        }
    }
}

/// `GET /console/w/{ws}/stale`.
pub(super) async fn stale(
    State(console): State<Arc<Console>>,
    ctx: Ctx,
    Path(ws): Path<String>,
    Query(f): Query<StaleForm>,
) -> Result<Response, Response> {
    ctx.workspace(&console, &ws)?;
    let fail = |e: ApiError| api_error(&ctx, Some(&ws), e);
    let days = number("window (days)", &f.days, 30u32).map_err(fail)?;
    let chain = number("chain length", &f.chain, 3usize).map_err(fail)?;
    let (store, ws2) = (console.app.store.clone(), ws.clone());
    let report = blocking(move || store.stale(&ws2, days, chain))
        .await
        .map_err(fail)?;
    let longest = [
        report.undelivered.len(),
        report.unnamed_assets.len(),
        report.old_unverified.len(),
        report.long_chains.len(),
        report.failing.len(),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let base = format!(
        "/console/w/{ws}/stale?days={}&chain={}",
        report.days, report.chain
    );
    let chains: Vec<_> = report
        .long_chains
        .iter()
        .skip(f.offset)
        .take(PAGE)
        .collect();
    let body = html! {
        h1 { "Stale cards" }
        form.search method="get" action={ "/console/w/" (ws) "/stale" } {
            label { "window (days) " input type="number" name="days" min="1" value=(report.days); }
            label { "chains longer than " input type="number" name="chain" min="1" value=(report.chain); }
            button type="submit" { "Show" }
        }
        h2 { "Delivered to no task in " (report.days) " days (" (report.undelivered.len()) ")" }
        (stale_table(&ws, &report.undelivered, f.offset))
        h2 { "Bound to an asset no task named in " (report.days) " days (" (report.unnamed_assets.len()) ")" }
        (stale_table(&ws, &report.unnamed_assets, f.offset))
        h2 { "Unverified for more than " (report.days) " days (" (report.old_unverified.len()) ")" }
        (stale_table(&ws, &report.old_unverified, f.offset))
        h2 { "Supersede chains longer than " (report.chain) " (" (report.long_chains.len()) ")" }
        @if chains.is_empty() { p.muted { "None." } }
        ul {
            @for c in &chains {
                li {
                    (shown(&c.title)) ": "
                    @for (i, id) in c.ids.iter().enumerate() {
                        @if i > 0 { " → " }
                        a href={ "/console/w/" (ws) "/cards/" (id) } { code { (id.to_string()[..8]) } }
                    }
                }
            }
        }
        h2 { "Delivered mostly to failing tasks in " (report.days) " days (" (report.failing.len()) ")" }
        p.muted { "A correlation, by what runners said of their tasks: a card given to failing tasks did not make them fail. Read it, and the agents' verdicts on it." }
        @if report.failing.is_empty() { p.muted { "None." } }
        ul.failing {
            @for c in report.failing.iter().skip(f.offset).take(PAGE) {
                li {
                    a href={ "/console/w/" (ws) "/cards/" (c.card.id) } { (shown(&c.card.title)) }
                    ": delivered to " (c.delivered) " tasks, " (c.outcomes.failed) " failed, "
                    (c.outcomes.succeeded) " succeeded, " (c.outcomes.unknown) " unknown"
                }
            }
        }
        (pager(&base, f.offset, longest.saturating_sub(f.offset).min(PAGE), longest, PAGE))
    };
    Ok(respond(
        StatusCode::OK,
        page(Some(&ctx), Some(&ws), "Stale cards", body),
    ))
}
