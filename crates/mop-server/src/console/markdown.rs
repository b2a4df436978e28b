//! Card Markdown to HTML that is safe inside a console page, and line diffs of card texts.
//!
//! Agents write cards, so a card body is hostile: pulldown-cmark renders it with raw HTML
//! turned into visible text and images turned into plain links (nothing loads from another
//! host), then ammonia keeps only harmless tags and attributes, only http, https and
//! mailto links, no relative URLs, and gives every link `rel="noopener noreferrer"`.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::Duration;

use maud::{Markup, html};
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

static CLEANER: LazyLock<ammonia::Builder<'static>> = LazyLock::new(|| {
    let mut b = ammonia::Builder::default();
    b.rm_tags(["img"])
        .url_schemes(HashSet::from(["http", "https", "mailto"]))
        .url_relative(ammonia::UrlRelative::Deny)
        .link_rel(Some("noopener noreferrer"))
        .strip_comments(true);
    b
});

/// Renders Markdown to sanitized HTML.
pub fn render(markdown: &str) -> String {
    let options = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    let events = Parser::new_ext(markdown, options).map(|event| match event {
        // Shown as the text it is, never interpreted.
        Event::Html(raw) | Event::InlineHtml(raw) => Event::Text(raw),
        // A curator's browser must not fetch what an agent points it at.
        Event::Start(Tag::Image {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }),
        Event::End(TagEnd::Image) => Event::End(TagEnd::Link),
        other => other,
    });
    let mut html = String::with_capacity(markdown.len() * 3 / 2);
    pulldown_cmark::html::push_html(&mut html, events);
    CLEANER.clean(&html).to_string()
}

/// A line diff of two card texts, as a `<pre>` of added and removed lines with their
/// context. A diff that would take too long (two huge texts with nothing in common) is
/// cut short and still correct, just coarser.
pub fn diff(old: &str, new: &str) -> Markup {
    let diff = similar::TextDiff::configure()
        .timeout(Duration::from_millis(250))
        .diff_lines(old, new);
    let groups = diff.grouped_ops(2);
    html! {
        @if groups.is_empty() {
            p.muted { "No change in the text." }
        } @else {
            pre.diff {
                @for (i, group) in groups.iter().enumerate() {
                    @if i > 0 { span.gap { "⋯\n" } }
                    @for op in group {
                        @for change in diff.iter_changes(op) {
                            @match change.tag() {
                                similar::ChangeTag::Delete => span.del { "- " (change.value()) }
                                similar::ChangeTag::Insert => span.add { "+ " (change.value()) }
                                similar::ChangeTag::Equal => span.same { "  " (change.value()) }
                            }
                            @if change.missing_newline() { "\n" }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_markdown_renders_inert() {
        let html = render(
            "<script>alert(1)</script>\n\n<img src=x onerror=alert(2)>\n\n\
             [a](javascript:alert(3)) <javascript:alert(4)> [b](JaVaScRiPt:alert(5))\n\n\
             ![pic](https://evil.example/p.png) [rel](/console/tokens) [ok](https://example.org/x)\n\n\
             <a href=\"https://example.org\" onclick=\"alert(6)\">x</a> &lt;b&gt; &#106;avascript:",
        );
        for bad in [
            "<script",
            "<img",
            "onerror=",
            "onclick=",
            "href=\"javascript",
            "href=\"JaVaScRiPt",
            "href=\"/console",
        ] {
            assert!(!html.contains(bad), "{bad} in {html}");
        }
        assert!(
            html.contains("&lt;script&gt;"),
            "raw HTML shown as text: {html}"
        );
        assert!(
            html.contains("href=\"https://evil.example/p.png\" rel=\"noopener noreferrer\""),
            "an image becomes a link: {html}"
        );
        assert!(html.contains("href=\"https://example.org/x\" rel=\"noopener noreferrer\""));
    }

    #[test]
    fn a_diff_shows_what_changed() {
        let d = diff("a\nb\nc\n", "a\nB\nc\n").into_string();
        assert!(d.contains("- b") && d.contains("+ B"), "{d}");
        assert!(diff("x\n", "x\n").into_string().contains("No change"));
    }
}
