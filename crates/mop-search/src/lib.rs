//! BM25 search over one workspace snapshot, for task selection and `mop memory retrieve`.
//!
//! [`build_index`] (or an [`IndexBuilder`] fed one card at a time) writes an index of
//! every card (title, description, labels, body) into a fresh directory once per
//! generation; [`SearchIndex::open`] opens it read-only. Text is tokenized by
//! [`tokenize::Tokens`]: lowercase words, and character bigrams for Chinese, Japanese and
//! Korean, so CJK queries work with no dictionary.
//!
//! Documents carry the card's *ordinal* in the generation's [`mop_cards::Catalog`] (cards
//! sorted by id). A search takes the task's [`VisibleSet`] and never returns a card outside
//! it, so text hits obey the same hard exclusions as the tiers.
//!
//! No answer depends on cards outside that set (DESIGN.md "Retrieval"): BM25's statistics
//! (document count, average length, each term's document frequency) are computed over the
//! visible cards only, so neither the scores nor the ranking nor the choice of query terms
//! tell whether a word occurs in a card the task cannot see. To keep that cheap, open cards
//! (those every task may see) and *restricted* cards have separate posting lists
//! ([`file`]): a term's frequency among the visible cards is the length of its open list
//! plus the visible restricted cards found in its restricted list (a task sees few).
//!
//! The index format and its writer are this crate's own ([`build`], [`file`],
//! [`postings`]). Until format 4 it was tantivy's, whose general-purpose writer was most of
//! a cold sync's CPU time (bench/NOTES.md, round four); the scoring was already ours
//! ([`topk`]): term at a time into one score array, which on these long queries beats
//! document-at-a-time unions and their pruning.
//!
//! With an embedding model ([`mop_embed`]), a build also stores each card's vector, and a
//! search ranks the visible cards a second way, by cosine similarity to the text, and
//! merges the two rankings by reciprocal rank fusion ([`RRF_K`]): BM25 finds the cards
//! that share the text's words, the model those that share its meaning. Vectors of
//! another model, or none, leave the index on BM25 alone ([`DenseState`]).

mod build;
mod fieldnorm;
mod file;
mod merge;
mod mmap;
mod postings;
pub mod tokenize;
mod topk;

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use mop_cards::{Catalog, Rules, Selection, TaskContext, TaskQuery, TextHit, VisibleSet};
use mop_embed::{CardVectors, Mismatch, Model};

pub use build::IndexBuilder;
pub use file::FORMAT;
pub use merge::{Source, build_from};

use file::{IndexFile, TermInfo};
use topk::{Score, TermList};

/// Reciprocal rank fusion's constant: a card's fused score is the sum over the rankings
/// that hold it of 1 / (k + rank), so agreement between rankings counts for more than a
/// top place in one (Cormack et al.'s k = 60).
pub const RRF_K: f32 = 60.0;

/// Cards taken from each ranking into the fusion (or the caller's limit, if larger): a
/// card ranked low by one ranker and high by the other must still be seen by both.
const FUSION_DEPTH: usize = 50;

/// Most query terms used; a long ticket keeps its rarest (most telling) terms.
pub const MAX_QUERY_TERMS: usize = 32;

/// Frequent English words that only add noise to a query built from ticket text.
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "in", "is", "it", "of",
    "on", "or", "that", "the", "this", "to", "was", "were", "will", "with",
];

/// Why an index cannot be built, opened or searched.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The directory is not a mop search index, or one of another format, or damaged.
    #[error("search index at {dir}: {problem}; rebuild the generation")]
    Invalid {
        /// The index directory.
        dir: String,
        /// What is wrong.
        problem: String,
    },
    /// File-system error around the index.
    #[error("search index at {dir}: {source}")]
    Io {
        /// The index directory.
        dir: String,
        /// The error.
        source: std::io::Error,
    },
    /// A card was given out of ordinal order to [`IndexBuilder::add`].
    #[error(
        "search index: card {got} given where card {expected} was due (cards go in by ordinal)"
    )]
    Order {
        /// The ordinal due.
        expected: u32,
        /// The ordinal given.
        got: u32,
    },
}

/// One card to index.
#[derive(Debug, Clone)]
pub struct IndexDoc<'a> {
    /// The card's ordinal in the generation's catalog.
    pub ord: u32,
    /// Title.
    pub title: &'a str,
    /// Description, or "".
    pub description: &'a str,
    /// Labels.
    pub labels: &'a [String],
    /// Markdown body: borrowed when the caller holds every card, owned when it reads
    /// them one at a time (so a build never holds all bodies at once).
    pub body: std::borrow::Cow<'a, str>,
    /// True when every task may see the card ([`mop_cards::CardSummary::is_open`]).
    pub open: bool,
}

/// What building an index did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildReport {
    /// Documents indexed.
    pub docs: u64,
    /// Why the card vectors asked for were not stored (the index is whole and serves by
    /// BM25 alone, as an index built without a model does).
    pub vectors_error: Option<String>,
}

/// Builds an index of `docs` (in ordinal order: 0, 1, 2, …) in `dir`, which must exist
/// and be empty. The caller makes it visible atomically (it is built inside a generation
/// that is renamed into place).
pub fn build_index<'a>(
    dir: &Path,
    docs: impl IntoIterator<Item = IndexDoc<'a>>,
) -> Result<BuildReport, SearchError> {
    build_index_with(dir, docs, None)
}

/// [`build_index`], and with a model also each card's vector (of the same text the index
/// holds), stored beside the index with the model's fingerprint.
///
/// With two cores and at least [`PARALLEL_MIN`] cards, each half of the cards is indexed
/// on a thread of its own and the second half is then appended to the first: the same
/// index, in a little over half the time.
pub fn build_index_with<'a>(
    dir: &Path,
    docs: impl IntoIterator<Item = IndexDoc<'a>>,
    model: Option<&Model>,
) -> Result<BuildReport, SearchError> {
    let docs: Vec<IndexDoc<'a>> = docs.into_iter().collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 || docs.len() < PARALLEL_MIN {
        let mut builder = IndexBuilder::new(model);
        for d in docs {
            builder.add(d)?;
        }
        return builder.write(dir);
    }
    let (first, second) = docs.split_at(docs.len() / 2);
    let (mut builder, later) = std::thread::scope(|s| {
        let later = s.spawn(|| {
            let mut later = IndexBuilder::starting_at(second[0].ord, model);
            for d in second {
                later.add(d.clone())?;
            }
            Ok::<_, SearchError>(later)
        });
        let mut builder = IndexBuilder::new(model);
        let built = first.iter().try_for_each(|d| builder.add(d.clone()));
        let later = later.join().expect("an index builder does not panic");
        built.map(|()| (builder, later))
    })?;
    builder.append(later?)?;
    builder.write(dir)
}

/// Cards from which [`build_index_with`] uses two threads.
pub const PARALLEL_MIN: usize = 2000;

/// The format of the index in `dir`, as its `mop-search.json` says, if it says.
pub fn index_format(dir: &Path) -> Option<u32> {
    file::read_meta(dir).ok()?.ok().map(|m| m.format)
}

/// An index opened read-only.
pub struct SearchIndex {
    dir: String,
    file: IndexFile,
    /// Each ordinal's card number in the file.
    docs_of: Vec<u32>,
    /// The open cards' ordinals.
    open: VisibleSet,
    /// The open cards' lengths, summed.
    open_tokens: u64,
    /// The dense ranker, when a model and this index's vectors agree.
    dense: Option<Dense>,
}

/// A model and the vectors it made of this index's cards.
struct Dense {
    model: Arc<Model>,
    vectors: CardVectors,
    min_similarity: f32,
}

/// Whether an index ranks with the dense ranker too.
#[derive(Debug, Clone, PartialEq)]
pub enum DenseState {
    /// No model is configured: BM25 alone, as intended.
    Off,
    /// BM25 and the model, fused.
    On,
    /// A model is configured but cannot be used with this index: BM25 alone, and the
    /// reason (for `mopd status`).
    FailedClosed(String),
}

impl std::fmt::Debug for SearchIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchIndex")
            .field("dir", &self.dir)
            .field("docs", &self.file.docs())
            .finish()
    }
}

impl SearchIndex {
    /// Opens an index built by [`build_index`], writing nothing.
    pub fn open(dir: &Path) -> Result<SearchIndex, SearchError> {
        let shown = dir.display().to_string();
        let invalid = |problem: String| SearchError::Invalid {
            dir: shown.clone(),
            problem,
        };
        let io = |source| SearchError::Io {
            dir: shown.clone(),
            source,
        };
        let meta = file::read_meta(dir).map_err(io)?.map_err(invalid)?;
        if meta.format != FORMAT {
            return Err(invalid(match meta.format {
                1..=3 => format!(
                    "index format {} was written by an earlier mop (a tantivy index); this one reads format {FORMAT}",
                    meta.format
                ),
                other => format!("index format {other} is not a supported format ({FORMAT})"),
            }));
        }
        let file = IndexFile::open(dir).map_err(io)?.map_err(invalid)?;
        if u64::from(file.docs()) != meta.docs {
            return Err(invalid(format!(
                "{} records {} documents but the index holds {}",
                file::META_FILE,
                meta.docs,
                file.docs()
            )));
        }
        let docs = file.docs();
        let mut docs_of = vec![0u32; docs as usize];
        for doc in 0..docs {
            docs_of[file.ord(doc) as usize] = doc;
        }
        let mut open = VisibleSet::empty(docs as usize);
        let mut open_tokens = 0;
        for doc in 0..file.open_docs() {
            open.insert(file.ord(doc));
            open_tokens += u64::from(fieldnorm::length(file.norms()[doc as usize]));
        }
        Ok(SearchIndex {
            dir: shown,
            file,
            docs_of,
            open,
            open_tokens,
            dense: None,
        })
    }

    /// Opens the index in `dir` as [`SearchIndex::open`] does and, given a model, its card
    /// vectors too: if they were made by that model (same fingerprint, same dimension),
    /// searches fuse both rankings; otherwise the index ranks by BM25 alone and the state
    /// says why. Damaged vectors fail closed the same way.
    pub fn open_with(
        dir: &Path,
        model: Option<&Arc<Model>>,
        min_similarity: f32,
    ) -> Result<(SearchIndex, DenseState), SearchError> {
        let mut index = SearchIndex::open(dir)?;
        let Some(model) = model else {
            return Ok((index, DenseState::Off));
        };
        let cards = index.file.docs();
        let state = match CardVectors::read(dir, model, cards) {
            Ok(Ok(vectors)) => {
                index.dense = Some(Dense {
                    model: model.clone(),
                    vectors,
                    min_similarity,
                });
                DenseState::On
            }
            Ok(Err(Mismatch::Absent)) => DenseState::FailedClosed(format!(
                "this generation was built without card vectors; model {} ranks from the next generation on",
                model.fingerprint()
            )),
            Ok(Err(m)) => DenseState::FailedClosed(format!(
                "{m}; the configured model is {} (vectors are rebuilt with the next generation)",
                model.fingerprint()
            )),
            Err(e) => DenseState::FailedClosed(e.to_string()),
        };
        Ok((index, state))
    }

    /// Whether searches fuse the dense ranking in.
    pub fn is_hybrid(&self) -> bool {
        self.dense.is_some()
    }

    /// Memory held by the dense ranker's vectors (not the model's, which is shared).
    pub fn vector_bytes(&self) -> usize {
        self.dense.as_ref().map_or(0, |d| d.vectors.heap_bytes())
    }

    /// Number of indexed cards.
    pub fn num_docs(&self) -> u64 {
        u64::from(self.file.docs())
    }

    /// The best `limit` cards for `text` among `visible`, best first (ties: lower ordinal,
    /// which is the lower id, first). Scores use statistics of the visible cards only (see
    /// the module comment). By BM25 alone, an empty or stopword-only text finds nothing.
    ///
    /// With the dense ranker on, the BM25 ranking and the cosine ranking (cards at
    /// `min_similarity` or more) are fused by reciprocal rank fusion; a hit's score is then
    /// its fused score. Either way only cards in `visible` are ranked, by either ranker.
    pub fn search(
        &self,
        text: &str,
        limit: usize,
        visible: Arc<VisibleSet>,
    ) -> Result<Vec<TextHit>, SearchError> {
        let Some(dense) = &self.dense else {
            return self.bm25(text, limit, visible);
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let depth = limit.max(FUSION_DEPTH);
        let by_words = self.bm25(text, depth, visible.clone())?;
        let by_meaning = match dense.model.embed(text) {
            Some(query) => {
                let everyone = VisibleSet::empty(0);
                dense.vectors.nearest(
                    &query,
                    visible.without(&everyone),
                    dense.min_similarity,
                    depth,
                )
            }
            None => Vec::new(),
        };
        Ok(fuse(
            by_words.iter().map(|h| h.ord),
            by_meaning.iter().map(|h| h.0),
            limit,
        ))
    }

    /// The BM25 ranking alone (see [`SearchIndex::search`]).
    pub fn bm25(
        &self,
        text: &str,
        limit: usize,
        visible: Arc<VisibleSet>,
    ) -> Result<Vec<TextHit>, SearchError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let Some(plan) = self.plan(text, &visible)? else {
            return Ok(Vec::new());
        };
        let f = &self.file;
        let open = f.open_docs();
        let (open_norms, restricted_norms) = f.norms().split_at(open as usize);
        let lists = |restricted: bool| -> Vec<TermList<'_>> {
            plan.terms
                .iter()
                .filter(|t| if restricted { t.info.restricted } else { t.info.open } > 0)
                .map(|t| TermList {
                    list: f.list(&t.info, restricted),
                    weight: t.weight,
                })
                .collect()
        };
        let mut best = topk::Best::new(limit);
        // Open cards: every one is visible on the fast path.
        let all_open = plan.own.is_some();
        let hits = topk::top_k(
            &plan.bm25,
            lists(false),
            open_norms,
            |doc| f.ord(doc),
            limit,
            |ord| all_open || visible.contains(ord),
        )
        .map_err(|_| self.damaged())?;
        hits.into_iter().for_each(|h| best.offer(h));
        match &plan.own {
            // The few visible restricted cards, scored from the frequencies found while
            // counting them (their lists are not scanned).
            Some(own) => {
                let mut scores = vec![0.0; own.len()];
                for t in &plan.terms {
                    for &(i, tf) in &t.own {
                        let norm = restricted_norms[own[i as usize] as usize];
                        scores[i as usize] += plan.bm25.score(t.weight, norm, tf);
                    }
                }
                for (&doc, score) in own.iter().zip(scores) {
                    if score > 0.0 {
                        best.offer(Ranked(score, f.ord(open + doc)));
                    }
                }
            }
            None => {
                let hits = topk::top_k(
                    &plan.bm25,
                    lists(true),
                    restricted_norms,
                    |doc| f.ord(open + doc),
                    limit,
                    |ord| visible.contains(ord),
                )
                .map_err(|_| self.damaged())?;
                hits.into_iter().for_each(|h| best.offer(h));
            }
        }
        Ok(best
            .into_sorted()
            .into_iter()
            .map(|Ranked(score, ord)| TextHit { ord, score })
            .collect())
    }

    fn damaged(&self) -> SearchError {
        SearchError::Invalid {
            dir: self.dir.clone(),
            problem: format!("a posting list in {} does not decode", file::INDEX_FILE),
        }
    }

    /// How `text` is searched: each distinct term that occurs in a visible card, keeping
    /// the [`MAX_QUERY_TERMS`] rarest among them (terms in no visible card cost nothing,
    /// and behave exactly like terms in no card at all, and a long ticket is searched by
    /// what is specific in it rather than by its commonest words), rarest first, each
    /// weighted by the visible cards' statistics.
    fn plan(&self, text: &str, visible: &VisibleSet) -> Result<Option<Plan>, SearchError> {
        let words = query_terms(text);
        let (docs, tokens) = self.visible_totals(visible);
        if docs == 0 {
            return Ok(None);
        }
        let f = &self.file;
        // With every open card visible (as in every task's set), the visible cards are the
        // open ones and a few restricted ones; otherwise every posting is looked at.
        let own: Option<Vec<u32>> = visible.covers(&self.open).then(|| {
            let mut own: Vec<u32> = visible
                .without(&self.open)
                .filter_map(|o| self.docs_of.get(o as usize))
                .map(|doc| doc - f.open_docs())
                .collect();
            own.sort_unstable();
            own
        });
        let mut terms = Vec::with_capacity(words.len());
        for word in words {
            let Some(info) = f.find(word.as_bytes()) else {
                continue;
            };
            let (df, own_tfs) = match &own {
                Some(own) => {
                    let found = if own.is_empty() || info.restricted == 0 {
                        Vec::new()
                    } else {
                        postings::frequencies_of(f.list(&info, true), own)
                            .map_err(|_| self.damaged())?
                    };
                    (u64::from(info.open) + found.len() as u64, found)
                }
                None => (self.count_visible(&info, visible)?, Vec::new()),
            };
            if df > 0 {
                terms.push((df, word, info, own_tfs));
            }
        }
        if terms.is_empty() {
            return Ok(None);
        }
        terms.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        terms.truncate(MAX_QUERY_TERMS);
        let bm25 = topk::Bm25::new(docs, tokens);
        let terms = terms
            .into_iter()
            .map(|(df, _, info, own)| PlannedTerm {
                weight: bm25.weight(df),
                info,
                own,
            })
            .collect();
        Ok(Some(Plan { bm25, terms, own }))
    }

    /// The visible cards' count and total length, summed over the visible cards alone
    /// (so that cards outside the set cannot shift it, not even by rounding): the open
    /// cards' precomputed sum plus the visible restricted ones.
    fn visible_totals(&self, visible: &VisibleSet) -> (u64, u64) {
        let norms = self.file.norms();
        let (base, none) = (&self.open, VisibleSet::empty(0));
        let (mut docs, mut tokens, extra) = if visible.covers(base) {
            (base.len() as u64, self.open_tokens, visible.without(base))
        } else {
            (0, 0, visible.without(&none))
        };
        for doc in extra.filter_map(|o| self.docs_of.get(o as usize)) {
            docs += 1;
            tokens += u64::from(fieldnorm::length(norms[*doc as usize]));
        }
        (docs, tokens)
    }

    /// How many visible cards hold the term at `info`: every posting of both its lists.
    fn count_visible(&self, info: &TermInfo, visible: &VisibleSet) -> Result<u64, SearchError> {
        let f = &self.file;
        let mut count = 0;
        let (mut docs, mut tfs) = ([0u32; postings::BLOCK], [0u32; postings::BLOCK]);
        for (restricted, offset) in [(false, 0), (true, f.open_docs())] {
            let mut list = f.list(info, restricted);
            loop {
                let n = list
                    .next_block(&mut docs, &mut tfs)
                    .map_err(|_| self.damaged())?;
                if n == 0 {
                    break;
                }
                count += docs[..n]
                    .iter()
                    .filter_map(|d| d.checked_add(offset).filter(|d| *d < f.docs()))
                    .filter(|d| visible.contains(f.ord(*d)))
                    .count() as u64;
            }
        }
        Ok(count)
    }
}

/// How one search scores: its terms, and on the fast path the visible restricted cards.
struct Plan {
    bm25: topk::Bm25,
    terms: Vec<PlannedTerm>,
    /// Fast path (every open card visible): the visible restricted cards (numbered in the
    /// restricted class), increasing, scored from [`PlannedTerm::own`].
    own: Option<Vec<u32>>,
}

/// One query term.
struct PlannedTerm {
    /// Its BM25 weight (idf × (K1 + 1)).
    weight: Score,
    /// Where its lists are.
    info: TermInfo,
    /// (index into [`Plan::own`], term frequency) for each visible restricted card that
    /// holds it.
    own: Vec<(u32, u32)>,
}

/// The distinct terms BM25 searches `text` by: its tokens without the stopwords (unless
/// it holds nothing else).
pub fn query_terms(text: &str) -> BTreeSet<String> {
    let mut words: BTreeSet<String> = tokenize::tokens(text).into_iter().map(|t| t.0).collect();
    if words.iter().any(|t| !STOPWORDS.contains(&t.as_str())) {
        words.retain(|t| !STOPWORDS.contains(&t.as_str()));
    }
    words
}

/// Reciprocal rank fusion of two rankings (best first): each card scores the sum of
/// 1 / (k + rank) over the rankings that hold it, ranks counting from 1. Best first, ties
/// to the lower ordinal; the sums are taken in one fixed order, so equal inputs give equal
/// scores to the last bit.
pub fn fuse(
    first: impl Iterator<Item = u32>,
    second: impl Iterator<Item = u32>,
    limit: usize,
) -> Vec<TextHit> {
    let mut scores: std::collections::BTreeMap<u32, f32> = std::collections::BTreeMap::new();
    for ranking in [first.collect::<Vec<_>>(), second.collect()] {
        for (rank, ord) in ranking.into_iter().enumerate() {
            *scores.entry(ord).or_insert(0.0) += 1.0 / (RRF_K + rank as f32 + 1.0);
        }
    }
    let mut hits: Vec<TextHit> = scores
        .into_iter()
        .map(|(ord, score)| TextHit { ord, score })
        .collect();
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.ord.cmp(&b.ord)));
    hits.truncate(limit);
    hits
}

/// Selects and ranks a task's cards in one call: derive codes and words, run BM25 over
/// the cards the task may see, then tier, rank and cap (see [`Catalog::select`]).
pub fn select_for_task(
    catalog: &Catalog,
    index: &SearchIndex,
    task: &TaskContext,
    rules: &Rules,
) -> Result<Selection, SearchError> {
    if index.num_docs() != catalog.len() as u64 {
        return Err(SearchError::Invalid {
            dir: "(open index)".into(),
            problem: format!(
                "index holds {} cards but the generation's manifest has {}",
                index.num_docs(),
                catalog.len()
            ),
        });
    }
    let query = TaskQuery::new(task, &rules.codes);
    let visible = Arc::new(catalog.visible_set(task));
    let hits = index.search(&task.search_text(), rules.config.text_candidates, visible)?;
    Ok(catalog.select(&query, &hits, &rules.config))
}

/// A scored hit (score, ordinal), ordered best last: higher score, then lower ordinal.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ranked(Score, u32);

impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    /// Better = higher score, then lower ordinal.
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(other.1.cmp(&self.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(docs: &[(String, bool)]) -> (SearchIndex, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let docs = docs.iter().enumerate().map(|(ord, (body, open))| IndexDoc {
            ord: ord as u32,
            title: "card",
            description: "",
            labels: &[],
            body: body.as_str().into(),
            open: *open,
        });
        build_index(dir.path(), docs).unwrap();
        (SearchIndex::open(dir.path()).unwrap(), dir)
    }

    /// A search over any visible set answers exactly like an index of only those cards,
    /// with open and restricted cards interleaved in ordinal order, on both paths (every
    /// open card visible, or not), across list lengths that make full blocks.
    #[test]
    fn answers_match_an_index_of_the_visible_cards_alone() {
        let n = 700u32;
        let docs: Vec<(String, bool)> = (0..n)
            .map(|i| {
                let body = format!("w{} w{} w{} w{} common", i % 3, i % 5, i % 7, i % 300);
                (body, i % 4 != 0)
            })
            .collect();
        let (index, _dir) = build(&docs);
        let sets: Vec<Vec<u32>> = vec![
            (0..n).filter(|o| o % 4 != 0).collect(),
            (0..n).filter(|o| o % 4 != 0 || o % 12 == 0).collect(),
            (0..n).collect(),
            (0..n).filter(|o| o % 3 == 1).collect(),
            vec![5, 8, 400],
        ];
        for set in sets {
            let alone: Vec<(String, bool)> = set
                .iter()
                .map(|&o| (docs[o as usize].0.clone(), true))
                .collect();
            let (small, _d) = build(&alone);
            let mut visible = VisibleSet::empty(n as usize);
            set.iter().for_each(|&o| visible.insert(o));
            let visible = Arc::new(visible);
            for q in ["w0", "w1 w4", "w2 w6 card", "common w17", "w299 w0 nothing"] {
                let got = index.search(q, 20, visible.clone()).unwrap();
                let mut everyone = VisibleSet::empty(set.len());
                (0..set.len() as u32).for_each(|o| everyone.insert(o));
                let want: Vec<TextHit> = small
                    .search(q, 20, Arc::new(everyone))
                    .unwrap()
                    .into_iter()
                    .map(|h| TextHit {
                        ord: set[h.ord as usize],
                        score: h.score,
                    })
                    .collect();
                // Equal scores may order differently by ordinal; compare as sets of pairs
                // sorted by (score, ordinal).
                let key = |v: &[TextHit]| {
                    let mut v: Vec<(u32, u32)> =
                        v.iter().map(|h| (h.score.to_bits(), h.ord)).collect();
                    v.sort_unstable();
                    v
                };
                assert_eq!(key(&got), key(&want), "{q:?} over {} cards", set.len());
            }
        }
    }

    /// An index built in two halves (two threads) is the same, byte for byte, as one
    /// built from every card in turn.
    #[test]
    fn two_halves_make_the_same_index_as_one_pass() {
        let n = PARALLEL_MIN as u32 + 301;
        let texts: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    "w{} w{} w{} long-{}-{} x{}",
                    i % 3,
                    i % 11,
                    i % 97,
                    i % 13,
                    "y".repeat((i % 20) as usize),
                    i
                )
            })
            .collect();
        let docs = || {
            texts.iter().enumerate().map(|(ord, t)| IndexDoc {
                ord: ord as u32,
                title: "a title",
                description: "",
                labels: &[],
                body: t.as_str().into(),
                open: ord % 3 != 1,
            })
        };
        let single = tempfile::tempdir().unwrap();
        let mut builder = IndexBuilder::new(None);
        for d in docs() {
            builder.add(d).unwrap();
        }
        builder.write(single.path()).unwrap();
        // By hand (whatever this machine's cores), then as build_index does it.
        let halves = tempfile::tempdir().unwrap();
        let (mut first, mut second) = (
            IndexBuilder::new(None),
            IndexBuilder::starting_at(n / 2, None),
        );
        for d in docs() {
            if d.ord < n / 2 {
                first.add(d)
            } else {
                second.add(d)
            }
            .unwrap();
        }
        first.append(second).unwrap();
        first.write(halves.path()).unwrap();
        let built = tempfile::tempdir().unwrap();
        build_index(built.path(), docs()).unwrap();
        let read = |d: &tempfile::TempDir| std::fs::read(d.path().join(file::INDEX_FILE)).unwrap();
        assert_eq!(read(&halves), read(&single));
        assert_eq!(read(&built), read(&single));
        // A later part that does not continue the first is refused.
        let mut first = IndexBuilder::new(None);
        first.add(docs().next().unwrap()).unwrap();
        assert!(matches!(
            first.append(IndexBuilder::starting_at(5, None)),
            Err(SearchError::Order {
                expected: 1,
                got: 5
            })
        ));
    }

    #[test]
    fn cards_out_of_order_are_refused_and_damage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let doc = |ord| IndexDoc {
            ord,
            title: "t",
            description: "",
            labels: &[],
            body: "b".into(),
            open: true,
        };
        assert!(matches!(
            build_index(dir.path(), [doc(0), doc(2)]),
            Err(SearchError::Order {
                expected: 1,
                got: 2
            })
        ));
        let docs: Vec<(String, bool)> = (0..300)
            .map(|i| (format!("x y{}", i % 2), i % 3 != 0))
            .collect();
        let (_, dir) = build(&docs);
        let path = dir.path().join(file::INDEX_FILE);
        let good = std::fs::read(&path).unwrap();
        // Every single-byte change and every cut either opens and searches (to some answer)
        // or is refused as invalid: never a panic.
        let mut refused = 0;
        for i in (0..good.len()).step_by(7).chain([good.len() - 1]) {
            for damaged in [
                {
                    let mut d = good.clone();
                    d[i] ^= 0x5a;
                    d
                },
                good[..i].to_vec(),
            ] {
                std::fs::write(&path, &damaged).unwrap();
                match SearchIndex::open(dir.path()) {
                    Ok(index) => {
                        let mut all = VisibleSet::empty(300);
                        (0..300).for_each(|o| all.insert(o));
                        let _ = index.search("x y0 y1", 10, Arc::new(all));
                        let mut some = VisibleSet::empty(300);
                        (0..300).step_by(2).for_each(|o| some.insert(o));
                        let _ = index.search("x y0 y1", 10, Arc::new(some));
                    }
                    Err(SearchError::Invalid { .. }) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        assert!(refused > 0);
    }
}
