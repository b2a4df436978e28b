//! Typed card errors. Every violation names the key (with a list index where one applies)
//! and the rule broken; none of them quotes card text, so they are safe to log.

use std::fmt;

use crate::id::IdError;

/// A rule of OKF.md that a frontmatter value broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// The key must be present.
    Required,
    /// The value has the wrong YAML type.
    Type(&'static str),
    /// The value is not a canonical UUID.
    Uuid(IdError),
    /// The value must be one of a fixed set.
    OneOf(&'static [&'static str]),
    /// One line of `min..=max` characters.
    OneLine {
        /// Fewest characters.
        min: usize,
        /// Most characters.
        max: usize,
    },
    /// A lowercase slug `[a-z0-9][a-z0-9._-]{0,63}`.
    Slug,
    /// A user, asset or task id: 1..128 characters, no control characters, no outer spaces.
    ScopeId,
    /// A number from 0.0 to 1.0.
    UnitInterval,
    /// An integer of at least 1.
    AtLeastOne,
    /// An RFC 3339 timestamp.
    Rfc3339,
    /// A nested key this version does not know. Unknown keys survive only at the top level:
    /// a misspelt `scope.user` must not silently turn a personal card into a shared one.
    UnknownKey {
        /// The keys allowed here.
        allowed: &'static [&'static str],
    },
    /// A card cannot supersede itself.
    NotSelf,
    /// A list holds more than this many items.
    TooMany(usize),
    /// Every frontmatter key must be a plain name.
    KeyName,
    /// Text kept verbatim (an unknown key's value) may hold no control characters but
    /// tab and line breaks.
    NoControlChars,
    /// An unknown key's value must come back unchanged when the card is written out.
    NotWrittenBack,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Required => f.write_str("is required"),
            Rule::Type(t) => write!(f, "must be {t}"),
            Rule::Uuid(e) => write!(f, "must be a lowercase hyphenated UUID ({e})"),
            Rule::OneOf(set) => write!(f, "must be one of: {}", set.join(", ")),
            Rule::OneLine { min, max } => {
                write!(f, "must be a single line of {min} to {max} characters")
            }
            Rule::Slug => f.write_str("must be a lowercase slug matching [a-z0-9][a-z0-9._-]{0,63}"),
            Rule::ScopeId => f.write_str(
                "must be 1 to 128 characters with no control characters and no leading or trailing spaces",
            ),
            Rule::UnitInterval => f.write_str("must be a number from 0.0 to 1.0"),
            Rule::AtLeastOne => f.write_str("must be an integer of at least 1"),
            Rule::Rfc3339 => f.write_str("must be an RFC 3339 timestamp such as 2026-10-10T08:00:00Z"),
            Rule::UnknownKey { allowed } => {
                write!(f, "is not a known key here; allowed: {}", allowed.join(", "))
            }
            Rule::NotSelf => f.write_str("must name another card, not the card itself"),
            Rule::TooMany(n) => write!(f, "must hold at most {n} items"),
            Rule::KeyName => f.write_str(
                "has a key that is not a plain name matching [A-Za-z_][A-Za-z0-9_-]{0,63}",
            ),
            Rule::NotWrittenBack => f.write_str(
                "is a YAML value this version cannot write back unchanged (use plain strings, numbers and lists)",
            ),
            Rule::NoControlChars => f.write_str(
                "must hold no control characters other than tab and line breaks (remove them)",
            ),
        }
    }
}

/// Why bytes are not a valid OKF v1 card.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CardError {
    /// The bytes are not UTF-8.
    #[error("card is not valid UTF-8 (first bad byte at offset {valid_up_to})")]
    NotUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// No `---` line opens the file.
    #[error("card must start with a '---' line that opens the YAML frontmatter")]
    NoFrontmatter,
    /// No `---` line closes the frontmatter.
    #[error("frontmatter is not closed: add a '---' line between the frontmatter and the body")]
    UnclosedFrontmatter,
    /// The frontmatter is implausibly large.
    #[error(
        "frontmatter is {size} bytes as read or as written back (lists one item a line, strings quoted); at most {max} are allowed: shorten its values or unknown keys"
    )]
    FrontmatterTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The frontmatter is not well-formed YAML (or uses a feature OKF forbids).
    #[error("frontmatter YAML, line {line} column {column}: {problem}")]
    Yaml {
        /// 1-based line within the file.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        problem: String,
    },
    /// The frontmatter is YAML but not a mapping.
    #[error("frontmatter must be a YAML mapping of keys to values")]
    NotMapping,
    /// A key broke a rule.
    #[error("`{key}` {rule}")]
    Field {
        /// The key, with a list index where one applies (`labels[2]`, `scope.user_id`).
        key: String,
        /// The rule it broke.
        rule: Rule,
    },
    /// The body is empty or only whitespace.
    #[error("body is empty: write the card's Markdown text after the closing '---' line")]
    EmptyBody,
    /// The body is larger than OKF allows.
    #[error("body is {size} bytes; at most {max} are allowed (split the card)")]
    BodyTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The body holds a NUL byte.
    #[error("body contains a NUL byte; cards are text")]
    NulInBody,
}

impl CardError {
    pub(crate) fn field(key: impl Into<String>, rule: Rule) -> Self {
        CardError::Field {
            key: key.into(),
            rule,
        }
    }

    /// The key this error is about, when it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            CardError::Field { key, .. } => Some(key),
            _ => None,
        }
    }
}
