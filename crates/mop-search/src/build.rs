//! Building an index in memory, one card at a time, then writing it in one pass.
//!
//! Every token of a card is looked up once in a hash table of the terms seen so far, and
//! its count in the card goes up; when the card ends, each term it holds appends (card,
//! count) to that term's list as two variable-length integers. Nothing else happens per
//! token, which is what makes this several times cheaper than a general-purpose search
//! engine's writer. A token of up to 16 bytes (nearly all of them) is its own key, the
//! bytes packed into one integer, so a lookup compares integers; longer ones are looked
//! up by their bytes. Open and restricted cards keep separate lists and are numbered
//! separately (see [`crate::file`]).
//!
//! Cards come in ordinal order, so each list is already in document order: writing the
//! file sorts the terms and re-encodes each list into blocks, and sorts nothing else.

use std::path::Path;

use hashbrown::{HashMap, HashTable};
use mop_embed::{Model, VectorsBuilder};

use crate::{IndexDoc, SearchError, fieldnorm, file, postings, tokenize};

/// A term seen so far: where its bytes are in the arena.
struct Term {
    start: u32,
    len: u32,
}

/// The terms seen so far, by id.
#[derive(Default)]
struct Terms {
    terms: Vec<Term>,
    /// Every term's bytes, back to back.
    arena: Vec<u8>,
    /// How often the card being added holds each term.
    in_card: Vec<u32>,
    /// Each term's lists of open and of restricted cards.
    lists: Vec<[MemList; 2]>,
}

impl Terms {
    fn add(&mut self, bytes: &[u8]) -> u32 {
        let id = self.terms.len() as u32;
        self.terms.push(Term {
            start: self.arena.len() as u32,
            len: bytes.len() as u32,
        });
        self.arena.extend_from_slice(bytes);
        self.in_card.push(0);
        self.lists.push(Default::default());
        id
    }

    fn text(&self, id: u32) -> &[u8] {
        let t = &self.terms[id as usize];
        &self.arena[t.start as usize..(t.start + t.len) as usize]
    }
}

/// Tokens of at most this many bytes are keys of their own ([`short_key`]).
const SHORT: usize = 16;

/// A token of at most [`SHORT`] bytes as one integer: its bytes, then zeros. Tokens hold
/// no zero byte (the tokenizer cuts words there), so no two tokens share a key.
fn short_key(bytes: &[u8]) -> u128 {
    let mut b = [0u8; SHORT];
    b[..bytes.len()].copy_from_slice(bytes);
    u128::from_le_bytes(b)
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

    /// Appends `later`'s pairs, its documents numbered from `offset` on (all after this
    /// list's): the first pair is re-encoded against this list's last document, the rest
    /// (gaps between its own documents) copied as they are.
    fn append(&mut self, later: &MemList, offset: u32) {
        if later.len == 0 {
            return;
        }
        let mut at = 0;
        let next = |at: &mut usize| postings::get_vint(&later.bytes, at).expect("written above");
        let v = next(&mut at);
        let tf = if v & 1 == 1 { 1 } else { next(&mut at) };
        let (len, last) = (self.len, self.last);
        self.push(offset + (v >> 1), tf);
        self.bytes.extend_from_slice(&later.bytes[at..]);
        self.len = len + later.len;
        self.last = offset + later.last;
        debug_assert!(len == 0 || offset + (v >> 1) > last);
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

/// Every term seen so far and how to find its id.
#[derive(Default)]
struct Dictionary {
    /// Term ids of tokens of at most 8 bytes (most of them), by [`short_key`]: a table
    /// of 16-byte entries, half the size of one with 16-byte keys, so more of it stays
    /// in the cache.
    tiny: HashMap<u64, u32, foldhash::fast::RandomState>,
    /// Term ids of tokens of 9 to 16 bytes, by [`short_key`].
    short: HashMap<u128, u32, foldhash::fast::RandomState>,
    /// Term ids of longer tokens, by their bytes' hash (with the hash, for growing).
    long: HashTable<(u64, u32)>,
    hasher: foldhash::fast::RandomState,
    terms: Terms,
}

impl Dictionary {
    /// The id of the term `bytes`, a new one if it is new.
    #[inline]
    fn id(&mut self, bytes: &[u8]) -> u32 {
        let terms = &mut self.terms;
        if bytes.len() <= 8 {
            *self
                .tiny
                .entry(short_key(bytes) as u64)
                .or_insert_with(|| terms.add(bytes))
        } else if bytes.len() <= SHORT {
            *self
                .short
                .entry(short_key(bytes))
                .or_insert_with(|| terms.add(bytes))
        } else {
            let hash = std::hash::BuildHasher::hash_one(&self.hasher, bytes);
            match self
                .long
                .find(hash, |&(h, id)| h == hash && terms.text(id) == bytes)
            {
                Some(&(_, id)) => id,
                None => {
                    let id = terms.add(bytes);
                    self.long.insert_unique(hash, (hash, id), |&(h, _)| h);
                    id
                }
            }
        }
    }
}

/// An index being built: cards go in with [`IndexBuilder::add`], in ordinal order, and
/// [`IndexBuilder::write`] stores it.
pub struct IndexBuilder<'m> {
    // Its hash maps have per-process seeds: card text is written by agents, and a fixed
    // seed would let a card of crafted words make every lookup collide.
    dict: Dictionary,
    /// The terms of the card being added, each once.
    in_doc: Vec<u32>,
    /// Open cards (0) and restricted ones (1).
    classes: [Class; 2],
    /// The ordinal of its first card (0 unless it is the later part of an index).
    first: u32,
    next_ord: u32,
    vectors: Option<VectorsBuilder<'m>>,
    vector_text: String,
    /// The tokenizer's buffer.
    buf: String,
}

impl std::fmt::Debug for IndexBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexBuilder")
            .field("cards", &self.next_ord)
            .field("terms", &self.dict.terms.terms.len())
            .finish()
    }
}

impl<'m> IndexBuilder<'m> {
    /// An empty index; with a model, each card's vector is computed as it is added and
    /// stored with the index.
    pub fn new(model: Option<&'m Model>) -> IndexBuilder<'m> {
        IndexBuilder {
            dict: Dictionary::default(),
            in_doc: Vec::new(),
            classes: Default::default(),
            first: 0,
            next_ord: 0,
            vectors: model.map(VectorsBuilder::new),
            vector_text: String::new(),
            buf: String::new(),
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
        let mut tokens = self.add_text(doc.title, 2);
        for l in doc.labels {
            tokens += self.add_text(l, 2);
        }
        tokens += self.add_text(doc.description, 1);
        tokens += self.add_text(&doc.body, 1);
        let class = usize::from(!doc.open);
        let local = self.classes[class].ords.len() as u32;
        let terms = &mut self.dict.terms;
        for id in self.in_doc.drain(..) {
            let tf = std::mem::take(&mut terms.in_card[id as usize]);
            terms.lists[id as usize][class].push(local, tf);
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

    /// Counts the tokens of `text` into the card being added, each `weight` times;
    /// returns how many that makes.
    fn add_text(&mut self, text: &str, weight: u32) -> u32 {
        let mut n = 0;
        let Self {
            dict, in_doc, buf, ..
        } = self;
        tokenize::scan(text, buf, |bytes, _, _| {
            n += weight;
            let id = dict.id(bytes);
            let count = &mut dict.terms.in_card[id as usize];
            if *count == 0 {
                in_doc.push(id);
            }
            *count += weight;
        });
        n
    }

    /// An empty index whose first card will have ordinal `first`: the later part of an
    /// index built in parts (see [`IndexBuilder::append`]).
    pub fn starting_at(first: u32, model: Option<&'m Model>) -> IndexBuilder<'m> {
        IndexBuilder {
            first,
            next_ord: first,
            ..IndexBuilder::new(model)
        }
    }

    /// Appends `later`, built from the cards that follow this one's (it was made with
    /// [`IndexBuilder::starting_at`] this one's length). Each of its lists is added to the
    /// same term's lists here: its first pair re-based, the rest copied as they are.
    pub fn append(&mut self, later: IndexBuilder<'m>) -> Result<(), SearchError> {
        if later.first != self.next_ord {
            return Err(SearchError::Order {
                expected: self.next_ord,
                got: later.first,
            });
        }
        let offsets = self.classes.each_ref().map(|c| c.ords.len() as u32);
        let theirs = &later.dict.terms;
        for id in 0..theirs.terms.len() as u32 {
            let mine = self.dict.id(theirs.text(id));
            for (class, offset) in offsets.into_iter().enumerate() {
                self.dict.terms.lists[mine as usize][class]
                    .append(&theirs.lists[id as usize][class], offset);
            }
        }
        for (mine, theirs) in self.classes.iter_mut().zip(later.classes) {
            mine.ords.extend(theirs.ords);
            mine.norms.extend(theirs.norms);
        }
        if let (Some(mine), Some(theirs)) = (&mut self.vectors, later.vectors) {
            mine.append(theirs, self.next_ord);
        }
        self.next_ord = later.next_ord;
        Ok(())
    }

    /// The cards added so far, by class (open, restricted).
    pub(crate) fn classes(&self) -> &[Class; 2] {
        &self.classes
    }

    /// Every term's id, the terms in bytewise order.
    pub(crate) fn sorted_terms(&self) -> Vec<u32> {
        let terms = &self.dict.terms;
        let mut order: Vec<u32> = (0..terms.terms.len() as u32).collect();
        order.sort_unstable_by(|a, b| terms.text(*a).cmp(terms.text(*b)));
        order
    }

    /// A term's bytes.
    pub(crate) fn term_text(&self, id: u32) -> &[u8] {
        self.dict.terms.text(id)
    }

    /// A term's pairs among the cards of one class (0 open, 1 restricted), into `into`.
    pub(crate) fn pairs(&self, id: u32, class: usize, into: &mut file::Pairs) {
        self.dict.terms.lists[id as usize][class].decode(into);
    }

    /// Writes the index into `dir`, which must exist and be empty. The caller makes it
    /// visible atomically (it is built inside a generation that is renamed into place).
    pub fn write(self, dir: &Path) -> Result<crate::BuildReport, SearchError> {
        let io = |source| SearchError::Io {
            dir: dir.display().to_string(),
            source,
        };
        let order = self.sorted_terms();
        let IndexBuilder {
            dict,
            classes,
            next_ord,
            vectors,
            ..
        } = self;
        let terms = &dict.terms;
        if terms.arena.len() > u32::MAX as usize {
            return Err(io(std::io::Error::other(
                "the terms of this workspace exceed 4 GiB",
            )));
        }
        let mut writer = file::Writer::create(dir, &classes).map_err(io)?;
        let (mut open, mut restricted) = Default::default();
        for id in order {
            let [o, r] = &terms.lists[id as usize];
            o.decode(&mut open);
            r.decode(&mut restricted);
            writer
                .term(terms.text(id), &open, &restricted)
                .map_err(io)?;
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
