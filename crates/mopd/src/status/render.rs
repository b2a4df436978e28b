//! The status report for a person: the summary line, every problem and warning with its
//! next command, each workspace, the tasks, the sandbox tool and the daemon.

use jiff::Timestamp;
use mop_proto::status::{StatusReport, SyncResult};

pub(crate) fn ago(now: Timestamp, then: Timestamp) -> String {
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

/// The exit code of `mopd status`: 0 healthy, 1 degraded.
pub fn exit_code(report: &StatusReport) -> i32 {
    if report.healthy { 0 } else { 1 }
}

/// The report for a person.
pub fn render(report: &StatusReport, now: Timestamp) -> String {
    report.render_at(now)
}

trait Render {
    fn render_at(&self, now: Timestamp) -> String;
}

impl Render for StatusReport {
    fn render_at(&self, now: Timestamp) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        if self.healthy {
            let _ = writeln!(out, "mopd: healthy — {}", self.summary);
        } else {
            let _ = writeln!(out, "mopd: DEGRADED — {}", self.summary);
        }
        for (kind, list) in [("problem", &self.problems), ("warning", &self.warnings)] {
            for p in list {
                let _ = writeln!(
                    out,
                    "  {kind}: {}{} → {}",
                    p.workspace
                        .as_ref()
                        .map(|w| format!("{w}: "))
                        .unwrap_or_default(),
                    p.message,
                    p.next
                );
            }
        }
        let replicas = self.daemon.server_urls.len() > 1;
        for w in &self.workspaces {
            render_workspace(&mut out, w, replicas, now);
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
        let q = &self.stores;
        if q.queued == 0 {
            let _ = writeln!(
                out,
                "stores       none waiting ({} sent from the queue, {} dropped since start)",
                q.sent, q.dropped
            );
        } else {
            let _ = writeln!(
                out,
                "stores       {} waiting for the server, {}, oldest {} ago ({} sent, {} dropped since start)",
                q.queued,
                human_bytes(q.bytes),
                human_secs(q.oldest_age_secs),
                q.sent,
                q.dropped
            );
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
            if d.server_urls.len() > 1 {
                d.server_urls.join(", ")
            } else {
                d.server_url.clone()
            }
        );
        out
    }
}

/// One workspace's lines of the report; `replicas` says whether to name the server that
/// answered.
fn render_workspace(
    out: &mut String,
    w: &mop_proto::status::WorkspaceStatus,
    replicas: bool,
    now: Timestamp,
) {
    use std::fmt::Write;
    if w.inherited_by.is_empty() {
        let _ = writeln!(out, "\nworkspace {}", w.workspace);
    } else {
        let _ = writeln!(
            out,
            "\nworkspace {} (inherited by {})",
            w.workspace,
            w.inherited_by.join(", ")
        );
    }
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
    if !w.inherits.is_empty() {
        let held: Vec<String> = w
            .inherits
            .iter()
            .map(|ws| match w.inherited.iter().find(|i| i.workspace == *ws) {
                Some(i) => format!("{ws} (revision {}, {} cards)", i.revision, i.cards),
                None => format!("{ws} (none yet)"),
            })
            .collect();
        let _ = writeln!(out, "  inherits     {}", held.join(", "));
    }
    match &w.last_sync {
        Some(s) => {
            let what = match s.result {
                SyncResult::Modified => "new generation".to_owned(),
                SyncResult::NotModified => "not modified".to_owned(),
                SyncResult::Failed => "failed".to_owned(),
            };
            let code = s.http_status.map(|c| format!("{c} ")).unwrap_or_default();
            let from = s
                .server
                .as_ref()
                .filter(|_| replicas)
                .map(|u| format!(" from {u}"))
                .unwrap_or_default();
            let _ = writeln!(out, "  last sync    {}: {code}{what}{from}", ago(now, s.at));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humans() {
        assert_eq!(human_secs(42), "42s");
        assert_eq!(human_secs(312), "5m12s");
        assert_eq!(human_secs(10_920), "3h2m");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(36_909_875), "35.2 MiB");
    }
}
