//! What daemons call: the manifest (with weak ETags, `If-None-Match` and deltas) and
//! objects by sha256, one at a time or in batches.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use mop_cards::is_sha256_hex;
use mop_proto::sync::{OBJECT_BATCH_TYPE, ObjectBatchRequest, Version, encode_batch_item};
use serde::Deserialize;

use super::{ApiError, Caller, Conditional, blocking, json, read_body};
use crate::encoding::Coding;
use crate::state::{AppState, CachedManifest};
use crate::store::ManifestKind;

/// Below this many changed cards a delta is always sent: a full manifest saves nothing.
const MIN_DELTA_LIMIT: usize = 64;

/// Bodies smaller than this are not worth compressing.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManifestQuery {
    since: Option<String>,
}

/// True when an `If-None-Match` value matches the entity tag whose opaque part is
/// `opaque` (`"<epoch>-<revision>"` without quotes). RFC 9110 §13.1.2: weak comparison,
/// so `W/"x"` and `"x"` both match; a list matches if any member does; `*` matches any
/// current representation.
pub fn if_none_match(header: &str, opaque: &str) -> bool {
    let mut rest = header.trim_start();
    while !rest.is_empty() {
        rest = rest.trim_start_matches([',', ' ', '\t']);
        if rest.starts_with('*') {
            return true;
        }
        let tag = rest.strip_prefix("W/").unwrap_or(rest);
        let Some(inner) = tag.strip_prefix('"') else {
            return false;
        };
        let Some(end) = inner.find('"') else {
            return false;
        };
        if &inner[..end] == opaque {
            return true;
        }
        rest = &inner[end + 1..];
    }
    false
}

fn etag_header(version: &Version) -> HeaderValue {
    HeaderValue::from_str(&version.etag()).expect("epochs and revisions are header-safe")
}

pub(crate) async fn manifest(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    Query(query): Query<ManifestQuery>,
    conditional: Conditional,
) -> Result<Response, ApiError> {
    let revision = caller.syncs(&state, &ws)?;
    let inherits = state.config.inheritance.of(&ws).join(",");
    let mut response = manifest_answer(&state, ws, revision, query, conditional).await?;
    // On every answer, a 304 too: a host learns of a change of the relation at its next
    // poll, whether or not a card changed.
    if !inherits.is_empty() {
        response.headers_mut().insert(
            mop_proto::sync::INHERITS_HEADER,
            HeaderValue::from_str(&inherits).expect("workspace slugs are header-safe"),
        );
    }
    Ok(response)
}

async fn manifest_answer(
    state: &Arc<AppState>,
    ws: String,
    revision: u64,
    query: ManifestQuery,
    conditional: Conditional,
) -> Result<Response, ApiError> {
    let state = state.clone();
    let current = Version {
        epoch: state.store.epoch().to_owned(),
        revision,
    };
    if let Some(inm) = conditional
        .if_none_match
        .as_ref()
        .and_then(|v| v.to_str().ok())
        && if_none_match(inm, &current.to_string())
    {
        state.metrics.manifest("not_modified");
        return Ok((
            StatusCode::NOT_MODIFIED,
            [(header::ETAG, etag_header(&current))],
        )
            .into_response());
    }
    let coding = conditional.coding;

    let delta_from = match &query.since {
        None => None,
        Some(s) => {
            let since: Version = s
                .parse()
                .map_err(|e| ApiError::bad_request(format!("since: {e}")))?;
            (since.epoch == current.epoch).then_some(since.revision)
        }
    };
    if let Some(since) = delta_from {
        let store = state.store.clone();
        let ws2 = ws.clone();
        // A delta that would list more than half the cards of the last full manifest is
        // answered with that manifest instead (cached and compressed once per revision).
        let max_changed = state
            .latest_manifest(&ws)
            .map(|m| (m.cards / 2).max(MIN_DELTA_LIMIT));
        if let Some(built) = blocking(move || store.delta(&ws2, since, max_changed)).await? {
            state.metrics.manifest("delta");
            let body = serde_json::to_vec(&built.manifest).map_err(ApiError::internal)?;
            let coding = coding.for_len(body.len());
            let body = match coding {
                Coding::Identity => Bytes::from(body),
                _ => coding.encode(&body),
            };
            return Ok(respond(&Version::of(&built.manifest), body, coding));
        }
        // Out of the kept history, or larger than half the workspace: the full manifest.
    }

    // What the requester holds, so it is never sent an older full manifest than that.
    let floor = match (&query.since, conditional.if_none_match.as_ref()) {
        (Some(_), _) => delta_from.map_or(revision, |s| s + 1),
        (None, None) => 0,
        (None, Some(v)) => match v.to_str().ok().and_then(held_revision) {
            Some((epoch, rev)) if epoch == current.epoch => rev + 1,
            Some(_) => 0,
            None => revision,
        },
    };
    let cached = match state.cached_manifest(&ws, revision) {
        Some(m) => m,
        None => full_manifest(&state, &ws, revision, floor).await?,
    };
    let version = Version {
        epoch: current.epoch,
        revision: cached.revision,
    };
    state.metrics.manifest("full");
    let coding = coding.for_len(cached.json.len());
    Ok(respond(&version, cached.body(coding), coding))
}

/// The newest full manifest of `ws`, building it if needed; at least revision `floor`.
///
/// Builds are single-flight: while one runs, a request is answered from the newest cached
/// manifest when that is at least `floor` (its ETag names its own revision, and the
/// requester catches up at its next poll), and otherwise waits for the build. So a fleet
/// restarting while stores change the workspace many times a second costs one build at a
/// time, not one per request.
async fn full_manifest(
    state: &Arc<AppState>,
    ws: &str,
    revision: u64,
    floor: u64,
) -> Result<Arc<CachedManifest>, ApiError> {
    let usable = |m: &Arc<CachedManifest>, at_least: u64| m.revision >= at_least;
    let lock = state.build_lock(ws);
    let _guard = match lock.try_lock() {
        Ok(g) => g,
        Err(_) => {
            if let Some(m) = state.latest_manifest(ws).filter(|m| usable(m, floor)) {
                return Ok(m);
            }
            lock.lock().await
        }
    };
    // A build that finished while this request waited may be recent enough.
    if let Some(m) = state.latest_manifest(ws).filter(|m| usable(m, revision)) {
        return Ok(m);
    }
    let store = state.store.clone();
    let ws2 = ws.to_owned();
    let started = std::time::Instant::now();
    let cached = blocking(move || {
        let built = store.manifest(&ws2, ManifestKind::Full)?;
        let json = serde_json::to_vec(&built.manifest).expect("manifests serialize");
        Ok(CachedManifest::new(
            built.manifest.revision,
            built.manifest.cards.len(),
            Bytes::from(json),
        ))
    })
    .await?;
    state.metrics.manifest_built(started.elapsed());
    let cached = Arc::new(cached);
    state.note_revision(ws, cached.revision);
    state.cache_manifest(ws, cached.clone());
    Ok(cached)
}

/// The version a single `If-None-Match` entity tag names (`W/"<epoch>-<revision>"` or
/// without `W/`); `None` for lists, `*` or anything else.
fn held_revision(header: &str) -> Option<(String, u64)> {
    let v = header.trim();
    let inner = v
        .strip_prefix("W/")
        .unwrap_or(v)
        .strip_prefix('"')?
        .strip_suffix('"')?;
    let version: Version = inner.parse().ok()?;
    Some((version.epoch, version.revision))
}

/// A JSON manifest response whose ETag is the version of the manifest in the body, which
/// is already in `coding`.
fn respond(version: &Version, body: Bytes, coding: Coding) -> Response {
    let mut headers = vec![
        (header::ETAG, etag_header(version)),
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
        (header::VARY, HeaderValue::from_static("Accept-Encoding")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    if let Some(value) = coding.header() {
        headers.push((header::CONTENT_ENCODING, value));
    }
    let mut response = Response::new(Body::from(body));
    for (k, v) in headers {
        response.headers_mut().insert(k, v);
    }
    response
}

fn check_sha(sha: &str) -> Result<(), ApiError> {
    if is_sha256_hex(sha) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{:?} is not a sha256: expected 64 lowercase hex digits",
            sha.chars().take(80).collect::<String>()
        )))
    }
}

pub(crate) async fn object(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((ws, sha)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.syncs(&state, &ws)?;
    check_sha(&sha)?;
    let store = state.store.clone();
    let (ws2, sha2) = (ws.clone(), sha.clone());
    let body = blocking(move || store.object(&ws2, &sha2))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("object {sha} not found in workspace {ws}")))?;
    let mut response = Response::new(Body::from(body));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/markdown; charset=utf-8"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{sha}\"")).expect("hex is header-safe"),
    );
    Ok(response)
}

pub(crate) async fn objects_batch(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(ws): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.syncs(&state, &ws)?;
    let body = read_body(&state, &headers, body).await?;
    let req: ObjectBatchRequest = json(&body)?;
    let max = state.config.sync.max_batch_objects;
    if req.sha256.len() > max {
        return Err(ApiError::bad_request(format!(
            "sha256: {} objects requested; at most {max} per batch (sync.max_batch_objects)",
            req.sha256.len()
        )));
    }
    for sha in &req.sha256 {
        check_sha(sha)?;
    }
    let store = state.store.clone();
    let items = blocking(move || store.objects(&ws, &req.sha256)).await?;
    let mut out = Vec::with_capacity(
        items
            .iter()
            .map(|(_, b)| b.as_ref().map_or(80, |b| b.len() + 80))
            .sum(),
    );
    for (sha, body) in &items {
        encode_batch_item(&mut out, sha, body.as_deref());
    }
    let coding = Coding::negotiate(&headers).for_len(out.len());
    let payload = match coding {
        Coding::Identity => Bytes::from(out),
        _ => coding.encode(&out),
    };
    let mut response = Response::new(Body::from(payload));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(OBJECT_BATCH_TYPE),
    );
    if let Some(value) = coding.header() {
        h.insert(header::CONTENT_ENCODING, value);
    }
    Ok(response.into_response())
}

#[cfg(test)]
mod tests {
    use super::if_none_match;

    #[test]
    fn weak_comparison_lists_and_star() {
        let tag = "e-7";
        assert!(if_none_match("W/\"e-7\"", tag));
        assert!(
            if_none_match("\"e-7\"", tag),
            "a strong tag matches under weak comparison"
        );
        assert!(if_none_match("W/\"e-6\", W/\"e-7\"", tag));
        assert!(if_none_match("W/\"x\",W/\"e-7\"", tag));
        assert!(if_none_match("*", tag));
        assert!(!if_none_match("W/\"e-6\"", tag));
        assert!(!if_none_match("W/\"e-70\"", tag));
        assert!(!if_none_match("e-7", tag), "unquoted is not an entity tag");
        assert!(!if_none_match("", tag));
        assert!(!if_none_match("W/\"e-7", tag));
    }
}
