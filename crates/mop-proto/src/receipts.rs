//! Task receipts: what a daemon delivered to one task and what the task's agent did
//! through its socket. Kept on the host (`mop receipt TASK`) and reported to the card
//! server in batches (`POST /v1/workspaces/{ws}/receipts`), where they become per-card
//! usage counters.
//!
//! A receipt holds ids, hashes and counts only: no card text and no query text. A
//! retrieval's query is kept as a keyed hash (the key stays on the host), so repeated
//! queries can be told apart without the server being able to guess short ones.

use jiff::Timestamp;
use mop_cards::{CardId, Tier, is_scope_id, is_sha256_hex, is_slug, is_task_id};
use serde::{Deserialize, Serialize};

/// The `schema` of every receipt this version writes.
pub const RECEIPT_SCHEMA: &str = "mop.receipt/1";

/// Most retrieves, gets and stores a receipt lists one by one; past that, only counted
/// (in [`Activity::unlisted`]), so a chatty agent cannot grow a receipt without bound.
pub const MAX_EVENTS: usize = 200;

/// Most cards one receipt lists (a view mounts 50 by default); past that they are only
/// counted, in [`Receipt::cards_unlisted`]. With [`MAX_EVENTS`] this keeps the largest
/// receipt well under the server's default body limit of 1 MiB.
pub const MAX_RECEIPT_CARDS: usize = 2_000;

/// Most bytes of receipts (as JSON) a daemon sends in one batch.
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

/// Most receipts in one report batch.
pub const MAX_BATCH: usize = 200;

/// One task's receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// Always [`RECEIPT_SCHEMA`].
    pub schema: String,
    /// The task.
    pub task_id: String,
    /// Its workspace.
    pub workspace: String,
    /// The host that ran it (its host name).
    pub host: String,
    /// The generation the view was built from, `<epoch>-<revision>`.
    pub generation: String,
    /// The sandbox profile.
    pub profile: String,
    /// Who asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// What the task targeted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset_id: Option<String>,
    /// The project it belonged to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// The kind of agent it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// When the task was prepared; with the task id, what makes a receipt unique (a task
    /// id may be used again once its task has ended).
    pub prepared_at: Timestamp,
    /// When the task ended; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    /// Every mounted card, best first (at most [`MAX_RECEIPT_CARDS`]).
    pub cards: Vec<ReceiptCard>,
    /// Mounted cards past [`MAX_RECEIPT_CARDS`], counted only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cards_unlisted: usize,
    /// Selected cards the mount cap left out, per tier (L0, L1, L2).
    pub left_out: [usize; 3],
    /// What the agent did through its socket.
    pub activity: Activity,
    /// How the task ended, as its runner said: `mop run` from the agent's exit status,
    /// `mop release --outcome` from the runner's own judgement. Absent when nobody said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// The agent's exit status (`mop run`), or 128 plus the signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// What `mop run` captured of the agent CLI's own memory at the task's end (its stores
    /// are in `activity.stores`, marked `captured`), and the working directory's memory
    /// files the task changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<Capture>,
}

/// How a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The task did what it was for.
    Success,
    /// It did not.
    Failure,
    /// Nobody can tell (an agent killed by a signal, a runner that does not judge).
    Unknown,
}

impl Outcome {
    /// Its name on the wire and on command lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Unknown => "unknown",
        }
    }

    /// The outcome an exit status means: 0 succeeded, 1 to 125 failed, and the rest
    /// (a shell's "not found" and "cannot run", a signal) tell nothing of the task.
    pub fn of_exit(code: i32) -> Outcome {
        match code {
            0 => Outcome::Success,
            1..=125 => Outcome::Failure,
            _ => Outcome::Unknown,
        }
    }
}

impl std::str::FromStr for Outcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "success" => Ok(Outcome::Success),
            "failure" => Ok(Outcome::Failure),
            "unknown" => Ok(Outcome::Unknown),
            _ => Err(format!(
                "{s:?} is not an outcome: say success, failure or unknown"
            )),
        }
    }
}

/// An agent's word on a card its task could see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The card held and the agent relied on it.
    Helped,
    /// The card is wrong.
    Wrong,
    /// The card was right once and is not any more.
    Outdated,
}

impl Verdict {
    /// Every verdict, in the order reports show them.
    pub const ALL: [Verdict; 3] = [Verdict::Helped, Verdict::Wrong, Verdict::Outdated];

    /// Its name on the wire and on command lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Helped => "helped",
            Verdict::Wrong => "wrong",
            Verdict::Outdated => "outdated",
        }
    }

    /// True for the verdicts that speak against a card.
    pub fn is_against(self) -> bool {
        self != Verdict::Helped
    }
}

impl std::str::FromStr for Verdict {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "helped" => Ok(Verdict::Helped),
            "wrong" => Ok(Verdict::Wrong),
            "outdated" => Ok(Verdict::Outdated),
            _ => Err(format!(
                "{s:?} is not a verdict: say helped, wrong or outdated"
            )),
        }
    }
}

/// Most characters of a feedback note: a sentence on what was wrong, not a card.
pub const MAX_FEEDBACK_NOTE: usize = 500;

/// Most bytes of notes one receipt carries: past it a verdict is kept without its note,
/// so that notes cannot take a receipt past what the server takes in one request.
pub const MAX_NOTES_BYTES: usize = 32 * 1024;

/// One verdict of the task's agent on a card (the latest per card: a later verdict on the
/// same card replaces it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackEvent {
    /// When.
    pub at: Timestamp,
    /// The card.
    pub id: CardId,
    /// The verdict.
    pub verdict: Verdict,
    /// What the agent found, at most [`MAX_FEEDBACK_NOTE`] characters, screened for
    /// credentials as a store is: the one piece of agent text a receipt carries, because
    /// the curator acting on a flag needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What `mop run` captured at a task's end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capture {
    /// The agent CLI (`claude`, `codex`).
    pub agent: String,
    /// False when capture was off (the profile's `capture.native_memory`, or `mop run
    /// --no-capture`): the CLI's own memory was turned off for the task too, so nothing
    /// was written to be lost.
    pub enabled: bool,
    /// Memory files found new or changed at the end and proposed as stores.
    pub files: usize,
    /// Files left out, each once, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<CaptureSkip>,
    /// The working directory's memory files (`CLAUDE.md`, `CLAUDE.local.md`,
    /// `AGENTS.md`) the task created, changed or deleted. They stay the runner's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workdir_edits: Vec<WorkdirEdit>,
}

impl Capture {
    /// Checks what a server stores: hashes, short reasons and the known file names only.
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if self.agent.len() > 32 || self.skipped.len() > MAX_CAPTURE_SKIPS {
            return Err((
                "capture",
                "must name an agent of at most 32 bytes and list at most 100 skipped files",
            ));
        }
        if self
            .skipped
            .iter()
            .any(|s| s.reason.len() > 32 || s.sha256.as_deref().is_some_and(|h| !is_sha256_hex(h)))
        {
            return Err(("capture.skipped", "must be hashes and short reasons"));
        }
        if self.workdir_edits.len() > WORKDIR_MEMORY_FILES.len()
            || self.workdir_edits.iter().any(|w| {
                !WORKDIR_MEMORY_FILES.contains(&w.file.as_str())
                    || !["created", "modified", "deleted"].contains(&w.change.as_str())
                    || w.sha256.as_deref().is_some_and(|h| !is_sha256_hex(h))
            })
        {
            return Err((
                "capture.workdir_edits",
                "must name CLAUDE.md, CLAUDE.local.md or AGENTS.md, each once, as created, modified or deleted",
            ));
        }
        Ok(())
    }
}

/// Most files a capture lists as skipped (past it, the rest are not listed).
pub const MAX_CAPTURE_SKIPS: usize = 100;

/// A memory file a capture left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureSkip {
    /// Its content's SHA-256, when it could be read (never its name: agents name their
    /// files after what they learned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Why: `index` (the CLI's own index of its files), `too_large`, `not_a_file` (a link,
    /// a directory, a hard-linked file), `unreadable`, `not_memory` (no section with text),
    /// `too_many` (past the capture's file cap).
    pub reason: String,
}

/// One of the working directory's memory files, as the task left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkdirEdit {
    /// The file, relative to the working directory (one of [`WORKDIR_MEMORY_FILES`]).
    pub file: String,
    /// `created`, `modified` or `deleted`.
    pub change: String,
    /// Its content's SHA-256 after the task, unless deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Sections of it proposed as cards (the profile's `capture.workdir_memory =
    /// "propose"`); their stores are in `activity.stores`, marked `captured`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub proposed: usize,
}

/// The working directory's files agent CLIs keep memory and instructions in, which `mop
/// run` watches.
pub const WORKDIR_MEMORY_FILES: [&str; 3] = ["CLAUDE.md", "CLAUDE.local.md", "AGENTS.md"];

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One card a task was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptCard {
    /// The card.
    pub id: CardId,
    /// Its file's hash in the task's generation.
    pub sha256: String,
    /// Its tier.
    pub tier: Tier,
    /// Its place in the task's ranking, from 1.
    pub rank: u32,
    /// Mounted in the view (every listed card is; a card the cap left out is only
    /// counted in `left_out`).
    pub mounted: bool,
    /// Listed by name in MEMORY.md (Primary Anchors or the recommendations table), not
    /// only mounted.
    pub listed: bool,
    /// The inherited workspace it came from; absent for the task's own workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// What an agent did through its task's socket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Activity {
    /// Searches, in order.
    #[serde(default)]
    pub retrieves: Vec<RetrieveEvent>,
    /// Cards read in full, in order.
    #[serde(default)]
    pub gets: Vec<GetEvent>,
    /// Stores, in order.
    #[serde(default)]
    pub stores: Vec<StoreEvent>,
    /// Verdicts on cards, one per card (the latest), in the order first given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feedback: Vec<FeedbackEvent>,
    /// Events past [`MAX_EVENTS`] of a kind: counted here, not listed.
    #[serde(default)]
    pub unlisted: u64,
}

/// One search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrieveEvent {
    /// When.
    pub at: Timestamp,
    /// Keyed SHA-256 of the query (hex); never the query.
    pub query_hash: String,
    /// The cards it returned, best first.
    pub hits: Vec<CardId>,
}

/// One card read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetEvent {
    /// When.
    pub at: Timestamp,
    /// The card asked for.
    pub id: CardId,
    /// False when it was not found (or not the task's to see).
    pub found: bool,
}

/// What became of a store a task made, as its receipt records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreEventOutcome {
    /// A new card.
    Created,
    /// The same lesson as a card the task could see: counted for it.
    Reinforced,
    /// Already counted for this task.
    Unchanged,
    /// The host keeps it until the server takes it; replaced by what the server answered
    /// then.
    Queued,
    /// Refused, here or by the server (with the status and code).
    Refused,
    /// The host could not keep it.
    Failed,
    /// Queued past `spool.max_age_secs`.
    Dropped,
}

impl StoreEventOutcome {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreEventOutcome::Created => "created",
            StoreEventOutcome::Reinforced => "reinforced",
            StoreEventOutcome::Unchanged => "unchanged",
            StoreEventOutcome::Queued => "queued",
            StoreEventOutcome::Refused => "refused",
            StoreEventOutcome::Failed => "failed",
            StoreEventOutcome::Dropped => "dropped",
        }
    }
}

impl From<crate::sync::StoreOutcome> for StoreEventOutcome {
    fn from(o: crate::sync::StoreOutcome) -> Self {
        use crate::sync::StoreOutcome;
        match o {
            StoreOutcome::Created => StoreEventOutcome::Created,
            StoreOutcome::Reinforced => StoreEventOutcome::Reinforced,
            StoreOutcome::Unchanged => StoreEventOutcome::Unchanged,
            StoreOutcome::Queued => StoreEventOutcome::Queued,
        }
    }
}

impl std::fmt::Display for StoreEventOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreEvent {
    /// When.
    pub at: Timestamp,
    /// What became of it.
    pub outcome: StoreEventOutcome,
    /// The card it created or reinforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CardId>,
    /// The HTTP status of a refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The store's id (its idempotency key), as `mop memory store-status` and `mopd
    /// status` name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_id: Option<String>,
    /// A refusal's error code (`credential`, `rejected`, `store_quota`, …): the kind,
    /// never the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// True for a store `mop run` made at the task's end from the agent CLI's own memory
    /// or the working directory's memory files, not one the agent made.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub captured: bool,
}

impl StoreEvent {
    /// A store refused now, here or by the card server, with its HTTP status and code.
    pub fn refused(status: u16, code: &str) -> StoreEvent {
        StoreEvent {
            at: Timestamp::now(),
            outcome: StoreEventOutcome::Refused,
            id: None,
            status: Some(status),
            store_id: None,
            code: Some(code.to_owned()),
            captured: false,
        }
    }
}

impl Activity {
    /// Adds an event to `list` unless it is full, in which case it is only counted.
    pub fn push<T>(list: &mut Vec<T>, unlisted: &mut u64, event: T) {
        if list.len() < MAX_EVENTS {
            list.push(event);
        } else {
            *unlisted += 1;
        }
    }

    /// True when the task's agent met card `id`: a retrieve returned it or a get read it
    /// (or, with events past the cap only counted, when that cannot be told). With the
    /// cards the task was given, the cards its verdicts may be about.
    pub fn met(&self, id: &CardId) -> bool {
        self.unlisted > 0
            || self.gets.iter().any(|g| g.found && g.id == *id)
            || self.retrieves.iter().any(|r| r.hits.contains(id))
    }

    /// Every card a retrieve returned, each once, in first-seen order.
    pub fn retrieved(&self) -> Vec<CardId> {
        let mut seen = std::collections::BTreeSet::new();
        self.retrieves
            .iter()
            .flat_map(|r| r.hits.iter().copied())
            .filter(|id| seen.insert(*id))
            .collect()
    }
}

/// Why a receipt is not acceptable; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("receipt {task}: {field} {problem}")]
pub struct ReceiptError {
    /// The receipt's task id (shortened).
    pub task: String,
    /// The field.
    pub field: &'static str,
    /// What is wrong.
    pub problem: String,
}

impl Receipt {
    /// Checks every field a server stores or counts by.
    pub fn validate(&self) -> Result<(), ReceiptError> {
        let fail = |field, problem: &str| ReceiptError {
            task: self.task_id.chars().take(64).collect(),
            field,
            problem: problem.to_owned(),
        };
        if self.schema != RECEIPT_SCHEMA {
            return Err(fail("schema", &format!("must be {RECEIPT_SCHEMA}")));
        }
        if !is_task_id(&self.task_id) {
            return Err(fail(
                "task_id",
                "must be a task id ([A-Za-z0-9._-], 1 to 64)",
            ));
        }
        if !is_slug(&self.workspace) {
            return Err(fail("workspace", "must be a workspace slug"));
        }
        if !is_scope_id(&self.host) {
            return Err(fail(
                "host",
                "must be 1 to 128 characters, no control characters",
            ));
        }
        if self.agent.as_deref().is_some_and(|a| !is_slug(a)) {
            return Err(fail("agent", "must be a lowercase slug"));
        }
        for (field, v) in [
            ("user_id", &self.user_id),
            ("asset_id", &self.asset_id),
            ("project_id", &self.project_id),
        ] {
            if v.as_deref().is_some_and(|v| !is_scope_id(v)) {
                return Err(fail(
                    field,
                    "must be 1 to 128 characters, no control characters",
                ));
            }
        }
        if self.generation.len() > 128 || self.profile.len() > 128 {
            return Err(fail("generation", "and profile must be at most 128 bytes"));
        }
        if self.ended_at.is_some_and(|end| end < self.prepared_at) {
            return Err(fail("ended_at", "must not be before prepared_at"));
        }
        if self.cards.len() > MAX_RECEIPT_CARDS {
            return Err(fail(
                "cards",
                &format!("must list at most {MAX_RECEIPT_CARDS}"),
            ));
        }
        for c in &self.cards {
            if c.workspace.as_deref().is_some_and(|w| !is_slug(w)) {
                return Err(fail("cards[].workspace", "must be a workspace slug"));
            }
            if !is_sha256_hex(&c.sha256) {
                return Err(fail("cards[].sha256", "must be 64 lowercase hex digits"));
            }
        }
        let a = &self.activity;
        if a.retrieves.len() > MAX_EVENTS
            || a.gets.len() > MAX_EVENTS
            || a.stores.len() > MAX_EVENTS
        {
            return Err(fail(
                "activity",
                &format!("lists at most {MAX_EVENTS} events of a kind"),
            ));
        }
        if a.feedback.len() > MAX_EVENTS {
            return Err(fail(
                "activity.feedback",
                &format!("lists at most {MAX_EVENTS} verdicts"),
            ));
        }
        if a.feedback
            .iter()
            .filter_map(|f| f.note.as_ref())
            .map(String::len)
            .sum::<usize>()
            > MAX_NOTES_BYTES
        {
            return Err(fail(
                "activity.feedback",
                &format!("carries at most {MAX_NOTES_BYTES} bytes of notes"),
            ));
        }
        for f in &a.feedback {
            if let Some(note) = &f.note
                && (note.chars().count() > MAX_FEEDBACK_NOTE
                    || note.chars().any(|c| c.is_control() && c != '\n'))
            {
                return Err(fail(
                    "activity.feedback[].note",
                    &format!(
                        "must be at most {MAX_FEEDBACK_NOTE} characters, no control characters but newlines"
                    ),
                ));
            }
        }
        if let Some(c) = &self.capture {
            c.validate()
                .map_err(|(field, problem)| fail(field, problem))?;
        }
        for r in &a.retrieves {
            if !is_sha256_hex(&r.query_hash) {
                return Err(fail(
                    "activity.retrieves[].query_hash",
                    "must be 64 lowercase hex digits",
                ));
            }
            if r.hits.len() > 50 {
                return Err(fail(
                    "activity.retrieves[].hits",
                    "must list at most 50 cards",
                ));
            }
        }
        Ok(())
    }
}

/// `POST /v1/workspaces/{ws}/receipts` (node token): receipts of ended tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptBatch {
    /// At most [`MAX_BATCH`] receipts of this workspace.
    pub receipts: Vec<Receipt>,
}

/// The answer to a receipt batch. Sending the same receipt again is not an error: it is
/// counted once, and answered as a duplicate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptBatchResponse {
    /// Receipts counted now.
    pub accepted: usize,
    /// Receipts the server had counted before.
    pub duplicates: usize,
    /// Receipts of tasks prepared too long ago to be counted (the server keeps what it
    /// needs to count each receipt once for a limited time only).
    #[serde(default)]
    pub too_old: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> Receipt {
        Receipt {
            schema: RECEIPT_SCHEMA.into(),
            task_id: "etl-1".into(),
            workspace: "acme".into(),
            host: "host-1".into(),
            generation: "e-1".into(),
            profile: "default".into(),
            user_id: Some("alice".into()),
            asset_id: None,
            project_id: None,
            agent: None,
            prepared_at: Timestamp::UNIX_EPOCH,
            ended_at: None,
            cards: vec![],
            cards_unlisted: 0,
            left_out: [0; 3],
            activity: Activity::default(),
            outcome: None,
            exit_code: None,
            capture: None,
        }
    }

    #[test]
    fn events_past_the_cap_are_counted_not_listed() {
        let mut a = Activity::default();
        for _ in 0..MAX_EVENTS + 3 {
            Activity::push(
                &mut a.gets,
                &mut a.unlisted,
                GetEvent {
                    at: Timestamp::UNIX_EPOCH,
                    id: CardId::from_uuid(uuid_zero()),
                    found: true,
                },
            );
        }
        assert_eq!(a.gets.len(), MAX_EVENTS);
        assert_eq!(a.unlisted, 3);
    }

    fn uuid_zero() -> mop_cards::Uuid {
        mop_cards::Uuid::nil()
    }

    #[test]
    fn validation_names_the_field() {
        assert!(receipt().validate().is_ok());
        let mut bad = receipt();
        bad.task_id = "../x".into();
        assert_eq!(bad.validate().unwrap_err().field, "task_id");
        let mut bad = receipt();
        bad.activity.retrieves.push(RetrieveEvent {
            at: Timestamp::UNIX_EPOCH,
            query_hash: "what was searched".into(),
            hits: vec![],
        });
        let e = bad.validate().unwrap_err();
        assert_eq!(e.field, "activity.retrieves[].query_hash");
        // The message names the receipt and field, never echoes the bad value.
        assert!(!e.to_string().contains("what was searched"), "{e}");
    }
}
