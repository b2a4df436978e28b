//! BM25 scoring of one query, term at a time, and the best k of what it scored.
//!
//! Queries here are long (up to 32 terms of a ticket) and most of their terms are common
//! words that match a large share of the cards, so nearly every card of a segment gets a
//! score anyway: pruning (WAND, MaxScore) was measured to skip almost nothing on such
//! queries and to cost more than it saved. What is cheap is the plain work: each term's
//! postings decoded a block of 128 at a time and its score added into one array indexed
//! by document, with no merging of postings lists.
//!
//! The scores are added in the query's term order for every card, so a card's score is
//! the same to the last bit whatever else the index holds: no answer depends on cards the
//! task cannot see, not even by rounding.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tantivy::Score;
use tantivy::postings::BlockSegmentPostings;
use tantivy::query::Bm25Weight;

use crate::Ranked;

thread_local! {
    /// The per-document score array, reused by every search on this thread (a 100k-card
    /// segment's array is 400 KB; allocating it per search costs page faults).
    static SCORES: RefCell<Vec<Score>> = const { RefCell::new(Vec::new()) };
}

/// One term's postings in one segment, with its weight.
pub(crate) struct TermPostings<'a> {
    pub(crate) postings: BlockSegmentPostings,
    pub(crate) weight: &'a Bm25Weight,
}

/// Scores every document of a segment of `max_doc` documents that holds one of `terms`
/// (in the query's order) and returns the best `limit` among those `keep` admits, as
/// (score, card ordinal). `norms` are the documents' field norm ids, `ords` their card
/// ordinals.
pub(crate) fn top_k(
    terms: Vec<TermPostings<'_>>,
    norms: &[u8],
    ords: &[u32],
    limit: usize,
    keep: impl Fn(u32) -> bool,
) -> Vec<Ranked> {
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.clear();
        scores.resize(norms.len(), 0.0);
        for mut t in terms {
            // A term occurs once in most cards that hold it: its score there depends on
            // the card's length alone, looked up instead of computed.
            let once: Vec<Score> = (0..=255u8).map(|id| t.weight.score(id, 1)).collect();
            loop {
                let docs = t.postings.docs();
                if docs.is_empty() {
                    break;
                }
                for (doc, tf) in docs.iter().zip(t.postings.freqs()) {
                    let doc = *doc as usize;
                    let (Some(score), Some(norm)) = (scores.get_mut(doc), norms.get(doc)) else {
                        continue;
                    };
                    *score += if *tf == 1 {
                        once[*norm as usize]
                    } else {
                        t.weight.score(*norm, *tf)
                    };
                }
                t.postings.advance();
            }
        }
        let mut best = Best::new(limit);
        for (doc, score) in scores.iter().enumerate() {
            if *score > 0.0 && best.would_take(*score) {
                let ord = ords[doc];
                if keep(ord) {
                    best.offer(Ranked(*score, ord));
                }
            }
        }
        best.into_sorted()
    })
}

/// The best `limit` hits offered, kept in a heap whose top is the worst of them.
pub(crate) struct Best {
    limit: usize,
    heap: BinaryHeap<Reverse<Ranked>>,
}

impl Best {
    pub(crate) fn new(limit: usize) -> Best {
        Best {
            limit,
            heap: BinaryHeap::with_capacity(limit + 1),
        }
    }

    /// False when a hit of this score cannot be kept (it would not beat the worst kept;
    /// an equal score may still win on its ordinal).
    fn would_take(&self, score: Score) -> bool {
        self.heap.len() < self.limit || self.heap.peek().is_some_and(|w| score >= w.0.0)
    }

    pub(crate) fn offer(&mut self, hit: Ranked) {
        if self.heap.len() < self.limit {
            self.heap.push(Reverse(hit));
        } else if self.heap.peek().is_some_and(|Reverse(worst)| hit > *worst) {
            self.heap.pop();
            self.heap.push(Reverse(hit));
        }
    }

    /// Best first.
    pub(crate) fn into_sorted(self) -> Vec<Ranked> {
        let mut hits: Vec<Ranked> = self.heap.into_iter().map(|Reverse(h)| h).collect();
        hits.sort_unstable_by(|a, b| b.cmp(a));
        hits
    }
}
