//! Error-code extraction and normalisation.
//!
//! A task's title, description and labels are scanned with a configurable list of patterns;
//! each match is rewritten to a canonical form by the pattern's format, so `ora-1555`,
//! `ORA-01555` and `ORA- 1555` all become `ORA-01555`. Card codes go through the same
//! rewriting, so a card and a task agree whatever spelling each used.

use std::collections::BTreeSet;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// One extraction pattern: a regular expression and the format its match is rewritten to.
///
/// In `format`, `{N}` is capture group N in upper case and `{N:0W}` is group N, a number,
/// zero-padded to W digits. Patterns carry their own flags (`(?i)` for case-insensitive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodePattern {
    /// A short name for messages (`oracle`, `postgres`, …).
    pub name: String,
    /// The regular expression (Rust `regex` syntax).
    pub regex: String,
    /// The canonical form, e.g. `{1}-{2:05}`.
    pub format: String,
}

impl CodePattern {
    fn new(name: &str, regex: &str, format: &str) -> Self {
        CodePattern {
            name: name.into(),
            regex: regex.into(),
            format: format.into(),
        }
    }
}

/// The built-in patterns: Oracle, PostgreSQL SQLSTATE (when marked as such), MySQL, and
/// HTTP 5xx status lines and phrases.
pub fn default_code_patterns() -> Vec<CodePattern> {
    // A SQLSTATE is five characters from [0-9A-Z] with at least one digit; spelling out
    // where the first digit sits keeps words like "could" from passing as codes.
    let sqlstate = "[0-9][0-9A-Z]{4}|[A-Z][0-9][0-9A-Z]{3}|[A-Z]{2}[0-9][0-9A-Z]{2}|[A-Z]{3}[0-9][0-9A-Z]|[A-Z]{4}[0-9]";
    vec![
        CodePattern::new(
            "oracle",
            r"(?i)\b(ORA|TNS|PLS)-\s?0*(\d{1,5})\b",
            "{1}-{2:05}",
        ),
        CodePattern::new(
            "postgres",
            &format!(r"(?i)\b(?:SQLSTATE|ERROR:)\s*[\[(=:]?\s*({sqlstate})\b"),
            "SQLSTATE {1}",
        ),
        CodePattern::new(
            "mysql",
            r"(?i)\b(?:ERROR|Error\s+Code:?)\s+(\d{4,5})\b",
            "ERROR {1}",
        ),
        CodePattern::new(
            "http-status",
            r"(?i)\bHTTP(?:/\d(?:\.\d)?)?\s*(5\d\d)\b",
            "HTTP {1}",
        ),
        CodePattern::new(
            "http-phrase",
            r"(?i)\b(5\d\d)\s+(?:Internal Server Error|Not Implemented|Bad Gateway|Service (?:Temporarily )?Unavailable|Gateway Time-?out|HTTP Version Not Supported|Insufficient Storage|Loop Detected|Network Authentication Required)\b",
            "HTTP {1}",
        ),
        CodePattern::new(
            "http-status-code",
            r"(?i)\bstatus(?:\s+code)?\s*[:=]?\s*(5\d\d)\b",
            "HTTP {1}",
        ),
    ]
}

/// Why a code pattern cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PatternError {
    /// The regular expression does not compile.
    #[error("error code pattern {name:?}: invalid regex: {source}")]
    Regex {
        /// The pattern's name.
        name: String,
        /// The compile error.
        source: regex::Error,
    },
    /// The format is malformed or names a group the regex lacks.
    #[error("error code pattern {name:?}: invalid format: {problem}")]
    Format {
        /// The pattern's name.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Debug, Clone)]
enum Piece {
    Literal(String),
    Group { index: usize, width: Option<usize> },
}

#[derive(Debug, Clone)]
struct Compiled {
    regex: Regex,
    format: Vec<Piece>,
}

/// Compiled patterns.
#[derive(Debug, Clone)]
pub struct CodeExtractor {
    patterns: Vec<Compiled>,
}

impl Default for CodeExtractor {
    fn default() -> Self {
        CodeExtractor::new(&default_code_patterns()).expect("built-in patterns compile")
    }
}

impl CodeExtractor {
    /// Compiles a pattern list.
    pub fn new(patterns: &[CodePattern]) -> Result<Self, PatternError> {
        let patterns = patterns
            .iter()
            .map(|p| {
                let regex = Regex::new(&p.regex).map_err(|source| PatternError::Regex {
                    name: p.name.clone(),
                    source,
                })?;
                let format = parse_format(&p.format, regex.captures_len()).map_err(|problem| {
                    PatternError::Format {
                        name: p.name.clone(),
                        problem,
                    }
                })?;
                Ok(Compiled { regex, format })
            })
            .collect::<Result<_, _>>()?;
        Ok(CodeExtractor { patterns })
    }

    /// Every canonical code found in `text`, added to `out`.
    pub fn extract_into(&self, text: &str, out: &mut BTreeSet<String>) {
        for p in &self.patterns {
            for caps in p.regex.captures_iter(text) {
                out.insert(render(&p.format, &caps));
            }
        }
    }

    /// Every canonical code found in `text`.
    pub fn extract(&self, text: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        self.extract_into(text, &mut out);
        out
    }

    /// The canonical form of a code as a card spells it: the earliest pattern match, or,
    /// when no pattern matches, the code in upper case with inner whitespace collapsed.
    pub fn normalize(&self, code: &str) -> String {
        let mut best: Option<(usize, String)> = None;
        for p in &self.patterns {
            if let Some(caps) = p.regex.captures(code) {
                let start = caps.get(0).map_or(0, |m| m.start());
                if best.as_ref().is_none_or(|(s, _)| start < *s) {
                    best = Some((start, render(&p.format, &caps)));
                }
            }
        }
        best.map_or_else(|| collapse_upper(code), |(_, c)| c)
    }
}

/// Upper case, whitespace trimmed and inner runs collapsed to one space.
pub fn collapse_upper(s: &str) -> String {
    s.split_whitespace()
        .map(str::to_uppercase)
        .collect::<Vec<_>>()
        .join(" ")
}

fn render(format: &[Piece], caps: &regex::Captures<'_>) -> String {
    let mut out = String::new();
    for piece in format {
        match piece {
            Piece::Literal(s) => out.push_str(s),
            Piece::Group { index, width } => {
                let text = caps.get(*index).map_or("", |m| m.as_str());
                match width {
                    Some(w) if text.bytes().all(|b| b.is_ascii_digit()) => {
                        let digits = text.trim_start_matches('0');
                        let digits = if digits.is_empty() { "0" } else { digits };
                        out.push_str(&format!("{digits:0>w$}"));
                    }
                    _ => out.push_str(&collapse_upper(text)),
                }
            }
        }
    }
    out
}

fn parse_format(format: &str, groups: usize) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = format;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Literal(rest[..open].to_owned()));
        }
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| format!("unclosed '{{' in {format:?}"))?
            + open;
        let spec = &rest[open + 1..close];
        let (index, width) = match spec.split_once(":0") {
            Some((i, w)) => (i, Some(w)),
            None => (spec, None),
        };
        let index: usize = index
            .parse()
            .map_err(|_| format!("{{{spec}}} must be {{N}} or {{N:0W}} with numbers N and W"))?;
        let width = width
            .map(|w| {
                w.parse::<usize>()
                    .map_err(|_| format!("{{{spec}}}: width must be a number"))
            })
            .transpose()?;
        if index == 0 || index >= groups {
            return Err(format!(
                "{{{index}}} names a capture group the regex does not have"
            ));
        }
        pieces.push(Piece::Group { index, width });
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Literal(rest.to_owned()));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(text: &str) -> Vec<String> {
        CodeExtractor::default().extract(text).into_iter().collect()
    }

    #[test]
    fn oracle_codes_are_padded_and_upper_cased() {
        assert_eq!(codes("nightly ETL fails with ora-1555"), ["ORA-01555"]);
        assert_eq!(codes("ORA-01555: snapshot too old"), ["ORA-01555"]);
        assert_eq!(
            codes("ORA-00060 deadlock, then TNS-12514"),
            ["ORA-00060", "TNS-12514"]
        );
        assert_eq!(codes("pls-00201 identifier"), ["PLS-00201"]);
    }

    #[test]
    fn postgres_sqlstate_only_when_marked() {
        assert_eq!(
            codes("ERROR:  42P01: relation \"orders\" does not exist"),
            ["SQLSTATE 42P01"]
        );
        assert_eq!(codes("failed with SQLSTATE 40001"), ["SQLSTATE 40001"]);
        assert_eq!(
            codes("sqlstate[53300] too many clients"),
            ["SQLSTATE 53300"]
        );
        // An unmarked five-character token is not a code, nor is a plain word after ERROR:.
        assert!(codes("table 42P01 appears").is_empty());
        assert!(codes("ERROR: could not connect").is_empty());
    }

    #[test]
    fn mysql_and_http() {
        assert_eq!(
            codes("ERROR 1205 (HY000): Lock wait timeout"),
            ["ERROR 1205"]
        );
        assert_eq!(codes("Error Code: 1213. Deadlock found"), ["ERROR 1213"]);
        assert_eq!(codes("gateway answers HTTP 502"), ["HTTP 502"]);
        assert_eq!(codes("HTTP/1.1 503 Service Unavailable"), ["HTTP 503"]);
        assert_eq!(codes("upstream returned 504 Gateway Timeout"), ["HTTP 504"]);
        assert_eq!(codes("status code 500 from api"), ["HTTP 500"]);
        assert!(codes("HTTP 404 not found").is_empty());
        assert!(codes("took 503 ms").is_empty());
    }

    #[test]
    fn normalisation_makes_spellings_equal() {
        let x = CodeExtractor::default();
        assert_eq!(x.normalize("ora-1555"), "ORA-01555");
        assert_eq!(x.normalize("ORA-01555"), "ORA-01555");
        assert_eq!(x.normalize("SQLSTATE 42P01"), "SQLSTATE 42P01");
        assert_eq!(x.normalize("ERROR: 42p01"), "SQLSTATE 42P01");
        assert_eq!(x.normalize("error 1205"), "ERROR 1205");
        assert_eq!(x.normalize("  custom   code\tX1 "), "CUSTOM CODE X1");
    }

    #[test]
    fn custom_patterns_and_bad_formats() {
        let x = CodeExtractor::new(&[CodePattern::new(
            "mssql",
            r"(?i)\bMsg\s+(\d+)",
            "MSSQL-{1:06}",
        )])
        .unwrap();
        assert_eq!(
            x.extract("Msg 1205, Level 13")
                .into_iter()
                .collect::<Vec<_>>(),
            ["MSSQL-001205"]
        );
        assert!(
            codes_of(&x, "ORA-1555").is_empty(),
            "custom list replaces the defaults"
        );

        let err = CodeExtractor::new(&[CodePattern::new("bad", "(", "{1}")]).unwrap_err();
        assert!(err.to_string().contains("\"bad\""), "{err}");
        let err = CodeExtractor::new(&[CodePattern::new("x", r"(\d)", "{2}")]).unwrap_err();
        assert!(err.to_string().contains("capture group"), "{err}");
        let err = CodeExtractor::new(&[CodePattern::new("x", r"(\d)", "{1")]).unwrap_err();
        assert!(err.to_string().contains("unclosed"), "{err}");
    }

    fn codes_of(x: &CodeExtractor, text: &str) -> Vec<String> {
        x.extract(text).into_iter().collect()
    }
}
