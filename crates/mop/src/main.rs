//! `mop`: the command line of mop.
//!
//! For runners: `mop prepare`, `mop run`, `mop release`, `mop renew`, `mop tasks`,
//! `mop receipt`,
//! `mop doctor`, `mop prime`. For agents inside a sandbox: `mop memory
//! retrieve|get|list|store`, and `mop mcp` for agent CLIs that take tools over MCP.

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
    /// read-only, release the view when CMD exits, and exit with CMD's status (125 when
    /// the sandbox could not be set up).
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
        let _ = writeln!(out, "  {} store {}{id}{status}", e.at, e.outcome);
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

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Prepare {
            task,
            ttl,
            json,
            daemon,
        } => {
            let id = task
                .task_id
                .clone()
                .context("--task-id is required for mop prepare")?;
            let req = PrepareRequest {
                task: task.context(|| id.clone()),
                lease: LeaseRequest::Ttl { ttl_secs: ttl },
                profile: task.profile.clone(),
                workdir: None,
            };
            req.task.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
            let plan = runtime()?.block_on(prepare(&daemon.socket, &req))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&plan)?);
            } else {
                print_plan(&plan);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            task,
            workdir,
            envs,
            interactive,
            agent,
            no_sandbox_dev_only,
            dry_run,
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
            socket: daemon.socket,
            command,
        }),
        Command::Release { task_id, daemon } => {
            runtime()?.block_on(release(&daemon.socket, &task_id))?;
            println!("released task {task_id}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Renew {
            task_id,
            ttl,
            daemon,
        } => {
            let info = runtime()?
                .block_on(Control::new(&daemon.socket).renew(&task_id, ttl))
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
                .block_on(Control::new(&daemon.socket).receipt(&task_id))
                .map_err(refused(format!("receipt of task {task_id}")))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&receipt)?);
            } else {
                print!("{}", render_receipt(&receipt));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Guard { task_id } => Ok(guard::run(&task_id)),
        Command::Doctor { json } => doctor_command(json),
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
        .block_on(Control::new(&daemon.socket).tasks())
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
fn doctor_command(json: bool) -> Result<ExitCode> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let report = doctor::probe(&cwd);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if report.ok {
        println!(
            "mop doctor: ok — {} ({}) runs sandboxes with mop's flags for you",
            report
                .bwrap
                .as_ref()
                .map_or("bwrap".into(), |b| b.display().to_string()),
            report.version.as_deref().unwrap_or("unknown version")
        );
        println!("  abstract sockets: {}", report.abstract_sockets.detail);
        println!("  TCP ports: {}", report.tcp_ports.detail);
    } else {
        println!(
            "mop doctor: PROBLEM — {}",
            report.problem.as_deref().unwrap_or("unknown")
        );
        println!("  fix: {}", report.fix.as_deref().unwrap_or("-"));
        println!("  abstract sockets: {}", report.abstract_sockets.detail);
        println!("  TCP ports: {}", report.tcp_ports.detail);
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `mop mcp`: the task's memory as MCP tools on stdin and stdout.
fn mcp_command() -> Result<ExitCode> {
    let (user, asset) = memory::task_scope_from_env();
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
            mop_agent::mcp::TaskScope { user, asset },
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
        MemoryCommand::StoreStatus { store_id, json } => {
            rt.block_on(memory::store_status(&store_id, json))?
        }
        MemoryCommand::Store(args) => {
            let (user, task_asset) = memory::task_scope_from_env();
            rt.block_on(memory::store(args, user, task_asset))?
        }
    }
    Ok(ExitCode::SUCCESS)
}
