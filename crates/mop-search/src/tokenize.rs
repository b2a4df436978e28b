//! The one tokenizer used for indexing and querying: lowercase words for alphabetic
//! scripts, and overlapping character bigrams for Chinese, Japanese and Korean runs.
//!
//! Bigrams find CJK words without a dictionary (nothing to download, nothing to keep in
//! sync): `死锁问题` indexes as `死锁`, `锁问`, `问题`, and a query for `死锁` matches it.

use tantivy::tokenizer::{Token, TokenStream, Tokenizer};

/// Tokens longer than this many bytes (base64 blobs, hashes) are skipped.
const MAX_TOKEN_BYTES: usize = 64;

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
    let mut stream = MopTokenStream::new(text);
    let mut out = Vec::new();
    while stream.advance() {
        let t = stream.token();
        out.push((t.text.clone(), t.offset_from, t.offset_to));
    }
    out
}

/// The tantivy face of [`tokens`].
#[derive(Clone, Default)]
pub struct MopTokenizer;

/// The token stream of [`MopTokenizer`]: one token at a time in a reused buffer, since
/// tokenizing is a third of an index build and allocating per token was most of that.
/// Runs of ASCII letters and digits (most of any card) are cut and lowercased as bytes;
/// other characters are decoded one at a time.
pub struct MopTokenStream<'a> {
    text: &'a str,
    /// Byte offset of the next character to read.
    pos: usize,
    /// The previous character of the CJK run being read, and whether it was the run's
    /// first (a run of one character is a token of its own).
    cjk: Option<(usize, char, bool)>,
    token: Token,
    emitted: usize,
}

impl<'a> MopTokenStream<'a> {
    fn new(text: &'a str) -> MopTokenStream<'a> {
        MopTokenStream {
            text,
            pos: 0,
            cjk: None,
            token: Token::default(),
            emitted: 0,
        }
    }

    /// The character at `pos`, if any.
    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn emit(&mut self, from: usize, to: usize) -> bool {
        self.token.offset_from = from;
        self.token.offset_to = to;
        self.token.position = self.emitted;
        self.token.position_length = 1;
        self.emitted += 1;
        true
    }

    /// Reads the word starting at `pos` (its first character is alphanumeric, not CJK)
    /// into the token; returns where it ends.
    fn word(&mut self) -> usize {
        let bytes = self.text.as_bytes();
        let start = self.pos;
        let mut end = start;
        while end < bytes.len() && bytes[end].is_ascii_alphanumeric() {
            end += 1;
        }
        self.token.text.clear();
        self.token.text.push_str(&self.text[start..end]);
        self.token.text.make_ascii_lowercase();
        self.pos = end;
        if end < bytes.len() && !bytes[end].is_ascii() {
            // The word goes on in (or starts with) other scripts: one character at a time.
            while let Some(c) = self.peek() {
                if !c.is_alphanumeric() || is_cjk(c) {
                    break;
                }
                push_lower(&mut self.token.text, c);
                self.pos += c.len_utf8();
            }
        }
        self.pos
    }
}

impl Tokenizer for MopTokenizer {
    type TokenStream<'a> = MopTokenStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> MopTokenStream<'a> {
        MopTokenStream::new(text)
    }
}

impl TokenStream for MopTokenStream<'_> {
    fn advance(&mut self) -> bool {
        loop {
            // Inside a CJK run: the next character makes a bigram with the previous one.
            if let Some((start, prev, first)) = self.cjk {
                match self.peek() {
                    Some(c) if is_cjk(c) => {
                        let i = self.pos;
                        self.pos += c.len_utf8();
                        self.cjk = Some((i, c, false));
                        self.token.text.clear();
                        self.token.text.push(prev);
                        self.token.text.push(c);
                        return self.emit(start, self.pos);
                    }
                    _ => {
                        self.cjk = None;
                        if first {
                            self.token.text.clear();
                            self.token.text.push(prev);
                            return self.emit(start, start + prev.len_utf8());
                        }
                    }
                }
            }
            let start = self.pos;
            let Some(&b) = self.text.as_bytes().get(start) else {
                return false;
            };
            if b.is_ascii() {
                if !b.is_ascii_alphanumeric() {
                    self.pos += 1;
                    continue;
                }
            } else {
                let c = self.peek().expect("a character starts here");
                if is_cjk(c) {
                    self.pos += c.len_utf8();
                    self.cjk = Some((start, c, true));
                    continue;
                }
                if !c.is_alphanumeric() {
                    self.pos += c.len_utf8();
                    continue;
                }
            }
            let end = self.word();
            if self.token.text.len() <= MAX_TOKEN_BYTES {
                return self.emit(start, end);
            }
        }
    }

    fn token(&self) -> &Token {
        &self.token
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.token
    }
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
        assert_eq!(texts(&format!("keep {blob} this")), ["keep", "this"]);
    }
}
