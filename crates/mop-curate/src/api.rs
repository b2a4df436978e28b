//! The card server's curation API, client side: one typed call per endpoint, errors that
//! say what the server said and what to do. Where to connect and with which token comes
//! from [`Connection`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mop_cards::CardId;
use mop_proto::curation::{
    CardChange, CardDetails, CardPage, CredentialCard, ListQuery, MergeRequest, PageQuery,
    RejectRequest, Rejection, RevertRequest, ReviewQueue, SearchResults, StaleQuery, StaleReport,
    SupersedeRequest,
};
use mop_proto::error::ErrorBody;
use mop_proto::routes::{Route, server};
use reqwest::StatusCode;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Where the server is and how to authenticate: from flags, the environment
/// (`MOP_SERVER_URL`, `MOP_ADMIN_TOKEN`, `MOP_ADMIN_TOKEN_FILE`, `MOP_WORKSPACE`), then the
/// config file (`$XDG_CONFIG_HOME/mop/curate.toml`, else `~/.config/mop/curate.toml`).
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The server's base URL.
    pub url: Option<String>,
    /// The workspace to curate.
    pub workspace: Option<String>,
    /// A file holding the admin token (keep it 0600).
    pub token_file: Option<PathBuf>,
}

impl Settings {
    /// The config file's path.
    pub fn path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
        Some(base.join("mop").join("curate.toml"))
    }

    /// The config file, or nothing when there is none.
    pub fn load() -> Result<Settings> {
        let Some(path) = Settings::path() else {
            return Ok(Settings::default());
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text).with_context(|| {
                format!(
                    "config {}: expected the keys url, workspace and token_file",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Settings::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }
}

/// An authenticated connection to one workspace.
pub struct Connection {
    http: Client,
    base: String,
    token: String,
    /// The workspace.
    pub workspace: String,
}

/// An answer the server gave, other than success.
#[derive(Debug)]
pub struct Refused {
    /// The HTTP status.
    pub status: StatusCode,
    /// The server's code (`not_found`, `precondition_failed`, …).
    pub code: String,
    /// The server's message.
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code,
            self.status.as_u16(),
            self.message
        )
    }
}

impl std::error::Error for Refused {}

impl Connection {
    /// Connects with these settings (nothing is sent yet). The admin token crosses the
    /// network in plain HTTP only to this machine, or when `allow_http` says the network
    /// is trusted.
    pub fn new(
        url: &str,
        token: String,
        workspace: String,
        allow_http: bool,
    ) -> Result<Connection> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = url.trim_end_matches('/').to_owned();
        let parsed = reqwest::Url::parse(&base)
            .with_context(|| format!("server URL {url:?} is not a URL (https://host[:port])"))?;
        match parsed.scheme() {
            "https" => {}
            "http" => {
                let host = parsed.host_str().unwrap_or("");
                let loopback = host == "localhost"
                    || host
                        .trim_matches(['[', ']'])
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback());
                if !loopback && !allow_http {
                    bail!(
                        "refusing to send the admin token in plain HTTP to {}: use https:// (a TLS proxy in front of mop-server), or pass --allow-http on a network you trust",
                        parsed.host_str().unwrap_or("?")
                    );
                }
            }
            _ => bail!("server URL {url:?} must start with https:// (or http:// to this machine)"),
        }
        if !mop_cards::is_slug(&workspace) {
            bail!(
                "workspace {workspace:?} must be a lowercase slug matching [a-z0-9][a-z0-9._-]{{0,63}}"
            );
        }
        let http = Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .context("cannot set up the HTTP client")?;
        Ok(Connection {
            http,
            base,
            token,
            workspace,
        })
    }

    /// The URL of a route of this workspace: `args` fill the parameters after `{ws}`.
    fn url(&self, route: Route, args: &[&str]) -> String {
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(self.workspace.as_str());
        all.extend_from_slice(args);
        format!("{}{}", self.base, route.path(&all))
    }

    fn send(&self, req: RequestBuilder, what: &str) -> Result<Response> {
        let response = req
            .bearer_auth(&self.token)
            .send()
            .with_context(|| format!("{what}: cannot reach the server at {}", self.base))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().unwrap_or_default();
        let (code, message) = match ErrorBody::parse(text.as_bytes()) {
            Some(b) => (b.error, b.message),
            None => (
                "http".to_owned(),
                text.chars().take(300).collect::<String>(),
            ),
        };
        Err(anyhow::Error::new(Refused {
            status,
            code,
            message,
        })
        .context(what.to_owned()))
    }

    fn json<T: DeserializeOwned>(&self, req: RequestBuilder, what: &str) -> Result<T> {
        self.send(req, what)?
            .json()
            .with_context(|| format!("{what}: the server's answer does not read as expected"))
    }

    /// Cards matching the filters.
    pub fn list(&self, q: &ListQuery) -> Result<CardPage> {
        self.json(
            self.http.get(self.url(server::CARDS, &[])).query(q),
            "listing cards",
        )
    }

    /// One card with its provenance, usage and history.
    pub fn details(&self, id: &CardId) -> Result<CardDetails> {
        self.json(
            self.http
                .get(self.url(server::CARD_DETAILS, &[&id.to_string()])),
            &format!("card {id}"),
        )
    }

    /// A card's text and its version tag.
    pub fn text(&self, id: &CardId) -> Result<(String, String)> {
        let r = self.send(
            self.http.get(self.url(server::CARD, &[&id.to_string()])),
            &format!("card {id}"),
        )?;
        let etag = r
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .with_context(|| format!("card {id}: the server sent no version tag (ETag)"))?;
        Ok((r.text()?, etag))
    }

    /// The cards `q` matches as a gzipped tarball of OKF files.
    pub fn export(&self, q: &ListQuery) -> Result<Vec<u8>> {
        let r = self.send(
            self.http.get(self.url(server::EXPORT, &[])).query(q),
            "export",
        )?;
        Ok(r.bytes().context("export: the answer broke off")?.to_vec())
    }

    /// A bulk action's preview (`confirm: None`) or the action itself.
    pub fn bulk(
        &self,
        req: &mop_proto::curation::BulkRequest,
    ) -> Result<mop_proto::curation::BulkAnswer> {
        self.json(
            self.http.post(self.url(server::BULK, &[])).json(req),
            "bulk action",
        )
    }

    /// A duplicate group's waiting cards, as one review entry.
    pub fn group(&self, group: &str) -> Result<mop_proto::curation::ReviewItem> {
        self.json(
            self.http.get(self.url(server::GROUP, &[group])),
            "read group",
        )
    }

    /// Makes a duplicate group one card.
    pub fn combine(
        &self,
        group: &str,
        req: &mop_proto::curation::CombineRequest,
    ) -> Result<CardChange> {
        self.json(
            self.http
                .post(self.url(server::GROUP_COMBINE, &[group]))
                .json(req),
            "combine group",
        )
    }

    /// Imports memory files (or says what an import would do, with `dry_run`).
    pub fn import(
        &self,
        req: &mop_proto::curation::ImportRequest,
    ) -> Result<mop_proto::curation::ImportAnswer> {
        self.json(
            self.http.post(self.url(server::IMPORT, &[])).json(req),
            "import",
        )
    }

    /// Creates a card from fields; the server gives it its id.
    pub fn create(
        &self,
        fields: &mop_proto::sync::NewCard,
        allow_credentials: bool,
    ) -> Result<CardChange> {
        self.json(
            self.http
                .post(self.url(server::CARDS, &[]))
                .query(&[("allow_credentials", allow_credentials)])
                .json(fields),
            "creating a card",
        )
    }

    /// Replaces a card's text if it is still at version `etag`.
    pub fn update(&self, id: &CardId, text: String, etag: &str) -> Result<CardChange> {
        self.json(
            self.http
                .put(self.url(server::CARD, &[&id.to_string()]))
                .header(reqwest::header::IF_MATCH, etag)
                .body(text),
            &format!("saving card {id}"),
        )
    }

    fn action(
        &self,
        id: &CardId,
        action: &str,
        body: Option<Vec<u8>>,
        etag: Option<&str>,
    ) -> Result<CardChange> {
        let mut req = self
            .http
            .post(self.url(server::CARD_ACTION, &[&id.to_string(), action]));
        if let Some(tag) = etag {
            req = req.header(reqwest::header::IF_MATCH, tag);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        self.json(req, &format!("{action} of card {id}"))
    }

    /// Verifies a card, after replacing its text with `edited` when given. A card that
    /// carries a credential is refused unless `allow_credentials` (audited).
    pub fn verify(
        &self,
        id: &CardId,
        edited: Option<String>,
        etag: Option<&str>,
        allow_credentials: bool,
    ) -> Result<CardChange> {
        let action = if allow_credentials {
            "verify?allow_credentials=true"
        } else {
            "verify"
        };
        self.action(id, action, edited.map(String::into_bytes), etag)
    }

    /// Deletes a card for good: its text, objects and history text go, and every host
    /// drops it at its next sync.
    pub fn delete(&self, id: &CardId, reason: &str) -> Result<CardChange> {
        self.json(
            self.http
                .delete(self.url(server::CARD, &[&id.to_string()]))
                .query(&[("reason", reason)]),
            &format!("deleting card {id}"),
        )
    }

    /// The cards whose text carries a credential (ids, kinds and places only).
    pub fn credentials(&self) -> Result<Vec<CredentialCard>> {
        self.json(
            self.http.get(self.url(server::CREDENTIALS, &[])),
            "cards with credentials",
        )
    }

    /// The rejection tombstones, newest first.
    pub fn rejections(&self) -> Result<Vec<Rejection>> {
        self.json(
            self.http.get(self.url(server::REJECTIONS, &[])),
            "rejections",
        )
    }

    /// Lifts a rejection: its lesson is no longer refused.
    pub fn lift(&self, id: &str) -> Result<Rejection> {
        self.json(
            self.http.post(self.url(server::REJECTION_LIFT, &[id])),
            &format!("lifting rejection {id}"),
        )
    }

    /// Rejects a card (archived, with the reason in its history).
    pub fn reject(&self, id: &CardId, reason: &str, etag: Option<&str>) -> Result<CardChange> {
        let body = serde_json::to_vec(&RejectRequest {
            reason: reason.to_owned(),
        })?;
        self.action(id, "reject", Some(body), etag)
    }

    /// Merges a card into another, which takes over its counters.
    /// With `verify` (the version of `into` read), an unverified `into` is verified in
    /// the same action.
    pub fn merge(
        &self,
        id: &CardId,
        into: &CardId,
        verify: Option<String>,
        etag: Option<&str>,
    ) -> Result<CardChange> {
        let body = serde_json::to_vec(&MergeRequest {
            into: *into,
            verify: verify.is_some(),
            into_version: verify,
        })?;
        self.action(id, "merge", Some(body), etag)
    }

    /// Reverts a card to the text its history row `seq` kept.
    pub fn revert(&self, id: &CardId, seq: i64, etag: Option<&str>) -> Result<CardChange> {
        let body = serde_json::to_vec(&RevertRequest { seq })?;
        self.action(id, "revert", Some(body), etag)
    }

    /// Disables, enables, archives or unarchives a card, with why.
    pub fn set_state(
        &self,
        id: &CardId,
        action: &str,
        reason: Option<&str>,
        etag: Option<&str>,
    ) -> Result<CardChange> {
        let body = serde_json::to_vec(&mop_proto::curation::StateRequest {
            reason: reason.map(str::to_owned),
        })?;
        self.action(id, action, Some(body), etag)
    }

    /// Sets a card's fields, keeping its text.
    pub fn set_fields(
        &self,
        id: &CardId,
        req: &mop_proto::curation::FieldsRequest,
        etag: Option<&str>,
    ) -> Result<CardChange> {
        self.action(id, "fields", Some(serde_json::to_vec(req)?), etag)
    }

    /// Marks a card superseded by another.
    pub fn supersede(&self, id: &CardId, by: &CardId, etag: Option<&str>) -> Result<CardChange> {
        let body = serde_json::to_vec(&SupersedeRequest { by: *by })?;
        self.action(id, "supersede", Some(body), etag)
    }

    /// A page of the review queue.
    pub fn review(&self, page: &PageQuery) -> Result<ReviewQueue> {
        self.json(
            self.http.get(self.url(server::REVIEW, &[])).query(page),
            "the review queue",
        )
    }

    /// BM25 search with the listing filters.
    pub fn search(&self, q: &ListQuery) -> Result<SearchResults> {
        self.json(
            self.http.get(self.url(server::SEARCH, &[])).query(q),
            "search",
        )
    }

    /// The staleness report.
    pub fn stale(&self, q: &StaleQuery) -> Result<StaleReport> {
        self.json(
            self.http.get(self.url(server::STALE, &[])).query(q),
            "the staleness report",
        )
    }
}

/// The server's refusal inside an error, if that is what it is.
pub fn refusal(e: &anyhow::Error) -> Option<&Refused> {
    e.chain().find_map(|c| c.downcast_ref::<Refused>())
}
