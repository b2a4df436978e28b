//! `mop memory …`: what an agent inside the sandbox runs. Everything goes through the
//! task's agent socket (`MOP_AGENT_SOCKET`), which answers only within the task's scope;
//! the memory directory itself is read-only.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use mop_agent::mcp::TaskScope;
use mop_cards::{CardId, CardType, MAX_BODY_BYTES, MAX_DESCRIPTION_CHARS, MAX_TITLE_CHARS, Scope};
use mop_proto::client::ControlError;
use mop_proto::inside;
use mop_proto::sync::NewCard;
use mop_proto::{Agent, AgentStoreRequest, Binding, RetrieveRequest};

/// The task's agent socket, from `MOP_AGENT_SOCKET` (which `mop run` sets).
pub fn agent() -> Result<Agent> {
    std::env::var_os(inside::env::AGENT_SOCKET)
        .map(Agent::new)
        .context(
            "MOP_AGENT_SOCKET is not set: `mop memory` works inside a task started by `mop run`",
        )
}

/// What a failed call says: the daemon's own message when it answered, else why the
/// socket could not be reached.
fn failed(agent: &Agent, e: ControlError) -> String {
    match e {
        ControlError::Answered { message, .. } => message,
        e => format!(
            "cannot reach the task's memory service at {}: {e}",
            agent.socket().display()
        ),
    }
}

/// `mop memory retrieve`.
pub async fn retrieve(query: &str, limit: Option<usize>, json: bool) -> Result<()> {
    let agent = agent()?;
    let req = RetrieveRequest {
        query: query.to_owned(),
        limit,
    };
    let r = agent
        .retrieve(&req)
        .await
        .map_err(|e| anyhow::anyhow!("retrieve failed: {}", failed(&agent, e)))?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    for h in &r.hits {
        let mut marks = h.marks();
        if h.mounted_at.is_some() {
            marks.push("mounted".to_owned());
        }
        let marks = marks.join(", ");
        // The marks come before the title, where no title can imitate or push them aside.
        println!(
            "{}  {}  {}{}",
            h.id,
            h.card_type,
            if marks.is_empty() {
                String::new()
            } else {
                format!("({marks})  ")
            },
            h.title,
        );
        if let Some(d) = &h.description {
            println!("    {d}");
        }
    }
    println!("{}", r.coverage);
    Ok(())
}

/// `mop memory get`.
pub async fn get(id: &str, save: bool) -> Result<()> {
    let agent = agent()?;
    let hint = "try `mop memory retrieve \"<words>\"` to find cards";
    let Ok(card) = CardId::parse(id) else {
        bail!(
            "{:?} is not a card id (a UUID); {hint}",
            id.chars().take(80).collect::<String>()
        );
    };
    let out = agent
        .get(&card)
        .await
        .map_err(|e| anyhow::anyhow!("{} ({hint})", failed(&agent, e)))?;
    if save {
        let path = save_copy(&card, &out)?;
        println!("saved to {}", path.display());
    } else {
        use std::io::Write;
        std::io::stdout().write_all(&out)?;
    }
    Ok(())
}

/// Writes a copy of card `id` into `$MOP_SAVED_DIR` (the sandbox's own `/run/mop/saved`,
/// gone with the task), readable by this user alone. Why not the working directory: a copy
/// there would outlive the task, and a later task could not tell it from a forgery an
/// earlier one left in its place.
fn save_copy(id: &CardId, text: &[u8]) -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = std::env::var_os(inside::env::SAVED_DIR).map(PathBuf::from).context(
        "MOP_SAVED_DIR is not set: --save works in a task that `mop run` started; print the card without --save",
    )?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create {} (MOP_SAVED_DIR)", dir.display()))?;
    let path = dir.join(format!("{id}.md"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// `mop memory list`.
pub async fn list(json: bool) -> Result<()> {
    let agent = agent()?;
    let r = agent
        .list()
        .await
        .map_err(|e| anyhow::anyhow!("list failed: {}", failed(&agent, e)))?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    for c in &r.cards {
        let marks = c.marks();
        println!(
            "{}  {}  {}{}  {}",
            c.id,
            c.card_type,
            if marks.is_empty() {
                String::new()
            } else {
                format!("({})  ", marks.join(", "))
            },
            c.title,
            c.mounted_at.as_deref().unwrap_or("")
        );
    }
    println!(
        "{} cards mounted of {} this task may see; `mop memory retrieve \"<query>\"` searches them all",
        r.cards.len(),
        r.visible
    );
    Ok(())
}

/// What `mop memory store` is given.
#[derive(clap::Args)]
pub struct StoreArgs {
    /// fact, preference, human_correction, error_resolution, pitfall, playbook or reference_doc.
    #[arg(long = "type")]
    pub card_type: String,
    /// One line, up to 200 characters.
    #[arg(long)]
    pub title: String,
    /// One line, up to 300 characters.
    #[arg(long)]
    pub description: Option<String>,
    /// Label (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Error code the card is about (repeatable).
    #[arg(long = "error-code")]
    pub error_codes: Vec<String>,
    /// Technology stack (repeatable).
    #[arg(long = "stack")]
    pub stacks: Vec<String>,
    /// Bind the card to the task's user (a personal card).
    #[arg(long)]
    pub personal: bool,
    /// Bind the card to the task's asset.
    #[arg(long)]
    pub asset: bool,
    /// Bind the card to the task's project: only tasks of that project will see it.
    #[arg(long)]
    pub project: bool,
    /// Read the card text from this file.
    #[arg(long)]
    pub content_file: Option<PathBuf>,
    /// Read the card text from stdin.
    #[arg(long)]
    pub content_stdin: bool,
}

/// `mop memory store`.
pub async fn store(a: StoreArgs, task: TaskScope) -> Result<()> {
    let card_type = CardType::parse(&a.card_type).with_context(|| {
        format!(
            "--type {:?}: must be one of {}",
            a.card_type,
            CardType::NAMES.join(", ")
        )
    })?;
    // Checked here as well as by the server, so an oversized card gets this message rather
    // than the socket's size refusal, and a huge input is never read whole.
    use std::io::Read;
    let limited = |r: &mut dyn Read, from: &str| -> Result<String> {
        let mut text = String::new();
        r.take(MAX_BODY_BYTES as u64 + 1)
            .read_to_string(&mut text)
            .with_context(|| format!("cannot read the card text from {from}"))?;
        if text.len() > MAX_BODY_BYTES {
            bail!(
                "the card text from {from} is over {} KiB, the most a card holds: split it into several cards, or store a summary that names the document",
                MAX_BODY_BYTES / 1024
            );
        }
        Ok(text)
    };
    let body = match (&a.content_file, a.content_stdin) {
        (Some(f), false) => {
            let mut file =
                std::fs::File::open(f).with_context(|| format!("cannot read {}", f.display()))?;
            limited(&mut file, &f.display().to_string())?
        }
        (None, true) => limited(&mut std::io::stdin(), "stdin")?,
        _ => bail!("give the card text with exactly one of --content-file FILE or --content-stdin"),
    };
    for (flag, value, max) in [
        ("--title", Some(&a.title), MAX_TITLE_CHARS),
        (
            "--description",
            a.description.as_ref(),
            MAX_DESCRIPTION_CHARS,
        ),
    ] {
        let n = value.map_or(0, |v| v.chars().count());
        if n > max {
            bail!("{flag} is {n} characters; at most {max} (put the detail in the card text)");
        }
    }
    let card = NewCard {
        card_type,
        title: a.title,
        description: a.description,
        labels: a.labels,
        error_codes: a.error_codes,
        stacks: a.stacks,
        scope: Scope::default(),
        body,
    };
    let want = Binding {
        personal: a.personal,
        asset: a.asset,
        project: a.project,
    };
    let req = AgentStoreRequest::bound(card, want, &task.viewer())
        .map_err(|e| anyhow::anyhow!("--{}: {e}", e.option()))?;
    let agent = agent()?;
    let r = agent
        .store(&req)
        .await
        .map_err(|e| anyhow::anyhow!("store refused: {}", failed(&agent, e)))?;
    println!("{}", r.summary());
    Ok(())
}

/// `mop memory feedback`.
pub async fn feedback(
    id: &str,
    verdict: mop_proto::receipts::Verdict,
    note: Option<String>,
) -> Result<()> {
    let agent = agent()?;
    let id = CardId::parse(id).map_err(|_| anyhow::anyhow!("{id:?} is not a card id (a UUID)"))?;
    let r = agent
        .feedback(&mop_proto::FeedbackRequest { id, verdict, note })
        .await
        .map_err(|e| anyhow::anyhow!("feedback on card {id} refused: {}", failed(&agent, e)))?;
    println!(
        "{} {}{}: {}",
        r.verdict.as_str(),
        r.id,
        if r.replaced {
            " (replaces this task's earlier verdict)"
        } else {
            ""
        },
        r.note
    );
    Ok(())
}

/// `mop memory store-status`.
pub async fn store_status(store_id: &str, json: bool) -> Result<()> {
    let agent = agent()?;
    let s = agent
        .store_status(store_id)
        .await
        .map_err(|e| anyhow::anyhow!("store {store_id}: {}", failed(&agent, e)))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!("{}: {}", s.state, s.message);
    if let Some(id) = s.id {
        println!("card: {id}");
    }
    println!(
        "queued at {}, {} tr{}",
        s.queued_at,
        s.attempts,
        if s.attempts == 1 { "y" } else { "ies" }
    );
    Ok(())
}
