//! The console's static files, embedded in the binary and served under a path that names
//! their content hash, so a browser may cache them forever and a new server version is
//! never mixed with an old script.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
const ICON: &str = include_str!("assets/favicon.svg");

/// The content version in the static files' path: a hash of all of them.
static VERSION: LazyLock<String> = LazyLock::new(|| {
    let mut both = Vec::with_capacity(CSS.len() + JS.len());
    both.extend_from_slice(CSS.as_bytes());
    both.extend_from_slice(JS.as_bytes());
    both.extend_from_slice(ICON.as_bytes());
    mop_cards::sha256_hex(&both)[..16].to_owned()
});

/// The URL of the style sheet.
pub fn css_url() -> String {
    format!("/console/static/{}/console.css", *VERSION)
}

/// The URL of the icon.
pub fn icon_url() -> String {
    format!("/console/static/{}/favicon.svg", *VERSION)
}

/// The URL of the script.
pub fn js_url() -> String {
    format!("/console/static/{}/console.js", *VERSION)
}

pub(super) async fn serve(Path((version, file)): Path<(String, String)>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.css" => (CSS, "text/css; charset=utf-8"),
        "console.js" => (JS, "text/javascript; charset=utf-8"),
        "favicon.svg" => (ICON, "image/svg+xml"),
        _ => return (StatusCode::NOT_FOUND, "no such file").into_response(),
    };
    // An old page asking for an old version gets the current file, but uncached.
    let cache = if version == *VERSION {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        ],
        body,
    )
        .into_response()
}
