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
    /// mopd's control socket.
    #[arg(long, env = "MOP_SOCKET", default_value = "/run/mopd/mopd.sock")]
    pub socket: PathBuf,
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

/// Turns a daemon's refusal into "<what> (<status>): <its message>"; other errors (the
/// daemon unreachable) keep their own advice.
pub(crate) fn refused(what: String) -> impl FnOnce(ControlError) -> anyhow::Error {
    move |e| match e {
        ControlError::Answered { status, message } => {
            anyhow::anyhow!("{what} ({status}): {message}")
        }
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
