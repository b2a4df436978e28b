//! The daemon's side of the protocol over HTTP: conditional and delta manifest requests,
//! stores from tasks, and object bodies (one by one, or a batch) handed over as they
//! stream. It knows nothing of the pool: where object bytes go is the fetcher's business
//! (the sync module's fetcher).
//!
//! Anything unexpected is refused with a reason: an HTML page where a manifest should be
//! (a captive portal), an ETag that does not match the manifest, a truncated body.
//!
//! With several server URLs (replicas of one database), a request that cannot connect,
//! times out or gets a 5xx is sent to the next URL; the one that answered is tried first
//! next time. Backing off between rounds is the sync loop's business. Every request is
//! safe to send again: reads are, receipts are counted once, and a store carries an
//! idempotency key, so the server answers a repeat with its first answer.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use mop_proto::receipts::{ReceiptBatch, ReceiptBatchResponse};
use mop_proto::routes::server;
use mop_proto::sync::{
    Manifest, OBJECT_BATCH_TYPE, ObjectBatchRequest, StoreRequest, StoreResponse, Version,
};
use reqwest::{StatusCode, header};

/// Largest manifest accepted, in bytes (uncompressed).
const MAX_MANIFEST_BYTES: usize = 512 * 1024 * 1024;

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
        /// The server's error code (`{"error": code}`), when it sent one: what refusals
        /// are classified by.
        code: Option<String>,
        /// The server's message.
        message: String,
        /// `Retry-After`, in seconds, when sent.
        retry_after: Option<u64>,
    },
    /// The answer is not what the protocol promises.
    #[error("bad response: {0}")]
    BadResponse(String),
}

impl ClientError {
    /// True when the server was not reached (use the offline re-check interval).
    pub fn is_offline(&self) -> bool {
        matches!(self, ClientError::Unreachable(_))
    }

    /// True when the same request may succeed later: the server was not reached, answered
    /// something unreadable, failed (5xx, a database restarting), or asked to slow down
    /// (429 with the rate code, 408). A refusal by the rules (4xx) is final.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable(_) | ClientError::BadResponse(_) => true,
            ClientError::Status { status, code, .. } => {
                *status >= 500
                    || *status == 408
                    || (*status == 429
                        && code.as_deref() != Some(mop_proto::sync::store_errors::QUOTA))
            }
        }
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
    NotModified {
        /// The workspaces it inherits (the `Mop-Inherits` header).
        inherits: Vec<String>,
    },
    /// A manifest (full or delta) and the bytes it took on the wire.
    Manifest {
        /// The manifest.
        manifest: Box<Manifest>,
        /// The workspaces it inherits (the `Mop-Inherits` header).
        inherits: Vec<String>,
    },
}

impl ManifestFetch {
    /// The workspaces the answer says the workspace inherits.
    pub fn inherits(&self) -> &[String] {
        match self {
            ManifestFetch::NotModified { inherits } | ManifestFetch::Manifest { inherits, .. } => {
                inherits
            }
        }
    }
}

/// The workspaces a manifest answer's `Mop-Inherits` header names; each must be a
/// workspace name, as they name pools on this host.
fn inherits_of(headers: &reqwest::header::HeaderMap) -> Result<Vec<String>, ClientError> {
    let Some(value) = headers.get(mop_proto::sync::INHERITS_HEADER) else {
        return Ok(Vec::new());
    };
    let text = value.to_str().map_err(|_| {
        ClientError::BadResponse("the Mop-Inherits header is not plain text".into())
    })?;
    text.split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(|w| {
            if mop_cards::is_slug(w) {
                Ok(w.to_owned())
            } else {
                Err(ClientError::BadResponse(format!(
                    "the Mop-Inherits header names {:?}, which is not a workspace name",
                    w.chars().take(80).collect::<String>()
                )))
            }
        })
        .collect()
}

/// One server a client knows: the URL as configured, the base its requests go to, and the
/// HTTP client that reaches it (a `unix:` server's connects to its socket).
#[derive(Debug)]
struct Server {
    shown: String,
    base: String,
    http: reqwest::Client,
}

/// The prefix of a server URL that names a Unix socket (`unix:/run/mop-server/api.sock`).
pub const UNIX_PREFIX: &str = "unix:";

/// A client of one mop-server, or of several replicas of one database.
#[derive(Debug, Clone)]
pub struct ServerClient {
    servers: Arc<[Server]>,
    /// The index of the server that answered last (tried first).
    current: Arc<AtomicUsize>,
    token: String,
    /// The longest a whole manifest answer may take, body included: a server (or a proxy)
    /// that trickles a byte now and then must not hold a sync forever.
    manifest_deadline: Duration,
}

/// Most bytes of an error answer read for its message.
const MAX_ERROR_BYTES: usize = 64 * 1024;

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

/// The certificates of a PEM file, refusing a file with none.
fn read_roots(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(path)
        .map_err(|e| format!("server.ca_file: cannot read {}: {e}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
        format!(
            "server.ca_file: {} is not a PEM certificate bundle: {e}",
            path.display()
        )
    })?;
    if certs.is_empty() {
        return Err(format!(
            "server.ca_file: {} holds no certificate (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

impl ServerClient {
    /// A client for the servers at `bases` (tried in order; no trailing slash needed) with
    /// a node token.
    pub fn new(bases: &[String], token: String, timeout: Duration) -> Result<ServerClient, String> {
        ServerClient::trusting(bases, token, timeout, None)
    }

    /// The client `[server]` of mopd.toml describes: its URLs, its timeout and, with
    /// `ca_file`, only the certificates in that file trusted.
    pub fn for_config(
        server: &crate::config::ServerSection,
        token: String,
    ) -> Result<ServerClient, String> {
        ServerClient::trusting(
            &server.all_urls(),
            token,
            Duration::from_secs(server.timeout_secs),
            server.ca_file.as_deref(),
        )
    }

    /// A client that trusts only the certificates in the PEM file `roots` (a private CA's,
    /// or the server's own self-signed one) when it is given, the system's roots otherwise.
    ///
    /// Why: the node token goes with every request, so it must go only to a peer that has
    /// proved to be the server; plain HTTP proves nothing, and a loopback port can be
    /// taken by whatever process binds it first while the server restarts.
    pub fn trusting(
        bases: &[String],
        token: String,
        timeout: Duration,
        roots: Option<&std::path::Path>,
    ) -> Result<ServerClient, String> {
        if bases.is_empty() {
            return Err("no server URL configured".into());
        }
        // Installing the provider twice is harmless; it fails only if another is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let roots = roots.map(read_roots).transpose()?;
        let builder = || {
            let b = reqwest::Client::builder()
                .user_agent(concat!("mopd/", env!("CARGO_PKG_VERSION")))
                .connect_timeout(Duration::from_secs(5).min(timeout))
                .read_timeout(timeout)
                .tls_backend_rustls();
            match &roots {
                Some(r) => b.tls_certs_only(r.clone()),
                None => b,
            }
        };
        let build = |b: reqwest::ClientBuilder| {
            b.build()
                .map_err(|e| format!("cannot build the HTTP client: {e}"))
        };
        // One client for the TCP servers, shared; one per socket.
        let tcp = build(builder())?;
        let servers = bases
            .iter()
            .map(|url| {
                let url = url.trim_end_matches('/');
                Ok(match url.strip_prefix(UNIX_PREFIX) {
                    Some(path) => Server {
                        shown: url.to_owned(),
                        base: "http://localhost".into(),
                        http: build(builder().unix_socket(std::path::PathBuf::from(path)))?,
                    },
                    None => Server {
                        shown: url.to_owned(),
                        base: url.to_owned(),
                        http: tcp.clone(),
                    },
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(ServerClient {
            servers: servers.into(),
            current: Arc::default(),
            token,
            manifest_deadline: (timeout * 4).max(Duration::from_secs(60)),
        })
    }

    /// Sends the request `build` makes with a server's client for its base URL, starting at
    /// the server that answered last and moving on past connection failures, timeouts and
    /// 5xx answers. Other answers (a 4xx among them) are the caller's to read.
    async fn send(
        &self,
        build: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let start = self.current.load(Ordering::Relaxed);
        let mut last = None;
        for step in 0..self.servers.len() {
            let i = (start + step) % self.servers.len();
            let server = &self.servers[i];
            let base = &server.shown;
            let more = step + 1 < self.servers.len();
            match build(&server.http, &server.base)
                .bearer_auth(&self.token)
                .send()
                .await
            {
                Ok(r) if r.status().is_server_error() && more => {
                    tracing::warn!(server = %base, status = r.status().as_u16(), "server answered with an error; trying the next one");
                    last = Some(Self::error_status(r).await);
                }
                Ok(r) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(r);
                }
                Err(e) => {
                    let e = transport(e);
                    if more {
                        tracing::warn!(server = %base, error = %e, "server not reached; trying the next one");
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one server was tried"))
    }

    async fn error_status(response: reqwest::Response) -> ClientError {
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
        // A few seconds and 64 KiB at most: an error page is read for its message only.
        let body = tokio::time::timeout(
            Duration::from_secs(5),
            read_limited(response, MAX_ERROR_BYTES),
        )
        .await;
        let text = match body {
            Ok(Ok(b)) => String::from_utf8_lossy(&b).into_owned(),
            _ => String::new(),
        };
        let (code, message) = match mop_proto::error::ErrorBody::parse(text.as_bytes()) {
            Some(b) => (Some(b.error), b.message),
            None => (None, text.chars().take(200).collect()),
        };
        ClientError::Status {
            status,
            code,
            message,
            retry_after,
        }
    }

    /// Asks for the manifest: conditional on `current` (304 when unchanged) and as a delta
    /// from it when the server still has the history.
    async fn fetch_manifest(
        &self,
        ws: &str,
        current: Option<&Version>,
    ) -> Result<ManifestFetch, ClientError> {
        let since = current.map_or_else(String::new, |v| format!("?since={v}"));
        let response = self
            .send(|http, base| {
                let req = http
                    .get(format!("{base}{}{since}", server::MANIFEST.path(&[ws])))
                    .timeout(self.manifest_deadline);
                match current {
                    Some(v) => req.header(header::IF_NONE_MATCH, v.etag()),
                    None => req,
                }
            })
            .await?;
        let inherits = match response.status() {
            StatusCode::NOT_MODIFIED | StatusCode::OK => inherits_of(response.headers())?,
            _ => Vec::new(),
        };
        match response.status() {
            StatusCode::NOT_MODIFIED => {
                // A 304 must name the version held, or it answers some other question.
                let named = response
                    .headers()
                    .get(header::ETAG)
                    .and_then(|v| v.to_str().ok());
                return match (named, current) {
                    (Some(tag), Some(v)) if tag != v.etag() => Err(ClientError::BadResponse(
                        format!("304 for {tag}, but {} is held", v.etag()),
                    )),
                    _ => Ok(ManifestFetch::NotModified { inherits }),
                };
            }
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
        let version = Version::of(&manifest);
        if etag != version.etag() {
            return Err(ClientError::BadResponse(format!(
                "ETag {etag} does not match the manifest's version {version}"
            )));
        }
        Ok(ManifestFetch::Manifest {
            manifest: Box::new(manifest),
            inherits,
        })
    }

    /// POSTs JSON to a server path and reads its JSON answer.
    async fn post_json<T: serde::de::DeserializeOwned>(
        &self,
        path: String,
        body: &impl serde::Serialize,
        what: &str,
        key: Option<&str>,
    ) -> Result<T, ClientError> {
        let response = self
            .send(|http, base| {
                let req = http.post(format!("{base}{path}")).json(body);
                match key {
                    Some(k) => req.header(mop_proto::sync::IDEMPOTENCY_KEY, k),
                    None => req,
                }
            })
            .await?;
        if !response.status().is_success() {
            return Err(Self::error_status(response).await);
        }
        response.json().await.map_err(|e| {
            ClientError::BadResponse(format!("{what} answer unreadable: {}", without_url(&e)))
        })
    }

    /// One object's body, to be read as it arrives.
    async fn fetch_object(&self, ws: &str, sha256: &str) -> Result<Body, ClientError> {
        let response = self
            .send(|http, base| http.get(format!("{base}{}", server::OBJECT.path(&[ws, sha256]))))
            .await?;
        if response.status() != StatusCode::OK {
            return Err(Self::error_status(response).await);
        }
        Ok(Body(Chunks::Http(response)))
    }

    /// A batch answer for `sha256` (in that order), to be decoded as it arrives.
    async fn fetch_object_batch(&self, ws: &str, sha256: Vec<String>) -> Result<Body, ClientError> {
        let request = ObjectBatchRequest { sha256 };
        let response = self
            .send(|http, base| {
                http.post(format!("{base}{}", server::OBJECTS_BATCH.path(&[ws])))
                    .json(&request)
            })
            .await?;
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
        Ok(Body(Chunks::Http(response)))
    }
}

/// A response body, chunk by chunk as the network delivers it (or as a stand-in server
/// in a test hands it over).
pub struct Body(Chunks);

enum Chunks {
    Http(reqwest::Response),
    Ready(std::collections::VecDeque<Bytes>),
}

impl Body {
    /// A body of chunks already in hand.
    pub fn from_chunks(chunks: Vec<Bytes>) -> Body {
        Body(Chunks::Ready(chunks.into()))
    }

    /// The next chunk, or `None` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        match &mut self.0 {
            Chunks::Http(r) => r.chunk().await.map_err(transport),
            Chunks::Ready(c) => Ok(c.pop_front()),
        }
    }
}

/// A future answer of a [`CardServer`].
pub type Answer<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, ClientError>> + Send + 'a>>;

/// The card server as the daemon uses it: what sync, the store queue and receipts ask of
/// it, and which of its replicas answered. [`ServerClient`] is the one over HTTP; the sync
/// module's unit tests drive a workspace's sync against a stand-in.
pub trait CardServer: Send + Sync {
    /// A workspace's manifest, conditional on (and a delta from) the `held` version.
    fn manifest<'a>(&'a self, ws: &'a str, held: Option<&'a Version>) -> Answer<'a, ManifestFetch>;
    /// One object's body.
    fn object<'a>(&'a self, ws: &'a str, sha256: &'a str) -> Answer<'a, Body>;
    /// A batch answer for `sha256`, in that order.
    fn object_batch<'a>(&'a self, ws: &'a str, sha256: Vec<String>) -> Answer<'a, Body>;
    /// Forwards a store from a task with its idempotency key: however often it is sent
    /// (again after a timeout, to another replica, replayed from the queue), the server
    /// applies it once and answers every repeat with its first answer.
    fn store<'a>(
        &'a self,
        ws: &'a str,
        req: &'a StoreRequest,
        key: &'a str,
    ) -> Answer<'a, StoreResponse>;
    /// Reports receipts of ended tasks.
    fn report_receipts<'a>(
        &'a self,
        ws: &'a str,
        batch: &'a ReceiptBatch,
    ) -> Answer<'a, ReceiptBatchResponse>;
    /// The server that answered last (or is asked first next).
    fn answered_by(&self) -> String;
    /// How many servers (replicas) there are.
    fn servers(&self) -> usize;
    /// The server that answered last gave an answer the caller could not use (older than
    /// what is held, or refused): the next request starts at the following server, when
    /// there is one.
    fn distrust_last_answer(&self);
}

impl CardServer for ServerClient {
    fn manifest<'a>(&'a self, ws: &'a str, held: Option<&'a Version>) -> Answer<'a, ManifestFetch> {
        Box::pin(self.fetch_manifest(ws, held))
    }

    fn object<'a>(&'a self, ws: &'a str, sha256: &'a str) -> Answer<'a, Body> {
        Box::pin(self.fetch_object(ws, sha256))
    }

    fn object_batch<'a>(&'a self, ws: &'a str, sha256: Vec<String>) -> Answer<'a, Body> {
        Box::pin(self.fetch_object_batch(ws, sha256))
    }

    fn store<'a>(
        &'a self,
        ws: &'a str,
        req: &'a StoreRequest,
        key: &'a str,
    ) -> Answer<'a, StoreResponse> {
        Box::pin(self.post_json(server::MEMORIES.path(&[ws]), req, "store", Some(key)))
    }

    fn report_receipts<'a>(
        &'a self,
        ws: &'a str,
        batch: &'a ReceiptBatch,
    ) -> Answer<'a, ReceiptBatchResponse> {
        Box::pin(self.post_json(server::RECEIPTS.path(&[ws]), batch, "receipts", None))
    }

    fn answered_by(&self) -> String {
        self.servers[self.current.load(Ordering::Relaxed) % self.servers.len()]
            .shown
            .clone()
    }

    fn servers(&self) -> usize {
        self.servers.len()
    }

    fn distrust_last_answer(&self) {
        let next = (self.current.load(Ordering::Relaxed) + 1) % self.servers.len();
        self.current.store(next, Ordering::Relaxed);
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
                "answer larger than {limit} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server that reads a request and then says nothing (a request that timed out after
    /// reaching it), and one that counts the connections it gets.
    async fn silent_and_counting() -> (
        String,
        String,
        Arc<AtomicUsize>,
        Arc<std::sync::Mutex<Vec<String>>>,
    ) {
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_url = format!("http://{}", silent.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = silent.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let _ = s.read(&mut buf).await;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                });
            }
        });
        let counting = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let counting_url = format!("http://{}", counting.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, k) = (count.clone(), keys.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = counting.accept().await.unwrap();
                c.fetch_add(1, Ordering::SeqCst);
                let k = k.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                    if let Some(line) = head.lines().find(|l| l.starts_with("idempotency-key:")) {
                        k.lock()
                            .unwrap()
                            .push(line["idempotency-key:".len()..].trim().to_owned());
                    }
                    let body = br#"{"accepted":0,"duplicates":0,"too_old":0}"#;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(head.as_bytes()).await;
                    let _ = s.write_all(body).await;
                });
            }
        });
        (silent_url, counting_url, count, keys)
    }

    #[tokio::test]
    async fn a_store_that_timed_out_goes_on_to_the_next_replica_with_its_key() {
        let (silent, counting, count, keys) = silent_and_counting().await;
        let client =
            ServerClient::new(&[silent, counting], "t".into(), Duration::from_millis(500)).unwrap();
        let store: StoreRequest = serde_json::from_value(serde_json::json!({
            "provenance": {"task_id": "t1", "user_id": "alice"},
            "card": {"type": "fact", "title": "x", "body": "y\n"}
        }))
        .unwrap();
        // The first replica took the request and said nothing: the store may have been
        // applied there. Sent on with the same key, the server applies it once.
        let answer = client.store("acme", &store, "k-1").await;
        assert!(
            answer.is_err(),
            "the counting server's answer is not a store answer"
        );
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "sent on to the next replica"
        );
        assert_eq!(
            keys.lock().unwrap().as_slice(),
            ["k-1"],
            "with its idempotency key"
        );
        // The control: receipts carry no key.
        let batch: ReceiptBatch =
            serde_json::from_value(serde_json::json!({"receipts": []})).unwrap();
        client.report_receipts("acme", &batch).await.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 2);
        assert_eq!(keys.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_manifest_trickled_past_its_deadline_is_refused() {
        let trickle = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", trickle.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut s, _) = trickle.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\netag: W/\"e-1\"\r\ncontent-length: 100000\r\n\r\n")
                .await;
            // A byte every 100 ms: never idle long enough for a read timeout.
            for _ in 0..600 {
                if s.write_all(b" ").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut client = ServerClient::new(&[url], "t".into(), Duration::from_secs(5)).unwrap();
        client.manifest_deadline = Duration::from_secs(1);
        let started = std::time::Instant::now();
        let err = client.manifest("acme", None).await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            matches!(
                err,
                ClientError::BadResponse(_) | ClientError::Unreachable(_)
            ),
            "{err}"
        );
    }
}
