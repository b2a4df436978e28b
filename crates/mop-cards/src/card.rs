//! The OKF v1 card model: types and their pillar paths, the summary every manifest carries,
//! server-owned counters, and the validation rules of OKF.md that apply however a card
//! arrived (parsed from a file or decoded from JSON).

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::error::{CardError, Rule};
use crate::id::{CardId, is_scope_id, is_slug};
use crate::parse::MAX_FRONTMATTER_BYTES;

/// Longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;
/// Longest description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 300;
/// Longest error code, in characters.
pub const MAX_ERROR_CODE_CHARS: usize = 64;
/// Largest body, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most inherited cards one card may supersede.
pub const MAX_SUPERSEDES: usize = 64;
/// Importance of a card that does not set one.
pub const DEFAULT_IMPORTANCE: f64 = 0.5;

/// The kind of knowledge a card holds; it decides the card's pillar directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CardType {
    /// Environment facts, asset configuration baselines.
    Fact,
    /// Conventions; with `scope.user_id`, one person's preferences.
    Preference,
    /// A person's correction of earlier agent behaviour.
    HumanCorrection,
    /// How a specific error was resolved.
    ErrorResolution,
    /// Known traps, incident postmortems.
    Pitfall,
    /// Verified step-by-step procedures.
    Playbook,
    /// Long-form reference documentation.
    ReferenceDoc,
}

impl CardType {
    /// Every type, in the order OKF.md lists them.
    pub const ALL: [CardType; 7] = [
        CardType::Fact,
        CardType::Preference,
        CardType::HumanCorrection,
        CardType::ErrorResolution,
        CardType::Pitfall,
        CardType::Playbook,
        CardType::ReferenceDoc,
    ];

    /// Every type's OKF name, for error messages and `--help`.
    pub const NAMES: [&'static str; 7] = [
        "fact",
        "preference",
        "human_correction",
        "error_resolution",
        "pitfall",
        "playbook",
        "reference_doc",
    ];

    /// The OKF name (`human_correction`, …).
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Parses an OKF type name.
    pub fn parse(s: &str) -> Option<CardType> {
        Self::NAMES
            .iter()
            .position(|n| *n == s)
            .map(|i| Self::ALL[i])
    }

    /// The pillar directory, relative to a card directory, with a trailing slash.
    pub fn pillar_dir(self) -> &'static str {
        match self {
            CardType::Fact => "facts/specs/",
            CardType::Preference => "conventions/preferences/",
            CardType::HumanCorrection => "conventions/corrections/",
            CardType::ErrorResolution => "runbooks/errors/",
            CardType::Pitfall => "runbooks/pitfalls/",
            CardType::Playbook => "runbooks/playbooks/",
            CardType::ReferenceDoc => "docs/",
        }
    }

    /// What the pillar holds, as MEMORY.md's knowledge map explains it.
    pub fn pillar_holds(self) -> &'static str {
        match self {
            CardType::Fact => "environment facts, asset configuration baselines",
            CardType::Preference => "conventions and personal preferences",
            CardType::HumanCorrection => "people's corrections of earlier agent behaviour",
            CardType::ErrorResolution => "how specific errors were resolved",
            CardType::Pitfall => "known traps, incident postmortems",
            CardType::Playbook => "verified step-by-step procedures",
            CardType::ReferenceDoc => "long-form reference documentation",
        }
    }

    /// Whether an unscoped card of this type belongs to the L0 workspace baseline.
    pub fn is_baseline(self) -> bool {
        matches!(
            self,
            CardType::Fact
                | CardType::Preference
                | CardType::HumanCorrection
                | CardType::ReferenceDoc
        )
    }
}

impl fmt::Display for CardType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a person has vouched for a card.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Curated or confirmed by a person.
    #[default]
    Verified,
    /// Stored by an agent and not yet reviewed.
    Unverified,
}

impl Trust {
    /// The OKF spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Verified => "verified",
            Trust::Unverified => "unverified",
        }
    }
}

/// What a card is bound to. Empty means the whole workspace. Every binding narrows: a
/// task sees the card only when it matches each one the card has.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// Bound to one user: a personal card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Bound to one asset (host, database, cluster …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset_id: Option<String>,
    /// Bound to one project of the workspace (a repository, a service, a team): only
    /// tasks of that project see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// Bound to one kind of agent (`claude`, `codex`, `generic` …): only tasks started
    /// for that agent see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl Scope {
    /// True when the card is bound to nothing: every task of the workspace may see it.
    pub fn is_workspace(&self) -> bool {
        self.user_id.is_none()
            && self.asset_id.is_none()
            && self.project_id.is_none()
            && self.agent.is_none()
    }

    /// Each binding the card has, as (axis, name): `user`, `asset`, `project`, `agent`, in
    /// that order; what listings and details show.
    pub fn bindings(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("user", &self.user_id),
            ("asset", &self.asset_id),
            ("project", &self.project_id),
            ("agent", &self.agent),
        ]
        .into_iter()
        .filter_map(|(axis, v)| Some((axis, v.as_deref()?)))
    }

    /// True when the card is bound to neither a user nor an asset: within its project and
    /// agent kind (if any), it belongs to every task, as a workspace card does.
    pub fn is_shared(&self) -> bool {
        self.user_id.is_none() && self.asset_id.is_none()
    }
}

/// Who a task is, as the hard exclusions compare it with a card's [`Scope`]: each `None`
/// when the task has none (and then no card bound to that axis reaches it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Viewer<'a> {
    /// The task's user.
    pub user: Option<&'a str>,
    /// The task's asset.
    pub asset: Option<&'a str>,
    /// The task's project.
    pub project: Option<&'a str>,
    /// The kind of agent the task runs.
    pub agent: Option<&'a str>,
}

/// Where a card that did not come from a curator's hand came from: an agent task's store
/// (set by the server from daemon-asserted facts), or a curator's import of a file.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// The task that stored it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The author: an unverified card with an author reaches only that author's tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The asset the task targeted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset_id: Option<String>,
    /// The project the task belonged to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// The kind of agent the task ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The curator who imported it (an admin token's name), for an imported card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_by: Option<String>,
    /// The file it was imported from, as the curator named it (one section of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_from: Option<String>,
}

/// Why a task may not store a card as asked: the rules every layer applies (mopd's agent
/// socket before it sends, the card server again when it takes the store), written once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreRefusal {
    /// The store names no task, or not a valid task id.
    #[error(
        "provenance.task_id must be 1 to 64 characters of [A-Za-z0-9._-] starting with a letter or digit"
    )]
    NoTask,
    /// The task has no user: nobody is the author, and no task could see the card.
    #[error(
        "task {task} was started without a user, so nobody is the author of what it stores and \
         no task could see the card: stores from tasks without a user are refused. The runner \
         can start the task with --user NAME"
    )]
    NoAuthor {
        /// The storing task.
        task: String,
    },
    /// The card binds to another user than the task's.
    #[error(
        "card.scope.user_id names another user than the task's; a task may bind a card only to its own user"
    )]
    OtherUser,
    /// The card binds to another asset than the task's.
    #[error(
        "card.scope.asset_id names another asset than the task's; a task may bind a card only to its own asset"
    )]
    OtherAsset,
    /// The card binds to another project than the task's.
    #[error(
        "card.scope.project_id names another project than the task's; a task may bind a card only to its own project"
    )]
    OtherProject,
    /// The card binds to another kind of agent than the task's.
    #[error(
        "card.scope.agent names another agent than the task's; a task may bind a card only to its own kind of agent"
    )]
    OtherAgent,
}

/// The rules for a card a task stores, where `self` is the task's provenance (asserted by
/// its daemon, never chosen by the agent).
impl Provenance {
    /// Whether the task may store a card bound to `scope`: it needs a task id and a user
    /// (its author), and binds a card only to its own user and its own asset.
    pub fn permits(&self, scope: &Scope) -> Result<(), StoreRefusal> {
        self.task()?;
        self.author()?;
        self.binds(scope)
    }

    /// The storing task's id, when it is a valid one.
    pub fn task(&self) -> Result<&str, StoreRefusal> {
        self.task_id
            .as_deref()
            .filter(|t| crate::is_task_id(t))
            .ok_or(StoreRefusal::NoTask)
    }

    /// Whether `scope` binds a card only to the task's own user, asset, project and kind
    /// of agent.
    pub fn binds(&self, scope: &Scope) -> Result<(), StoreRefusal> {
        let own = |card: &Option<String>, task: &Option<String>| card.is_none() || card == task;
        if !own(&scope.user_id, &self.user_id) {
            return Err(StoreRefusal::OtherUser);
        }
        if !own(&scope.asset_id, &self.asset_id) {
            return Err(StoreRefusal::OtherAsset);
        }
        if !own(&scope.project_id, &self.project_id) {
            return Err(StoreRefusal::OtherProject);
        }
        if !own(&scope.agent, &self.agent) {
            return Err(StoreRefusal::OtherAgent);
        }
        Ok(())
    }

    /// The storing task as a [`Viewer`]: what it may see of the cards.
    pub fn viewer(&self) -> Viewer<'_> {
        Viewer {
            user: self.user_id.as_deref(),
            asset: self.asset_id.as_deref(),
            project: self.project_id.as_deref(),
            agent: self.agent.as_deref(),
        }
    }

    /// The author of what the task stores: its user.
    pub fn author(&self) -> Result<&str, StoreRefusal> {
        self.user_id
            .as_deref()
            .ok_or_else(|| StoreRefusal::NoAuthor {
                task: self.task_id.clone().unwrap_or_default(),
            })
    }
}

fn default_importance() -> f64 {
    DEFAULT_IMPORTANCE
}
fn default_true() -> bool {
    true
}
fn is_true(b: &bool) -> bool {
    *b
}
fn is_default_trust(t: &Trust) -> bool {
    *t == Trust::Verified
}
fn is_default_scope(s: &Scope) -> bool {
    s.is_workspace()
}

/// A card's frontmatter without its counters: what a manifest entry carries, and what tier
/// selection and MEMORY.md need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardSummary {
    /// The card id.
    pub id: CardId,
    /// The card type.
    #[serde(rename = "type")]
    pub card_type: CardType,
    /// One line, 1..200 characters.
    pub title: String,
    /// One line, up to 300 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Lowercase slugs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// User and asset binding.
    #[serde(default, skip_serializing_if = "is_default_scope")]
    pub scope: Scope,
    /// Codes this card resolves or warns about, as written in the card.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_codes: Vec<String>,
    /// Technology stacks (slugs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<String>,
    /// 0.0..=1.0.
    #[serde(default = "default_importance")]
    pub importance: f64,
    /// When the card was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
    /// When the card text last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Timestamp>,
    /// A disabled card never reaches a task.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub enabled: bool,
    /// The newer card that replaces this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<CardId>,
    /// Cards of an inherited workspace this one replaces for its own workspace's tasks
    /// (an override of an organisation card; the inherited card itself is unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supersedes: Vec<CardId>,
    /// Verified or unverified.
    #[serde(default, skip_serializing_if = "is_default_trust")]
    pub trust: Trust,
    /// Task provenance of an agent-stored card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

/// Who may see a card, by its trust (OKF.md "Tiers"): a verified card is workspace
/// memory; an unverified one reaches only its author's tasks; an unverified card with no
/// author (stored by a task that named no user) reaches no task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience<'a> {
    /// Verified: any task the scope allows.
    Everyone,
    /// Unverified: only tasks of this user.
    Author(&'a str),
    /// Unverified with no author: no task.
    Nobody,
}

impl CardSummary {
    /// The card's path inside a card directory: `<pillar>/<id>.md`.
    pub fn path(&self) -> String {
        card_path(self.card_type, &self.id)
    }

    /// Enabled and not superseded. (Archived cards never reach a manifest.)
    pub fn is_live(&self) -> bool {
        self.enabled && self.superseded_by.is_none()
    }

    /// True for an unverified (agent-stored, not yet checked by a person) card.
    pub fn is_unverified(&self) -> bool {
        self.trust == Trust::Unverified
    }

    /// The author an unverified card is restricted to: `None` for a verified card, and
    /// also for an unverified card with no author, which reaches no task at all (see
    /// [`CardSummary::audience`]).
    pub fn restricted_to_author(&self) -> Option<&str> {
        match self.trust {
            Trust::Unverified => self.provenance.as_ref()?.user_id.as_deref(),
            Trust::Verified => None,
        }
    }

    /// Which tasks may see this card, by its trust alone (the scope narrows it further).
    pub fn audience(&self) -> Audience<'_> {
        match (self.trust, self.restricted_to_author()) {
            (Trust::Verified, _) => Audience::Everyone,
            (Trust::Unverified, Some(author)) => Audience::Author(author),
            (Trust::Unverified, None) => Audience::Nobody,
        }
    }

    /// The hard exclusions of OKF.md for one card: live, not bound to another user,
    /// asset, project or kind of agent (nor to any when the task has none), and not an
    /// unverified card of another author. [`crate::Catalog`] applies the same rule with
    /// interned names for speed.
    pub fn is_visible_to(&self, who: &Viewer<'_>) -> bool {
        let ok = |card: Option<&str>, task: Option<&str>| card.is_none_or(|c| task == Some(c));
        let trusted = match self.audience() {
            Audience::Everyone => true,
            Audience::Author(author) => who.user == Some(author),
            Audience::Nobody => false,
        };
        self.is_live()
            && ok(self.scope.user_id.as_deref(), who.user)
            && ok(self.scope.asset_id.as_deref(), who.asset)
            && ok(self.scope.project_id.as_deref(), who.project)
            && ok(self.scope.agent.as_deref(), who.agent)
            && trusted
    }

    /// True when every task may see this card: live, bound to no user or asset, and
    /// verified. Everything else is restricted to some tasks (or to none).
    pub fn is_open(&self) -> bool {
        self.is_live() && self.scope.is_workspace() && self.trust == Trust::Verified
    }

    /// One sentence on who will see this card, for the agent that stored it: an
    /// unverified card reaches only its author's tasks (and, when asset-bound, only on
    /// that asset) until a person verifies it.
    pub fn audience_sentence(&self) -> String {
        let scope = &self.scope;
        let narrowed = [
            scope.asset_id.as_deref().map(|a| format!(" on asset {a}")),
            scope
                .project_id
                .as_deref()
                .map(|p| format!(" in project {p}")),
            scope
                .agent
                .as_deref()
                .map(|a| format!(" run for agent {a}")),
        ]
        .into_iter()
        .flatten()
        .collect::<String>();
        match self.audience() {
            Audience::Everyone => match self.scope.user_id.as_deref() {
                Some(u) => format!("verified: tasks of user {u}{narrowed} see it"),
                None if narrowed.is_empty() => {
                    "verified: every task of the workspace may see it".into()
                }
                None => format!("verified: tasks{narrowed} see it"),
            },
            Audience::Author(author) => format!(
                "unverified: only tasks of user {author}{narrowed} see it, until a curator verifies it"
            ),
            Audience::Nobody => {
                "unverified and without an author: no task sees it until a curator verifies it"
                    .into()
            }
        }
    }

    /// Checks every value rule of OKF.md. Parsing calls this, and so should anything that
    /// receives a summary as JSON.
    pub fn validate(&self) -> Result<(), CardError> {
        check_line("title", &self.title, 1, MAX_TITLE_CHARS)?;
        if let Some(d) = &self.description {
            check_line("description", d, 0, MAX_DESCRIPTION_CHARS)?;
        }
        check_slugs("labels", &self.labels)?;
        check_slugs("stacks", &self.stacks)?;
        for (i, code) in self.error_codes.iter().enumerate() {
            check_line(&format!("error_codes[{i}]"), code, 1, MAX_ERROR_CODE_CHARS)?;
        }
        check_scope_id("scope.user_id", self.scope.user_id.as_deref())?;
        check_scope_id("scope.asset_id", self.scope.asset_id.as_deref())?;
        check_scope_id("scope.project_id", self.scope.project_id.as_deref())?;
        if self
            .scope
            .agent
            .as_deref()
            .is_some_and(|a| !crate::is_slug(a))
        {
            return Err(CardError::field("scope.agent", Rule::Slug));
        }
        if let Some(p) = &self.provenance {
            check_scope_id("provenance.task_id", p.task_id.as_deref())?;
            check_scope_id("provenance.user_id", p.user_id.as_deref())?;
            check_scope_id("provenance.asset_id", p.asset_id.as_deref())?;
            check_scope_id("provenance.project_id", p.project_id.as_deref())?;
            if p.agent.as_deref().is_some_and(|a| !crate::is_slug(a)) {
                return Err(CardError::field("provenance.agent", Rule::Slug));
            }
            if let Some(by) = &p.imported_by {
                check_line("provenance.imported_by", by, 1, MAX_TITLE_CHARS)?;
            }
            if let Some(from) = &p.imported_from {
                check_line("provenance.imported_from", from, 1, MAX_DESCRIPTION_CHARS)?;
            }
        }
        if !(0.0..=1.0).contains(&self.importance) {
            return Err(CardError::field("importance", Rule::UnitInterval));
        }
        if self.supersedes.contains(&self.id) {
            return Err(CardError::field("supersedes", Rule::NotSelf));
        }
        if self.supersedes.len() > MAX_SUPERSEDES {
            return Err(CardError::field(
                "supersedes",
                Rule::TooMany(MAX_SUPERSEDES),
            ));
        }
        if self.superseded_by == Some(self.id) {
            return Err(CardError::field("superseded_by", Rule::NotSelf));
        }
        Ok(())
    }
}

/// The path of a card inside a card directory.
pub fn card_path(card_type: CardType, id: &CardId) -> String {
    format!("{}{}.md", card_type.pillar_dir(), id)
}

/// Counters. A file's values are those at import; afterwards the server's are authoritative
/// and travel in the manifest, so a reinforcement changes no file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// How often the card was stored or reinforced; at least 1.
    pub occurrence: u64,
    /// When it was last reinforced; defaults to `created_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Timestamp>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            occurrence: 1,
            last_seen: None,
        }
    }
}

/// A whole card: summary, counters, frontmatter keys this version does not know (kept so
/// they survive a round trip), and the Markdown body.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    /// The known frontmatter fields other than the counters.
    pub summary: CardSummary,
    /// `occurrence` and `last_seen` (defaulted to `created_at`).
    pub counters: Counters,
    /// Unknown frontmatter keys, in file order.
    pub extra: Extra,
    /// Markdown body: non-empty, at most 64 KiB.
    pub body: String,
}

impl Card {
    /// The card's path inside a card directory.
    pub fn path(&self) -> String {
        self.summary.path()
    }

    /// Checks every rule, summary and body.
    pub fn validate(&self) -> Result<(), CardError> {
        self.summary.validate()?;
        if self.counters.occurrence < 1 {
            return Err(CardError::field("occurrence", Rule::AtLeastOne));
        }
        // Measured as rendered, not as read: quoting can make a file's unknown keys longer
        // when written back, and a card the server stores must parse when it is read again.
        let size = crate::render::frontmatter(self).len();
        if size > MAX_FRONTMATTER_BYTES {
            return Err(CardError::FrontmatterTooLarge {
                size,
                max: MAX_FRONTMATTER_BYTES,
            });
        }
        check_body(&self.body)
    }
}

/// Frontmatter keys outside OKF v1, kept verbatim (as YAML values) and in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Extra(pub(crate) Vec<(yaml_rust2::Yaml, yaml_rust2::Yaml)>);

impl Extra {
    /// True when the card had no unknown keys.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The unknown keys that are strings, in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|(k, _)| k.as_str())
    }
}

pub(crate) fn check_body(body: &str) -> Result<(), CardError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(CardError::BodyTooLarge {
            size: body.len(),
            max: MAX_BODY_BYTES,
        });
    }
    if body.trim().is_empty() {
        return Err(CardError::EmptyBody);
    }
    if body.contains('\0') {
        return Err(CardError::NulInBody);
    }
    Ok(())
}

fn check_line(key: &str, value: &str, min: usize, max: usize) -> Result<(), CardError> {
    let chars = value.chars().count();
    let one_line = !value.contains(['\n', '\r', '\u{2028}', '\u{2029}'])
        && !value.chars().any(char::is_control);
    if !one_line || chars < min || chars > max || (min > 0 && value.trim().is_empty()) {
        return Err(CardError::field(key, Rule::OneLine { min, max }));
    }
    Ok(())
}

fn check_slugs(key: &str, values: &[String]) -> Result<(), CardError> {
    for (i, v) in values.iter().enumerate() {
        if !is_slug(v) {
            return Err(CardError::field(format!("{key}[{i}]"), Rule::Slug));
        }
    }
    Ok(())
}

fn check_scope_id(key: &str, value: Option<&str>) -> Result<(), CardError> {
    match value {
        Some(v) if !is_scope_id(v) => Err(CardError::field(key, Rule::ScopeId)),
        _ => Ok(()),
    }
}
