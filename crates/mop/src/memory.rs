//! `mop memory …`: what an agent inside the sandbox runs. Everything goes through the
//! task's agent socket (`MOP_AGENT_SOCKET`), which answers only within the task's scope;
//! the memory directory itself is read-only.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use mop_cards::{CardType, MAX_BODY_BYTES, MAX_DESCRIPTION_CHARS, MAX_TITLE_CHARS, Scope};
use mop_proto::client::{ControlError, request};
use mop_proto::sync::{NewCard, StoreOutcome};
use mop_proto::{
    AgentStoreRequest, AgentStoreResponse, ListResponse, RetrieveRequest, RetrieveResponse,
};

fn socket() -> Result<PathBuf> {
    std::env::var_os("MOP_AGENT_SOCKET")
        .map(PathBuf::from)
        .context(
            "MOP_AGENT_SOCKET is not set: `mop memory` works inside a task started by `mop run`",
        )
}

async fn call(method: &str, path: &str, body: Option<Vec<u8>>) -> Result<(u16, Vec<u8>)> {
    let s = socket()?;
    request(&s, method, path, body).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot reach the task's memory service at {}: {e}",
            s.display()
        )
    })
}

/// The message of an error answer.
fn message(code: u16, body: &[u8]) -> String {
    match ControlError::answered(code, body) {
        ControlError::Answered { message, .. } => message,
        e => e.to_string(),
    }
}

/// `mop memory retrieve`.
pub async fn retrieve(query: &str, limit: Option<usize>, json: bool) -> Result<()> {
    let body = serde_json::to_vec(&RetrieveRequest {
        query: query.to_owned(),
        limit,
    })?;
    let (code, out) = call("POST", "/v1/retrieve", Some(body)).await?;
    if code != 200 {
        bail!("retrieve failed: {}", message(code, &out));
    }
    if json {
        println!("{}", String::from_utf8_lossy(&out));
        return Ok(());
    }
    let r: RetrieveResponse = serde_json::from_slice(&out)?;
    for h in &r.hits {
        let marks = [
            h.unverified.then_some("unverified"),
            h.mounted_at.as_ref().map(|_| "mounted"),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ");
        println!(
            "{}  {}  {}{}",
            h.id,
            h.card_type,
            h.title,
            if marks.is_empty() {
                String::new()
            } else {
                format!("  ({marks})")
            }
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
    let (code, out) = call("GET", &format!("/v1/cards/{id}"), None).await?;
    if code != 200 {
        bail!(
            "{} (try `mop memory retrieve \"<words>\"` to find cards)",
            message(code, &out)
        );
    }
    if save {
        let workdir = std::env::var_os("MOP_WORKDIR")
            .map(PathBuf::from)
            .unwrap_or(std::env::current_dir()?);
        let dir = workdir.join(".memory");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("{id}.md"));
        std::fs::write(&path, &out).with_context(|| format!("cannot write {}", path.display()))?;
        println!("saved to {}", path.display());
    } else {
        use std::io::Write;
        std::io::stdout().write_all(&out)?;
    }
    Ok(())
}

/// `mop memory list`.
pub async fn list(json: bool) -> Result<()> {
    let (code, out) = call("GET", "/v1/cards", None).await?;
    if code != 200 {
        bail!("list failed: {}", message(code, &out));
    }
    if json {
        println!("{}", String::from_utf8_lossy(&out));
        return Ok(());
    }
    let r: ListResponse = serde_json::from_slice(&out)?;
    for c in &r.cards {
        println!(
            "{}  {}  {}{}  {}",
            c.id,
            c.card_type,
            c.title,
            if c.unverified { " (unverified)" } else { "" },
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

/// What `mop memory store` was given.
pub struct StoreArgs {
    /// Card type.
    pub card_type: CardType,
    /// Title.
    pub title: String,
    /// Description.
    pub description: Option<String>,
    /// Labels.
    pub labels: Vec<String>,
    /// Error codes.
    pub error_codes: Vec<String>,
    /// Stacks.
    pub stacks: Vec<String>,
    /// Bind to the task's user.
    pub personal: bool,
    /// Bind to the task's asset.
    pub asset: bool,
    /// Body from a file.
    pub content_file: Option<PathBuf>,
    /// Body from stdin.
    pub content_stdin: bool,
}

/// `mop memory store`.
pub async fn store(a: StoreArgs, user: Option<String>, asset: Option<String>) -> Result<()> {
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
    let scope = Scope {
        user_id: if a.personal {
            Some(user.context("--personal: this task has no user")?)
        } else {
            None
        },
        asset_id: if a.asset {
            Some(asset.context("--asset: this task has no asset")?)
        } else {
            None
        },
    };
    let req = AgentStoreRequest {
        card: NewCard {
            card_type: a.card_type,
            title: a.title,
            description: a.description,
            labels: a.labels,
            error_codes: a.error_codes,
            stacks: a.stacks,
            scope,
            body,
        },
    };
    let (code, out) = call("POST", "/v1/store", Some(serde_json::to_vec(&req)?)).await?;
    if code != 200 {
        bail!("store refused: {}", message(code, &out));
    }
    let r: AgentStoreResponse = serde_json::from_slice(&out)?;
    let what = match r.outcome {
        StoreOutcome::Created => "created a new unverified card",
        StoreOutcome::Reinforced => "reinforced an equal card (counters only)",
        StoreOutcome::Extended => "extended your unverified card with the new text",
        StoreOutcome::Unchanged => {
            "this task already reinforced an equal card; a task counts once per card, nothing changed"
        }
    };
    println!("{}: {what} ({})", r.outcome_word(), r.id);
    if !r.audience.is_empty() {
        println!("who sees it: {}", r.audience);
    }
    Ok(())
}

trait OutcomeWord {
    fn outcome_word(&self) -> &'static str;
}

impl OutcomeWord for AgentStoreResponse {
    fn outcome_word(&self) -> &'static str {
        match self.outcome {
            StoreOutcome::Created => "created",
            StoreOutcome::Reinforced => "reinforced",
            StoreOutcome::Extended => "extended",
            StoreOutcome::Unchanged => "unchanged",
        }
    }
}

/// The task's user and asset, which the agent socket knows; `store --personal/--asset`
/// needs them only to fill the scope, and the daemon checks them again.
pub fn task_scope_from_env() -> (Option<String>, Option<String>) {
    (
        std::env::var("MOP_TASK_USER").ok(),
        std::env::var("MOP_TASK_ASSET").ok(),
    )
}
