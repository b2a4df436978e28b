//! The one tokenizer used for indexing and querying: lowercase words for alphabetic
//! scripts, and overlapping character bigrams for Chinese, Japanese and Korean runs.
//!
//! Bigrams find CJK words without a dictionary (nothing to download, nothing to keep in
//! sync): `死锁问题` indexes as `死锁`, `锁问`, `问题`, and a query for `死锁` matches it.
//!
//! Tokenizing is much of an index build's work, so [`scan`] hands out tokens without
//! allocating: runs of ASCII letters and digits (most of any card) are cut by a byte
//! table, and when such a run has no capital letter the token is a slice of the text
//! itself; other characters are decoded one at a time into a reused buffer.

/// Tokens longer than this many bytes (base64 blobs, hashes) are skipped.
const MAX_TOKEN_BYTES: usize = 64;

/// What a byte is to the tokenizer, as bits: 0 ends a word (spaces, punctuation,
/// control characters); [`WORD`] is a letter or digit, with [`UPPER`] for a capital;
/// [`OTHER`] starts (or continues) a longer character. Flags rather than an enum, so the
/// loop over a word's bytes is a load, a test and an OR, with no jump table.
const CLASSES: [u8; 256] = {
    let mut t = [OTHER; 256];
    let mut b = 0;
    while b < 128 {
        t[b] = match b as u8 {
            b'a'..=b'z' | b'0'..=b'9' => WORD,
            b'A'..=b'Z' => WORD | UPPER,
            _ => 0,
        };
        b += 1;
    }
    t
};
const WORD: u8 = 1;
const UPPER: u8 = 2;
const OTHER: u8 = 4;

/// True for characters of scripts written without spaces between words.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x31F0..=0x31FF    // Katakana phonetic extensions
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0xFF66..=0xFF9F    // Halfwidth Katakana
        | 0x1100..=0x11FF    // Hangul Jamo
        | 0x3130..=0x318F    // Hangul compatibility Jamo
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0x20000..=0x2FA1F  // CJK extensions B..F, compatibility supplement
    )
}

/// Splits text into `(lowercase token, byte start, byte end)`.
pub fn tokens(text: &str) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    scan(text, &mut String::new(), |t, from, to| {
        let t = std::str::from_utf8(t).expect("tokens are whole characters");
        out.push((t.to_owned(), from, to));
    });
    out
}

/// Calls `f` with each token of `text` (lowercase, in UTF-8, always whole characters) and
/// its byte range in `text`. `buf` holds a token that is not a slice of the text (one that
/// needed lowercasing); pass the same one every time to allocate it once.
///
/// A function with a callback rather than an iterator, so the scan's position and state
/// stay in registers: this loop is where an index build spends most of its time.
pub fn scan(text: &str, buf: &mut String, mut f: impl FnMut(&[u8], usize, usize)) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let class = CLASSES[b as usize];
        if class == 0 {
            i += 1;
            continue;
        }
        if class & WORD != 0 {
            // A word: first its ASCII run, a byte at a time.
            let start = i;
            let mut seen = class;
            i += 1;
            while let Some(&b) = bytes.get(i) {
                let class = CLASSES[b as usize];
                if class & WORD == 0 {
                    break;
                }
                seen |= class;
                i += 1;
            }
            if bytes.get(i).is_some_and(|b| !b.is_ascii()) {
                i = word(text, start, i, buf, &mut f);
            } else if i - start <= MAX_TOKEN_BYTES {
                if seen & UPPER == 0 {
                    f(&bytes[start..i], start, i);
                } else {
                    buf.clear();
                    buf.push_str(&text[start..i]);
                    buf.make_ascii_lowercase();
                    f(buf.as_bytes(), start, i);
                }
            }
            continue;
        }
        let c = text[i..].chars().next().expect("a character starts here");
        if is_cjk(c) {
            i = cjk_run(text, i, &mut f);
        } else if c.is_alphanumeric() {
            i = word(text, i, i, buf, &mut f);
        } else {
            i += c.len_utf8();
        }
    }
}

/// A word that starts at `start`, is ASCII up to `ascii_end` and goes on in other
/// scripts: lowercased a character at a time. Returns where it ends.
fn word(
    text: &str,
    start: usize,
    ascii_end: usize,
    buf: &mut String,
    f: &mut impl FnMut(&[u8], usize, usize),
) -> usize {
    buf.clear();
    buf.push_str(&text[start..ascii_end]);
    buf.make_ascii_lowercase();
    let mut end = ascii_end;
    for c in text[ascii_end..].chars() {
        if !c.is_alphanumeric() || is_cjk(c) {
            break;
        }
        push_lower(buf, c);
        end += c.len_utf8();
    }
    if buf.len() <= MAX_TOKEN_BYTES {
        f(buf.as_bytes(), start, end);
    }
    end
}

/// The CJK run starting at `start`: each pair of neighbouring characters, or the one
/// character of a run of one. Returns where the run ends.
fn cjk_run(text: &str, start: usize, f: &mut impl FnMut(&[u8], usize, usize)) -> usize {
    let mut chars = text[start..].char_indices().map(|(at, c)| (start + at, c));
    let (_, first) = chars.next().expect("a run has a first character");
    let (mut prev, mut end) = (start, start + first.len_utf8());
    let mut pairs = 0;
    for (at, c) in chars {
        if !is_cjk(c) {
            break;
        }
        let next = at + c.len_utf8();
        f(&text.as_bytes()[prev..next], prev, next);
        pairs += 1;
        (prev, end) = (at, next);
    }
    if pairs == 0 {
        f(&text.as_bytes()[start..end], start, end);
    }
    end
}

fn push_lower(s: &mut String, c: char) {
    if c.is_ascii() {
        s.push(c.to_ascii_lowercase());
    } else {
        s.extend(c.to_lowercase());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(s: &str) -> Vec<String> {
        tokens(s).into_iter().map(|t| t.0).collect()
    }

    #[test]
    fn latin_words_are_lowercased_and_split() {
        assert_eq!(
            texts("ORA-01555: Snapshot too old"),
            ["ora", "01555", "snapshot", "too", "old"]
        );
        assert_eq!(texts("db-prod-01"), ["db", "prod", "01"]);
    }

    #[test]
    fn cjk_runs_become_bigrams() {
        assert_eq!(texts("死锁问题"), ["死锁", "锁问", "问题"]);
        assert_eq!(texts("锁"), ["锁"]);
        assert_eq!(
            texts("ERROR 1213 死锁：账单"),
            ["error", "1213", "死锁", "账单"]
        );
        assert_eq!(texts("文字化け"), ["文字", "字化", "化け"]);
        assert_eq!(texts("MySQLの文字"), ["mysql", "の文", "文字"]);
    }

    #[test]
    fn offsets_point_at_the_source() {
        let s = "a 死锁";
        for (text, from, to) in tokens(s) {
            assert_eq!(s[from..to].to_lowercase(), text);
        }
    }

    #[test]
    fn mixed_scripts_split_like_characters_do() {
        assert_eq!(texts("Café-ÉTÉ naïve"), ["café", "été", "naïve"]);
        assert_eq!(texts("abcДЕФ12 ÄÖ"), ["abcдеф12", "äö"]);
        assert_eq!(texts("x² ½"), ["x²", "½"]);
        assert_eq!(texts("db01死锁x"), ["db01", "死锁", "x"]);
        assert_eq!(texts("  ..,,  "), Vec::<String>::new());
        assert_eq!(texts("İstanbul"), ["i̇stanbul"]);
    }

    /// The byte-wise fast path cuts and lowercases exactly as the character rules do.
    #[test]
    fn fast_path_matches_the_character_rules() {
        let samples = [
            "ORA-01555 snapshot too old; Deadlock ÉTÉ 死锁问题 MySQLの文字化け x²",
            "kubectl drain --ignore-daemonsets node-7 Straße ΔΈΛΤΑ ﾊﾝｶｸ",
            "a\u{0301}b c\t\nd_e f.g 123abc ß",
            "lower UPPER MiXeD 9lives x 死 Zß 锁X",
        ];
        for s in samples {
            let mut expected = Vec::new();
            let mut word = String::new();
            let mut cjk: Vec<char> = Vec::new();
            let flush_cjk = |cjk: &mut Vec<char>, out: &mut Vec<String>| {
                if cjk.len() == 1 {
                    out.push(cjk[0].to_string());
                }
                for w in cjk.windows(2) {
                    out.push(w.iter().collect());
                }
                cjk.clear();
            };
            for c in s.chars() {
                if is_cjk(c) {
                    if !word.is_empty() {
                        expected.push(std::mem::take(&mut word));
                    }
                    cjk.push(c);
                } else {
                    flush_cjk(&mut cjk, &mut expected);
                    if c.is_alphanumeric() {
                        word.extend(c.to_lowercase());
                    } else if !word.is_empty() {
                        expected.push(std::mem::take(&mut word));
                    }
                }
            }
            flush_cjk(&mut cjk, &mut expected);
            if !word.is_empty() {
                expected.push(word);
            }
            assert_eq!(texts(s), expected, "{s:?}");
            for (text, from, to) in tokens(s) {
                assert_eq!(s[from..to].to_lowercase(), text, "{s:?}");
            }
        }
    }

    #[test]
    fn long_tokens_are_skipped() {
        let blob = "x".repeat(65);
        let upper = "Y".repeat(65);
        assert_eq!(
            texts(&format!("keep {blob} this {upper} and")),
            ["keep", "this", "and"]
        );
        assert_eq!(texts(&"z".repeat(64)), ["z".repeat(64)]);
    }
}
