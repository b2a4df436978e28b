//! The mop card server: one process and one SQLite file hold every workspace's cards.
//!
//! - [`store`]: the SQLite store — cards keyed by (workspace, id), content-addressed
//!   objects, per-workspace revisions bumped in the same transaction as every change,
//!   hashed tokens, audit history, versioned migrations.
//! - [`api`]: the HTTP/1.1 JSON API of DESIGN.md "Protocol": manifests with weak ETags and
//!   deltas, objects, stores from tasks, task receipts, admin endpoints, and the curation
//!   API (listings, review queue and actions, search, staleness).
//! - [`console`]: the curators' web console under `/console` (server-rendered pages over
//!   the same store calls as the curation API; sessions, CSRF, a strict CSP).
//! - [`encoding`]: the content codings of the large answers (zstd, gzip), negotiated and
//!   applied.
//! - [`metrics`]: Prometheus metrics at `/metrics` (counted by `api::track`).
//! - [`rate`]: token buckets by key (stores per task and per token, failed logins).
//! - [`search`]: the server's own BM25 index of each workspace, for curators.
//! - [`server`]: serving with graceful shutdown and background work.
//! - [`service`]: between handlers and store: the rules a request is decided by (what a
//!   store from an agent task does; what a curator's action does to a card).
//! - [`transfer`]: OKF card directories in and out (`import`, `export`).

pub mod alerts;
pub mod api;
pub mod config;
pub mod console;
pub mod encoding;
pub mod metrics;
pub mod rate;
pub mod search;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
pub mod transfer;
