//! The curators' web console under `/console`: server-rendered pages over the same store
//! calls as the curation API (review queue, card, edit with preview, history with diffs,
//! search, staleness report, tools: create, bulk, import, export; tokens).
//!
//! Every field of a card is hostile text, because agents write cards: pages are built with
//! maud, which escapes every value, and card Markdown goes through [`markdown`] (no raw
//! HTML, no scripts, no remote images). Each answer carries a strict Content-Security-Policy
//! (scripts only from our own embedded file), `X-Frame-Options: DENY` and `no-store`.
//! A curator logs in by pasting an admin token once and gets a server-side session
//! ([`session`]); every form post carries the session's CSRF token.

// A refused request is answered with a whole page, so handlers return `Result<Response,
// Response>` (axum's idiom); boxing the error page would buy nothing on this cold path.
#![allow(clippy::result_large_err)]

mod assets;
mod auth;
mod browse;
mod card;
mod group;
mod layout;
pub mod markdown;
mod queue;
pub mod session;
mod throttle;
mod tokens;
mod tools;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};

use crate::state::AppState;

pub use session::{MAX_SESSIONS, Sessions};
pub use throttle::LoginThrottle;

/// What the console's handlers share.
#[derive(Debug)]
pub struct Console {
    /// The server's state (store, caches, config).
    pub app: Arc<AppState>,
    /// Logged-in sessions.
    pub sessions: Sessions,
    /// Failed logins per source.
    pub logins: LoginThrottle,
}

/// The policy every console answer carries: nothing loads from elsewhere, no inline script
/// or style runs, no page frames ours, forms post only to us.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's routes (all under `/console`), or none when `console.enabled` is off.
pub fn router(app: Arc<AppState>) -> Router {
    if !app.config.console.enabled {
        return Router::new();
    }
    let idle = std::time::Duration::from_secs(app.config.console.idle_secs.max(1));
    let sessions = Sessions::new(idle, app.config.console.max_sessions);
    let logins = LoginThrottle::new(app.config.console.login_failures_per_minute);
    let state = Arc::new(Console {
        app,
        sessions,
        logins,
    });
    Router::new()
        .route("/console", get(auth::home))
        .route("/console/", get(auth::home))
        .route("/console/login", get(auth::login_page).post(auth::login))
        .route("/console/logout", post(auth::logout))
        .route("/console/static/{version}/{file}", get(assets::serve))
        .route("/console/tokens", get(tokens::list).post(tokens::create))
        .route("/console/tokens/{id}/revoke", post(tokens::revoke))
        .route("/console/w/{ws}", get(queue::show))
        .route("/console/w/{ws}/search", get(browse::search))
        .route(
            "/console/w/{ws}/groups/{group}/combine",
            post(group::combine),
        )
        .route("/console/w/{ws}/groups/{group}/target", get(group::target))
        .route("/console/w/{ws}/stale", get(browse::stale))
        .route("/console/w/{ws}/tools", get(tools::show))
        .route("/console/w/{ws}/create", post(tools::create))
        .route("/console/w/{ws}/bulk", post(tools::bulk))
        .route("/console/w/{ws}/import", post(tools::import))
        .route("/console/w/{ws}/export", get(tools::export))
        .route("/console/w/{ws}/preview", post(card::preview))
        .route("/console/w/{ws}/cards/{id}", get(card::show))
        .route(
            "/console/w/{ws}/cards/{id}/edit",
            get(card::edit_page).post(card::save),
        )
        .route("/console/w/{ws}/cards/{id}/history", get(card::history))
        .route("/console/w/{ws}/cards/{id}/do/{action}", post(card::act))
        .layer(axum::middleware::from_fn(headers))
        .with_state(state)
}

/// Adds the security headers to every console answer; pages are never cached (they name
/// cards and may show a new token once), the versioned static files are.
async fn headers(request: Request, next: Next) -> Response {
    let is_static = request.uri().path().starts_with("/console/static/");
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !is_static {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
