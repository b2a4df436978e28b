//! `mop`'s side of mopd's control socket: where the daemon is, what a task is about (the
//! arguments every task command shares), and the daemon's refusals worded for people.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use mop_cards::TaskContext;
use mop_proto::control::{Control, ControlError};
use mop_proto::{Plan, PrepareRequest};

/// Where the daemon is.
#[derive(Args, Clone)]
pub(crate) struct Daemon {
    /// mopd's control socket [default: <paths.runtime_dir>/mopd.sock from mopd's
    /// configuration, else /run/mopd/mopd.sock].
    #[arg(long, env = "MOP_SOCKET")]
    socket: Option<PathBuf>,
    /// mopd's configuration, read (when readable) only to find its socket.
    #[arg(long, env = "MOPD_CONFIG", default_value = "/etc/mopd/mopd.toml")]
    mopd_config: PathBuf,
}

impl Daemon {
    /// The control socket: `--socket` (or `MOP_SOCKET`), else where mopd's configuration
    /// puts it, else mopd's default.
    pub fn socket(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| {
            std::fs::read_to_string(&self.mopd_config)
                .ok()
                .and_then(|t| t.parse::<toml::Table>().ok())
                .and_then(|t| {
                    t.get("paths")?
                        .get("runtime_dir")?
                        .as_str()
                        .map(PathBuf::from)
                })
                .unwrap_or_else(|| PathBuf::from("/run/mopd"))
                .join("mopd.sock")
        })
    }
}

/// What a task is about.
#[derive(Args, Clone)]
pub(crate) struct TaskArgs {
    /// Workspace whose memory the task may use.
    #[arg(long)]
    pub workspace: String,
    /// Task id: 1–64 of [A-Za-z0-9._-], starting with a letter or digit.
    #[arg(long)]
    pub task_id: Option<String>,
    /// Who asked (their personal cards join the task).
    #[arg(long)]
    pub user: Option<String>,
    /// What the task targets (host, database, cluster …).
    #[arg(long)]
    pub asset: Option<String>,
    /// The project the task belongs to (a repository, a service, a team): that project's
    /// cards join the task, and no other project's.
    #[arg(long)]
    pub project: Option<String>,
    /// The ticket title.
    #[arg(long)]
    pub title: String,
    /// The ticket text.
    #[arg(long, default_value = "")]
    pub description: String,
    /// Labels (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Sandbox profile [default: the daemon's tasks.default_profile].
    #[arg(long)]
    pub profile: Option<String>,
}

impl TaskArgs {
    pub fn context(&self, generated_id: impl FnOnce() -> String) -> TaskContext {
        TaskContext {
            task_id: self.task_id.clone().unwrap_or_else(generated_id),
            workspace: self.workspace.clone(),
            origin_user_id: self.user.clone(),
            asset_id: self.asset.clone(),
            project_id: self.project.clone(),
            agent: None,
            title: self.title.clone(),
            description: self.description.clone(),
            labels: self.labels.clone(),
        }
    }
}

/// The runtime a command's daemon calls run on: one thread is all a command needs.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// A daemon's answer that refused or failed a request: "<what> (<status>): <its message>".
/// Kept as a type, so that `mop run` can tell it from an unreachable daemon by its exit
/// status.
#[derive(Debug)]
pub(crate) struct DaemonSaid {
    /// What was asked, in words.
    pub what: String,
    /// The HTTP status of the answer.
    pub status: u16,
    /// The daemon's message.
    pub message: String,
}

impl std::fmt::Display for DaemonSaid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.what, self.status, self.message)
    }
}

impl std::error::Error for DaemonSaid {}

/// Turns a daemon's refusal into a [`DaemonSaid`]; other errors (the daemon unreachable)
/// keep their own advice and type.
pub(crate) fn refused(what: String) -> impl FnOnce(ControlError) -> anyhow::Error {
    move |e| match e {
        ControlError::Answered { status, message } => anyhow::Error::new(DaemonSaid {
            what,
            status,
            message,
        }),
        e => e.into(),
    }
}

/// Sends a prepare to the daemon.
pub(crate) async fn prepare(socket: &std::path::Path, req: &PrepareRequest) -> Result<Plan> {
    Control::new(socket)
        .prepare(req)
        .await
        .map_err(refused(format!(
            "prepare of task {} refused",
            req.task.task_id
        )))
}

/// Releases a task.
pub(crate) async fn release(socket: &std::path::Path, task_id: &str) -> Result<()> {
    Control::new(socket)
        .release(task_id)
        .await
        .map_err(refused(format!("release of task {task_id} failed")))?;
    Ok(())
}
