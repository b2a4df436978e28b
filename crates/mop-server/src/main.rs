//! `mop-server`: the central card server and its admin commands.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use mop_server::config::{DEFAULT_CONFIG, ServerConfig};
use mop_server::store::{Database, NewToken, Role, Store};
use mop_server::transfer;

#[derive(Parser)]
#[command(
    name = "mop-server",
    version,
    about = "The mop card server: holds each workspace's memory cards and serves them to host daemons",
    long_about = "The mop card server: holds each workspace's memory cards in one SQLite file (or, for \
                  several replicas, in PostgreSQL: --db postgres://… or MOP_DATABASE_URL) and \
                  serves them to host daemons (mopd) over HTTP.\n\nStart it with `mop-server serve`; \
                  create tokens for daemons and curators with `mop-server token create`; load cards \
                  with `mop-server import`; move an SQLite database to PostgreSQL with \
                  `mop-server migrate`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the config and database are.
#[derive(Args, Clone)]
struct Location {
    /// Config file [default: /etc/mop-server/server.toml, used when present].
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// SQLite database file, or a postgres:// URL (overrides server.db and
    /// server.database_url in the config, and MOP_DATABASE_URL).
    #[arg(long, value_name = "PATH|URL", global = true)]
    db: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API until SIGTERM or SIGINT.
    Serve {
        #[command(flatten)]
        at: Location,
        /// Address to listen on (overrides server.listen); port 0 picks a free port.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
    },
    /// Create, list and revoke bearer tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Import an OKF card directory into a workspace; bad files are reported and skipped.
    /// A card that carries a credential (a key, token, private key, password) is one of
    /// them, named with the credential's kind and place, never its value.
    Import {
        /// Directory of cards at <pillar>/<id>.md.
        dir: PathBuf,
        /// Workspace to import into (created if missing).
        #[arg(long)]
        workspace: String,
        /// Import this card although it carries credentials (a deliberate override, kept
        /// in its history with the kinds); repeat or separate ids with commas.
        #[arg(long = "allow-credentials", value_name = "ID", value_delimiter = ',')]
        allow_credentials: Vec<mop_cards::CardId>,
        #[command(flatten)]
        at: Location,
    },
    /// List every card of a workspace whose text carries a credential: id, kind and place
    /// (field, line, column), never the value or the title. Delete such cards for good
    /// with `mop-curate delete` (or the console), or edit the credential out.
    Credentials {
        /// Workspace to look in.
        #[arg(long)]
        workspace: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Copy the database to DEST while the server keeps serving (SQLite's online backup),
    /// check the copy and move it into place. Restore by stopping the server and putting
    /// the copy at server.db.
    Backup {
        /// The copy to write (must not exist unless --force).
        dest: PathBuf,
        /// Replace DEST if it exists.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Copy a whole database to another, e.g. SQLite to PostgreSQL: cards, objects,
    /// history, tokens and counters, keeping the epoch and revisions (daemons go on with
    /// 304s). Checks row counts and content hashes of every table at the end. Safe to run
    /// again; refuses a target that holds other data unless --replace. Stop the servers
    /// (or writes) on the source first: writes made during the copy are not in it.
    Migrate {
        /// The database to copy: sqlite:PATH (or a path), or a postgres:// URL.
        #[arg(long, value_name = "DB")]
        from: String,
        /// The database to fill: postgres://user[:password]@host[:port]/db, or sqlite:PATH
        /// [default: MOP_DATABASE_URL, which keeps the password off the command line].
        #[arg(long, value_name = "DB")]
        to: Option<String>,
        /// Overwrite a target that already holds other data.
        #[arg(long)]
        replace: bool,
    },
    /// Export a workspace's cards, byte for byte, into a new or empty directory.
    Export {
        /// Target directory.
        dir: PathBuf,
        /// Workspace to export.
        #[arg(long)]
        workspace: String,
        /// Include archived cards (not yet purged).
        #[arg(long)]
        include_archived: bool,
        #[command(flatten)]
        at: Location,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token and print it on stdout (it is shown only once).
    Create {
        /// node: a host daemon (manifests, objects, stores); admin: a curator.
        #[arg(long, value_parser = ["node", "admin"])]
        role: String,
        /// Workspace the token may use; repeat for several.
        #[arg(long = "workspace", required = true)]
        workspaces: Vec<String>,
        /// Free text to recognise the token by in `token list`.
        #[arg(long)]
        note: Option<String>,
        /// The person who will use it (required for admin tokens): the audit history names
        /// them for everything done with it.
        #[arg(long)]
        name: Option<String>,
        /// Make the token stop working after this long: a number and a unit, s, m, h, d
        /// or w (`90d`, `12h`) [default: never].
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        expires_in: Option<jiff::SignedDuration>,
        #[command(flatten)]
        at: Location,
    },
    /// List tokens: ids, roles, names, workspaces, expiry and last use (recorded at most
    /// once a minute by a running server); never the secrets.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Revoke a token by id; a running server refuses it within a second.
    Revoke {
        /// Token id, as `token list` shows it.
        id: String,
        #[command(flatten)]
        at: Location,
    },
}

fn config(at: &Location) -> Result<ServerConfig> {
    let mut config = ServerConfig::load(at.config.as_deref())?;
    match at.db.as_deref().map(Database::parse) {
        Some(Database::Sqlite(path)) => {
            config.server.db = path;
            config.server.database_url = None;
        }
        Some(Database::Postgres(url)) => config.server.database_url = Some(url),
        None => {}
    }
    Ok(config)
}

fn open(at: &Location) -> Result<Store> {
    let config = config(at)?;
    let database = config.database();
    let db = &config.server.db;
    if matches!(database, Database::Sqlite(_))
        && let Some(parent) = db.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.is_dir()
    {
        bail!(
            "database directory {} does not exist; create it or pass --db (config: {})",
            parent.display(),
            at.config
                .as_deref()
                .unwrap_or(Path::new(DEFAULT_CONFIG))
                .display()
        );
    }
    Store::connect(&database).with_context(|| format!("cannot open database {}", database.shown()))
}

/// `90d`, `12h`, `30m`, `45s`, `2w`: a positive whole number and one unit.
fn parse_duration(s: &str) -> std::result::Result<jiff::SignedDuration, String> {
    let bad = || {
        format!("{s:?} is not a duration; write a number and a unit: s, m, h, d or w (90d, 12h)")
    };
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: i64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(bad()),
    };
    match n.checked_mul(secs) {
        Some(total) if total > 0 => Ok(jiff::SignedDuration::from_secs(total)),
        _ => Err(bad()),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mop-server: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<std::process::ExitCode> {
    match cli.command {
        Command::Serve { at, listen } => {
            mop_log::init("info");
            let mut config = config(&at)?;
            if let Some(l) = listen {
                config.server.listen = l;
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            let scheme = if config.server.tls_cert.is_some() {
                "https"
            } else {
                "http"
            };
            runtime.block_on(mop_server::server::serve(config, |addr| {
                println!("mop-server listening on {scheme}://{addr}");
                let _ = std::io::stdout().flush();
            }))?;
        }
        Command::Token { command } => token_command(command)?,
        Command::Credentials {
            workspace,
            json,
            at,
        } => credentials_command(&workspace, json, &at)?,
        Command::Import {
            dir,
            workspace,
            allow_credentials,
            at,
        } => return import_command(&dir, &workspace, &allow_credentials, &at),
        Command::Backup { dest, force, at } => {
            let config = config(&at)?;
            if let Database::Postgres(_) = config.database() {
                bail!(
                    "backup copies an SQLite file; this server uses PostgreSQL ({}): back it up with pg_dump -Fc (see README, Backups)",
                    config.database().shown()
                );
            }
            let db = &config.server.db;
            let report = mop_server::store::backup(db, &dest, force).with_context(|| {
                format!("backup of {} to {} failed", db.display(), dest.display())
            })?;
            println!(
                "backed up {} to {}: {} pages, {} bytes, integrity check ok; the copy's epoch is {} (the database's is {}), so daemons take a restore as a new history",
                db.display(),
                dest.display(),
                report.pages,
                report.bytes,
                report.epoch,
                report.source_epoch
            );
        }
        Command::Migrate { from, to, replace } => {
            let to = to
                .or_else(|| {
                    std::env::var("MOP_DATABASE_URL")
                        .ok()
                        .filter(|u| !u.is_empty())
                })
                .context("name the target with --to, or set MOP_DATABASE_URL")?;
            let (from, to) = (Database::parse(&from), Database::parse(&to));
            eprintln!("copying {} to {}", from.shown(), to.shown());
            let report = mop_server::store::migrate(&from, &to, replace, |table, rows| {
                eprintln!("copied {rows} rows of {table}");
            })
            .with_context(|| format!("migration from {} to {} failed", from.shown(), to.shown()))?;
            for t in &report.tables {
                println!(
                    "{:<20} {:>10} rows  sha256 {}",
                    t.table,
                    t.rows,
                    &t.sha256[..16]
                );
            }
            if report.already {
                println!(
                    "{} already holds exactly what {} holds (epoch {}); nothing was written",
                    to.shown(),
                    from.shown(),
                    report.epoch
                );
            } else {
                println!(
                    "migrated {} to {}: every table's row count and content hash match (epoch {})",
                    from.shown(),
                    to.shown(),
                    report.epoch
                );
            }
        }
        Command::Export {
            dir,
            workspace,
            include_archived,
            at,
        } => {
            let store = open(&at)?;
            let files = store.export(&workspace, include_archived)?;
            transfer::write_card_dir(&dir, &files)?;
            println!(
                "exported {} cards from {workspace} to {}",
                files.len(),
                dir.display()
            );
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `mop-server token create|list|revoke`.
fn token_command(command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Create {
            role,
            workspaces,
            note,
            name,
            expires_in,
            at,
        } => {
            let role = Role::parse(&role).expect("clap checked the role");
            let expires_at = expires_in
                .map(|d| jiff::Timestamp::now().checked_add(d))
                .transpose()
                .context("--expires-in is too far in the future")?;
            let (id, token) = open(&at)?.create_token(&NewToken {
                role,
                workspaces: &workspaces,
                note: note.as_deref(),
                name: name.as_deref(),
                expires_at,
                actor: "cli:token",
            })?;
            let until = expires_at.map_or_else(String::new, |t| format!(", valid until {t}"));
            eprintln!(
                "created {role} token {id} for {}{until}; store it now, it is not shown again",
                workspaces.join(", ")
            );
            println!("{token}");
        }
        TokenCommand::List { json, at } => {
            let rows = open(&at)?.list_tokens()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else if rows.is_empty() {
                println!(
                    "no tokens; create one with: mop-server token create --role node --workspace W"
                );
            } else {
                println!(
                    "{:<12} {:<6} {:<20} {:<20} {:<28} {:<28} STATUS",
                    "ID", "ROLE", "NAME", "WORKSPACES", "CREATED", "LAST USED"
                );
                let now = jiff::Timestamp::now();
                for r in rows {
                    let status = match (&r.revoked_at, &r.expires_at) {
                        (Some(t), _) => format!("revoked {t}"),
                        (None, Some(t)) if t.0 <= now => {
                            format!("expired {t}")
                        }
                        (None, Some(t)) => format!("active until {t}"),
                        (None, None) => "active".to_owned(),
                    };
                    println!(
                        "{:<12} {:<6} {:<20} {:<20} {:<28} {:<28} {}",
                        r.id,
                        r.role,
                        r.name.as_deref().unwrap_or("-"),
                        r.workspaces.join(","),
                        r.created_at,
                        r.last_used_at
                            .map_or_else(|| "never".to_owned(), |t| t.to_string()),
                        status
                    );
                }
            }
        }
        TokenCommand::Revoke { id, at } => {
            open(&at)?.revoke_token(&id, "cli:token")?;
            println!("revoked token {id}");
        }
    }
    Ok(())
}

/// `mop-server credentials`: the cards of a workspace that carry a credential.
fn credentials_command(workspace: &str, json: bool, at: &Location) -> Result<()> {
    let cards = open(at)?.credential_cards(workspace)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&cards)?);
    } else if cards.is_empty() {
        println!(
            "no card of {workspace} carries a credential (rules: {})",
            mop_intake::secrets::RULES_SOURCE
        );
    } else {
        for c in &cards {
            let archived = if c.archived_at.is_some() {
                " (archived)"
            } else {
                ""
            };
            for f in &c.findings {
                println!(
                    "{}{archived}  {}  {} line {} column {}",
                    c.id, f.kind, f.field, f.line, f.column
                );
            }
        }
        println!(
            "{} card(s) carry credentials; delete each for good (mop-curate delete ID --reason …) or edit the credential out",
            cards.len()
        );
    }
    Ok(())
}

/// `mop-server import`: an OKF card directory into a workspace, bad files reported.
fn import_command(
    dir: &Path,
    workspace: &str,
    allow_credentials: &[mop_cards::CardId],
    at: &Location,
) -> Result<std::process::ExitCode> {
    if !mop_cards::is_slug(workspace) {
        bail!(
            "--workspace {workspace:?} must be a lowercase slug matching [a-z0-9][a-z0-9._-]{{0,63}}"
        );
    }
    let store = open(at)?;
    // Ids another workspace holds that tasks get together with this one are refused.
    let composed_with = config(at)?.inheritance.composed_with(workspace);
    let (files, skipped) = transfer::read_card_dir(dir, |n| {
        if n % 1000 == 0 {
            eprintln!("read {n} files");
        }
    })?;
    let total = files.len() + skipped.len();
    let mut report = store.import(
        workspace,
        files,
        "cli:import",
        allow_credentials,
        &composed_with,
    )?;
    for s in skipped {
        report.rejected.push(mop_server::store::Rejected {
            path: s.path,
            reason: s.reason,
        });
    }
    for r in &report.rejected {
        eprintln!("rejected {}: {}", dir.join(&r.path).display(), r.reason);
    }
    println!(
        "imported {total} files into {workspace}: {} created, {} updated, {} unchanged, {} rejected; revision {}",
        report.created,
        report.updated,
        report.unchanged,
        report.rejected.len(),
        report.revision
    );
    if !report.rejected.is_empty() {
        eprintln!("some files were rejected (listed above); the others were imported");
        return Ok(std::process::ExitCode::FAILURE);
    }
    Ok(std::process::ExitCode::SUCCESS)
}
