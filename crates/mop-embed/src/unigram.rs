//! The model's tokenizer: a SentencePiece Unigram model as a Hugging Face `tokenizer.json`
//! describes it, read into a compact form.
//!
//! The general-purpose `tokenizers` crate keeps a Unigram vocabulary as a trie of hash
//! maps, one per node: 124 MiB for a 128k-piece vocabulary, and about 1.3 MB/s of text on
//! this project's machines. Here the pieces live in one double-array trie (a few MiB,
//! searched without allocating), the scores in one array, and text runs through the same
//! pipeline in one pass:
//!
//! 1. special tokens (`added_tokens`, not normalized) are split out of the raw text;
//! 2. the SentencePiece normalizer (`Precompiled` charsmap) rewrites each grapheme, with
//!    a table for plain ASCII, whose graphemes are single bytes;
//! 3. words are split at whitespace, each gets a leading `▁` and is split again before
//!    every `▁` inside it (`WhitespaceSplit` + `Metaspace`);
//! 4. each piece of a word is segmented by Viterbi over the vocabulary's scores, an unknown
//!    character scoring the lowest score less 10, as SentencePiece does.
//!
//! It gives the same ids as the `tokenizers` crate for the pipelines model2vec's Unigram
//! models use (`tests/retrieval.rs` compares both on every text of the eval). A
//! `tokenizer.json` with any other step is refused with an error that names the step:
//! a silently different tokenization would put card vectors in another space.

use serde::Deserialize;

/// What a `tokenizer.json` holds that is read here; every other key is ignored.
#[derive(Deserialize)]
struct Json {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    normalizer: Option<Normalizer>,
    pre_tokenizer: Option<PreTokenizer>,
    model: ModelJson,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    normalized: bool,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Normalizer {
    Sequence {
        normalizers: Vec<Normalizer>,
    },
    Precompiled {
        precompiled_charsmap: Option<String>,
    },
    Replace {
        pattern: Pattern,
        content: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
enum Pattern {
    String(String),
    Regex(String),
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum PreTokenizer {
    Sequence {
        pretokenizers: Vec<PreTokenizer>,
    },
    WhitespaceSplit,
    Metaspace {
        replacement: char,
        #[serde(default = "always")]
        prepend_scheme: String,
        #[serde(default = "yes")]
        split: bool,
    },
    #[serde(other)]
    Other,
}

fn always() -> String {
    "always".into()
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum ModelJson {
    Unigram {
        vocab: Vec<(String, f64)>,
        unk_id: Option<u32>,
        #[serde(default)]
        byte_fallback: bool,
    },
    #[serde(other)]
    Other,
}

/// SentencePiece's penalty for a character no piece covers.
const UNK_PENALTY: f64 = 10.0;
/// The piece separator that `Metaspace` puts before every word.
const SPACE: char = '\u{2581}';

/// A Unigram tokenizer.
pub(crate) struct Unigram {
    /// Piece bytes to id.
    trie: yada::DoubleArray<Vec<u8>>,
    scores: Vec<f64>,
    unk: u32,
    unk_score: f64,
    /// Special tokens matched in the raw text, longest first.
    special: Vec<(String, u32)>,
    normalizer: Option<Charsmap>,
}

/// The SentencePiece normalizer, with each ASCII byte's rewrite looked up once.
struct Charsmap {
    map: spm_precompiled::Precompiled,
    /// What each ASCII byte becomes on its own (`None`: itself).
    ascii: Vec<Option<Box<str>>>,
}

impl Charsmap {
    fn new(map: spm_precompiled::Precompiled) -> Charsmap {
        let ascii = (0u8..128)
            .map(|b| {
                let s = [b];
                let s = std::str::from_utf8(&s).expect("ASCII");
                map.transform(s).map(Box::from)
            })
            .collect();
        Charsmap { map, ascii }
    }

    /// Appends `text`, normalized, to `out`: grapheme by grapheme, as SentencePiece does.
    /// A byte that is ASCII, not `\r`, and has such bytes on both sides is a grapheme of
    /// its own (no rule of Unicode's segmentation joins two of them), so it is looked up
    /// in the table; the rest goes through the general path in runs whose ends are such
    /// boundaries.
    fn normalize_into(&self, text: &str, out: &mut String) {
        let b = text.as_bytes();
        let plain = |i: usize| b.get(i).is_none_or(|c| c.is_ascii() && *c != b'\r');
        let fast = |i: usize| plain(i) && (i == 0 || plain(i - 1)) && plain(i + 1);
        let mut i = 0;
        while i < b.len() {
            if fast(i) {
                match &self.ascii[b[i] as usize] {
                    Some(rewrite) => out.push_str(rewrite),
                    None => out.push(b[i] as char),
                }
                i += 1;
                continue;
            }
            let start = i;
            while i < b.len() && !fast(i) {
                i += 1;
            }
            // `start` and `i` sit between two plain ASCII bytes (or at an end): both are
            // character boundaries.
            out.push_str(&self.map.normalize_string(&text[start..i]));
        }
    }
}

/// Why a `tokenizer.json` cannot be used.
pub(crate) type Refusal = String;

impl Unigram {
    /// Reads a `tokenizer.json`.
    pub(crate) fn from_json(bytes: &[u8]) -> Result<Unigram, Refusal> {
        let json: Json = serde_json::from_slice(bytes).map_err(|e| format!("unreadable: {e}"))?;
        let ModelJson::Unigram {
            vocab,
            unk_id,
            byte_fallback,
        } = json.model
        else {
            return Err(
                "the model is not a Unigram model (mop reads SentencePiece Unigram \
                        tokenizers, as multilingual model2vec models have)"
                    .into(),
            );
        };
        if byte_fallback {
            return Err("the Unigram model uses byte_fallback, which mop does not read".into());
        }
        let unk = unk_id.ok_or("the Unigram model has no unk_id")?;
        if vocab.is_empty() || unk as usize >= vocab.len() {
            return Err(format!(
                "unk_id {unk} is not in the vocabulary of {} pieces",
                vocab.len()
            ));
        }
        let normalizer = match json.normalizer {
            None => None,
            Some(n) => charsmap(n)?,
        };
        check_pre_tokenizer(json.pre_tokenizer)?;
        let mut special = Vec::new();
        for t in json.added_tokens {
            if t.normalized || t.single_word || t.lstrip || t.rstrip {
                return Err(format!(
                    "added token {:?} is normalized or matched by word, which mop does not read",
                    t.content
                ));
            }
            if t.content.is_empty() || t.id as usize >= vocab.len() {
                return Err(format!(
                    "added token {:?} is not in the vocabulary",
                    t.content
                ));
            }
            special.push((t.content, t.id));
        }
        // Leftmost-longest, as the tokenizers crate matches them.
        special.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));

        let min_score = vocab.iter().map(|v| v.1).fold(f64::INFINITY, f64::min);
        if !min_score.is_finite() {
            return Err("the vocabulary holds a score that is not a number".into());
        }
        let mut keys: Vec<(&[u8], u32)> = Vec::with_capacity(vocab.len());
        for (id, (piece, _)) in vocab.iter().enumerate() {
            if piece.is_empty() || piece.as_bytes().contains(&0) {
                // No text can match it; the trie cannot hold it.
                continue;
            }
            keys.push((piece.as_bytes(), id as u32));
        }
        // A piece listed twice maps to its last id, as in the tokenizers crate.
        keys.sort_by(|a, b| a.0.cmp(b.0).then(b.1.cmp(&a.1)));
        keys.dedup_by(|later, kept| later.0 == kept.0);
        let trie = yada::builder::DoubleArrayBuilder::build(&keys)
            .ok_or("the vocabulary does not fit a double-array trie")?;
        Ok(Unigram {
            trie: yada::DoubleArray::new(trie),
            scores: vocab.iter().map(|v| v.1).collect(),
            unk,
            unk_score: min_score - UNK_PENALTY,
            special,
            normalizer,
        })
    }

    /// The unknown token's id.
    pub(crate) fn unk(&self) -> u32 {
        self.unk
    }

    /// The ids of `text`'s tokens, appended to `ids` in order.
    pub(crate) fn encode(&self, text: &str, ids: &mut Vec<u32>) {
        let mut scratch = Scratch::default();
        let mut rest = text;
        while !rest.is_empty() {
            let (before, token) = self.next_special(rest);
            self.encode_plain(&rest[..before], &mut scratch, ids);
            match token {
                Some((len, id)) => {
                    ids.push(id);
                    rest = &rest[before + len..];
                }
                None => break,
            }
        }
    }

    /// Where the first special token in `text` starts, and its length and id.
    fn next_special(&self, text: &str) -> (usize, Option<(usize, u32)>) {
        let mut best: Option<(usize, usize, u32)> = None;
        for (content, id) in &self.special {
            if let Some(at) = text.find(content.as_str()) {
                // Longest first in the list, so a later one wins only by starting earlier.
                if best.is_none_or(|(b, _, _)| at < b) {
                    best = Some((at, content.len(), *id));
                }
            }
        }
        match best {
            Some((at, len, id)) => (at, Some((len, id))),
            None => (text.len(), None),
        }
    }

    fn encode_plain(&self, text: &str, scratch: &mut Scratch, ids: &mut Vec<u32>) {
        let normalized = match &self.normalizer {
            Some(n) => {
                scratch.normalized.clear();
                n.normalize_into(text, &mut scratch.normalized);
                std::mem::take(&mut scratch.normalized)
            }
            None => text.to_owned(),
        };
        for word in normalized
            .split(char::is_whitespace)
            .filter(|w| !w.is_empty())
        {
            scratch.word.clear();
            if !word.starts_with(SPACE) {
                scratch.word.push(SPACE);
            }
            scratch.word.push_str(word);
            let word = std::mem::take(&mut scratch.word);
            // Split before every `▁`, each keeping the `▁` it starts with.
            let mut start = 0;
            for (at, _) in word.match_indices(SPACE).skip(1) {
                self.viterbi(&word[start..at], &mut scratch.lattice, ids);
                start = at;
            }
            self.viterbi(&word[start..], &mut scratch.lattice, ids);
            scratch.word = word;
        }
        scratch.normalized = normalized;
    }

    /// The best segmentation of `piece` into vocabulary pieces (SentencePiece's Viterbi:
    /// the highest total score; an unknown character is a piece of its own).
    fn viterbi(&self, piece: &str, lattice: &mut Vec<Node>, ids: &mut Vec<u32>) {
        let bytes = piece.as_bytes();
        lattice.clear();
        lattice.resize(bytes.len() + 1, Node::EMPTY);
        lattice[0].reached = true;
        let mut at = 0;
        while at < bytes.len() {
            let here = lattice[at].score;
            let char_len = utf8_len(bytes[at]);
            // No piece holds a NUL byte, so no match can reach past one.
            let key = &bytes[at..];
            let key = &key[..key.iter().position(|b| *b == 0).unwrap_or(key.len())];
            let mut single = false;
            for (id, len) in self.trie.common_prefix_search(key) {
                let score = here + self.scores[id as usize];
                lattice[at + len].offer(score, at, id);
                single |= len == char_len;
            }
            if !single {
                let end = (at + char_len).min(bytes.len());
                lattice[end].offer(here + self.unk_score, at, self.unk);
            }
            at += char_len;
        }
        let first = ids.len();
        let mut end = bytes.len();
        while end > 0 {
            let node = lattice[end];
            ids.push(node.id);
            end = node.from;
        }
        ids[first..].reverse();
    }
}

/// Buffers reused across the words of one text.
#[derive(Default)]
struct Scratch {
    normalized: String,
    word: String,
    lattice: Vec<Node>,
}

/// The best path found so far to a position of the lattice.
#[derive(Clone, Copy)]
struct Node {
    reached: bool,
    score: f64,
    from: usize,
    id: u32,
}

impl Node {
    const EMPTY: Node = Node {
        reached: false,
        score: 0.0,
        from: 0,
        id: 0,
    };

    fn offer(&mut self, score: f64, from: usize, id: u32) {
        if !self.reached || score > self.score {
            *self = Node {
                reached: true,
                score,
                from,
                id,
            };
        }
    }
}

/// Length of the UTF-8 character that starts with `lead`.
fn utf8_len(lead: u8) -> usize {
    match lead {
        0..0x80 => 1,
        0xc0..0xe0 => 2,
        0xe0..0xf0 => 3,
        _ => 4,
    }
}

/// The normalizer steps: a `Precompiled` charsmap, alone or followed by the `Replace` of
/// runs of spaces that SentencePiece exports add (whitespace is split on next, so that
/// replace changes nothing and is not run).
fn charsmap(n: Normalizer) -> Result<Option<Charsmap>, Refusal> {
    let steps = match n {
        Normalizer::Sequence { normalizers } => normalizers,
        one => vec![one],
    };
    let mut map = None;
    for step in steps {
        match step {
            Normalizer::Precompiled {
                precompiled_charsmap,
            } if map.is_none() => {
                let Some(encoded) = precompiled_charsmap else {
                    continue;
                };
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| format!("the Precompiled normalizer's charsmap: {e}"))?;
                let parsed = spm_precompiled::Precompiled::from(&bytes)
                    .map_err(|e| format!("the Precompiled normalizer's charsmap: {e}"))?;
                map = Some(Charsmap::new(parsed));
            }
            Normalizer::Replace { pattern, content }
                if !content.is_empty()
                    && content.chars().all(|c| c == ' ')
                    && spaces_only(&pattern) => {}
            _ => {
                return Err(
                    "the normalizer has a step other than one Precompiled charsmap \
                            and a Replace of spaces, which mop does not read"
                        .into(),
                );
            }
        }
    }
    Ok(map)
}

/// True for a pattern that matches only non-empty runs of spaces: `" "`-strings, and the
/// regexes `" +"`, `" {n,}"` and `" {n,m}"` with n ≥ 1 (what SentencePiece exports write).
fn spaces_only(pattern: &Pattern) -> bool {
    match pattern {
        Pattern::String(s) => !s.is_empty() && s.chars().all(|c| c == ' '),
        Pattern::Regex(r) => {
            let Some(rest) = r.strip_prefix(' ') else {
                return false;
            };
            if rest == "+" {
                return true;
            }
            let Some(range) = rest.strip_prefix('{').and_then(|x| x.strip_suffix('}')) else {
                return false;
            };
            let (low, high) = range.split_once(',').unwrap_or((range, range));
            let low: Option<u32> = low.parse().ok();
            let high_ok = high.is_empty() || high.parse::<u32>().is_ok_and(|h| Some(h) >= low);
            low.is_some_and(|l| l >= 1) && high_ok
        }
    }
}

/// The pre-tokenizer must be `WhitespaceSplit` then `Metaspace` (with `▁`, prepended to
/// every word, and split), which is what [`Unigram::encode`] does.
fn check_pre_tokenizer(p: Option<PreTokenizer>) -> Result<(), Refusal> {
    let steps = match p {
        Some(PreTokenizer::Sequence { pretokenizers }) => pretokenizers,
        Some(one) => vec![one],
        None => Vec::new(),
    };
    let ok = matches!(
        &steps[..],
        [PreTokenizer::WhitespaceSplit, PreTokenizer::Metaspace { replacement, prepend_scheme, split }]
            if *replacement == SPACE && prepend_scheme == "always" && *split
    );
    if ok {
        Ok(())
    } else {
        Err(
            "the pre-tokenizer is not WhitespaceSplit followed by Metaspace (▁, prepended \
             always, split), which is what mop reads"
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokenizer.json of the shape the install script writes, with a tiny vocabulary
    /// and no charsmap.
    fn tiny(vocab: &[(&str, f64)]) -> Unigram {
        let json = serde_json::json!({
            "added_tokens": [{"id": 0, "content": "<unk>", "special": true, "normalized": false,
                              "single_word": false, "lstrip": false, "rstrip": false}],
            "normalizer": null,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "WhitespaceSplit"},
                {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}]},
            "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": false, "vocab": vocab},
        });
        Unigram::from_json(json.to_string().as_bytes()).unwrap()
    }

    fn ids(t: &Unigram, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        t.encode(text, &mut ids);
        ids
    }

    #[test]
    fn viterbi_takes_the_best_total_score() {
        let t = tiny(&[
            ("<unk>", 0.0),
            ("▁ab", -5.0),
            ("▁a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("▁", -2.0),
        ]);
        // ▁a + b (-2) beats ▁ab (-5).
        assert_eq!(ids(&t, "ab"), vec![2, 3]);
        // Two words, each with its ▁; an unknown character is the unk id.
        assert_eq!(ids(&t, " ab  c x"), vec![2, 3, 5, 4, 5, 0]);
        // A special token is split out of the raw text.
        assert_eq!(ids(&t, "a<unk>b"), vec![2, 0, 5, 3]);
        // A ▁ inside a word starts a new piece.
        assert_eq!(ids(&t, "a▁b"), vec![2, 5, 3]);
        assert!(ids(&t, " \t\n").is_empty());
    }

    #[test]
    fn only_replaces_of_space_runs_are_skipped() {
        let regex = |r: &str| Pattern::Regex(r.into());
        for ok in [" {2,}", " +", " {1,3}", " {2}"] {
            assert!(spaces_only(&regex(ok)), "{ok}");
        }
        for bad in [
            " *", " {0,}", " {0,2}", "  ?", "\\s+", " {3,1}", "x {2,}", "",
        ] {
            assert!(!spaces_only(&regex(bad)), "{bad}");
        }
        assert!(spaces_only(&Pattern::String("  ".into())));
        assert!(!spaces_only(&Pattern::String("".into())));
    }

    #[test]
    fn other_tokenizers_are_refused_by_name() {
        let wordpiece = br#"{"model": {"type": "WordPiece", "vocab": {}}}"#;
        let err = Unigram::from_json(wordpiece).err().unwrap();
        assert!(err.contains("not a Unigram model"), "{err}");
        let lowercase = serde_json::json!({
            "normalizer": {"type": "Lowercase"},
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]},
        });
        let err = Unigram::from_json(lowercase.to_string().as_bytes())
            .err()
            .unwrap();
        assert!(err.contains("normalizer"), "{err}");
    }
}
