//! BM25 search over one workspace snapshot, for task selection and `mop memory retrieve`.
//!
//! [`build_index`] writes an index of every card (title, description, labels, body) into a
//! fresh directory once per generation; [`SearchIndex::open`] opens it read-only. Text is
//! tokenized by [`tokenize::tokens`]: lowercase words, and character bigrams for Chinese,
//! Japanese and Korean, so CJK queries work with no dictionary.
//!
//! Documents carry the card's *ordinal* in the generation's [`mop_cards::Catalog`] (cards
//! sorted by id). A search takes the task's [`VisibleSet`] and never returns a card outside
//! it, so text hits obey the same hard exclusions as the tiers.
//!
//! No answer depends on cards outside that set (DESIGN.md "Retrieval"): BM25's statistics
//! (document count, average length, each term's document frequency) are computed over the
//! visible cards only, so neither the scores nor the ranking nor the choice of query terms
//! tell whether a word occurs in a card the task cannot see. To keep that cheap, open cards
//! (those every task may see) and *restricted* cards are indexed into separate segments: a
//! term's frequency among the visible cards is its frequency in the open segments (one
//! dictionary lookup per segment) plus the visible restricted cards that hold it (a
//! skip-list seek for each of them; a task sees few). Earlier formats indexed restricted
//! cards' words a second time in a field of their own, which cost 60 % more indexing for
//! the same answer; they are still read.
//!
//! Tantivy stores the index (term dictionary, postings, field norms); scoring is this
//! crate's own ([`topk`]): term at a time into one score array, the open segments
//! scanned and the visible restricted cards scored from the frequencies found while
//! counting them, which on these long queries beats tantivy's union and its pruning.
//!
//! With an embedding model ([`mop_embed`]), a build also stores each card's vector, and a
//! search ranks the visible cards a second way, by cosine similarity to the text, and
//! merges the two rankings by reciprocal rank fusion ([`RRF_K`]): BM25 finds the cards
//! that share the text's words, the model those that share its meaning. Vectors of
//! another model, or none, leave the index on BM25 alone ([`DenseState`]).

mod readonly;
pub mod tokenize;
mod topk;

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use mop_cards::{Catalog, Rules, Selection, TaskContext, TaskQuery, TextHit, VisibleSet};
use mop_embed::{CardVectors, Mismatch, Model, VectorsBuilder};
use serde::{Deserialize, Serialize};
use tantivy::directory::MmapDirectory;
use tantivy::index::InvertedIndexReader;
use tantivy::index::SegmentId;
use tantivy::indexer::NoMergePolicy;
use tantivy::postings::{Postings, TermInfo};
use tantivy::schema::{FAST, Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions};
use tantivy::{
    DocId, DocSet, Index, IndexReader, IndexWriter, ReloadPolicy, Score, TERMINATED,
    TantivyDocument, Term,
};

use crate::readonly::ReadOnlyDirectory;

const TOKENIZER: &str = "mop";
const META_FILE: &str = "mop-search.json";
/// Format 3 keeps open and restricted cards in separate segments. Format 2 (a
/// restricted-text field and the `open` flag) and format 1 indexes still open; format 1's
/// visible statistics are computed the slow way (every posting).
const FORMAT: u32 = 3;
/// Indexing memory budget (shared by the indexing threads). Tantivy flushes a segment
/// when it is reached, and the segments are merged at the end: a 10k-card workspace never
/// reaches it, a 100k-card one makes a few segments, and every extra segment costs a
/// merge (48 MiB: 5.2 s for 100k cards, 128 MiB: 4.5 s, same machine and sitting).
const WRITER_BUDGET_BYTES: usize = 128 * 1024 * 1024;

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
    /// Tantivy failed.
    #[error("search index at {dir}: {source}")]
    Tantivy {
        /// The index directory.
        dir: String,
        /// The error.
        source: tantivy::TantivyError,
    },
    /// The directory is not a mop search index, or one of another format.
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

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    format: u32,
    docs: u64,
}

/// The index's fields: the text of every card, its ordinal and whether it is open. One
/// text field holds title, labels, description and body. Title and labels are written
/// twice: a word there says more about a card than one in its body, and repetition weights
/// them without the cost of querying four fields per term.
struct Fields {
    text: Field,
    ord: Field,
    open: Field,
}

fn schema() -> (Schema, Fields) {
    let mut builder = Schema::builder();
    // Frequencies without positions: BM25 needs no phrase queries, and the index is smaller.
    let options = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER)
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let text = builder.add_text_field("text", options);
    let ord = builder.add_u64_field("ord", FAST);
    let open = builder.add_u64_field("open", FAST);
    (builder.build(), Fields { text, ord, open })
}

fn field_of(schema: &Schema, dir: &Path, name: &str) -> Result<Field, SearchError> {
    schema.get_field(name).map_err(|_| SearchError::Invalid {
        dir: dir.display().to_string(),
        problem: format!("field {name} is missing"),
    })
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

/// Builds an index of `docs` in `dir`, which must exist and be empty. The caller makes it
/// visible atomically (it is built inside a generation that is renamed into place).
///
/// Each change between open and restricted cards in `docs` ends a segment, so callers
/// pass the open cards first and then the restricted ones (any order works; that one makes
/// the fewest segments).
pub fn build_index<'a>(
    dir: &Path,
    docs: impl IntoIterator<Item = IndexDoc<'a>>,
) -> Result<BuildReport, SearchError> {
    build_index_with(dir, docs, None)
}

/// [`build_index`], and with a model also each card's vector (of the same text the index
/// holds), stored beside the index with the model's fingerprint. The vectors are computed
/// on this thread while the index's own threads write the index.
pub fn build_index_with<'a>(
    dir: &Path,
    docs: impl IntoIterator<Item = IndexDoc<'a>>,
    model: Option<&Model>,
) -> Result<BuildReport, SearchError> {
    let tantivy = |source| SearchError::Tantivy {
        dir: dir.display().to_string(),
        source,
    };
    let (schema, fields) = schema();
    let index = Index::create_in_dir(dir, schema).map_err(tantivy)?;
    index
        .tokenizers()
        .register(TOKENIZER, tokenize::MopTokenizer);
    // Two threads halve the wall time of a large build (the CPU time stays the same).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(2));
    let mut writer = index
        .writer_with_num_threads::<TantivyDocument>(threads, WRITER_BUDGET_BYTES)
        .map_err(tantivy)?;
    // Merges would mix open and restricted segments.
    writer.set_merge_policy(Box::new(NoMergePolicy));
    let mut count = 0u64;
    let mut text = String::new();
    let mut vectors = model.map(VectorsBuilder::new);
    // The kind of card being indexed, and the segments made of each kind so far.
    let mut kind = None;
    let mut segments: [Vec<SegmentId>; 2] = Default::default();
    let mut commit = |writer: &mut IndexWriter<TantivyDocument>, open: bool| {
        writer.commit()?;
        let new: Vec<SegmentId> = index
            .searchable_segment_ids()?
            .into_iter()
            .filter(|id| !segments.iter().flatten().any(|s| s == id))
            .collect();
        segments[usize::from(open)].extend(new);
        tantivy::Result::Ok(())
    };
    for d in docs {
        if let Some(open) = kind.filter(|open| *open != d.open) {
            commit(&mut writer, open).map_err(tantivy)?;
        }
        kind = Some(d.open);
        let mut doc = TantivyDocument::new();
        text.clear();
        let mut once = 0;
        for _ in 0..2 {
            once = text.len();
            text.push_str(d.title);
            text.push('\n');
            for l in d.labels {
                text.push_str(l);
                text.push(' ');
            }
            text.push('\n');
        }
        text.push_str(d.description);
        text.push('\n');
        // The vector's text leads with what says most: title, labels, description, then
        // the body (the model reads the first kilobyte).
        text.push_str(&d.body);
        if let Some(v) = &mut vectors {
            // Title and labels once (the index has them twice, to weight them).
            v.add(d.ord, &text[once..]);
        }
        doc.add_text(fields.text, &text);
        doc.add_u64(fields.ord, u64::from(d.ord));
        doc.add_u64(fields.open, u64::from(d.open));
        writer.add_document(doc).map_err(tantivy)?;
        count += 1;
    }
    commit(&mut writer, kind.unwrap_or(true)).map_err(tantivy)?;
    // One segment per kind: each indexing thread flushes its own, and every segment costs
    // a search a dictionary lookup per term. Both merges run at once.
    let merges: Vec<_> = segments
        .iter()
        .filter(|ids| ids.len() > 1)
        .map(|ids| writer.merge(ids))
        .collect();
    for merge in merges {
        merge.wait().map_err(tantivy)?;
    }
    writer.wait_merging_threads().map_err(tantivy)?;
    drop(index);
    // Lock files are only for writers; leaving none behind keeps the generation clean.
    for lock in [".tantivy-writer.lock", ".tantivy-meta.lock"] {
        match std::fs::remove_file(dir.join(lock)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(SearchError::Io {
                    dir: dir.display().to_string(),
                    source: e,
                });
            }
            _ => {}
        }
    }
    let meta = serde_json::to_vec(&Meta {
        format: FORMAT,
        docs: count,
    })
    .expect("meta serializes");
    // Vectors are an extra: failing to store them leaves a BM25-only index, never a
    // failed generation.
    let vectors_error = vectors.and_then(|v| {
        let stored = u32::try_from(count)
            .map_err(|_| format!("{count} cards are more than vectors can number"))
            .and_then(|cards| v.write(dir, cards).map_err(|e| e.to_string()));
        stored.err().inspect(|_| {
            for f in [mop_embed::VECTORS_META, mop_embed::VECTORS_FILE] {
                let _ = std::fs::remove_file(dir.join(f));
            }
        })
    });
    std::fs::write(dir.join(META_FILE), meta).map_err(|source| SearchError::Io {
        dir: dir.display().to_string(),
        source,
    })?;
    Ok(BuildReport {
        docs: count,
        vectors_error,
    })
}

/// `items` (a generation's cards, by ordinal) in the order [`build_index`] wants them:
/// the open ones, then the restricted ones, each with its ordinal.
pub fn open_first<T>(
    items: &[T],
    is_open: impl Fn(&T) -> bool + Copy,
) -> impl Iterator<Item = (u32, &T)> {
    let ordinals = || items.iter().enumerate().map(|(ord, t)| (ord as u32, t));
    ordinals()
        .filter(move |(_, t)| is_open(t))
        .chain(ordinals().filter(move |(_, t)| !is_open(t)))
}

/// An index opened read-only.
pub struct SearchIndex {
    reader: IndexReader,
    text: Field,
    /// How a term's frequency among the open cards is found (format 1 indexes: not at
    /// all, and every posting is looked at).
    open_df: Option<OpenFrequency>,
    docs: u64,
    /// Per segment (in searcher order), the card ordinal of each document: an array
    /// lookup while collecting instead of decoding the fast field for every hit.
    ords: Arc<Vec<Vec<u32>>>,
    /// The other way: each ordinal's (segment, document).
    docs_of: Vec<(u32, DocId)>,
    /// The open cards' ordinals (empty in format 1 indexes).
    open: VisibleSet,
    /// Each card's length (its text's field norm), by ordinal.
    norms: Vec<u32>,
    /// The open cards' lengths, summed.
    open_tokens: u64,
    /// Per segment (in searcher order), each document's field norm id: what BM25 reads
    /// of a card's length.
    segment_norms: Vec<Vec<u8>>,
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

/// How a search learns a term's frequency among the open cards, which every task sees.
enum OpenFrequency {
    /// Format 2: every card's frequency minus that in the restricted-text field.
    RestrictedField(Field),
    /// Format 3: the sum over the open segments (true at an open segment's position).
    Segments(Vec<bool>),
}

impl std::fmt::Debug for SearchIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchIndex")
            .field("docs", &self.docs)
            .finish()
    }
}

impl SearchIndex {
    /// Opens an index built by [`build_index`], writing nothing.
    pub fn open(dir: &Path) -> Result<SearchIndex, SearchError> {
        let shown = || dir.display().to_string();
        let invalid = |problem: String| SearchError::Invalid {
            dir: shown(),
            problem,
        };
        let meta_bytes = std::fs::read(dir.join(META_FILE)).map_err(|source| SearchError::Io {
            dir: shown(),
            source,
        })?;
        let meta: Meta = serde_json::from_slice(&meta_bytes)
            .map_err(|e| invalid(format!("{META_FILE} is unreadable: {e}")))?;
        if !(1..=FORMAT).contains(&meta.format) {
            return Err(invalid(format!(
                "index format {} is not a supported format (1 to {FORMAT})",
                meta.format
            )));
        }
        let tantivy = |source| SearchError::Tantivy {
            dir: shown(),
            source,
        };
        let mmap = MmapDirectory::open(dir).map_err(|e| invalid(e.to_string()))?;
        let index = Index::open(ReadOnlyDirectory(mmap)).map_err(tantivy)?;
        index
            .tokenizers()
            .register(TOKENIZER, tokenize::MopTokenizer);
        let text = field_of(&index.schema(), dir, "text")?;
        field_of(&index.schema(), dir, "ord")?;
        let mut open_df = match meta.format {
            1 => None,
            2 => Some(OpenFrequency::RestrictedField(field_of(
                &index.schema(),
                dir,
                "restricted",
            )?)),
            _ => Some(OpenFrequency::Segments(Vec::new())),
        };
        if meta.format >= 2 {
            field_of(&index.schema(), dir, "open")?;
        }
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(tantivy)?;
        let docs = reader.searcher().num_docs();
        if docs != meta.docs {
            return Err(invalid(format!(
                "{META_FILE} records {} documents but the index holds {docs}",
                meta.docs
            )));
        }
        let mut ords = Vec::new();
        let mut open = VisibleSet::empty(docs as usize);
        let mut norms = vec![0u32; docs as usize];
        let mut docs_of = vec![(0u32, 0 as DocId); docs as usize];
        let mut segment_norms = Vec::new();
        for (seg_no, segment) in reader.searcher().segment_readers().iter().enumerate() {
            let column = segment.fast_fields().u64("ord").map_err(tantivy)?;
            let open_column = match open_df {
                None => None,
                Some(_) => Some(segment.fast_fields().u64("open").map_err(tantivy)?),
            };
            let fieldnorms = segment.get_fieldnorms_reader(text).map_err(tantivy)?;
            let mut seg = Vec::with_capacity(segment.max_doc() as usize);
            let mut seg_norms = Vec::with_capacity(segment.max_doc() as usize);
            let opened = open.len();
            for doc in 0..segment.max_doc() {
                let ord = column
                    .first(doc)
                    .and_then(|o| u32::try_from(o).ok())
                    .filter(|o| u64::from(*o) < docs)
                    .ok_or_else(|| invalid(format!("document {doc} has no card ordinal")))?;
                if open_column.as_ref().and_then(|c| c.first(doc)) == Some(1) {
                    open.insert(ord);
                }
                norms[ord as usize] = fieldnorms.fieldnorm(doc);
                seg_norms.push(fieldnorms.fieldnorm_id(doc));
                docs_of[ord as usize] = (seg_no as u32, doc);
                seg.push(ord);
            }
            if let Some(OpenFrequency::Segments(kinds)) = &mut open_df {
                let open_here = open.len() - opened;
                if open_here != 0 && open_here != seg.len() {
                    return Err(invalid(format!(
                        "segment {seg_no} holds both open and restricted cards"
                    )));
                }
                kinds.push(open_here != 0);
            }
            ords.push(seg);
            segment_norms.push(seg_norms);
        }
        let open_tokens = open
            .without(&VisibleSet::empty(0))
            .map(|o| u64::from(norms[o as usize]))
            .sum();
        Ok(SearchIndex {
            reader,
            text,
            open_df,
            docs,
            ords: Arc::new(ords),
            docs_of,
            open,
            norms,
            open_tokens,
            segment_norms,
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
        let cards = u32::try_from(index.docs).unwrap_or(u32::MAX);
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
        self.docs
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
        let tantivy = |source| SearchError::Tantivy {
            dir: "(open index)".into(),
            source,
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let searcher = self.reader.searcher();
        let Some(plan) = self.plan(text, &searcher, &visible).map_err(tantivy)? else {
            return Ok(Vec::new());
        };
        let mut best = topk::Best::new(limit);
        for (segment, reader) in searcher.segment_readers().iter().enumerate() {
            // On the fast path, restricted segments are not scanned: the few restricted
            // cards the task sees were scored from the frequencies found while counting.
            let open = plan.open_segments.get(segment).copied();
            if plan.own.is_some() && open != Some(true) {
                continue;
            }
            let inverted = reader.inverted_index(self.text).map_err(tantivy)?;
            let mut postings = Vec::with_capacity(plan.terms.len());
            for t in &plan.terms {
                if let Some(info) = t.infos.get(segment).and_then(Option::as_ref) {
                    postings.push(topk::TermPostings {
                        postings: inverted
                            .read_block_postings_from_terminfo(info, IndexRecordOption::WithFreqs)
                            .map_err(|e| tantivy(e.into()))?,
                        weight: t.weight,
                    });
                }
            }
            if postings.is_empty() {
                continue;
            }
            let all_visible = plan.own.is_some();
            let hits = topk::top_k(
                &plan.bm25,
                postings,
                &self.segment_norms[segment],
                &self.ords[segment],
                limit,
                |ord| all_visible || visible.contains(ord),
            );
            hits.into_iter().for_each(|h| best.offer(h));
        }
        if let Some(own) = &plan.own {
            let mut scores = vec![0.0; own.len()];
            for t in &plan.terms {
                for &(i, tf) in &t.own {
                    let (segment, doc) = own[i as usize];
                    let norm = self.segment_norms[segment as usize][doc as usize];
                    scores[i as usize] += plan.bm25.score(t.weight, norm, tf);
                }
            }
            for (&(segment, doc), score) in own.iter().zip(scores) {
                if score > 0.0 {
                    best.offer(Ranked(score, self.ords[segment as usize][doc as usize]));
                }
            }
        }
        Ok(best
            .into_sorted()
            .into_iter()
            .map(|Ranked(score, ord)| TextHit { ord, score })
            .collect())
    }

    /// How `text` is searched: each distinct term that occurs in a visible card, keeping
    /// the [`MAX_QUERY_TERMS`] rarest among them (terms in no visible card cost nothing,
    /// and behave exactly like terms in no card at all, and a long ticket is searched by
    /// what is specific in it rather than by its commonest words), rarest first, each
    /// weighted by the visible cards' statistics.
    fn plan(
        &self,
        text: &str,
        searcher: &tantivy::Searcher,
        visible: &VisibleSet,
    ) -> Result<Option<Plan>, tantivy::TantivyError> {
        let words = query_terms(text);
        let (docs, tokens) = self.visible_totals(visible);
        if docs == 0 {
            return Ok(None);
        }
        let inverted = searcher
            .segment_readers()
            .iter()
            .map(|r| r.inverted_index(self.text))
            .collect::<tantivy::Result<Vec<_>>>()?;
        // With every open card visible (as in every task's set), the visible cards are the
        // open ones and a few restricted ones; otherwise every posting is looked at.
        let fast = match &self.open_df {
            Some(how) if visible.covers(&self.open) => {
                let mut own: Vec<(u32, DocId)> = visible
                    .without(&self.open)
                    .filter_map(|o| self.docs_of.get(o as usize).copied())
                    .collect();
                own.sort_unstable();
                Some((how, own))
            }
            _ => None,
        };
        let mut terms = Vec::with_capacity(words.len());
        for word in words {
            let term = Term::from_field_text(self.text, &word);
            let infos = inverted
                .iter()
                .map(|inv| inv.get_term_info(&term))
                .collect::<std::io::Result<Vec<_>>>()?;
            let everywhere: u64 = infos.iter().flatten().map(|i| u64::from(i.doc_freq)).sum();
            if everywhere == 0 {
                continue;
            }
            let mut own_tfs = Vec::new();
            let df = match &fast {
                Some((OpenFrequency::Segments(kinds), own)) => {
                    let in_open: u64 = infos
                        .iter()
                        .zip(kinds)
                        .filter(|(_, open)| **open)
                        .filter_map(|(info, _)| info.as_ref())
                        .map(|info| u64::from(info.doc_freq))
                        .sum();
                    own_tfs = frequencies_among(&inverted, &infos, own)?;
                    in_open + own_tfs.len() as u64
                }
                Some((OpenFrequency::RestrictedField(field), own)) => {
                    let term = Term::from_field_text(*field, &word);
                    let in_restricted = searcher.doc_freq(&term)?;
                    (everywhere - in_restricted.min(everywhere))
                        + self.count_among(searcher, &term, own)?
                }
                None => everywhere.saturating_sub(self.count_outside(searcher, &term, visible)?),
            };
            if df > 0 {
                terms.push((df, word, infos, own_tfs));
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
            .map(|(df, _, infos, own)| PlannedTerm {
                weight: bm25.weight(df),
                infos,
                own,
            })
            .collect();
        let (open_segments, own) = match (fast, &self.open_df) {
            (Some((_, own)), Some(OpenFrequency::Segments(kinds))) => (kinds.clone(), Some(own)),
            _ => (Vec::new(), None),
        };
        Ok(Some(Plan {
            bm25,
            terms,
            open_segments,
            own,
        }))
    }

    /// The visible cards' count and total length, summed over the visible cards alone
    /// (so that cards outside the set cannot shift it, not even by rounding): the open
    /// cards' precomputed sum plus the visible restricted ones.
    fn visible_totals(&self, visible: &VisibleSet) -> (u64, u64) {
        let length = |o: u32| u64::from(self.norms.get(o as usize).copied().unwrap_or(0));
        let in_index = |o: &u32| u64::from(*o) < self.docs;
        let (base, none) = (&self.open, VisibleSet::empty(0));
        let (mut docs, mut tokens, extra) = if visible.covers(base) {
            (base.len() as u64, self.open_tokens, visible.without(base))
        } else {
            (0, 0, visible.without(&none))
        };
        for o in extra.filter(in_index) {
            docs += 1;
            tokens += length(o);
        }
        (docs, tokens)
    }

    /// How many of `docs` (sorted (segment, document) pairs) hold `term`: one seek in the
    /// term's postings per document.
    fn count_among(
        &self,
        searcher: &tantivy::Searcher,
        term: &Term,
        docs: &[(u32, DocId)],
    ) -> Result<u64, tantivy::TantivyError> {
        let mut found = 0;
        let readers = searcher.segment_readers();
        let mut i = 0;
        while i < docs.len() {
            let segment = docs[i].0;
            let end = i + docs[i..].iter().take_while(|d| d.0 == segment).count();
            if let Some(reader) = readers.get(segment as usize)
                && let Some(mut postings) = reader
                    .inverted_index(term.field())?
                    .read_postings(term, IndexRecordOption::Basic)?
            {
                for &(_, doc) in &docs[i..end] {
                    if postings.doc() > doc {
                        continue;
                    }
                    if postings.seek(doc) == TERMINATED {
                        break;
                    }
                    if postings.doc() == doc {
                        found += 1;
                    }
                }
            }
            i = end;
        }
        Ok(found)
    }

    /// How many documents with `term` (in its field) are outside `visible`.
    fn count_outside(
        &self,
        searcher: &tantivy::Searcher,
        term: &Term,
        visible: &VisibleSet,
    ) -> Result<u64, tantivy::TantivyError> {
        let mut outside = 0;
        for (segment, reader) in searcher.segment_readers().iter().enumerate() {
            let Some(mut postings) = reader
                .inverted_index(term.field())?
                .read_postings(term, IndexRecordOption::Basic)?
            else {
                continue;
            };
            let ords = &self.ords[segment];
            let mut doc = postings.doc();
            while doc != TERMINATED {
                if ords
                    .get(doc as usize)
                    .is_some_and(|o| !visible.contains(*o))
                {
                    outside += 1;
                }
                doc = postings.advance();
            }
        }
        Ok(outside)
    }
}

/// How one search scores: its terms, and on the fast path the visible restricted cards.
struct Plan {
    bm25: topk::Bm25,
    terms: Vec<PlannedTerm>,
    /// Per segment, whether it holds open cards (fast path only).
    open_segments: Vec<bool>,
    /// Fast path (format 3, every open card visible): the visible restricted cards as
    /// sorted (segment, document) pairs, scored from [`PlannedTerm::own`].
    own: Option<Vec<(u32, DocId)>>,
}

/// One query term.
struct PlannedTerm {
    /// Its BM25 weight (idf × (K1 + 1)).
    weight: Score,
    /// Where its postings are in each segment (`None`: not in that segment).
    infos: Vec<Option<TermInfo>>,
    /// (index into [`Plan::own`], term frequency) for each visible restricted card that
    /// holds it.
    own: Vec<(u32, u32)>,
}

/// Which of `docs` (sorted (segment, document) pairs) hold the term whose postings are at
/// `infos`, with its frequency there: one seek per document.
fn frequencies_among(
    inverted: &[Arc<InvertedIndexReader>],
    infos: &[Option<TermInfo>],
    docs: &[(u32, DocId)],
) -> std::io::Result<Vec<(u32, u32)>> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < docs.len() {
        let segment = docs[i].0 as usize;
        let end = i + docs[i..]
            .iter()
            .take_while(|d| d.0 as usize == segment)
            .count();
        if let (Some(inv), Some(Some(info))) = (inverted.get(segment), infos.get(segment)) {
            let mut postings =
                inv.read_postings_from_terminfo(info, IndexRecordOption::WithFreqs)?;
            for (at, &(_, doc)) in docs.iter().enumerate().take(end).skip(i) {
                if postings.doc() > doc {
                    continue;
                }
                if postings.seek(doc) == TERMINATED {
                    break;
                }
                if postings.doc() == doc {
                    found.push((at as u32, postings.term_freq()));
                }
            }
        }
        i = end;
    }
    Ok(found)
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

    /// Cards given in any order (here: open and restricted interleaved, so every card
    /// starts a segment) answer exactly like cards given open first.
    #[test]
    fn card_order_does_not_change_answers() {
        let docs: Vec<(u32, String, bool)> = (0..40)
            .map(|i| (i, format!("w{} w{} w{}", i % 3, i % 5, i % 7), i % 3 != 0))
            .collect();
        let build = |ordered: Vec<&(u32, String, bool)>| {
            let dir = tempfile::tempdir().unwrap();
            let docs = ordered.into_iter().map(|(ord, body, open)| IndexDoc {
                ord: *ord,
                title: "card",
                description: "",
                labels: &[],
                body: body.as_str().into(),
                open: *open,
            });
            build_index(dir.path(), docs).unwrap();
            (SearchIndex::open(dir.path()).unwrap(), dir)
        };
        let (interleaved, a) = build(docs.iter().collect());
        let (grouped, _b) = build(open_first(&docs, |d| d.2).map(|(_, d)| d).collect());
        // Merged: one segment of each kind, and no files of the merged-away segments left.
        for index in [&interleaved, &grouped] {
            assert_eq!(index.reader.searcher().segment_readers().len(), 2);
        }
        let live: Vec<String> = interleaved
            .reader
            .searcher()
            .segment_readers()
            .iter()
            .map(|r| r.segment_id().uuid_string())
            .collect();
        for f in std::fs::read_dir(a.path()).unwrap() {
            let name = f.unwrap().file_name().into_string().unwrap();
            assert!(
                name.ends_with(".json") || live.iter().any(|id| name.starts_with(id.as_str())),
                "{name} is left over"
            );
        }
        for seen in [vec![0, 1, 2], vec![3], (0..40).collect()] {
            let mut visible = VisibleSet::empty(40);
            for o in (0..40).filter(|o| o % 3 != 0).chain(seen) {
                visible.insert(o);
            }
            let visible = Arc::new(visible);
            for q in ["w0", "w1 w4", "w2 w6 card"] {
                assert_eq!(
                    interleaved.search(q, 10, visible.clone()).unwrap(),
                    grouped.search(q, 10, visible.clone()).unwrap(),
                    "{q:?}"
                );
            }
        }
    }
}
