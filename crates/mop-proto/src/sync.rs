//! Card server ↔ daemon: the `<epoch>-<revision>` version both sides name a manifest by,
//! stores from tasks, and the object batch framing with its one decoder.
//!
//! The manifest ([`Manifest`], [`ManifestEntry`]) is also the card engine's input, so it
//! is defined in `mop-cards` and re-exported here: one definition.
//!
//! The batch answer frames each object as `<sha256> <size>\n<bytes>\n`, or
//! `<sha256> missing\n` for one the server no longer has. [`BatchDecoder`] decodes it
//! incrementally, in whatever chunks the network delivers, into a [`BatchSink`] (the
//! daemon's writes objects into its pool as they stream; [`CollectItems`] keeps them in
//! memory).

use std::fmt;
use std::str::FromStr;

use mop_cards::{CardId, is_epoch, is_sha256_hex};
use serde::{Deserialize, Serialize};

pub use mop_cards::{EntryError, Manifest, ManifestEntry};

/// A point in a workspace's history: the database epoch (a UUID made when the server
/// database was created) and the workspace revision within it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version {
    /// The server database's epoch.
    pub epoch: String,
    /// The workspace revision, bumped by every change the manifest shows.
    pub revision: u64,
}

impl Version {
    /// The version a manifest describes.
    pub fn of(manifest: &Manifest) -> Version {
        Version {
            epoch: manifest.epoch.clone(),
            revision: manifest.revision,
        }
    }

    /// The manifest's weak entity tag: `W/"<epoch>-<revision>"`.
    pub fn etag(&self) -> String {
        format!("W/\"{self}\"")
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.epoch, self.revision)
    }
}

/// Why a `<epoch>-<revision>` string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a manifest version; expected <epoch uuid>-<revision number>")]
pub struct VersionError(String);

impl FromStr for Version {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || VersionError(s.chars().take(100).collect());
        // The epoch is a UUID and holds hyphens itself, so split at the last one.
        let (epoch, revision) = s.rsplit_once('-').ok_or_else(bad)?;
        if !is_epoch(epoch) {
            return Err(bad());
        }
        if revision.is_empty() || !revision.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let revision = revision.parse().map_err(|_| bad())?;
        Ok(Version {
            epoch: epoch.to_owned(),
            revision,
        })
    }
}

/// The task a store comes from, and the rules for what it may store: one provenance type,
/// the card's own, which the daemon asserts and the server records on the card.
pub use mop_cards::{Provenance, StoreRefusal};

/// A card an agent proposes; the server assigns id, trust and provenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewCard {
    /// The card type.
    #[serde(rename = "type")]
    pub card_type: mop_cards::CardType,
    /// One line, 1..200 characters.
    pub title: String,
    /// One line, up to 300 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Lowercase slugs.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Error codes the card resolves.
    #[serde(default)]
    pub error_codes: Vec<String>,
    /// Technology stacks.
    #[serde(default)]
    pub stacks: Vec<String>,
    /// Binding to the task's own user and/or asset (checked against the provenance).
    #[serde(default)]
    pub scope: mop_cards::Scope,
    /// Markdown body.
    pub body: String,
}

impl NewCard {
    /// The card these fields make: a new id, made `now`, seen once, at the default
    /// importance, with `trust` and `provenance` as its writer gives them. The one place a
    /// card is built from fields: an agent's store (unverified, the task's provenance) and
    /// a curator's create (verified, none).
    pub fn into_card(
        self,
        trust: mop_cards::Trust,
        provenance: Option<mop_cards::Provenance>,
        now: jiff::Timestamp,
    ) -> mop_cards::Card {
        let summary = mop_cards::CardSummary {
            id: CardId::random(),
            card_type: self.card_type,
            title: self.title,
            description: self.description,
            labels: self.labels,
            scope: self.scope,
            error_codes: self.error_codes,
            stacks: self.stacks,
            importance: mop_cards::DEFAULT_IMPORTANCE,
            created_at: Some(now),
            updated_at: None,
            enabled: true,
            superseded_by: None,
            supersedes: Vec::new(),
            trust,
            provenance,
        };
        mop_cards::Card {
            summary,
            counters: mop_cards::Counters {
                occurrence: 1,
                last_seen: Some(now),
            },
            extra: mop_cards::Extra::default(),
            body: self.body,
        }
    }

    /// Every field of the card as text, by name: what credential screening reads.
    pub fn text_fields(&self) -> [(&'static str, String); 6] {
        [
            ("title", self.title.clone()),
            ("description", self.description.clone().unwrap_or_default()),
            ("body", self.body.clone()),
            ("labels", self.labels.join(" ")),
            ("error_codes", self.error_codes.join(" ")),
            ("stacks", self.stacks.join(" ")),
        ]
    }
}

/// `POST /v1/workspaces/{ws}/memories`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreRequest {
    /// Asserted by the daemon: the task (required), its user and its asset.
    pub provenance: Provenance,
    /// The proposed card.
    pub card: NewCard,
}

/// The header a store's idempotency key travels in: a daemon sends the same key with
/// every attempt of one store (a direct one that timed out, every replay of a queued one),
/// and the server answers a key it has seen with its first answer.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The error codes (`{"error": code, …}`) a refused store can carry; the daemon classifies
/// refusals by these, never by their message.
pub mod store_errors {
    /// The card carries a credential (422); the answer lists the findings.
    pub const CREDENTIAL: &str = "credential";
    /// A curator rejected this lesson before (422); the answer says when and why.
    pub const REJECTED: &str = "rejected";
    /// The task made the most stores one task may make (429, no `Retry-After`).
    pub const QUOTA: &str = "store_quota";
    /// The node token is over its store rate (429 with `Retry-After`): send it again later.
    pub const RATE: &str = "too_many_requests";
    /// The request breaks a rule (422).
    pub const INVALID: &str = "invalid";
    /// The task may not store (403).
    pub const FORBIDDEN: &str = "forbidden";
}

/// A credential found in a card: its kind (the screening rule that found it) and where it
/// starts. Never the value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CredentialFinding {
    /// The kind: `aws-access-token`, `private-key`, `github-pat`, `url-password`, …
    pub kind: String,
    /// The field: `title`, `description`, `body`, `labels`, … (in a card file, the
    /// frontmatter key or `body`).
    pub field: String,
    /// Line in the field, from 1.
    pub line: u32,
    /// Column in the line, in characters, from 1.
    pub column: u32,
}

impl fmt::Display for CredentialFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} in {} (line {}, column {})",
            self.kind, self.field, self.line, self.column
        )
    }
}

/// What a refused store is told about the credentials in it (`what`: "the card"): the
/// kind and place of each, never a value, and what to do instead. The server and a daemon
/// that refuses before queueing say the same.
pub fn credential_refusal(what: &str, findings: &[CredentialFinding]) -> String {
    format!(
        "{what} carries {} credential(s): {}; nothing was stored. Store the lesson without the credential (name where it lives, e.g. the vault path, instead)",
        findings.len(),
        findings
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    )
}

/// A curator's rejection of a lesson, as a later store that repeats it is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionNote {
    /// The tombstone.
    pub id: String,
    /// When (RFC 3339).
    pub at: String,
    /// The curator's reason.
    pub reason: String,
}

/// What a store did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreOutcome {
    /// A new unverified card.
    Created,
    /// The same lesson as a card the task can see: its counters went up, nothing else
    /// changed.
    Reinforced,
    /// The same lesson as a card this task already reinforced or stored: a task counts
    /// once per card, so nothing changed.
    Unchanged,
    /// The card server could not take it now; the host daemon keeps it on disk and sends
    /// it when the server is back (follow it by `store_id`).
    Queued,
}

impl StoreOutcome {
    /// The outcome as one word, as the wire spells it.
    pub fn word(self) -> &'static str {
        match self {
            StoreOutcome::Created => "created",
            StoreOutcome::Reinforced => "reinforced",
            StoreOutcome::Unchanged => "unchanged",
            StoreOutcome::Queued => "queued",
        }
    }

    /// What it means for the agent that stored.
    pub fn meaning(self) -> &'static str {
        match self {
            StoreOutcome::Created => "created a new unverified card",
            StoreOutcome::Reinforced => {
                "the same lesson as a card this task can see; that card's counters went up, nothing else changed"
            }
            StoreOutcome::Unchanged => {
                "this task already stored or reinforced the same lesson; a task counts once per card, nothing changed"
            }
            StoreOutcome::Queued => {
                "the card server cannot take it now; this host keeps it on disk and sends it when the server is back"
            }
        }
    }
}

/// The answer to a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreResponse {
    /// What happened.
    pub outcome: StoreOutcome,
    /// The card created or reinforced (none while queued).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CardId>,
    /// The workspace revision after the store (a reinforcement shows in the manifest only
    /// when counters are next published; 0 while queued).
    #[serde(default)]
    pub revision: u64,
    /// Who will see the card, in one sentence (an unverified card reaches only its
    /// author's tasks until a curator verifies it).
    #[serde(default)]
    pub audience: String,
    /// For a reinforcement: whether a person verified the card it reinforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
    /// What to do next, in a sentence or two (how to read the card that already covers
    /// the lesson, how to follow a queued store).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// The store's id (its idempotency key): what the receipt, `mopd status` and
    /// `mop memory store-status` follow it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_id: Option<String>,
    /// Set when the lesson matches one a curator rejected and the server is configured to
    /// queue such stores (marked) rather than refuse them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previously_rejected: Option<RejectionNote>,
}

impl StoreResponse {
    /// The answer as `mop memory store` and the MCP tool print it: the outcome and card,
    /// then who sees it and what to do next, a line each.
    pub fn summary(&self) -> String {
        let mut out = format!("{}: {}", self.outcome.word(), self.outcome.meaning());
        if let Some(id) = &self.id {
            out.push_str(&format!(" ({id})"));
        }
        if let Some(store_id) = &self.store_id {
            out.push_str(&format!("\nstore id: {store_id}"));
        }
        if !self.audience.is_empty() {
            out.push_str(&format!("\nwho sees it: {}", self.audience));
        }
        if let Some(r) = &self.previously_rejected {
            out.push_str(&format!(
                "\npreviously rejected: a curator rejected this lesson on {}: {}",
                r.at, r.reason
            ));
        }
        if !self.note.is_empty() {
            out.push_str(&format!("\n{}", self.note));
        }
        out
    }
}

/// `POST /v1/workspaces/{ws}/objects/batch`: the objects a daemon wants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectBatchRequest {
    /// Object hashes (64 lowercase hex digits each).
    pub sha256: Vec<String>,
}

/// The content type of a batch answer.
pub const OBJECT_BATCH_TYPE: &str = "application/x-mop-objects";

/// The header of every manifest answer (a 304 too) of a workspace that inherits others:
/// their names, comma-separated, in the order the server's `[inheritance]` gives them.
/// Absent: it inherits none.
pub const INHERITS_HEADER: &str = "mop-inherits";

/// Longest header line of a batch item (`<64 hex> <size>`), with room to spare.
const MAX_HEADER: usize = 200;

/// Appends one item to a batch answer: the object's bytes, or `None` when it is gone.
pub fn encode_batch_item(out: &mut Vec<u8>, sha256: &str, body: Option<&[u8]>) {
    match body {
        Some(b) => {
            out.extend_from_slice(format!("{sha256} {}\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.push(b'\n');
        }
        None => out.extend_from_slice(format!("{sha256} missing\n").as_bytes()),
    }
}

/// Why a batch answer cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object batch is malformed at byte {offset}: {problem}")]
pub struct BatchError {
    /// Where, from the start of the answer.
    pub offset: u64,
    /// What.
    pub problem: &'static str,
}

/// Where decoded items go. Each item is `begin`, then `data` in order (possibly in
/// several pieces, none for an empty object), then `end`; or a single `missing`.
pub trait BatchSink {
    /// What the sink's own failures look like (a batch error must convert into it).
    type Error: From<BatchError>;
    /// An object of `size` bytes starts.
    fn begin(&mut self, sha256: &str, size: u64) -> Result<(), Self::Error>;
    /// The next bytes of the object begun.
    fn data(&mut self, chunk: &[u8]) -> Result<(), Self::Error>;
    /// The object begun is complete.
    fn end(&mut self) -> Result<(), Self::Error>;
    /// The server no longer has this object.
    fn missing(&mut self, sha256: &str) -> Result<(), Self::Error>;
}

/// The incremental decoder of the batch framing: feed it the answer in any chunks.
#[derive(Debug, Clone)]
pub struct BatchDecoder {
    max_item: u64,
    header: Vec<u8>,
    /// Bytes of the object in progress still to come.
    remaining: Option<u64>,
    /// An object ended: its newline comes next.
    expect_newline: bool,
    offset: u64,
}

impl BatchDecoder {
    /// A decoder that refuses items larger than `max_item` bytes.
    pub fn new(max_item: u64) -> BatchDecoder {
        BatchDecoder {
            max_item,
            header: Vec::new(),
            remaining: None,
            expect_newline: false,
            offset: 0,
        }
    }

    fn error(&self, problem: &'static str) -> BatchError {
        BatchError {
            offset: self.offset,
            problem,
        }
    }

    /// Decodes the next bytes of the answer into `sink`.
    pub fn feed<S: BatchSink>(&mut self, mut data: &[u8], sink: &mut S) -> Result<(), S::Error> {
        while !data.is_empty() {
            if self.expect_newline {
                if data[0] != b'\n' {
                    return Err(self.error("an object is not followed by a newline").into());
                }
                self.expect_newline = false;
                self.advance(&mut data, 1);
                continue;
            }
            if let Some(remaining) = self.remaining {
                let take = remaining.min(data.len() as u64) as usize;
                sink.data(&data[..take])?;
                self.advance(&mut data, take);
                let left = remaining - take as u64;
                if left == 0 {
                    self.remaining = None;
                    self.expect_newline = true;
                    sink.end()?;
                } else {
                    self.remaining = Some(left);
                }
                continue;
            }
            match data.iter().position(|b| *b == b'\n') {
                None => {
                    if self.header.len() + data.len() > MAX_HEADER {
                        return Err(self.error("header line too long").into());
                    }
                    self.header.extend_from_slice(data);
                    let n = data.len();
                    self.advance(&mut data, n);
                }
                Some(i) => {
                    if self.header.len() + i > MAX_HEADER {
                        return Err(self.error("header line too long").into());
                    }
                    self.header.extend_from_slice(&data[..i]);
                    self.advance(&mut data, i + 1);
                    let header = std::mem::take(&mut self.header);
                    self.start_item(&header, sink)?;
                }
            }
        }
        Ok(())
    }

    fn advance(&mut self, data: &mut &[u8], n: usize) {
        *data = &data[n..];
        self.offset += n as u64;
    }

    fn start_item<S: BatchSink>(&mut self, header: &[u8], sink: &mut S) -> Result<(), S::Error> {
        let line = std::str::from_utf8(header).map_err(|_| self.error("header is not UTF-8"))?;
        let (sha, rest) = line
            .split_once(' ')
            .ok_or_else(|| self.error("header has no size"))?;
        if !is_sha256_hex(sha) {
            return Err(self.error("header does not start with a sha256").into());
        }
        if rest == "missing" {
            return sink.missing(sha);
        }
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.error("size is not a number").into());
        }
        let size: u64 = rest
            .parse()
            .map_err(|_| self.error("size is not a number"))?;
        if size > self.max_item {
            return Err(self.error("item is larger than allowed").into());
        }
        sink.begin(sha, size)?;
        if size == 0 {
            self.expect_newline = true;
            sink.end()?;
        } else {
            self.remaining = Some(size);
        }
        Ok(())
    }

    /// The answer ended: an error when it stopped inside an item.
    pub fn finish(&self) -> Result<(), BatchError> {
        if self.remaining.is_some() || self.expect_newline || !self.header.is_empty() {
            return Err(self.error("the answer ends inside an item"));
        }
        Ok(())
    }
}

/// One decoded item: the sha256 and the bytes, or `None` when the server lacks it.
pub type BatchItem = (String, Option<Vec<u8>>);

/// A [`BatchSink`] that keeps every item in memory.
#[derive(Debug, Default)]
pub struct CollectItems {
    /// The items so far.
    pub items: Vec<BatchItem>,
}

impl BatchSink for CollectItems {
    type Error = BatchError;
    fn begin(&mut self, sha256: &str, size: u64) -> Result<(), BatchError> {
        self.items
            .push((sha256.to_owned(), Some(Vec::with_capacity(size as usize))));
        Ok(())
    }
    fn data(&mut self, chunk: &[u8]) -> Result<(), BatchError> {
        if let Some((_, Some(body))) = self.items.last_mut() {
            body.extend_from_slice(chunk);
        }
        Ok(())
    }
    fn end(&mut self) -> Result<(), BatchError> {
        Ok(())
    }
    fn missing(&mut self, sha256: &str) -> Result<(), BatchError> {
        self.items.push((sha256.to_owned(), None));
        Ok(())
    }
}

/// Decodes a whole batch answer held in memory.
pub fn decode_batch(data: &[u8], max_item: u64) -> Result<Vec<BatchItem>, BatchError> {
    let mut decoder = BatchDecoder::new(max_item);
    let mut sink = CollectItems::default();
    decoder.feed(data, &mut sink)?;
    decoder.finish()?;
    Ok(sink.items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_round_trip_and_etag() {
        let v: Version = "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e-42".parse().unwrap();
        assert_eq!(v.epoch, "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e");
        assert_eq!(v.revision, 42);
        assert_eq!(v.to_string(), "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e-42");
        assert_eq!(v.etag(), "W/\"0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e-42\"");
        for bad in [
            "",
            "42",
            "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e",
            "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e-",
            "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e-+1",
            "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e--1",
            "not-a-uuid-1",
            "0B6C1F3E-8D7A-4F43-9C1E-1F2A3B4C5D6E-1",
            "../../x-1",
        ] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?}");
        }
    }

    fn sample() -> (Vec<u8>, Vec<BatchItem>) {
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let mut buf = Vec::new();
        encode_batch_item(&mut buf, &a, Some(b"x\ny\n"));
        encode_batch_item(&mut buf, &b, None);
        encode_batch_item(&mut buf, &c, Some(b""));
        let items = vec![(a, Some(b"x\ny\n".to_vec())), (b, None), (c, Some(vec![]))];
        (buf, items)
    }

    #[test]
    fn decodes_in_any_chunks() {
        let (buf, items) = sample();
        assert_eq!(decode_batch(&buf, 1024).unwrap(), items);
        // Every split point, and one byte at a time.
        for split in 0..=buf.len() {
            let mut d = BatchDecoder::new(1024);
            let mut sink = CollectItems::default();
            d.feed(&buf[..split], &mut sink).unwrap();
            d.feed(&buf[split..], &mut sink).unwrap();
            d.finish().unwrap();
            assert_eq!(sink.items, items, "split at {split}");
        }
        let mut d = BatchDecoder::new(1024);
        let mut sink = CollectItems::default();
        for b in &buf {
            d.feed(std::slice::from_ref(b), &mut sink).unwrap();
        }
        d.finish().unwrap();
        assert_eq!(sink.items, items);
    }

    #[test]
    fn refuses_what_the_framing_forbids() {
        let (buf, _) = sample();
        for cut in [1, 30, 64, 66, 70, buf.len() - 1] {
            let mut d = BatchDecoder::new(1024);
            let mut sink = CollectItems::default();
            let fed = d.feed(&buf[..cut], &mut sink);
            assert!(fed.is_err() || d.finish().is_err(), "cut at {cut}");
        }
        let a = "a".repeat(64);
        for (bad, why) in [
            (format!("{a} 3\nabcX"), "not followed by a newline"),
            (format!("{a} x\n"), "size is not a number"),
            (format!("{a} +3\nabc\n"), "size is not a number"),
            (format!("{} 1\nx\n", "A".repeat(64)), "sha256"),
            (format!("{a}\n"), "no size"),
            (format!("{a} 2000\n"), "larger than allowed"),
            ("z".repeat(300), "too long"),
        ] {
            let err = decode_batch(bad.as_bytes(), 1024).unwrap_err();
            assert!(err.problem.contains(why), "{bad:?}: {err}");
        }
        let err = decode_batch(&[0xff, b' ', b'1', b'\n'], 1024).unwrap_err();
        assert!(err.problem.contains("UTF-8"));
    }
}
