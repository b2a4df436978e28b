//! Credential screening: does a text carry a credential, of what kind, and where?
//!
//! The rules are data. Most come from gitleaks v8.30.1 (`rules/gitleaks-v8.30.1.json`,
//! as the crates.io package keyspoor 0.1.4 ships them for Rust's regex engine; `rules/NOTICE`
//! has the provenance and licences): cloud keys, VCS, chat and payment tokens, private key
//! blocks, JWTs, generic `key = value` assignments with an entropy floor. mop adds the
//! kinds gitleaks has no rule for (`rules/mop.toml`): a password in a URL, and a
//! high-entropy value assigned to a password or secret key in any syntax.
//!
//! A rule is run as gitleaks runs it on a string: only when one of its keywords is in the
//! text (any case); each match's secret is its capture group (the rule's, else the first
//! non-empty one, else the whole match); a rule with an entropy floor needs a secret whose
//! Shannon entropy is above it (and, for the generic rules, a digit); an allowlist group
//! that matches the secret, the match or its line excuses it. Rules bound to a file name
//! (four of gitleaks', for `.php`, `.tf`, `.yaml` and `nuget.config` files) are not run:
//! cards have no file names. On top of the data, a generic finding whose secret is an
//! identifier everybody writes down (a UUID, a sha256 or git object id, base64 of plain
//! text, a version) is dropped.
//!
//! A [`Finding`] names the rule (the kind of credential) and where the secret starts
//! (field, line and column, 1-based, columns in characters). Never the value: nothing
//! here returns or logs it.

use std::collections::HashMap;
use std::sync::OnceLock;

use aho_corasick::AhoCorasick;
use regex::bytes::{Regex, RegexBuilder};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The gitleaks rules, as data.
const GITLEAKS: &str = include_str!("../rules/gitleaks-v8.30.1.json");
/// mop's own rules, as data.
const MOP_RULES: &str = include_str!("../rules/mop.toml");

/// Where the rules come from, as `--help`, logs and README name it.
pub const RULES_SOURCE: &str =
    "gitleaks v8.30.1 (commit 83d9cd68, via keyspoor 0.1.4) and mop's own rules";

/// A credential found in a text: its kind and where it starts. Never its value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Finding {
    /// The field the text was (`title`, `body`, …).
    pub field: String,
    /// Line in the field, from 1.
    pub line: u32,
    /// Column in that line, in characters, from 1.
    pub column: u32,
    /// The kind: the id of the rule that found it (`aws-access-token`, `private-key`,
    /// `github-pat`, `url-password`, …).
    pub kind: String,
}

#[derive(Deserialize)]
struct RuleFile {
    rules: Vec<RuleSpec>,
}

#[derive(Deserialize)]
struct RuleSpec {
    id: String,
    pattern: String,
    #[serde(default)]
    secret_group: Option<usize>,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default)]
    min_entropy: f64,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    allowlist: Vec<GroupSpec>,
}

#[derive(Deserialize)]
struct GroupSpec {
    #[serde(default)]
    condition: Option<String>,
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    regexes: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    stopwords: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Secret,
    Match,
    Line,
}

struct Group {
    all: bool,
    target: Target,
    regexes: Vec<Regex>,
    /// The stopwords, any case: one automaton, so a group of a thousand costs one pass.
    stopwords: Option<AhoCorasick>,
    /// The group names file paths: a text has none, so that category never matches.
    has_paths: bool,
}

impl Group {
    /// Whether the group excuses a match; `line` gives the match's line when a regex of
    /// the group looks at lines (its answer is the same for every match of one line, so
    /// the caller keeps it).
    fn excuses(&self, secret: &[u8], whole: &[u8], line: &mut dyn FnMut(&Group) -> bool) -> bool {
        let mut results = [None; 3];
        if !self.regexes.is_empty() {
            results[0] = Some(match self.target {
                Target::Secret => self.regexes.iter().any(|r| r.is_match(secret)),
                Target::Match => self.regexes.iter().any(|r| r.is_match(whole)),
                Target::Line => line(self),
            });
        }
        if let Some(words) = &self.stopwords {
            results[1] = Some(words.is_match(secret));
        }
        if self.has_paths {
            results[2] = Some(false);
        }
        let mut given = results.iter().flatten();
        if self.all {
            results.iter().any(Option::is_some) && given.all(|r| *r)
        } else {
            given.any(|r| *r)
        }
    }

    fn excuses_line(&self, line: &[u8]) -> bool {
        self.regexes.iter().any(|r| r.is_match(line))
    }
}

/// Where each line of a text starts, for positions in O(log n).
struct Lines(Vec<usize>);

impl Lines {
    fn of(text: &[u8]) -> Lines {
        let mut starts = vec![0];
        starts.extend(
            text.iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i + 1),
        );
        Lines(starts)
    }

    /// The 0-based line of byte `at`.
    fn index(&self, at: usize) -> usize {
        self.0.partition_point(|s| *s <= at) - 1
    }

    /// The bytes of line `i`, without its newline.
    fn get<'t>(&self, text: &'t [u8], i: usize) -> &'t [u8] {
        let end = self.0.get(i + 1).map_or(text.len(), |n| n - 1);
        &text[self.0[i]..end]
    }

    /// 1-based line and character column of byte `at`.
    fn position(&self, text: &str, at: usize) -> (u32, u32) {
        let i = self.index(at);
        let column = text[self.0[i]..at].chars().count() + 1;
        (i as u32 + 1, column as u32)
    }
}

/// Credentials found per text at most: past them the text is refused on what was found
/// already (one is reason enough), and a text of thousands of them cannot make the screen
/// slow. Near-misses (matches a look-alike filter excuses) do not count: a text padded with
/// them must not hide a credential after them. Their number is bounded by the text's
/// length (a card body is at most 64 KiB).
const MAX_HITS: usize = 64;

struct Rule {
    id: String,
    re: Regex,
    secret_group: Option<usize>,
    min_entropy: f64,
    /// A rule for any `name = value` rather than one provider's format: its secrets need a
    /// digit and pass the identifier filter.
    generic: bool,
    /// Which rule names a position several find, lowest first: a provider's format, then
    /// mop's own, then gitleaks' generic ones.
    rank: u8,
    allow: Vec<Group>,
}

/// The compiled rule set.
pub struct Screen {
    rules: Vec<Rule>,
    keywords: AhoCorasick,
    /// For each keyword pattern, the rules it wakes.
    keyword_rules: Vec<Vec<usize>>,
    /// Rules with no keyword: always run.
    always: Vec<usize>,
}

/// A short hash of the rule data (without compiling it): results stored under another
/// one were made by other rules and are made again.
pub fn rules_fingerprint() -> &'static str {
    static FINGERPRINT: OnceLock<String> = OnceLock::new();
    FINGERPRINT.get_or_init(|| {
        let mut h = Sha256::new();
        h.update(GITLEAKS.as_bytes());
        h.update(MOP_RULES.as_bytes());
        format!("{:x}", h.finalize())[..16].to_owned()
    })
}

/// Why a rule file cannot be used (a build with broken rule data; tests catch it).
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The file does not parse.
    #[error("rule file {file}: {message}")]
    File {
        /// Which file.
        file: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A pattern does not compile.
    #[error("rule {id} in {file}: {message}")]
    Pattern {
        /// Which file.
        file: &'static str,
        /// The rule.
        id: String,
        /// What is wrong.
        message: String,
    },
}

fn compile(pattern: &str, file: &'static str, id: &str) -> Result<Regex, RulesError> {
    // ASCII classes, as gitleaks' RE2 patterns mean them for credentials; Unicode-wide \w
    // would make three of them too large to compile.
    RegexBuilder::new(pattern)
        .unicode(false)
        .size_limit(64 << 20)
        .build()
        .map_err(|e| RulesError::Pattern {
            file,
            id: id.to_owned(),
            message: e.to_string(),
        })
}

impl Screen {
    /// The built-in rule set, compiled once (about 230 patterns; the first call takes a
    /// moment, so servers call it at start).
    pub fn builtin() -> &'static Screen {
        static SCREEN: OnceLock<Screen> = OnceLock::new();
        SCREEN.get_or_init(|| Screen::from_data().expect("the built-in credential rules compile"))
    }

    fn from_data() -> Result<Screen, RulesError> {
        let gitleaks: RuleFile = serde_json::from_str(GITLEAKS).map_err(|e| RulesError::File {
            file: "gitleaks-v8.30.1.json",
            message: e.to_string(),
        })?;
        let own: RuleFile = toml::from_str(MOP_RULES).map_err(|e| RulesError::File {
            file: "mop.toml",
            message: e.to_string(),
        })?;
        let mut rules = Vec::new();
        let mut keyword_list: Vec<String> = Vec::new();
        let mut keyword_rules: Vec<Vec<usize>> = Vec::new();
        let mut always = Vec::new();
        for (file, spec) in gitleaks
            .rules
            .into_iter()
            .map(|r| ("gitleaks-v8.30.1.json", r))
            .chain(own.rules.into_iter().map(|r| ("mop.toml", r)))
        {
            if spec.path.is_some() {
                continue;
            }
            let allow = spec
                .allowlist
                .iter()
                .map(|g| {
                    Ok(Group {
                        all: g.condition.as_deref() == Some("and"),
                        target: match g.target.as_deref() {
                            Some("match") => Target::Match,
                            Some("line") => Target::Line,
                            _ => Target::Secret,
                        },
                        regexes: g
                            .regexes
                            .iter()
                            .map(|r| compile(r, file, &spec.id))
                            .collect::<Result<_, _>>()?,
                        stopwords: (!g.stopwords.is_empty())
                            .then(|| {
                                AhoCorasick::builder()
                                    .ascii_case_insensitive(true)
                                    .build(&g.stopwords)
                            })
                            .transpose()
                            .map_err(|e| RulesError::Pattern {
                                file,
                                id: spec.id.clone(),
                                message: e.to_string(),
                            })?,
                        has_paths: !g.paths.is_empty(),
                    })
                })
                .collect::<Result<Vec<_>, RulesError>>()?;
            let index = rules.len();
            rules.push(Rule {
                generic: spec.id.starts_with("generic") || spec.id == "credential-assignment",
                rank: if spec.id.starts_with("generic") {
                    2
                } else {
                    u8::from(file == "mop.toml")
                },
                re: compile(&spec.pattern, file, &spec.id)?,
                id: spec.id,
                secret_group: spec.secret_group.filter(|g| *g > 0),
                min_entropy: spec.min_entropy,
                allow,
            });
            if spec.keywords.is_empty() {
                always.push(index);
            }
            for k in spec.keywords {
                let k = k.to_ascii_lowercase();
                match keyword_list.iter().position(|x| *x == k) {
                    Some(i) => keyword_rules[i].push(index),
                    None => {
                        keyword_list.push(k);
                        keyword_rules.push(vec![index]);
                    }
                }
            }
        }
        let keywords = AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(&keyword_list)
            .map_err(|e| RulesError::File {
                file: "keywords",
                message: e.to_string(),
            })?;
        Ok(Screen {
            rules,
            keywords,
            keyword_rules,
            always,
        })
    }

    /// How many rules run.
    pub fn rules(&self) -> usize {
        self.rules.len()
    }

    /// The credentials in `text`, the value of `field`, in order of position; one finding
    /// per position (a provider's rule wins over a generic one).
    pub fn scan(&self, field: &str, text: &str) -> Vec<Finding> {
        let found = self.scan_exactly(field, text);
        if !found.is_empty() {
            return found;
        }
        // A credential broken up by invisible characters, or written in fullwidth or
        // other compatibility forms, is still one: look again at the text as it reads
        // (positions are then in that text).
        let plain = readable(text);
        if plain != text {
            return self.scan_exactly(field, &plain);
        }
        found
    }

    fn scan_exactly(&self, field: &str, text: &str) -> Vec<Finding> {
        let bytes = text.as_bytes();
        let lines = Lines::of(bytes);
        // Line-target allowlist answers, by (rule, group, line).
        let mut by_line: HashMap<(usize, usize, usize), bool> = HashMap::new();
        let mut woken = vec![false; self.rules.len()];
        for i in &self.always {
            woken[*i] = true;
        }
        for m in self.keywords.find_overlapping_iter(bytes) {
            for r in &self.keyword_rules[m.pattern().as_usize()] {
                woken[*r] = true;
            }
        }
        // (start of the secret, rank, rule)
        let mut hits: Vec<(usize, u8, usize)> = Vec::new();
        'rules: for (index, rule) in self.rules.iter().enumerate() {
            if !woken[index] {
                continue;
            }
            for caps in rule.re.captures_iter(bytes) {
                let whole = caps.get(0).expect("group 0 is the match");
                let secret = match rule.secret_group {
                    Some(g) => caps.get(g),
                    None => caps.iter().skip(1).flatten().find(|m| !m.is_empty()),
                }
                .unwrap_or(whole);
                let line = lines.index(whole.start());
                let mut line_check = |g: &Group| {
                    let key = (index, std::ptr::from_ref(g) as usize, line);
                    *by_line
                        .entry(key)
                        .or_insert_with(|| g.excuses_line(lines.get(bytes, line)))
                };
                if excused(rule, secret.as_bytes(), whole.as_bytes(), &mut line_check) {
                    continue;
                }
                hits.push((secret.start(), rule.rank, index));
                if hits.len() >= MAX_HITS {
                    break 'rules;
                }
            }
        }
        hits.sort();
        let mut out: Vec<Finding> = Vec::new();
        let mut last_start = None;
        for (start, _, index) in hits {
            if last_start == Some(start) {
                continue;
            }
            last_start = Some(start);
            let (line, column) = lines.position(text, start);
            out.push(Finding {
                field: field.to_owned(),
                line,
                column,
                kind: self.rules[index].id.clone(),
            });
        }
        out
    }

    /// The credentials in a card's fields: each `(field, text)` scanned on its own.
    pub fn scan_fields<'a>(
        &self,
        fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Vec<Finding> {
        fields
            .into_iter()
            .flat_map(|(field, text)| self.scan(field, text))
            .collect()
    }

    /// The credentials in an OKF card file, each placed in the card's terms: a
    /// frontmatter line is the field its key names (`title`, `description`, …, line 1),
    /// the body is `body` with lines counted from its first.
    pub fn scan_card_file(&self, raw: &str) -> Vec<Finding> {
        let body_start = body_line(raw);
        let lines: Vec<&str> = raw.lines().collect();
        self.scan("card", raw)
            .into_iter()
            .map(|f| match body_start {
                Some(b) if f.line >= b => Finding {
                    field: "body".into(),
                    line: f.line - b + 1,
                    ..f
                },
                _ => {
                    let key = frontmatter_key(&lines, f.line);
                    Finding {
                        field: key.unwrap_or_else(|| "frontmatter".into()),
                        ..f
                    }
                }
            })
            .collect()
    }
}

/// Whether the rule's entropy floor, digit rule, allowlists or the identifier filter
/// excuse a match.
fn excused(rule: &Rule, secret: &[u8], whole: &[u8], line: &mut dyn FnMut(&Group) -> bool) -> bool {
    if rule.min_entropy > 0.0 && entropy(secret) <= rule.min_entropy {
        return true;
    }
    if rule.generic && !secret.iter().any(u8::is_ascii_digit) {
        return true;
    }
    if rule.allow.iter().any(|g| g.excuses(secret, whole, line)) {
        return true;
    }
    rule.generic && is_plain_identifier(secret)
}

/// The text as a reader sees it: invisible characters (zero-width, soft hyphens, controls
/// other than line breaks and tabs) dropped, compatibility forms (fullwidth letters and
/// the like) folded by NFKC.
fn readable(text: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    text.chars()
        .filter(|&c| {
            matches!(c, '\n' | '\t')
                || !(mop_cards::is_hidden_char(c) || mop_cards::is_default_ignorable(c))
        })
        .nfkc()
        .collect()
}

/// The 1-based line of a card file's body (after the closing `---`), if it has one.
fn body_line(raw: &str) -> Option<u32> {
    let mut lines = raw.lines().enumerate();
    let (_, first) = lines.next()?;
    if first.trim_end() != "---" {
        return None;
    }
    lines
        .find(|(_, l)| l.trim_end() == "---")
        .map(|(i, _)| i as u32 + 2)
}

/// The top-level frontmatter key a line belongs to (the nearest unindented `key:` at or
/// above it).
fn frontmatter_key(lines: &[&str], line: u32) -> Option<String> {
    lines[..(line as usize).min(lines.len())]
        .iter()
        .rev()
        .find_map(|l| {
            let (key, _) = l.split_once(':')?;
            // Trimmed first: a key of only other whitespace (a vertical tab) names nothing.
            let name = key.trim();
            (!key.starts_with([' ', '\t', '-', '#']) && !name.is_empty()).then(|| name.to_owned())
        })
}

/// Shannon entropy in bits per byte, as gitleaks computes it.
fn entropy(s: &[u8]) -> f64 {
    if s.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for b in s {
        counts[*b as usize] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

/// Identifiers people write down that only look random: a UUID, a hex digest of a hash
/// (sha1/git object id, sha256), base64 of plain text, a version.
fn is_plain_identifier(s: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(s) else {
        return false;
    };
    let hex = |n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if hex(40) || hex(64) || is_uuid(s) {
        return true;
    }
    if s.bytes()
        .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-')
        || regex_version(s)
    {
        return true;
    }
    base64_of_text(s)
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// `v1.2.3`, `1.0.219-rc.1`: digits and dots after an optional `v`, with at least two dots.
fn regex_version(s: &str) -> bool {
    let core = s.strip_prefix('v').unwrap_or(s);
    let core = core.split(['-', '+']).next().unwrap_or(core);
    core.matches('.').count() >= 2 && core.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// Base64 (standard or URL alphabet) whose bytes are UTF-8 text with spaces: a note, not
/// a key.
fn base64_of_text(s: &str) -> bool {
    use base64::Engine;
    let trimmed = s.trim_end_matches('=');
    if trimmed.len() < 16 {
        return false;
    }
    let engines = [
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    engines.iter().any(|e| {
        e.decode(trimmed).ok().is_some_and(|bytes| {
            std::str::from_utf8(&bytes).is_ok_and(|t| {
                let printable = t
                    .chars()
                    .filter(|c| {
                        c.is_alphanumeric() || c.is_whitespace() || c.is_ascii_punctuation()
                    })
                    .count();
                t.contains(' ') && printable * 10 >= t.chars().count() * 9
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_compiles_and_the_data_is_what_readme_names() {
        let s = Screen::builtin();
        // 221 gitleaks rules less the 4 bound to file names, and mop's 2.
        assert_eq!(s.rules(), 219);
        let sha = format!("{:x}", Sha256::digest(GITLEAKS.as_bytes()));
        assert_eq!(
            sha, "5c5323a02c4f00f70fc5e48d219ad6728778a83d011e303579eb6e6d9d07ee1b",
            "rules/gitleaks-v8.30.1.json changed: update RULES_SOURCE, rules/NOTICE and README"
        );
    }

    #[test]
    fn a_finding_names_kind_and_place_never_the_value() {
        let s = Screen::builtin();
        let key = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
        let text = format!("Use the bot.\n  token {key} here\n");
        let found = s.scan("body", &text);
        assert_eq!(
            found,
            vec![Finding {
                field: "body".into(),
                line: 2,
                column: 9,
                kind: "github-pat".into()
            }]
        );
        assert!(!format!("{found:?}").contains(key));
    }

    #[test]
    fn card_files_place_findings_in_fields() {
        let s = Screen::builtin();
        let raw = "---\nid: 00000000-0000-4000-8000-000000000001\ntype: fact\ntitle: key AKIAZ7QRLWXN3BJ4VTDC\n---\nline one\npostgres://app:s3cr3tPassw0rd@db.internal/prod\n";
        let mut found = s.scan_card_file(raw);
        found.sort();
        let places: Vec<(&str, u32, &str)> = found
            .iter()
            .map(|f| (f.field.as_str(), f.line, f.kind.as_str()))
            .collect();
        assert_eq!(
            places,
            [
                ("body", 2, "url-password"),
                ("title", 4, "aws-access-token")
            ]
        );
    }

    #[test]
    fn identifiers_that_look_random_pass() {
        let s = Screen::builtin();
        for text in [
            "card 1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7 and token_id = 1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7",
            "cache key: 0f5a1f6f3c6a9e2b7c1d4e8f0a3b6c9d2e5f8a1b4c7d0e3f6a9b2c5d8e1f4a7b",
            "token: 3b18e512dba79e4c8300dd08aeb37f8e728b8dad",
            "secret_note: cmVtZW1iZXIgdG8gd2F0ZXIgdGhlIHBsYW50cyBvbiBmcmlkYXk=",
            "api_version: 1.0.219-rc.1",
        ] {
            assert_eq!(s.scan("body", text), vec![], "{text}");
        }
    }

    #[test]
    fn a_credential_hidden_by_invisible_or_fullwidth_characters_is_still_found() {
        let s = Screen::builtin();
        let token = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
        let broken = format!("token ghp_\u{200B}{}", &token[4..]);
        let found = s.scan("body", &broken);
        assert_eq!(found.len(), 1, "{broken:?}");
        assert_eq!(found[0].kind, "github-pat");
        let fullwidth: String = format!("key {token}")
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' => {
                    char::from_u32(c as u32 - 0x21 + 0xFF01).unwrap()
                }
                other => other,
            })
            .collect();
        assert_eq!(s.scan("body", &fullwidth).len(), 1, "{fullwidth}");
        // Every invisible character Unicode calls default-ignorable, not only the usual
        // zero-width ones: a combining grapheme joiner, a variation selector, a Mongolian
        // free variation selector, a musical format control, a Hangul filler.
        for c in [
            '\u{034F}',
            '\u{FE0F}',
            '\u{E0100}',
            '\u{180B}',
            '\u{1D173}',
            '\u{3164}',
        ] {
            let split = format!("token {}{c}{}", &token[..24], &token[24..]);
            let found = s.scan("body", &split);
            assert!(
                found.iter().any(|f| f.kind == "github-pat"),
                "U+{:04X}: {found:?}",
                c as u32
            );
        }
        // The control: plain prose with a zero-width space is not a credential.
        assert!(s.scan("body", "deploy\u{200B}ment notes").is_empty());
    }

    #[test]
    fn near_misses_before_a_credential_do_not_hide_it() {
        let s = Screen::builtin();
        let token = format!("ghp_{}", "x7Qm2Lp9Rk4Tz8Vb3Nw6Hc1Jd5Fg0Ys2Ae7U");
        for decoy in [
            "api_key = aaaaaaaaaaaa",
            "password = changeme",
            "AKIAIOSFODNN7EXAMPLE",
        ] {
            let mut text: String = (0..500).map(|_| format!("{decoy}\n")).collect();
            text.push_str(&format!("token {token}\n"));
            let found = s.scan("body", &text);
            assert!(
                found
                    .iter()
                    .any(|f| f.kind == "github-pat" && f.line == 501),
                "{decoy}: {found:?}"
            );
            // The control: the decoys alone are no credential.
            let alone: String = (0..500).map(|_| format!("{decoy}\n")).collect();
            assert!(s.scan("body", &alone).is_empty(), "{decoy}");
        }
    }

    #[test]
    fn a_text_of_many_matches_is_looked_at_up_to_the_cap() {
        let s = Screen::builtin();
        let alnum = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut x: u64 = 42;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            alnum[(x >> 33) as usize % alnum.len()] as char
        };
        let text: String = (0..200)
            .map(|_| format!("ghp_{} ", (0..36).map(|_| next()).collect::<String>()))
            .collect();
        let found = s.scan("body", &text);
        assert!(
            !found.is_empty() && found.len() <= MAX_HITS,
            "{}",
            found.len()
        );
    }

    #[test]
    fn entropy_of_uniform_text() {
        assert_eq!(entropy(b"aaaa"), 0.0);
        assert!((entropy(b"abcd") - 2.0).abs() < 1e-9);
    }
}
