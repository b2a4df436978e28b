//! The memory files agents and teams already keep, read as card drafts: the one decoder
//! a curator's import uses (and, for Claude Code's topic files, a task's native capture).
//!
//! A file is one of:
//! - an **OKF card** (frontmatter that parses as a card): taken whole, its id kept;
//! - a **Claude Code auto-memory topic file**: frontmatter with `name`, `description` and
//!   `type` (`user`, `feedback`, `project` or `reference`, also as `metadata.type`); the
//!   file is one card, its type mapped as OKF.md says;
//! - **instructions** (`CLAUDE.md`, `CLAUDE.local.md`, `.claude/rules/*.md`, `AGENTS.md`,
//!   Codex's `memories/MEMORY.md` and `memory_summary.md`, any other Markdown): each
//!   section with text of its own becomes one card, its heading the title and the headings
//!   above it the description;
//! - skipped, with the reason: an auto-memory `MEMORY.md` index (it only links the topic
//!   files beside it), Codex's `raw_memories.md` and `rollout_summaries/` (the raw notes
//!   its `MEMORY.md` consolidates), anything not Markdown.
//!
//! Nothing here touches a file system or a database: the caller reads the files and
//! decides what each draft does to the workspace.

use mop_cards::{Card, CardType, MAX_BODY_BYTES, MAX_DESCRIPTION_CHARS, MAX_TITLE_CHARS};
use yaml_rust2::YamlLoader;

/// A card a file section would become, before the server gives it an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    /// The OKF type.
    pub card_type: CardType,
    /// The section's heading (or the topic file's name).
    pub title: String,
    /// Where it came from within the file, or the topic file's description.
    pub description: Option<String>,
    /// Claude Code's `user` memory: one person's, to bind to that person when the import
    /// names one.
    pub personal: bool,
    /// The section's text.
    pub body: String,
}

/// A section that cannot become a card, and why (the rest of its file still can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The section's heading, when it has one.
    pub title: Option<String>,
    /// What is wrong, and what to do.
    pub reason: String,
}

/// What one file holds for an import.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// An OKF card, whole.
    Card(Box<Card>),
    /// Sections as drafts, and the sections that could not be.
    Drafts {
        /// What the file calls itself: "instructions", "Claude Code auto memory" …
        kind: &'static str,
        /// One per section with text.
        drafts: Vec<Draft>,
        /// Sections refused.
        refused: Vec<Refused>,
    },
    /// Nothing to import from this file, and why.
    Skip(String),
}

/// Reads file `path` (as the curator names it, `/`-separated) with its `text`.
pub fn read_source(path: &str, text: &str) -> Source {
    let name = path.rsplit('/').next().unwrap_or(path);
    if path.split('/').any(|part| part == "rollout_summaries") || name == "raw_memories.md" {
        return Source::Skip(
            "Codex's raw notes, which its memories/MEMORY.md consolidates: import that file".into(),
        );
    }
    if !name.to_ascii_lowercase().ends_with(".md") {
        return Source::Skip("not a Markdown (.md) file".into());
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (front, body) = split_front(text);
    if let Some(front) = front {
        // A memory file is untrusted text: no YAML that could expand as it loads.
        if let Err(e) = mop_cards::check_frontmatter(front) {
            return Source::Skip(format!("its frontmatter cannot be read safely: {e}"));
        }
        let map = YamlLoader::load_from_str(front)
            .ok()
            .and_then(|docs| docs.into_iter().next());
        let get = |k: &str| map.as_ref().and_then(|m| m[k].as_str().map(str::to_owned));
        if get("id").is_some() && get("title").is_some() {
            return match mop_cards::parse_card(text.as_bytes()) {
                Ok(card) => Source::Card(Box::new(card)),
                Err(e) => Source::Skip(format!("an OKF card that is not valid: {e}")),
            };
        }
        let kind = get("type").or_else(|| {
            let m = map.as_ref()?;
            m["metadata"]["type"].as_str().map(str::to_owned)
        });
        if let Some(kind) = kind.filter(|k| memory_type(k).is_some())
            && let Some(title) = get("name")
        {
            return topic_file(&kind, &title, get("description"), body);
        }
    }
    if name == "MEMORY.md" && is_index(body) {
        return Source::Skip(
            "an auto-memory index that only links the topic files beside it: import the directory"
                .into(),
        );
    }
    let (drafts, refused) = sections(name, body);
    Source::Drafts {
        kind: "instructions",
        drafts,
        refused,
    }
}

/// The OKF type of a Claude Code memory type, and whether it is one person's.
fn memory_type(kind: &str) -> Option<(CardType, bool)> {
    Some(match kind {
        "user" => (CardType::Preference, true),
        "feedback" => (CardType::HumanCorrection, false),
        "project" => (CardType::Fact, false),
        "reference" => (CardType::ReferenceDoc, false),
        _ => return None,
    })
}

/// A Claude Code topic file: one card.
fn topic_file(kind: &str, name: &str, description: Option<String>, body: &str) -> Source {
    let (card_type, personal) = memory_type(kind).expect("checked by the caller");
    let (mut drafts, mut refused) = (Vec::new(), Vec::new());
    let title = title_of(name);
    let description = description
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty());
    match check(&title, body.trim(), description.as_deref()) {
        Ok(()) => drafts.push(Draft {
            card_type,
            title,
            description,
            personal,
            body: body.trim().to_owned(),
        }),
        Err(reason) => refused.push(Refused {
            title: Some(title),
            reason,
        }),
    }
    Source::Drafts {
        kind: "Claude Code auto memory",
        drafts,
        refused,
    }
}

/// A topic file's `name` as a card title: Claude Code names its memories with kebab-case
/// slugs (`never-deploy-on-fridays`, and rewrites other names so), which read as words
/// once the dashes are spaces ("Never deploy on fridays"). Other names stay as written.
fn title_of(name: &str) -> String {
    let name = name.trim();
    let slug = !name.is_empty()
        && name.contains(['-', '_'])
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !slug {
        return name.to_owned();
    }
    let words = name.replace(['-', '_'], " ");
    let mut chars = words.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// Why a draft cannot be a card, if it cannot.
fn check(title: &str, body: &str, description: Option<&str>) -> Result<(), String> {
    let chars = title.chars().count();
    if chars == 0 || chars > MAX_TITLE_CHARS || title.contains(['\n', '\r']) {
        return Err(format!(
            "a title must be one line of 1 to {MAX_TITLE_CHARS} characters (this one has {chars}): shorten the heading"
        ));
    }
    if body.is_empty() {
        return Err("no text under the heading".into());
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(format!(
            "the text is {} bytes, more than a card's {MAX_BODY_BYTES}: split the section",
            body.len()
        ));
    }
    if let Some(d) = description
        && (d.chars().count() > MAX_DESCRIPTION_CHARS || d.contains(['\n', '\r']))
    {
        return Err(format!(
            "the description must be one line of at most {MAX_DESCRIPTION_CHARS} characters"
        ));
    }
    Ok(())
}

/// `---\n<yaml>---\n<body>` split, or no frontmatter and the whole text.
fn split_front(text: &str) -> (Option<&str>, &str) {
    let delim = |l: &str| l.trim_end() == "---";
    let mut lines = text.split_inclusive('\n');
    match lines.next() {
        Some(first) if delim(first) => {
            let start = first.len();
            let mut pos = start;
            for line in lines {
                if delim(line) {
                    return (Some(&text[start..pos]), &text[pos + line.len()..]);
                }
                pos += line.len();
            }
            (None, text)
        }
        _ => (None, text),
    }
}

/// Whether a `MEMORY.md` only lists links (Claude Code's index of its topic files).
fn is_index(body: &str) -> bool {
    let mut links = 0;
    for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with('#') {
            continue;
        }
        if line.starts_with(['-', '*']) && line.contains("](") {
            links += 1;
        } else {
            return false;
        }
    }
    links > 0
}

/// An ATX heading's level and text, outside code.
fn heading(line: &str) -> Option<(usize, &str)> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    let level = t.bytes().take_while(|b| *b == b'#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &t[level..];
    if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    let text = rest.trim().trim_end_matches('#').trim_end();
    Some((level, text))
}

/// Whether `line` opens or closes a fenced code block.
fn fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// Each section with text of its own, with the headings above it as its place.
fn sections(file: &str, body: &str) -> (Vec<Draft>, Vec<Refused>) {
    // (level, heading) of the sections enclosing the current one.
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut current: Option<String> = None;
    let mut text = String::new();
    let mut in_code = false;
    let (mut drafts, mut refused) = (Vec::new(), Vec::new());
    let mut flush = |title: Option<&String>, path: &[(usize, String)], text: &mut String| {
        let body = text.trim().to_owned();
        text.clear();
        if body.is_empty() {
            return;
        }
        // Text before any heading is titled by the file it opens.
        let title = title.cloned().unwrap_or_else(|| file.to_owned());
        let mut place = vec![file.to_owned()];
        place.extend(path.iter().map(|(_, h)| h.clone()));
        let mut description = format!("From {}", place.join(" › "));
        if description.chars().count() > MAX_DESCRIPTION_CHARS {
            description = format!("From {file}");
        }
        match check(&title, &body, Some(&description)) {
            Ok(()) => drafts.push(Draft {
                card_type: CardType::Preference,
                title,
                description: Some(description),
                personal: false,
                body,
            }),
            Err(reason) => refused.push(Refused {
                title: Some(title),
                reason,
            }),
        }
    };
    for line in body.split_inclusive('\n') {
        if fence(line) {
            in_code = !in_code;
        }
        match (!in_code).then(|| heading(line)).flatten() {
            Some((level, h)) => {
                flush(current.as_ref(), enclosing(&path), &mut text);
                path.retain(|(l, _)| *l < level);
                path.push((level, h.to_owned()));
                current = Some(h.to_owned());
            }
            None => text.push_str(line),
        }
    }
    flush(current.as_ref(), enclosing(&path), &mut text);
    (drafts, refused)
}

/// The headings above the current section (the last on the stack is its own).
fn enclosing(path: &[(usize, String)]) -> &[(usize, String)] {
    path.split_last().map_or(&[], |(_, above)| above)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slug_names_read_as_words() {
        assert_eq!(
            title_of("never-deploy-on-fridays"),
            "Never deploy on fridays"
        );
        assert_eq!(title_of("user_prefs_2"), "User prefs 2");
        assert_eq!(title_of("Terse answers"), "Terse answers");
        assert_eq!(title_of("ORA-01555-fix"), "ORA-01555-fix");
    }

    fn drafts(path: &str, text: &str) -> Vec<Draft> {
        match read_source(path, text) {
            Source::Drafts { drafts, .. } => drafts,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_section_with_text_is_one_draft_titled_by_its_heading() {
        let text = "Read this first.\n\n# Project\n\n## Build\n\nRun `make`.\n\n```sh\n# not a heading\n```\n\n## Style\n### Go\nUse gofmt.\n";
        let d = drafts("CLAUDE.md", text);
        let titles: Vec<_> = d.iter().map(|d| d.title.as_str()).collect();
        assert_eq!(titles, ["CLAUDE.md", "Build", "Go"]);
        assert_eq!(
            d[1].description.as_deref(),
            Some("From CLAUDE.md › Project")
        );
        assert!(d[1].body.contains("# not a heading"), "{:?}", d[1].body);
        assert_eq!(
            d[2].description.as_deref(),
            Some("From CLAUDE.md › Project › Style")
        );
        assert!(d.iter().all(|d| d.card_type == CardType::Preference));
    }

    #[test]
    fn a_topic_file_is_one_card_of_its_mapped_type() {
        let text = "---\nname: Testing policy\ndescription: no mocks\ntype: feedback\n---\nTests use a real database.\n";
        let d = drafts("memory/feedback_testing.md", text);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].card_type, CardType::HumanCorrection);
        assert_eq!(d[0].title, "Testing policy");
        assert_eq!(d[0].description.as_deref(), Some("no mocks"));
        let user = "---\nname: Role\ndescription: who\nmetadata:\n  type: user\n---\nSenior Go developer.\n";
        let d = drafts("memory/user_role.md", user);
        assert!(d[0].personal);
        assert_eq!(d[0].card_type, CardType::Preference);
    }

    #[test]
    fn an_index_and_raw_notes_are_skipped_with_the_reason() {
        let index = "- [Testing](feedback_testing.md) — no mocks\n- [Role](user_role.md)\n";
        assert!(matches!(
            read_source("memory/MEMORY.md", index),
            Source::Skip(_)
        ));
        assert!(matches!(
            read_source("memories/raw_memories.md", "x"),
            Source::Skip(_)
        ));
        assert!(matches!(
            read_source("memories/rollout_summaries/a.md", "x"),
            Source::Skip(_)
        ));
        assert!(matches!(read_source("notes.txt", "x"), Source::Skip(_)));
        // Codex's MEMORY.md is a handbook, not an index: its sections are cards.
        let codex = "# Workflows\n\n## Release\nTag, then push the tag.\n";
        assert_eq!(drafts("memories/MEMORY.md", codex).len(), 1);
    }

    #[test]
    fn a_heading_too_long_is_refused_and_its_neighbours_kept() {
        let text = format!("# {}\ntext\n# Short\ntext\n", "x".repeat(201));
        match read_source("AGENTS.md", &text) {
            Source::Drafts {
                drafts, refused, ..
            } => {
                assert_eq!(drafts.len(), 1);
                assert_eq!(refused.len(), 1);
                assert!(refused[0].reason.contains("200"), "{:?}", refused[0]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn yaml_that_would_expand_is_refused_before_it_loads() {
        let bomb = "---\na: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n---\n# T\ntext\n";
        match read_source("AGENTS.md", bomb) {
            Source::Skip(why) => assert!(why.contains("cannot be read safely"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Control: the same file without anchors is read.
        let plain = "---\na: [x]\n---\n# T\ntext\n";
        assert!(matches!(
            read_source("AGENTS.md", plain),
            Source::Drafts { .. }
        ));
    }

    #[test]
    fn rules_frontmatter_is_not_a_card() {
        let text = "---\npaths: [\"src/**\"]\n---\n# API\nReturn errx codes.\n";
        let d = drafts(".claude/rules/api.md", text);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].title, "API");
    }
}
