//! `mop run`: prepare, build the bwrap command line, run it, forward signals, and return
//! the command's exit status (125 when the sandbox could not be set up).
//!
//! The prepare is answered in two steps on one held connection: first a reservation
//! (the task's view and agent socket directories, and the profile), then the plan once
//! the daemon has selected the cards and filled the view. bwrap is started on the
//! reservation, so the sandbox is set up while the daemon works, and the command starts
//! only after the plan arrived: its go signal is the end of the seccomp program (see
//! [`crate::confine`]), so if this process dies first the command never starts. The
//! task's lease is that connection: when this process ends, however it ends, the daemon
//! sees it close and releases the task.
//!
//! Before anything else every inherited descriptor is marked close-on-exec; bwrap gets
//! exactly six: the checked working directory (`--bind-fd`), the view twice and the agent
//! socket directory (O_PATH, for `--ro-bind-fd`), the status pipe (`--json-status-fd`,
//! which tells a started command from a setup failure) and the seccomp pipe, plus, with
//! `--agent claude|codex`, one memfd per priming file (`--file`, copied into the
//! sandbox's private home and closed by bwrap; see `mop_agent::prime`). bwrap is
//! spawned from the main thread, which lives until it exits, so `--die-with-parent`
//! follows the right thread; that thread also enters the Landlock domain and the fresh
//! session keyring the sandbox inherits.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use mop_agent::prime::{Primed, TaskFacts, prime};
use mop_proto::control::{Control, FinishRequest, HeldPrepare};
use mop_proto::inside::env;
use mop_proto::receipts::{Capture, Outcome};
use mop_proto::{
    AgentKind, LeaseRequest, Plan, PrepareEvent, PrepareRequest, Reservation, WorkdirMemory,
};
use nix::fcntl::OFlag;
use nix::sys::signal::Signal;

use crate::capture::{CaptureDir, WorkdirFiles};
use crate::confine::{self, AbstractSockets, TcpBind};
use crate::control::{TaskArgs, refused, runtime};
use crate::sandbox::{Spec, bwrap_args, open_dir, sandbox_env, system_layout};
use crate::workdir::Workdir;
use crate::{doctor, sys};

/// Exit status when the sandbox could not be set up (the command never ran).
pub const SETUP_FAILED: u8 = 125;

/// Exit status when `mop run` itself could not start the task: its arguments, the working
/// directory (as `mop run` checks it), no bubblewrap (the command never ran).
pub const RUN_FAILED: u8 = 120;

/// Exit status when the daemon could not be reached (no socket, nothing listening, no
/// permission): the command never ran.
pub const DAEMON_UNREACHABLE: u8 = 121;

/// Exit status when the daemon refused the task (an unknown workspace or profile, a
/// working directory it will not serve, a task id in use): the command never ran.
pub const PREPARE_REFUSED: u8 = 122;

/// Exit status when the daemon failed to prepare the task (it is not synced yet, its
/// disk, a fault of its own): the command never ran.
pub const PREPARE_FAILED: u8 = 123;

/// The exit status of a `mop run` that ended with `e` before its command started: each
/// kind of failure its own, so that a runner tells an infrastructure failure from the
/// agent's own exit status (README "Running tasks").
pub fn failure_status(e: &anyhow::Error) -> u8 {
    use mop_proto::control::ControlError;
    for cause in e.chain() {
        if let Some(said) = cause.downcast_ref::<crate::control::DaemonSaid>() {
            return if (400..500).contains(&said.status) {
                PREPARE_REFUSED
            } else {
                PREPARE_FAILED
            };
        }
        if let Some(c) = cause.downcast_ref::<ControlError>() {
            return match c {
                ControlError::Missing(_)
                | ControlError::Refused(_)
                | ControlError::Denied(_)
                | ControlError::Other { .. } => DAEMON_UNREACHABLE,
                _ => PREPARE_FAILED,
            };
        }
    }
    RUN_FAILED
}

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
    /// `--agent`, when given (else the profile's).
    pub agent: Option<AgentKind>,
    /// `--no-sandbox-dev-only`.
    pub no_sandbox: bool,
    /// `--dry-run`: print the plan and the bwrap command line instead of running.
    pub dry_run: bool,
    /// `--no-capture`: the agent CLI's own memory is turned off rather than captured.
    pub no_capture: bool,
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
        if a.agent.is_some_and(|k| k != AgentKind::Generic) {
            eprintln!(
                "mop: warning: --agent primes only a sandbox's private home; without a sandbox \
                 nothing is written and the agent keeps your own configuration"
            );
        }
        None
    } else {
        Some(mop_proto::host::find_bwrap(Some(&workdir)).map_err(anyhow::Error::msg)?)
    };
    let pid = std::process::id();
    let mut task = a
        .task
        .context(|| format!("run-{pid}-{}", jiff::Timestamp::now().as_millisecond()));
    // Without --agent the daemon fills in the profile's, which this run then primes.
    task.agent = a.agent.map(|k| k.name().to_owned());
    task.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    if task.origin_user_id.is_none() {
        eprintln!(
            "mop: warning: task {} has no --user: its agent cannot store memory (a store needs the task's user) and no one's personal cards reach it; pass --user NAME",
            task.task_id
        );
    }
    let req = PrepareRequest {
        task,
        lease: LeaseRequest::Run {
            pid,
            start_time: mop_proto::host::own_start_time()
                .context("cannot read this process's start time from /proc/self/stat")?,
        },
        profile: a.task.profile.clone(),
        workdir: Some(workdir.clone()),
    };
    // The guard starts now, so that its start-up overlaps the daemon's work, and before
    // any descriptor is made inheritable, so that it holds none of them.
    let _guard = match &bwrap {
        Some(_) if !a.dry_run => Some(Guard::start(
            &std::env::current_exe().context("cannot find the mop binary for the guard")?,
            &req.task.task_id,
        )?),
        _ => None,
    };
    // After the guard: a fork needs this process to have one thread.
    let rt = runtime()?;
    let mut hold = rt
        .block_on(Control::new(&a.socket).prepare_held(&req))
        .map_err(refused(format!(
            "prepare of task {} refused",
            req.task.task_id
        )))?;
    let reservation = match next_event(&rt, &mut hold)? {
        PrepareEvent::Reserved(r) => *r,
        PrepareEvent::Failed { message } => {
            return Err(prepare_failed(&req.task.task_id, message));
        }
        PrepareEvent::Ready(_) => bail!("the daemon sent a plan before a reservation"),
    };
    let result = match &bwrap {
        Some(bwrap) => sandboxed(&rt, bwrap, &reservation, &mut hold, &workdir, &a),
        None => {
            let plan = ready(&rt, &mut hold, &reservation)?;
            unsandboxed(&rt, &plan, &workdir, &a)
        }
    };
    drop(hold);
    // Nothing is left to finish: do not wait for idle blocking threads.
    rt.shutdown_background();
    result
}

fn next_event(rt: &tokio::runtime::Runtime, hold: &mut HeldPrepare) -> Result<PrepareEvent> {
    rt.block_on(hold.next())?
        .context("the daemon ended the prepare answer early (is it shutting down?)")
}

/// The daemon gave up preparing `task_id` after it reserved it.
fn prepare_failed(task_id: &str, message: String) -> anyhow::Error {
    anyhow::Error::new(crate::control::DaemonSaid {
        what: format!("prepare of task {task_id} failed"),
        status: 500,
        message,
    })
}

/// Waits for the plan (the view is complete).
fn ready(rt: &tokio::runtime::Runtime, hold: &mut HeldPrepare, r: &Reservation) -> Result<Plan> {
    match next_event(rt, hold)? {
        PrepareEvent::Ready(plan) => Ok(*plan),
        PrepareEvent::Failed { message } => Err(prepare_failed(&r.task_id, message)),
        PrepareEvent::Reserved(_) => bail!("the daemon sent a second reservation"),
    }
}

/// The priming files as memfds bwrap copies from (`--file FD PATH`), each holding its
/// whole contents from offset 0. Not pipes: a pipe's capacity shrinks to one page when the
/// runner's uid holds many pipe pages (which a sandboxed agent of the same uid can
/// arrange), and a larger file would then block `mop run` before bwrap ever started.
fn primed_files(p: &Primed) -> Result<Vec<(std::os::fd::OwnedFd, PathBuf)>> {
    use std::io::{Seek, Write};
    p.files
        .iter()
        .map(|(path, text)| {
            let fd =
                nix::sys::memfd::memfd_create(c"mop-prime", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                    .context("cannot create a memfd for the agent's priming files")?;
            let mut file = std::fs::File::from(fd);
            file.write_all(text.as_bytes())
                .and_then(|()| file.rewind())
                .with_context(|| format!("cannot write priming file {}", path.display()))?;
            Ok((file.into(), path.clone()))
        })
        .collect()
}

fn runner_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// The sandbox environment, plus the task's user and asset for `mop memory store
/// --personal/--asset` (the daemon checks them against the task again).
fn task_env(
    profile: &mop_proto::Profile,
    task_id: &str,
    workdir: &Path,
    a: &RunArgs,
) -> Result<Vec<(String, String)>> {
    let mut env = sandbox_env(profile, &runner_env(), &a.envs, task_id, workdir)
        .map_err(anyhow::Error::msg)?;
    if let Some(user) = &a.task.user {
        env.push((env::TASK_USER.into(), user.clone()));
    }
    if let Some(asset) = &a.task.asset {
        env.push((env::TASK_ASSET.into(), asset.clone()));
    }
    if let Some(project) = &a.task.project {
        env.push((env::TASK_PROJECT.into(), project.clone()));
    }
    Ok(env)
}

fn sandboxed(
    rt: &tokio::runtime::Runtime,
    bwrap: &Path,
    r: &Reservation,
    hold: &mut HeldPrepare,
    workdir: &Path,
    a: &RunArgs,
) -> Result<ExitCode> {
    let claimed = claim_workdir(workdir, r)?;
    let mop_exe =
        std::env::current_exe().context("cannot find the mop binary to bind into the sandbox")?;
    let views = [
        open_dir(&r.view_dir).map_err(anyhow::Error::msg)?,
        open_dir(&r.view_dir).map_err(anyhow::Error::msg)?,
    ];
    let socket_dir = open_dir(&r.agent_socket_dir).map_err(anyhow::Error::msg)?;
    let agent = a.agent.unwrap_or(r.profile.agent);
    let (primed, capture_path, watch) = priming(agent, r, a, &claimed)?;
    let env = with_primed(task_env(&r.profile, &r.task_id, workdir, a)?, &primed.env);
    let primed_pipes = primed_files(&primed)?;
    // The seccomp filter refuses TIOCSTI inside the sandbox, so an interactive agent may
    // keep its controlling terminal. An agent CLI on a terminal is a terminal UI.
    use std::io::IsTerminal;
    let interactive =
        a.interactive || (agent != AgentKind::Generic && std::io::stdin().is_terminal());
    let new_session = !interactive;
    let (status_read, status_write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).context("cannot create the status pipe")?;
    let program = confine::seccomp_program().map_err(anyhow::Error::msg)?;
    let (seccomp_read, gate) = confine::gate(&program).context("cannot create the seccomp pipe")?;
    let workdir_fd = sys::inherit(&claimed.dir)?;
    let view_fds = [sys::inherit(&views[0])?, sys::inherit(&views[1])?];
    let socket_fd = sys::inherit(&socket_dir)?;
    let capture_fd = capture_path.as_ref().map(sys::inherit).transpose()?;
    let status_fd = sys::inherit(&status_write)?;
    let seccomp_fd = sys::inherit(&seccomp_read)?;
    let primed_fds = primed_pipes
        .iter()
        .map(|(fd, path)| Ok((sys::inherit(fd)?, path.clone())))
        .collect::<Result<Vec<_>>>()?;
    let system = system_layout(&r.profile);
    let args = bwrap_args(&Spec {
        profile: &r.profile,
        system: &system,
        workdir,
        workdir_fd,
        view_fds,
        socket_dir_fd: socket_fd,
        capture_fd,
        status_fd,
        seccomp_fd,
        mop_exe: &mop_exe,
        new_session,
        primed_dirs: &primed.dirs,
        primed_files: &primed_fds,
        command: &a.command,
    });
    if a.dry_run {
        let plan = ready(rt, hold, r)?;
        let fds = serde_json::json!({ "workdir": workdir_fd, "view": view_fds, "agent_socket_dir": socket_fd, "status": status_fd, "seccomp": seccomp_fd });
        print_dry_run(&plan, bwrap, &args, &env, fds, agent)?;
        return Ok(ExitCode::SUCCESS);
    }
    confine_this_thread(&r.profile);
    // Spawned from the main thread (see the module comment); tokio only reaps it.
    let mut std_cmd = Command::new(bwrap);
    // The sandbox's environment is bwrap's own (see `bwrap_args`), never its command line.
    std_cmd
        .args(&args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)));
    sys::prepare_bwrap_exec(&mut std_cmd, rlimits(&r.profile.limits));
    let mut child = {
        let _rt = rt.enter();
        tokio::process::Command::from(std_cmd)
            .spawn()
            .with_context(|| format!("cannot start {}", bwrap.display()))?
    };
    // Only bwrap keeps these (the working directory's locks stay with this process).
    drop(status_write);
    drop(seccomp_read);
    drop(views);
    drop(socket_dir);
    drop(capture_path);
    let bwrap_pid = nix::unistd::Pid::from_raw(child.id().context("bwrap exited at once")? as i32);
    // The command may start only once the view is complete.
    match ready(rt, hold, r) {
        Ok(_) => match gate.open() {
            // A broken pipe: bwrap already gave up setting up the sandbox; its status
            // and message are read below.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                let _ = nix::sys::signal::kill(bwrap_pid, Signal::SIGKILL);
                let _ = rt.block_on(child.wait());
                return Err(e).context("cannot start the command (seccomp pipe)");
            }
            _ => {}
        },
        Err(e) => {
            // A cut-short filter stops bwrap by itself; the kill makes it quick.
            drop(gate);
            let _ = nix::sys::signal::kill(bwrap_pid, Signal::SIGKILL);
            let _ = rt.block_on(child.wait());
            return Err(e);
        }
    }
    let (status, forwarded) = rt.block_on(wait_forwarding_signals(&mut child, bwrap_pid))?;
    // bwrap has exited, so its status lines are all in the pipe (they are far smaller
    // than a pipe's buffer, so bwrap never waited on us to read them).
    let raw = read_available(status_read);
    let (code, ran) = exit_code(&raw, status, forwarded, workdir);
    watch.finish(rt, &a.socket, &r.task_id, ran, &claimed);
    Ok(code)
}

/// The agent CLI's priming files, the descriptor bwrap binds the capture directory by,
/// and what `mop run` watches for the task's end.
fn priming(
    agent: AgentKind,
    r: &Reservation,
    a: &RunArgs,
    claimed: &Workdir,
) -> Result<(Primed, Option<std::os::fd::OwnedFd>, Watch)> {
    let capture = r.profile.capture.native_memory && !a.no_capture;
    let primed = prime(
        agent,
        &TaskFacts {
            user: a.task.user.as_deref(),
            asset: a.task.asset.as_deref(),
            project: a.task.project.as_deref(),
            capture,
        },
    );
    // Only Claude Code's memory goes to a directory of mop's choosing (see prime).
    let dir = match (agent, capture, a.dry_run) {
        (AgentKind::Claude, true, false) => Some(CaptureDir::create()?),
        _ => None,
    };
    let path = dir
        .as_ref()
        .map(|c| open_dir(c.path()).map_err(anyhow::Error::msg))
        .transpose()?;
    let watch = Watch {
        agent,
        capture,
        propose: capture && r.profile.capture.workdir_memory == WorkdirMemory::Propose,
        dir,
        workdir_before: WorkdirFiles::read(&claimed.dir),
    };
    Ok((primed, path, watch))
}

/// What `mop run` keeps an eye on for the task's end: the agent CLI's capture directory,
/// and the working directory's memory files as they were before the task.
struct Watch {
    agent: AgentKind,
    /// The CLI's own memory is captured (else it was turned off).
    capture: bool,
    /// New sections of the working directory's memory files are proposed as cards.
    propose: bool,
    dir: Option<CaptureDir>,
    workdir_before: WorkdirFiles,
}

impl Watch {
    /// Tells the daemon how the task ended (`exit_code`: the command's status, or 128 plus
    /// the signal it got; none when it never ran) and hands it what was captured, before
    /// the lease ends; then says on stderr what became of it, in one line (and one for the
    /// working directory's memory files, when the task changed them). A daemon that
    /// cannot be told costs the receipt its ending, never the command's exit status.
    fn finish(
        self,
        rt: &tokio::runtime::Runtime,
        socket: &Path,
        task_id: &str,
        exit_code: Option<i32>,
        claimed: &Workdir,
    ) {
        let workdir_after = WorkdirFiles::read(&claimed.dir);
        let found = self
            .dir
            .as_ref()
            .map(CaptureDir::collect)
            .unwrap_or_default();
        let (workdir_edits, proposed) =
            workdir_after.edits_since(&self.workdir_before, self.propose);
        let primed = self.agent != AgentKind::Generic;
        let capture = (primed || !workdir_edits.is_empty()).then(|| Capture {
            agent: self.agent.name().to_owned(),
            enabled: self.capture && self.agent == AgentKind::Claude,
            files: found.files,
            skipped: found.skipped,
            workdir_edits,
        });
        let mut cards = found.cards;
        cards.extend(proposed);
        cards.truncate(mop_proto::control::MAX_CAPTURED);
        // The ending goes first, alone, so that no size of what the agent wrote can cost
        // the receipt its outcome; the cards follow in batches the socket takes.
        let control = Control::new(socket);
        let ending = FinishRequest {
            outcome: exit_code.map(Outcome::of_exit),
            exit_code,
            capture: capture.clone(),
            cards: Vec::new(),
        };
        let mut stores = Vec::new();
        for req in
            std::iter::once(ending).chain(crate::capture::batches(cards).into_iter().map(|cards| {
                FinishRequest {
                    cards,
                    ..Default::default()
                }
            }))
        {
            match rt.block_on(control.finish(task_id, &req)) {
                Ok(r) => stores.extend(r.stores),
                Err(err) => {
                    eprintln!(
                        "mop: warning: cannot record how task {task_id} ended, or store all it captured ({err}); its receipt lacks some of it"
                    );
                    return;
                }
            }
        }
        let Some(c) = capture else { return };
        if primed {
            eprintln!(
                "mop: {} (mop receipt {task_id})",
                crate::capture::line(&c, &stores)
            );
        }
        if !c.workdir_edits.is_empty() {
            let files: Vec<String> = c
                .workdir_edits
                .iter()
                .map(|w| format!("{} {}", w.file, w.change))
                .collect();
            eprintln!(
                "mop: the task changed the working directory's memory files: {}; they stay as the task left them{}",
                files.join(", "),
                if self.propose {
                    ", and their new sections were proposed as cards"
                } else {
                    ": review them before the next task reads them"
                }
            );
        }
    }
}

/// `mop run`'s exit code from bwrap's status lines (`raw`) and exit: the command's own, 128
/// plus a signal forwarded before it ran, or [`SETUP_FAILED`] with what `mop doctor` finds.
fn exit_code(
    raw: &[u8],
    status: std::process::ExitStatus,
    forwarded: Option<Signal>,
    workdir: &Path,
) -> (ExitCode, Option<i32>) {
    // bwrap reports "exit-code" only when the command itself ran and exited; a failure to
    // set up the sandbox (a mount, execvp) ends without one.
    let exit_code = serde_json::Deserializer::from_slice(raw)
        .into_iter::<serde_json::Value>()
        .flatten()
        .find_map(|doc| doc.get("exit-code").and_then(|c| c.as_i64()));
    if let (None, Some(sig)) = (exit_code, forwarded) {
        return (ExitCode::from(128 + sig as u8), Some(128 + sig as i32));
    }
    let Some(code) = exit_code else {
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
        return (ExitCode::from(SETUP_FAILED), None);
    };
    let code = code.clamp(0, 255) as i32;
    (ExitCode::from(code as u8), Some(code))
}

/// The task's environment with what the agent adapter sets in place of the same names.
fn with_primed(
    mut env: Vec<(String, String)>,
    primed: &[(String, String)],
) -> Vec<(String, String)> {
    for (k, v) in primed {
        env.retain(|(x, _)| x != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

/// `mop run --dry-run`: the plan and what would run (bwrap, its arguments, the
/// environment's names, never values that may be secrets, and the inherited descriptors).
fn print_dry_run(
    plan: &Plan,
    bwrap: &Path,
    args: &[std::ffi::OsString],
    env: &[(String, String)],
    fds: serde_json::Value,
    agent: AgentKind,
) -> Result<()> {
    let shown: Vec<String> = args
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "plan": plan,
            "bwrap": bwrap,
            "args": shown,
            "env": env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            "fds": fds,
            "agent": agent.name(),
        }))?
    );
    Ok(())
}

/// Claims the working directory for the run, and says what the runner should know of
/// it: warnings, and files where agents look for memory that mop did not deliver.
fn claim_workdir(workdir: &Path, r: &Reservation) -> Result<Workdir> {
    let claimed = Workdir::claim(workdir, &r.profile.memory_dir, r.profile.shared_workdir)
        .map_err(anyhow::Error::msg)?;
    for w in &claimed.warnings {
        eprintln!("mop: warning: {w}");
    }
    if !claimed.leftovers.is_empty() {
        eprintln!(
            "mop: note: the working directory holds files where agents look for memory, left by an earlier run or by anyone who can write it; mop delivered none of them (this task's memory is mounted at {}, with its MEMORY.md):",
            r.profile.memory_dir
        );
        for l in &claimed.leftovers {
            eprintln!("mop: note:   {l}");
        }
    }
    Ok(claimed)
}

/// Confines this thread as the sandbox will inherit it: a session keyring of its own
/// (none of the runner's keys) and, with a shared network, the Landlock domain that keeps
/// the host's abstract Unix sockets out of reach and its fixed TCP ports unbound. What
/// the kernel cannot do is said, not fatal.
fn confine_this_thread(profile: &mop_proto::Profile) {
    if let Err(e) = sys::join_fresh_session_keyring()
        && e.raw_os_error() != Some(nix::libc::ENOSYS)
    {
        eprintln!(
            "mop: note: the sandbox keeps the runner's session keyring ({e}); the seccomp filter still refuses every key call"
        );
    }
    if profile.network {
        let confined = confine::confine_network(&profile.bind_ports);
        if let AbstractSockets::Reachable(why) = confined.abstract_sockets {
            eprintln!(
                "mop: note: this sandbox can reach the host's abstract Unix sockets ({why}); the offline profile has none, see: mop doctor"
            );
        }
        if let TcpBind::Open(why) = confined.tcp_bind {
            eprintln!(
                "mop: note: this sandbox can listen on any free TCP port of the host ({why}); the offline profile cannot, see: mop doctor"
            );
        }
    }
}

/// Waits for bwrap to exit, forwarding SIGINT, SIGTERM, SIGHUP and SIGQUIT to it; its
/// exit status, and the last signal forwarded.
async fn wait_forwarding_signals(
    child: &mut tokio::process::Child,
    bwrap_pid: nix::unistd::Pid,
) -> std::io::Result<(std::process::ExitStatus, Option<Signal>)> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut quit = signal(SignalKind::quit())?;
    let mut forwarded = None;
    loop {
        let forward = tokio::select! {
            r = child.wait() => return Ok((r?, forwarded)),
            _ = int.recv() => Signal::SIGINT,
            _ = term.recv() => Signal::SIGTERM,
            _ = hup.recv() => Signal::SIGHUP,
            _ = quit.recv() => Signal::SIGQUIT,
        };
        forwarded = Some(forward);
        let _ = nix::sys::signal::kill(bwrap_pid, forward);
    }
}

/// The running guard of this `mop run` (see [`crate::guard`]): told on drop that `mop run`
/// ends normally. Only a death that skips destructors (SIGKILL) leaves it to clean up.
struct Guard {
    pipe: Option<std::fs::File>,
}

impl Guard {
    fn start(mop_exe: &Path, task_id: &str) -> Result<Guard> {
        use std::os::unix::process::CommandExt;
        if let Some(pipe) = sys::fork_guard(task_id).context("cannot start the guard")? {
            return Ok(Guard { pipe: Some(pipe) });
        }
        let (read, write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).context("cannot create the guard's pipe")?;
        Command::new(mop_exe)
            .args(["__guard", "--task-id", task_id])
            .env_clear()
            .stdin(std::process::Stdio::from(read))
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the guard process (mop __guard)")?;
        Ok(Guard {
            pipe: Some(std::fs::File::from(write)),
        })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        use std::io::Write;
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(&[crate::guard::DONE]);
        }
    }
}

/// A profile's `[limits]` as resource limits for the sandbox.
/// The profile's limits in force ([`mop_proto::Limits::effective`]), each at most the
/// runner's own hard limit (only root could raise that; the runner's limit is the stricter
/// one then). A value the profile names that the runner's limit cuts is said once.
fn rlimits(l: &mop_proto::Limits) -> Vec<(nix::sys::resource::Resource, u64)> {
    use nix::sys::resource::{Resource, getrlimit};
    let e = l.effective();
    [
        (Resource::RLIMIT_NPROC, "nproc", Some(e.nproc), l.nproc),
        (
            Resource::RLIMIT_AS,
            "address_space_bytes",
            e.address_space_bytes,
            l.address_space_bytes,
        ),
        (
            Resource::RLIMIT_DATA,
            "data_bytes",
            Some(e.data_bytes),
            l.data_bytes,
        ),
        (
            Resource::RLIMIT_NOFILE,
            "open_files",
            Some(e.open_files),
            l.open_files,
        ),
    ]
    .into_iter()
    .filter_map(|(resource, key, value, named)| {
        let value = value?;
        let hard = getrlimit(resource).map_or(u64::MAX, |(_, hard)| hard);
        if named.is_some() && value > hard {
            eprintln!(
                "mop: note: the profile's limits.{key} = {value} is above the runner's own hard limit; {hard} applies"
            );
        }
        Some((resource, value.min(hard)))
    })
    .collect()
}

/// What a pipe holds now, without waiting for writers that may linger.
fn read_available(fd: std::os::fd::OwnedFd) -> Vec<u8> {
    let _ = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    let mut buf = Vec::new();
    let _ = std::fs::File::from(fd).read_to_end(&mut buf);
    buf
}

fn unsandboxed(
    rt: &tokio::runtime::Runtime,
    plan: &Plan,
    workdir: &Path,
    a: &RunArgs,
) -> Result<ExitCode> {
    let mut env = task_env(&plan.profile, &plan.task_id, workdir, a)?;
    // Saved copies go to a private directory removed when the run ends, as the sandbox's
    // tmpfs would be.
    let saved = tempfile::Builder::new()
        .prefix("mop-saved-")
        .tempdir()
        .context("cannot create a directory for saved cards")?;
    for (k, v) in env.iter_mut() {
        let host_path = match k.as_str() {
            env::AGENT_SOCKET => &plan.agent_socket,
            env::MEMORY_DIR => &plan.view_dir,
            env::MEMORY_MD => &plan.memory_md,
            env::SAVED_DIR => saved.path(),
            _ => continue,
        };
        *v = host_path.display().to_string();
    }
    let (cmd, args) = a.command.split_first().context("no command given")?;
    let status = Command::new(cmd)
        .args(args)
        .env_clear()
        .envs(env)
        .current_dir(workdir)
        .status()
        .with_context(|| format!("cannot run {}", cmd.to_string_lossy()))?;
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
        .clamp(0, 255);
    // Nothing is captured without a sandbox (nothing was primed); the ending is kept.
    let ending = FinishRequest {
        outcome: Some(Outcome::of_exit(code)),
        exit_code: Some(code),
        ..Default::default()
    };
    if let Err(e) = rt.block_on(Control::new(&a.socket).finish(&plan.task_id, &ending)) {
        eprintln!(
            "mop: warning: cannot record how task {} ended ({e}); its receipt lacks it",
            plan.task_id
        );
    }
    Ok(ExitCode::from(code as u8))
}
