//! The same-lesson eval (`tests/eval/same_lesson.toml`): every pair of wordings within a
//! split, scored by the rule at some thresholds. A pair of one lesson's wordings is a
//! positive, a pair across lessons a negative; precision and recall are over pairs.

use std::path::PathBuf;

use mop_intake::lesson::{Lesson, Thresholds};
use serde::Deserialize;

/// One lesson and its wordings (title, body).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalLesson {
    /// A name for messages.
    pub id: String,
    /// `dev` or `test`.
    pub split: String,
    /// Title and body of each wording.
    pub wordings: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    lesson: Vec<EvalLesson>,
}

/// The eval file.
pub fn path() -> PathBuf {
    crate::repo_root().join("tests/eval/same_lesson.toml")
}

/// Every lesson of the eval.
pub fn load() -> Vec<EvalLesson> {
    let text = std::fs::read_to_string(path()).expect("tests/eval/same_lesson.toml");
    toml::from_str::<File>(&text)
        .expect("tests/eval/same_lesson.toml parses")
        .lesson
}

/// A split's scores.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Score {
    /// Pairs of one lesson found the same.
    pub true_merges: usize,
    /// Pairs of one lesson in all.
    pub positives: usize,
    /// Pairs of two lessons found the same: a lesson lost.
    pub false_merges: usize,
    /// Pairs of two lessons in all.
    pub negatives: usize,
    /// Each false merge, as `lesson a #i ~ lesson b #j`.
    pub false_pairs: Vec<String>,
}

impl Score {
    /// Of the pairs found the same, the share that are one lesson (1 when none is found).
    pub fn precision(&self) -> f64 {
        let found = self.true_merges + self.false_merges;
        if found == 0 {
            1.0
        } else {
            self.true_merges as f64 / found as f64
        }
    }

    /// Of the pairs that are one lesson, the share found the same.
    pub fn recall(&self) -> f64 {
        if self.positives == 0 {
            0.0
        } else {
            self.true_merges as f64 / self.positives as f64
        }
    }
}

/// One wording of a split, fingerprinted: (lesson id, wording index, fingerprint).
pub type Item<'a> = (&'a str, usize, Lesson);

/// The wordings of `split`, fingerprinted, with vectors when `model` is given.
pub fn items<'a>(
    lessons: &'a [EvalLesson],
    split: &str,
    model: Option<&mop_embed::Model>,
) -> Vec<Item<'a>> {
    lessons
        .iter()
        .filter(|l| l.split == split)
        .flat_map(|l| {
            l.wordings
                .iter()
                .enumerate()
                .map(move |(i, (title, body))| {
                    let lesson = Lesson::of(title, body);
                    let lesson = match model
                        .and_then(|m| m.embed(&mop_intake::lesson::embedding_text(title, body)))
                    {
                        Some(v) => lesson.with_vector(&v),
                        None => lesson,
                    };
                    (l.id.as_str(), i, lesson)
                })
        })
        .collect()
}

/// Scores the lessons of `split` at `t` (words alone).
pub fn score(lessons: &[EvalLesson], split: &str, t: &Thresholds) -> Score {
    score_items(&items(lessons, split, None), t)
}

/// Scores fingerprinted wordings at `t`.
pub fn score_items(items: &[Item<'_>], t: &Thresholds) -> Score {
    let mut s = Score::default();
    for (i, a) in items.iter().enumerate() {
        for b in &items[i + 1..] {
            let same = a.2.same_as(&b.2, t).is_some();
            if a.0 == b.0 {
                s.positives += 1;
                s.true_merges += usize::from(same);
            } else {
                s.negatives += 1;
                if same {
                    s.false_merges += 1;
                    s.false_pairs
                        .push(format!("{} #{} ~ {} #{}", a.0, a.1, b.0, b.1));
                }
            }
        }
    }
    s
}
