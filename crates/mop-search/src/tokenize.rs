//! The one tokenizer used for indexing and querying: lowercase words for alphabetic
//! scripts, and overlapping character bigrams for Chinese, Japanese and Korean runs.
//!
//! Bigrams find CJK words without a dictionary (nothing to download, nothing to keep in
//! sync): `死锁问题` indexes as `死锁`, `锁问`, `问题`, and a query for `死锁` matches it.
//!
//! Tokenizing is most of an index build's work, so [`Tokens`] hands out one token at a
//! time without allocating: runs of ASCII letters and digits (most of any card) are cut
//! by a byte table, and when such a run has no capital letter the token is a slice of the
//! text itself; other characters are decoded one at a time into a reused buffer.

/// Tokens longer than this many bytes (base64 blobs, hashes) are skipped.
const MAX_TOKEN_BYTES: usize = 64;

/// What an ASCII byte is to the tokenizer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Ends a word: spaces, punctuation, control characters.
    Break,
    /// A lowercase letter or a digit.
    Lower,
    /// A capital letter.
    Upper,
    /// The first byte of a longer character (or a continuation byte).
    Other,
}

const CLASSES: [Class; 256] = {
    let mut t = [Class::Other; 256];
    let mut b = 0;
    while b < 128 {
        t[b] = match b as u8 {
            b'a'..=b'z' | b'0'..=b'9' => Class::Lower,
            b'A'..=b'Z' => Class::Upper,
            _ => Class::Break,
        };
        b += 1;
    }
    t
};

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
    let mut stream = Tokens::new(text);
    let mut out = Vec::new();
    while let Some((t, from, to)) = stream.next_token() {
        out.push((t.to_owned(), from, to));
    }
    out
}

/// The tokens of one text, one at a time (see the module comment).
pub struct Tokens<'a> {
    text: &'a str,
    /// Byte offset of the next character to read.
    pos: usize,
    /// The previous character of the CJK run being read, where it starts, and whether it
    /// was the run's first (a run of one character is a token of its own).
    cjk: Option<(usize, char, bool)>,
    /// The current token when it is not a slice of `text`.
    buf: String,
}

impl<'a> Tokens<'a> {
    /// The tokens of `text`.
    pub fn new(text: &'a str) -> Tokens<'a> {
        Tokens {
            text,
            pos: 0,
            cjk: None,
            buf: String::new(),
        }
    }

    /// The character at `pos`, if any.
    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    /// The next token, lowercase, with its byte range in the text.
    pub fn next_token(&mut self) -> Option<(&str, usize, usize)> {
        let bytes = self.text.as_bytes();
        loop {
            // Inside a CJK run: the next character makes a bigram with the previous one.
            if let Some((start, prev, first)) = self.cjk {
                match self.peek() {
                    Some(c) if is_cjk(c) => {
                        let i = self.pos;
                        self.pos += c.len_utf8();
                        self.cjk = Some((i, c, false));
                        return Some((&self.text[start..self.pos], start, self.pos));
                    }
                    _ => {
                        self.cjk = None;
                        if first {
                            let end = start + prev.len_utf8();
                            return Some((&self.text[start..end], start, end));
                        }
                    }
                }
            }
            let start = self.pos;
            let &b = bytes.get(start)?;
            match CLASSES[b as usize] {
                Class::Break => {
                    self.pos += 1;
                    continue;
                }
                Class::Lower | Class::Upper => {}
                Class::Other => {
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
            }
            // A word: first its ASCII run, byte by byte.
            let mut end = start;
            let mut upper = false;
            while let Some(&b) = bytes.get(end) {
                match CLASSES[b as usize] {
                    Class::Lower => {}
                    Class::Upper => upper = true,
                    Class::Break | Class::Other => break,
                }
                end += 1;
            }
            self.pos = end;
            let goes_on = bytes.get(end).is_some_and(|b| !b.is_ascii());
            if !goes_on && !upper {
                if end - start <= MAX_TOKEN_BYTES {
                    return Some((&self.text[start..end], start, end));
                }
                continue;
            }
            self.buf.clear();
            self.buf.push_str(&self.text[start..end]);
            self.buf.make_ascii_lowercase();
            if goes_on {
                // The word goes on in (or starts with) other scripts: a character at a time.
                while let Some(c) = self.peek() {
                    if !c.is_alphanumeric() || is_cjk(c) {
                        break;
                    }
                    push_lower(&mut self.buf, c);
                    self.pos += c.len_utf8();
                }
            }
            if self.buf.len() <= MAX_TOKEN_BYTES {
                return Some((self.buf.as_str(), start, self.pos));
            }
        }
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
