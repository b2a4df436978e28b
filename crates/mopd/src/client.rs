//! The daemon's side of the protocol: conditional and delta manifest requests, and objects
//! by sha256 (one by one, or in batches on a cold sync) verified while they stream.
//!
//! Anything unexpected is refused with a reason: an HTML page where a manifest should be
//! (a captive portal), an ETag that does not match the manifest, a truncated body, an
//! object whose bytes do not hash to its name.

use std::path::Path;
use std::time::Duration;

use mop_cards::{Manifest, OBJECT_BATCH_TYPE, ObjectBatchRequest, Version, is_sha256_hex};
use reqwest::{StatusCode, header};

use crate::pool::{ObjectWriter, Pool, PoolError};

/// Largest manifest accepted, in bytes (uncompressed).
const MAX_MANIFEST_BYTES: usize = 512 * 1024 * 1024;
/// Objects per batch request.
const BATCH: usize = 500;
/// Below this many missing objects, fetch them one by one.
const BATCH_THRESHOLD: usize = 4;

/// Why talking to the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached at all (connect error or timeout).
    #[error("server unreachable: {0}")]
    Unreachable(String),
    /// The server answered with an error status.
    #[error("server answered {status}: {message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// The answer is not what the protocol promises.
    #[error("bad response: {0}")]
    BadResponse(String),
    /// An object could not be stored.
    #[error(transparent)]
    Pool(#[from] PoolError),
}

impl ClientError {
    /// True when the server was not reached (use the offline re-check interval).
    pub fn is_offline(&self) -> bool {
        matches!(self, ClientError::Unreachable(_))
    }
}

fn transport(e: reqwest::Error) -> ClientError {
    if e.is_connect() || e.is_timeout() {
        ClientError::Unreachable(without_url(&e))
    } else {
        ClientError::BadResponse(without_url(&e))
    }
}

/// reqwest errors carry the URL, which is fine (no secrets in it), plus the source chain.
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// The answer to a manifest request.
#[derive(Debug)]
pub enum ManifestFetch {
    /// `304 Not Modified`.
    NotModified,
    /// A manifest (full or delta) and the bytes it took on the wire.
    Manifest(Box<Manifest>),
}

/// A client of one mop-server.
#[derive(Debug, Clone)]
pub struct ServerClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// Reads a node token file, refusing one that others can read.
pub fn read_token(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "token file {} is readable by others (mode {:o}); run: chmod 0600 {}",
            path.display(),
            meta.permissions().mode() & 0o777,
            path.display()
        ));
    }
    let token = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = token.trim().to_owned();
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(token)
}

impl ServerClient {
    /// A client for `base` (no trailing slash needed) with a node token.
    pub fn new(base: &str, token: String, timeout: Duration) -> Result<ServerClient, String> {
        // Installing the provider twice is harmless; it fails only if another is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .user_agent(concat!("mopd/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(5).min(timeout))
            .read_timeout(timeout)
            .tls_backend_rustls()
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(ServerClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
        })
    }

    fn url(&self, ws: &str, rest: &str) -> String {
        format!("{}/v1/workspaces/{ws}/{rest}", self.base)
    }

    async fn error_status(response: reqwest::Response) -> ClientError {
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| text.chars().take(200).collect());
        ClientError::Status { status, message }
    }

    /// Asks for the manifest: conditional on `current` (304 when unchanged) and as a delta
    /// from it when the server still has the history.
    pub async fn manifest(
        &self,
        ws: &str,
        current: Option<&Version>,
    ) -> Result<ManifestFetch, ClientError> {
        let mut url = self.url(ws, "manifest");
        if let Some(v) = current {
            url.push_str(&format!("?since={v}"));
        }
        let mut req = self.http.get(&url).bearer_auth(&self.token);
        if let Some(v) = current {
            req = req.header(header::IF_NONE_MATCH, v.etag());
        }
        let response = req.send().await.map_err(transport)?;
        match response.status() {
            StatusCode::NOT_MODIFIED => return Ok(ManifestFetch::NotModified),
            StatusCode::OK => {}
            _ => return Err(Self::error_status(response).await),
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        if !content_type.starts_with("application/json") {
            return Err(ClientError::BadResponse(format!(
                "expected a JSON manifest, got {content_type:?} (a proxy or captive portal in the way?)"
            )));
        }
        let etag = response
            .headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| ClientError::BadResponse("manifest has no ETag".into()))?;
        let body = read_limited(response, MAX_MANIFEST_BYTES).await?;
        let manifest: Manifest = serde_json::from_slice(&body)
            .map_err(|e| ClientError::BadResponse(format!("manifest is not valid JSON: {e}")))?;
        if etag != manifest.version().etag() {
            return Err(ClientError::BadResponse(format!(
                "ETag {etag} does not match the manifest's version {}",
                manifest.version()
            )));
        }
        Ok(ManifestFetch::Manifest(Box::new(manifest)))
    }

    /// Forwards a store from a task.
    pub async fn store(
        &self,
        ws: &str,
        req: &mop_cards::StoreRequest,
    ) -> Result<mop_cards::StoreResponse, ClientError> {
        let response = self
            .http
            .post(self.url(ws, "memories"))
            .bearer_auth(&self.token)
            .json(req)
            .send()
            .await
            .map_err(transport)?;
        if !response.status().is_success() {
            return Err(Self::error_status(response).await);
        }
        response.json().await.map_err(|e| {
            ClientError::BadResponse(format!("store answer unreadable: {}", without_url(&e)))
        })
    }

    /// Fetches objects into the pool, each verified while it streams. Returns the bytes
    /// received.
    pub async fn fetch_objects(
        &self,
        ws: &str,
        pool: &Pool,
        wanted: &[(String, u64)],
    ) -> Result<u64, ClientError> {
        let mut received = 0;
        if wanted.len() < BATCH_THRESHOLD {
            for (sha, size) in wanted {
                received += self.fetch_one(ws, pool, sha, *size).await?;
            }
            return Ok(received);
        }
        for chunk in wanted.chunks(BATCH) {
            received += self.fetch_batch(ws, pool, chunk).await?;
        }
        Ok(received)
    }

    async fn fetch_one(
        &self,
        ws: &str,
        pool: &Pool,
        sha: &str,
        size: u64,
    ) -> Result<u64, ClientError> {
        let mut response = self
            .http
            .get(self.url(ws, &format!("objects/{sha}")))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(transport)?;
        if response.status() != StatusCode::OK {
            return Err(Self::error_status(response).await);
        }
        let mut writer = pool.new_object(sha, size)?;
        let mut received = 0;
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            received += chunk.len() as u64;
            writer.write(&chunk)?;
        }
        writer.finish()?;
        Ok(received)
    }

    async fn fetch_batch(
        &self,
        ws: &str,
        pool: &Pool,
        wanted: &[(String, u64)],
    ) -> Result<u64, ClientError> {
        let req = ObjectBatchRequest {
            sha256: wanted.iter().map(|(s, _)| s.clone()).collect(),
        };
        let mut response = self
            .http
            .post(self.url(ws, "objects/batch"))
            .bearer_auth(&self.token)
            .json(&req)
            .send()
            .await
            .map_err(transport)?;
        if response.status() != StatusCode::OK {
            return Err(Self::error_status(response).await);
        }
        let ct = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if ct != OBJECT_BATCH_TYPE {
            return Err(ClientError::BadResponse(format!(
                "expected {OBJECT_BATCH_TYPE}, got {ct:?}"
            )));
        }
        let mut parser = BatchParser::new(pool, wanted);
        let mut received = 0;
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            received += chunk.len() as u64;
            parser.feed(&chunk)?;
        }
        parser.end()?;
        Ok(received)
    }
}

async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, ClientError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        ClientError::BadResponse(format!("response body cut short: {}", without_url(&e)))
    })? {
        if body.len() + chunk.len() > limit {
            return Err(ClientError::BadResponse(format!(
                "manifest larger than {limit} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Incremental decoder of the batch framing (`<sha> <size>\n<bytes>\n` or
/// `<sha> missing\n`), writing each item through an [`ObjectWriter`].
struct BatchParser<'a> {
    pool: &'a Pool,
    wanted: &'a [(String, u64)],
    next: usize,
    header: Vec<u8>,
    body: Option<(ObjectWriter, u64)>,
    expect_newline: bool,
}

impl<'a> BatchParser<'a> {
    fn new(pool: &'a Pool, wanted: &'a [(String, u64)]) -> Self {
        BatchParser {
            pool,
            wanted,
            next: 0,
            header: Vec::new(),
            body: None,
            expect_newline: false,
        }
    }

    fn feed(&mut self, mut data: &[u8]) -> Result<(), ClientError> {
        let bad = |m: String| ClientError::BadResponse(format!("object batch: {m}"));
        while !data.is_empty() {
            if self.expect_newline {
                if data[0] != b'\n' {
                    return Err(bad("an object is not followed by a newline".into()));
                }
                self.expect_newline = false;
                data = &data[1..];
                continue;
            }
            if let Some((writer, remaining)) = &mut self.body {
                let take = (*remaining as usize).min(data.len());
                writer.write(&data[..take])?;
                *remaining -= take as u64;
                data = &data[take..];
                if *remaining == 0 {
                    let (writer, _) = self.body.take().expect("body in progress");
                    writer.finish()?;
                    self.expect_newline = true;
                }
                continue;
            }
            match data.iter().position(|b| *b == b'\n') {
                None => {
                    self.header.extend_from_slice(data);
                    if self.header.len() > 200 {
                        return Err(bad("header line too long".into()));
                    }
                    return Ok(());
                }
                Some(i) => {
                    self.header.extend_from_slice(&data[..i]);
                    data = &data[i + 1..];
                    let line = String::from_utf8(std::mem::take(&mut self.header))
                        .map_err(|_| bad("header is not UTF-8".into()))?;
                    self.start_item(&line)?;
                }
            }
        }
        Ok(())
    }

    fn start_item(&mut self, line: &str) -> Result<(), ClientError> {
        let bad = |m: String| ClientError::BadResponse(format!("object batch: {m}"));
        let (sha, rest) = line
            .split_once(' ')
            .ok_or_else(|| bad("header has no size".into()))?;
        let Some((want_sha, want_size)) = self.wanted.get(self.next) else {
            return Err(bad("more objects than requested".into()));
        };
        if !is_sha256_hex(sha) || sha != want_sha {
            return Err(bad(format!(
                "expected object {want_sha}, got {:?}",
                sha.chars().take(70).collect::<String>()
            )));
        }
        self.next += 1;
        if rest == "missing" {
            return Err(ClientError::Status {
                status: 404,
                message: format!(
                    "object {sha} is no longer on the server; the manifest will be fetched again"
                ),
            });
        }
        let size: u64 = rest
            .parse()
            .map_err(|_| bad(format!("bad size {rest:?}")))?;
        if size != *want_size {
            return Err(bad(format!(
                "object {sha} has {size} bytes, the manifest says {want_size}"
            )));
        }
        let writer = self.pool.new_object(sha, size)?;
        if size == 0 {
            writer.finish()?;
            self.expect_newline = true;
        } else {
            self.body = Some((writer, size));
        }
        Ok(())
    }

    fn end(self) -> Result<(), ClientError> {
        if self.body.is_some()
            || self.expect_newline
            || !self.header.is_empty()
            || self.next != self.wanted.len()
        {
            return Err(ClientError::BadResponse(format!(
                "object batch cut short after {} of {} objects",
                self.next,
                self.wanted.len()
            )));
        }
        Ok(())
    }
}
