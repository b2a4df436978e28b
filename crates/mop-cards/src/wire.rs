//! Types that cross the network between `mop-server` and `mopd`: the manifest of a
//! workspace, its entries, and the `<epoch>-<revision>` version both sides name it by.
//! Defined once here; the server and the daemon both use them.

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::card::{Card, CardSummary, card_path};
use crate::error::CardError;
use crate::id::CardId;

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

/// One live card in a manifest: its summary, where its bytes are, and its counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// The card's frontmatter fields other than counters.
    #[serde(flatten)]
    pub summary: CardSummary,
    /// SHA-256 of the card file, lowercase hex; the object is fetched by it.
    pub sha256: String,
    /// Size of the card file in bytes.
    pub size: u64,
    /// The card's path inside a card directory (`<pillar>/<id>.md`).
    pub path: String,
    /// Server counter: how often the card was stored or reinforced.
    pub occurrence: u64,
    /// Server counter: when it was last reinforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Timestamp>,
}

/// Why a manifest entry cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// A summary field breaks an OKF rule.
    #[error("card {id}: {source}")]
    Card {
        /// The card.
        id: CardId,
        /// The rule broken.
        source: CardError,
    },
    /// `sha256` is not 64 lowercase hex digits.
    #[error("card {id}: sha256 must be 64 lowercase hex digits")]
    Sha256 {
        /// The card.
        id: CardId,
    },
    /// `path` is not the path its type and id give.
    #[error("card {id}: path does not match its type and id (expected {expected})")]
    Path {
        /// The card.
        id: CardId,
        /// The path the type and id give.
        expected: String,
    },
}

impl ManifestEntry {
    /// Checks that the entry is well-formed: a daemon never trusts a server's path or hash
    /// blindly, since both end up in file names.
    pub fn validate(&self) -> Result<(), EntryError> {
        let id = self.summary.id;
        self.summary
            .validate()
            .map_err(|source| EntryError::Card { id, source })?;
        if !is_sha256_hex(&self.sha256) {
            return Err(EntryError::Sha256 { id });
        }
        let expected = card_path(self.summary.card_type, &id);
        if self.path != expected {
            return Err(EntryError::Path { id, expected });
        }
        Ok(())
    }
}

impl ManifestEntry {
    /// The entry for a parsed card and the exact bytes it was parsed from.
    pub fn for_card(card: &Card, raw: &[u8]) -> ManifestEntry {
        ManifestEntry {
            summary: card.summary.clone(),
            sha256: sha256_hex(raw),
            size: raw.len() as u64,
            path: card.path(),
            occurrence: card.counters.occurrence,
            last_seen: card.counters.last_seen,
        }
    }
}

/// True for a server epoch: a UUID in its lowercase hyphenated form. An epoch names
/// directories on hosts (`gens/<epoch>-<revision>`), so nothing else may pass.
pub fn is_epoch(s: &str) -> bool {
    uuid::Uuid::try_parse(s).is_ok_and(|u| u.hyphenated().to_string() == s)
}

/// SHA-256 of some bytes, as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// True for 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A workspace manifest. A full manifest lists every live card; a delta (`since` set)
/// lists the entries changed after `since` and the ids removed since then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The server database's epoch.
    pub epoch: String,
    /// The workspace revision this manifest describes.
    pub revision: u64,
    /// Server time when the manifest was generated; the "now" of importance decay.
    pub generated_at: Timestamp,
    /// For a delta, the revision it starts from; absent for a full manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Live cards (all of them, or for a delta the changed ones).
    pub cards: Vec<ManifestEntry>,
    /// For a delta, the cards that left the manifest since `since`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<CardId>,
}

impl Manifest {
    /// The version this manifest describes.
    pub fn version(&self) -> Version {
        Version {
            epoch: self.epoch.clone(),
            revision: self.revision,
        }
    }

    /// True for a delta manifest.
    pub fn is_delta(&self) -> bool {
        self.since.is_some()
    }
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
        ] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sha256_hex() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex(&"a".repeat(63)));
        assert!(!is_sha256_hex(&format!("../{}", "a".repeat(61))));
    }
}

/// The provenance a daemon asserts for a store from a task. The server records it and
/// never accepts a card bound to another user or asset than it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreProvenance {
    /// The storing task.
    pub task_id: String,
    /// The task's origin user: the author of the stored card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The task's asset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset_id: Option<String>,
}

/// A card an agent proposes; the server assigns id, trust and provenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewCard {
    /// The card type.
    #[serde(rename = "type")]
    pub card_type: crate::CardType,
    /// One line, 1..200 characters.
    pub title: String,
    /// One line, up to 300 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Lowercase slugs.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Error codes.
    #[serde(default)]
    pub error_codes: Vec<String>,
    /// Stacks (slugs).
    #[serde(default)]
    pub stacks: Vec<String>,
    /// Binding; may only name the provenance's own user and asset.
    #[serde(default)]
    pub scope: crate::Scope,
    /// Markdown body.
    pub body: String,
}

/// `POST /v1/workspaces/{ws}/memories`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreRequest {
    /// Who is storing.
    pub provenance: StoreProvenance,
    /// What.
    pub card: NewCard,
}

/// What a store did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreOutcome {
    /// A new unverified card.
    Created,
    /// An equal card the task could see: its counters went up, nothing else changed.
    Reinforced,
    /// The author's own unverified card with the same title got the new specifics.
    Extended,
    /// An equal card this task already reinforced: a task counts once per card, so
    /// nothing changed.
    Unchanged,
}

/// The answer to a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreResponse {
    /// What happened.
    pub outcome: StoreOutcome,
    /// The card created, reinforced or extended.
    pub id: CardId,
    /// The workspace revision after the store (a reinforcement shows in the manifest only
    /// when counters are next published).
    pub revision: u64,
    /// Who will see the card, in one sentence (an unverified card reaches only its
    /// author's tasks until a curator verifies it).
    #[serde(default)]
    pub audience: String,
}

/// `POST /v1/workspaces/{ws}/objects/batch`: the objects a daemon wants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectBatchRequest {
    /// Object hashes (64 lowercase hex digits each).
    pub sha256: Vec<String>,
}

/// Media type of an object batch response.
pub const OBJECT_BATCH_TYPE: &str = "application/x-mop-objects";

/// Appends one object to a batch response: `<sha256> <size>\n<bytes>\n`, or
/// `<sha256> missing\n` when the server does not have it. A simple framing that streams and
/// needs no escaping, since sizes are given up front.
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

/// Why a batch response cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object batch is malformed at byte {offset}: {problem}")]
pub struct BatchError {
    /// Where.
    pub offset: usize,
    /// What.
    pub problem: &'static str,
}

/// One item of a batch: the sha256 and the bytes, or `None` when the server lacks it.
pub type BatchItem = (String, Option<Vec<u8>>);

/// Decodes a whole batch response. Items larger than `max_item` bytes are refused.
pub fn decode_batch(data: &[u8], max_item: usize) -> Result<Vec<BatchItem>, BatchError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let err = |problem| BatchError {
            offset: pos,
            problem,
        };
        let line_end = data[pos..]
            .iter()
            .position(|b| *b == b'\n')
            .map(|i| pos + i)
            .ok_or(err("header line has no newline"))?;
        let header =
            std::str::from_utf8(&data[pos..line_end]).map_err(|_| err("header is not UTF-8"))?;
        let (sha, rest) = header.split_once(' ').ok_or(err("header has no size"))?;
        if !is_sha256_hex(sha) {
            return Err(err("header does not start with a sha256"));
        }
        if rest == "missing" {
            out.push((sha.to_owned(), None));
            pos = line_end + 1;
            continue;
        }
        let size: usize = rest.parse().map_err(|_| err("size is not a number"))?;
        if size > max_item {
            return Err(err("item is larger than allowed"));
        }
        let start = line_end + 1;
        let end = start.checked_add(size).ok_or(err("size overflows"))?;
        if end >= data.len() || data[end] != b'\n' {
            return Err(err("item is truncated"));
        }
        out.push((sha.to_owned(), Some(data[start..end].to_vec())));
        pos = end + 1;
    }
    Ok(out)
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    #[test]
    fn batch_round_trip_and_truncation() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let mut buf = Vec::new();
        encode_batch_item(&mut buf, &a, Some(b"x\ny\n"));
        encode_batch_item(&mut buf, &b, None);
        let items = decode_batch(&buf, 1024).unwrap();
        assert_eq!(
            items,
            vec![(a.clone(), Some(b"x\ny\n".to_vec())), (b, None)]
        );
        assert!(decode_batch(&buf[..buf.len() - 40], 1024).is_err());
        assert!(decode_batch(&buf[..10], 1024).is_err());
        assert!(decode_batch(&buf, 2).is_err(), "item over the limit");
        assert!(decode_batch(b"../etc 3\nabc\n", 1024).is_err());
    }
}
