//! `mop-curate`: the curator's command line. It talks to the card server's curation API
//! over HTTP with an admin token, so it runs from a laptop: it needs neither the daemon nor
//! the server's database. Every listing has `--json`. Every change is sent with the
//! version of the card the curator acts on (the one `review` or `edit` showed, the one
//! given with `--version`, else the one read just before), so a concurrent change is
//! refused (412) instead of overwritten.

mod api;
mod combine;
mod fields;
mod render;
mod review;
mod transfer;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use mop_cards::CardId;
use mop_proto::curation::{ListQuery, PageQuery, StaleQuery};

use api::{Connection, Settings, refusal};

#[derive(Parser)]
#[command(
    name = "mop-curate",
    version,
    about = "Curate a mop workspace: review what agents stored, verify, reject, merge and edit cards",
    long_about = "Curate a mop workspace over the card server's HTTP API with an admin token.\n\n\
                  Where to connect: --url, --workspace and --token-file, else the environment \
                  (MOP_SERVER_URL, MOP_WORKSPACE, MOP_ADMIN_TOKEN or MOP_ADMIN_TOKEN_FILE), else \
                  ~/.config/mop/curate.toml (keys url, workspace, token_file).\n\n\
                  Start with `mop-curate review`: each unverified card with where it came from, \
                  how tasks used it and the existing cards closest to it; answer v(erify), \
                  r(eject), m(erge), e(dit), s(kip) or q(uit)."
)]
struct Cli {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct ConnArgs {
    /// The card server's base URL (https:// unless it is on this machine).
    #[arg(long, global = true, env = "MOP_SERVER_URL")]
    url: Option<String>,
    /// The workspace to curate.
    #[arg(long, short = 'w', global = true, env = "MOP_WORKSPACE")]
    workspace: Option<String>,
    /// A file holding an admin token (`mop-server token create --role admin --name …`).
    #[arg(long, global = true, env = "MOP_ADMIN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Send the admin token over plain http:// to another machine (only on a network you
    /// trust; https:// needs no flag, nor does http:// to this machine).
    #[arg(long, global = true)]
    allow_http: bool,
}

/// A state change's arguments.
#[derive(Args)]
struct StateArgs {
    /// The card id.
    id: String,
    /// Why (kept in the card's history); needed to archive or disable.
    #[arg(long)]
    reason: Option<String>,
    /// Do not ask.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    version: Version,
}

/// The version a change is meant for.
#[derive(Args, Default)]
struct Version {
    /// The card's version as `show` printed it: the change is refused (412) if the card
    /// changed since [default: the version read just before the change].
    #[arg(long, value_name = "TAG")]
    version: Option<String>,
}

#[derive(Args, Default)]
struct Filters {
    /// Only unverified cards waiting for review (agent-written, not yet reviewed; not
    /// those merged away, rejected or disabled): what the review queue holds.
    #[arg(long, conflicts_with = "verified")]
    unverified: bool,
    /// Only verified cards.
    #[arg(long)]
    verified: bool,
    /// Only cards of this type (fact, preference, human_correction, error_resolution,
    /// pitfall, playbook, reference_doc).
    #[arg(long = "type", value_name = "TYPE")]
    card_type: Option<String>,
    /// Only cards with this label.
    #[arg(long)]
    label: Option<String>,
    /// Only cards bound to this asset.
    #[arg(long)]
    asset: Option<String>,
    /// Only cards bound to this project.
    #[arg(long)]
    project: Option<String>,
    /// Only cards bound to this kind of agent (claude, codex …).
    #[arg(long)]
    agent: Option<String>,
    /// Only cards bound to, or written by a task of, this user.
    #[arg(long)]
    user: Option<String>,
    /// Only cards no task received in this many days.
    #[arg(long, value_name = "DAYS")]
    stale_days: Option<u32>,
    /// Only cards made more than this many days ago.
    #[arg(long, value_name = "DAYS")]
    older_than: Option<u32>,
    /// Only the cards of this duplicate group (as `review` and `show` name it).
    #[arg(long)]
    group: Option<String>,
    /// Include archived (rejected) cards.
    #[arg(long)]
    archived: bool,
    /// Entries to skip.
    #[arg(long, default_value_t = 0)]
    offset: usize,
    /// Most entries to show (at most 500).
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

impl Filters {
    fn query(&self) -> ListQuery {
        ListQuery {
            unverified: match (self.unverified, self.verified) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            card_type: self.card_type.clone(),
            label: self.label.clone(),
            asset: self.asset.clone(),
            project: self.project.clone(),
            agent: self.agent.clone(),
            user: self.user.clone(),
            stale_days: self.stale_days,
            older_than_days: self.older_than,
            group: self.group.clone(),
            archived: self.archived.then_some(true),
            offset: Some(self.offset),
            limit: Some(self.limit),
            q: None,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// List cards, with filters.
    List {
        #[command(flatten)]
        filters: Filters,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a card: its fields, provenance, usage by tasks, and versions.
    Show {
        /// The card id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a card's history, with the diff each version made.
    History {
        /// The card id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Verify a card: it becomes workspace memory that every task its scope allows sees.
    /// A card whose text carries a credential is refused (every task would read it).
    Verify {
        /// The card id.
        id: String,
        /// Verify the text in this file instead (an edited copy of the card; keep its id).
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// Verify it although its text carries credentials (kept in its history with
        /// their kinds). Better: edit them out, or delete the card.
        #[arg(long)]
        allow_credentials: bool,
        #[command(flatten)]
        version: Version,
    },
    /// Delete a card for good: its text, objects and history text go on the server, and
    /// every host drops it at its next sync. For a credential or personal data; asks
    /// for confirmation unless --yes.
    Delete {
        /// The card id.
        id: String,
        /// Why (kept in the audit history).
        #[arg(long)]
        reason: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// List the cards whose text carries a credential: id, kind and place, never the
    /// value. Delete each (`delete ID --reason …`) or edit the credential out.
    Credentials {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the rejected lessons stores are refused for (or marked by): who rejected
    /// which card, when and why.
    Rejections {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lift a rejection: stores of its lesson are no longer refused (audited).
    Lift {
        /// The rejection id, as `rejections` lists it.
        id: String,
    },
    /// Reject a card: it is archived (out of every task now), with the reason in its
    /// history.
    Reject {
        /// The card id.
        id: String,
        /// Why (kept in the history).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        version: Version,
    },
    /// Archive a card: out of every task now (soft delete), purged after the server's
    /// archive retention unless unarchived. Asks for confirmation unless --yes.
    Archive(StateArgs),
    /// Put an archived card back.
    Unarchive(StateArgs),
    /// Keep a card agents flagged as wrong or outdated, as it is: the verdicts so far no
    /// longer flag it (later ones can again). `--reason` says why it still holds.
    Keep(StateArgs),
    /// Disable a card: out of every task until enabled, kept in the listings. Asks for
    /// confirmation unless --yes.
    Disable(StateArgs),
    /// Enable a disabled card.
    Enable(StateArgs),
    /// Set a card's type, labels, scope or importance (its text stays), unless someone
    /// changed it meanwhile.
    Set(fields::SetArgs),
    /// Merge a card into an existing one: the card is superseded and the other takes over
    /// its counters.
    Merge {
        /// The card to merge away.
        id: String,
        /// The card that stays.
        #[arg(long)]
        into: String,
        /// Verify the card that stays in the same action: a merge into an unverified card
        /// needs it (only its author's tasks would see the lesson otherwise).
        #[arg(long)]
        verify: bool,
        #[command(flatten)]
        version: Version,
    },
    /// Show a duplicate group: its waiting cards side by side, numbered for `combine`.
    Group {
        /// The group (as `review` and `show` name it).
        group: String,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make a duplicate group one card: keep one of its cards (--base N) or another card
    /// (--into ID), verified, with the text you edit in $EDITOR (every variant's text below
    /// a cut line, to copy from) or give (--text-file), and merge the rest of the group
    /// into it, in one step the server refuses if the group changed since it was shown.
    Combine(CombineArgs),
    /// Mark a card superseded by a newer one.
    Supersede {
        /// The older card.
        id: String,
        /// The newer card.
        #[arg(long)]
        by: String,
        #[command(flatten)]
        version: Version,
    },
    /// Create a card: the server gives it its id; you give its fields, and its text from a
    /// file (--body-file, `-` for standard input) or your $EDITOR. A card a curator writes
    /// is verified.
    Create(CreateArgs),
    /// Import memory files as cards: OKF cards (kept as written, with their ids), and the
    /// files agents and teams already keep: CLAUDE.md, .claude/rules/*.md, AGENTS.md,
    /// Claude Code's auto-memory directories (~/.claude/projects/*/memory) and Codex's
    /// memories (~/.codex/memories). Each section becomes an unverified card waiting for
    /// review, its heading the title, "imported by YOU from FILE" its provenance. A
    /// directory is read for its .md files, recursively.
    Import {
        /// Files or directories.
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
        /// Only show what would be created; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Bind Claude Code `user` memories (one person's preferences) to this user.
        #[arg(long, value_name = "USER")]
        user: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Export the cards the filters match (every match: paging is ignored) as OKF files:
    /// into a new directory, or a .tar.gz file.
    Export {
        /// A directory that does not exist yet, or a file ending .tar.gz or .tgz.
        out: std::path::PathBuf,
        #[command(flatten)]
        filters: Filters,
    },
    /// One action on every card the filters match: lists them with their count, asks, then
    /// acts in one transaction (each card's history names you). Refused, changing nothing,
    /// if the cards matching changed in between.
    Bulk(BulkArgs),
    /// Revert a card to an earlier version's text (`history ID` numbers them), unless
    /// someone changed it meanwhile.
    Revert {
        /// The card id.
        id: String,
        /// The history entry whose text to restore (the number `history` shows).
        #[arg(long, value_name = "N")]
        to: i64,
        #[command(flatten)]
        version: Version,
    },
    /// Edit a card in $EDITOR and save it, unless someone changed it meanwhile (then your
    /// text is kept in a file and nothing is overwritten).
    Edit {
        /// The card id.
        id: String,
    },
    /// Search the workspace (BM25), with the same filters as list.
    Search {
        /// What to look for.
        query: String,
        #[command(flatten)]
        filters: Filters,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cards no task received, cards of assets no task named, long supersede chains, and
    /// old unverified cards.
    Stale {
        /// The window, in days.
        #[arg(long, default_value_t = 30)]
        days: u32,
        /// Report supersede chains longer than this.
        #[arg(long, default_value_t = 3)]
        chain: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Go through the review queue: each unverified card with its provenance, usage and
    /// nearest cards; answer v(erify), r(eject), m(erge), e(dit), s(kip) or q(uit).
    Review {
        /// Print the queue's first page as JSON and change nothing.
        #[arg(long)]
        json: bool,
        /// Entries per page.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mop-curate: error: {e:#}");
            if let Some(hint) = refusal(&e).and_then(hint) {
                eprintln!("  {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// What to do about a refusal, beyond the server's own words.
fn hint(r: &api::Refused) -> Option<&'static str> {
    match r.status.as_u16() {
        401 => Some(
            "check the token (--token-file, MOP_ADMIN_TOKEN): it may be mistyped, revoked or expired",
        ),
        403 => Some(
            "curation needs an admin token: mop-server token create --role admin --name \"Your Name\" --workspace W",
        ),
        404 => {
            Some("check the id and the workspace (--workspace); `mop-curate list` shows the cards")
        }
        412 => Some(
            "someone changed the card since you read it: `mop-curate show ID` shows the new version; apply your change to it again",
        ),
        _ => None,
    }
}

fn connect(args: &ConnArgs) -> Result<Connection> {
    let settings = Settings::load()?;
    let config = Settings::path().map_or_else(
        || "~/.config/mop/curate.toml".into(),
        |p| p.display().to_string(),
    );
    let url = args.url.clone().or(settings.url).with_context(|| {
        format!(
            "no server URL: pass --url, set MOP_SERVER_URL, or put url = \"https://…\" in {config}"
        )
    })?;
    let workspace = args.workspace.clone().or(settings.workspace).with_context(|| {
        format!("no workspace: pass --workspace, set MOP_WORKSPACE, or put workspace = \"…\" in {config}")
    })?;
    let token = match std::env::var("MOP_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        Some(t) if args.token_file.is_none() => t,
        _ => {
            let file = args.token_file.clone().or(settings.token_file).with_context(|| {
                format!(
                    "no admin token: pass --token-file, set MOP_ADMIN_TOKEN or MOP_ADMIN_TOKEN_FILE, or put token_file = \"…\" in {config}"
                )
            })?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read the token file {}", file.display()))?;
            let t = text.trim().to_owned();
            if t.is_empty() {
                bail!("token file {} is empty", file.display());
            }
            t
        }
    };
    Connection::new(&url, token, workspace, args.allow_http)
}

/// `combine`'s choices.
#[derive(Args)]
struct CombineArgs {
    /// The group (as `review` and `show` name it).
    group: String,
    /// Keep the group's card of this number (as `group` lists them; 1 is the oldest).
    #[arg(long, default_value_t = 1, conflicts_with = "into")]
    base: usize,
    /// Keep this card instead (any live card, found with `search`).
    #[arg(long, value_name = "ID")]
    into: Option<String>,
    /// The text of the card that stays from this file (`-`: standard input): a whole
    /// card, or a body that replaces its body. Default: edit it in $EDITOR.
    #[arg(long, value_name = "FILE", conflicts_with = "keep_text")]
    text_file: Option<PathBuf>,
    /// Keep the text of the card that stays as it is.
    #[arg(long)]
    keep_text: bool,
    /// Do not ask before acting.
    #[arg(long)]
    yes: bool,
}

/// `combine`: shows the group, then makes it one card.
fn combine_group(c: &Connection, args: CombineArgs) -> Result<()> {
    let item = c.group(&args.group)?;
    print!("{}", render::review_item(1, 1, &item));
    let keep = match &args.into {
        Some(id) => combine::Keep::Card(card_id(id)?, None),
        None => combine::Keep::Base(args.base),
    };
    let text = match (&args.text_file, args.keep_text) {
        (Some(p), _) => combine::Text::File(p),
        (None, true) => combine::Text::Unchanged,
        (None, false) => combine::Text::Editor,
    };
    combine::run(c, &item, keep, text, args.yes, &mut std::io::stdin().lock())?;
    Ok(())
}

/// `create`'s fields.
#[derive(Args)]
struct CreateArgs {
    /// The card type (fact, preference, human_correction, error_resolution, pitfall,
    /// playbook, reference_doc).
    #[arg(long = "type", value_name = "TYPE")]
    card_type: String,
    /// One line, up to 200 characters.
    #[arg(long)]
    title: String,
    /// One line, up to 300 characters.
    #[arg(long)]
    description: Option<String>,
    /// A label (lowercase slug); repeat for more.
    #[arg(long = "label", value_name = "LABEL")]
    labels: Vec<String>,
    /// An error code the card resolves; repeat for more.
    #[arg(long = "error-code", value_name = "CODE")]
    error_codes: Vec<String>,
    /// A technology stack; repeat for more.
    #[arg(long = "stack", value_name = "STACK")]
    stacks: Vec<String>,
    /// Bind the card to this asset: only its tasks get it.
    #[arg(long)]
    asset: Option<String>,
    /// Bind the card to this project: only its tasks get it.
    #[arg(long)]
    project: Option<String>,
    /// Bind the card to this kind of agent (claude, codex …): only tasks run for it get
    /// it.
    #[arg(long)]
    agent: Option<String>,
    /// Bind the card to this user: only their tasks get it.
    #[arg(long)]
    user: Option<String>,
    /// The card's Markdown text from this file (`-`: standard input) instead of $EDITOR.
    #[arg(long, value_name = "FILE")]
    body_file: Option<PathBuf>,
    /// Keep a credential the text carries (audited, kinds only); refused otherwise.
    #[arg(long)]
    allow_credentials: bool,
}

/// `create`: the card from its fields, the text from a file, stdin or $EDITOR.
fn create(c: &Connection, args: CreateArgs) -> Result<()> {
    let CreateArgs {
        card_type,
        title,
        description,
        labels,
        error_codes,
        stacks,
        asset,
        project,
        agent,
        user,
        body_file,
        allow_credentials,
    } = args;
    let card_type = mop_cards::CardType::parse(&card_type).with_context(|| {
        format!(
            "--type {card_type:?} is not a card type; use one of: {}",
            mop_cards::CardType::NAMES.join(", ")
        )
    })?;
    let body = match body_file {
        Some(p) if p.as_os_str() == "-" => std::io::read_to_string(std::io::stdin())
            .context("cannot read the text from standard input")?,
        Some(p) => {
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?
        }
        None => review::in_editor("", "mop-new-card-")?.1,
    };
    if body.trim().is_empty() {
        bail!(
            "the card has no text; nothing was created (write it in the editor or give --body-file)"
        );
    }
    let fields = mop_proto::sync::NewCard {
        card_type,
        title,
        description,
        labels,
        error_codes,
        stacks,
        scope: mop_cards::Scope {
            user_id: user,
            asset_id: asset,
            project_id: project,
            agent,
        },
        body,
    };
    let change = c.create(&fields, allow_credentials)?;
    println!("created card {} (revision {})", change.id, change.revision);
    Ok(())
}

/// `merge`: `id` into `into`, verifying `into` (at the version shown) when asked.
fn merge(c: &Connection, id: &str, into: &str, verify: bool, version: Version) -> Result<()> {
    let (id, into) = (card_id(id)?, card_id(into)?);
    let tag = version_for(c, &id, version)?;
    // The card verified is shown (title and version) before it is.
    let verify = if verify {
        Some(version_for(c, &into, Version::default())?)
    } else {
        None
    };
    let change = c.merge(&id, &into, verify, Some(&tag))?;
    println!(
        "merged card {id} into {into} (revision {})",
        change.revision
    );
    Ok(())
}

/// `revert`: the text of history entry `to` again, on the version read or given.
fn revert(c: &Connection, id: &str, to: i64, version: Version) -> Result<()> {
    let id = card_id(id)?;
    let tag = version_for(c, &id, version)?;
    let change = c.revert(&id, to, Some(&tag))?;
    if change.changed {
        println!(
            "card {id} reverted to version {to} (revision {})",
            change.revision
        );
    } else {
        println!("card {id} already has the text of version {to}; nothing changed");
    }
    Ok(())
}

/// What `bulk` does to each card.
#[derive(Clone, Copy, clap::ValueEnum)]
enum BulkArg {
    Verify,
    Reject,
    Label,
}

/// `bulk`'s arguments.
#[derive(Args)]
struct BulkArgs {
    /// What to do to each: verify, reject (needs --reason) or label (needs --add-label).
    #[arg(value_enum)]
    action: BulkArg,
    /// Why they are rejected (kept in each card's history and tombstone).
    #[arg(long)]
    reason: Option<String>,
    /// The label to add to each.
    #[arg(long, value_name = "LABEL")]
    add_label: Option<String>,
    #[command(flatten)]
    filters: Filters,
    /// Act without asking (the count shown is still checked).
    #[arg(long)]
    yes: bool,
}

fn bulk(c: &Connection, args: BulkArgs) -> Result<()> {
    use mop_proto::curation::{BulkAction, BulkRequest};
    let BulkArgs {
        action,
        reason,
        add_label: label,
        filters,
        yes,
    } = args;
    let (action, verb) = match action {
        BulkArg::Verify => (BulkAction::Verify, "verify"),
        BulkArg::Reject => (BulkAction::Reject, "reject"),
        BulkArg::Label => (BulkAction::Label, "label"),
    };
    if matches!(action, BulkAction::Reject) && reason.is_none() {
        bail!("bulk reject needs --reason (kept in each card's history)");
    }
    if matches!(action, BulkAction::Label) && label.is_none() {
        bail!("bulk label needs --add-label LABEL");
    }
    let mut req = BulkRequest {
        // Every match counts: no paging.
        filter: ListQuery {
            offset: None,
            limit: None,
            ..filters.query()
        },
        action,
        reason,
        label,
        confirm: None,
    };
    let preview = c.bulk(&req)?;
    for card in &preview.cards {
        println!(
            "{}  {:<16} {}",
            card.id,
            card.card_type.as_str(),
            render::safe(&card.title)
        );
    }
    let n = preview.cards.len();
    if n == 0 {
        println!("no card matches; nothing to do");
        return Ok(());
    }
    if !yes {
        print!("{verb} these {n} card(s)? [y/N] ");
        std::io::Write::flush(&mut std::io::stdout())?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("nothing was changed");
            return Ok(());
        }
    }
    req.confirm = Some(preview.cards.iter().map(|c| c.id).collect());
    let done = c.bulk(&req)?;
    println!(
        "{verb}: {} card(s) done (revision {})",
        done.cards.len(),
        done.revision.unwrap_or_default()
    );
    Ok(())
}

/// The version a one-shot change is sent with: the one given, else the card's version read
/// now (the change then applies to what the curator sees printed next to it).
fn version_for(c: &Connection, id: &CardId, given: Version) -> Result<String> {
    match given.version {
        Some(tag) => Ok(tag),
        None => {
            let details = c.details(id)?;
            println!(
                "card {id} at version {}: {}",
                details.card.etag,
                render::safe(&details.card.summary.title)
            );
            Ok(details.card.etag)
        }
    }
}

fn card_id(s: &str) -> Result<CardId> {
    CardId::parse(s).map_err(|e| {
        anyhow::anyhow!("{s:?} is not a card id ({e}); `mop-curate list` shows the ids")
    })
}

fn print_json(v: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Prints an answer as JSON with `--json`, else as `render` words it for people.
fn print_as<T: serde::Serialize>(json: bool, v: &T, render: impl Fn(&T) -> String) -> Result<()> {
    if json {
        print_json(v)
    } else {
        print!("{}", render(v));
        Ok(())
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let c = connect(&cli.conn)?;
    match cli.command {
        Command::List { filters, json } => {
            let page = c.list(&filters.query())?;
            print_as(json, &page, render::page)?;
        }
        Command::Show { id, json } => {
            let details = c.details(&card_id(&id)?)?;
            print_as(json, &details, render::details)?;
        }
        Command::History { id, json } => {
            let details = c.details(&card_id(&id)?)?;
            print_as(json, &details.history, |h| render::history(h))?;
        }
        Command::Verify {
            id,
            file,
            allow_credentials,
            version,
        } => verify(&c, &id, file, allow_credentials, version)?,
        Command::Reject {
            id,
            reason,
            version,
        } => {
            let id = card_id(&id)?;
            let tag = version_for(&c, &id, version)?;
            let change = c.reject(&id, &reason, Some(&tag))?;
            println!(
                "rejected card {id}: archived, out of every task (revision {})",
                change.revision
            );
        }
        Command::Merge {
            id,
            into,
            verify,
            version,
        } => merge(&c, &id, &into, verify, version)?,
        Command::Create(args) => create(&c, args)?,
        Command::Combine(args) => combine_group(&c, args)?,
        Command::Group { group, json } => {
            print_as(json, &c.group(&group)?, |i| render::review_item(1, 1, i))?
        }
        Command::Bulk(args) => bulk(&c, args)?,
        Command::Export { out, filters } => export(&c, &out, &filters)?,
        Command::Archive(a) => set_state(&c, "archive", a)?,
        Command::Unarchive(a) => set_state(&c, "unarchive", a)?,
        Command::Keep(a) => keep(&c, a)?,
        Command::Disable(a) => set_state(&c, "disable", a)?,
        Command::Enable(a) => set_state(&c, "enable", a)?,
        Command::Set(a) => fields::set(&c, a)?,
        Command::Import {
            paths,
            dry_run,
            user,
            json,
        } => {
            let answer = transfer::import_paths(&c, &paths, dry_run, user)?;
            print_as(json, &answer, transfer::render)?;
        }
        Command::Revert { id, to, version } => revert(&c, &id, to, version)?,
        Command::Supersede { id, by, version } => {
            let (id, by) = (card_id(&id)?, card_id(&by)?);
            let tag = version_for(&c, &id, version)?;
            let change = c.supersede(&id, &by, Some(&tag))?;
            println!(
                "card {id} is superseded by {by} (revision {})",
                change.revision
            );
        }
        Command::Delete { id, reason, yes } => delete(&c, &id, &reason, yes)?,
        Command::Credentials { json } => credentials(&c, json)?,
        Command::Rejections { json } => rejections(&c, json)?,
        Command::Lift { id } => {
            let r = c.lift(&id)?;
            println!(
                "lifted rejection {} of card {}: its lesson may be stored again",
                r.id, r.card_id
            );
        }
        Command::Edit { id } => {
            let id = card_id(&id)?;
            review::edit(&c, &id, None)?;
        }
        Command::Search {
            query,
            filters,
            json,
        } => {
            let results = c.search(&ListQuery {
                q: Some(query),
                ..filters.query()
            })?;
            print_as(json, &results, render::search)?;
        }
        Command::Stale { days, chain, json } => {
            let report = c.stale(&StaleQuery {
                days: Some(days),
                chain: Some(chain),
            })?;
            print_as(json, &report, render::stale)?;
        }
        Command::Review { json, limit } => {
            if json {
                print_json(&c.review(&PageQuery {
                    offset: None,
                    limit: Some(limit),
                })?)?;
            } else {
                let stdin = std::io::stdin();
                let interactive = stdin.is_terminal();
                review::run(&c, limit, &mut stdin.lock(), interactive)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `mop-curate delete`: a card gone for good, after a typed yes.
/// `verify`, of the card as it is or of an edited copy in `file`.
fn verify(
    c: &Connection,
    id: &str,
    file: Option<std::path::PathBuf>,
    allow_credentials: bool,
    version: Version,
) -> Result<()> {
    let id = card_id(id)?;
    let edited = file
        .map(|f| {
            std::fs::read_to_string(&f).with_context(|| format!("cannot read {}", f.display()))
        })
        .transpose()?;
    let tag = version_for(c, &id, version)?;
    let change = c.verify(&id, edited, Some(&tag), allow_credentials)?;
    println!("verified card {id} (revision {})", change.revision);
    Ok(())
}

/// `export`: every card the filters match (paging ignored).
fn export(c: &Connection, out: &std::path::Path, filters: &Filters) -> Result<()> {
    let q = ListQuery {
        offset: None,
        limit: None,
        ..filters.query()
    };
    let n = transfer::export(c, &q, out)?;
    println!("exported {n} card(s) to {}", out.display());
    Ok(())
}

/// Asks `question` on the terminal; anything but "yes" stops with `refused`.
fn confirm(question: &str, refused: &str) -> Result<()> {
    eprint!("{question} Type yes: ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if answer.trim() != "yes" {
        bail!("{refused} (answer yes, or pass --yes)");
    }
    Ok(())
}

/// `archive`, `unarchive`, `disable` and `enable`.
fn set_state(c: &Connection, action: &str, a: StateArgs) -> Result<()> {
    let id = card_id(&a.id)?;
    let takes_out = matches!(action, "archive" | "disable");
    let reason = a.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
    if takes_out && reason.is_none() {
        bail!("--reason must say why the card is {action}d (it is kept in its history)");
    }
    let tag = version_for(c, &id, a.version)?;
    if takes_out && !a.yes {
        let until = if action == "archive" {
            "it is purged after the archive retention unless unarchived"
        } else {
            "until it is enabled"
        };
        confirm(
            &format!("{action} card {id}? It leaves every task now; {until}."),
            &format!("not {action}d"),
        )?;
    }
    let change = c.set_state(&id, action, reason, Some(&tag))?;
    if change.changed {
        println!("card {id}: {action}d (revision {})", change.revision);
    } else {
        println!("card {id} was {action}d already; nothing changed");
    }
    Ok(())
}

/// `keep`: a card agents flagged stays as it is.
fn keep(c: &Connection, a: StateArgs) -> Result<()> {
    let id = card_id(&a.id)?;
    let reason = a.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
    c.set_state(&id, "keep", reason, None)?;
    println!("card {id}: kept as it is; the agents' verdicts so far no longer flag it");
    Ok(())
}

fn delete(c: &Connection, id: &str, reason: &str, yes: bool) -> Result<()> {
    let id = card_id(id)?;
    if reason.trim().is_empty() {
        bail!("--reason must say why the card is deleted (it is kept in the audit)");
    }
    if !yes {
        let details = c.details(&id)?;
        confirm(
            &format!(
                "Delete card {id} ({}) for good? Its text, objects and history text go and cannot be restored.",
                render::safe(&details.card.summary.title)
            ),
            "not deleted",
        )?;
    }
    let change = c.delete(&id, reason)?;
    println!(
        "deleted card {id} for good (revision {}); every host drops it at its next sync",
        change.revision
    );
    Ok(())
}

/// `mop-curate credentials`: the cards whose text carries a credential.
fn credentials(c: &Connection, json: bool) -> Result<()> {
    let cards = c.credentials()?;
    if json {
        print_json(&cards)?;
    } else if cards.is_empty() {
        println!("no card carries a credential");
    } else {
        for card in &cards {
            let archived = if card.archived_at.is_some() {
                " (archived)"
            } else {
                ""
            };
            for f in &card.findings {
                println!("{}{archived}  {f}", card.id);
            }
        }
        println!(
            "{} card(s) carry credentials: `mop-curate delete ID --reason …` removes one for good",
            cards.len()
        );
    }
    Ok(())
}

/// `mop-curate rejections`: the rejected lessons, lifted or still refused.
fn rejections(c: &Connection, json: bool) -> Result<()> {
    let list = c.rejections()?;
    if json {
        print_json(&list)?;
    } else if list.is_empty() {
        println!("no lesson has been rejected");
    } else {
        for r in &list {
            let who = r.actor_name.as_deref().unwrap_or(&r.actor);
            let state = match &r.lifted_at {
                Some(at) => format!("lifted {at}"),
                None => "refused".into(),
            };
            println!(
                "{}  card {}  by {} at {}  [{state}]  {}",
                r.id,
                r.card_id,
                render::safe(who),
                r.at,
                render::safe(&r.reason)
            );
        }
    }
    Ok(())
}
