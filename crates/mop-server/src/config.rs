//! `server.toml`: where the server listens, where its database lives, limits and
//! retention. Every key has a default; command-line flags override the file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The default config file.
pub const DEFAULT_CONFIG: &str = "/etc/mop-server/server.toml";

/// The whole config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// `[server]`.
    pub server: Listen,
    /// `[sync]`.
    pub sync: Sync,
    /// `[retention]`.
    pub retention: Retention,
    /// `[limits]`.
    pub limits: Limits,
    /// `[console]`.
    pub console: ConsoleConfig,
    /// `[metrics]`.
    pub metrics: MetricsConfig,
    /// `[intake]`.
    pub intake: Intake,
    /// `[alerts]`.
    pub alerts: Alerts,
    /// `[inheritance]`: workspace → the workspaces whose cards its tasks get as well.
    pub inheritance: Inheritance,
}

/// `[inheritance]`: which workspaces inherit the cards of which others (for example every
/// team workspace from `org`). Configured here, so that every host agrees: a node token of
/// an inheriting workspace reads the inherited workspaces' manifests and objects, and an
/// admin token of it reads (never changes) their cards.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct Inheritance(pub std::collections::BTreeMap<String, Vec<String>>);

impl Inheritance {
    /// The workspaces `ws` inherits from, in the order configured (empty: none).
    pub fn of(&self, ws: &str) -> &[String] {
        self.0.get(ws).map_or(&[], Vec::as_slice)
    }

    /// Whether a token of `own` may read `ws`: it is one of them, or one inherits it.
    pub fn reaches(&self, own: &[String], ws: &str) -> bool {
        own.iter()
            .any(|w| w == ws || self.of(w).iter().any(|i| i == ws))
    }

    /// The workspaces whose card ids `ws`'s must not repeat, because some task's
    /// generation composes the two: those `ws` inherits, those inheriting `ws`, and the
    /// other workspaces those inherit. A card created with an id one of them holds would
    /// hide the other card from every task that composes both.
    pub fn composed_with(&self, ws: &str) -> Vec<String> {
        let mut out: std::collections::BTreeSet<&str> =
            self.of(ws).iter().map(String::as_str).collect();
        for (child, parents) in &self.0 {
            if parents.iter().any(|p| p == ws) {
                out.insert(child);
                out.extend(parents.iter().map(String::as_str));
            }
        }
        out.remove(ws);
        out.into_iter().map(str::to_owned).collect()
    }

    /// One level only: an inherited workspace inherits nothing itself, so that what a
    /// task gets is always its own cards and those of the workspaces named for it.
    fn check(&self) -> Result<(), String> {
        for (ws, from) in &self.0 {
            for name in std::iter::once(ws).chain(from) {
                if !mop_cards::is_slug(name) {
                    return Err(format!(
                        "inheritance: {name:?} is not a workspace name (a lowercase slug)"
                    ));
                }
            }
            if from.iter().any(|f| f == ws) {
                return Err(format!("inheritance.{ws} names {ws} itself"));
            }
            if let Some(f) = from.iter().find(|f| !self.of(f).is_empty()) {
                return Err(format!(
                    "inheritance.{ws} names {f}, which inherits from others itself; inheritance is one level: name every workspace {ws} inherits directly"
                ));
            }
            let mut seen = std::collections::BTreeSet::new();
            if let Some(f) = from.iter().find(|f| !seen.insert(*f)) {
                return Err(format!("inheritance.{ws} names {f} twice"));
            }
        }
        Ok(())
    }
}

/// `[alerts]`: a webhook told when the review queue needs a curator. Off until
/// `webhook_url` is set.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Alerts {
    /// Where events are POSTed (https://, or http:// to this machine only).
    pub webhook_url: Option<String>,
    /// A file holding the secret each body is signed with (HMAC-SHA256, in the
    /// `X-Mop-Signature: sha256=<hex>` header). Required with `webhook_url`.
    pub webhook_secret_file: Option<PathBuf>,
    /// An item waiting longer than this is announced once (`item_aged`).
    pub item_age_secs: u64,
    /// How often the queue is checked for new groups and aged items.
    pub scan_secs: u64,
    /// Delivery attempts per event before it is given up (kept, counted as failed).
    pub max_attempts: u32,
    /// The longest wait between two attempts (the wait doubles from one second).
    pub max_backoff_secs: u64,
    /// Most events waiting for delivery; past it, new events wait in the queue itself
    /// (nothing is lost: the next check finds them again).
    pub max_pending: u64,
}

impl Default for Alerts {
    fn default() -> Alerts {
        Alerts {
            webhook_url: None,
            webhook_secret_file: None,
            item_age_secs: 24 * 3600,
            scan_secs: 60,
            max_attempts: 12,
            max_backoff_secs: 3600,
            max_pending: 10_000,
        }
    }
}

impl Alerts {
    /// Why the webhook settings cannot work, if they cannot.
    fn check(&self) -> Result<(), String> {
        let Some(url) = &self.webhook_url else {
            return Ok(());
        };
        let parsed = url::Url::parse(url)
            .map_err(|e| format!("alerts.webhook_url {url:?} is not a URL: {e}"))?;
        let local = matches!(
            parsed.host(),
            Some(url::Host::Ipv4(ip)) if ip.is_loopback()
        ) || matches!(parsed.host(), Some(url::Host::Ipv6(ip)) if ip.is_loopback())
            || parsed.host_str() == Some("localhost");
        match parsed.scheme() {
            "https" => {}
            "http" if local => {}
            _ => {
                return Err(format!(
                    "alerts.webhook_url must be https:// (or http:// to this machine): {url:?}"
                ));
            }
        }
        if self.webhook_secret_file.is_none() {
            return Err(
                "alerts.webhook_secret_file is required with alerts.webhook_url: receivers check each body's signature"
                    .into(),
            );
        }
        // A week between attempts is the most that is still a retry.
        if self.max_backoff_secs > 7 * 86_400 {
            return Err("alerts.max_backoff_secs must be at most 604800 (a week)".into());
        }
        for (key, n) in [
            ("alerts.item_age_secs", self.item_age_secs),
            ("alerts.scan_secs", self.scan_secs),
            ("alerts.max_backoff_secs", self.max_backoff_secs),
            ("alerts.max_pending", self.max_pending),
            ("alerts.max_attempts", u64::from(self.max_attempts)),
        ] {
            if n == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        Ok(())
    }
}

/// `[intake]`: what may enter memory (agent stores, admin writes, imports).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Intake {
    /// What a store of a lesson a curator rejected gets: `refuse` (the agent is told the
    /// date and the reason) or `queue` (created, marked "previously rejected" for review).
    pub on_rejected: crate::store::OnRejected,
    /// Days a store's first answer is kept under its idempotency key: a daemon replaying a
    /// store within them gets that answer, never a second card. Keep it above mopd's
    /// `spool.max_age_secs`.
    pub store_answer_days: u64,
    /// `[intake.same_lesson]`: when two cards say the same thing.
    pub same_lesson: mop_intake::lesson::Thresholds,
    /// A model2vec embedding model's directory (the one mopd's `[selection]
    /// embedding_model` uses): the same-lesson rule then also compares meaning
    /// (`same_lesson.dense_cosine`). Unset: words alone.
    pub embedding_model: Option<PathBuf>,
    /// A verified card enters the review queue as a flag item once agents of this many
    /// distinct users called it wrong or outdated (within 30 days, since a curator last
    /// kept it). Verdicts never change what tasks are given.
    pub flag_min_users: u64,
}

impl Default for Intake {
    fn default() -> Self {
        Intake {
            on_rejected: crate::store::OnRejected::Refuse,
            store_answer_days: 30,
            same_lesson: mop_intake::lesson::Thresholds::default(),
            embedding_model: None,
            flag_min_users: 2,
        }
    }
}

impl Intake {
    /// The store's settings from this section.
    pub fn policy(&self) -> crate::store::IntakePolicy {
        crate::store::IntakePolicy {
            same_lesson: self.same_lesson,
            on_rejected: self.on_rejected,
            flag_min_users: self.flag_min_users.max(1),
        }
    }
}

/// `[metrics]`: Prometheus metrics at `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `/metrics` to anyone who reaches the port (route patterns, counts and
    /// times, never a workspace, card or token; still, counts of logins and actions say
    /// something), so off unless turned on.
    pub enabled: bool,
    /// Name workspaces in the review-queue gauges' `workspace` label. Off, the label is
    /// `sha256:` and the first 12 hex digits of the name's SHA-256 (stable, so alerts and
    /// dashboards still tell workspaces apart, without telling a reader of the port what
    /// they are called).
    pub workspace_names: bool,
}

/// `[console]`: the curators' web pages under `/console`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console (it answers only to admin tokens).
    pub enabled: bool,
    /// A session ends after this many seconds without a request.
    pub idle_secs: u64,
    /// Mark the session cookie `Secure`. Turn on when curators reach the server through a
    /// TLS-terminating proxy; the cookie is also marked when the proxy sends
    /// `X-Forwarded-Proto: https`.
    pub secure_cookie: bool,
    /// Most sessions kept at once. When full, the workspace holding the most sessions
    /// loses its least recently used one, so no workspace's curators can log another's out.
    pub max_sessions: usize,
    /// Failed logins one source may make per minute (bursts up to the same number); past
    /// it, its login attempts are answered 429 without being checked, until it slows down.
    pub login_failures_per_minute: u32,
    /// Proxies whose `X-Forwarded-For` names the source of a login (its last address),
    /// so that the throttle applies per browser, not to the proxy as a whole.
    pub trusted_proxies: Vec<std::net::IpAddr>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            idle_secs: 30 * 60,
            secure_cookie: false,
            max_sessions: crate::console::MAX_SESSIONS,
            login_failures_per_minute: 10,
            trusted_proxies: Vec::new(),
        }
    }
}

/// `[server]`: network and storage.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Listen {
    /// Address to listen on. Plain HTTP: put a TLS-terminating proxy in front when daemons
    /// reach the server over an untrusted network.
    pub listen: SocketAddr,
    /// The SQLite database file; created with its schema on first start. With
    /// `database_url` set it is unused, but its directory still holds the curation search
    /// index (a cache).
    pub db: PathBuf,
    /// A PostgreSQL database (`postgres://user:password@host:port/db`) instead of the
    /// SQLite file, for several replicas on one database. The schema is created on first
    /// start. The `MOP_DATABASE_URL` environment variable, when set, takes precedence, so
    /// the password need not be in this file. No TLS to PostgreSQL: reach it over
    /// loopback or a network you trust.
    pub database_url: Option<String>,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Most open client connections; 0 sizes it from the descriptor limit (the soft
    /// `RLIMIT_NOFILE` less a reserve for the database and logs). At the cap, a new
    /// connection closes the oldest one that has no request in progress.
    pub max_connections: usize,
    /// Seconds a client has to send a whole request head, from its first byte or from
    /// connecting (slow or half-open clients are closed after it).
    pub header_timeout_secs: u64,
    /// Seconds a kept-alive connection may wait for its next request.
    pub idle_timeout_secs: u64,
    /// Seconds a request body may take to arrive after its head.
    pub body_timeout_secs: u64,
    /// Serve HTTPS with this certificate chain (PEM); needs `tls_key`. Reloaded on SIGHUP.
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Also serve the API on this Unix socket (mode 0666), for a mopd on the same host:
    /// only mop-server can create it in its own directory, so a daemon that connects to it
    /// reaches the server and nothing else, with no certificate to manage.
    pub socket: Option<PathBuf>,
}

/// `[sync]`: how changes reach daemons.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Sync {
    /// Counter-only changes (reinforcements) are published at most this often, so a busy
    /// workspace does not make the whole fleet re-download its manifest.
    pub counter_publish_secs: u64,
    /// Most objects in one batch request.
    pub max_batch_objects: usize,
}

/// `[retention]`: how long superseded data is kept.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Retention {
    /// Objects no card references any more stay fetchable this long, so a daemon in the
    /// middle of a sync never chases a moving target.
    pub object_secs: u64,
    /// Archived cards are purged (content removed, history redacted) after this many days.
    pub archive_days: u64,
    /// Delta manifests can start from revisions up to this many days old; older clients get
    /// the full manifest.
    pub delta_history_days: u64,
}

/// `[limits]`: how much agents may store.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Most stores one task may make (counted per node token and task id).
    pub stores_per_task: u64,
    /// Most stores one token may make per minute (a host's node token carries every
    /// store of that host's tasks); bursts up to the same number.
    pub stores_per_token_per_minute: u64,
    /// Most stores one task may make per minute, taken before its token's budget: each
    /// task's share of its host's, so one task storing in a loop cannot spend the rest.
    pub stores_per_task_per_minute: u64,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            listen: "127.0.0.1:8731".parse().expect("valid address"),
            db: PathBuf::from("/var/lib/mop-server/mop.db"),
            database_url: None,
            max_body_bytes: 1024 * 1024,
            max_connections: 0,
            header_timeout_secs: 10,
            idle_timeout_secs: 75,
            body_timeout_secs: 30,
            tls_cert: None,
            tls_key: None,
            socket: None,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            stores_per_task: 50,
            stores_per_token_per_minute: 120,
            stores_per_task_per_minute: 12,
        }
    }
}

impl Default for Sync {
    fn default() -> Self {
        Sync {
            counter_publish_secs: 300,
            max_batch_objects: 1000,
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            object_secs: 3600,
            archive_days: 30,
            delta_history_days: 7,
        }
    }
}

impl ServerConfig {
    /// The database in force: `server.database_url` (which `MOP_DATABASE_URL` overrides at
    /// load), else the SQLite file `server.db`.
    pub fn database(&self) -> crate::store::Database {
        match &self.server.database_url {
            Some(url) => crate::store::Database::parse(url),
            None => crate::store::Database::Sqlite(self.server.db.clone()),
        }
    }

    /// Reads a config file. A missing file is an error only when it was named explicitly;
    /// the default path may be absent (all defaults then apply).
    pub fn load(path: Option<&Path>) -> anyhow::Result<ServerConfig> {
        let (path, explicit) = match path {
            Some(p) => (p.to_owned(), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                let mut config = ServerConfig::default();
                config.database_from_env();
                return Ok(config);
            }
            Err(e) => anyhow::bail!("cannot read config {}: {e}", path.display()),
        };
        let mut config: ServerConfig = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!("config {}: {}", path.display(), e.to_string().trim_end())
        })?;
        config.database_from_env();
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        Ok(config)
    }

    /// `MOP_DATABASE_URL`, when set and not empty, replaces `server.database_url`: the
    /// password then lives in the service's environment, not in this file.
    fn database_from_env(&mut self) {
        if let Some(url) = std::env::var("MOP_DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            self.server.database_url = Some(url);
        }
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), String> {
        self.alerts.check()?;
        self.inheritance.check()?;
        if self.server.max_body_bytes < 4096 {
            return Err("server.max_body_bytes must be at least 4096".into());
        }
        if self.sync.counter_publish_secs == 0 {
            return Err("sync.counter_publish_secs must be at least 1".into());
        }
        if self.sync.max_batch_objects == 0 {
            return Err("sync.max_batch_objects must be at least 1".into());
        }
        for (key, secs) in [
            (
                "server.header_timeout_secs",
                self.server.header_timeout_secs,
            ),
            ("server.idle_timeout_secs", self.server.idle_timeout_secs),
            ("server.body_timeout_secs", self.server.body_timeout_secs),
        ] {
            if secs == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        for (key, n) in [
            ("limits.stores_per_task", self.limits.stores_per_task),
            (
                "limits.stores_per_token_per_minute",
                self.limits.stores_per_token_per_minute,
            ),
            (
                "limits.stores_per_task_per_minute",
                self.limits.stores_per_task_per_minute,
            ),
        ] {
            if n == 0 {
                return Err(format!(
                    "{key} must be at least 1 (agents cannot store at all otherwise)"
                ));
            }
        }
        if self.server.tls_cert.is_some() != self.server.tls_key.is_some() {
            return Err(
                "server.tls_cert and server.tls_key go together: set both for HTTPS, or neither"
                    .into(),
            );
        }
        if let Some(socket) = &self.server.socket
            && (!socket.is_absolute() || socket.as_os_str().len() > 107)
        {
            return Err(format!(
                "server.socket {} must be an absolute path of at most 107 bytes (a Unix socket path)",
                socket.display()
            ));
        }
        if self.console.idle_secs == 0 {
            return Err("console.idle_secs must be at least 1".into());
        }
        if self.console.max_sessions == 0 || self.console.login_failures_per_minute == 0 {
            return Err(
                "console.max_sessions and console.login_failures_per_minute must be at least 1"
                    .into(),
            );
        }
        if self.intake.store_answer_days == 0 {
            return Err("intake.store_answer_days must be at least 1".into());
        }
        self.intake
            .same_lesson
            .check()
            .map_err(|e| format!("intake.same_lesson.{e}"))?;
        if let Some(url) = &self.server.database_url
            && !matches!(
                crate::store::Database::parse(url),
                crate::store::Database::Postgres(_)
            )
        {
            return Err(
                "server.database_url must be a postgres:// URL (for SQLite, set server.db)".into(),
            );
        }
        Ok(())
    }

    /// The connection limits of the listener: `max_connections` 0 leaves 128 of the
    /// process's descriptors for the database and logs.
    pub fn connection_limits(&self) -> mop_serve::Limits {
        let s = &self.server;
        mop_serve::Limits {
            max_connections: match s.max_connections {
                0 => mop_serve::connections_for_fd_limit(128, 16),
                n => n,
            },
            header_timeout: Duration::from_secs(s.header_timeout_secs),
            idle_timeout: Duration::from_secs(s.idle_timeout_secs),
            body_timeout: Duration::from_secs(s.body_timeout_secs),
        }
    }

    /// The counter publish interval.
    pub fn counter_publish(&self) -> Duration {
        Duration::from_secs(self.sync.counter_publish_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inheritance(pairs: &[(&str, &[&str])]) -> Inheritance {
        Inheritance(
            pairs
                .iter()
                .map(|(w, from)| (w.to_string(), from.iter().map(|f| f.to_string()).collect()))
                .collect(),
        )
    }

    #[test]
    fn inheritance_is_one_level_and_names_what_composes_with_what() {
        let ok = inheritance(&[
            ("acme", &["org", "sec"]),
            ("globex", &["org"]),
            ("org", &[]),
        ]);
        assert_eq!(ok.check(), Ok(()));
        assert_eq!(ok.composed_with("acme"), ["org", "sec"]);
        assert_eq!(ok.composed_with("org"), ["acme", "globex", "sec"]);
        assert_eq!(ok.composed_with("sec"), ["acme", "org"]);
        assert_eq!(ok.composed_with("globex"), ["org"]);
        assert!(ok.composed_with("other").is_empty());
        for bad in [
            inheritance(&[("acme", &["acme"])]),
            inheritance(&[("acme", &["org"]), ("org", &["root"])]),
            inheritance(&[("acme", &["org", "org"])]),
            inheritance(&[("acme", &["Org"])]),
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shipped_example_parses_to_the_defaults() {
        let text = include_str!("../../../config/server.toml");
        let parsed: ServerConfig = toml::from_str(text).unwrap();
        assert_eq!(parsed, ServerConfig::default());
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let err = toml::from_str::<ServerConfig>("[server]\nlisten_addr = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("listen_addr"), "{err}");
        let err = toml::from_str::<ServerConfig>("[server]\nlisten = \"nope\"\n").unwrap_err();
        assert!(err.to_string().contains("listen"), "{err}");
        let c: ServerConfig = toml::from_str("[sync]\ncounter_publish_secs = 0\n").unwrap();
        assert!(c.validate().unwrap_err().contains("counter_publish_secs"));
    }
}
