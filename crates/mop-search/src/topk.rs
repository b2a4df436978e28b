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

use crate::Ranked;
use crate::fieldnorm;
use crate::postings::{BLOCK, Damaged, ListReader};

/// A score.
pub(crate) type Score = f32;

thread_local! {
    /// The per-document score array, reused by every search on this thread (a 100k-card
    /// segment's array is 400 KB; allocating it per search costs page faults).
    static SCORES: RefCell<Vec<Score>> = const { RefCell::new(Vec::new()) };
}

/// BM25's constants, as Lucene (and tantivy) use them.
const K1: Score = 1.2;
const B: Score = 0.75;

/// Term frequencies up to this have their length factors in a table.
const TABLED_TF: usize = 16;

/// BM25 over one set of statistics (the cards a task sees): what a card's length does to
/// a term's score, computed once per search for each of the 256 field norm ids.
pub(crate) struct Bm25 {
    /// K1 × (1 − B + B × length / average length), by field norm id.
    norm: [Score; 256],
    /// tf / (tf + norm) for tf in 1..=TABLED_TF (row tf − 1), by field norm id: a lookup
    /// instead of a division for nearly every posting.
    factors: Vec<Score>,
    docs: u64,
}

impl Bm25 {
    /// BM25 for `docs` cards of `tokens` tokens in all.
    pub(crate) fn new(docs: u64, tokens: u64) -> Bm25 {
        let average = tokens as Score / docs as Score;
        let norm: [Score; 256] = std::array::from_fn(|id| {
            let length = fieldnorm::length(id as u8);
            K1 * (1.0 - B + B * length as Score / average)
        });
        let factors = (1..=TABLED_TF)
            .flat_map(|tf| {
                let tf = tf as Score;
                norm.iter().map(move |n| tf / (tf + n))
            })
            .collect();
        Bm25 {
            norm,
            factors,
            docs,
        }
    }

    /// A term's weight from its document frequency: idf × (K1 + 1).
    pub(crate) fn weight(&self, df: u64) -> Score {
        let x = (self.docs.saturating_sub(df) as Score + 0.5) / (df as Score + 0.5);
        (1.0 + x).ln() * (1.0 + K1)
    }

    /// What a term of `weight` adds to a card of this field norm id where it occurs `tf`
    /// times.
    pub(crate) fn score(&self, weight: Score, norm: u8, tf: u32) -> Score {
        let at = (tf as usize)
            .checked_sub(1)
            .map(|row| row * 256 + norm as usize);
        let factor = match at.and_then(|at| self.factors.get(at)) {
            Some(f) => *f,
            None => {
                let tf = tf as Score;
                tf / (tf + self.norm[norm as usize])
            }
        };
        weight * factor
    }
}

/// One term's posting list in one class of cards, with its weight.
pub(crate) struct TermList<'a> {
    pub(crate) list: ListReader<'a>,
    pub(crate) weight: Score,
}

/// Scores every card of one class that holds one of `terms` (in the query's order) and
/// returns the best `limit` among those `keep` admits, as (score, card ordinal). `norms`
/// are the class's cards' field norm ids and `ord` gives a card's ordinal, both in the
/// class's own numbering.
pub(crate) fn top_k(
    bm25: &Bm25,
    terms: Vec<TermList<'_>>,
    norms: &[u8],
    ord: impl Fn(u32) -> u32,
    limit: usize,
    keep: impl Fn(u32) -> bool,
) -> Result<Vec<Ranked>, Damaged> {
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.clear();
        scores.resize(norms.len(), 0.0);
        let (mut docs, mut tfs) = ([0u32; BLOCK], [0u32; BLOCK]);
        for mut t in terms {
            loop {
                let n = t.list.next_block(&mut docs, &mut tfs)?;
                if n == 0 {
                    break;
                }
                for (doc, tf) in docs[..n].iter().zip(&tfs[..n]) {
                    let doc = *doc as usize;
                    let (Some(score), Some(norm)) = (scores.get_mut(doc), norms.get(doc)) else {
                        continue;
                    };
                    *score += bm25.score(t.weight, *norm, *tf);
                }
            }
        }
        let mut best = Best::new(limit);
        for (doc, score) in scores.iter().enumerate() {
            if *score > 0.0 && best.would_take(*score) {
                let ord = ord(doc as u32);
                if keep(ord) {
                    best.offer(Ranked(*score, ord));
                }
            }
        }
        Ok(best.into_sorted())
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
            // Room for what a search keeps at most; a limit larger than any index grows
            // the heap as hits come instead.
            heap: BinaryHeap::with_capacity(limit.min(1024).saturating_add(1)),
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
