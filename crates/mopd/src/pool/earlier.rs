//! What a new generation takes from the one before it, so that a sync costs what changed
//! rather than what the workspace holds: the whole search index when no card's indexed
//! text moved (a counter-only change), or else the postings of every unchanged card
//! ([`mop_search::build_from`]), with only the new and changed cards tokenized.
//!
//! Either way the index is the one a build from scratch would write, byte for byte; the
//! tests compare them. Anything that does not fit (an earlier index of another format or
//! model, one that does not decode, more than a quarter of the cards changed) is built
//! from scratch instead.

use std::fs;

use mop_cards::{Manifest, ManifestEntry, card_body};
use mop_search::{IndexDoc, Source};

use super::{Pool, io_err, make_dir};
use crate::paths::GenerationPaths;

/// The generation a new one is built after, and where each of the new one's cards is in
/// it.
#[derive(Debug, Clone)]
pub struct Earlier {
    generation: String,
    /// Cards in the earlier generation.
    cards: usize,
    /// Per card of the new generation, in order.
    sources: Vec<Source>,
}

/// The document the index makes of a card: one place, so that what [`same_text`] compares
/// is what the index reads.
pub(super) fn index_doc<'a>(ord: u32, e: &'a ManifestEntry, raw: &'a [u8]) -> IndexDoc<'a> {
    IndexDoc {
        ord,
        title: &e.summary.title,
        description: e.summary.description.as_deref().unwrap_or(""),
        labels: &e.summary.labels,
        body: card_body(raw).unwrap_or("").into(),
        open: e.summary.is_open(),
    }
}

/// True when the index makes the same document of both entries (of one card id): the
/// same file (so the same body) and the same title, description, labels and openness.
fn same_text(a: &ManifestEntry, b: &ManifestEntry) -> bool {
    let (s, t) = (&a.summary, &b.summary);
    a.sha256 == b.sha256
        && s.title == t.title
        && s.description == t.description
        && s.labels == t.labels
        && s.is_open() == t.is_open()
}

impl Earlier {
    /// Matches the cards of `next` with those of the generation `generation`, whose
    /// manifest is `previous` (both sorted by id, as full manifests are).
    pub fn between(generation: &str, previous: &Manifest, next: &Manifest) -> Earlier {
        let mut old = previous.cards.iter().enumerate().peekable();
        let sources = next
            .cards
            .iter()
            .map(|e| {
                while old.next_if(|(_, o)| o.summary.id < e.summary.id).is_some() {}
                match old.next_if(|(_, o)| o.summary.id == e.summary.id) {
                    Some((i, o)) if same_text(o, e) => Source::Kept(i as u32),
                    _ => Source::New,
                }
            })
            .collect();
        Earlier {
            generation: generation.to_owned(),
            cards: previous.cards.len(),
            sources,
        }
    }

    /// True when the new generation's index is the earlier one's.
    pub fn unchanged(&self) -> bool {
        self.cards == self.sources.len()
            && (0..).zip(&self.sources).all(|(i, s)| *s == Source::Kept(i))
    }

    /// Cards of the new generation to tokenize.
    pub fn new_cards(&self) -> usize {
        self.sources.iter().filter(|s| **s == Source::New).count()
    }
}

impl Pool {
    /// Links the earlier generation's index into the generation at `paths` when it is one
    /// this build would have written: of this format, whole (it opens, every section in
    /// place), and with this model's card vectors (or, with no model, none). Index files
    /// are immutable (0440), so two generations can share them. False (and nothing left
    /// behind) when it cannot; the caller builds.
    pub(super) fn take_index(
        &self,
        earlier: &Earlier,
        paths: &GenerationPaths,
        model: Option<&mop_embed::Model>,
    ) -> bool {
        // Shared, so no collection removes the earlier generation while it is linked.
        let Ok(_no_collection) = self.lock(false) else {
            return false;
        };
        let old = self.paths().generation(&earlier.generation).index();
        let vectors_fit = match model {
            Some(m) => mop_embed::usable(&old, m),
            None => !old.join(mop_embed::VECTORS_META).exists(),
        };
        if !vectors_fit || mop_search::SearchIndex::open(&old).is_err() {
            return false;
        }
        let new = paths.index();
        let linked = make_dir(&new).and_then(|()| {
            for f in fs::read_dir(&old).map_err(io_err(&old))? {
                let f = f.map_err(io_err(&old))?;
                let to = new.join(f.file_name());
                fs::hard_link(f.path(), &to).map_err(io_err(&to))?;
            }
            Ok(())
        });
        if let Err(e) = linked {
            tracing::info!(workspace = %self.workspace(), error = %e, "could not take the earlier generation's index; building one");
            let _ = fs::remove_dir_all(&new);
            return false;
        }
        true
    }

    /// Writes the index of `manifest`'s cards into the generation at `paths` from the
    /// earlier generation's index and the new cards' objects (all in the pool by now).
    /// False (and nothing left behind) when it cannot; the caller builds from scratch.
    pub(super) fn merge_index(
        &self,
        earlier: &Earlier,
        paths: &GenerationPaths,
        manifest: &Manifest,
    ) -> bool {
        let old = self.paths().generation(&earlier.generation).index();
        let new = paths.index();
        let merged = (|| {
            let mut raws = Vec::new();
            for (ord, e) in manifest.cards.iter().enumerate() {
                if earlier.sources.get(ord) == Some(&Source::New) {
                    let raw = self.read_object(e)?;
                    if raw.len() as u64 != e.size {
                        return Err(super::PoolError::MissingObject(e.sha256.clone()));
                    }
                    raws.push((ord as u32, e, raw));
                }
            }
            make_dir(&new)?;
            let docs = raws.iter().map(|(ord, e, raw)| index_doc(*ord, e, raw));
            mop_search::build_from(&old, &new, &earlier.sources, docs)?;
            Ok::<_, super::PoolError>(())
        })();
        if let Err(e) = merged {
            tracing::info!(workspace = %self.workspace(), error = %e, "could not build the index from the earlier generation's; building it from scratch");
            let _ = fs::remove_dir_all(&new);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;

    use super::*;

    /// A card's entry, its object written into the pool.
    fn card(pool: &Pool, i: u32, body: &str, user: bool) -> ManifestEntry {
        let scope = if user { "scope:\n  user_id: ana\n" } else { "" };
        let raw = format!(
            "---\nid: 00000000-0000-4000-8000-{i:012}\ntype: fact\ntitle: Card {i}\n{scope}---\n{body}\n"
        );
        let card = mop_cards::parse_card(raw.as_bytes()).unwrap();
        let e = ManifestEntry::for_card(&card, raw.as_bytes());
        if !pool.has_object(&e.sha256, e.size) {
            let mut w = pool.new_object(&e.sha256, e.size).unwrap();
            w.write(raw.as_bytes()).unwrap();
            w.finish().unwrap();
        }
        e
    }

    fn index_file(pool: &Pool, generation: &str) -> std::path::PathBuf {
        pool.paths()
            .generation(generation)
            .index()
            .join("postings.mop")
    }

    /// Builds `manifest` after `earlier` the way a sync does.
    fn after(pool: &Pool, earlier: (&str, &Manifest), manifest: &Manifest) -> (String, Earlier) {
        let e = Earlier::between(earlier.0, earlier.1, manifest);
        let (building, feed) = pool
            .start_generation(
                Arc::new(manifest.clone()),
                Vec::new(),
                Some(e.clone()),
                None,
            )
            .unwrap();
        drop(feed);
        (building.finish().unwrap().0.name().to_owned(), e)
    }

    /// A counter-only change takes the earlier index as it is (the same files); edits of
    /// every kind give the index a build from scratch gives, byte for byte, made from the
    /// earlier one.
    #[test]
    fn a_generation_takes_what_it_can_of_the_earlier_index() {
        let dir = tempfile::tempdir().unwrap();
        let n = mop_search::PARALLEL_MIN as u32 + 11;
        let (pool, first) = super::super::tests::pool_with_cards(dir.path(), n);
        let one = pool
            .build_generation(Arc::new(first.clone()), None)
            .unwrap();

        let mut counted = first.clone();
        counted.revision = 2;
        for e in counted.cards.iter_mut().step_by(7) {
            e.occurrence += 3;
        }
        let (two, e) = after(&pool, (&one, &first), &counted);
        assert!(e.unchanged());
        let ino = |g: &str| fs::metadata(index_file(&pool, g)).unwrap().ino();
        assert_eq!(ino(&one), ino(&two), "the index is shared, not rebuilt");

        // Removed cards, changed bodies, a card that became restricted, new cards.
        let mut edited = counted.clone();
        edited.revision = 3;
        edited.cards.clear();
        for (i, e) in (0..).zip(&counted.cards) {
            match i % 53 {
                0 => {}
                1 => edited
                    .cards
                    .push(card(&pool, i, &format!("Body {i}, edited."), false)),
                2 => edited
                    .cards
                    .push(card(&pool, i, &format!("Body {i}."), true)),
                _ => edited.cards.push(e.clone()),
            }
        }
        for i in n..n + 20 {
            edited
                .cards
                .push(card(&pool, i, &format!("New card {i} 新しい"), i % 2 == 0));
        }
        let e = Earlier::between(&two, &counted, &edited);
        assert!(!e.unchanged());
        assert!(e.new_cards() > 60 && e.new_cards() * 4 < edited.cards.len());
        let scratch = pool
            .build_generation(Arc::new(edited.clone()), None)
            .unwrap();
        // The way a sync builds, then the merge itself.
        let (three, _) = after(&pool, (&two, &counted), &edited);
        assert_ne!(ino(&three), ino(&two));
        assert!(
            fs::read(index_file(&pool, &three)).unwrap()
                == fs::read(index_file(&pool, &scratch)).unwrap(),
            "the index made from the earlier one differs from one built from scratch"
        );
        let gen_paths = pool.paths().generation("merge-check");
        make_dir(gen_paths.dir()).unwrap();
        assert!(pool.merge_index(&e, &gen_paths, &edited));
        assert!(
            fs::read(gen_paths.index().join("postings.mop")).unwrap()
                == fs::read(index_file(&pool, &scratch)).unwrap()
        );
        // A counter-only change whose fetch fails (an object the pool lacks never comes)
        // is not built, though its index could be taken whole.
        let mut lacking = edited.clone();
        lacking.revision = 4;
        let absent = card(&pool, 0, "Body 0, fetched again.", false);
        fs::remove_file(pool.object_path(&absent.sha256)).unwrap();
        let (building, feed) = pool
            .start_generation(
                Arc::new(lacking.clone()),
                vec![absent.sha256.clone()],
                Some(Earlier::between(&three, &edited, &lacking)),
                None,
            )
            .unwrap();
        let name = building.name().to_owned();
        drop(feed);
        assert!(matches!(
            building.finish(),
            Err(super::super::PoolError::MissingObject(_))
        ));
        assert!(!pool.paths().generation(&name).dir().exists());
        // A damaged earlier index is not taken: the next one is built from scratch.
        let postings = index_file(&pool, &three);
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&postings, fs::Permissions::from_mode(0o640)).unwrap();
        let whole = fs::read(&postings).unwrap();
        fs::write(&postings, &whole[..whole.len() / 2]).unwrap();
        let mut recounted = edited.clone();
        recounted.revision = 5;
        let (five, e) = after(&pool, (&three, &edited), &recounted);
        assert!(e.unchanged());
        assert_ne!(ino(&five), ino(&three));
        assert!(
            fs::read(index_file(&pool, &five)).unwrap()
                == fs::read(index_file(&pool, &scratch)).unwrap()
        );
        // An earlier index that is gone: no merge, nothing left behind.
        fs::remove_dir_all(pool.paths().generation(&two).index()).unwrap();
        let gone = pool.paths().generation("merge-gone");
        make_dir(gone.dir()).unwrap();
        assert!(!pool.merge_index(&e, &gone, &edited));
        assert!(!gone.index().exists());
    }
}
