//! Curator ↔ card server (admin tokens): listings with provenance and usage, the review
//! queue, review actions, card versions, search and the staleness report. The curator CLI
//! (`mop-curate`) and the server's own pages are clients of exactly these types.
//!
//! Every card answer carries the card's version tag ([`card_etag`]); an edit or action sent
//! with `If-Match: <tag>` is refused with 412 when the card changed meanwhile, so two
//! curators never silently overwrite each other.

use jiff::Timestamp;
use mop_cards::{CardId, CardSummary, CardType, Provenance};

use crate::time::Stamp;

pub use crate::sync::{CredentialFinding, RejectionNote};
use serde::{Deserialize, Serialize};

/// A card's version tag: a strong entity tag over its stored bytes and whether it is
/// archived (an archive changes no byte but is a change a curator must see).
pub fn card_etag(sha256: &str, archived: bool) -> String {
    if archived {
        format!("\"{sha256}.archived\"")
    } else {
        format!("\"{sha256}\"")
    }
}

/// Default and largest page of a listing.
pub const DEFAULT_PAGE: usize = 50;
/// Largest page of a listing.
pub const MAX_PAGE: usize = 500;

/// How often a card reached tasks, from the daemons' receipts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tasks it was delivered to (mounted in their view), last 7 days.
    pub delivered_7d: u64,
    /// The same, last 30 days.
    pub delivered_30d: u64,
    /// Tasks whose agent got it from a retrieve, last 7 days.
    pub retrieved_7d: u64,
    /// The same, last 30 days.
    pub retrieved_30d: u64,
    /// The last delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivered_at: Option<Timestamp>,
    /// Hosts that delivered or retrieved it in the last 30 days, by the name their daemon
    /// reports: most recent first, at most 20.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// How the tasks it was delivered to in the last 30 days ended, as their runners said
    /// (a correlation: a card given to failing tasks did not make them fail).
    #[serde(default)]
    pub outcomes_30d: OutcomeCounts,
    /// What the agents that were given it said of it.
    #[serde(default)]
    pub feedback: FeedbackCounts,
}

/// Deliveries by how their task ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeCounts {
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that failed.
    pub failed: u64,
    /// Tasks whose runner said neither (or nothing).
    pub unknown: u64,
}

/// Agents' verdicts on one card (one per task: its latest).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackCounts {
    /// "Helped", last 7 days.
    pub helped_7d: u64,
    /// "Wrong", last 7 days.
    pub wrong_7d: u64,
    /// "Outdated", last 7 days.
    pub outdated_7d: u64,
    /// "Helped", last 30 days.
    pub helped_30d: u64,
    /// "Wrong", last 30 days.
    pub wrong_30d: u64,
    /// "Outdated", last 30 days.
    pub outdated_30d: u64,
    /// Distinct users whose tasks gave a verdict, last 30 days.
    pub users_30d: u64,
    /// Distinct hosts that reported one, last 30 days.
    pub hosts_30d: u64,
    /// Distinct users who said "wrong" or "outdated" since a curator last kept the card
    /// (within 30 days): the flag's measure.
    pub against_users: u64,
    /// The card is in the review queue as a flag item (a verified card, `against_users`
    /// at the server's `[intake] flag_min_users` or more).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flagged: bool,
    /// The latest notes, newest first (at most 10), since a curator last kept the card.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<FeedbackNote>,
}

/// One agent's note on a card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackNote {
    /// When the verdict was given.
    pub at: Timestamp,
    /// The verdict.
    pub verdict: crate::receipts::Verdict,
    /// The task's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The note (screened for credentials on the host and again here).
    pub note: String,
}

/// Where an agent-stored card came from: the card's own provenance (task, author, asset)
/// and what only the server knows (which host stored it, and when).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardProvenance {
    /// The storing task, its origin user (the author) and its asset.
    #[serde(flatten)]
    pub source: Provenance,
    /// The node token (id) of the host daemon that stored it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_token: Option<String>,
    /// When it was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_at: Option<Stamp>,
}

/// A card as curators see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardInfo {
    /// The frontmatter fields.
    pub summary: CardSummary,
    /// Version tag for `If-Match`.
    pub etag: String,
    /// Set while archived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived_at: Option<Stamp>,
    /// Server counter.
    pub occurrence: u64,
    /// Server counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Stamp>,
    /// How often tasks stored an equal card again.
    pub reinforcements: u64,
    /// For agent-stored cards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<CardProvenance>,
    /// Deliveries and retrievals.
    pub usage: Usage,
    /// Credentials found in its text (kind and place, never the value): such a card should
    /// be deleted for good or edited, not verified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialFinding>,
    /// The other cards stored as the same lesson (by tasks that could not see each
    /// other's), with this one: a curator reviews them as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_group: Option<DuplicateGroup>,
    /// A curator rejected this lesson before (the tombstone it matches). Filled where a
    /// curator decides: the review queue and a card's details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previously_rejected: Option<RejectionNote>,
    /// A curator rejected this card: it is archived, and a rejection is the last archive
    /// action in its history (an unarchive clears it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rejected: bool,
    /// The cards merged into this one, oldest merge first, each with its own provenance:
    /// the authors and tasks whose lesson this card now carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged: Vec<MergedCard>,
}

/// A card merged into another, as the card that stayed lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedCard {
    /// The merged card (superseded by the one that stayed).
    pub id: CardId,
    /// Its task, author and asset, when an agent stored it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

/// Where a card stands, in one word, as curators' listings show it. A card merged away or
/// rejected is no longer waiting for review, whatever trust its text still says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Live, vouched for by a person.
    Verified,
    /// Live, written by an agent, waiting for a curator.
    Unverified,
    /// Taken out of every task by a curator.
    Disabled,
    /// Replaced by another card (superseded, or merged into it).
    Superseded,
    /// Archived: out of every task, purged after the retention.
    Archived,
    /// Rejected by a curator: archived, with a tombstone of its lesson.
    Rejected,
}

impl Standing {
    /// The word listings show.
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Verified => "verified",
            Standing::Unverified => "unverified",
            Standing::Disabled => "disabled",
            Standing::Superseded => "superseded",
            Standing::Archived => "archived",
            Standing::Rejected => "rejected",
        }
    }
}

impl CardInfo {
    /// Where the card stands: what happened to it last wins (rejected or archived, then
    /// superseded, then disabled), and only a live card is verified or unverified.
    pub fn standing(&self) -> Standing {
        let s = &self.summary;
        if self.archived_at.is_some() {
            if self.rejected {
                Standing::Rejected
            } else {
                Standing::Archived
            }
        } else if s.superseded_by.is_some() {
            Standing::Superseded
        } else if !s.enabled {
            Standing::Disabled
        } else if s.trust == mop_cards::Trust::Unverified {
            Standing::Unverified
        } else {
            Standing::Verified
        }
    }

    /// Whether the card waits in the review queue: live and unverified.
    pub fn awaits_review(&self) -> bool {
        self.standing() == Standing::Unverified
    }
}

/// Cards stored as one lesson.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DuplicateGroup {
    /// The group's id (its first card).
    pub id: String,
    /// Every card in it, oldest first (this one included).
    pub members: Vec<CardId>,
}

/// A rejection tombstone as curators list it (`GET …/rejections`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// Its id (what `lift` takes).
    pub id: String,
    /// The card that was rejected (purged after the archive retention; the tombstone
    /// stays).
    pub card_id: CardId,
    /// The curator's reason.
    pub reason: String,
    /// Who rejected it (the actor) and their name, when the token has one.
    pub actor: String,
    /// The token's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_name: Option<String>,
    /// When.
    pub at: Stamp,
    /// When it was lifted, and by whom; a lifted tombstone refuses nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifted_at: Option<Stamp>,
    /// Who lifted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifted_by: Option<String>,
}

/// A card that carries credentials (`GET …/credentials`): id and findings only, never
/// its title or text (which may hold the credential).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialCard {
    /// The card.
    pub id: CardId,
    /// Set while archived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived_at: Option<Stamp>,
    /// Kinds and places.
    pub findings: Vec<CredentialFinding>,
}

/// Filters of `GET /v1/workspaces/{ws}/cards` and `GET /v1/workspaces/{ws}/search` (a
/// query string; `q` is the search text, for `search` only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Free text to search for (`search` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    /// Only unverified cards waiting for review (true: live, not merged away, rejected or
    /// disabled; what the review queue holds) or only verified cards (false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unverified: Option<bool>,
    /// Only this type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub card_type: Option<String>,
    /// Only cards with this label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Only cards bound to this asset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset: Option<String>,
    /// Only cards bound to this project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Only cards bound to this kind of agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Only cards bound to (or, unverified, authored by) this user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Only cards delivered to no task in this many days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_days: Option<u32>,
    /// Only cards made more than this many days ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older_than_days: Option<u32>,
    /// Only the cards of this duplicate group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Include archived cards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived: Option<bool>,
    /// Entries to skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// Page size ([`DEFAULT_PAGE`], at most [`MAX_PAGE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// A page of cards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardPage {
    /// Cards matching the filters, in all.
    pub total: usize,
    /// Where this page starts.
    pub offset: usize,
    /// This page.
    pub cards: Vec<CardInfo>,
}

/// A card close to another, by BM25 over the workspace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Nearest {
    /// The card.
    pub id: CardId,
    /// Its type.
    #[serde(rename = "type")]
    pub card_type: CardType,
    /// Its title.
    pub title: String,
    /// True when unverified.
    pub unverified: bool,
    /// BM25 score.
    pub score: f32,
}

/// One entry of the review queue: one lesson. A card stored once is an entry of its own;
/// the cards of a duplicate group waiting together are one entry, the oldest as `card` and
/// the others as `variants`, so a curator decides the lesson once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewItem {
    /// The unverified card (a group's oldest waiting card).
    pub card: CardInfo,
    /// Its whole text (frontmatter and body) at the version `card.etag` names: what a
    /// verify would make workspace memory.
    pub text: String,
    /// Live cards closest to it, best first (a merge candidate is usually the first).
    pub nearest: Vec<Nearest>,
    /// What a rendering of `text` leaves out that an agent reading the file still reads
    /// (invisible characters, extra table cells, unused link definitions, unknown
    /// frontmatter keys), in words. A reviewer verifies such a card only after reading its
    /// whole raw text.
    #[serde(default)]
    pub unshown: Vec<String>,
    /// The duplicate group this entry stands for, when `card` is in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The group's other waiting cards, oldest first, each with its whole text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<Variant>,
    /// A flag item: `card` is verified memory that agents of enough distinct users said
    /// is wrong or outdated (`card.usage.feedback` has the counts and notes). A curator
    /// edits it, archives it, or keeps it as it is (which clears the flag).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flagged: bool,
}

impl ReviewItem {
    /// Every waiting card of the entry, `card` first.
    pub fn cards(&self) -> impl Iterator<Item = (&CardInfo, &str)> {
        std::iter::once((&self.card, self.text.as_str()))
            .chain(self.variants.iter().map(|v| (&v.card, v.text.as_str())))
    }
}

/// How a variant's text differs from the base's, line by line (blank lines and leading or
/// trailing spaces ignored): what a curator reads before picking a base, and the lines a
/// combination may take over from another variant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Differences {
    /// Lines of the variant's body the base's body lacks, in the variant's order.
    pub added: Vec<String>,
    /// Lines of the base's body the variant's body lacks, in the base's order.
    pub missing: Vec<String>,
}

impl Differences {
    /// The differences of the card text `variant` from the card text `base` (their bodies;
    /// a text that is not a card is taken whole).
    pub fn between(base: &str, variant: &str) -> Differences {
        fn lines(text: &str) -> Vec<&str> {
            let body = mop_cards::card_body(text.as_bytes()).unwrap_or(text);
            body.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect()
        }
        let (b, v) = (lines(base), lines(variant));
        let only = |of: &[&str], not_in: &[&str]| {
            let mut out: Vec<String> = Vec::new();
            for l in of {
                if !not_in.contains(l) && !out.iter().any(|o| o == l) {
                    out.push((*l).to_owned());
                }
            }
            out
        };
        Differences {
            added: only(&v, &b),
            missing: only(&b, &v),
        }
    }

    /// True when the bodies hold the same lines.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.missing.is_empty()
    }
}

/// Another waiting card of a duplicate group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// The card.
    pub card: CardInfo,
    /// Its whole text at the version `card.etag` names.
    pub text: String,
    /// What a rendering of `text` leaves out (as [`ReviewItem::unshown`]).
    #[serde(default)]
    pub unshown: Vec<String>,
}

/// `GET /v1/workspaces/{ws}/review`: the lessons waiting, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewQueue {
    /// Entries in all (a duplicate group counts once).
    pub total: usize,
    /// Unverified live cards in all (every variant counts).
    #[serde(default)]
    pub cards: usize,
    /// Where this page starts.
    pub offset: usize,
    /// This page.
    pub items: Vec<ReviewItem>,
    /// The whole queue counted by type and age.
    #[serde(default)]
    pub counts: ReviewCounts,
}

impl ReviewCounts {
    /// Entries in all.
    pub fn total(&self) -> usize {
        self.under_1d + self.under_7d + self.under_30d + self.older
    }
}

/// The review queue counted, an entry (a lone card or a group) once, its age the age of
/// its oldest card: what a curator has ahead of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewCounts {
    /// Entries per card type (types with none are left out).
    pub by_type: std::collections::BTreeMap<String, usize>,
    /// Of the entries, verified cards agents flagged as wrong or outdated.
    #[serde(default)]
    pub flagged: usize,
    /// Entries younger than a day.
    pub under_1d: usize,
    /// One to seven days old.
    pub under_7d: usize,
    /// Seven to thirty days old.
    pub under_30d: usize,
    /// Older than thirty days.
    pub older: usize,
}

/// Paging of the review queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Entries to skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// Page size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// One audit row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRow {
    /// Order of mutations.
    pub seq: i64,
    /// The card, absent for workspace-wide rows (counter publication).
    pub card_id: Option<String>,
    /// Workspace revision the change produced (or the current one, for changes the
    /// manifest does not show yet).
    pub revision: u64,
    /// When.
    pub at: Stamp,
    /// Token id (`token:<id>`), or `cli:<command>`.
    pub actor: String,
    /// The name of the person behind an admin token, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_name: Option<String>,
    /// What.
    pub action: String,
    /// Hash before.
    pub sha256_before: Option<String>,
    /// Hash after.
    pub sha256_after: Option<String>,
    /// Card text after the change; `None` when redacted or not applicable.
    pub content: Option<String>,
    /// True once a purge or hard delete removed the content.
    pub redacted: bool,
    /// Extra facts (outcome of a store, superseding card, a rejection's reason, …).
    pub detail: Option<String>,
}

/// `GET /v1/workspaces/{ws}/cards/{id}/details`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardDetails {
    /// The card.
    pub card: CardInfo,
    /// Its whole text at the version `card.etag` names.
    pub text: String,
    /// Its audit history, oldest first.
    pub history: Vec<HistoryRow>,
}

/// What a card mutation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardChange {
    /// The card.
    pub id: CardId,
    /// The workspace revision after the change.
    pub revision: u64,
    /// The card file's hash after the change (absent once deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// False when the request changed nothing (same bytes).
    pub changed: bool,
    /// The card's version tag after the change (absent once deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

/// `POST …/cards/{id}/reject`: archive an unverified card, saying why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectRequest {
    /// Why (1 to 500 characters; kept in the history).
    pub reason: String,
}

/// `POST …/cards/{id}/merge`: fold a card into an existing one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeRequest {
    /// The card that stays; it takes over the merged card's counters.
    pub into: CardId,
    /// Verify `into` in the same action: a merge into an unverified card needs it (only
    /// its author's tasks would see the lesson otherwise). Needs `into_version`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify: bool,
    /// The version of `into` the curator read (its ETag): what `verify` makes workspace
    /// memory, refused (412) if `into` changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub into_version: Option<String>,
}

/// `POST /v1/workspaces/{ws}/groups/{group}/combine`: a duplicate group becomes one card.
/// `into` stays, verified, with `text` when given; every card of `variants` other than
/// `into` is merged into it (counters summed, each author's provenance listed). It is one
/// transaction, and it is refused (409) when the group's waiting cards are no longer
/// exactly `variants`, so a variant stored meanwhile is never merged unread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CombineRequest {
    /// The card that stays: one of the group (its base text), or any live card of the
    /// workspace (found by search).
    pub into: CardId,
    /// The version of `into` the curator read (its ETag); 412 if it changed since.
    pub into_version: String,
    /// The group's waiting cards as the curator saw them.
    pub variants: Vec<CardId>,
    /// The whole text `into` gets (frontmatter and body, its own id): the base text as
    /// the curator edited it. Absent: `into` keeps its text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// What a bulk action does to each card it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    /// Verify each (a card whose text carries a credential stops the whole action).
    Verify,
    /// Reject each, with one reason.
    Reject,
    /// Add one label to each.
    Label,
}

/// `POST /v1/workspaces/{ws}/bulk`: without `confirm`, a preview of the cards `filter`
/// matches; with it, the action on each, if exactly the cards the preview showed still
/// match (else 409 and nothing changes). All of it is one transaction, one audit row per
/// card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// Which cards: the listing's filters (no search text and no paging: every match
    /// counts).
    pub filter: ListQuery,
    /// What to do to each.
    pub action: BulkAction,
    /// Why (a rejection's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The label to add.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The cards the preview showed: act only if exactly these match now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm: Option<Vec<CardId>>,
}

/// A card a bulk action matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkItem {
    /// The card.
    pub id: CardId,
    /// Its type.
    #[serde(rename = "type")]
    pub card_type: CardType,
    /// Its title.
    pub title: String,
}

/// What a bulk request matched, and whether it acted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkAnswer {
    /// Every card matched, by id.
    pub cards: Vec<BulkItem>,
    /// True once the action was applied to each (false: a preview).
    pub done: bool,
    /// The workspace revision after the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// One file sent for import: its path as the curator names it (it decides how the file is
/// read: `CLAUDE.md`, `memories/MEMORY.md` …) and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportFile {
    /// The path, `/`-separated, relative to what the curator imports.
    pub path: String,
    /// The file's UTF-8 text.
    pub text: String,
}

/// `POST /v1/workspaces/{ws}/import`: files read as cards (`mop_intake::import` says how).
/// A section becomes an unverified card with no author, waiting for review, its provenance
/// "imported by CURATOR from FILE"; an OKF card is taken as it is, with its id. With
/// `dry_run`, nothing changes and the answer says what would be created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    /// The files.
    pub files: Vec<ImportFile>,
    /// Only say what would happen.
    #[serde(default)]
    pub dry_run: bool,
    /// Bind Claude Code `user` memories (one person's) to this user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// What an import did (or would do) with one card.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportOutcome {
    /// A new card (with a dry run: one would be made).
    Created,
    /// A new card in the duplicate group of a card with the same lesson.
    Grouped,
}

/// A card an import made (or would make).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedCard {
    /// The file it came from.
    pub file: String,
    /// Its id (with a dry run, the id it would have had: not kept).
    pub id: CardId,
    /// Its type.
    #[serde(rename = "type")]
    pub card_type: CardType,
    /// Its title.
    pub title: String,
    /// What happened.
    pub outcome: ImportOutcome,
    /// The card of the same lesson it joins, for [`ImportOutcome::Grouped`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with: Option<CardId>,
}

/// A file or section an import left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportSkip {
    /// The file.
    pub file: String,
    /// The section's title, when one section was left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Why, and what to do.
    pub reason: String,
}

/// `POST …/import`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportAnswer {
    /// The cards made, in file and section order.
    pub cards: Vec<ImportedCard>,
    /// What was left out.
    pub skipped: Vec<ImportSkip>,
    /// False for a dry run.
    pub done: bool,
    /// The workspace revision after the import, when it changed anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// `POST …/cards/{id}/{disable|enable|archive|unarchive}`: an optional body with why,
/// kept in the card's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StateRequest {
    /// Why (one line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST …/cards/{id}/fields`: a card's fields set as a curator's form or flags give them,
/// its text otherwise kept; a field left out stays as it is. Conditional on the version
/// (`If-Match`) like every edit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FieldsRequest {
    /// The card's type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub card_type: Option<CardType>,
    /// Every label the card has (lowercase slugs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    /// Its binding to a user and an asset (`{}`: the whole workspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<mop_cards::Scope>,
    /// 0.0 ..= 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub importance: Option<f64>,
}

/// `POST …/cards/{id}/revert`: the card's text becomes an earlier version's again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevertRequest {
    /// The history row (its `seq`) whose text to restore: the card's own, one that kept
    /// text (a store, create, update, verify with edits, import or revert).
    pub seq: i64,
}

/// `POST …/cards/{id}/supersede`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupersedeRequest {
    /// The newer card.
    pub by: CardId,
}

/// A search hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchHit {
    /// The card.
    pub card: CardInfo,
    /// BM25 score.
    pub score: f32,
}

/// The answer to a search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResults {
    /// Hits, best first.
    pub hits: Vec<SearchHit>,
    /// Cards searched: those the filters chose (archived ones only when asked).
    pub searched: usize,
}

/// `GET /v1/workspaces/{ws}/stale` parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaleQuery {
    /// The window, in days (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub days: Option<u32>,
    /// Supersede chains longer than this are reported (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<usize>,
}

/// A card the staleness report names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaleCard {
    /// The card.
    pub id: CardId,
    /// Its type.
    #[serde(rename = "type")]
    pub card_type: CardType,
    /// Its title.
    pub title: String,
    /// True when unverified.
    pub unverified: bool,
    /// Its asset, when bound to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset_id: Option<String>,
    /// When it was made (its `created_at`, else when the server first had it).
    pub created_at: Stamp,
    /// Its last delivery, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivered_at: Option<Timestamp>,
    /// When a task last named its asset, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset_last_named_at: Option<Timestamp>,
}

/// A chain of supersessions, oldest first; the last card is the live one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    /// The cards, oldest first.
    pub ids: Vec<CardId>,
    /// The live card's title.
    pub title: String,
}

/// The staleness report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaleReport {
    /// The window used.
    pub days: u32,
    /// The chain length used.
    pub chain: usize,
    /// Live cards made before the window that no task received in it.
    pub undelivered: Vec<StaleCard>,
    /// Live asset-bound cards whose asset no task named in the window.
    pub unnamed_assets: Vec<StaleCard>,
    /// Supersede chains longer than `chain`.
    pub long_chains: Vec<Chain>,
    /// Unverified live cards older than the window.
    pub old_unverified: Vec<StaleCard>,
    /// Live cards delivered to at least five tasks in the window, most of which failed
    /// (by their runners' word): a correlation to look into, not a cause.
    #[serde(default)]
    pub failing: Vec<FailingCard>,
}

/// A card delivered mostly to failing tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailingCard {
    /// The card.
    pub card: StaleCard,
    /// Tasks it was delivered to in the window.
    pub delivered: u64,
    /// How they ended.
    pub outcomes: OutcomeCounts,
}

/// `POST /v1/workspaces/{ws}/tokens`-style token rows are managed by `mop-server token`;
/// this is how curators' tools show them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRow {
    /// Public id.
    pub id: String,
    /// `node` or `admin`.
    pub role: String,
    /// Workspaces in scope.
    pub workspaces: Vec<String>,
    /// The person behind an admin token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Free note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Creation time.
    pub created_at: Stamp,
    /// When it stops working, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Stamp>,
    /// Its last use (recorded at most once a minute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<Stamp>,
    /// Revocation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Stamp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_the_lines_only_one_side_has() {
        let base = "---\nid: 1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7\ntype: fact\ntitle: T\n---\nRestart the pool.\n\nThen check the lag.\n";
        let variant = "---\nid: 2528fa6d-2786-4c33-9e4e-a2e4e84ca7d7\ntype: fact\ntitle: T2\n---\n  Restart the pool.\nUse --force on db-1.\n";
        let d = Differences::between(base, variant);
        assert_eq!(d.added, vec!["Use --force on db-1."]);
        assert_eq!(d.missing, vec!["Then check the lag."]);
        // Frontmatter differences are not body lines; the same body is no difference.
        assert!(Differences::between(base, base).is_empty());
    }

    #[test]
    fn provenance_travels_flat_with_the_servers_own_facts() {
        let json = r#"{"task_id":"t1","user_id":"alice","node_token":"n1","stored_at":"2026-12-06T13:00:00.000000Z"}"#;
        let p: CardProvenance = serde_json::from_str(json).unwrap();
        assert_eq!(p.source.task_id.as_deref(), Some("t1"));
        assert_eq!(p.source.user_id.as_deref(), Some("alice"));
        assert_eq!(p.node_token.as_deref(), Some("n1"));
        assert_eq!(serde_json::to_string(&p).unwrap(), json);
    }
}
