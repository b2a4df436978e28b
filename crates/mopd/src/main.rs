//! `mopd`: the mop host daemon and its operator commands.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use mopd::config::{DEFAULT_CONFIG, MopdConfig};
use mopd::control::{ControlError, request};
use mopd::pool::{Pool, VerifyReport};
use mopd::status::StatusReport;

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
        /// Workspaces [default: all configured].
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
            mopd::pool::limit_malloc_arenas();
            mop_log::init("info");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(mopd::daemon::run(config))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { keep } => {
            let ok = mopd::demo::run(&mopd::demo::DemoOptions { keep })?;
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
        } => {
            let socket = socket_for(socket, &config);
            let answer = runtime()?.block_on(request(&socket, "GET", "/v1/status", None));
            let body = match answer {
                Ok((200, body)) => body,
                Ok((code, body)) => {
                    eprintln!(
                        "mopd: the daemon answered {code}: {}",
                        String::from_utf8_lossy(&body)
                    );
                    return Ok(ExitCode::from(2));
                }
                Err(e) => {
                    if json {
                        let kind = match &e {
                            ControlError::Missing(_) => "socket_missing",
                            ControlError::Refused(_) => "socket_refusing",
                            ControlError::Denied(_) => "permission_denied",
                            ControlError::Other { .. } => "error",
                        };
                        println!(
                            "{}",
                            serde_json::json!({ "schema": mopd::status::STATUS_SCHEMA, "reachable": false, "reason": kind, "message": e.to_string() })
                        );
                    } else {
                        println!("mopd: UNREACHABLE — {e}");
                    }
                    return Ok(ExitCode::from(2));
                }
            };
            let report: StatusReport = serde_json::from_slice(&body)
                .context("the daemon's status report is unreadable")?;
            if json {
                println!("{}", String::from_utf8_lossy(&body));
            } else {
                print!("{}", report.render(jiff::Timestamp::now()));
            }
            Ok(ExitCode::from(report.exit_code() as u8))
        }
        Command::Sync {
            workspaces,
            socket,
            config,
        } => {
            let wanted = if workspaces.is_empty() {
                MopdConfig::load(&config)?.sync.workspaces
            } else {
                workspaces
            };
            let socket = socket_for(socket, &config);
            let rt = runtime()?;
            let mut failed = false;
            for ws in wanted {
                let (code, body) = rt.block_on(request(
                    &socket,
                    "POST",
                    &format!("/v1/workspaces/{ws}/sync"),
                    None,
                ))?;
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if code != 200 {
                    failed = true;
                    println!("{ws}: {}", v["message"].as_str().unwrap_or("failed"));
                } else if v["result"] == "failed" {
                    failed = true;
                    println!("{ws}: sync failed: {}", v["message"].as_str().unwrap_or(""));
                } else {
                    println!(
                        "{ws}: {}",
                        v["result"].as_str().unwrap_or("?").replace('_', " ")
                    );
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
            let socket = socket_for(socket, &config);
            let (code, body) = runtime()?.block_on(request(
                &socket,
                "POST",
                &format!("/v1/workspaces/{workspace}/ack-epoch"),
                None,
            ))?;
            if code == 200 {
                println!("{workspace}: new server epoch acknowledged");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("mopd: {}", String::from_utf8_lossy(&body));
                Ok(ExitCode::FAILURE)
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
    let workspaces: Vec<String> = match only {
        Some(ws) if config.sync.workspaces.contains(&ws) => vec![ws],
        Some(ws) => anyhow::bail!(
            "workspace {ws} is not in sync.workspaces of {}",
            config_path.display()
        ),
        None => config.sync.workspaces.clone(),
    };
    let rt = runtime()?;
    let body = serde_json::to_vec(&serde_json::json!({ "repair": repair }))?;
    let mut results: Vec<(String, VerifyReport, Option<String>)> = Vec::new();
    let daemon_up = rt
        .block_on(request(&config.socket_path(), "GET", "/v1/status", None))
        .is_ok();
    for ws in &workspaces {
        if daemon_up {
            // The daemon knows which generations tasks pin: let it do the work.
            let (code, answer) = rt.block_on(request(
                &config.socket_path(),
                "POST",
                &format!("/v1/workspaces/{ws}/verify"),
                Some(body.clone()),
            ))?;
            let v: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
            if code != 200 {
                anyhow::bail!("{ws}: {}", v["message"].as_str().unwrap_or("verify failed"));
            }
            let report: VerifyReport =
                serde_json::from_value(v["report"].clone()).context("unreadable verify report")?;
            results.push((
                ws.clone(),
                report,
                v["repaired_generation"].as_str().map(str::to_owned),
            ));
        } else {
            let token = if repair {
                mopd::client::read_token(&config.server.token_file).map_err(anyhow::Error::msg)?
            } else {
                String::new()
            };
            let client = mopd::client::ServerClient::new(
                &config.server.url,
                token,
                std::time::Duration::from_secs(config.server.timeout_secs),
            )
            .map_err(anyhow::Error::msg)?;
            let shared = Arc::new(mopd::shared::Shared::new(
                config.clone(),
                client,
                config_path.to_owned(),
            ));
            let pool = Pool::open(&config.paths.cache_dir, ws)?;
            let status = Arc::new(Mutex::new(mopd::sync::load_status(
                &config.paths.state_dir,
                ws,
            )));
            let syncer = mopd::sync::Syncer::new(ws.clone(), pool, status, shared);
            let (report, repaired) = rt
                .block_on(syncer.verify(repair))
                .map_err(|f| anyhow::anyhow!("{ws}: {}", f.message))?;
            results.push((ws.clone(), report, repaired));
        }
    }
    let mut damage_left = false;
    for (ws, report, repaired) in &results {
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
        let out: Vec<_> = results
            .iter()
            .map(|(ws, r, g)| serde_json::json!({ "workspace": ws, "report": r, "repaired_generation": g }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(if damage_left {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
