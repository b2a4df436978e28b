//! The text a catalog keeps of each card: what a task's MEMORY.md, receipts and agent
//! listings show (title, description, labels, object hash), packed into one string.
//!
//! A parsed [`ManifestEntry`] costs about 1.25 KiB per card in owned strings and their
//! allocator overhead, and a daemon holding five 10k-card workspaces spent 62 MiB on them.
//! Selection ranks on the catalog's per-card numbers and never reads this text; rendering
//! reads it for the few dozen cards a task shows. Here a card costs its text plus a span.

use jiff::Timestamp;

use crate::{CardId, CardType, ManifestEntry, card_path};

/// What listings show of one card, borrowed from its [`crate::Catalog`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CardLine<'a> {
    /// Id.
    pub id: CardId,
    /// Type.
    pub card_type: CardType,
    /// Title.
    pub title: &'a str,
    /// Description, if it has one.
    pub description: Option<&'a str>,
    /// Labels, joined with ", ".
    pub labels: &'a str,
    /// Server counter: how often it was stored or reinforced.
    pub occurrence: u64,
    /// When it was last reinforced, or else created.
    pub last_seen: Option<Timestamp>,
    /// Stored by an agent and not reviewed yet.
    pub unverified: bool,
    /// SHA-256 of the card file, as the manifest gave it.
    pub sha256: &'a str,
    /// The inherited workspace it comes from; `None` for the task's own workspace.
    pub from: Option<&'a str>,
}

impl CardLine<'_> {
    /// The card's path inside a card directory (`<pillar>/<id>.md`).
    pub fn path(&self) -> String {
        card_path(self.card_type, &self.id)
    }

    /// See [`crate::is_primary_anchor`].
    pub fn is_primary_anchor(&self) -> bool {
        crate::memory_md::is_anchor(self.card_type, self.unverified)
    }
}

/// Where one card's strings sit in [`Lines::text`]: they follow each other from `start`.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    title: u32,
    /// `u32::MAX`: no description (an empty one is `Some("")`).
    description: u32,
    labels: u32,
    sha256: u32,
}

const NONE: u32 = u32::MAX;

/// Every card's strings, by ordinal.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lines {
    text: String,
    spans: Vec<Span>,
}

impl Lines {
    pub(crate) fn with_capacity(cards: usize) -> Lines {
        Lines {
            text: String::new(),
            spans: Vec::with_capacity(cards),
        }
    }

    /// Appends the next card's strings.
    pub(crate) fn push(&mut self, e: &ManifestEntry) {
        let s = &e.summary;
        let start = self.text.len();
        let mut add = |part: &str| {
            self.text.push_str(part);
            // Card limits keep every part far below 4 GiB; a longer one would be cut by
            // the cast, so it is checked.
            u32::try_from(part.len()).expect("a card's field is shorter than 4 GiB")
        };
        let title = add(&s.title);
        let description = match &s.description {
            Some(d) => add(d),
            None => NONE,
        };
        let labels = add(&s.labels.join(", "));
        let sha256 = add(&e.sha256);
        self.spans.push(Span {
            start,
            title,
            description,
            labels,
            sha256,
        });
    }

    /// Gives back the spare capacity of the build.
    pub(crate) fn shrink(&mut self) {
        self.text.shrink_to_fit();
        self.spans.shrink_to_fit();
    }

    /// Card `ord`'s title, description, labels and hash.
    pub(crate) fn get(&self, ord: usize) -> (&str, Option<&str>, &str, &str) {
        let span = self.spans[ord];
        let mut at = span.start;
        let mut take = |len: u32| {
            let part = &self.text[at..at + len as usize];
            at += len as usize;
            part
        };
        let title = take(span.title);
        let description = (span.description != NONE).then(|| take(span.description));
        let labels = take(span.labels);
        let sha256 = take(span.sha256);
        (title, description, labels, sha256)
    }
}
