//! What `mopd status` shows. The report's model is in `mop_proto::status` (it crosses the
//! control socket); here it is assembled ([`assemble`]), judged ([`judge`]) and rendered
//! ([`render`]). Each workspace's status is sync's to keep (`sync::record`).
//!
//! Must not change anything: it only reads the daemon's state.

pub mod judge;
pub mod render;

use std::time::Duration;

use jiff::Timestamp;
pub use mop_proto::status::*;

use crate::config::MopdConfig;

/// What the report is made of, gathered by the daemon.
pub struct Facts<'a> {
    /// The config in force.
    pub config: &'a MopdConfig,
    /// The config file.
    pub config_path: &'a std::path::Path,
    /// When the daemon started.
    pub started_at: Timestamp,
    /// Every workspace's status.
    pub workspaces: Vec<WorkspaceStatus>,
    /// The live tasks.
    pub tasks: Vec<mop_proto::TaskSummary>,
    /// The `bwrap` `mop run` would use.
    pub bwrap: Option<String>,
    /// How receipts are being reported.
    pub receipts: ReceiptsInfo,
    /// The queue of stores waiting for the server.
    pub stores: SpoolInfo,
    /// Why hybrid retrieval is off where it was asked for (already judged).
    pub retrieval: Vec<Problem>,
}

/// Assembles the report: judges the workspaces and writes the summary line.
pub fn assemble(f: Facts<'_>, now: Timestamp) -> StatusReport {
    let config = f.config;
    let stale_after = Duration::from_secs(
        3 * config
            .sync
            .interval_secs
            .max(config.sync.offline_recheck_secs)
            + 60,
    );
    let (problems, mut warnings) = judge::judge(
        &f.workspaces,
        now,
        stale_after,
        &config.server.primary_url(),
        &config.server.token_file.display().to_string(),
    );
    warnings.extend(judge::receipts(&f.receipts));
    warnings.extend(judge::stores(&f.stores));
    warnings.extend(f.retrieval);
    let healthy = problems.is_empty();
    let tasks: Vec<TaskInfo> = f
        .tasks
        .into_iter()
        .map(|t| TaskInfo {
            lease: match (&t.lease.pid, &t.lease.expires_at) {
                (Some(pid), _) => format!("lives with mop run pid {pid}"),
                (_, Some(at)) => format!("expires {at}"),
                _ => t.lease.kind.to_string(),
            },
            task_id: t.task_id,
            workspace: t.workspace,
            generation: t.generation,
        })
        .collect();
    let failing: std::collections::BTreeSet<&String> = problems
        .iter()
        .filter_map(|p| p.workspace.as_ref())
        .collect();
    let in_sync = f.workspaces.len() - failing.len();
    let summary = if healthy {
        format!(
            "{} workspace(s) in sync, {} active task(s)",
            f.workspaces.len(),
            tasks.len()
        )
    } else {
        format!(
            "{in_sync} of {} workspace(s) in sync, {} problem(s)",
            f.workspaces.len(),
            problems.len()
        )
    };
    StatusReport {
        schema: STATUS_SCHEMA,
        healthy,
        summary,
        daemon: DaemonInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            started_at: f.started_at,
            uptime_secs: (now.as_second() - f.started_at.as_second()).max(0) as u64,
            config_path: f.config_path.display().to_string(),
            server_url: config.server.primary_url(),
            server_urls: config.server.all_urls(),
        },
        workspaces: f.workspaces,
        tasks,
        sandbox: SandboxInfo { bwrap: f.bwrap },
        problems,
        warnings,
        receipts: f.receipts,
        stores: f.stores,
    }
}

/// The daemon's report now.
pub fn report(state: &crate::state::State, tasks: &crate::tasks::Tasks) -> StatusReport {
    let config = state.config();
    assemble(
        Facts {
            config: &config,
            config_path: &state.config_path,
            started_at: state.started_at,
            workspaces: state.statuses(),
            tasks: tasks.list(),
            bwrap: mop_proto::host::find_bwrap(None)
                .ok()
                .map(|p| p.display().to_string()),
            receipts: {
                let (pending, refused) = tasks.receipts().counts();
                let r = tasks.receipts().report_state();
                ReceiptsInfo {
                    pending,
                    refused,
                    dropped: r.dropped,
                    last_reported_at: r.last_reported_at,
                    last_error: r.last_error,
                }
            },
            stores: tasks.spool().info(Timestamp::now()),
            retrieval: retrieval_warnings(state, tasks),
        },
        Timestamp::now(),
    )
}

/// Warnings for a configured embedding model that is not in use: it does not load, or a
/// loaded generation's vectors do not match it. Either way that ranking is BM25 alone.
fn retrieval_warnings(state: &crate::state::State, tasks: &crate::tasks::Tasks) -> Vec<Problem> {
    let config = state.config();
    let Some(dir) = config.selection.embedding_model.as_deref() else {
        return Vec::new();
    };
    let mut warnings = Vec::new();
    if let Some(Err(e)) = state.embedding.peek(Some(dir)) {
        warnings.push(Problem {
            workspace: None,
            message: format!("hybrid retrieval is off, ranking by BM25 alone: {e}"),
            next: format!(
                "install the model into {} (README: Hybrid retrieval) or remove [selection] embedding_model; then: systemctl restart mopd",
                dir.display()
            ),
        });
    }
    for (ws, generation, dense) in tasks.dense_states() {
        if let mop_search::DenseState::FailedClosed(why) = dense {
            warnings.push(Problem {
                workspace: Some(ws),
                message: format!(
                    "hybrid retrieval is off for generation {generation}, ranking by BM25 alone: {why}"
                ),
                next: "mopd sync (the next generation is built with the model's vectors)".into(),
            });
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> MopdConfig {
        toml::from_str("[server]\nurl = \"http://127.0.0.1:1\"\n[sync]\nworkspaces = [\"acme\"]\n")
            .unwrap()
    }

    fn task(id: &str) -> mop_proto::TaskSummary {
        mop_proto::TaskSummary {
            task_id: id.into(),
            workspace: "acme".into(),
            generation: "g".into(),
            revision: 1,
            lease: mop_proto::LeaseInfo {
                kind: mop_proto::tasks::LeaseKind::Run,
                pid: Some(42),
                expires_at: None,
            },
            created_at: "2026-11-29T10:00:00Z".parse().unwrap(),
            owner_uid: 1000,
        }
    }

    #[test]
    fn the_healthy_summary_counts_the_live_tasks() {
        let now: Timestamp = "2026-11-29T10:00:30Z".parse().unwrap();
        let ws = WorkspaceStatus {
            workspace: "acme".into(),
            generation: Some("g".into()),
            last_sync: Some(SyncRecord {
                at: now,
                result: SyncResult::NotModified,
                http_status: Some(304),
                server: None,
            }),
            last_reached: Some(now),
            ..Default::default()
        };
        let config = config();
        let report = |tasks: Vec<mop_proto::TaskSummary>| {
            assemble(
                Facts {
                    config: &config,
                    config_path: std::path::Path::new("/etc/mopd/mopd.toml"),
                    started_at: now,
                    workspaces: vec![ws.clone()],
                    tasks,
                    bwrap: None,
                    receipts: ReceiptsInfo::default(),
                    stores: SpoolInfo::default(),
                    retrieval: Vec::new(),
                },
                now,
            )
        };
        assert_eq!(
            report(vec![]).summary,
            "1 workspace(s) in sync, 0 active task(s)"
        );
        let two = report(vec![task("a"), task("b")]);
        assert!(two.healthy);
        assert_eq!(two.summary, "1 workspace(s) in sync, 2 active task(s)");
        assert_eq!(two.tasks[0].lease, "lives with mop run pid 42");
    }
}
