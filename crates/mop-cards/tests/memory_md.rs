//! MEMORY.md: sections, caps and notices, unverified marks, escaping of hostile card text
//! (checked by parsing the output as Markdown), and byte-for-byte determinism.

mod common;

use std::collections::BTreeSet;

use common::*;
use mop_cards::{
    CardType, Catalog, ManifestEntry, Provenance, Rules, SelectionConfig, TaskContext, TaskQuery,
    TextHit, Trust, render_memory_md,
};
use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

const SECTIONS: [&str; 5] = [
    "Primary Anchors",
    "Knowledge Map",
    "Top Matched Recommendations",
    "Additional Mounted Cards",
    "Usage Guidelines",
];

fn render(
    cat: &Catalog,
    t: &TaskContext,
    hits: &[TextHit],
    config: &SelectionConfig,
) -> (String, BTreeSet<String>) {
    let rules = Rules::new(config.clone()).unwrap();
    let sel = cat.select(&TaskQuery::new(t, &rules.codes), hits, config);
    let mounted = sel.cards.iter().map(|s| cat.card(s.ord).path()).collect();
    (render_memory_md(cat, &sel, t, config), mounted)
}

/// What the Markdown parser sees: headings, link targets, table rows' cell counts, and
/// whether any HTML or image got through.
#[derive(Debug, Default)]
struct Structure {
    headings: Vec<(HeadingLevel, String)>,
    links: Vec<String>,
    row_cells: Vec<usize>,
    html: usize,
    images: usize,
}

fn structure(md: &str) -> Structure {
    let mut s = Structure::default();
    let mut heading: Option<(HeadingLevel, String)> = None;
    let mut cells = 0;
    for event in Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH) {
        match event {
            Event::Start(Tag::Heading { level, .. }) => heading = Some((level, String::new())),
            Event::End(TagEnd::Heading(_)) => s.headings.extend(heading.take()),
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, h)) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Start(Tag::Link { dest_url, .. }) => s.links.push(dest_url.to_string()),
            Event::Start(Tag::Image { .. }) => s.images += 1,
            Event::Html(_) | Event::InlineHtml(_) => s.html += 1,
            Event::Start(Tag::TableHead) | Event::Start(Tag::TableRow) => cells = 0,
            Event::Start(Tag::TableCell) => cells += 1,
            Event::End(TagEnd::TableHead) | Event::End(TagEnd::TableRow) => s.row_cells.push(cells),
            _ => {}
        }
    }
    s
}

fn assert_sound(md: &str, mounted: &BTreeSet<String>) -> Structure {
    let s = structure(md);
    assert_eq!(s.headings[0].0, HeadingLevel::H1);
    let h2: Vec<&str> = s.headings[1..].iter().map(|h| h.1.as_str()).collect();
    assert_eq!(h2, SECTIONS, "exactly the six sections, in order");
    assert_eq!(s.html, 0, "no HTML");
    assert_eq!(s.images, 0, "no images");
    for link in &s.links {
        assert!(
            mounted.contains(link),
            "link {link:?} does not resolve to a mounted card"
        );
    }
    s
}

fn hostile(n: u32, card_type: CardType) -> ManifestEntry {
    with(card(n, card_type), |e| {
        e.summary.title = "Evil | [click](https://evil.example/x) <script>alert(1)</script> ![i](http://x/i.png) `tick".into();
        e.summary.description =
            Some("desc | www.evil.example <b>bold</b> [a]: http://ref \\| \\\\".into());
    })
}

#[test]
fn hostile_card_text_cannot_break_structure_or_add_links() {
    let cat = catalog(vec![
        hostile(1, CardType::HumanCorrection),
        hostile(2, CardType::Fact),
        hostile(3, CardType::Preference),
    ]);
    let config = SelectionConfig {
        table_rows: 2,
        ..Default::default()
    };
    let (md, mounted) = render(&cat, &task(None, None, "x"), &[], &config);
    let s = assert_sound(&md, &mounted);
    // Two anchors (correction, preference), two table rows, one additional card.
    assert_eq!(s.links.len(), 5, "{md}");
    // The knowledge map has 3 columns, the recommendations table 7, in every row.
    assert!(
        s.row_cells.iter().all(|c| *c == 3 || *c == 7),
        "{:?}\n{md}",
        s.row_cells
    );
    assert_eq!(
        s.row_cells.iter().filter(|c| **c == 7).count(),
        3,
        "header + 2 rows"
    );
    assert!(!md.contains("](https://evil"), "{md}");
    assert!(!md.contains("<script>"), "{md}");
    assert!(!md.contains("www.evil"), "bare autolink defused: {md}");
    assert!(!md.contains("https://"), "bare URL defused: {md}");
}

#[test]
fn sections_notices_and_caps() {
    let mut cards: Vec<_> = (1..=8).map(|n| card(n, CardType::Fact)).collect();
    cards.push(with(card(9, CardType::Preference), user("alice")));
    cards.push(with(card(10, CardType::Pitfall), |e| {
        e.summary.stacks = vec!["oracle".into()]
    }));
    let cat = catalog(cards);
    let config = SelectionConfig {
        max_mounted: 4,
        table_rows: 2,
        ..Default::default()
    };
    let (md, mounted) = render(&cat, &task(Some("alice"), None, "oracle"), &[], &config);
    let s = assert_sound(&md, &mounted);
    assert_eq!(mounted.len(), 4);
    assert!(
        md.contains("Showing top 2 of 10 selected cards (L0 8, L1 1, L2 1)."),
        "{md}"
    );
    assert!(
        md.contains("Not in this table: 8 cards (L0 8, L1 0, L2 0)"),
        "{md}"
    );
    assert!(
        md.contains("**Not mounted:** the cap of 4 mounted cards left out 6 cards selected for this task (L0 6, L1 0, L2 0)."),
        "{md}"
    );
    assert!(md.contains("mop memory retrieve"), "{md}");
    // Anchor (the preference) + 2 table rows + 2 additional.
    assert_eq!(s.links.len(), 5, "{md}");
    assert!(md.contains("| `facts/specs/` |"), "{md}");
    assert!(md.contains("| `runbooks/pitfalls/` |"), "{md}");
    assert!(md.contains("| `conventions/preferences/` |"), "{md}");
    assert!(
        !md.contains("runbooks/errors/"),
        "no empty pillar in the map: {md}"
    );
}

#[test]
fn nothing_selected_still_gives_every_section() {
    let cat = catalog(vec![with(card(1, CardType::Fact), user("bob"))]);
    let (md, mounted) = render(
        &cat,
        &task(Some("alice"), None, "x"),
        &[],
        &SelectionConfig::default(),
    );
    assert!(mounted.is_empty());
    let s = assert_sound(&md, &mounted);
    assert!(s.links.is_empty());
    assert!(md.contains("Showing top 0 of 0 selected cards"), "{md}");
    assert!(md.contains("_No cards are mounted in this view._"), "{md}");
}

#[test]
fn unverified_cards_are_marked_in_table_and_lists() {
    let unverified = |e: &mut ManifestEntry| {
        e.summary.trust = Trust::Unverified;
        e.summary.provenance = Some(Provenance {
            user_id: Some("alice".into()),
            ..Default::default()
        });
    };
    // Unverified cards are never baseline: these two are alice's own (user-bound).
    let cat = catalog(vec![
        with(
            with(card(1, CardType::Preference), unverified),
            user("alice"),
        ),
        with(with(card(2, CardType::Fact), unverified), user("alice")),
        card(3, CardType::Fact),
        card(4, CardType::Preference),
    ]);
    let config = SelectionConfig {
        table_rows: 1,
        ..Default::default()
    };
    let (md, mounted) = render(&cat, &task(Some("alice"), None, "x"), &[], &config);
    assert_sound(&md, &mounted);
    let marked = md
        .lines()
        .filter(|l| {
            l.contains("_(unverified)_") && l.contains("card 1")
                || l.contains("card 2") && l.contains("_(unverified)_")
        })
        .count();
    // Card 1: table row (it ranks first). Card 2: additional list.
    assert_eq!(marked, 2, "{md}");
    assert!(
        md.lines()
            .any(|l| l.contains("card 3") && !l.contains("unverified"))
    );
    // The verified preference is an anchor; the agent-stored one never is.
    let anchors = section(&md, "Primary Anchors");
    assert!(anchors.contains("card 4"), "{anchors}");
    assert!(!anchors.contains("card 1"), "{anchors}");
}

#[test]
fn same_inputs_same_bytes() {
    let cards = || -> Vec<ManifestEntry> {
        (1..=30)
            .map(|n| {
                with(card(n, CardType::ALL[n as usize % 7]), |e| {
                    e.summary.importance = f64::from(n % 5) / 5.0
                })
            })
            .collect()
    };
    let mut reversed = cards();
    reversed.reverse();
    let t = task(Some("alice"), None, "card");
    let config = SelectionConfig::default();
    let a = render(&catalog(cards()), &t, &[], &config).0;
    let b = render(&catalog(cards()), &t, &[], &config).0;
    let c = render(&catalog(reversed), &t, &[], &config).0;
    assert_eq!(a, b);
    assert_eq!(a, c, "manifest order does not matter");
}

/// The text of one `## ` section, up to the next.
fn section<'a>(md: &'a str, name: &str) -> &'a str {
    let start = md
        .find(&format!("## {name}\n"))
        .unwrap_or_else(|| panic!("no section {name}: {md}"));
    let rest = &md[start + name.len() + 4..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}
