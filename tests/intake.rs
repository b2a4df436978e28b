//! The write path's two rules scored on their corpora, at the library level (the same
//! corpora go through the real binaries in `tests/write_path.rs`): every synthetic
//! credential is found with its kind and place and every look-alike passes; and the
//! same-lesson rule's precision and recall on the eval's splits.

use mop_intake::secrets::Screen;
use mop_testkit::credentials::{credentials, look_alikes};

#[test]
fn every_credential_is_found_with_its_kind_and_every_look_alike_passes() {
    // Several seeds: the random parts must not decide (an unlucky low-entropy draw).
    for seed in [20261204, 1, 2, 3, 4, 5, 6, 7] {
        check_corpus(seed);
    }
}

/// The text from a 1-based line and character column on.
fn at(text: &str, line: u32, column: u32) -> &str {
    let l = text.split('\n').nth(line as usize - 1).unwrap_or("");
    let start = l
        .char_indices()
        .nth(column as usize - 1)
        .map_or(l.len(), |(i, _)| i);
    &l[start..]
}

fn check_corpus(seed: u64) {
    let screen = Screen::builtin();
    let creds = credentials(seed);
    let kinds: std::collections::BTreeSet<_> = creds.iter().filter_map(|s| s.kind).collect();
    assert!(
        creds.len() >= 30 && kinds.len() >= 15,
        "{} samples, {} kinds",
        creds.len(),
        kinds.len()
    );
    let mut wrong = Vec::new();
    for s in &creds {
        let field = if s.in_title { "title" } else { "body" };
        let found = screen.scan(field, &s.text);
        let kinds: Vec<&str> = found.iter().map(|f| f.kind.as_str()).collect();
        if kinds != [s.kind.unwrap()] {
            wrong.push(format!(
                "seed {seed}, {}: expected {:?}, found {kinds:?}",
                s.name,
                s.kind.unwrap()
            ));
        } else if !at(&s.text, found[0].line, found[0].column)
            .starts_with(s.secret.lines().next().unwrap_or_default())
        {
            wrong.push(format!(
                "seed {seed}, {}: line {} column {} is not where the credential starts",
                s.name, found[0].line, found[0].column
            ));
        }
    }
    let alikes = look_alikes(seed);
    assert!(alikes.len() >= 30, "{} look-alikes", alikes.len());
    for s in &alikes {
        let found = screen.scan("body", &s.text);
        if !found.is_empty() {
            let kinds: Vec<&str> = found.iter().map(|f| f.kind.as_str()).collect();
            wrong.push(format!(
                "seed {seed}, look-alike {}: refused as {kinds:?}",
                s.name
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The same-lesson eval at the default thresholds (chosen on dev by `mop-bench lessons`):
/// no two lessons merged on either split, and the recall README records.
#[test]
fn the_same_lesson_rule_never_merges_two_lessons_and_finds_most_rewordings() {
    use mop_intake::lesson::Thresholds;
    use mop_testkit::lessons::{load, score};
    let lessons = load();
    for split in ["dev", "test"] {
        let of_split: Vec<_> = lessons.iter().filter(|l| l.split == split).collect();
        assert!(
            of_split.len() >= 10 && of_split.iter().all(|l| l.wordings.len() >= 4),
            "{split}: at least 10 lessons of at least 4 wordings"
        );
        let s = score(&lessons, split, &Thresholds::default());
        eprintln!(
            "{split}: precision {:.3}, recall {:.3} ({} of {} pairs; {} false merges of {})",
            s.precision(),
            s.recall(),
            s.true_merges,
            s.positives,
            s.false_merges,
            s.negatives
        );
        assert_eq!(s.false_merges, 0, "{split}: {:?}", s.false_pairs);
        // README records these (dev 0.598, test 0.594); a change to the rule or the eval
        // shows here.
        assert!(s.recall() >= 0.59, "{split}: recall {:.3}", s.recall());
    }
}

/// The same-lesson rule with the embedding model `.ci/run` installs: still no two lessons
/// merged on either split, and more rewordings found than by words alone (README records
/// the figures).
#[test]
fn with_the_embedding_model_the_rule_finds_more_rewordings_and_still_never_merges_two_lessons() {
    use mop_intake::lesson::Thresholds;
    use mop_testkit::lessons::{items, load, score_items};
    let model =
        mop_embed::Model::load(&mop_testkit::embedding_model_dir()).expect("the model loads");
    let lessons = load();
    let words = Thresholds {
        dense_cosine: 2.0,
        ..Thresholds::default()
    };
    for split in ["dev", "test"] {
        let with = items(&lessons, split, Some(&model));
        let dense = score_items(&with, &Thresholds::default());
        let lexical = score_items(&with, &words);
        eprintln!(
            "{split}: words alone recall {:.3}; with the model precision {:.3}, recall {:.3}",
            lexical.recall(),
            dense.precision(),
            dense.recall()
        );
        assert_eq!(dense.false_merges, 0, "{split}: {:?}", dense.false_pairs);
        // README records these (dev 0.793, test 0.688).
        assert!(
            dense.recall() > lexical.recall() && dense.recall() >= 0.68,
            "{split}"
        );
    }
}
