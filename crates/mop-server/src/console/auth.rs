//! Logging in and out, and what every console request checks: its session ([`Ctx`]) and,
//! for a form post, the session's CSRF token ([`Posted`]).
//!
//! The token a session was opened with is looked up again on every request, so revoking it
//! (here, with `mop-server token revoke`, or by its expiry) ends its sessions at once.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::Console;
use super::layout::{error_page, page, respond};
use super::session::{
    Lookup, Session, clear_cookie, cookie_ids, has_cookie, same_secret, set_cookie,
};
use super::throttle;
use crate::api::{ApiError, Caller};
use crate::store::{Role, token_hash};

/// A logged-in curator's request.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The admin token behind the session.
    pub caller: Caller,
    /// The session.
    pub session: Session,
}

impl Ctx {
    /// The person the token names.
    pub fn name(&self) -> &str {
        self.caller.0.name.as_deref().unwrap_or(&self.caller.0.id)
    }

    /// The workspaces the token may curate.
    pub fn workspaces(&self) -> &[String] {
        &self.caller.0.workspaces
    }

    /// Checks that `ws` is in scope (else 404, as the API answers).
    pub fn workspace(&self, console: &Console, ws: &str) -> Result<(), Response> {
        self.caller
            .workspace(&console.app, ws)
            .and_then(|_| self.caller.admin())
            .map(drop)
            .map_err(|e| super::layout::api_error(self, None, e))
    }
}

/// "30 minutes", "45 seconds".
fn idle_words(secs: u64) -> String {
    match secs {
        s if s % 3600 == 0 => format!("{} hour{}", s / 3600, if s == 3600 { "" } else { "s" }),
        s if s % 60 == 0 => format!("{} minute{}", s / 60, if s == 60 { "" } else { "s" }),
        s => format!("{s} second{}", if s == 1 { "" } else { "s" }),
    }
}

/// Where a login may send the curator back to: a console page, nothing else.
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n)
            if n.starts_with("/console/")
                && !n.starts_with("/console//")
                && !n.contains('\\')
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n
        }
        _ => "/console/",
    }
}

/// The login page, at `status`, with a message saying why it is shown.
fn login_form(status: StatusCode, message: Option<&str>, next: &str) -> Response {
    respond(
        status,
        page(
            None,
            None,
            "Log in",
            html! {
                section.login {
                    h1 { "mop console" }
                    @if let Some(m) = message { p.notice role="alert" { (m) } }
                    form method="post" action="/console/login" {
                        label for="token" { "Admin token" }
                        input #token type="password" name="token" autocomplete="off"
                            required placeholder="mop_…" autofocus;
                        input type="hidden" name="next" value=(next);
                        button type="submit" { "Log in" }
                    }
                    p.muted {
                        "Paste an admin token once (" code { "mop-server token create --role admin --name \"Your Name\" --workspace …" }
                        "). The server keeps a session for you; the token is not stored in the browser."
                    }
                }
            },
        ),
    )
}

/// Why a request without a usable session is refused, and the login page that says so.
fn login_again(parts: &Parts, why: &str) -> Response {
    let post = parts.method == Method::POST;
    let next = if post {
        parts
            .headers
            .get(header::REFERER)
            .and_then(|v| v.to_str().ok())
            .and_then(|r| r.find("/console/").map(|i| r[i..].to_owned()))
    } else {
        parts.uri.path_and_query().map(|p| p.to_string())
    };
    let message = if post {
        format!("{why} What you just sent was not saved: log in, then do it again.")
    } else {
        why.to_owned()
    };
    let mut response = login_form(
        StatusCode::UNAUTHORIZED,
        Some(&message),
        safe_next(next.as_deref()),
    );
    // Only a browser that sent a session cookie is told to drop it: a cross-site link
    // arrives without the (SameSite=Strict) cookie, and must not log the curator out.
    if has_cookie(&parts.headers)
        && let Ok(v) = clear_cookie(false).parse()
    {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

impl FromRequestParts<Arc<Console>> for Ctx {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Arc<Console>,
    ) -> Result<Self, Response> {
        let ids = cookie_ids(&parts.headers);
        let session = match console.sessions.get(&ids) {
            Lookup::Active(s) => s,
            Lookup::Expired => {
                return Err(login_again(
                    parts,
                    &format!(
                        "Your session expired after {} without activity. Paste your token again to continue.",
                        idle_words(console.app.config.console.idle_secs)
                    ),
                ));
            }
            Lookup::Missing => {
                let why = if !ids.is_empty() {
                    "Your session has ended (logged out, or the server restarted). Log in again."
                } else {
                    "Log in with an admin token to use the console."
                };
                return Err(login_again(parts, why));
            }
        };
        let app = &console.app;
        let mut info = app.token(&session.token_hash);
        // Look again whatever the refresh says: a reload that ran meanwhile may have
        // brought the token.
        if info.is_none() && app.refresh_if_changed().is_ok() {
            info = app.token(&session.token_hash);
        }
        let ended = |why: String| {
            console.sessions.end_all_of(&session.token_hash);
            login_again(parts, &why)
        };
        let Some(info) = info else {
            return Err(ended(
                "The token of this session no longer exists. Log in with another admin token."
                    .into(),
            ));
        };
        if info.revoked {
            return Err(ended(format!(
                "Token {} was revoked, which ended this session. Log in with another admin token.",
                info.id
            )));
        }
        if info.expired(jiff::Timestamp::now()) {
            return Err(ended(format!(
                "Token {} expired, which ended this session. Ask an admin for a new token.",
                info.id
            )));
        }
        app.note_token_use(&info.id);
        Ok(Ctx {
            caller: Caller(info),
            session,
        })
    }
}

/// Refuses a request another site made the browser send. Browsers say so in
/// `Sec-Fetch-Site`; older ones send `Origin`, which must be this host.
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return !matches!(site, "same-origin" | "none");
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => false,
        Some(origin) => {
            let origin_host = origin.split_once("://").map(|(_, h)| h);
            origin_host.is_none() || origin_host != host
        }
    }
}

fn forged(ctx: Option<&Ctx>) -> Response {
    error_page(
        ctx,
        None,
        StatusCode::FORBIDDEN,
        "This form was refused: it did not carry this session's security token (it is from \
         an older session, another site, or was changed). Nothing was saved.",
        html! { "Go back, reload the page, and send the form again." },
    )
}

/// A form post from a logged-in session, its CSRF token checked, its fields decoded.
pub struct Posted<T>(pub Ctx, pub T);

#[derive(Deserialize)]
struct CsrfField {
    #[serde(default)]
    _csrf: String,
}

impl<T: DeserializeOwned> FromRequest<Arc<Console>> for Posted<T> {
    type Rejection = Response;

    async fn from_request(req: Request, console: &Arc<Console>) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let ctx = Ctx::from_request_parts(&mut parts, console).await?;
        if cross_site(&parts.headers) {
            return Err(forged(Some(&ctx)));
        }
        let bytes = crate::api::read_body(&console.app, &parts.headers, body)
            .await
            .map_err(|e| super::layout::api_error(&ctx, None, e))?;
        let sent: CsrfField =
            serde_urlencoded::from_bytes(&bytes).map_err(|_| forged(Some(&ctx)))?;
        if !same_secret(&sent._csrf, &ctx.session.csrf) {
            tracing::warn!(token = %ctx.caller.0.id, path = %parts.uri.path(), "console form refused: CSRF token missing or wrong");
            return Err(forged(Some(&ctx)));
        }
        match serde_urlencoded::from_bytes::<T>(&bytes) {
            Ok(form) => Ok(Posted(ctx, form)),
            Err(e) => Err(super::layout::api_error(
                &ctx,
                None,
                ApiError::bad_request(format!("the form could not be read: {e}")),
            )),
        }
    }
}

/// The checks [`Posted`] makes, for a form it cannot read (a file upload): same site, and
/// the session's CSRF token in the form's `_csrf` field.
pub(super) fn check_upload(ctx: &Ctx, headers: &HeaderMap, csrf: &str) -> Result<(), Response> {
    if cross_site(headers) || !same_secret(csrf, &ctx.session.csrf) {
        tracing::warn!(token = %ctx.caller.0.id, "console upload refused: cross-site or CSRF token missing or wrong");
        return Err(forged(Some(ctx)));
    }
    Ok(())
}

#[derive(Deserialize)]
pub(super) struct NextQuery {
    next: Option<String>,
    out: Option<String>,
}

/// `GET /console/login`.
pub(super) async fn login_page(Query(q): Query<NextQuery>) -> Response {
    let message = q
        .out
        .is_some()
        .then_some("You are logged out. The session is gone from the server too.");
    login_form(StatusCode::OK, message, safe_next(q.next.as_deref()))
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    token: String,
    next: Option<String>,
}

/// Marks the cookie `Secure` when configured, or when a TLS proxy says the browser used
/// https.
fn secure(console: &Console, headers: &HeaderMap) -> bool {
    console.app.config.console.secure_cookie
        || headers
            .get("x-forwarded-proto")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// `POST /console/login`.
pub(super) async fn login(
    State(console): State<Arc<Console>>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    if cross_site(&headers) {
        return forged(None);
    }
    let metrics = &console.app.metrics;
    let source = throttle::source(
        peer.as_ref().map(|e| &e.0),
        &headers,
        &console.app.config.console.trusted_proxies,
    );
    // A source past its failures is not locked out: a valid token still logs in (so no
    // one can lock the curators behind a proxy or a tunnel out by failing on purpose), but
    // its failures are refused without a database lookup and without a log line each.
    let throttled = source.and_then(|src| console.logins.check(src).err());
    let form: LoginForm = match crate::api::read_body(&console.app, &headers, body)
        .await
        .ok()
        .and_then(|b| serde_urlencoded::from_bytes(&b).ok())
    {
        Some(f) => f,
        None => {
            return login_form(
                StatusCode::BAD_REQUEST,
                Some("The login form was incomplete: paste the token and press Log in."),
                "/console/",
            );
        }
    };
    let next = safe_next(form.next.as_deref()).to_owned();
    let hash = token_hash(form.token.trim());
    let app = &console.app;
    let mut info = app.token(&hash);
    if info.is_none() && throttled.is_none() && app.refresh_if_changed().is_ok() {
        info = app.token(&hash);
    }
    let refuse = |m: &str| {
        if let Some(secs) = throttled {
            metrics.console_login("throttled");
            // Not logged at warn: a flood would flood the log; the metrics count these.
            tracing::debug!(source = ?source, "console login refused: a wrong token from a throttled source");
            let mut response = login_form(
                StatusCode::TOO_MANY_REQUESTS,
                Some(&format!(
                    "Too many failed logins from your address: a wrong token is refused for {secs} s more. A valid admin token still logs in."
                )),
                &next,
            );
            if let Ok(v) = secs.to_string().parse() {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return response;
        }
        metrics.console_login("refused");
        let failed = console.logins.failed(source);
        // The source and the count, never the token (not even its hash).
        tracing::warn!(source = ?source, failed_since_start = failed, "console login failed");
        login_form(StatusCode::UNAUTHORIZED, Some(m), &next)
    };
    let Some(info) = info else {
        return refuse(
            "That is not a valid token. Paste the whole token that mop-server token create printed.",
        );
    };
    if info.revoked {
        return refuse("That token has been revoked. Ask an admin for a new one.");
    }
    if info.expired(jiff::Timestamp::now()) {
        return refuse("That token has expired. Ask an admin for a new one.");
    }
    if info.role != Role::Admin {
        return refuse(
            "That is a node token (for host daemons). The console needs an admin token: \
             mop-server token create --role admin --name \"Your Name\".",
        );
    }
    app.note_token_use(&info.id);
    // A login replaces whatever session this browser had.
    console.sessions.end(&cookie_ids(&headers));
    let id = console.sessions.open(hash, info.workspaces.clone());
    metrics.console_login("ok");
    tracing::info!(token = %info.id, source = ?source, "console login");
    let mut response = Redirect::to(&next).into_response();
    if let Ok(v) = set_cookie(&id, secure(&console, &headers)).parse() {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

/// `POST /console/logout`.
pub(super) async fn logout(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Posted(ctx, _): Posted<Vec<(String, String)>>,
) -> Response {
    console.sessions.end(&cookie_ids(&headers));
    tracing::info!(token = %ctx.caller.0.id, "console logout");
    let mut response = Redirect::to("/console/login?out=1").into_response();
    if let Ok(v) = clear_cookie(secure(&console, &headers)).parse() {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

/// `GET /console/`: the only workspace's queue, or a choice of workspaces.
pub(super) async fn home(ctx: Ctx) -> Response {
    if let [only] = ctx.workspaces() {
        return Redirect::to(&format!("/console/w/{only}")).into_response();
    }
    respond(
        StatusCode::OK,
        page(
            Some(&ctx),
            None,
            "Workspaces",
            html! {
                h1 { "Workspaces" }
                ul.plain {
                    @for ws in ctx.workspaces() {
                        li { a href={ "/console/w/" (ws) } { (ws) } }
                    }
                }
            },
        ),
    )
}
