//! `mop-bench lessons`: chooses the same-lesson thresholds on the eval's dev split and
//! reports them once on its test split (tests/eval/same_lesson.toml). The sweep prints
//! every candidate's dev precision and recall; the choice is the candidate with the
//! highest dev recall among those with no false merge on dev and room to spare: the
//! closest dev pair of two lessons (whose numbers agree) must stay three standard errors
//! of the MinHash estimate below the threshold (σ = √(t(1−t)/128)), so that estimate's
//! noise on other texts does not decide. Ties: the strictest, by jaccard, then the
//! containment rule's jaccard, then containment.
//! Only then is the test split scored, for the chosen candidate and for the defaults.
//! The closest pairs of two lessons on each split (those the numbers rule does not already
//! tell apart) show how much room the threshold has.

use mop_bench::Section;
use mop_intake::lesson::Thresholds;
use mop_testkit::lessons::{Score, load, score};

fn row(name: &str, t: &Thresholds, s: &Score) -> String {
    format!(
        "| {name} | {:.2} | {:.2} / {:.2} | {:.3} | {:.3} | {} of {} | {} of {} |",
        t.jaccard,
        t.containment,
        t.containment_jaccard,
        s.precision(),
        s.recall(),
        s.true_merges,
        s.positives,
        s.false_merges,
        s.negatives
    )
}

/// Runs the sweep: the section with the tables (Markdown); with an embedding model, the
/// dense half of the rule is swept and scored too.
pub fn run(model: Option<&std::path::Path>) -> anyhow::Result<Section> {
    let lessons = load();
    let mut section =
        Section::new("The same-lesson rule: thresholds chosen on dev, scored on test");
    let mut candidates = Vec::new();
    for j in [0.4f32, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8] {
        for (c, cj) in [
            (0.9f32, 0.3f32),
            (0.9, 0.35),
            (0.9, 0.4),
            (0.9, 0.45),
            (0.95, 0.4),
            (1.0, 1.0),
        ] {
            candidates.push(Thresholds {
                jaccard: j,
                containment: c,
                containment_jaccard: cj.min(j),
                ..Thresholds::default()
            });
        }
    }
    let closest_dev = closest_negatives(&lessons, "dev")
        .first()
        .map_or(0.0, |c| c.0);
    let room = |t: &Thresholds| {
        let j = f64::from(t.jaccard);
        let sigma = (j * (1.0 - j) / mop_intake::lesson::SIGNATURE_LEN as f64).sqrt();
        f64::from(closest_dev) < j - 3.0 * sigma
    };
    let count = |split: &str| lessons.iter().filter(|l| l.split == split).count();
    section.line(format!(
        "`tests/eval/same_lesson.toml`: {} lessons on dev and {} on test, each in 4 or 5 wordings, in \
         sibling pairs that share their error code and vocabulary but teach another fix. Every pair of \
         wordings is scored: one lesson's pair should be found the same (recall), two lessons' pair never \
         (precision). Candidates are swept on dev; the choice is the highest dev recall with no false \
         merge and three standard errors of the MinHash estimate (σ = √(t(1−t)/128)) between the closest \
         dev pair of two lessons ({closest_dev:.3}) and the threshold; only then is the test split scored.\n",
        count("dev"),
        count("test")
    ));
    section.line(
        "| candidate | jaccard | containment / its jaccard | dev precision | dev recall | merged | false merges |",
    );
    section.line("|---|---|---|---|---|---|---|");
    let mut best: Option<(Thresholds, Score)> = None;
    for (i, t) in candidates.iter().enumerate() {
        let s = score(&lessons, "dev", t);
        // The containment rule added nothing on dev: only its strictest setting is shown.
        if t.containment == 1.0 {
            section.line(row(&format!("{i}"), t, &s));
        }
        let strictness = |t: &Thresholds| (t.jaccard, t.containment_jaccard, t.containment);
        let better = s.false_merges == 0
            && room(t)
            && best.as_ref().is_none_or(|(bt, bs)| {
                s.recall() > bs.recall()
                    || (s.recall() == bs.recall() && strictness(t) > strictness(bt))
            });
        if better {
            best = Some((*t, s));
        }
    }
    let (chosen, dev) =
        best.ok_or_else(|| anyhow::anyhow!("no candidate is free of false merges on dev"))?;
    section.line(format!(
        "\nChosen on dev: jaccard {:.2}, containment {:.2} with jaccard {:.2} (dev precision {:.3}, recall {:.3}). Scored once on the test split:\n",
        chosen.jaccard,
        chosen.containment,
        chosen.containment_jaccard,
        dev.precision(),
        dev.recall()
    ));
    section.line(
        "| thresholds | jaccard | containment / its jaccard | test precision | test recall | merged | false merges |",
    );
    section.line("|---|---|---|---|---|---|---|");
    let default = Thresholds::default();
    let on_test = score(&lessons, "test", &chosen);
    section.line(row("chosen on dev", &chosen, &on_test));
    let d = score(&lessons, "test", &default);
    section.line(row("the default (server.toml)", &default, &d));
    section.figure("lessons.test_precision", d.precision(), false);
    section.figure("lessons.test_recall", d.recall(), false);
    section.target(
        "same-lesson rule on the eval's test split",
        "no false merge",
        format!(
            "{} of {} pairs of two lessons merged",
            d.false_merges, d.negatives
        ),
        d.false_merges == 0,
    );
    for p in &d.false_pairs {
        section.line(format!("\nfalse merge at the default: {p}"));
    }
    for split in ["dev", "test"] {
        section.line(format!(
            "\nThe closest pairs of two lessons on {split} whose numbers agree (estimated Jaccard):\n"
        ));
        for (j, pair) in closest_negatives(&lessons, split).into_iter().take(3) {
            section.line(format!("- {j:.3} {pair}"));
        }
    }
    if let Some(dir) = model {
        dense(&mut section, &lessons, &chosen, dir)?;
    }
    Ok(section)
}

/// The dense half: with the lexical thresholds chosen, sweeps `dense_jaccard` and
/// `dense_cosine` on dev (highest recall with no false merge, and the cosine threshold at
/// least 0.05 above every dev pair of two lessons it could merge), then scores test once.
fn dense(
    section: &mut Section,
    lessons: &[mop_testkit::lessons::EvalLesson],
    lexical: &Thresholds,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    use mop_testkit::lessons::{items, score_items};
    let model = mop_embed::Model::load(dir)?;
    let dev = items(lessons, "dev", Some(&model));
    let test = items(lessons, "test", Some(&model));
    // Words alone: no cosine reaches 2.
    let words = Thresholds {
        dense_cosine: 2.0,
        ..*lexical
    };
    let words_only = score_items(&dev, &words);
    // The highest cosine among dev pairs of two lessons that pass the numbers rule, above
    // each Jaccard floor.
    let loose = Thresholds {
        jaccard: 0.0001,
        containment: 1.0,
        containment_jaccard: 1.0,
        ..*lexical
    };
    let highest_negative = |floor: f32| {
        let mut best = 0f32;
        for (i, a) in dev.iter().enumerate() {
            for b in &dev[i + 1..] {
                if a.0 != b.0 && a.2.same_as(&b.2, &loose).is_some() && a.2.jaccard(&b.2) >= floor {
                    best = best.max(a.2.cosine(&b.2).unwrap_or(0.0));
                }
            }
        }
        best
    };
    section.line(format!(
        "\n### With the embedding model ({})\n\nThe lexical thresholds stay as chosen; two lessons are also the same when their \
         vectors' cosine reaches `dense_cosine` while their Jaccard similarity reaches `dense_jaccard`. Swept on \
         dev (highest recall with no false merge, the cosine threshold at least 0.05 above every dev pair of two \
         lessons it could merge); words alone on dev: recall {:.3}.\n",
        model.fingerprint(),
        words_only.recall()
    ));
    section.line(
        "| dense_jaccard | dense_cosine | dev precision | dev recall | false merges | room |",
    );
    section.line("|---|---|---|---|---|---|");
    let mut best: Option<(Thresholds, f64)> = None;
    for floor in [0.25f32, 0.3, 0.35, 0.4, 0.45] {
        let top = highest_negative(floor);
        for cos in [0.85f32, 0.88, 0.9, 0.92, 0.95] {
            let t = Thresholds {
                dense_jaccard: floor,
                dense_cosine: cos,
                ..*lexical
            };
            let s = score_items(&dev, &t);
            let room = cos >= top + 0.05;
            section.line(format!(
                "| {floor:.2} | {cos:.2} | {:.3} | {:.3} | {} | {} |",
                s.precision(),
                s.recall(),
                s.false_merges,
                if room { "yes" } else { "no" }
            ));
            let better = s.false_merges == 0
                && room
                && best.as_ref().is_none_or(|(bt, br)| {
                    s.recall() > *br
                        || (s.recall() == *br
                            && (t.dense_cosine, t.dense_jaccard)
                                > (bt.dense_cosine, bt.dense_jaccard))
                });
            if better {
                best = Some((t, s.recall()));
            }
        }
    }
    let Some((chosen, _)) = best else {
        section.line("\nNo dense setting adds recall on dev without a false merge.");
        return Ok(());
    };
    let t_words = score_items(&test, &words);
    let t_dense = score_items(&test, &chosen);
    let default = Thresholds::default();
    let t_default = score_items(&test, &default);
    section.line(format!(
        "\nChosen on dev: dense_jaccard {:.2}, dense_cosine {:.2}. On test: words alone precision {:.3}, recall {:.3}; \
         with the model precision {:.3}, recall {:.3} ({} false merges); the default (server.toml: {:.2} / {:.2}) \
         precision {:.3}, recall {:.3}.",
        chosen.dense_jaccard,
        chosen.dense_cosine,
        t_words.precision(),
        t_words.recall(),
        t_dense.precision(),
        t_dense.recall(),
        t_dense.false_merges,
        default.dense_jaccard,
        default.dense_cosine,
        t_default.precision(),
        t_default.recall()
    ));
    section.figure("lessons.test_recall_dense", t_default.recall(), false);
    section.target(
        "same-lesson rule with the embedding model, on the eval's test split",
        "no false merge",
        format!(
            "{} of {} pairs of two lessons merged",
            t_default.false_merges, t_default.negatives
        ),
        t_default.false_merges == 0,
    );
    Ok(())
}

/// Pairs of wordings of two different lessons, most similar first.
fn closest_negatives(
    lessons: &[mop_testkit::lessons::EvalLesson],
    split: &str,
) -> Vec<(f32, String)> {
    let items = mop_testkit::lessons::items(lessons, split, None);
    let mut out = Vec::new();
    for (i, a) in items.iter().enumerate() {
        for b in &items[i + 1..] {
            // Pairs whose numbers disagree are never the same, whatever their similarity.
            let loose = Thresholds {
                jaccard: 0.0001,
                containment: 1.0,
                containment_jaccard: 1.0,
                ..Thresholds::default()
            };
            if a.0 != b.0 && a.2.same_as(&b.2, &loose).is_some() {
                out.push((
                    a.2.jaccard(&b.2),
                    format!("{} #{} ~ {} #{}", a.0, a.1, b.0, b.1),
                ));
            }
        }
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0));
    out
}

/// How many cards of a synthetic workspace of `n` share a band key with a card (what a
/// store's lookup reads), over a sample of 200 cards: mean and largest.
pub fn band_candidates(n: usize, seed: u64) {
    use mop_intake::lesson::Lesson;
    use std::collections::HashMap;
    let now = "2026-11-29T00:00:00Z".parse().expect("a valid timestamp");
    let ws = mop_bench::synth::workspace(seed, n, now);
    let lessons: Vec<Lesson> = ws
        .cards
        .iter()
        .map(|c| Lesson::of(&c.summary.title, &c.body))
        .collect();
    let mut by_band: HashMap<i64, Vec<usize>> = HashMap::new();
    for (i, l) in lessons.iter().enumerate() {
        for b in l.bands() {
            by_band.entry(b).or_default().push(i);
        }
    }
    let (mut total, mut most, mut rows) = (0usize, 0usize, 0usize);
    for i in (0..n).step_by((n / 200).max(1)) {
        let mut seen = std::collections::HashSet::new();
        for b in lessons[i].bands() {
            let hits = &by_band[&b];
            rows += hits.len();
            seen.extend(hits.iter().copied());
        }
        total += seen.len();
        most = most.max(seen.len());
    }
    let samples = n.div_ceil((n / 200).max(1));
    println!(
        "{n} synthetic cards: a card shares a band with {} others on average (most {most}); {} band rows read per lookup",
        total / samples,
        rows / samples
    );
}
