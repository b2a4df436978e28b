//! Identifiers that end up in file paths or match keys: card ids, slugs and scope ids.
//!
//! Card ids are UUIDs in their canonical lowercase hyphenated form and nothing else, so a
//! card path (`<pillar>/<id>.md`) can never leave its pillar directory whatever a card file
//! or a request says.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// Why a string is not a valid card id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id was empty.
    #[error("id is empty; expected a UUID such as 1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7")]
    Empty,
    /// The id holds a character that could form a path (`/`, `\`, `..`, NUL).
    #[error("id {0:?} contains a path character; ids are UUIDs, never paths")]
    PathLike(String),
    /// The id is not a UUID at all.
    #[error("id {0:?} is not a UUID; expected the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
    NotUuid(String),
    /// The id is a UUID but not written in lowercase hyphenated form.
    #[error("id {given:?} must be written in lowercase hyphenated form: {canonical}")]
    NotCanonical {
        /// What was given.
        given: String,
        /// The canonical spelling of the same UUID.
        canonical: String,
    },
}

/// A card id: a UUID, displayed and parsed only in lowercase hyphenated form.
///
/// Ordering is the same as the ordering of the canonical strings, which the ranking's
/// final tie-breaker ("id ascending") relies on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CardId(Uuid);

impl CardId {
    /// Parses the canonical form; every other spelling is an error.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        if s.is_empty() {
            return Err(IdError::Empty);
        }
        if s.contains(['/', '\\', '\0']) || s.contains("..") {
            return Err(IdError::PathLike(s.to_owned()));
        }
        let uuid = Uuid::try_parse(s).map_err(|_| IdError::NotUuid(s.to_owned()))?;
        let canonical = uuid.hyphenated().to_string();
        if canonical != s {
            return Err(IdError::NotCanonical {
                given: s.to_owned(),
                canonical,
            });
        }
        Ok(CardId(uuid))
    }

    /// A new random id (UUID v4): what the server gives a card it makes.
    pub fn random() -> Self {
        CardId::from_uuid(Uuid::new_v4())
    }

    /// Wraps a UUID made elsewhere.
    pub fn from_uuid(uuid: Uuid) -> Self {
        CardId(uuid)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl fmt::Display for CardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for CardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CardId({self})")
    }
}

impl FromStr for CardId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CardId::parse(s)
    }
}

impl Serialize for CardId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CardId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        CardId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// True for a label or stack slug: `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn is_slug(s: &str) -> bool {
    let bytes = s.as_bytes();
    match bytes.first() {
        Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit() => {}
        _ => return false,
    }
    bytes.len() <= 64
        && bytes[1..].iter().all(|&c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

/// True for a user, asset or provenance id: 1 to 128 characters, no control characters,
/// no leading or trailing whitespace. These are compared, never used as paths.
pub fn is_scope_id(s: &str) -> bool {
    !s.is_empty() && s.chars().count() <= 128 && !s.chars().any(char::is_control) && s.trim() == s
}

/// True for a task id: `[A-Za-z0-9._-]`, 1 to 64 characters, starting with a letter or
/// digit (so `.` and `..` can never name a task directory).
pub fn is_task_id(s: &str) -> bool {
    let bytes = s.as_bytes();
    match bytes.first() {
        Some(c) if c.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    bytes.len() <= 64
        && bytes
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_uuid_parses_and_displays_unchanged() {
        let s = "1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7";
        assert_eq!(CardId::parse(s).unwrap().to_string(), s);
    }

    #[test]
    fn path_like_and_malformed_ids_are_rejected() {
        for bad in [
            "../etc/passwd",
            "../../1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7",
            "/etc/passwd",
            "/1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7",
            "1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7\0",
            "1528fa6d\0-2786-4c33-9e4e-a2e4e84ca7d7",
            "foo\\bar",
            "..",
            "",
            "card-1",
            "1528fa6d27864c339e4ea2e4e84ca7d7",
            "{1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7}",
            "urn:uuid:1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7",
            "1528FA6D-2786-4C33-9E4E-A2E4E84CA7D7",
            " 1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7",
        ] {
            assert!(CardId::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(matches!(CardId::parse("../x"), Err(IdError::PathLike(_))));
        assert!(matches!(CardId::parse("/x"), Err(IdError::PathLike(_))));
        assert!(matches!(CardId::parse("a\0"), Err(IdError::PathLike(_))));
        assert!(matches!(
            CardId::parse("1528FA6D-2786-4C33-9E4E-A2E4E84CA7D7"),
            Err(IdError::NotCanonical { .. })
        ));
    }

    #[test]
    fn ordering_matches_string_ordering() {
        let mut ids: Vec<CardId> = [
            "ffffffff-0000-4000-8000-000000000000",
            "0a000000-0000-4000-8000-000000000000",
            "a0000000-0000-4000-8000-000000000000",
            "09000000-0000-4000-8000-000000000000",
        ]
        .iter()
        .map(|s| CardId::parse(s).unwrap())
        .collect();
        ids.sort();
        let strings: Vec<String> = ids.iter().map(ToString::to_string).collect();
        let mut sorted = strings.clone();
        sorted.sort();
        assert_eq!(strings, sorted);
    }

    #[test]
    fn deserialize_is_strict() {
        let ok: CardId =
            serde_json_like("\"1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7\"").expect("canonical id");
        assert_eq!(ok.to_string(), "1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7");
        assert!(serde_json_like("\"../x\"").is_err());
    }

    fn serde_json_like(s: &str) -> Result<CardId, String> {
        serde_json::from_str(s).map_err(|e| e.to_string())
    }

    #[test]
    fn slugs() {
        for ok in ["go", "oracle", "a", "k8s", "db-prod.01_x", &"a".repeat(64)] {
            assert!(is_slug(ok), "{ok:?}");
        }
        for bad in [
            "",
            "Go",
            "-go",
            ".go",
            "go lang",
            "go/x",
            &"a".repeat(65),
            "ü",
        ] {
            assert!(!is_slug(bad), "{bad:?}");
        }
    }

    #[test]
    fn task_ids() {
        for ok in ["etl-7781", "A.b_c-9", &"x".repeat(64)] {
            assert!(is_task_id(ok), "{ok:?}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", &"x".repeat(65), "é"] {
            assert!(!is_task_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn scope_ids() {
        assert!(is_scope_id("alice@example.com"));
        assert!(is_scope_id("db-prod-01"));
        assert!(!is_scope_id(""));
        assert!(!is_scope_id(" alice"));
        assert!(!is_scope_id("al\nice"));
        assert!(!is_scope_id(&"x".repeat(129)));
    }
}
