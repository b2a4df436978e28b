//! Parsing OKF v1 card files: split the frontmatter from the body, load the YAML with the
//! features OKF does not need turned away (anchors, aliases, deep nesting), map each key to
//! its field with a typed error, and validate.

use std::str::FromStr;

use jiff::Timestamp;
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::ScanError;
use yaml_rust2::{Yaml, YamlEmitter, YamlLoader};

use crate::card::{
    Card, CardSummary, CardType, Counters, DEFAULT_IMPORTANCE, Extra, Provenance, Scope, Trust,
    check_body,
};
use crate::error::{CardError, Rule};
use crate::id::CardId;

/// Largest frontmatter block, in bytes.
pub const MAX_FRONTMATTER_BYTES: usize = 16 * 1024;
/// Deepest nesting of YAML collections in a frontmatter block.
const MAX_YAML_DEPTH: usize = 8;

const SCOPE_KEYS: &[&str] = &["user_id", "asset_id", "project_id", "agent"];
const PROVENANCE_KEYS: &[&str] = &[
    "task_id",
    "user_id",
    "asset_id",
    "project_id",
    "agent",
    "imported_by",
    "imported_from",
];
const TRUST_NAMES: &[&str] = &["verified", "unverified"];

/// Parses and validates one card file.
pub fn parse_card(bytes: &[u8]) -> Result<Card, CardError> {
    let text = std::str::from_utf8(bytes).map_err(|e| CardError::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (frontmatter, body) = split_frontmatter(text)?;
    if frontmatter.len() > MAX_FRONTMATTER_BYTES {
        return Err(CardError::FrontmatterTooLarge {
            size: frontmatter.len(),
            max: MAX_FRONTMATTER_BYTES,
        });
    }
    let map = load_mapping(frontmatter)?;
    let card = card_from_mapping(map, body)?;
    card.validate()?;
    Ok(card)
}

/// The Markdown body of a card file, without parsing or validating its frontmatter: for
/// callers that already trust the file (a daemon indexing objects it verified by hash).
pub fn card_body(bytes: &[u8]) -> Result<&str, CardError> {
    let text = std::str::from_utf8(bytes).map_err(|e| CardError::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    split_frontmatter(text).map(|(_, body)| body)
}

/// Splits `---\n<yaml>---\n<body>`; the body is everything after the closing line, verbatim.
fn split_frontmatter(text: &str) -> Result<(&str, &str), CardError> {
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().ok_or(CardError::NoFrontmatter)?;
    if !is_delimiter(first) {
        return Err(CardError::NoFrontmatter);
    }
    let start = first.len();
    let mut pos = start;
    for line in lines {
        if is_delimiter(line) {
            return Ok((&text[start..pos], &text[pos + line.len()..]));
        }
        pos += line.len();
    }
    Err(CardError::UnclosedFrontmatter)
}

fn is_delimiter(line: &str) -> bool {
    line.trim_end_matches(['\n', '\r', ' ', '\t']) == "---"
}

/// The scope of its fields in [`SCOPE_KEYS`] order.
fn scope_of(fields: Vec<Option<String>>) -> Scope {
    let mut f = fields.into_iter();
    let mut next = || f.next().flatten();
    Scope {
        user_id: next(),
        asset_id: next(),
        project_id: next(),
        agent: next(),
    }
}

/// The provenance of its fields in [`PROVENANCE_KEYS`] order; none when all are absent.
fn provenance_of(fields: Vec<Option<String>>) -> Option<Provenance> {
    if fields.iter().all(Option::is_none) {
        return None;
    }
    let mut f = fields.into_iter();
    let mut next = || f.next().flatten();
    Some(Provenance {
        task_id: next(),
        user_id: next(),
        asset_id: next(),
        project_id: next(),
        agent: next(),
        imported_by: next(),
        imported_from: next(),
    })
}

/// Loads the frontmatter as one YAML mapping, in file order.
fn load_mapping(frontmatter: &str) -> Result<yaml_rust2::yaml::Hash, CardError> {
    reject_control_chars(frontmatter)?;
    reject_unsafe_yaml(frontmatter)?;
    let mut docs = YamlLoader::load_from_str(frontmatter).map_err(|e| yaml_error(&e))?;
    match docs.len() {
        0 => Ok(Default::default()),
        1 => match docs.pop() {
            Some(Yaml::Hash(map)) => Ok(map),
            Some(Yaml::Null) | Some(Yaml::BadValue) => Ok(Default::default()),
            _ => Err(CardError::NotMapping),
        },
        _ => Err(CardError::Yaml {
            line: 1,
            column: 1,
            problem: "frontmatter holds more than one YAML document".into(),
        }),
    }
}

/// YAML allows no control characters but tab, line feed and carriage return, and the
/// parser stops silently at a NUL: everything after it (a `scope`, say) would vanish from
/// the card. Refused, with where.
fn reject_control_chars(frontmatter: &str) -> Result<(), CardError> {
    for (n, line) in frontmatter.split('\n').enumerate() {
        if let Some((col, c)) = line
            .chars()
            .enumerate()
            .find(|(_, c)| c.is_control() && !matches!(c, '\t' | '\r'))
        {
            return Err(CardError::Yaml {
                // The frontmatter starts on the file's second line.
                line: n + 2,
                column: col + 1,
                problem: format!(
                    "control character U+{:04X} in the frontmatter (write it escaped in a quoted string, or remove it)",
                    c as u32
                ),
            });
        }
    }
    Ok(())
}

/// Whether `frontmatter` may be loaded as YAML at all: within [`MAX_FRONTMATTER_BYTES`],
/// with no anchor, alias or deep nesting. For any reader of frontmatter that is not a card
/// (a memory file's), before it loads one.
pub fn check_frontmatter(frontmatter: &str) -> Result<(), CardError> {
    if frontmatter.len() > MAX_FRONTMATTER_BYTES {
        return Err(CardError::FrontmatterTooLarge {
            size: frontmatter.len(),
            max: MAX_FRONTMATTER_BYTES,
        });
    }
    reject_unsafe_yaml(frontmatter)
}

/// Anchors and aliases let a few bytes expand into gigabytes ("billion laughs"), and cards
/// never need them; deep nesting has no use either. Both are refused before loading.
fn reject_unsafe_yaml(frontmatter: &str) -> Result<(), CardError> {
    let mut parser = Parser::new_from_str(frontmatter);
    let mut depth = 0usize;
    loop {
        let (event, mark) = parser.next_token().map_err(|e| yaml_error(&e))?;
        let at = |problem: &str| CardError::Yaml {
            line: mark.line() + 1,
            column: mark.col() + 1,
            problem: problem.into(),
        };
        match event {
            Event::StreamEnd => return Ok(()),
            Event::Alias(_) => return Err(at("aliases are not allowed in card frontmatter")),
            Event::Scalar(_, _, anchor, _) if anchor > 0 => {
                return Err(at("anchors are not allowed in card frontmatter"));
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if anchor > 0 {
                    return Err(at("anchors are not allowed in card frontmatter"));
                }
                depth += 1;
                if depth > MAX_YAML_DEPTH {
                    return Err(at("frontmatter is nested too deeply"));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
}

fn yaml_error(e: &ScanError) -> CardError {
    // The frontmatter starts on the file's second line, after the opening `---`.
    CardError::Yaml {
        line: e.marker().line() + 1,
        column: e.marker().col() + 1,
        problem: e.info().to_owned(),
    }
}

fn card_from_mapping(map: yaml_rust2::yaml::Hash, body: &str) -> Result<Card, CardError> {
    let mut id = None;
    let mut card_type = None;
    let mut title = None;
    let mut summary_description = None;
    let mut labels = Vec::new();
    let mut scope = Scope::default();
    let mut error_codes = Vec::new();
    let mut stacks = Vec::new();
    let mut importance = DEFAULT_IMPORTANCE;
    let mut occurrence = 1u64;
    let mut created_at = None;
    let mut updated_at = None;
    let mut last_seen = None;
    let mut enabled = true;
    let mut superseded_by = None;
    let mut supersedes = Vec::new();
    let mut trust = Trust::Verified;
    let mut provenance = None;
    let mut extra = Vec::new();

    for (key, value) in map {
        // Unknown keys are kept and written back on render, so only plain names are
        // allowed: a key YAML cannot write back as a simple key (control characters, over
        // 1024 characters, a map as a key) would make the card unrenderable.
        let Some(name) = key.as_str().filter(|k| is_plain_key(k)) else {
            return Err(CardError::field("frontmatter", Rule::KeyName));
        };
        match name {
            "id" => id = Some(card_id("id", &value)?),
            "type" => {
                let s = string("type", &value)?;
                card_type = Some(
                    CardType::parse(s)
                        .ok_or(CardError::field("type", Rule::OneOf(&CardType::NAMES)))?,
                );
            }
            "title" => title = Some(string("title", &value)?.to_owned()),
            "description" => summary_description = opt_string("description", &value)?,
            "labels" => labels = string_list("labels", &value)?,
            "scope" => scope = scope_of(nested("scope", &value, SCOPE_KEYS)?),
            "error_codes" => error_codes = string_list("error_codes", &value)?,
            "stacks" => stacks = string_list("stacks", &value)?,
            "importance" => importance = number("importance", &value)?,
            "occurrence" => occurrence = positive_integer("occurrence", &value)?,
            "created_at" => created_at = opt_timestamp("created_at", &value)?,
            "updated_at" => updated_at = opt_timestamp("updated_at", &value)?,
            "last_seen" => last_seen = opt_timestamp("last_seen", &value)?,
            "enabled" => {
                enabled = value
                    .as_bool()
                    .ok_or(CardError::field("enabled", Rule::Type("true or false")))?
            }
            "superseded_by" => {
                superseded_by = match value {
                    Yaml::Null => None,
                    v => Some(card_id("superseded_by", &v)?),
                }
            }
            "supersedes" => supersedes = card_ids("supersedes", &value)?,
            "trust" => {
                trust = match string("trust", &value)? {
                    "verified" => Trust::Verified,
                    "unverified" => Trust::Unverified,
                    _ => return Err(CardError::field("trust", Rule::OneOf(TRUST_NAMES))),
                }
            }
            "provenance" => {
                provenance = provenance_of(nested("provenance", &value, PROVENANCE_KEYS)?);
            }
            _ => {
                if let Some(rule) = unrenderable(&value) {
                    return Err(CardError::field(name, rule));
                }
                if !written_back(&key, &value) {
                    return Err(CardError::field(name, Rule::NotWrittenBack));
                }
                extra.push((key, value))
            }
        }
    }

    let summary = CardSummary {
        id: id.ok_or(CardError::field("id", Rule::Required))?,
        card_type: card_type.ok_or(CardError::field("type", Rule::Required))?,
        title: title.ok_or(CardError::field("title", Rule::Required))?,
        description: summary_description,
        labels,
        scope,
        error_codes,
        stacks,
        importance,
        created_at,
        updated_at,
        enabled,
        superseded_by,
        supersedes,
        trust,
        provenance,
    };
    check_body(body)?;
    Ok(Card {
        counters: Counters {
            occurrence,
            last_seen: last_seen.or(summary.created_at),
        },
        summary,
        extra: Extra(extra),
        body: body.to_owned(),
    })
}

fn string<'a>(key: &str, value: &'a Yaml) -> Result<&'a str, CardError> {
    value.as_str().ok_or_else(|| {
        CardError::field(
            key,
            Rule::Type("a string (quote it if it looks like a number or boolean)"),
        )
    })
}

fn opt_string(key: &str, value: &Yaml) -> Result<Option<String>, CardError> {
    match value {
        Yaml::Null => Ok(None),
        v => string(key, v).map(|s| Some(s.to_owned())),
    }
}

fn string_list(key: &str, value: &Yaml) -> Result<Vec<String>, CardError> {
    match value {
        Yaml::Null => Ok(Vec::new()),
        Yaml::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| string(&format!("{key}[{i}]"), item).map(str::to_owned))
            .collect(),
        _ => Err(CardError::field(key, Rule::Type("a list of strings"))),
    }
}

fn card_ids(key: &str, value: &Yaml) -> Result<Vec<CardId>, CardError> {
    string_list(key, value)?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            CardId::parse(s).map_err(|e| CardError::field(format!("{key}[{i}]"), Rule::Uuid(e)))
        })
        .collect()
}

fn card_id(key: &str, value: &Yaml) -> Result<CardId, CardError> {
    CardId::parse(string(key, value)?).map_err(|e| CardError::field(key, Rule::Uuid(e)))
}

fn number(key: &str, value: &Yaml) -> Result<f64, CardError> {
    let n = match value {
        Yaml::Integer(i) => *i as f64,
        Yaml::Real(_) => value.as_f64().unwrap_or(f64::NAN),
        _ => return Err(CardError::field(key, Rule::UnitInterval)),
    };
    if (0.0..=1.0).contains(&n) {
        Ok(n)
    } else {
        Err(CardError::field(key, Rule::UnitInterval))
    }
}

fn positive_integer(key: &str, value: &Yaml) -> Result<u64, CardError> {
    match value {
        Yaml::Integer(i) if *i >= 1 => Ok(*i as u64),
        _ => Err(CardError::field(key, Rule::AtLeastOne)),
    }
}

fn opt_timestamp(key: &str, value: &Yaml) -> Result<Option<Timestamp>, CardError> {
    match value {
        Yaml::Null => Ok(None),
        Yaml::String(s) => Timestamp::from_str(s)
            .map(Some)
            .map_err(|_| CardError::field(key, Rule::Rfc3339)),
        _ => Err(CardError::field(key, Rule::Rfc3339)),
    }
}

/// A small mapping of optional strings with a fixed key set; unknown keys are errors here.
fn nested(
    key: &str,
    value: &Yaml,
    allowed: &'static [&'static str],
) -> Result<Vec<Option<String>>, CardError> {
    let mut out = vec![None; allowed.len()];
    let map = match value {
        Yaml::Null => return Ok(out),
        Yaml::Hash(map) => map,
        _ => return Err(CardError::field(key, Rule::Type("a mapping"))),
    };
    for (k, v) in map {
        let name = k.as_str().unwrap_or("");
        let full = format!("{key}.{name}");
        let slot = allowed
            .iter()
            .position(|a| *a == name)
            .ok_or_else(|| CardError::field(full.clone(), Rule::UnknownKey { allowed }))?;
        out[slot] = opt_string(&full, v)?;
    }
    Ok(out)
}

/// `[A-Za-z_][A-Za-z0-9_-]{0,63}`: what a frontmatter key may look like.
/// Why an unknown key's value would not survive being written back, if it would not. A
/// quoted YAML string may carry any character as an escape, but the emitter writes some
/// control characters (BEL, BS, VT, FF, ESC, DEL and the C1 range) raw, which this parser
/// then refuses; and a nested key the emitter writes as an implicit key must stay short
/// and simple. Such a card would be stored fine and never parse again.
fn unrenderable(value: &Yaml) -> Option<Rule> {
    let text_ok = |s: &str| {
        !s.chars()
            .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    };
    match value {
        Yaml::String(s) | Yaml::Real(s) => (!text_ok(s)).then_some(Rule::NoControlChars),
        Yaml::Array(items) => items.iter().find_map(unrenderable),
        Yaml::Hash(map) => map.iter().find_map(|(k, v)| match k.as_str() {
            Some(k) if is_plain_key(k) => unrenderable(v),
            _ => Some(Rule::KeyName),
        }),
        _ => None,
    }
}

/// Whether an unknown key and its value come back unchanged from the emitter that
/// `render_card` uses. The checks above name the known causes; this one holds the round
/// trip for whatever YAML corner they do not know yet.
fn written_back(key: &Yaml, value: &Yaml) -> bool {
    let mut map = yaml_rust2::yaml::Hash::new();
    map.insert(key.clone(), value.clone());
    let mut text = String::new();
    if YamlEmitter::new(&mut text)
        .dump(&Yaml::Hash(map.clone()))
        .is_err()
    {
        return false;
    }
    load_mapping(&text).is_ok_and(|again| again == map)
}

fn is_plain_key(k: &str) -> bool {
    let mut bytes = k.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && k.len() <= 64
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
