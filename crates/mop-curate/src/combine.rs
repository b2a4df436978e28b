//! Turning a duplicate group into one card: the curator picks the card that stays (one of
//! the group, by its number, or any card by id), gives its text (edited in `$EDITOR` with
//! every variant below a cut line, or from a file), and the server verifies it and merges
//! the rest of the group into it in one transaction, refusing if the group changed since
//! it was shown.

use std::io::BufRead;
use std::path::Path;

use anyhow::{Context, Result, bail};
use mop_cards::CardId;
use mop_proto::curation::{CombineRequest, ReviewItem};

use crate::api::Connection;
use crate::review::in_editor;

/// Everything from this line on is left out of the edited text (as `git commit` does).
pub const CUT: &str = "# ------------------------ >8 ------------------------";

/// Which card stays.
pub enum Keep {
    /// The group's card of this number (1: the oldest, as the review lists them).
    Base(usize),
    /// Any card of the workspace, at the version the curator read (`None`: read now, and
    /// shown whole when it is unverified, since the combination verifies it).
    Card(CardId, Option<String>),
}

/// Where the text of the card that stays comes from.
pub enum Text<'a> {
    /// Its text as it is.
    Unchanged,
    /// This file (`-`: standard input): a whole card, or a body that replaces its body.
    File(&'a Path),
    /// `$EDITOR`, on its text with every variant below [`CUT`].
    Editor,
}

/// The editor's file: the card that stays, then, below the cut line, each variant's text
/// to take lines from.
fn editor_text(base: &str, item: &ReviewItem) -> String {
    let mut out = base.to_owned();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(CUT);
    out.push_str("\n# Do not change or remove the line above: everything below it is left out.\n");
    out.push_str("# Edit the card above; the group's texts follow, to copy from.\n");
    for (i, (card, text)) in item.cards().enumerate() {
        let author = card
            .provenance
            .as_ref()
            .and_then(|p| p.source.user_id.as_deref())
            .unwrap_or("-");
        out.push_str(&format!(
            "\n# {}. card {} (user {author})\n",
            i + 1,
            card.summary.id
        ));
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// `text` up to the cut line.
fn before_cut(text: &str) -> &str {
    match text.find(&format!("\n{CUT}")) {
        Some(at) => &text[..=at],
        None => text,
    }
}

/// A whole card text from what the curator wrote: a text with frontmatter is taken as it
/// is; a bare body replaces the body of `base` (its frontmatter kept).
fn whole(base: &str, written: &str) -> Result<String> {
    if written.trim_start().starts_with("---") {
        return Ok(written.to_owned());
    }
    let body = mop_cards::card_body(base.as_bytes())
        .context("the card that stays has no readable text")?;
    let front = &base[..base.len() - body.len()];
    Ok(format!("{front}{written}"))
}

/// Combines `item` (a group's review entry): keeps `keep`, with its text from `text`,
/// after the curator says yes (unless `yes`). Prints what happened; returns false when the
/// curator said no.
pub fn run(
    c: &Connection,
    item: &ReviewItem,
    keep: Keep,
    text: Text<'_>,
    yes: bool,
    input: &mut impl BufRead,
) -> Result<bool> {
    let group = item
        .group
        .as_deref()
        .context("this entry is a single card, not a group; verify, reject or merge it")?;
    let cards: Vec<_> = item.cards().collect();
    let (into, current, version) = match keep {
        Keep::Base(n) => {
            let Some((card, text)) = cards.get(n.wrapping_sub(1)) else {
                bail!(
                    "--base {n}: the group has cards 1 to {}; nothing was changed",
                    cards.len()
                );
            };
            (card.summary.id, (*text).to_owned(), card.etag.clone())
        }
        Keep::Card(id, seen) => {
            let d = c.details(&id)?;
            if seen.is_none() && d.card.awaits_review() {
                println!("card {id} is unverified, and stays verified; its whole text:");
                print!("{}", crate::render::text(&d.text, usize::MAX));
            }
            (id, d.text, seen.unwrap_or(d.card.etag))
        }
    };
    let written = match text {
        Text::Unchanged => None,
        Text::File(p) if p.as_os_str() == "-" => Some(
            std::io::read_to_string(std::io::stdin())
                .context("cannot read the text from standard input")?,
        ),
        Text::File(p) => Some(
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        ),
        Text::Editor => {
            let (_file, edited) = in_editor(&editor_text(&current, item), "mop-group-")?;
            Some(before_cut(&edited).to_owned())
        }
    };
    let text = match written {
        Some(w) if w.trim().is_empty() => bail!("the text is empty; nothing was changed"),
        Some(w) => Some(whole(&current, &w)?).filter(|t| *t != current),
        None => None,
    };
    let merged = cards.iter().filter(|(c, _)| c.summary.id != into).count();
    if !yes {
        println!(
            "keep card {into}{}, verified, and merge {merged} card(s) of group {group} into it? [y/N] ",
            if text.is_some() {
                " with the new text"
            } else {
                ""
            }
        );
        let mut answer = String::new();
        input.read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "yes") {
            println!("nothing was changed");
            return Ok(false);
        }
    }
    let req = CombineRequest {
        into,
        into_version: version,
        variants: cards.iter().map(|(c, _)| c.summary.id).collect(),
        text,
    };
    let change = c.combine(group, &req)?;
    println!(
        "group {group} is one card now: {into}, verified; {merged} card(s) merged into it (revision {})",
        change.revision
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_line_ends_the_text_and_a_bare_body_keeps_the_frontmatter() {
        let base =
            "---\nid: 1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7\ntype: fact\ntitle: T\n---\nOld.\n";
        let edited = format!("New body.\n{CUT}\n# 1. card …\nOld.\n");
        assert_eq!(before_cut(&edited), "New body.\n");
        let text = whole(base, before_cut(&edited)).unwrap();
        assert!(text.starts_with("---\nid: 1528fa6d"), "{text}");
        assert!(text.ends_with("---\nNew body.\n"), "{text}");
        // Control: a whole card is taken as written.
        assert_eq!(whole(base, base).unwrap(), base);
    }
}
