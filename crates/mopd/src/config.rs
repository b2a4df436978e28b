//! `mopd.toml`: where the server is, which workspaces to keep, where the pool, state and
//! sockets live, and pool limits. Every key is documented in `config/mopd.toml`.
//!
//! A bad file is refused with the file, the key and the reason; at start that stops the
//! daemon, on reload (SIGHUP or a change of the file) the running config stays in force.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The default config file.
pub const DEFAULT_CONFIG: &str = "/etc/mopd/mopd.toml";

/// The whole file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MopdConfig {
    /// `[server]`.
    pub server: ServerSection,
    /// `[sync]`.
    pub sync: SyncSection,
    /// `[paths]`.
    #[serde(default)]
    pub paths: PathsSection,
    /// `[pool]`.
    #[serde(default)]
    pub pool: PoolSection,
    /// `[tasks]`: task views, leases and sandbox profiles.
    #[serde(default)]
    pub tasks: TasksSection,
    /// `[selection]`: tier, ranking and MEMORY.md settings (OKF.md defaults).
    #[serde(default)]
    pub selection: mop_cards::SelectionConfig,
    /// `[sockets]`: connection limits of the control and agent sockets.
    #[serde(default)]
    pub sockets: SocketsSection,
    /// `[receipts]`: task receipts kept on the host and reported to the server.
    #[serde(default)]
    pub receipts: ReceiptsSection,
    /// `[metrics]`.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// `[spool]`: agents' stores kept on the host while the server cannot take them.
    #[serde(default)]
    pub spool: SpoolSection,
}

/// `[spool]`: how many of the agents' stores the host keeps, and how long, while the card
/// server cannot take them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpoolSection {
    /// Most stores one task may have waiting.
    pub max_per_task: usize,
    /// Most bytes one task's waiting stores may take.
    pub max_bytes_per_task: u64,
    /// Most stores waiting on this host.
    pub max_stores: usize,
    /// Most bytes the waiting stores may take on this host.
    pub max_bytes: u64,
    /// A store waiting longer than this many seconds is dropped, with a log line and a
    /// counter (keep it below the server's `intake.store_answer_days`).
    pub max_age_secs: u64,
    /// Longest wait between two tries while the server cannot take stores (the wait
    /// doubles from one second up to this).
    pub retry_max_secs: u64,
    /// Days what became of a queued store is kept for `mop memory store-status`.
    pub keep_done_days: u64,
}

impl Default for SpoolSection {
    fn default() -> Self {
        SpoolSection {
            max_per_task: 50,
            max_bytes_per_task: 4 * 1024 * 1024,
            max_stores: 2000,
            max_bytes: 64 * 1024 * 1024,
            max_age_secs: 7 * 86_400,
            retry_max_secs: 60,
            keep_done_days: 7,
        }
    }
}

/// `[receipts]`: what the host keeps of each task's receipt and how often it reports them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReceiptsSection {
    /// Seconds between reports of ended tasks' receipts to the server (a task's end
    /// also starts one).
    pub report_interval_secs: u64,
    /// Reported receipts kept on the host for `mop receipt`, newest first.
    pub keep: usize,
    /// Days a receipt is kept on the host, reported or not (the server counts no older
    /// receipt either).
    pub keep_days: u64,
}

impl Default for ReceiptsSection {
    fn default() -> Self {
        ReceiptsSection {
            report_interval_secs: 30,
            keep: 10_000,
            keep_days: 30,
        }
    }
}

/// `[sockets]`: how many connections the daemon's sockets keep, and how long they wait.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SocketsSection {
    /// Most connections to the control socket; 0 is `tasks.max_tasks` + 64 (every
    /// `mop run` holds one for its task's life).
    pub control_max_connections: usize,
    /// Most connections to one task's agent socket (an agent needs one or two).
    pub agent_max_connections: usize,
    /// Seconds a client has to send a request head.
    pub header_timeout_secs: u64,
    /// Seconds a kept-alive connection may wait for its next request.
    pub idle_timeout_secs: u64,
    /// Seconds a request body may take to arrive after its head.
    pub body_timeout_secs: u64,
}

impl Default for SocketsSection {
    fn default() -> Self {
        SocketsSection {
            control_max_connections: 0,
            agent_max_connections: 8,
            header_timeout_secs: 5,
            idle_timeout_secs: 30,
            body_timeout_secs: 10,
        }
    }
}

/// `[metrics]`: Prometheus metrics, off unless a loopback port or a socket is named.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Serve `/metrics` on this loopback address (`127.0.0.1:9732`); needs `token_file`.
    pub listen: Option<std::net::SocketAddr>,
    /// Or on this Unix socket (mode 0660).
    pub socket: Option<PathBuf>,
    /// A file (mode 0600) holding the bearer token a scrape of `listen` must send. Why:
    /// tasks in a profile that shares the host's network reach every loopback port, and
    /// the metrics say what other tasks on the host do.
    pub token_file: Option<PathBuf>,
}

/// Checks the path of a `unix:` server URL: absolute, short enough for a socket, and in a
/// directory that nobody but its owner can write (where nothing but the server can put a
/// socket: the proof that a peer there is the server). A directory that does not exist
/// yet (the server not started) is checked when it is used: the connect fails.
fn check_server_socket(key: &str, path: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let p = Path::new(path);
    if !p.is_absolute() || path.len() > 107 {
        return Err(format!(
            "{key} unix:{path}: the socket must be an absolute path of at most 107 bytes"
        ));
    }
    let dir = p.parent().unwrap_or(Path::new("/"));
    if let Ok(meta) = std::fs::metadata(dir)
        && meta.mode() & 0o022 != 0
    {
        return Err(format!(
            "{key} unix:{path}: others may write {} (mode {:o}), so anyone could put a socket there and receive the node token; use mop-server's own directory (such as /run/mop-server)",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Base URL of mop-server (`https://…`, `unix:/run/mop-server/api.sock` for a server on
    /// this host, or `http://…` on a trusted network). Give either this or `urls`.
    #[serde(default)]
    pub url: Option<String>,
    /// Several mop-server replicas of one database, tried in order: on a connection
    /// failure, a timeout or a 5xx the daemon moves on to the next.
    #[serde(default)]
    pub urls: Vec<String>,
    /// File holding this host's node token; readable by the daemon alone (mode 0600 or 0400).
    #[serde(default = "default_token_file")]
    pub token_file: PathBuf,
    /// Timeout of one request to the server, in seconds.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// PEM file of the only certificates trusted for the server's `https://` URLs: a
    /// private CA's, or the server's own self-signed certificate (a pin). Unset: the
    /// system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

impl ServerSection {
    /// The server URLs in the order they are tried (`url` alone, or `urls`).
    pub fn all_urls(&self) -> Vec<String> {
        match &self.url {
            Some(u) => vec![u.clone()],
            None => self.urls.clone(),
        }
    }

    /// The first URL, for messages that name one server.
    pub fn primary_url(&self) -> String {
        self.all_urls().into_iter().next().unwrap_or_default()
    }
}

/// `[sync]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncSection {
    /// Workspaces to keep in the pool.
    pub workspaces: Vec<String>,
    /// Seconds between polls of an unchanged workspace (jittered by ±20 %).
    #[serde(default = "default_interval")]
    pub interval_secs: u64,
    /// Seconds between attempts while the server cannot be reached.
    #[serde(default = "default_offline")]
    pub offline_recheck_secs: u64,
    /// Longest wait between attempts after errors (exponential backoff with jitter).
    #[serde(default = "default_backoff_max")]
    pub backoff_max_secs: u64,
}

/// `[paths]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PathsSection {
    /// The cache pool: objects, generations, task views.
    pub cache_dir: PathBuf,
    /// Sockets.
    pub runtime_dir: PathBuf,
    /// Sync status and leases.
    pub state_dir: PathBuf,
}

/// `[pool]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolSection {
    /// Most bytes all pools together may use; a sync that would pass it is refused.
    pub max_bytes: u64,
    /// Seconds between background re-hashes of every pool (0: never; `mopd verify` on demand).
    pub verify_interval_secs: u64,
}

/// `[tasks]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksSection {
    /// Directories searched for `<profile>.toml`, first match wins.
    pub profile_dirs: Vec<PathBuf>,
    /// Profile used when a prepare names none.
    pub default_profile: String,
    /// Lifetime of a bare `mop prepare` lease, in seconds (`mop renew` extends it).
    pub lease_ttl_secs: u64,
    /// Most live tasks on this host.
    pub max_tasks: usize,
    /// Most live tasks of one runner uid, so that one runner cannot take every slot.
    pub max_tasks_per_uid: usize,
}

impl Default for TasksSection {
    fn default() -> Self {
        TasksSection {
            profile_dirs: vec![
                PathBuf::from("/etc/mopd/profiles"),
                PathBuf::from("/usr/share/mopd/profiles"),
            ],
            default_profile: "default".into(),
            lease_ttl_secs: 24 * 3600,
            max_tasks: 1024,
            max_tasks_per_uid: 256,
        }
    }
}

fn default_token_file() -> PathBuf {
    PathBuf::from("/etc/mopd/node.token")
}
fn default_timeout() -> u64 {
    30
}
fn default_interval() -> u64 {
    30
}
fn default_offline() -> u64 {
    30
}
fn default_backoff_max() -> u64 {
    300
}

impl Default for PathsSection {
    fn default() -> Self {
        PathsSection {
            cache_dir: PathBuf::from("/var/cache/mopd"),
            runtime_dir: PathBuf::from("/run/mopd"),
            state_dir: PathBuf::from("/var/lib/mopd"),
        }
    }
}

impl Default for PoolSection {
    fn default() -> Self {
        PoolSection {
            max_bytes: 2 * 1024 * 1024 * 1024,
            verify_interval_secs: 6 * 3600,
        }
    }
}

/// Why a config is refused: the file, the key and the reason.
#[derive(Debug, thiserror::Error)]
#[error("config {file}: {problem}")]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// Key and reason.
    pub problem: String,
}

impl MopdConfig {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<MopdConfig, ConfigError> {
        let err = |problem: String| ConfigError {
            file: path.display().to_string(),
            problem,
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(format!(
                "cannot read it: {e} (pass --config or create {DEFAULT_CONFIG})"
            ))
        })?;
        let config: MopdConfig =
            toml::from_str(&text).map_err(|e| err(e.to_string().trim_end().to_owned()))?;
        config.validate().map_err(err)?;
        Ok(config)
    }

    /// Checks values a parser cannot: URL form, workspace names, ranges, paths.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_server()?;
        self.validate_metrics()?;
        self.validate_sync_and_paths()?;
        self.validate_limits()
    }

    /// `[server]`: one way to name the server, URLs mop can use, a CA only for https://,
    /// and replicas all reached alike.
    fn validate_server(&self) -> Result<(), String> {
        let key = match (&self.server.url, self.server.urls.is_empty()) {
            (Some(_), false) => {
                return Err(
                    "server.url and server.urls are both set: give one (server.urls for several replicas)"
                        .into(),
                );
            }
            (None, true) => {
                return Err("server.url (or server.urls) must name the card server".into());
            }
            (Some(_), true) => "server.url",
            (None, false) => "server.urls",
        };
        let urls = self.server.all_urls();
        for (i, url) in urls.iter().enumerate() {
            if let Some(path) = url.strip_prefix(crate::client::UNIX_PREFIX) {
                check_server_socket(key, path)?;
            } else if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10
            {
                return Err(format!(
                    "{key} {url:?} must be an http:// or https:// URL, or unix:/path of mop-server's socket"
                ));
            }
            if urls[..i]
                .iter()
                .any(|u| u.trim_end_matches('/') == url.trim_end_matches('/'))
            {
                return Err(format!("{key}: {url:?} is listed twice"));
            }
        }
        if let Some(ca) = &self.server.ca_file {
            if !ca.is_absolute() {
                return Err(format!(
                    "server.ca_file {:?} must be an absolute path",
                    ca.display()
                ));
            }
            if let Some(plain) = urls.iter().find(|u| !u.starts_with("https://")) {
                return Err(format!(
                    "server.ca_file is set but {key} {plain:?} is not https://: a certificate proves nothing there; use https://"
                ));
            }
        }
        // Every replica is trusted alike: one reached over plain HTTP would let anyone on
        // its path speak for all of them.
        if urls.len() > 1
            && urls.iter().any(|u| !u.starts_with("http://"))
            && urls.iter().any(|u| u.starts_with("http://"))
        {
            return Err(format!(
                "{key} mixes http:// replicas with https:// or unix: ones: use https:// (or unix:) for all of them (or http:// for all, on a trusted network)"
            ));
        }
        Ok(())
    }

    /// `[metrics]`: one listener, on loopback and behind a token.
    fn validate_metrics(&self) -> Result<(), String> {
        match (&self.metrics.listen, &self.metrics.socket) {
            (Some(_), Some(_)) => {
                return Err("metrics.listen and metrics.socket are both set: give one".into());
            }
            (Some(addr), None) if !addr.ip().is_loopback() => {
                return Err(format!(
                    "metrics.listen = {addr} is not a loopback address: the metrics port stays on this host (127.0.0.1 or ::1); let a local agent scrape it"
                ));
            }
            (Some(addr), None) if self.metrics.token_file.is_none() => {
                return Err(format!(
                    "metrics.listen = {addr} needs metrics.token_file: sandboxed tasks that share the host's network reach every loopback port; \
                     name a 0600 file holding a bearer token for the scraper (Prometheus: authorization.credentials_file), or use metrics.socket"
                ));
            }
            _ => {}
        }
        if let Some(f) = &self.metrics.token_file
            && !f.is_absolute()
        {
            return Err(format!(
                "metrics.token_file {} must be an absolute path",
                f.display()
            ));
        }
        Ok(())
    }

    /// `[sync]` and `[paths]`: workspaces named once, intervals of at least a second,
    /// absolute paths, and sockets that fit a Unix socket path.
    fn validate_sync_and_paths(&self) -> Result<(), String> {
        if self.sync.workspaces.is_empty() {
            return Err("sync.workspaces must name at least one workspace".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for ws in &self.sync.workspaces {
            if !mop_cards::is_slug(ws) {
                return Err(format!(
                    "sync.workspaces: {ws:?} must be a lowercase slug matching [a-z0-9][a-z0-9._-]{{0,63}}"
                ));
            }
            if !seen.insert(ws) {
                return Err(format!("sync.workspaces: {ws:?} is listed twice"));
            }
        }
        for (key, v) in [
            ("sync.interval_secs", self.sync.interval_secs),
            ("sync.offline_recheck_secs", self.sync.offline_recheck_secs),
            ("sync.backoff_max_secs", self.sync.backoff_max_secs),
            ("server.timeout_secs", self.server.timeout_secs),
        ] {
            if v == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        for (key, p) in [
            ("paths.cache_dir", &self.paths.cache_dir),
            ("paths.runtime_dir", &self.paths.runtime_dir),
            ("paths.state_dir", &self.paths.state_dir),
            ("server.token_file", &self.server.token_file),
        ] {
            if !p.is_absolute() {
                return Err(format!("{key} {} must be an absolute path", p.display()));
            }
        }
        // Socket paths must fit sun_path (108 bytes with its NUL); a task's agent socket is
        // the longest under the runtime directory.
        let sock = self
            .layout()
            .agent_dir(&crate::paths::agent_dir_name())
            .join(crate::paths::AGENT_SOCKET);
        if sock.as_os_str().len() > 107 {
            return Err(format!(
                "paths.runtime_dir is too long: the socket {} would exceed the 108-byte limit of Unix socket paths",
                sock.display()
            ));
        }
        Ok(())
    }

    /// `[selection]`, `[sockets]`, `[spool]` and `[tasks]`: rules that compile and no limit
    /// of zero.
    fn validate_limits(&self) -> Result<(), String> {
        mop_cards::Rules::new(self.selection.clone()).map_err(|e| format!("selection.{e}"))?;
        for (key, v) in [
            (
                "sockets.agent_max_connections",
                self.sockets.agent_max_connections as u64,
            ),
            (
                "sockets.header_timeout_secs",
                self.sockets.header_timeout_secs,
            ),
            ("sockets.idle_timeout_secs", self.sockets.idle_timeout_secs),
            ("sockets.body_timeout_secs", self.sockets.body_timeout_secs),
            ("spool.max_per_task", self.spool.max_per_task as u64),
            ("spool.max_bytes_per_task", self.spool.max_bytes_per_task),
            ("spool.max_stores", self.spool.max_stores as u64),
            ("spool.max_bytes", self.spool.max_bytes),
            ("spool.max_age_secs", self.spool.max_age_secs),
            ("spool.retry_max_secs", self.spool.retry_max_secs),
            ("spool.keep_done_days", self.spool.keep_done_days),
        ] {
            if v == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        if self.tasks.lease_ttl_secs == 0
            || self.tasks.max_tasks == 0
            || self.tasks.max_tasks_per_uid == 0
        {
            return Err(
                "tasks.lease_ttl_secs, tasks.max_tasks and tasks.max_tasks_per_uid must be at least 1"
                    .into(),
            );
        }
        for (i, d) in self.tasks.profile_dirs.iter().enumerate() {
            if !d.is_absolute() {
                return Err(format!(
                    "tasks.profile_dirs[{i}] {} must be an absolute path",
                    d.display()
                ));
            }
        }
        Ok(())
    }

    /// The directory layout under `[paths]`.
    pub fn layout(&self) -> crate::paths::Paths {
        let p = &self.paths;
        crate::paths::Paths::new(&p.cache_dir, &p.state_dir, &p.runtime_dir)
    }

    /// The control socket.
    pub fn socket_path(&self) -> PathBuf {
        self.layout().control_socket()
    }

    /// Directories a sandbox must never see: mop's cache, state, runtime and config.
    pub fn protected_dirs(&self, config_path: &Path) -> Vec<PathBuf> {
        let mut dirs = vec![
            self.paths.cache_dir.clone(),
            self.paths.state_dir.clone(),
            self.paths.runtime_dir.clone(),
            self.server.token_file.clone(),
        ];
        if let Some(parent) = config_path.parent().filter(|p| !p.as_os_str().is_empty()) {
            dirs.push(std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_owned()));
        }
        dirs
    }

    /// Limits of the control socket (`agent: false`) or of one agent socket.
    pub fn socket_limits(&self, agent: bool) -> mop_serve::Limits {
        let s = &self.sockets;
        mop_serve::Limits {
            max_connections: match (agent, s.control_max_connections) {
                (true, _) => s.agent_max_connections,
                (false, 0) => self.tasks.max_tasks + 64,
                (false, n) => n,
            },
            header_timeout: Duration::from_secs(s.header_timeout_secs),
            idle_timeout: Duration::from_secs(s.idle_timeout_secs),
            body_timeout: Duration::from_secs(s.body_timeout_secs),
        }
    }

    /// Poll interval.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.sync.interval_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<MopdConfig, String> {
        let c: MopdConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.validate()?;
        Ok(c)
    }

    const MINIMAL: &str =
        "[server]\nurl = \"https://mop.example.internal\"\n[sync]\nworkspaces = [\"acme\"]\n";

    #[test]
    fn shipped_default_file_parses() {
        let text = include_str!("../../../config/mopd.toml");
        let c = parse(text).unwrap();
        assert_eq!(c.sync.workspaces, ["acme"]);
        assert_eq!(c.sync.interval_secs, 30);
        assert_eq!(c.paths, PathsSection::default());
        assert_eq!(c.pool, PoolSection::default());
        assert_eq!(c.selection, mop_cards::SelectionConfig::default());
        assert_eq!(c.tasks, TasksSection::default());
        assert_eq!(c.sockets, SocketsSection::default());
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.server.token_file, PathBuf::from("/etc/mopd/node.token"));
        assert_eq!(c.socket_path(), PathBuf::from("/run/mopd/mopd.sock"));
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (
                MINIMAL.replace("https://mop.example.internal", "ftp://x"),
                "server.url",
            ),
            (MINIMAL.replace("[\"acme\"]", "[]"), "sync.workspaces"),
            (
                format!("{MINIMAL}[metrics]\nlisten = \"0.0.0.0:9732\"\n"),
                "not a loopback address",
            ),
            (
                MINIMAL.replace("[\"acme\"]", "[\"Acme\"]"),
                "sync.workspaces",
            ),
            (
                MINIMAL.replace("[\"acme\"]", "[\"a\", \"a\"]"),
                "listed twice",
            ),
            (
                format!("{MINIMAL}interval_secs = 0\n"),
                "sync.interval_secs",
            ),
            (format!("{MINIMAL}intervall_secs = 5\n"), "intervall_secs"),
            (
                format!("{MINIMAL}[paths]\ncache_dir = \"relative\"\n"),
                "paths.cache_dir",
            ),
            (
                format!("{MINIMAL}[paths]\nruntime_dir = \"/{}\"\n", "r".repeat(100)),
                "108-byte",
            ),
            (
                format!("{MINIMAL}[selection]\nmin_text_ratio = 3.0\n"),
                "min_text_ratio",
            ),
        ];
        for (text, needle) in cases {
            let err = parse(&text).unwrap_err();
            assert!(err.contains(needle), "{err:?} lacks {needle:?}");
        }
    }
}
