//! Building a generation's index from the one before it: the cards whose indexed text is
//! unchanged keep their postings, re-numbered, and only the new or changed cards are
//! tokenized. The file written is the one [`crate::build_index`] would write for the same
//! cards, byte for byte, because it is made of the same parts in the same order:
//!
//! - cards keep their class (open or restricted) and their relative order, so the
//!   re-numbering of a kept card's documents is monotone and every list stays sorted;
//! - a kept card has the same text, so the same terms, frequencies and field norm;
//! - a term is written when some card of the new index holds it, lists are encoded by
//!   the same encoder, and the terms go in bytewise order.
//!
//! The cost is a decode and an encode of every posting (a few bytes each, bit-packed)
//! and the tokenizing of the changed cards alone, where a full build tokenizes every
//! card: at 10k cards the build took about 200 ms and this takes a tenth of it.

use std::path::Path;

use crate::build::{Class, IndexBuilder};
use crate::file::{self, IndexFile, Pairs};
use crate::postings::{BLOCK, Damaged, ListReader};
use crate::{BuildReport, FORMAT, IndexDoc, SearchError};

/// Where one card of the new index comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The card of this ordinal in the earlier index, whose indexed text (title,
    /// description, labels, body) and openness are those of the new card.
    Kept(u32),
    /// A card to index: new, or changed.
    New,
}

/// No document: a card of the earlier index that the new one does not keep.
const GONE: u32 = u32::MAX;

/// Writes into `dir` (existing, empty) the index of the cards `sources` describes, in
/// ordinal order: each kept card's postings from the index in `earlier`, and each new
/// card from `new` (its documents in ordinal order, one per [`Source::New`]). The result
/// is byte for byte what [`crate::build_index`] writes for the same cards. No card
/// vectors: with a model, build in full.
///
/// An earlier index that does not open, or does not decode, or `sources` that do not
/// fit it (an ordinal kept twice or out of range, a new card missing) is an error; the
/// caller then builds in full.
pub fn build_from<'a>(
    earlier: &Path,
    dir: &Path,
    sources: &[Source],
    new: impl IntoIterator<Item = IndexDoc<'a>>,
) -> Result<BuildReport, SearchError> {
    let invalid = |problem: String| SearchError::Invalid {
        dir: earlier.display().to_string(),
        problem,
    };
    let io = |source| SearchError::Io {
        dir: dir.display().to_string(),
        source,
    };
    match file::read_meta(earlier) {
        Ok(Ok(m)) if m.format == FORMAT => {}
        _ => return Err(invalid(format!("not an index of format {FORMAT}"))),
    }
    let old = IndexFile::open(earlier)
        .map_err(|source| SearchError::Io {
            dir: earlier.display().to_string(),
            source,
        })?
        .map_err(invalid)?;
    // The new cards, numbered 0.. in their own builder; `real[j]` is the ordinal of the
    // builder's card j.
    let mut delta = IndexBuilder::new(None);
    let mut real = Vec::new();
    for (j, doc) in new.into_iter().enumerate() {
        if sources.get(doc.ord as usize) != Some(&Source::New) || real.last() >= Some(&doc.ord) {
            return Err(invalid(format!(
                "card {} is not the next new card of the new index",
                doc.ord
            )));
        }
        real.push(doc.ord);
        delta.add(IndexDoc {
            ord: j as u32,
            ..doc
        })?;
    }
    let numbering = Numbering::new(&old, sources, &delta, &real).map_err(invalid)?;
    let mut writer = file::Writer::create(dir, &numbering.classes).map_err(io)?;
    let damaged = |_: Damaged| {
        invalid(format!(
            "a posting list in {} does not decode",
            file::INDEX_FILE
        ))
    };
    let mut lists = Lists::default();
    let delta_terms = delta.sorted_terms();
    let (mut t, mut d) = (0, 0);
    while t < old.terms() || d < delta_terms.len() {
        let from_old = (t < old.terms()).then(|| old.term(t));
        let from_delta = delta_terms.get(d).map(|&id| delta.term_text(id));
        let text = match (from_old, from_delta) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => unreachable!("the loop ends first"),
        };
        lists.clear();
        if from_old == Some(text) {
            let info = old.info(t);
            for (class, restricted) in [(0, false), (1, true)] {
                let base = if restricted { old.open_docs() } else { 0 };
                lists
                    .old_class(
                        class,
                        old.list(&info, restricted),
                        base,
                        &numbering.old_to_new,
                    )
                    .map_err(damaged)?;
            }
            t += 1;
        }
        if from_delta == Some(text) {
            for class in 0..2 {
                delta.pairs(delta_terms[d], class, &mut lists.delta);
                lists.merge(class, &numbering.delta_to_new[class]);
            }
            d += 1;
        }
        let [open, restricted] = &lists.out;
        if !open.docs.is_empty() || !restricted.docs.is_empty() {
            writer.term(text, open, restricted).map_err(io)?;
        }
    }
    writer.finish().map_err(io)?;
    let docs = sources.len() as u64;
    file::write_meta(dir, docs).map_err(io)?;
    Ok(BuildReport {
        docs,
        vectors_error: None,
    })
}

/// The new index's document numbers: where each earlier document and each new card go.
struct Numbering {
    /// The new index's cards of each class: ordinals and field norms.
    classes: [Class; 2],
    /// Each earlier document's new number within its class, or [`GONE`].
    old_to_new: Vec<u32>,
    /// Each new card's number within its class, by class and its number in the delta.
    delta_to_new: [Vec<u32>; 2],
}

impl Numbering {
    fn new(
        old: &IndexFile,
        sources: &[Source],
        delta: &IndexBuilder<'_>,
        real: &[u32],
    ) -> Result<Numbering, String> {
        let mut docs_of = vec![GONE; old.docs() as usize];
        for doc in 0..old.docs() {
            docs_of[old.ord(doc) as usize] = doc;
        }
        // Where each new card sits in the delta: (class, number), by ordinal.
        let mut in_delta = std::collections::HashMap::with_capacity(real.len());
        for (class, c) in delta.classes().iter().enumerate() {
            for (i, &j) in c.ords.iter().enumerate() {
                in_delta.insert(real[j as usize], (class, i, c.norms[i]));
            }
        }
        let mut n = Numbering {
            classes: Default::default(),
            old_to_new: vec![GONE; old.docs() as usize],
            delta_to_new: [
                vec![GONE; delta.classes()[0].ords.len()],
                vec![GONE; delta.classes()[1].ords.len()],
            ],
        };
        for (ord, source) in sources.iter().enumerate() {
            let ord = ord as u32;
            match *source {
                Source::Kept(was) => {
                    let doc = *docs_of
                        .get(was as usize)
                        .filter(|d| **d != GONE)
                        .ok_or_else(|| format!("card {was} is not in the earlier index"))?;
                    if n.old_to_new[doc as usize] != GONE {
                        return Err(format!("card {was} of the earlier index is kept twice"));
                    }
                    let class = usize::from(doc >= old.open_docs());
                    let c = &mut n.classes[class];
                    n.old_to_new[doc as usize] = c.ords.len() as u32;
                    c.ords.push(ord);
                    c.norms.push(old.norms()[doc as usize]);
                }
                Source::New => {
                    let &(class, i, norm) = in_delta
                        .get(&ord)
                        .ok_or_else(|| format!("new card {ord} was not given"))?;
                    let c = &mut n.classes[class];
                    n.delta_to_new[class][i] = c.ords.len() as u32;
                    c.ords.push(ord);
                    c.norms.push(norm);
                }
            }
        }
        Ok(n)
    }
}

/// One term's lists in the new numbering, as they are put together.
#[derive(Default)]
struct Lists {
    out: [Pairs; 2],
    /// The earlier index's part of a class, before the delta's is merged in.
    scratch: Pairs,
    /// The delta's pairs of one class (numbered in the delta).
    delta: Pairs,
}

impl Lists {
    fn clear(&mut self) {
        for p in &mut self.out {
            p.docs.clear();
            p.tfs.clear();
        }
    }

    /// The earlier index's pairs of one class (its documents numbered from `base` in the
    /// earlier file), re-numbered, the gone ones left out. Monotone, so still sorted.
    fn old_class(
        &mut self,
        class: usize,
        mut list: ListReader<'_>,
        base: u32,
        old_to_new: &[u32],
    ) -> Result<(), Damaged> {
        let out = &mut self.out[class];
        let (mut docs, mut tfs) = ([0u32; BLOCK], [0u32; BLOCK]);
        loop {
            let n = list.next_block(&mut docs, &mut tfs)?;
            if n == 0 {
                return Ok(());
            }
            for (&doc, &tf) in docs[..n].iter().zip(&tfs[..n]) {
                let new = *old_to_new.get((base + doc) as usize).ok_or(Damaged)?;
                if new != GONE {
                    out.docs.push(new);
                    out.tfs.push(tf);
                }
            }
        }
    }

    /// Merges the delta's pairs of one class ([`Lists::delta`]) into the class's list.
    fn merge(&mut self, class: usize, delta_to_new: &[u32]) {
        let Lists {
            out,
            scratch: s,
            delta: pairs,
        } = self;
        if pairs.docs.is_empty() {
            return;
        }
        let out = &mut out[class];
        std::mem::swap(out, s);
        out.docs.clear();
        out.tfs.clear();
        let mut i = 0;
        for (&doc, &tf) in pairs.docs.iter().zip(&pairs.tfs) {
            let new = delta_to_new[doc as usize];
            while i < s.docs.len() && s.docs[i] < new {
                out.docs.push(s.docs[i]);
                out.tfs.push(s.tfs[i]);
                i += 1;
            }
            out.docs.push(new);
            out.tfs.push(tf);
        }
        out.docs.extend_from_slice(&s.docs[i..]);
        out.tfs.extend_from_slice(&s.tfs[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A card: id (its place among the others), body, openness.
    type Card = (u32, String, bool);

    fn docs(cards: &[Card]) -> impl Iterator<Item = IndexDoc<'_>> {
        cards
            .iter()
            .enumerate()
            .map(|(ord, (_, body, open))| IndexDoc {
                ord: ord as u32,
                title: "card",
                description: "",
                labels: &[],
                body: body.as_str().into(),
                open: *open,
            })
    }

    fn file(dir: &Path) -> Vec<u8> {
        std::fs::read(dir.join(file::INDEX_FILE)).unwrap()
    }

    /// Edits of every kind (removed cards, changed text, changed openness, new cards
    /// between old ones and after the last, a term's last card gone, lists longer than a
    /// block) give the same file, byte for byte, as a build from scratch; sources that do
    /// not fit the earlier index are refused.
    #[test]
    fn an_index_built_from_the_last_one_is_the_one_built_from_scratch() {
        let body = |i: u32, v: u32| {
            format!(
                "w{} w{} w{} 共通 rare{i} v{v} common common {}",
                i % 3,
                i % 7,
                i % 300,
                "x".repeat((i % 5) as usize + 1)
            )
        };
        let before: Vec<Card> = (0..900u32)
            .map(|i| (i * 10, body(i, 0), i % 4 != 0))
            .collect();
        let mut after: Vec<Card> = Vec::new();
        for (k, c) in before.iter().enumerate() {
            let k = k as u32;
            match k % 37 {
                0 => continue,
                1 => after.push((c.0, body(k, 1), c.2)),
                2 => after.push((c.0, c.1.clone(), !c.2)),
                3 => {
                    after.push(c.clone());
                    after.push((
                        c.0 + 5,
                        format!("{} brandnew 新しい", body(k, 2)),
                        k.is_multiple_of(2),
                    ));
                }
                _ => after.push(c.clone()),
            }
        }
        after.push((100_000, "last card only here".into(), true));
        let (old_dir, new_dir, scratch) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        crate::build_index(old_dir.path(), docs(&before)).unwrap();
        crate::build_index(scratch.path(), docs(&after)).unwrap();
        let sources: Vec<Source> = after
            .iter()
            .map(|c| match before.iter().position(|b| b == c) {
                Some(was) => Source::Kept(was as u32),
                None => Source::New,
            })
            .collect();
        let new: Vec<IndexDoc<'_>> = docs(&after)
            .filter(|d| sources[d.ord as usize] == Source::New)
            .collect();
        assert!(new.len() > 50 && new.len() < after.len() / 4);
        let report = build_from(old_dir.path(), new_dir.path(), &sources, new.clone()).unwrap();
        assert_eq!(report.docs, after.len() as u64);
        assert!(
            file(new_dir.path()) == file(scratch.path()),
            "the files differ"
        );
        assert_eq!(
            std::fs::read(new_dir.path().join(file::META_FILE)).unwrap(),
            std::fs::read(scratch.path().join(file::META_FILE)).unwrap()
        );
        crate::SearchIndex::open(new_dir.path()).unwrap();
        // Sources that do not fit: an earlier card kept twice, one out of range, a new
        // card not given.
        let mut twice = sources.clone();
        let first_kept = twice
            .iter()
            .position(|s| matches!(s, Source::Kept(_)))
            .unwrap();
        let last_kept = twice
            .iter()
            .rposition(|s| matches!(s, Source::Kept(_)))
            .unwrap();
        twice[last_kept] = twice[first_kept];
        let mut beyond = sources.clone();
        beyond[first_kept] = Source::Kept(before.len() as u32);
        for bad in [twice, beyond] {
            let d = tempfile::tempdir().unwrap();
            assert!(build_from(old_dir.path(), d.path(), &bad, new.clone()).is_err());
        }
        let d = tempfile::tempdir().unwrap();
        assert!(build_from(old_dir.path(), d.path(), &sources, new[1..].to_vec()).is_err());
    }
}
