//! The card engine of mop: everything about memory cards that needs no I/O and no async.
//!
//! - [`parse_card`] / [`render_card`]: OKF v1 files (YAML frontmatter + Markdown body),
//!   validated with typed errors ([`CardError`]) that name the key and the rule.
//! - [`CardType`], [`CardSummary`], [`CardId`]: the card model; a card's path follows from
//!   its type and UUID alone, so no card can name a path outside its pillar directory.
//! - [`Manifest`], [`ManifestEntry`]: a workspace snapshot, as the server publishes it and
//!   the catalog is built from (the rest of the sync protocol is in `mop-proto`);
//!   [`compose`]: a workspace's snapshot with those of the workspaces it inherits.
//! - [`TaskContext`], [`CodeExtractor`]: what a task is about and the error codes in it.
//! - [`Catalog`]: one generation's cards indexed for tier selection (L0/L1/L2) with the hard
//!   exclusions, and the strict ranking of OKF.md; "now" is the manifest's `generated_at`.
//!   It keeps of each card only what ranking and listings use ([`CardLine`]).
//! - [`render_memory_md`]: the task's `MEMORY.md`, deterministic and escaped.
//! - [`is_hidden_char`], [`unshown`]: what a person reviewing a card could miss: characters
//!   that render as nothing, and what a Markdown rendering of a card leaves out.
//!
//! Text matching needs BM25 hits, which the `mop-search` crate computes; selection takes
//! them as [`TextHit`]s so this crate stays pure.

mod card;
mod codes;
mod compose;
mod config;
mod error;
mod hidden;
mod id;
mod lines;
mod memory_md;
mod parse;
mod render;
mod select;
mod task;
mod unshown;
mod wire;

pub use card::{
    Audience, Card, CardSummary, CardType, Counters, DEFAULT_IMPORTANCE, Extra, MAX_BODY_BYTES,
    MAX_DESCRIPTION_CHARS, MAX_TITLE_CHARS, Provenance, Scope, StoreRefusal, Trust, Viewer,
    card_path,
};
pub use codes::{CodeExtractor, CodePattern, PatternError, collapse_upper, default_code_patterns};
pub use compose::{ComposeError, compose};
pub use config::{ConfigError, Rules, SelectionConfig};
pub use error::{CardError, Rule};
pub use hidden::{is_default_ignorable, is_hidden_char, one_line_for_agent, reveal_hidden};
pub use id::{CardId, IdError, is_scope_id, is_slug, is_task_id};
pub use lines::CardLine;
pub use memory_md::{escape_inline, is_primary_anchor, render_memory_md};
pub use parse::{MAX_FRONTMATTER_BYTES, card_body, check_frontmatter, parse_card};
pub use render::render_card;
pub use select::{
    Catalog, CatalogError, MatchClass, Selected, Selection, TextHit, Tier, TierCounts, VisibleSet,
    effective_importance,
};
pub use task::{TaskContext, TaskError, TaskQuery};
pub use unshown::{MARKDOWN_OPTIONS, Unshown, unshown, unshown_in_body};
pub use uuid::Uuid;
pub use wire::{
    EntryError, InheritedVersion, Manifest, ManifestEntry, hex, is_epoch, is_sha256_hex, sha256_hex,
};
