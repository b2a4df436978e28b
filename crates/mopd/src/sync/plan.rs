//! Sync planning: from the manifest the server sent and the manifest the pool holds, what
//! to do — nothing, or fetch these objects and publish this full manifest — or why the
//! answer is refused. Pure: no I/O, so every rule is unit-tested here.
//!
//! The rules (DESIGN.md "Cache pool rules"): the epoch must be a UUID (it names a
//! directory); every entry must be well-formed; a delta must start at the held version;
//! no card twice; within one epoch a lower revision is a rollback and refused, the same
//! revision is nothing new; a new epoch is accepted (the caller warns).

use std::collections::BTreeSet;

use mop_cards::CardId;
use mop_proto::sync::{Manifest, Version};

/// What a sync should do.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// The version is already held.
    Unchanged,
    /// Fetch `missing`, then build and publish `manifest` (full, cards sorted by id).
    Publish {
        /// The full manifest.
        manifest: Manifest,
        /// Objects the pool lacks, each once: (sha256, size).
        missing: Vec<(String, u64)>,
        /// The epoch this replaces, when the server's epoch changed.
        replaces_epoch: Option<String>,
    },
}

/// What is known of the held generation's objects in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// All there: every one was found when a sync planned against it (or fetched), and
    /// nothing has been quarantined, repaired or recreated since.
    Whole,
    /// Not known (the daemon started, the scrub found damage, a repair ran, the pool's
    /// layout was recreated): every card's object is looked up.
    Unknown,
}

/// Why a manifest is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// A lower revision than the one held, within the same epoch.
    pub rollback: bool,
    /// What is wrong.
    pub message: String,
}

fn bad(message: String) -> Refused {
    Refused {
        rollback: false,
        message,
    }
}

/// Plans a sync of `incoming` over `held` (the own part of the current generation's
/// manifest: see [`Manifest::own`]). With `held_whole`, the pool is known to hold every
/// object of `held`, and only the objects a delta names are looked up (see [`Checked`]).
pub fn plan(
    incoming: Manifest,
    held: Option<&Manifest>,
    held_whole: Checked,
    has_object: impl Fn(&str, u64) -> bool,
) -> Result<Plan, Refused> {
    if !mop_cards::is_epoch(&incoming.epoch) {
        return Err(bad(format!(
            "manifest refused: its epoch {:?} is not a UUID",
            incoming.epoch.chars().take(80).collect::<String>()
        )));
    }
    for e in &incoming.cards {
        e.validate()
            .map_err(|err| bad(format!("manifest entry refused: {err}")))?;
    }
    // Only this daemon composes a workspace with those it inherits; a server (or a proxy)
    // that claims a card came from elsewhere is answering some other question.
    if incoming.is_composed() {
        return Err(bad(
            "manifest refused: it claims inherited cards, which only a daemon's composition has"
                .into(),
        ));
    }
    // The objects a delta names: with the held generation's objects all in the pool,
    // only these can be missing, and the pool is asked about these alone (every entry of
    // the delta is in the full manifest, so these are all the candidates). In card order,
    // each at its first card, as [`missing_objects`] gives them: the build takes arriving
    // objects in that order.
    let named: Option<Vec<(CardId, String, u64)>> = incoming
        .since
        .filter(|_| held_whole == Checked::Whole)
        .map(|_| {
            let mut named: Vec<_> = incoming
                .cards
                .iter()
                .map(|c| (c.summary.id, c.sha256.clone(), c.size))
                .collect();
            named.sort_by_key(|(id, ..)| *id);
            named
        });
    let mut full = match (incoming.since, held) {
        (None, _) => incoming,
        (Some(since), Some(cur)) if cur.epoch == incoming.epoch && cur.revision == since => {
            apply_delta(cur, incoming)
        }
        (Some(since), _) => {
            return Err(bad(format!(
                "delta from revision {since} does not apply to the held version {}",
                held.map_or_else(|| "(none)".into(), |m| Version::of(m).to_string())
            )));
        }
    };
    full.cards.sort_by_key(|c| c.summary.id);
    if let Some(w) = full
        .cards
        .windows(2)
        .find(|w| w[0].summary.id == w[1].summary.id)
    {
        return Err(bad(format!(
            "manifest lists card {} twice",
            w[0].summary.id
        )));
    }
    let mut replaces_epoch = None;
    if let Some(cur) = held {
        if cur.epoch == full.epoch {
            if full.revision < cur.revision {
                return Err(Refused {
                    rollback: true,
                    message: format!(
                        "refused revision {} of epoch {}: revision {} is already held (rollback)",
                        full.revision, full.epoch, cur.revision
                    ),
                });
            }
            if full.revision == cur.revision {
                return Ok(Plan::Unchanged);
            }
        } else {
            replaces_epoch = Some(cur.epoch.clone());
        }
    }
    let missing = match &named {
        Some(named) => missing_objects(
            named.iter().map(|(_, sha, size)| (sha.as_str(), *size)),
            has_object,
        ),
        None => missing_objects(objects_of(&full), has_object),
    };
    Ok(Plan::Publish {
        manifest: full,
        missing,
        replaces_epoch,
    })
}

/// Of `objects` (sha256, size), those the pool lacks, each once, in the order given.
pub fn missing_objects<'a>(
    objects: impl IntoIterator<Item = (&'a str, u64)>,
    has_object: impl Fn(&str, u64) -> bool,
) -> Vec<(String, u64)> {
    let mut seen = BTreeSet::new();
    objects
        .into_iter()
        .filter(|(sha, size)| seen.insert(*sha) && !has_object(sha, *size))
        .map(|(sha, size)| (sha.to_owned(), size))
        .collect()
}

/// A manifest's objects (sha256, size), in card order.
pub fn objects_of(manifest: &Manifest) -> impl Iterator<Item = (&str, u64)> {
    manifest.cards.iter().map(|e| (e.sha256.as_str(), e.size))
}

/// Applies a delta to the manifest it was computed from (its cards sorted by id, as a
/// generation's are): one pass over both, so the cost is a copy of each kept entry.
fn apply_delta(base: &Manifest, delta: Manifest) -> Manifest {
    let removed: std::collections::HashSet<_> = delta.removed.iter().collect();
    let mut changed = delta.cards;
    changed.sort_by_key(|c| c.summary.id);
    let mut cards = Vec::with_capacity(base.cards.len() + changed.len());
    let mut changed = changed.into_iter().peekable();
    for c in &base.cards {
        let id = c.summary.id;
        while let Some(new) = changed.next_if(|n| n.summary.id < id) {
            cards.push(new);
        }
        match changed.next_if(|n| n.summary.id == id) {
            Some(new) => cards.push(new),
            None if removed.contains(&id) => {}
            None => cards.push(c.clone()),
        }
    }
    cards.extend(changed);
    Manifest {
        epoch: delta.epoch,
        revision: delta.revision,
        generated_at: delta.generated_at,
        since: None,
        cards,
        removed: Vec::new(),
        inherited: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mop_cards::parse_card;
    use mop_proto::sync::ManifestEntry;

    const EPOCH: &str = "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e";

    fn entry(n: u32, body: &str) -> ManifestEntry {
        let raw = format!(
            "---\nid: 00000000-0000-4000-8000-{n:012}\ntype: fact\ntitle: Card {n}\n---\n{body}\n"
        );
        ManifestEntry::for_card(&parse_card(raw.as_bytes()).unwrap(), raw.as_bytes())
    }

    fn manifest(epoch: &str, revision: u64, cards: Vec<ManifestEntry>) -> Manifest {
        Manifest {
            epoch: epoch.into(),
            revision,
            generated_at: "2026-11-29T00:00:00Z".parse().unwrap(),
            since: None,
            cards,
            removed: vec![],
            inherited: Vec::new(),
        }
    }

    fn nothing_held(_: &str, _: u64) -> bool {
        false
    }

    #[test]
    fn a_first_manifest_fetches_each_object_once() {
        let m = manifest(EPOCH, 1, vec![entry(2, "b"), entry(1, "a"), entry(3, "a")]);
        let Plan::Publish {
            manifest,
            missing,
            replaces_epoch,
        } = plan(m, None, Checked::Unknown, nothing_held).unwrap()
        else {
            panic!("publish expected");
        };
        let ids: Vec<String> = manifest
            .cards
            .iter()
            .map(|c| c.summary.title.clone())
            .collect();
        assert_eq!(ids, ["Card 1", "Card 2", "Card 3"], "sorted by id");
        assert_eq!(missing.len(), 3);
        assert_eq!(replaces_epoch, None);
        let held: BTreeSet<String> = [manifest.cards[0].sha256.clone()].into();
        let again = missing_objects(objects_of(&manifest), |s, _| held.contains(s));
        assert_eq!(again.len(), 2);
    }

    #[test]
    fn deltas_apply_to_the_held_version_only() {
        let held = manifest(EPOCH, 5, vec![entry(1, "a"), entry(2, "b")]);
        let mut delta = manifest(EPOCH, 6, vec![entry(3, "c"), entry(2, "b2")]);
        delta.since = Some(5);
        delta.removed = vec![entry(1, "a").summary.id];
        let Plan::Publish { manifest, .. } =
            plan(delta.clone(), Some(&held), Checked::Unknown, nothing_held).unwrap()
        else {
            panic!("publish expected");
        };
        let bodies: Vec<&str> = manifest
            .cards
            .iter()
            .map(|c| c.summary.title.as_str())
            .collect();
        assert_eq!(bodies, ["Card 2", "Card 3"]);
        assert_eq!(manifest.since, None);
        // New cards before, between and after the held ones, changed and removed ones.
        let held9 = self::manifest(EPOCH, 5, [1, 3, 5, 7, 9].map(|n| entry(n, "x")).to_vec());
        let mut d9 = self::manifest(EPOCH, 6, [10, 5, 0, 6].map(|n| entry(n, "y")).to_vec());
        d9.since = Some(5);
        d9.removed = [3, 9].map(|n| entry(n, "x").summary.id).to_vec();
        let Plan::Publish { manifest: m9, .. } =
            plan(d9, Some(&held9), Checked::Unknown, nothing_held).unwrap()
        else {
            panic!("publish expected");
        };
        let got: Vec<(String, String)> = m9
            .cards
            .iter()
            .map(|c| (c.summary.title.clone(), c.sha256.clone()))
            .collect();
        let want: Vec<(String, String)> =
            [(0, "y"), (1, "x"), (5, "y"), (6, "y"), (7, "x"), (10, "y")]
                .map(|(n, b)| (format!("Card {n}"), entry(n, b).sha256))
                .to_vec();
        assert_eq!(got, want);
        delta.since = Some(4);
        let err = plan(delta, Some(&held), Checked::Unknown, nothing_held).unwrap_err();
        assert!(err.message.contains("does not apply"), "{err:?}");
    }

    /// With the held generation's objects known to be in the pool, only those a delta
    /// names are looked up; otherwise every card's.
    #[test]
    fn a_delta_over_a_whole_pool_looks_up_its_own_objects_only() {
        let held = manifest(EPOCH, 5, vec![entry(1, "a"), entry(2, "b"), entry(3, "c")]);
        let mut delta = manifest(EPOCH, 6, vec![entry(4, "d")]);
        delta.since = Some(5);
        for (checked, asked) in [(Checked::Whole, 1), (Checked::Unknown, 4)] {
            let count = std::cell::Cell::new(0);
            let have = |_: &str, _: u64| {
                count.set(count.get() + 1);
                false
            };
            let Plan::Publish { missing, .. } =
                plan(delta.clone(), Some(&held), checked, have).unwrap()
            else {
                panic!("publish expected");
            };
            assert_eq!(count.get(), asked, "{checked:?}");
            assert_eq!(missing.len(), asked, "{checked:?}");
        }
    }

    /// The build takes arriving objects in the order of the first card naming each: the
    /// delta's own objects come in card order too, whatever order their hashes sort in.
    #[test]
    fn a_deltas_missing_objects_come_in_card_order() {
        let held = manifest(
            EPOCH,
            5,
            (1..=6).map(|n| entry(n, "old")).collect::<Vec<_>>(),
        );
        let edited: Vec<ManifestEntry> = (1..=6).map(|n| entry(n, "new")).collect();
        let mut delta = manifest(EPOCH, 6, edited.iter().rev().cloned().collect());
        delta.since = Some(5);
        for checked in [Checked::Whole, Checked::Unknown] {
            let have = |sha: &str, _: u64| held.cards.iter().any(|c| c.sha256 == sha);
            let Plan::Publish { missing, .. } =
                plan(delta.clone(), Some(&held), checked, have).unwrap()
            else {
                panic!("publish expected");
            };
            let want: Vec<(String, u64)> =
                edited.iter().map(|c| (c.sha256.clone(), c.size)).collect();
            assert_eq!(missing, want, "{checked:?}");
        }
        // The hashes do not sort in card order, or this would prove nothing.
        let mut sorted: Vec<&str> = edited.iter().map(|c| c.sha256.as_str()).collect();
        sorted.sort_unstable();
        assert_ne!(
            sorted,
            edited.iter().map(|c| c.sha256.as_str()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn rollbacks_are_refused_and_new_epochs_accepted() {
        let held = manifest(EPOCH, 5, vec![entry(1, "a")]);
        let err = plan(
            manifest(EPOCH, 4, vec![]),
            Some(&held),
            Checked::Unknown,
            nothing_held,
        )
        .unwrap_err();
        assert!(err.rollback && err.message.contains("rollback"), "{err:?}");
        assert_eq!(
            plan(
                manifest(EPOCH, 5, vec![entry(1, "a")]),
                Some(&held),
                Checked::Unknown,
                nothing_held
            )
            .unwrap(),
            Plan::Unchanged
        );
        let other = "1b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e";
        let Plan::Publish { replaces_epoch, .. } = plan(
            manifest(other, 1, vec![]),
            Some(&held),
            Checked::Unknown,
            nothing_held,
        )
        .unwrap() else {
            panic!("a new epoch publishes");
        };
        assert_eq!(replaces_epoch.as_deref(), Some(EPOCH));
    }

    #[test]
    fn malformed_answers_are_refused() {
        let err = plan(
            manifest("../../x", 1, vec![]),
            None,
            Checked::Unknown,
            nothing_held,
        )
        .unwrap_err();
        assert!(err.message.contains("not a UUID") && !err.rollback);
        let err = plan(
            manifest(EPOCH, 1, vec![entry(1, "a"), entry(1, "b")]),
            None,
            Checked::Unknown,
            nothing_held,
        )
        .unwrap_err();
        assert!(err.message.contains("twice"), "{err:?}");
        let mut bad_path = entry(1, "a");
        bad_path.path = "../../etc/passwd".into();
        let err = plan(
            manifest(EPOCH, 1, vec![bad_path]),
            None,
            Checked::Unknown,
            nothing_held,
        )
        .unwrap_err();
        assert!(err.message.contains("path"), "{err:?}");
    }
}
