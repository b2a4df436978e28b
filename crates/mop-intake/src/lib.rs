//! What may enter a workspace's memory, decided without I/O: the card server's write path
//! (agent stores, admin writes, imports) calls both halves, and nothing else decides.
//!
//! - [`secrets`]: credential screening. A rule set kept as data names each credential's
//!   kind; a finding says the kind and where it is (field, line, column), never the value.
//! - [`import`]: the memory files agents and teams already keep (`CLAUDE.md`, `AGENTS.md`,
//!   Claude Code's and Codex's memory directories, OKF cards) read as card drafts.
//! - [`lesson`]: the "same lesson" rule. A card's lesson is reduced to a fingerprint (a
//!   hash of its normalised text and a MinHash signature of its words, no text), so a
//!   store is compared with live cards and with the tombstones of rejected ones by one
//!   rule.

pub mod import;
pub mod lesson;
pub mod secrets;
