//! `mopd`: the mop host daemon and its operator commands.

mod demo;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use mop_proto::control::{Control, ControlError, VerifyReply};
use mop_proto::status::SyncResult;
use mopd::config::{DEFAULT_CONFIG, MopdConfig};

#[derive(Parser)]
#[command(
    name = "mopd",
    version,
    about = "The mop host daemon: keeps a verified local pool of each workspace's memory cards",
    long_about = "The mop host daemon: keeps a verified local pool of each workspace's memory cards, \
                  synced from mop-server, and serves task views to agent runners.\n\n\
                  `mopd run` is what systemd starts; `mopd status` tells whether all is well and \
                  what to do when it is not."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon in the foreground (as systemd does).
    Run {
        /// Config file.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Show whether all is well. Exit 0 healthy, 1 degraded, 2 daemon unreachable.
    Status {
        /// Print the versioned JSON report.
        #[arg(long)]
        json: bool,
        /// Control socket [default: <runtime_dir>/mopd.sock from the config, else /run/mopd/mopd.sock].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Config file (to find the socket).
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Sync workspaces now and wait for the result.
    Sync {
        /// Workspaces [default: all the daemon serves].
        workspaces: Vec<String>,
        /// Control socket.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Config file.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Re-hash the pools and report damage; --repair fetches bad or missing objects again
    /// and publishes a rebuilt generation. Asks the running daemon, or works directly when
    /// it is not running. Exit 0 clean or repaired, 1 damage left.
    Verify {
        /// Fix what is found.
        #[arg(long)]
        repair: bool,
        /// Only this workspace.
        #[arg(long)]
        workspace: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Config file.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Show the whole system working on this machine, with no configuration: an embedded
    /// card server on loopback seeded with example cards, a daemon, and one example task
    /// run in a bubblewrap sandbox. Everything lives in a temporary directory that is
    /// removed at the end. Needs `mop` next to `mopd`.
    Demo {
        /// Keep the temporary directory (config, logs, pool) for a look afterwards.
        #[arg(long)]
        keep: bool,
    },
    /// Acknowledge a new server epoch so status stops warning about it.
    AckEpoch {
        /// Workspace.
        workspace: String,
        /// Control socket.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Config file.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
}

fn socket_for(socket: Option<PathBuf>, config: &Path) -> PathBuf {
    socket.unwrap_or_else(|| {
        MopdConfig::load(config)
            .map(|c| c.socket_path())
            .unwrap_or_else(|_| PathBuf::from("/run/mopd/mopd.sock"))
    })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mopd: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Run { config } => {
            mopd::sys::tune_malloc();
            mop_log::init("info");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(mopd::daemon::run(config))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { keep } => {
            let ok = demo::run(&demo::DemoOptions { keep })?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Status {
            json,
            socket,
            config,
        } => status_command(json, socket_for(socket, &config)),
        Command::Sync {
            workspaces,
            socket,
            config,
        } => {
            let control = Control::new(socket_for(socket, &config));
            let rt = runtime()?;
            // All of them: the daemon knows which (its configuration may be unreadable here).
            let wanted = if workspaces.is_empty() {
                rt.block_on(control.status())?
                    .workspaces
                    .into_iter()
                    .map(|w| w.workspace)
                    .collect()
            } else {
                workspaces
            };
            let mut failed = false;
            for ws in wanted {
                match rt.block_on(control.sync(&ws)) {
                    Ok(reply) if reply.result == SyncResult::Failed => {
                        failed = true;
                        println!(
                            "{ws}: sync failed: {}",
                            reply.message.as_deref().unwrap_or("")
                        );
                    }
                    Ok(reply) => println!(
                        "{ws}: {}",
                        match reply.result {
                            SyncResult::Modified => "modified",
                            _ => "not modified",
                        }
                    ),
                    Err(ControlError::Answered { message, .. }) => {
                        failed = true;
                        println!("{ws}: {message}");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::AckEpoch {
            workspace,
            socket,
            config,
        } => {
            let control = Control::new(socket_for(socket, &config));
            match runtime()?.block_on(control.ack_epoch(&workspace)) {
                Ok(_) => {
                    println!("{workspace}: new server epoch acknowledged");
                    Ok(ExitCode::SUCCESS)
                }
                Err(ControlError::Answered { message, .. }) => {
                    eprintln!("mopd: {message}");
                    Ok(ExitCode::FAILURE)
                }
                Err(e) => Err(e.into()),
            }
        }
        Command::Verify {
            repair,
            workspace,
            json,
            config,
        } => verify(&config, repair, workspace, json),
    }
}

fn verify(config_path: &Path, repair: bool, only: Option<String>, json: bool) -> Result<ExitCode> {
    let config = MopdConfig::load(config_path)?;
    let rt = runtime()?;
    let control = Control::new(config.socket_path());
    let status = rt.block_on(control.status()).ok();
    let daemon_up = status.is_some();
    // The configured workspaces, and (the daemon knows them) the pools they inherit;
    // those that inherit others last, since their repair links the inherited objects.
    let mut known = config.sync.workspaces.clone();
    let mut inheriting = Vec::new();
    for w in status.iter().flat_map(|s| &s.workspaces) {
        if !known.contains(&w.workspace) {
            known.push(w.workspace.clone());
        }
        if !w.inherits.is_empty() {
            inheriting.push(w.workspace.clone());
        }
    }
    known.sort_by_key(|w| inheriting.contains(w));
    let workspaces: Vec<String> = match only {
        Some(ws) if known.contains(&ws) => vec![ws],
        Some(ws) => anyhow::bail!(
            "workspace {ws} is not in sync.workspaces of {} (nor inherited by one of them)",
            config_path.display()
        ),
        None => known,
    };
    let mut results: Vec<VerifyReply> = Vec::new();
    for ws in &workspaces {
        if daemon_up {
            // The daemon knows which generations tasks pin: let it do the work.
            let reply = rt
                .block_on(control.verify(ws, repair))
                .with_context(|| format!("{ws}: verify failed"))?;
            results.push(reply);
        } else {
            let token = if repair {
                mopd::client::read_token(&config.server.token_file).map_err(anyhow::Error::msg)?
            } else {
                String::new()
            };
            let client = mopd::client::ServerClient::for_config(&config.server, token)
                .map_err(anyhow::Error::msg)?;
            let state = Arc::new(mopd::state::State::new(
                config.clone(),
                Arc::new(client),
                config_path.to_owned(),
            ));
            let syncer = mopd::sync::Syncer::open(&state, ws)?;
            let (report, repaired_generation) = rt
                .block_on(syncer.verify(repair))
                .map_err(|f| anyhow::anyhow!("{ws}: {}", f.message))?;
            results.push(VerifyReply {
                workspace: ws.clone(),
                report,
                repaired_generation,
            });
        }
    }
    let mut damage_left = false;
    for VerifyReply {
        workspace: ws,
        report,
        repaired_generation: repaired,
    } in &results
    {
        let fixed = repaired.is_some();
        if !report.is_clean() && !fixed {
            damage_left = true;
        }
        if json {
            continue;
        }
        if report.is_clean() {
            println!(
                "{ws}: ok — {} objects verified, generation {}",
                report.objects_checked,
                report.current.as_deref().unwrap_or("none")
            );
        } else {
            println!(
                "{ws}: DAMAGED — {} bad object(s) quarantined, {} missing, {} damaged file(s)",
                report.bad_objects.len(),
                report.missing_objects.len(),
                report.damaged_files.len()
            );
            for sha in &report.bad_objects {
                println!("  bad object {sha}");
            }
            for f in report.damaged_files.iter().take(20) {
                println!("  damaged {f}");
            }
            match repaired {
                Some(g) => println!("  repaired: fetched again and published generation {g}"),
                None => println!("  → mopd verify --repair --workspace {ws}"),
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(if damage_left {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `mopd status`: the daemon's report, for people or as JSON; exit 2 when the daemon
/// cannot be asked.
fn status_command(json: bool, socket: PathBuf) -> Result<ExitCode> {
    let control = Control::new(socket);
    let report = match runtime()?.block_on(control.status()) {
        Ok(r) => r,
        Err(e @ (ControlError::Answered { .. } | ControlError::Unreadable(_))) => {
            eprintln!("mopd: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => {
            if json {
                let kind = match &e {
                    ControlError::Missing(_) => "socket_missing",
                    ControlError::Refused(_) => "socket_refusing",
                    ControlError::Denied(_) => "permission_denied",
                    _ => "error",
                };
                println!(
                    "{}",
                    serde_json::json!({ "schema": mop_proto::status::STATUS_SCHEMA, "reachable": false, "reason": kind, "message": e.to_string() })
                );
            } else {
                println!("mopd: UNREACHABLE — {e}");
            }
            return Ok(ExitCode::from(2));
        }
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!(
            "{}",
            mopd::status::render::render(&report, jiff::Timestamp::now())
        );
    }
    Ok(ExitCode::from(
        mopd::status::render::exit_code(&report) as u8
    ))
}
