//! The "same lesson" rule: when two cards say the same thing.
//!
//! A card's lesson is its title and body. Both are normalised (Unicode NFKC, lower case,
//! punctuation and runs of white space made one space), then cut into words by the search
//! tokenizer (`mop-search`: CJK runs as character bigrams), with a few English function
//! words left out and a plural `s` taken off. Two lessons are the same when
//! - their normalised texts are equal ([`Lesson::exact`]), or
//! - their numbers agree (one's words with digits are all among the other's: "to 10800"
//!   and "to 3600" are two lessons however alike the rest) and
//!   - the Jaccard similarity of their word sets reaches [`Thresholds::jaccard`], or
//!   - one's words are nearly all in the other's ([`Thresholds::containment`]) while the
//!     similarity still reaches [`Thresholds::containment_jaccard`]: the same lesson with
//!     a detail added, or
//!   - where an embedding model is configured and both have its vector, their cosine
//!     similarity reaches [`Thresholds::dense_cosine`] while the Jaccard similarity still
//!     reaches [`Thresholds::dense_jaccard`]: the same lesson in other words.
//!
//! Similarity is estimated from a MinHash signature ([`SIGNATURE_LEN`] minima of one
//! 64-bit hash of each word under as many fixed permutations), never from the text. So a
//! rejected card's tombstone keeps its signature and word count, no text, and a later store
//! is compared with it by exactly the rule that compares it with live cards. The signature
//! also gives [`BANDS`] locality-sensitive band keys, which a store looks up to find the
//! few cards worth comparing with, whatever the workspace's size.
//!
//! Everything here is deterministic and stable across builds and machines: fingerprints
//! are kept in databases. Changing the features or the hash means a new [`VERSION`].

use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

/// The fingerprint format; stored fingerprints of another version are made again.
pub const VERSION: u32 = 2;
/// MinHash minima per signature.
pub const SIGNATURE_LEN: usize = 128;
/// Locality-sensitive bands.
pub const BANDS: usize = 20;
/// Signature values per band: two cards share a band key with probability about J^ROWS.
pub const ROWS: usize = 3;
/// Below this many distinct words a lesson is too short for a similarity to mean
/// anything (two four-word notes that differ in one number share 60 % of their words):
/// only an exact match counts.
pub const MIN_WORDS: u32 = 8;

/// Words that carry no lesson. Negations ("not", "never", "no") are kept: they turn a
/// lesson into its opposite.
const STOPWORDS: &[&str] = &[
    "a", "also", "an", "and", "are", "as", "at", "be", "been", "being", "by", "can", "could",
    "did", "do", "does", "for", "from", "had", "has", "have", "he", "here", "i", "if", "in",
    "into", "is", "it", "its", "just", "may", "me", "might", "my", "of", "on", "onto", "or", "our",
    "she", "should", "so", "than", "that", "the", "their", "them", "then", "there", "these",
    "they", "this", "those", "to", "very", "was", "we", "were", "when", "which", "will", "with",
    "would", "you", "your",
];

/// The thresholds of the rule (the server's `[intake]` configuration).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Jaccard similarity of the word sets at or above which two lessons are the same.
    pub jaccard: f32,
    /// Share of the smaller word set found in the larger one at or above which two
    /// lessons are the same (with [`Thresholds::containment_jaccard`]).
    pub containment: f32,
    /// The similarity a containment match needs as well, so that a one-line card is not
    /// "contained" in every long card that mentions its words.
    pub containment_jaccard: f32,
    /// With an embedding model: the cosine similarity of the two vectors at or above which
    /// two lessons are the same (with [`Thresholds::dense_jaccard`]).
    pub dense_cosine: f32,
    /// The Jaccard similarity a dense match needs as well.
    pub dense_jaccard: f32,
}

impl Default for Thresholds {
    /// Chosen on the dev split of `tests/eval/same_lesson.toml` by `mop-bench lessons`:
    /// the highest dev recall with no false merge (README has the precision and recall
    /// on its test split). The containment rule added no recall there, so it is at its
    /// strictest (all words) by default. The dense pair was chosen the same way, with the
    /// model `.ci/run` installs, after the lexical one.
    fn default() -> Thresholds {
        Thresholds {
            jaccard: 0.55,
            containment: 1.0,
            containment_jaccard: 0.55,
            dense_cosine: 0.85,
            dense_jaccard: 0.4,
        }
    }
}

impl Thresholds {
    /// Checks that each threshold is a share in (0, 1]; names the key otherwise.
    pub fn check(&self) -> Result<(), String> {
        for (key, v) in [
            ("jaccard", self.jaccard),
            ("containment", self.containment),
            ("containment_jaccard", self.containment_jaccard),
            ("dense_cosine", self.dense_cosine),
            ("dense_jaccard", self.dense_jaccard),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(format!("{key} must be above 0 and at most 1 (got {v})"));
            }
        }
        Ok(())
    }
}

/// How two lessons were found to be the same.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sameness {
    /// Equal normalised texts.
    Exact,
    /// Similar word sets: the estimated Jaccard similarity and containment.
    Similar {
        /// Estimated Jaccard similarity of the word sets.
        jaccard: f32,
        /// Estimated share of the smaller set found in the larger.
        containment: f32,
    },
    /// Similar meaning by the embedding model, with some words in common.
    Dense {
        /// Estimated Jaccard similarity of the word sets.
        jaccard: f32,
        /// Cosine similarity of the vectors.
        cosine: f32,
    },
}

impl Sameness {
    /// A score to pick the closest of several matches by (1 for an exact match).
    pub fn score(&self) -> f32 {
        match self {
            Sameness::Exact => 1.0,
            Sameness::Similar { jaccard, .. } | Sameness::Dense { jaccard, .. } => *jaccard,
        }
    }
}

/// A card's lesson, as the rule compares it: no text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lesson {
    /// SHA-256 (hex) of the normalised title and body.
    pub exact: String,
    /// MinHash minima of the word set ([`SIGNATURE_LEN`] of them).
    pub signature: Vec<u32>,
    /// Distinct words.
    pub words: u32,
    /// Hashes of its distinct words with digits in them (values, versions, ports, codes),
    /// sorted: two lessons whose numbers disagree are two lessons.
    pub numbers: Vec<u64>,
    /// Its vector by the configured embedding model (quantized: ±127 is ±1), if any.
    pub vector: Option<Vec<i8>>,
}

/// The text of a lesson an embedding model reads.
pub fn embedding_text(title: &str, body: &str) -> String {
    format!("{title}\n{body}")
}

/// Text in NFKC, lower case, with everything but letters and digits made one space.
pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut space = true;
    for c in text.nfkc().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            out.push(c);
            space = false;
        } else if !space {
            out.push(' ');
            space = true;
        }
    }
    if out.ends_with(' ') {
        out.pop();
    }
    out
}

/// 64-bit FNV-1a, finished with splitmix64's mixer so nearby inputs spread.
fn hash64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The permutations: odd multipliers and offsets from a fixed splitmix64 sequence.
fn permutations() -> &'static [(u64, u64); SIGNATURE_LEN] {
    static P: std::sync::OnceLock<[(u64, u64); SIGNATURE_LEN]> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let mut state: u64 = 0x6d6f_702d_6c65_7373; // "mop-less"
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            mix(state)
        };
        std::array::from_fn(|_| (next() | 1, next()))
    })
}

/// The word of a token: a plural `s` off (`restarts` = `restart`, `queries` = `query`).
fn stem(token: &str) -> std::borrow::Cow<'_, str> {
    let n = token.len();
    if n > 4 && token.ends_with("ies") {
        return format!("{}y", &token[..n - 3]).into();
    }
    if n > 3
        && token.ends_with('s')
        && !token.ends_with("ss")
        && !token.ends_with("us")
        && !token.ends_with("is")
        && token.is_ascii()
    {
        return token[..n - 1].into();
    }
    token.into()
}

/// The distinct word hashes of a normalised text, and of those with a digit, sorted.
fn word_hashes(normalized: &str) -> (Vec<u64>, Vec<u64>) {
    let (mut words, mut numbers) = (Vec::new(), Vec::new());
    let mut buf = String::new();
    mop_search::tokenize::scan(normalized, &mut buf, |t, _, _| {
        let Ok(t) = std::str::from_utf8(t) else {
            return;
        };
        if STOPWORDS.binary_search(&t).is_ok() {
            return;
        }
        let h = hash64(stem(t).as_bytes());
        words.push(h);
        if t.bytes().any(|b| b.is_ascii_digit()) {
            numbers.push(h);
        }
    });
    for v in [&mut words, &mut numbers] {
        v.sort_unstable();
        v.dedup();
    }
    (words, numbers)
}

/// True when every element of sorted `a` is in sorted `b`.
fn subset(a: &[u64], b: &[u64]) -> bool {
    a.iter().all(|x| b.binary_search(x).is_ok())
}

impl Lesson {
    /// The lesson of a card with this title and body.
    pub fn of(title: &str, body: &str) -> Lesson {
        let normalized = format!("{}\n{}", normalize(title), normalize(body));
        let exact = format!("{:x}", Sha256::digest(normalized.as_bytes()));
        let (words, numbers) = word_hashes(&normalized);
        let mut signature = vec![u32::MAX; SIGNATURE_LEN];
        for (slot, (a, b)) in signature.iter_mut().zip(permutations()) {
            for w in &words {
                let v = (a.wrapping_mul(*w).wrapping_add(*b) >> 32) as u32;
                if v < *slot {
                    *slot = v;
                }
            }
        }
        Lesson {
            exact,
            signature,
            words: words.len().min(u32::MAX as usize) as u32,
            numbers,
            vector: None,
        }
    }

    /// The lesson with its vector (an L2-normalized embedding of [`embedding_text`]).
    pub fn with_vector(mut self, vector: &[f32]) -> Lesson {
        self.vector = Some(
            vector
                .iter()
                .map(|v| (v * 127.0).round().clamp(-127.0, 127.0) as i8)
                .collect(),
        );
        self
    }

    /// The cosine similarity of the two vectors, when both have one of one model.
    pub fn cosine(&self, other: &Lesson) -> Option<f32> {
        let (a, b) = (self.vector.as_ref()?, other.vector.as_ref()?);
        if a.len() != b.len() || a.is_empty() {
            return None;
        }
        let dot: i32 = a
            .iter()
            .zip(b)
            .map(|(x, y)| i32::from(*x) * i32::from(*y))
            .sum();
        Some(dot as f32 / (127.0 * 127.0))
    }

    /// The estimated Jaccard similarity of the two word sets.
    pub fn jaccard(&self, other: &Lesson) -> f32 {
        if self.words == 0 || other.words == 0 {
            return 0.0;
        }
        let equal = self
            .signature
            .iter()
            .zip(&other.signature)
            .filter(|(a, b)| a == b)
            .count();
        equal as f32 / SIGNATURE_LEN as f32
    }

    /// Whether `other` says the same lesson, and how.
    pub fn same_as(&self, other: &Lesson, t: &Thresholds) -> Option<Sameness> {
        if self.exact == other.exact {
            return Some(Sameness::Exact);
        }
        if self.words < MIN_WORDS || other.words < MIN_WORDS {
            return None;
        }
        if !subset(&self.numbers, &other.numbers) && !subset(&other.numbers, &self.numbers) {
            return None;
        }
        let jaccard = self.jaccard(other);
        // |A ∩ B| = J (|A| + |B|) / (1 + J).
        let (a, b) = (self.words as f32, other.words as f32);
        let shared = jaccard * (a + b) / (1.0 + jaccard);
        let containment = (shared / a.min(b)).min(1.0);
        if jaccard >= t.jaccard
            || (containment >= t.containment && jaccard >= t.containment_jaccard)
        {
            return Some(Sameness::Similar {
                jaccard,
                containment,
            });
        }
        let cosine = self.cosine(other)?;
        (jaccard >= t.dense_jaccard && cosine >= t.dense_cosine)
            .then_some(Sameness::Dense { jaccard, cosine })
    }

    /// The band keys: two lessons with a Jaccard similarity J share at least one with
    /// probability 1 - (1 - J^ROWS)^BANDS (0.99 at 0.6, 0.93 at 0.5, 0.02 at 0.1).
    pub fn bands(&self) -> [i64; BANDS] {
        std::array::from_fn(|band| {
            let mut bytes = Vec::with_capacity(4 + ROWS * 4);
            bytes.extend_from_slice(&(band as u32).to_le_bytes());
            for v in &self.signature[band * ROWS..(band + 1) * ROWS] {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            hash64(&bytes) as i64
        })
    }

    /// The signature as stored: little-endian `u32`s.
    pub fn signature_bytes(&self) -> Vec<u8> {
        self.signature
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    /// The number hashes as stored: little-endian `u64`s.
    pub fn numbers_bytes(&self) -> Vec<u8> {
        self.numbers.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// The vector as stored: one byte per dimension.
    pub fn vector_bytes(&self) -> Option<Vec<u8>> {
        self.vector
            .as_ref()
            .map(|v| v.iter().map(|x| x.to_le_bytes()[0]).collect())
    }

    /// A stored vector back.
    pub fn with_stored_vector(mut self, bytes: Option<Vec<u8>>) -> Lesson {
        self.vector = bytes.map(|b| b.into_iter().map(|x| i8::from_le_bytes([x])).collect());
        self
    }

    /// A stored lesson back; `None` when the signature has the wrong length or the
    /// numbers are not whole `u64`s.
    pub fn from_stored(
        exact: String,
        signature: &[u8],
        words: u32,
        numbers: &[u8],
    ) -> Option<Lesson> {
        if signature.len() != SIGNATURE_LEN * 4 || !numbers.len().is_multiple_of(8) {
            return None;
        }
        Some(Lesson {
            exact,
            signature: signature
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            words,
            numbers: numbers
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("eight bytes")))
                .collect(),
            vector: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopwords_are_sorted_for_binary_search() {
        assert!(STOPWORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn normalisation_folds_width_case_punctuation_and_space() {
        assert_eq!(
            normalize("  Restart the PRIMARY.\n\n ＯＲＡ－０１５５５!! "),
            "restart the primary ora 01555"
        );
        assert_eq!(normalize("死锁，问题。"), "死锁 问题");
    }

    #[test]
    fn a_trailing_period_or_case_is_the_same_text() {
        let a = Lesson::of("Raise undo retention", "Set UNDO_RETENTION to 10800.");
        let b = Lesson::of("raise undo retention.", "set undo_retention to 10800");
        assert_eq!(a.exact, b.exact);
        assert_eq!(a.same_as(&b, &Thresholds::default()), Some(Sameness::Exact));
    }

    #[test]
    fn signatures_are_stable_across_builds() {
        // Stored fingerprints outlive the binary that made them: these values must never
        // change without a new VERSION.
        let l = Lesson::of(
            "ORA-01555 snapshot too old",
            "Raise UNDO_RETENTION to 10800.",
        );
        assert_eq!(l.words, 9);
        assert_eq!(&l.signature[..3], &[104_447_092, 14_981_012, 96_959_149]);
        let back = Lesson::from_stored(
            l.exact.clone(),
            &l.signature_bytes(),
            l.words,
            &l.numbers_bytes(),
        )
        .unwrap();
        assert_eq!(back, l);
    }

    #[test]
    fn the_same_error_with_another_fix_is_another_lesson() {
        let t = Thresholds::default();
        let a = Lesson::of(
            "ORA-01555 in the nightly ETL",
            "Raise UNDO_RETENTION to 10800 and grow the undo tablespace before the run.",
        );
        let b = Lesson::of(
            "ORA-01555 in the nightly ETL",
            "Commit less often in the cursor loop: fetching across commits causes it.",
        );
        assert_eq!(a.same_as(&b, &t), None, "J = {}", a.jaccard(&b));
        let reworded = Lesson::of(
            "Nightly ETL: ORA-01555",
            "Grow the undo tablespace and raise UNDO_RETENTION to 10800 before the run.",
        );
        assert!(
            a.same_as(&reworded, &t).is_some(),
            "J = {}",
            a.jaccard(&reworded)
        );
    }

    #[test]
    fn lessons_whose_numbers_disagree_are_two_lessons() {
        let t = Thresholds::default();
        let a = Lesson::of(
            "Undo retention for the nightly ledger ETL",
            "Set UNDO_RETENTION to 10800 seconds before the nightly ledger ETL runs, and let the undo tablespace grow.",
        );
        let b = Lesson::of(
            "Undo retention for the nightly ledger ETL",
            "Set UNDO_RETENTION to 3600 seconds before the nightly ledger ETL runs, and let the undo tablespace grow.",
        );
        assert!(a.jaccard(&b) > 0.8, "J = {}", a.jaccard(&b));
        assert_eq!(a.same_as(&b, &t), None);
        // The control: a rewording with the same number, and one that adds a number.
        let c = Lesson::of(
            "Nightly ledger ETL: undo retention",
            "Before the nightly ledger ETL runs, set UNDO_RETENTION to 10800 seconds and let the undo tablespace grow.",
        );
        assert!(a.same_as(&c, &t).is_some(), "J = {}", a.jaccard(&c));
        let d = Lesson::of(
            "Undo retention for the nightly ledger ETL",
            "Set UNDO_RETENTION to 10800 seconds before the nightly ledger ETL runs at 02:00, and let the undo tablespace grow.",
        );
        assert!(a.same_as(&d, &t).is_some(), "J = {}", a.jaccard(&d));
    }

    #[test]
    fn short_texts_match_only_exactly() {
        let t = Thresholds::default();
        let a = Lesson::of("x", "y");
        let b = Lesson::of("x", "z");
        assert_eq!(a.same_as(&b, &t), None);
        assert_eq!(a.same_as(&Lesson::of("X.", "Y"), &t), Some(Sameness::Exact));
    }

    #[test]
    fn similar_lessons_share_a_band() {
        let a = Lesson::of(
            "Deadlock on the orders table",
            "Take the row locks in primary key order in every writer; the batch job took them in reverse.",
        );
        let b = Lesson::of(
            "Deadlock on the orders table.",
            "Every writer must take row locks in primary key order; the batch job took them in reverse order.",
        );
        let shared = a.bands().iter().filter(|k| b.bands().contains(k)).count();
        assert!(shared > 0, "J = {}", a.jaccard(&b));
    }
}
