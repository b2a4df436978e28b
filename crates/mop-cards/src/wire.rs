//! The manifest of a workspace snapshot: what the card server publishes, what the card
//! engine ([`crate::Catalog`]) is built from, and what a daemon keeps with each generation.
//! The rest of the sync protocol (versions, stores, the object batch framing) is in
//! `mop-proto`, which re-exports these types.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::card::{Card, CardSummary, card_path};
use crate::error::CardError;
use crate::id::CardId;

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
    /// The inherited workspace the card comes from, in a generation a daemon composed of
    /// its workspace and the ones it inherits; absent for the workspace's own cards. Never
    /// in what a server sends (a daemon refuses a manifest that claims it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited_from: Option<String>,
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
            inherited_from: None,
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
    hex(&sha2::Sha256::digest(bytes))
}

/// Bytes as lowercase hex. By table, not `format!`: the card server hashes every
/// request's token with this, and `format!` per byte was 2 % of its profile under a flood
/// of unchanged polls.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
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
    /// In a generation a daemon composed: the inherited workspaces' versions its cards
    /// come from. Never in what a server sends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherited: Vec<InheritedVersion>,
}

/// One inherited workspace's part of a composed generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InheritedVersion {
    /// The inherited workspace.
    pub workspace: String,
    /// Its server epoch.
    pub epoch: String,
    /// Its revision.
    pub revision: u64,
    /// Its cards in the composition (after own cards that supersede or share an id).
    pub cards: usize,
}

impl Manifest {
    /// True for a delta manifest.
    pub fn is_delta(&self) -> bool {
        self.since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_hex_is_the_standard_lowercase_digest() {
        assert_eq!(
            super::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(hex(&[0x00, 0x0f, 0xf0, 0xff]), "000ff0ff");
        assert!(is_sha256_hex(&super::sha256_hex(b"")));
    }

    #[test]
    fn sha256_hex() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex(&"a".repeat(63)));
        assert!(!is_sha256_hex(&format!("../{}", "a".repeat(61))));
    }
}
