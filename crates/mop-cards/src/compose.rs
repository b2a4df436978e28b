//! A workspace's cards together with those of the workspaces it inherits (server.toml
//! `[inheritance]`): the one manifest a daemon builds a task's generation from, so that
//! selection, ranking and retrieve's statistics all run over the combined set.
//!
//! The rules, in one place: the workspace's own cards all take part; an inherited card
//! takes part when it is verified (an inherited workspace's agent-written cards stay in
//! it until its curators verify them), unless an own card has its id, a live verified own
//! card bound to nothing supersedes it (`supersedes`: it replaces the card for every task
//! of the workspace, so only a card that reaches every task may), or an earlier inherited
//! workspace gave the same id. The server refuses ids that would collide (a card created
//! with an id a composed workspace holds); what collides anyway (an `[inheritance]` added
//! over existing cards) resolves as above. Each inherited entry carries the workspace it
//! came from (`inherited_from`), which MEMORY.md and `retrieve` name and ranking uses to
//! let the own workspace win ties.

use std::collections::HashSet;

use crate::id::CardId;
use crate::wire::{InheritedVersion, Manifest};

/// Why manifests cannot be composed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComposeError {
    /// A delta lists changes only; composing needs every card.
    #[error("workspace {0}: composing needs a full manifest, not a delta")]
    Delta(String),
    /// A manifest that came from a server claims to be composed already.
    #[error("workspace {0}: the manifest is a composed one")]
    Composed(String),
}

impl Manifest {
    /// True when this manifest was composed by a daemon (it names inherited cards).
    pub fn is_composed(&self) -> bool {
        !self.inherited.is_empty() || self.cards.iter().any(|e| e.inherited_from.is_some())
    }

    /// The workspace's own part of a (possibly composed) manifest: what its server sent.
    pub fn own(&self) -> Manifest {
        Manifest {
            cards: self
                .cards
                .iter()
                .filter(|e| e.inherited_from.is_none())
                .cloned()
                .collect(),
            inherited: Vec::new(),
            ..self.clone()
        }
    }
}

/// `own` (a full manifest of the task's workspace) with the cards of `inherited`, each a
/// full manifest of an inherited workspace, in the order the server names them. The result
/// keeps `own`'s version and "now", lists its cards by id, and records each inherited
/// workspace's version.
pub fn compose(own: Manifest, inherited: &[(&str, &Manifest)]) -> Result<Manifest, ComposeError> {
    if own.is_delta() {
        return Err(ComposeError::Delta("(own)".into()));
    }
    if own.is_composed() {
        return Err(ComposeError::Composed("(own)".into()));
    }
    let mut taken: HashSet<CardId> = own.cards.iter().map(|e| e.summary.id).collect();
    let replaced: HashSet<CardId> = own
        .cards
        .iter()
        // Only a person's word replaces a card for the whole workspace: an unverified card
        // (an agent's, or an import waiting for review) supersedes nothing yet. A card bound
        // to a user, asset, project or agent kind reaches only some tasks, and the others
        // would be left with neither card.
        .filter(|e| {
            e.summary.is_live() && !e.summary.is_unverified() && e.summary.scope.is_workspace()
        })
        .flat_map(|e| e.summary.supersedes.iter().copied())
        .collect();
    let mut out = own;
    for (ws, m) in inherited {
        if m.is_delta() {
            return Err(ComposeError::Delta((*ws).to_owned()));
        }
        if m.is_composed() {
            return Err(ComposeError::Composed((*ws).to_owned()));
        }
        let before = out.cards.len();
        for e in &m.cards {
            let id = e.summary.id;
            if e.summary.is_unverified() || replaced.contains(&id) || !taken.insert(id) {
                continue;
            }
            let mut e = e.clone();
            e.inherited_from = Some((*ws).to_owned());
            out.cards.push(e);
        }
        out.inherited.push(InheritedVersion {
            workspace: (*ws).to_owned(),
            epoch: m.epoch.clone(),
            revision: m.revision,
            cards: out.cards.len() - before,
        });
    }
    out.cards.sort_unstable_by_key(|e| e.summary.id);
    Ok(out)
}
