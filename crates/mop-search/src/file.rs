//! The index on disk (format 4): one file, `postings.mop`, and `mop-search.json` beside it
//! naming the format and the card count.
//!
//! Cards are numbered open ones first (`0..open`, in ordinal order), then restricted ones
//! (`open..docs`): every term has one posting list of open cards and one of restricted
//! cards, the latter numbered from 0 again. A term's frequency among the cards a task sees
//! is then its open list's length plus the visible restricted cards found in the other
//! list, and no search ever reads a restricted card it cannot see (see the crate comment).
//!
//! Layout, all integers little-endian:
//!
//! | section | contents |
//! |---|---|
//! | header | 16 × u64: magic, docs, open docs, terms, then where each section starts (and the lengths of postings and term bytes), and the file's length |
//! | ords | u32 per card (in the numbering above): its ordinal |
//! | norms | u8 per card: its length's field norm id ([`crate::fieldnorm`]) |
//! | postings | per term in term order: its open list, then its restricted list ([`crate::postings`]) |
//! | ends | u32 per term: where its bytes end in the term bytes |
//! | term bytes | every term's bytes, sorted bytewise, back to back |
//! | infos | per term: u32 start of its lists in postings, u32 bytes of its open list, u32 open cards, u32 restricted cards |
//!
//! [`IndexFile::open`] checks every section's place and size, the ordinals (each once),
//! the term ends and every term's list offsets before anything is searched, so a search
//! never indexes outside the file; list contents are checked as they are decoded.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::build::Class;
use crate::mmap::Map;
use crate::postings::{self, ListReader};

/// The index file's name.
pub(crate) const INDEX_FILE: &str = "postings.mop";
/// The file naming the format and the card count.
pub(crate) const META_FILE: &str = "mop-search.json";
/// This format. Formats 1 to 3 were tantivy indexes; a daemon rebuilds a generation that
/// holds one (see mopd's sync). It also names the analysis: a change of the tokenizer,
/// the field weights or the norms is a new format, since a daemon carries an earlier
/// generation's index (and its unchanged cards' postings) forward while the format is
/// the same.
pub const FORMAT: u32 = 4;

const MAGIC: u64 = u64::from_le_bytes(*b"mop-idx4");
const HEADER_BYTES: u64 = 16 * 8;
const INFO_BYTES: usize = 16;

/// What `mop-search.json` says.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub(crate) format: u32,
    pub(crate) docs: u64,
}

/// Writes `mop-search.json` for an index of `docs` cards.
pub(crate) fn write_meta(dir: &Path, docs: u64) -> io::Result<()> {
    let meta = serde_json::to_vec(&Meta {
        format: FORMAT,
        docs,
    })
    .expect("meta serializes");
    std::fs::write(dir.join(META_FILE), meta)
}

/// Reads `mop-search.json`.
pub(crate) fn read_meta(dir: &Path) -> io::Result<Result<Meta, String>> {
    let bytes = std::fs::read(dir.join(META_FILE))?;
    Ok(serde_json::from_slice(&bytes).map_err(|e| format!("{META_FILE} is unreadable: {e}")))
}

/// Documents and their frequencies, in document order.
#[derive(Debug, Default)]
pub(crate) struct Pairs {
    pub(crate) docs: Vec<u32>,
    pub(crate) tfs: Vec<u32>,
}

/// Writes an index file: the cards first, then each term's lists in term order.
pub(crate) struct Writer {
    out: BufWriter<File>,
    header: [u64; 16],
    postings_len: u64,
    ends: Vec<u8>,
    bytes: Vec<u8>,
    infos: Vec<u8>,
    buf: Vec<u8>,
}

impl Writer {
    /// Starts the file in `dir` with the cards of both classes.
    pub(crate) fn create(dir: &Path, classes: &[Class; 2]) -> io::Result<Writer> {
        let [open, restricted] = classes;
        let docs = (open.ords.len() + restricted.ords.len()) as u64;
        let mut out = BufWriter::with_capacity(256 * 1024, File::create(dir.join(INDEX_FILE))?);
        out.write_all(&[0; HEADER_BYTES as usize])?;
        let mut header = [0u64; 16];
        header[0] = MAGIC;
        header[1] = docs;
        header[2] = open.ords.len() as u64;
        header[4] = HEADER_BYTES;
        for ord in open.ords.iter().chain(&restricted.ords) {
            out.write_all(&ord.to_le_bytes())?;
        }
        header[5] = HEADER_BYTES + 4 * docs;
        out.write_all(&open.norms)?;
        out.write_all(&restricted.norms)?;
        header[6] = header[5] + docs;
        Ok(Writer {
            out,
            header,
            postings_len: 0,
            ends: Vec::new(),
            bytes: Vec::new(),
            infos: Vec::new(),
            buf: Vec::new(),
        })
    }

    /// Adds the next term (terms come in increasing bytewise order) with its lists.
    pub(crate) fn term(&mut self, text: &[u8], open: &Pairs, restricted: &Pairs) -> io::Result<()> {
        debug_assert!(self.last_term().is_none_or(|last| last < text));
        self.buf.clear();
        postings::encode(&open.docs, &open.tfs, &mut self.buf);
        let open_bytes = self.buf.len();
        postings::encode(&restricted.docs, &restricted.tfs, &mut self.buf);
        let too_large = || io::Error::other("the index's postings exceed 4 GiB");
        let start = u32::try_from(self.postings_len).map_err(|_| too_large())?;
        self.out.write_all(&self.buf)?;
        self.postings_len += self.buf.len() as u64;
        u32::try_from(self.postings_len).map_err(|_| too_large())?;
        self.bytes.extend_from_slice(text);
        let end = u32::try_from(self.bytes.len()).map_err(|_| too_large())?;
        self.ends.extend_from_slice(&end.to_le_bytes());
        for v in [
            start,
            open_bytes as u32,
            open.docs.len() as u32,
            restricted.docs.len() as u32,
        ] {
            self.infos.extend_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }

    fn last_term(&self) -> Option<&[u8]> {
        let n = self.ends.len() / 4;
        let end = |i: usize| u32::from_le_bytes(self.ends[4 * i..4 * i + 4].try_into().unwrap());
        match n {
            0 => None,
            1 => Some(&self.bytes[..end(0) as usize]),
            _ => Some(&self.bytes[end(n - 2) as usize..end(n - 1) as usize]),
        }
    }

    /// Writes the term dictionary and the header.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        let h = &mut self.header;
        h[3] = (self.ends.len() / 4) as u64;
        h[7] = self.postings_len;
        h[8] = h[6] + self.postings_len;
        h[9] = h[8] + self.ends.len() as u64;
        h[10] = self.bytes.len() as u64;
        h[11] = h[9] + h[10];
        h[12] = h[11] + self.infos.len() as u64;
        self.out.write_all(&self.ends)?;
        self.out.write_all(&self.bytes)?;
        self.out.write_all(&self.infos)?;
        let mut file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.seek(SeekFrom::Start(0))?;
        let header: Vec<u8> = self.header.iter().flat_map(|v| v.to_le_bytes()).collect();
        file.write_all(&header)
    }
}

/// Where one term's lists are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TermInfo {
    start: usize,
    open_bytes: usize,
    /// Open cards that hold it.
    pub(crate) open: u32,
    /// Restricted cards that hold it.
    pub(crate) restricted: u32,
}

/// An index file opened read-only (see the module comment).
pub(crate) struct IndexFile {
    map: Map,
    docs: u32,
    open: u32,
    terms: usize,
    ords: usize,
    norms: usize,
    postings: std::ops::Range<usize>,
    ends: usize,
    bytes: std::ops::Range<usize>,
    infos: usize,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl IndexFile {
    /// Opens and checks the index file in `dir`. `Ok(Err(problem))` when it is not a
    /// well-formed index.
    pub(crate) fn open(dir: &Path) -> io::Result<Result<IndexFile, String>> {
        let file = File::open(dir.join(INDEX_FILE))?;
        let map = Map::of(&file)?;
        Ok(IndexFile::check(map))
    }

    fn check(map: Map) -> Result<IndexFile, String> {
        let b = map.bytes();
        let bad = |what: &str| format!("{INDEX_FILE}: {what}");
        if (b.len() as u64) < HEADER_BYTES {
            return Err(bad("shorter than its header"));
        }
        let h: Vec<u64> = (0..16)
            .map(|i| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes")))
            .collect();
        if h[0] != MAGIC {
            return Err(bad("not a mop index (wrong magic number)"));
        }
        let (docs, open, terms) = (h[1], h[2], h[3]);
        let expected = [
            (4, HEADER_BYTES),
            (5, h[4].saturating_add(docs.saturating_mul(4))),
            (6, h[5].saturating_add(docs)),
            (8, h[6].saturating_add(h[7])),
            (9, h[8].saturating_add(terms.saturating_mul(4))),
            (11, h[9].saturating_add(h[10])),
            (
                12,
                h[11].saturating_add(terms.saturating_mul(INFO_BYTES as u64)),
            ),
        ];
        if let Some((i, _)) = expected.iter().find(|(i, v)| h[*i] != *v) {
            return Err(bad(&format!("header field {i} is out of place")));
        }
        if h[12] != b.len() as u64 || docs > u64::from(u32::MAX) || open > docs {
            return Err(bad("its length or card counts do not match its header"));
        }
        let f = IndexFile {
            docs: docs as u32,
            open: open as u32,
            terms: terms as usize,
            ords: h[4] as usize,
            norms: h[5] as usize,
            postings: h[6] as usize..h[8] as usize,
            ends: h[8] as usize,
            bytes: h[9] as usize..h[11] as usize,
            infos: h[11] as usize,
            map,
        };
        let mut seen = vec![false; f.docs as usize];
        for doc in 0..f.docs {
            let ord = f.ord(doc) as usize;
            match seen.get_mut(ord) {
                Some(s) if !*s => *s = true,
                _ => {
                    return Err(bad(&format!(
                        "card {doc} has ordinal {ord}, out of range or twice"
                    )));
                }
            }
        }
        let restricted = f.docs - f.open;
        let mut last_end = 0;
        for t in 0..f.terms {
            let end = le32(f.map.bytes(), f.ends + 4 * t) as usize;
            if end < last_end || end > f.bytes.len() {
                return Err(bad(&format!("term {t} ends out of order")));
            }
            last_end = end;
            let info = f.info(t);
            if info.start + info.open_bytes > f.postings.len()
                || info.open > f.open
                || info.restricted > restricted
            {
                return Err(bad(&format!("term {t}'s lists are out of place")));
            }
        }
        if last_end != f.bytes.len() {
            return Err(bad("the term bytes do not end with the last term"));
        }
        Ok(f)
    }

    /// Cards.
    pub(crate) fn docs(&self) -> u32 {
        self.docs
    }

    /// Open cards: numbered `0..open_docs()`.
    pub(crate) fn open_docs(&self) -> u32 {
        self.open
    }

    /// The ordinal of card `doc` (in the file's numbering, below [`IndexFile::docs`]).
    pub(crate) fn ord(&self, doc: u32) -> u32 {
        le32(self.map.bytes(), self.ords + 4 * doc as usize)
    }

    /// Every card's field norm id, in the file's numbering.
    pub(crate) fn norms(&self) -> &[u8] {
        &self.map.bytes()[self.norms..self.norms + self.docs as usize]
    }

    /// Terms: numbered `0..terms()` in bytewise order.
    pub(crate) fn terms(&self) -> usize {
        self.terms
    }

    /// Where term `t`'s lists are.
    pub(crate) fn info(&self, t: usize) -> TermInfo {
        let b = self.map.bytes();
        let at = self.infos + INFO_BYTES * t;
        TermInfo {
            start: le32(b, at) as usize,
            open_bytes: le32(b, at + 4) as usize,
            open: le32(b, at + 8),
            restricted: le32(b, at + 12),
        }
    }

    /// Term `t`'s bytes.
    pub(crate) fn term(&self, t: usize) -> &[u8] {
        let b = self.map.bytes();
        let end = le32(b, self.ends + 4 * t) as usize;
        let start = match t {
            0 => 0,
            _ => le32(b, self.ends + 4 * (t - 1)) as usize,
        };
        &b[self.bytes.start + start..self.bytes.start + end]
    }

    /// Where `term`'s lists are, if any card holds it.
    pub(crate) fn find(&self, term: &[u8]) -> Option<TermInfo> {
        let (mut lo, mut hi) = (0, self.terms);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.term(mid).cmp(term) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(self.info(mid)),
            }
        }
        None
    }

    /// A term's list of open cards, or of restricted cards (numbered from 0).
    pub(crate) fn list(&self, info: &TermInfo, restricted: bool) -> ListReader<'_> {
        let postings = &self.map.bytes()[self.postings.clone()];
        if restricted {
            ListReader::new(
                &postings[info.start + info.open_bytes..],
                info.restricted as usize,
            )
        } else {
            ListReader::new(&postings[info.start..], info.open as usize)
        }
    }
}
