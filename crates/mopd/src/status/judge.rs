//! Judgement of a status: which workspaces are degraded and why, what only deserves a
//! warning, and the next command to run for each. Pure: the inputs are the workspaces'
//! statuses, the time, and where the server and token are.

use std::time::Duration;

use jiff::Timestamp;
use mop_proto::status::{
    ErrorKind, ErrorRecord, LocalCause, Problem, ReceiptsInfo, SpoolInfo, SyncResult,
    WorkspaceStatus,
};

use super::render::ago;

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
        let advice = |e: &ErrorRecord| {
            match e.kind {
            ErrorKind::Unreachable => format!("curl -sS {}", health_url(server_url)),
            ErrorKind::Unauthorized => format!(
                "on the server: mop-server token create --role node --workspace {ws}; put it in {token_file}; then: systemctl reload mopd"
            ),
            ErrorKind::NotFound => format!(
                "on the server: mop-server token list (the token must include workspace {ws})"
            ),
            ErrorKind::BadResponse => {
                format!("curl -sSI {} (look for a proxy or captive portal)", health_url(server_url))
            }
            ErrorKind::Rollback => {
                "check that the server database was not rolled back; see journalctl -u mopd".into()
            }
            ErrorKind::Quota => {
                "raise [pool] max_bytes in the config, then: systemctl reload mopd".into()
            }
            // The two local failures an operator can fix at once; the next sync after the
            // fix succeeds by itself, and the last good generation serves meanwhile.
            ErrorKind::Local if e.cause == Some(LocalCause::DiskFull) => {
                "free space on the cache filesystem (df -h on the path above); the next sync retries by itself".into()
            }
            ErrorKind::Local if e.cause == Some(LocalCause::ReadOnly) => {
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
                advice(e),
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
                format!("curl -sS {}", health_url(server_url)),
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

/// curl's arguments for the health check of the server at `url` (a `unix:` server through
/// its socket).
fn health_url(url: &str) -> String {
    const HEALTH: &str = mop_proto::routes::server::HEALTH.template();
    match url.strip_prefix(crate::client::UNIX_PREFIX) {
        Some(path) => format!("--unix-socket {path} http://localhost{HEALTH}"),
        None => format!("{url}{HEALTH}"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use mop_proto::status::SyncRecord;

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
                server: None,
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
            cause: None,
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
    fn local_advice_follows_the_cause_not_the_message() {
        let now = ts("2026-11-29T10:00:30Z");
        let mut full = ok_ws();
        full.last_sync.as_mut().unwrap().result = SyncResult::Failed;
        full.last_error = Some(ErrorRecord {
            at: now,
            kind: ErrorKind::Local,
            message: "some words".into(),
            cause: Some(LocalCause::DiskFull),
        });
        let (p, _) = judge(
            &[full.clone()],
            now,
            Duration::from_secs(120),
            "http://127.0.0.1:1",
            "/t",
        );
        assert!(p[0].next.contains("free space"), "{p:?}");
        full.last_error.as_mut().unwrap().cause = None;
        full.last_error.as_mut().unwrap().message = "No space left on device".into();
        let (p, _) = judge(
            &[full],
            now,
            Duration::from_secs(120),
            "http://127.0.0.1:1",
            "/t",
        );
        assert_eq!(p[0].next, "journalctl -u mopd -n 50", "{p:?}");
    }
}

/// Warnings about agents' stores queued on this host: waiting ones (while the server
/// cannot take them), ones the server refused when they were sent, dropped ones.
pub fn stores(q: &SpoolInfo) -> Vec<Problem> {
    let mut out = Vec::new();
    if q.queued > 0 {
        out.push(Problem {
            workspace: None,
            message: format!(
                "{} agent store(s) wait on this host for the card server ({} bytes, the oldest for {} s){}",
                q.queued,
                q.bytes,
                q.oldest_age_secs,
                q.last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
            ),
            next: "they are sent, in order and once each, when the server takes them; nothing to do unless this lasts (spool.max_age_secs drops old ones)".into(),
        });
    }
    for r in &q.refused {
        out.push(Problem {
            workspace: Some(r.workspace.clone()),
            message: format!(
                "the card server refused queued store {} of task {} when it was sent ({}{})",
                r.store_id,
                r.task_id,
                r.status,
                r.code
                    .as_deref()
                    .map(|c| format!(" {c}"))
                    .unwrap_or_default()
            ),
            next: format!("mop receipt {} shows it; the store is not kept", r.task_id),
        });
    }
    if q.dropped > 0 {
        out.push(Problem {
            workspace: None,
            message: format!(
                "{} queued store(s) were dropped unsent (older than spool.max_age_secs)",
                q.dropped
            ),
            next:
                "check that the card server is reachable; raise spool.max_age_secs to wait longer"
                    .into(),
        });
    }
    out
}

/// Warnings about task receipts: refused or dropped ones, and reports that keep failing.
pub fn receipts(r: &ReceiptsInfo) -> Vec<Problem> {
    let mut out = Vec::new();
    if let (true, Some(e)) = (r.pending > 0, &r.last_error) {
        out.push(Problem {
            workspace: None,
            message: format!("{} task receipt(s) wait to be reported: {e}", r.pending),
            next: "they are sent once the server takes them; nothing to do unless this lasts (see the log)".into(),
        });
    }
    if r.refused > 0 {
        out.push(Problem {
            workspace: None,
            message: format!("the server refused {} task receipt(s)", r.refused),
            next:
                "see the log for why; they are kept under the state directory in receipts/refused"
                    .into(),
        });
    }
    if r.dropped > 0 {
        out.push(Problem {
            workspace: None,
            message: format!(
                "{} task receipt(s) were dropped unreported (older than receipts.keep_days)",
                r.dropped
            ),
            next: "usage counts on the server miss those tasks; check that the server is reachable"
                .into(),
        });
    }
    out
}
