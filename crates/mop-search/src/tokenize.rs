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
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if is_cjk(c) {
            let mut run: Vec<(usize, char)> = Vec::new();
            while let Some(&(i, c)) = chars.peek() {
                if !is_cjk(c) {
                    break;
                }
                run.push((i, c));
                chars.next();
            }
            let end_of = |k: usize| run[k].0 + run[k].1.len_utf8();
            if run.len() == 1 {
                out.push((run[0].1.to_string(), run[0].0, end_of(0)));
            }
            for k in 1..run.len() {
                let text: String = [run[k - 1].1, run[k].1].into_iter().collect();
                out.push((text, run[k - 1].0, end_of(k)));
            }
        } else if c.is_alphanumeric() {
            let mut word = String::new();
            let mut end = start;
            while let Some(&(i, c)) = chars.peek() {
                if !c.is_alphanumeric() || is_cjk(c) {
                    break;
                }
                word.extend(c.to_lowercase());
                end = i + c.len_utf8();
                chars.next();
            }
            if word.len() <= MAX_TOKEN_BYTES {
                out.push((word, start, end));
            }
        } else {
            chars.next();
        }
    }
    out
}

/// The tantivy face of [`tokens`].
#[derive(Clone, Default)]
pub struct MopTokenizer;

/// The token stream of [`MopTokenizer`].
pub struct MopTokenStream {
    tokens: Vec<Token>,
    next: usize,
}

impl Tokenizer for MopTokenizer {
    type TokenStream<'a> = MopTokenStream;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> MopTokenStream {
        let tokens = tokens(text)
            .into_iter()
            .enumerate()
            .map(|(position, (text, offset_from, offset_to))| Token {
                offset_from,
                offset_to,
                position,
                text,
                position_length: 1,
            })
            .collect();
        MopTokenStream { tokens, next: 0 }
    }
}

impl TokenStream for MopTokenStream {
    fn advance(&mut self) -> bool {
        self.next += 1;
        self.next <= self.tokens.len()
    }

    fn token(&self) -> &Token {
        &self.tokens[self.next - 1]
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.tokens[self.next - 1]
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
    fn long_tokens_are_skipped() {
        let blob = "x".repeat(65);
        assert_eq!(texts(&format!("keep {blob} this")), ["keep", "this"]);
    }
}
