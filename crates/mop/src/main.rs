//! `mop`: the command line of mop.
//!
//! For runners: `mop prepare`, `mop run`, `mop release`, `mop renew`, `mop tasks`,
//! `mop receipt`,
//! `mop doctor`, `mop prime`. For agents inside a sandbox: `mop memory
//! retrieve|get|list|store`, and `mop mcp` for agent CLIs that take tools over MCP.

mod capture;
mod confine;
mod control;
mod doctor;
mod guard;
mod memory;
mod run;
mod sandbox;
mod sys;
mod workdir;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use mop_proto::control::Control;
use mop_proto::{AgentKind, LeaseKind, LeaseRequest, Plan, PrepareRequest};

use control::{Daemon, TaskArgs, prepare, refused, release, runtime};

#[derive(Parser)]
#[command(
    name = "mop",
    version,
    about = "Memory for AI agent tasks: prepare a task's memory view and run agents in a bubblewrap sandbox",
    long_about = "Memory for AI agent tasks.\n\nRunners: `mop run --workspace W --title T -- CMD` prepares the task's \
                  memory view (the cards it may see, and a MEMORY.md index), runs CMD in a bubblewrap sandbox \
                  where the view is mounted read-only, and releases the view when CMD exits. `mop doctor` checks \
                  that bubblewrap works for you.\n\nAgents (inside the sandbox): `mop memory retrieve`, `get`, \
                  `list`, `store`, or the same as MCP tools with `mop mcp`.\n\nAgent CLIs: `mop run --agent claude -- claude` \
                  (or codex) writes what the CLI loads (its instruction file importing the task's MEMORY.md, and \
                  `mop mcp` as its MCP server) into a sandbox-private home; `mop prime` prints the instructions \
                  for runners that build their own prompt."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Prepare a task's memory view and print the plan (the view lives until released or
    /// its TTL passes).
    Prepare {
        #[command(flatten)]
        task: TaskArgs,
        /// The agent CLI the task will run (generic, claude, codex): cards bound to that
        /// kind of agent join it [default: the profile's `agent`].
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(AgentKind::NAMES))]
        agent: Option<String>,
        /// Lease lifetime in seconds [default: the daemon's tasks.lease_ttl_secs].
        #[arg(long)]
        ttl: Option<u64>,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        daemon: Daemon,
    },
    /// Prepare a task, run CMD in a bubblewrap sandbox with the memory view mounted
    /// read-only, release the view when CMD exits, and exit with CMD's status. When CMD
    /// never started: 120 (mop run's own checks), 121 (mopd unreachable), 122 (the task
    /// refused), 123 (mopd failed to prepare it), 125 (the sandbox could not be set up).
    Run {
        #[command(flatten)]
        task: TaskArgs,
        /// Working directory, bound read-write [default: the current directory].
        #[arg(long)]
        workdir: Option<PathBuf>,
        /// Pass an environment variable: NAME (from this environment) or NAME=VALUE.
        #[arg(long = "env")]
        envs: Vec<String>,
        /// The agent needs its controlling terminal (a terminal UI): keep the runner's session
        /// instead of --new-session. TIOCSTI stays blocked by the sandbox's seccomp filter.
        /// On by default for `--agent claude|codex` when stdin is a terminal.
        #[arg(long)]
        interactive: bool,
        /// The agent CLI the task runs: claude or codex get their instruction file and `mop
        /// mcp` as MCP server in a sandbox-private HOME; generic gets only MOP_MEMORY_MD
        /// [default: the profile's `agent`, else generic].
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(AgentKind::NAMES))]
        agent: Option<String>,
        /// Run without any sandbox (development only; warns every time).
        #[arg(long)]
        no_sandbox_dev_only: bool,
        /// Prepare, print the plan and the bwrap command line as JSON, release; run nothing.
        #[arg(long)]
        dry_run: bool,
        /// Turn the agent CLI's own memory off for this task instead of capturing it
        /// (capture is on by default, or as the profile's `capture.native_memory` says:
        /// with --agent claude, what Claude Code's auto memory wrote becomes the task's
        /// stores when it ends).
        #[arg(long)]
        no_capture: bool,
        #[command(flatten)]
        daemon: Daemon,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Release a prepared task: its view and agent socket go.
    Release {
        /// The task.
        #[arg(long)]
        task_id: String,
        /// How the task ended, by your judgement: recorded in its receipt, where curators
        /// see per card how the tasks it was given to ended.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["success", "failure", "unknown"]))]
        outcome: Option<String>,
        #[command(flatten)]
        daemon: Daemon,
    },
    /// Extend a prepared task's lease.
    Renew {
        /// The task.
        #[arg(long)]
        task_id: String,
        /// New lifetime from now, in seconds.
        #[arg(long)]
        ttl: Option<u64>,
        #[command(flatten)]
        daemon: Daemon,
    },
    /// Show a task's receipt: the generation and profile it got, each card it was given
    /// (tier, rank, mounted or also listed in MEMORY.md), and what its agent did (searches
    /// as query hashes, cards read, stores and their outcome). The live receipt while the
    /// task runs, else the newest one kept on this host.
    Receipt {
        /// The task.
        task_id: String,
        /// Print the receipt as JSON (schema `mop.receipt/1`, documented in README.md).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        daemon: Daemon,
    },
    /// List live tasks.
    Tasks {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        daemon: Daemon,
    },
    /// Check that bubblewrap works for you, and say how to fix it if not.
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        daemon: Daemon,
    },
    /// Print the instructions an agent follows with its memory (the same text `mop run
    /// --agent` writes), for runners that build their own system prompt.
    Prime {
        /// The agent: claude and codex have the MCP tools, generic uses `mop memory` in a shell.
        #[arg(long, default_value = "generic", value_parser = clap::builder::PossibleValuesParser::new(AgentKind::NAMES))]
        agent: String,
    },
    /// Inside a task's sandbox: serve the task's memory over MCP on stdin/stdout (tools
    /// memory_retrieve, memory_get, memory_list, memory_store; resources MEMORY.md and the
    /// mounted cards). Agent CLIs start it themselves once `mop run --agent` configured it.
    Mcp,
    /// Inside a task's sandbox: search, read and propose memory.
    Memory {
        #[command(subcommand)]
        command: MemoryCommand,
    },
    /// Started by `mop run` for itself: ends the task's sandbox if `mop run` dies.
    #[command(name = "__guard", hide = true)]
    Guard {
        /// The task.
        #[arg(long)]
        task_id: String,
    },
}

#[derive(Subcommand)]
enum MemoryCommand {
    /// Search every card this task may see (mounted or not).
    Retrieve {
        /// What to look for.
        query: String,
        /// Most results.
        #[arg(long)]
        limit: Option<usize>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print one card (or save a copy in $MOP_SAVED_DIR, the task's own /run/mop/saved).
    Get {
        /// Card id.
        id: String,
        /// Save to $MOP_SAVED_DIR/<id>.md (mode 0600, gone when the task ends) instead of
        /// printing.
        #[arg(long)]
        save: bool,
    },
    /// List the cards mounted in the memory directory.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Propose a new card (stored unverified until a person reviews it). The answer is
    /// one of: created, reinforced (the same lesson as a card this task can see),
    /// unchanged, or queued (the server is away; this host keeps it and sends it later:
    /// follow it with `store-status`). A card carrying a credential, or a lesson a curator
    /// rejected, is refused with the reason.
    Store(memory::StoreArgs),
    /// Say whether a card you were given held: helped, wrong or outdated (once per card;
    /// a later verdict replaces the earlier one). Curators see the verdicts with the card;
    /// they never change what tasks are given.
    Feedback {
        /// Card id (a card this task can see).
        id: String,
        /// helped, wrong or outdated.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(["helped", "wrong", "outdated"]))]
        verdict: String,
        /// What you found, in a sentence (at most 500 characters; a credential is refused).
        #[arg(long)]
        note: Option<String>,
    },
    /// Where a queued store stands: still queued, stored (and as what), refused (and why)
    /// or dropped.
    StoreStatus {
        /// The store id a `queued` answer gave.
        store_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mop: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A receipt for people: one line per card and per agent action.
fn render_receipt(r: &mop_proto::receipts::Receipt) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let ended = r
        .ended_at
        .map_or_else(|| "still running".to_owned(), |t| format!("ended {t}"));
    let _ = writeln!(out, "task {} in {} on {}", r.task_id, r.workspace, r.host);
    let _ = writeln!(
        out,
        "  prepared {}, {ended}; generation {}, profile {}",
        r.prepared_at, r.generation, r.profile
    );
    let who = [
        r.user_id.as_deref().map(|u| format!("user {u}")),
        r.asset_id.as_deref().map(|a| format!("asset {a}")),
        r.project_id.as_deref().map(|p| format!("project {p}")),
        r.agent.as_deref().map(|a| format!("agent {a}")),
    ];
    let who: Vec<String> = who.into_iter().flatten().collect();
    if !who.is_empty() {
        let _ = writeln!(out, "  for {}", who.join(", "));
    }
    let left: usize = r.left_out.iter().sum();
    let _ = writeln!(
        out,
        "cards: {} mounted{}",
        r.cards.len(),
        if left > 0 {
            format!(", {left} more selected but left out by the mount cap")
        } else {
            String::new()
        }
    );
    for c in &r.cards {
        let _ = writeln!(
            out,
            "  {:>3}. {}  {}  {}  sha256 {}",
            c.rank,
            c.tier,
            c.id,
            if c.listed { "listed" } else { "mounted" },
            &c.sha256[..12.min(c.sha256.len())]
        );
    }
    let a = &r.activity;
    let _ = writeln!(
        out,
        "agent: {} retrieves, {} gets, {} stores{}",
        a.retrieves.len(),
        a.gets.len(),
        a.stores.len(),
        if a.unlisted > 0 {
            format!(" ({} more not listed)", a.unlisted)
        } else {
            String::new()
        }
    );
    for e in &a.retrieves {
        let _ = writeln!(
            out,
            "  {} retrieve query {} -> {} hits",
            e.at,
            &e.query_hash[..12.min(e.query_hash.len())],
            e.hits.len()
        );
    }
    for e in &a.gets {
        let _ = writeln!(
            out,
            "  {} get {}{}",
            e.at,
            e.id,
            if e.found { "" } else { " (not found)" }
        );
    }
    for e in &a.stores {
        let id = e.id.map(|i| format!(" {i}")).unwrap_or_default();
        let status = e.status.map(|s| format!(" ({s})")).unwrap_or_default();
        let code = e
            .code
            .as_deref()
            .map(|c| format!(" {c}"))
            .unwrap_or_default();
        let by = if e.captured { " captured" } else { "" };
        let _ = writeln!(out, "  {} store{by} {}{id}{status}{code}", e.at, e.outcome);
    }
    for f in &a.feedback {
        let note = if f.note.is_some() {
            " (with a note)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {} feedback {} {}{note}",
            f.at,
            f.id,
            f.verdict.as_str()
        );
    }
    if let Some(o) = r.outcome {
        let code = r
            .exit_code
            .map(|c| format!(" (exit {c})"))
            .unwrap_or_default();
        let _ = writeln!(out, "outcome: {}{code}", o.as_str());
    }
    if let Some(c) = &r.capture {
        let _ = writeln!(out, "{}", capture::line(c, &a.stores));
        for w in &c.workdir_edits {
            let _ = writeln!(out, "  working directory: {} {}", w.file, w.change);
        }
    }
    out
}

fn print_plan(plan: &Plan) {
    println!(
        "task       {} (workspace {}, revision {})",
        plan.task_id, plan.workspace, plan.revision
    );
    println!("view       {}", plan.view_dir.display());
    println!("MEMORY.md  {}", plan.memory_md.display());
    println!("agent      {}", plan.agent_socket.display());
    println!(
        "profile    {} (memory dir {})",
        plan.profile.name, plan.profile.memory_dir
    );
    match (plan.lease.kind, plan.expires_at) {
        (LeaseKind::Ttl, Some(at)) => println!(
            "lease      until {at} (mop renew --task-id {} extends it)",
            plan.task_id
        ),
        _ => println!(
            "lease      while pid {} runs",
            plan.lease.pid.unwrap_or_default()
        ),
    }
    println!(
        "cards      {} mounted of {} selected (L0 {}, L1 {}, L2 {})",
        plan.cards.len(),
        plan.selected.iter().sum::<usize>(),
        plan.selected[0],
        plan.selected[1],
        plan.selected[2]
    );
}

/// `mop prepare`: a task's view for a runner that starts its own sandbox.
fn prepare_command(
    task: &TaskArgs,
    agent: Option<String>,
    ttl: Option<u64>,
    json: bool,
    daemon: &Daemon,
) -> Result<ExitCode> {
    let id = task
        .task_id
        .clone()
        .context("--task-id is required for mop prepare")?;
    let mut context = task.context(|| id.clone());
    context.agent = agent;
    let req = PrepareRequest {
        task: context,
        lease: LeaseRequest::Ttl { ttl_secs: ttl },
        profile: task.profile.clone(),
        workdir: None,
    };
    req.task.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let plan = runtime()?.block_on(prepare(&daemon.socket(), &req))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print_plan(&plan);
    }
    Ok(ExitCode::SUCCESS)
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Prepare {
            task,
            agent,
            ttl,
            json,
            daemon,
        } => prepare_command(&task, agent, ttl, json, &daemon),
        Command::Run {
            task,
            workdir,
            envs,
            interactive,
            agent,
            no_sandbox_dev_only,
            dry_run,
            no_capture,
            daemon,
            command,
        } => run::run(run::RunArgs {
            task,
            workdir,
            envs,
            interactive,
            agent: agent.map(|a| a.parse().expect("clap checked the name")),
            no_sandbox: no_sandbox_dev_only,
            dry_run,
            no_capture,
            socket: daemon.socket(),
            command,
        })
        .or_else(|e| {
            // Before the command started: a status of its own, never the agent's.
            eprintln!("mop: error: {e:#}");
            Ok(ExitCode::from(run::failure_status(&e)))
        }),
        Command::Release {
            task_id,
            outcome,
            daemon,
        } => {
            let rt = runtime()?;
            if let Some(outcome) = outcome {
                let req = mop_proto::control::FinishRequest {
                    outcome: Some(outcome.parse().map_err(anyhow::Error::msg)?),
                    ..Default::default()
                };
                rt.block_on(Control::new(daemon.socket()).finish(&task_id, &req))
                    .map_err(refused(format!(
                        "recording the outcome of task {task_id} failed"
                    )))?;
            }
            rt.block_on(release(&daemon.socket(), &task_id))?;
            println!("released task {task_id}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Renew {
            task_id,
            ttl,
            daemon,
        } => {
            let info = runtime()?
                .block_on(Control::new(daemon.socket()).renew(&task_id, ttl))
                .map_err(refused(format!("renew of task {task_id} failed")))?;
            println!(
                "task {task_id} renewed until {}",
                info.expires_at.map_or("?".into(), |t| t.to_string())
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Tasks { json, daemon } => tasks_command(json, &daemon),
        Command::Receipt {
            task_id,
            json,
            daemon,
        } => {
            let receipt = runtime()?
                .block_on(Control::new(daemon.socket()).receipt(&task_id))
                .map_err(refused(format!("receipt of task {task_id}")))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&receipt)?);
            } else {
                print!("{}", render_receipt(&receipt));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Guard { task_id } => Ok(guard::run(&task_id)),
        Command::Doctor { json, daemon } => doctor_command(json, &daemon),
        Command::Prime { agent } => {
            let agent: AgentKind = agent.parse().map_err(anyhow::Error::msg)?;
            print!(
                "{}",
                mop_agent::prime::contract(agent != AgentKind::Generic)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp => mcp_command(),
        Command::Memory { command } => memory_command(command),
    }
}

/// `mop tasks`: the live tasks of the daemon.
fn tasks_command(json: bool, daemon: &Daemon) -> Result<ExitCode> {
    let tasks = runtime()?
        .block_on(Control::new(daemon.socket()).tasks())
        .map_err(refused("listing tasks failed".into()))?;
    if json {
        println!("{}", serde_json::to_string(&tasks)?);
    } else {
        if tasks.is_empty() {
            println!("no live tasks");
        }
        for t in tasks {
            println!(
                "{}  {}  revision {}  {}  uid {}",
                t.task_id, t.workspace, t.revision, t.lease.kind, t.owner_uid
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `mop doctor`: probes bubblewrap and the kernel's confinement, and says what to fix.
fn doctor_command(json: bool, daemon: &Daemon) -> Result<ExitCode> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let report = doctor::probe(&cwd);
    let socket = daemon.socket();
    // The daemon is the other half of `mop run`: reachable, and answering as the runner.
    let mopd = match runtime()?.block_on(Control::new(&socket).status()) {
        Ok(s) => Ok(format!(
            "answers at {} ({} workspace{})",
            socket.display(),
            s.workspaces.len(),
            if s.workspaces.len() == 1 { "" } else { "s" }
        )),
        Err(e) => Err(format!(
            "{e}; if mopd's socket is elsewhere, pass --socket PATH or set MOP_SOCKET (mop reads mopd's paths.runtime_dir from --mopd-config when it can)"
        )),
    };
    let ok = report.ok && mopd.is_ok();
    if json {
        let mut v = serde_json::to_value(&report)?;
        v["ok"] = ok.into();
        v["daemon"] = serde_json::json!({
            "socket": socket,
            "reachable": mopd.is_ok(),
            "detail": mopd.as_ref().unwrap_or_else(|e| e),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if report.ok {
            println!(
                "mop doctor: {} — {} ({}) runs sandboxes with mop's flags for you",
                if ok { "ok" } else { "PROBLEM with mopd" },
                report
                    .bwrap
                    .as_ref()
                    .map_or("bwrap".into(), |b| b.display().to_string()),
                report.version.as_deref().unwrap_or("unknown version")
            );
        } else {
            println!(
                "mop doctor: PROBLEM — {}",
                report.problem.as_deref().unwrap_or("unknown")
            );
            println!("  fix: {}", report.fix.as_deref().unwrap_or("-"));
        }
        match &mopd {
            Ok(line) => println!("  mopd: {line}"),
            Err(why) => println!("  mopd: UNREACHABLE — {why}"),
        }
        println!("  abstract sockets: {}", report.abstract_sockets.detail);
        println!("  TCP ports: {}", report.tcp_ports.detail);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `mop mcp`: the task's memory as MCP tools on stdin and stdout.
fn mcp_command() -> Result<ExitCode> {
    let var = |k: &str, default: &str| {
        std::env::var_os(k).map_or_else(|| PathBuf::from(default), PathBuf::from)
    };
    let memory = mop_agent::mcp::SandboxMemory::new(
        var(
            mop_proto::inside::env::AGENT_SOCKET,
            mop_proto::inside::AGENT_SOCKET,
        ),
        var(
            mop_proto::inside::env::MEMORY_DIR,
            mop_proto::inside::MEMORY_DIR,
        ),
    );
    runtime()?
        .block_on(mop_agent::mcp::serve_stdio(
            memory,
            mop_agent::mcp::TaskScope::from_env(),
        ))
        .map_err(|e| anyhow::anyhow!("mop mcp: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// `mop memory …`: an agent's calls on its task's memory.
fn memory_command(command: MemoryCommand) -> Result<ExitCode> {
    let rt = runtime()?;
    match command {
        MemoryCommand::Retrieve { query, limit, json } => {
            rt.block_on(memory::retrieve(&query, limit, json))?
        }
        MemoryCommand::Get { id, save } => rt.block_on(memory::get(&id, save))?,
        MemoryCommand::List { json } => rt.block_on(memory::list(json))?,
        MemoryCommand::Feedback { id, verdict, note } => rt.block_on(memory::feedback(
            &id,
            verdict.parse().map_err(anyhow::Error::msg)?,
            note,
        ))?,
        MemoryCommand::StoreStatus { store_id, json } => {
            rt.block_on(memory::store_status(&store_id, json))?
        }
        MemoryCommand::Store(args) => {
            rt.block_on(memory::store(args, mop_agent::mcp::TaskScope::from_env()))?
        }
    }
    Ok(ExitCode::SUCCESS)
}
