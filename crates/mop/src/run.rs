//! `mop run`: prepare, build the bwrap command line from the plan, run it, forward
//! signals, return the command's exit status (125 when the sandbox could not be set up),
//! and release the task on every way out.
//!
//! Before anything else every inherited descriptor is marked close-on-exec; bwrap gets
//! exactly three more: the view and the agent socket directory (O_PATH, for
//! `--ro-bind-fd`) and the status pipe (`--json-status-fd`), from which a successful
//! start (`child-pid`) is told apart from a setup failure. bwrap is spawned from the main
//! thread, which lives until it exits, so `--die-with-parent` follows the right thread.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use mop_proto::{LeaseRequest, Plan, PrepareRequest};
use nix::fcntl::OFlag;
use nix::sys::signal::Signal;

use crate::sandbox::{
    Spec, bwrap_args, find_bwrap, open_dir, prepare_memory_dir, sandbox_env, system_layout,
    tiocsti_blocked,
};
use crate::{TaskArgs, doctor, prepare, release, sys};

/// Exit status when the sandbox could not be set up (the command never ran).
pub const SETUP_FAILED: u8 = 125;

/// What `mop run` was given.
pub struct RunArgs {
    /// The task.
    pub task: TaskArgs,
    /// Working directory.
    pub workdir: Option<PathBuf>,
    /// `--env` items.
    pub envs: Vec<String>,
    /// `--interactive`.
    pub interactive: bool,
    /// `--no-sandbox-dev-only`.
    pub no_sandbox: bool,
    /// Control socket.
    pub socket: PathBuf,
    /// The command.
    pub command: Vec<OsString>,
}

/// Runs a task.
pub fn run(a: RunArgs) -> Result<ExitCode> {
    sys::cloexec_inherited().context("cannot mark inherited file descriptors close-on-exec")?;
    let workdir = a
        .workdir
        .clone()
        .map_or_else(std::env::current_dir, Ok)
        .context("no working directory")?;
    let workdir = std::fs::canonicalize(&workdir)
        .with_context(|| format!("working directory {}", workdir.display()))?;
    if !workdir.is_dir() {
        bail!("working directory {} is not a directory", workdir.display());
    }
    let bwrap = if a.no_sandbox {
        eprintln!(
            "mop: WARNING: --no-sandbox-dev-only: running WITHOUT a sandbox; the command can read and write \
             everything you can. Never use this for real agents."
        );
        None
    } else {
        Some(find_bwrap(&workdir).map_err(anyhow::Error::msg)?)
    };
    let rt = crate::runtime()?;
    let pid = std::process::id();
    let task = a
        .task
        .context(|| format!("run-{pid}-{}", jiff::Timestamp::now().as_millisecond()));
    task.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let req = PrepareRequest {
        task,
        lease: LeaseRequest::Run { pid, start_time: 0 },
        profile: a.task.profile.clone(),
    };
    let plan = rt.block_on(prepare(&a.socket, &req))?;
    let result = match &bwrap {
        Some(bwrap) => sandboxed(&rt, bwrap, &plan, &workdir, &a),
        None => unsandboxed(&plan, &workdir, &a),
    };
    if let Err(e) = rt.block_on(release(&a.socket, &plan.task_id)) {
        eprintln!("mop: warning: {e:#} (the daemon releases it when it sees this process gone)");
    }
    result
}

fn runner_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// The sandbox environment, plus the task's user and asset for `mop memory store
/// --personal/--asset` (the daemon checks them against the task again).
fn task_env(plan: &Plan, workdir: &std::path::Path, a: &RunArgs) -> Result<Vec<(String, String)>> {
    let mut env = sandbox_env(
        &plan.profile,
        &runner_env(),
        &a.envs,
        &plan.task_id,
        workdir,
    )
    .map_err(anyhow::Error::msg)?;
    if let Some(user) = &a.task.user {
        env.push(("MOP_TASK_USER".into(), user.clone()));
    }
    if let Some(asset) = &a.task.asset {
        env.push(("MOP_TASK_ASSET".into(), asset.clone()));
    }
    Ok(env)
}

fn sandboxed(
    rt: &tokio::runtime::Runtime,
    bwrap: &std::path::Path,
    plan: &Plan,
    workdir: &std::path::Path,
    a: &RunArgs,
) -> Result<ExitCode> {
    prepare_memory_dir(workdir, &plan.profile.memory_dir).map_err(anyhow::Error::msg)?;
    let view = open_dir(&plan.view_dir).map_err(anyhow::Error::msg)?;
    let socket_dir = open_dir(&plan.agent_socket_dir).map_err(anyhow::Error::msg)?;
    let env = task_env(plan, workdir, a)?;
    let blocked = tiocsti_blocked();
    let new_session = !(a.interactive && blocked);
    if a.interactive && !blocked {
        eprintln!(
            "mop: note: keeping --new-session although --interactive was asked: TIOCSTI is not blocked on this host \
             (sysctl dev.tty.legacy_tiocsti is not 0), and without it the agent could type into your terminal"
        );
    }
    let (status_read, status_write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).context("cannot create the status pipe")?;
    let view_fd = sys::inherit(&view)?;
    let socket_fd = sys::inherit(&socket_dir)?;
    let status_fd = sys::inherit(&status_write)?;
    let mop_exe =
        std::env::current_exe().context("cannot find the mop binary to bind into the sandbox")?;
    let system = system_layout(&plan.profile);
    let args = bwrap_args(&Spec {
        profile: &plan.profile,
        system: &system,
        workdir,
        view_fd,
        socket_dir_fd: socket_fd,
        status_fd,
        mop_exe: &mop_exe,
        env: &env,
        new_session,
        command: &a.command,
    });
    let mut child = Command::new(bwrap)
        .args(&args)
        .env_clear()
        .spawn()
        .with_context(|| format!("cannot start {}", bwrap.display()))?;
    // Only bwrap keeps these.
    drop(status_write);
    drop(view);
    drop(socket_dir);
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::fs::File::from(status_read).read_to_end(&mut buf);
        buf
    });
    let bwrap_pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut forwarded: Option<Signal> = None;
    let forwarded_ref = &mut forwarded;
    let status = rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        let mut quit = signal(SignalKind::quit())?;
        let mut wait = tokio::task::spawn_blocking(move || child.wait());
        loop {
            let forward = tokio::select! {
                r = &mut wait => return r.map_err(std::io::Error::other)?,
                _ = int.recv() => Signal::SIGINT,
                _ = term.recv() => Signal::SIGTERM,
                _ = hup.recv() => Signal::SIGHUP,
                _ = quit.recv() => Signal::SIGQUIT,
            };
            *forwarded_ref = Some(forward);
            let _ = nix::sys::signal::kill(bwrap_pid, forward);
        }
    })?;
    // bwrap reports "exit-code" only when the command itself ran and exited; a failure to
    // set up the sandbox (a mount, execvp) ends without one.
    let raw = reader.join().unwrap_or_default();
    let exit_code = serde_json::Deserializer::from_slice(&raw)
        .into_iter::<serde_json::Value>()
        .flatten()
        .find_map(|doc| doc.get("exit-code").and_then(|c| c.as_i64()));
    if let (None, Some(sig)) = (exit_code, forwarded) {
        return Ok(ExitCode::from(128 + sig as u8));
    }
    if exit_code.is_none() {
        let report = doctor::probe(workdir);
        eprintln!(
            "mop: the sandbox could not be set up ({}): {}",
            status,
            report
                .problem
                .as_deref()
                .unwrap_or("bwrap failed; its message is above")
        );
        if let Some(fix) = report.fix {
            eprintln!("mop: fix: {fix}");
        }
        return Ok(ExitCode::from(SETUP_FAILED));
    }
    let code = exit_code.unwrap_or(1);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

fn unsandboxed(plan: &Plan, workdir: &std::path::Path, a: &RunArgs) -> Result<ExitCode> {
    let mut env = task_env(plan, workdir, a)?;
    for (k, v) in env.iter_mut() {
        match k.as_str() {
            "MOP_AGENT_SOCKET" => *v = plan.agent_socket.display().to_string(),
            "MOP_MEMORY_DIR" => *v = plan.view_dir.display().to_string(),
            _ => {}
        }
    }
    let (cmd, args) = a.command.split_first().context("no command given")?;
    let status = Command::new(cmd)
        .args(args)
        .env_clear()
        .envs(env)
        .current_dir(workdir)
        .status()
        .with_context(|| format!("cannot run {}", cmd.to_string_lossy()))?;
    Ok(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}
