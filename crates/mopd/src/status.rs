//! What `mopd status` shows: the versioned JSON report the control socket serves, how it is
//! judged (healthy, degraded), and how it is printed for a person. Every problem names the
//! next command to run.

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Version of the JSON report; bumped when a field changes meaning or disappears.
pub const STATUS_SCHEMA: u32 = 1;

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// [`STATUS_SCHEMA`].
    pub schema: u32,
    /// True when no workspace is stale or failing.
    pub healthy: bool,
    /// One line, also sent to systemd as STATUS=.
    pub summary: String,
    /// The daemon itself.
    pub daemon: DaemonInfo,
    /// Each configured workspace.
    pub workspaces: Vec<WorkspaceStatus>,
    /// Tasks with live views.
    pub tasks: Vec<TaskInfo>,
    /// The sandbox tool.
    pub sandbox: SandboxInfo,
    /// What is wrong, with the next command to run.
    pub problems: Vec<Problem>,
    /// Things to know that do not make the daemon degraded (a new server epoch, …).
    pub warnings: Vec<Problem>,
}

/// The daemon process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonInfo {
    /// mopd version.
    pub version: String,
    /// Process id.
    pub pid: u32,
    /// When it started.
    pub started_at: Timestamp,
    /// Seconds since then.
    pub uptime_secs: u64,
    /// The config file in force.
    pub config_path: String,
    /// The server it syncs from.
    pub server_url: String,
}

/// A task with a live view (filled in by task projection).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// Task id.
    pub task_id: String,
    /// Workspace.
    pub workspace: String,
    /// Generation its view was built from.
    pub generation: String,
    /// Lease kind and expiry.
    pub lease: String,
}

/// Whether bubblewrap is installed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// Path of `bwrap` if found on PATH.
    pub bwrap: Option<String>,
}

/// One problem or warning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// The workspace concerned, if one.
    pub workspace: Option<String>,
    /// What is wrong.
    pub message: String,
    /// The next command to run.
    pub next: String,
}

/// What the last sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncResult {
    /// A new generation was published (HTTP 200).
    Modified,
    /// Nothing changed (HTTP 304, or a 200 for the version already held).
    NotModified,
    /// The sync failed; see `last_error`.
    Failed,
}

/// The kind of the last error, which decides the advice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The server was not reached.
    Unreachable,
    /// The token was refused (401).
    Unauthorized,
    /// The workspace is not in the token's scope, or does not exist (404).
    NotFound,
    /// The server answered something the protocol does not allow.
    BadResponse,
    /// The manifest's revision is lower than the one held (rollback refused).
    Rollback,
    /// The pool quota would be exceeded.
    Quota,
    /// Local file-system trouble.
    Local,
    /// Any other server error status.
    Server,
}

/// One sync attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// When it finished.
    pub at: Timestamp,
    /// What it did.
    pub result: SyncResult,
    /// The manifest request's HTTP status, when one was answered.
    pub http_status: Option<u16>,
}

/// The last error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// When.
    pub at: Timestamp,
    /// Kind.
    pub kind: ErrorKind,
    /// Text (never card content or tokens).
    pub message: String,
}

/// Counters since the daemon started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncStats {
    /// Manifest requests made.
    pub polls: u64,
    /// 304 answers.
    pub not_modified: u64,
    /// Generations published.
    pub generations: u64,
    /// Failed attempts.
    pub failures: u64,
    /// Manifests refused for a lower revision within the epoch.
    pub rollbacks_refused: u64,
    /// Objects downloaded.
    pub objects_fetched: u64,
    /// Object bytes downloaded.
    pub object_bytes: u64,
    /// Bad objects found by re-hashing.
    pub objects_quarantined: u64,
}

/// One workspace's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceStatus {
    /// Name.
    pub workspace: String,
    /// Server database epoch of the current generation.
    pub epoch: Option<String>,
    /// Revision of the current generation.
    pub revision: Option<u64>,
    /// Current generation directory name.
    pub generation: Option<String>,
    /// Cards in it.
    pub cards: usize,
    /// Bytes the pool uses on disk.
    pub pool_bytes: u64,
    /// Last sync attempt.
    pub last_sync: Option<SyncRecord>,
    /// Last error (kept after recovery, for the record).
    pub last_error: Option<ErrorRecord>,
    /// Last time the server answered anything.
    pub last_reached: Option<Timestamp>,
    /// Failures since the last success.
    pub consecutive_failures: u32,
    /// Set when a new server epoch was accepted.
    pub epoch_warning: Option<String>,
    /// Counters.
    #[serde(default)]
    pub stats: SyncStats,
}

fn ago(now: Timestamp, then: Timestamp) -> String {
    let secs = (now.as_second() - then.as_second()).max(0);
    human_secs(secs as u64) + " ago"
}

/// `3h2m`, `5m12s`, `40s`.
pub fn human_secs(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{}m", secs / 3600, (secs % 3600) / 60),
        _ => format!("{}d{}h", secs / 86400, (secs % 86400) / 3600),
    }
}

/// `35.2 MiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Judges workspaces: a workspace is degraded when it has no generation, its last sync
/// failed, or the server has not been reached for `stale_after`.
pub fn judge(
    workspaces: &[WorkspaceStatus],
    now: Timestamp,
    stale_after: Duration,
    server_url: &str,
    token_file: &str,
) -> (Vec<Problem>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    for w in workspaces {
        let ws = &w.workspace;
        let p = |message: String, next: String| Problem {
            workspace: Some(ws.clone()),
            message,
            next,
        };
        let advice = |kind: ErrorKind, message: &str| {
            match kind {
            ErrorKind::Unreachable => format!("curl -sS {server_url}/v1/health"),
            ErrorKind::Unauthorized => format!(
                "on the server: mop-server token create --role node --workspace {ws}; put it in {token_file}; then: systemctl reload mopd"
            ),
            ErrorKind::NotFound => format!(
                "on the server: mop-server token list (the token must include workspace {ws})"
            ),
            ErrorKind::BadResponse => {
                format!("curl -sSI {server_url}/v1/health (look for a proxy or captive portal)")
            }
            ErrorKind::Rollback => {
                "check that the server database was not rolled back; see journalctl -u mopd".into()
            }
            ErrorKind::Quota => {
                "raise [pool] max_bytes in the config, then: systemctl reload mopd".into()
            }
            // The two local failures an operator can fix at once; the next sync after the
            // fix succeeds by itself, and the last good generation serves meanwhile.
            ErrorKind::Local if message.contains("No space left on device") => {
                "free space on the cache filesystem (df -h on the path above); the next sync retries by itself".into()
            }
            ErrorKind::Local if message.contains("Read-only file system") => {
                "remount the cache filesystem read-write (mount -o remount,rw); the next sync retries by itself".into()
            }
            ErrorKind::Local => "journalctl -u mopd -n 50".into(),
            ErrorKind::Server => "journalctl -u mop-server on the server".into(),
        }
        };
        let failing = w
            .last_sync
            .as_ref()
            .is_some_and(|s| s.result == SyncResult::Failed);
        if failing && let Some(e) = &w.last_error {
            let since = ago(now, e.at);
            problems.push(p(
                format!(
                    "sync failing ({} in a row, last {since}): {}",
                    w.consecutive_failures, e.message
                ),
                advice(e.kind, &e.message),
            ));
        } else if w.generation.is_none() {
            problems.push(p(
                "no cards yet: the first sync has not completed".into(),
                "mopd sync".into(),
            ));
        }
        let stale = match w.last_reached {
            None => w.last_sync.is_some(),
            Some(t) => (now.as_second() - t.as_second()).max(0) as u64 > stale_after.as_secs(),
        };
        if stale && !failing {
            problems.push(p(
                format!(
                    "stale: server last reached {}",
                    w.last_reached
                        .map_or_else(|| "never".into(), |t| ago(now, t))
                ),
                format!("curl -sS {server_url}/v1/health"),
            ));
        } else if stale && failing {
            // Already reported as failing; serving from the last good generation meanwhile.
        }
        if let Some(wn) = &w.epoch_warning {
            warnings.push(p(wn.clone(), format!("mopd ack-epoch {ws}")));
        }
    }
    if let Some(host) = plain_http_remote_host(server_url) {
        warnings.push(Problem {
            workspace: None,
            message: format!(
                "the node token goes to {host} over plain HTTP: anyone on the path can read it and the cards"
            ),
            next: "use an https:// server.url (a TLS proxy in front of mop-server), then: systemctl reload mopd"
                .into(),
        });
    }
    (problems, warnings)
}

/// The host of an `http://` URL that is not a loopback address: where a bearer token
/// would cross a network in the clear.
pub fn plain_http_remote_host(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!loopback).then(|| host.to_owned())
}

#[cfg(test)]
mod plain_http_tests {
    use super::plain_http_remote_host as remote;

    #[test]
    fn tokens_over_plain_http_to_other_hosts_are_named() {
        assert_eq!(
            remote("http://mop.example:8731"),
            Some("mop.example".into())
        );
        assert_eq!(remote("http://10.0.0.5/"), Some("10.0.0.5".into()));
        assert_eq!(
            remote("http://[2001:db8::1]:8731"),
            Some("2001:db8::1".into())
        );
        for fine in [
            "https://mop.example",
            "http://127.0.0.1:8731",
            "http://127.8.9.10",
            "http://localhost:8731/",
            "http://[::1]:8731",
        ] {
            assert_eq!(remote(fine), None, "{fine}");
        }
    }
}

impl StatusReport {
    /// The exit code of `mopd status`: 0 healthy, 1 degraded.
    pub fn exit_code(&self) -> i32 {
        if self.healthy { 0 } else { 1 }
    }

    /// The report for a person.
    pub fn render(&self, now: Timestamp) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        if self.healthy {
            let _ = writeln!(out, "mopd: healthy — {}", self.summary);
        } else {
            let _ = writeln!(out, "mopd: DEGRADED — {}", self.summary);
        }
        for p in &self.problems {
            let _ = writeln!(
                out,
                "  problem: {}{} → {}",
                p.workspace
                    .as_ref()
                    .map(|w| format!("{w}: "))
                    .unwrap_or_default(),
                p.message,
                p.next
            );
        }
        for p in &self.warnings {
            let _ = writeln!(
                out,
                "  warning: {}{} → {}",
                p.workspace
                    .as_ref()
                    .map(|w| format!("{w}: "))
                    .unwrap_or_default(),
                p.message,
                p.next
            );
        }
        for w in &self.workspaces {
            let _ = writeln!(out, "\nworkspace {}", w.workspace);
            match (&w.epoch, w.revision) {
                (Some(e), Some(r)) => {
                    let _ = writeln!(
                        out,
                        "  revision     {r} (epoch {e})\n  cards        {}\n  pool         {}  (generation {})",
                        w.cards,
                        human_bytes(w.pool_bytes),
                        w.generation.as_deref().unwrap_or("-")
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        "  revision     none yet\n  pool         {}",
                        human_bytes(w.pool_bytes)
                    );
                }
            }
            match &w.last_sync {
                Some(s) => {
                    let what = match s.result {
                        SyncResult::Modified => "new generation".to_owned(),
                        SyncResult::NotModified => "not modified".to_owned(),
                        SyncResult::Failed => "failed".to_owned(),
                    };
                    let code = s.http_status.map(|c| format!("{c} ")).unwrap_or_default();
                    let _ = writeln!(out, "  last sync    {}: {code}{what}", ago(now, s.at));
                }
                None => {
                    let _ = writeln!(out, "  last sync    never");
                }
            }
            let _ = writeln!(
                out,
                "  server       {}",
                w.last_reached.map_or_else(
                    || "never reached".into(),
                    |t| format!("reached {}", ago(now, t))
                )
            );
            let _ = writeln!(
                out,
                "  last error   {}",
                w.last_error.as_ref().map_or_else(
                    || "none".into(),
                    |e| format!("{} ({})", e.message, ago(now, e.at))
                )
            );
        }
        let _ = writeln!(out);
        if self.tasks.is_empty() {
            let _ = writeln!(out, "tasks        none active");
        } else {
            let _ = writeln!(out, "tasks        {} active", self.tasks.len());
            for t in &self.tasks {
                let _ = writeln!(
                    out,
                    "  {} ({}, generation {}, {})",
                    t.task_id, t.workspace, t.generation, t.lease
                );
            }
        }
        match &self.sandbox.bwrap {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "sandbox      bwrap installed at {p} (run `mop doctor` for a full probe)"
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "sandbox      bwrap not installed → apt-get install bubblewrap (or dnf install bubblewrap), then: mop doctor"
                );
            }
        }
        let d = &self.daemon;
        let _ = writeln!(
            out,
            "daemon       mopd {}, pid {}, up {}, config {}, server {}",
            d.version,
            d.pid,
            human_secs(d.uptime_secs),
            d.config_path,
            d.server_url
        );
        out
    }
}

/// Finds `bwrap` on PATH.
pub fn find_bwrap() -> Option<String> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn ok_ws() -> WorkspaceStatus {
        WorkspaceStatus {
            workspace: "acme".into(),
            epoch: Some("e".into()),
            revision: Some(3),
            generation: Some("e-3".into()),
            cards: 10,
            last_sync: Some(SyncRecord {
                at: ts("2026-11-29T10:00:00Z"),
                result: SyncResult::NotModified,
                http_status: Some(304),
            }),
            last_reached: Some(ts("2026-11-29T10:00:00Z")),
            ..Default::default()
        }
    }

    #[test]
    fn judging() {
        let now = ts("2026-11-29T10:00:30Z");
        let stale = Duration::from_secs(120);
        let (p, w) = judge(&[ok_ws()], now, stale, "http://127.0.0.1:8731", "/t");
        assert!(p.is_empty() && w.is_empty());

        let mut failing = ok_ws();
        failing.last_sync.as_mut().unwrap().result = SyncResult::Failed;
        failing.consecutive_failures = 2;
        failing.last_error = Some(ErrorRecord {
            at: now,
            kind: ErrorKind::Unreachable,
            message: "server unreachable: connection refused".into(),
        });
        let (p, _) = judge(&[failing], now, stale, "http://127.0.0.1:8731", "/t");
        assert_eq!(p.len(), 1);
        assert!(p[0].message.contains("connection refused"));
        assert_eq!(p[0].next, "curl -sS http://127.0.0.1:8731/v1/health");

        let (p, _) = judge(
            &[ok_ws()],
            ts("2026-11-29T11:00:00Z"),
            stale,
            "http://127.0.0.1:8731",
            "/t",
        );
        assert!(p[0].message.starts_with("stale"), "{p:?}");

        let mut warned = ok_ws();
        warned.epoch_warning = Some("server epoch changed".into());
        let (p, w) = judge(&[warned], now, stale, "http://127.0.0.1:8731", "/t");
        assert!(p.is_empty());
        assert_eq!(w[0].next, "mopd ack-epoch acme");
    }

    #[test]
    fn humans() {
        assert_eq!(human_secs(42), "42s");
        assert_eq!(human_secs(312), "5m12s");
        assert_eq!(human_secs(10_920), "3h2m");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(36_909_875), "35.2 MiB");
    }
}
