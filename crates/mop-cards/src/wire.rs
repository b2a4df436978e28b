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
        let uuid = uuid::Uuid::try_parse(epoch).map_err(|_| bad())?;
        if uuid.hyphenated().to_string() != epoch {
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
