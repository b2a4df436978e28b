//! `mop-curate set`: a card's type, labels, scope and importance as flags, not YAML. The
//! change is computed against the card as read, and sent conditional on that version.

use anyhow::{Result, bail};
use clap::Args;
use mop_cards::{CardType, Scope};
use mop_proto::curation::FieldsRequest;

use crate::api::Connection;
use crate::{card_id, render};

/// `set`'s arguments.
#[derive(Args)]
pub struct SetArgs {
    /// The card id.
    id: String,
    /// Its type (fact, preference, human_correction, error_resolution, pitfall, playbook,
    /// reference_doc).
    #[arg(long = "type", value_name = "TYPE")]
    card_type: Option<String>,
    /// Add this label (repeatable).
    #[arg(long = "label", value_name = "LABEL")]
    add_labels: Vec<String>,
    /// Remove this label (repeatable).
    #[arg(long = "unlabel", value_name = "LABEL")]
    remove_labels: Vec<String>,
    /// Bind it to this user (a personal card).
    #[arg(long, conflicts_with = "no_user")]
    user: Option<String>,
    /// Bind it to no user.
    #[arg(long)]
    no_user: bool,
    /// Bind it to this asset.
    #[arg(long, conflicts_with = "no_asset")]
    asset: Option<String>,
    /// Bind it to no asset.
    #[arg(long)]
    no_asset: bool,
    /// Bind it to this project.
    #[arg(long, conflicts_with = "no_project")]
    project: Option<String>,
    /// Bind it to no project.
    #[arg(long)]
    no_project: bool,
    /// Bind it to this kind of agent (claude, codex …).
    #[arg(long, conflicts_with = "no_agent")]
    agent: Option<String>,
    /// Bind it to no kind of agent.
    #[arg(long)]
    no_agent: bool,
    /// Its importance, 0.0 to 1.0.
    #[arg(long)]
    importance: Option<f64>,
    /// The card's version as `show` printed it: refused (412) if it changed since
    /// [default: the version read just before].
    #[arg(long, value_name = "TAG")]
    version: Option<String>,
}

/// Reads the card, applies the flags to what it has, and sends the fields that change.
pub fn set(c: &Connection, a: SetArgs) -> Result<()> {
    let id = card_id(&a.id)?;
    let details = c.details(&id)?;
    let s = &details.card.summary;
    let card_type = a
        .card_type
        .as_deref()
        .map(|t| {
            CardType::parse(t).ok_or_else(|| {
                anyhow::anyhow!(
                    "--type {t:?} is not a card type; one of: {}",
                    CardType::ALL.map(CardType::as_str).join(", ")
                )
            })
        })
        .transpose()?;
    let mut labels = s.labels.clone();
    for l in &a.add_labels {
        let l = l.trim().to_lowercase();
        if !labels.contains(&l) {
            labels.push(l);
        }
    }
    for l in &a.remove_labels {
        let l = l.trim().to_lowercase();
        if !labels.contains(&l) {
            bail!(
                "card {id} has no label {l:?} to remove (it has: {})",
                s.labels.join(", ")
            );
        }
        labels.retain(|x| *x != l);
    }
    let mut scope = s.scope.clone();
    if a.no_user {
        scope.user_id = None;
    }
    if let Some(u) = a.user {
        scope.user_id = Some(u);
    }
    if a.no_asset {
        scope.asset_id = None;
    }
    if let Some(x) = a.asset {
        scope.asset_id = Some(x);
    }
    if a.no_project {
        scope.project_id = None;
    }
    if let Some(x) = a.project {
        scope.project_id = Some(x);
    }
    if a.no_agent {
        scope.agent = None;
    }
    if let Some(x) = a.agent {
        scope.agent = Some(x);
    }
    let req = FieldsRequest {
        card_type: card_type.filter(|t| *t != s.card_type),
        labels: (labels != s.labels).then_some(labels),
        scope: (scope != s.scope).then_some(scope.clone()),
        importance: a.importance.filter(|i| *i != s.importance),
    };
    if req == FieldsRequest::default() {
        println!("card {id} has these fields already; nothing to change");
        return Ok(());
    }
    let tag = a.version.unwrap_or_else(|| details.card.etag.clone());
    let change = c.set_fields(&id, &req, Some(&tag))?;
    println!(
        "card {id} ({}): {} (revision {})",
        render::safe(&s.title),
        describe(&req, &scope),
        change.revision
    );
    Ok(())
}

/// What a fields change sets, for people.
fn describe(req: &FieldsRequest, scope: &Scope) -> String {
    let mut out = Vec::new();
    if let Some(t) = req.card_type {
        out.push(format!("type {}", t.as_str()));
    }
    if let Some(l) = &req.labels {
        out.push(format!("labels [{}]", l.join(", ")));
    }
    if req.scope.is_some() {
        let bound: Vec<String> = scope
            .bindings()
            .map(|(axis, name)| format!("{axis} {}", render::safe(name)))
            .collect();
        if bound.is_empty() {
            out.push("scope the whole workspace".to_owned());
        } else {
            out.push(format!("scope {}", bound.join(", ")));
        }
    }
    if let Some(i) = req.importance {
        out.push(format!("importance {i}"));
    }
    out.join("; ")
}
