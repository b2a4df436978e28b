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
use mop_tests::lessons::{Score, load, score};

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

/// Runs the sweep: the section with the tables (Markdown).
pub fn run() -> anyhow::Result<Section> {
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
    Ok(section)
}

/// Pairs of wordings of two different lessons, most similar first.
fn closest_negatives(
    lessons: &[mop_tests::lessons::EvalLesson],
    split: &str,
) -> Vec<(f32, String)> {
    use mop_intake::lesson::Lesson;
    let items: Vec<(&str, usize, Lesson)> = lessons
        .iter()
        .filter(|l| l.split == split)
        .flat_map(|l| {
            l.wordings
                .iter()
                .enumerate()
                .map(move |(i, (t, b))| (l.id.as_str(), i, Lesson::of(t, b)))
        })
        .collect();
    let mut out = Vec::new();
    for (i, a) in items.iter().enumerate() {
        for b in &items[i + 1..] {
            // Pairs whose numbers disagree are never the same, whatever their similarity.
            let loose = Thresholds {
                jaccard: 0.0001,
                containment: 1.0,
                containment_jaccard: 1.0,
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
