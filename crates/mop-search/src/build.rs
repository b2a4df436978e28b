//! Building an index in memory, one card at a time, then writing it in one pass.
//!
//! Every token of a card is looked up once in one hash table of the terms seen so far
//! (keyed by the term's bytes, which live in one arena), and its count in the card goes
//! up; when the card ends, each term it holds appends (card, count) to that term's list as
//! two variable-length integers. Nothing else happens per token, which is what makes this
//! several times cheaper than a general-purpose search engine's writer. Open and
//! restricted cards keep separate lists and are numbered separately (see [`crate::file`]).
//!
//! Cards come in ordinal order, so each list is already in document order: writing the
//! file sorts the terms and re-encodes each list into blocks, and sorts nothing else.

use std::path::Path;

use hashbrown::HashTable;
use mop_embed::{Model, VectorsBuilder};

use crate::tokenize::Tokens;
use crate::{IndexDoc, SearchError, fieldnorm, file, postings};

/// A term seen so far: where its bytes are in the arena, its hash (for growing the
/// table), and how often the card being added holds it.
struct Term {
    start: u32,
    len: u32,
    in_doc: u32,
    hash: u64,
}

/// One term's pairs for one class of cards, as variable-length integers (the gap from
/// the previous card shifted left once, low bit set for a count of 1, else followed by
/// the count).
#[derive(Default)]
struct MemList {
    bytes: Vec<u8>,
    last: u32,
    len: u32,
}

impl MemList {
    fn push(&mut self, doc: u32, tf: u32) {
        let gap = doc - self.last;
        self.last = doc;
        self.len += 1;
        if tf == 1 {
            postings::put_vint(&mut self.bytes, (gap << 1) | 1);
        } else {
            postings::put_vint(&mut self.bytes, gap << 1);
            postings::put_vint(&mut self.bytes, tf);
        }
    }

    /// Decodes into `into` (cleared first).
    fn decode(&self, into: &mut file::Pairs) {
        let (docs, tfs) = (&mut into.docs, &mut into.tfs);
        docs.clear();
        tfs.clear();
        let mut at = 0;
        let mut doc = 0u32;
        let next = |at: &mut usize| postings::get_vint(&self.bytes, at).expect("written above");
        for _ in 0..self.len {
            let v = next(&mut at);
            doc += v >> 1;
            docs.push(doc);
            tfs.push(if v & 1 == 1 { 1 } else { next(&mut at) });
        }
    }
}

/// The cards of one class (open or restricted), in the order they were added.
#[derive(Default)]
pub(crate) struct Class {
    /// Each card's ordinal.
    pub(crate) ords: Vec<u32>,
    /// Each card's length, as a field norm id.
    pub(crate) norms: Vec<u8>,
}

/// An index being built: cards go in with [`IndexBuilder::add`], in ordinal order, and
/// [`IndexBuilder::write`] stores it.
pub struct IndexBuilder<'m> {
    table: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    terms: Vec<Term>,
    arena: Vec<u8>,
    /// Per term, its lists of open and of restricted cards.
    lists: Vec<[MemList; 2]>,
    /// The terms of the card being added, each once.
    in_doc: Vec<u32>,
    /// Open cards (0) and restricted ones (1).
    classes: [Class; 2],
    next_ord: u32,
    vectors: Option<VectorsBuilder<'m>>,
    vector_text: String,
}

impl std::fmt::Debug for IndexBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexBuilder")
            .field("cards", &self.next_ord)
            .field("terms", &self.terms.len())
            .finish()
    }
}

impl<'m> IndexBuilder<'m> {
    /// An empty index; with a model, each card's vector is computed as it is added and
    /// stored with the index.
    pub fn new(model: Option<&'m Model>) -> IndexBuilder<'m> {
        IndexBuilder {
            table: HashTable::new(),
            // A per-process seed: card text is written by agents, and a fixed one would let
            // a card of crafted words make every lookup collide.
            hasher: foldhash::fast::RandomState::default(),
            terms: Vec::new(),
            arena: Vec::new(),
            lists: Vec::new(),
            in_doc: Vec::new(),
            classes: Default::default(),
            next_ord: 0,
            vectors: model.map(VectorsBuilder::new),
            vector_text: String::new(),
        }
    }

    /// Cards added so far.
    pub fn len(&self) -> u32 {
        self.next_ord
    }

    /// True when no card was added.
    pub fn is_empty(&self) -> bool {
        self.next_ord == 0
    }

    /// Adds the next card; its ordinal must be the number of cards added before it.
    pub fn add(&mut self, doc: IndexDoc<'_>) -> Result<(), SearchError> {
        if doc.ord != self.next_ord {
            return Err(SearchError::Order {
                expected: self.next_ord,
                got: doc.ord,
            });
        }
        // Title and labels count twice: a word there says more about a card than one in
        // its body. The parts are tokenized apart, which cuts exactly where the newlines
        // and spaces that once joined them did.
        let mut tokens = 0u32;
        for _ in 0..2 {
            tokens += self.add_text(doc.title);
            for l in doc.labels {
                tokens += self.add_text(l);
            }
        }
        tokens += self.add_text(doc.description);
        tokens += self.add_text(&doc.body);
        let class = usize::from(!doc.open);
        let local = self.classes[class].ords.len() as u32;
        for id in self.in_doc.drain(..) {
            let term = &mut self.terms[id as usize];
            let tf = std::mem::take(&mut term.in_doc);
            self.lists[id as usize][class].push(local, tf);
        }
        self.classes[class].ords.push(doc.ord);
        self.classes[class].norms.push(fieldnorm::id_of(tokens));
        if let Some(v) = &mut self.vectors {
            // The vector's text leads with what says most: title, labels, description,
            // then the body (the model reads the first kilobyte).
            let t = &mut self.vector_text;
            t.clear();
            t.push_str(doc.title);
            t.push('\n');
            for l in doc.labels {
                t.push_str(l);
                t.push(' ');
            }
            t.push('\n');
            t.push_str(doc.description);
            t.push('\n');
            t.push_str(&doc.body);
            v.add(doc.ord, t);
        }
        self.next_ord += 1;
        Ok(())
    }

    /// Counts the tokens of `text` into the card being added; returns how many.
    fn add_text(&mut self, text: &str) -> u32 {
        let mut tokens = Tokens::new(text);
        let mut n = 0;
        let Self {
            table,
            hasher,
            terms,
            arena,
            lists,
            in_doc,
            ..
        } = self;
        while let Some((token, _, _)) = tokens.next_token() {
            n += 1;
            let bytes = token.as_bytes();
            let hash = std::hash::BuildHasher::hash_one(&*hasher, bytes);
            let found = table.find(hash, |&id| {
                let t = &terms[id as usize];
                t.hash == hash && &arena[t.start as usize..(t.start + t.len) as usize] == bytes
            });
            let id = match found {
                Some(&id) => id,
                None => {
                    let id = terms.len() as u32;
                    terms.push(Term {
                        start: arena.len() as u32,
                        len: bytes.len() as u32,
                        in_doc: 0,
                        hash,
                    });
                    arena.extend_from_slice(bytes);
                    lists.push(Default::default());
                    table.insert_unique(hash, id, |&id| terms[id as usize].hash);
                    id
                }
            };
            let term = &mut terms[id as usize];
            if term.in_doc == 0 {
                in_doc.push(id);
            }
            term.in_doc += 1;
        }
        n
    }

    /// Writes the index into `dir`, which must exist and be empty. The caller makes it
    /// visible atomically (it is built inside a generation that is renamed into place).
    pub fn write(self, dir: &Path) -> Result<crate::BuildReport, SearchError> {
        let io = |source| SearchError::Io {
            dir: dir.display().to_string(),
            source,
        };
        let IndexBuilder {
            terms,
            arena,
            lists,
            classes,
            next_ord,
            vectors,
            ..
        } = self;
        if arena.len() > u32::MAX as usize {
            return Err(io(std::io::Error::other(
                "the terms of this workspace exceed 4 GiB",
            )));
        }
        let text = |id: u32| {
            let t = &terms[id as usize];
            &arena[t.start as usize..(t.start + t.len) as usize]
        };
        let mut order: Vec<u32> = (0..terms.len() as u32).collect();
        order.sort_unstable_by(|a, b| text(*a).cmp(text(*b)));
        let mut writer = file::Writer::create(dir, &classes).map_err(io)?;
        let (mut open, mut restricted) = Default::default();
        for id in order {
            let [o, r] = &lists[id as usize];
            o.decode(&mut open);
            r.decode(&mut restricted);
            writer.term(text(id), &open, &restricted).map_err(io)?;
        }
        writer.finish().map_err(io)?;
        // Vectors are an extra: failing to store them leaves a BM25-only index, never a
        // failed build.
        let vectors_error = vectors.and_then(|v| {
            v.write(dir, next_ord)
                .map_err(|e| e.to_string())
                .err()
                .inspect(|_| {
                    for f in [mop_embed::VECTORS_META, mop_embed::VECTORS_FILE] {
                        let _ = std::fs::remove_file(dir.join(f));
                    }
                })
        });
        file::write_meta(dir, u64::from(next_ord)).map_err(io)?;
        Ok(crate::BuildReport {
            docs: u64::from(next_ord),
            vectors_error,
        })
    }
}
