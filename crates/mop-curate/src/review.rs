//! The interactive review queue and `edit`. Each answer acts on the version of the card
//! the curator was shown: a card changed meanwhile is refused by the server (412) and
//! left in the queue, and an edit that loses the race is kept in a file, never dropped.

use std::io::{BufRead, Write};

use anyhow::{Context, Result, bail};
use mop_cards::CardId;
use mop_proto::curation::{PageQuery, ReviewItem};

use crate::api::{Connection, refusal};
use crate::{combine, render};

/// Reads one answer; `None` at the end of the input.
fn ask(input: &mut impl BufRead, prompt: &str, echo: bool) -> Result<Option<String>> {
    print!("{prompt}");
    std::io::stdout().flush()?;
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        println!();
        return Ok(None);
    }
    let answer = line.trim().to_owned();
    if echo {
        println!("{answer}");
    }
    Ok(Some(answer))
}

/// What happened to one entry.
enum Outcome {
    /// It left the queue (verified, rejected or merged).
    Done,
    /// It stays in the queue.
    Skipped,
    /// The curator is done.
    Quit,
}

/// Goes through the queue, a page at a time, until it is empty or the curator quits.
/// `interactive` is false when answers come from a pipe (they are echoed then).
pub fn run(
    c: &Connection,
    limit: usize,
    input: &mut impl BufRead,
    interactive: bool,
) -> Result<()> {
    let (mut skipped, mut reviewed) = (0usize, 0usize);
    // Entries shown, and the queue's length when the review began (for "[n/total]").
    let (mut shown, mut total) = (0usize, None::<usize>);
    loop {
        let queue = c.review(&PageQuery {
            offset: Some(skipped),
            limit: Some(limit.clamp(1, 500)),
        })?;
        if queue.items.is_empty() {
            if reviewed + skipped == 0 {
                println!("the review queue of {} is empty", c.workspace);
            } else {
                println!("end of the queue: {reviewed} reviewed, {skipped} skipped");
            }
            return Ok(());
        }
        let total = *total.get_or_insert(queue.total);
        for item in &queue.items {
            shown += 1;
            println!();
            print!("{}", render::review_item(shown, total.max(shown), item));
            match one(c, item, input, !interactive)? {
                Outcome::Done => reviewed += 1,
                Outcome::Skipped => skipped += 1,
                Outcome::Quit => {
                    println!("stopped: {reviewed} reviewed, {skipped} skipped");
                    return Ok(());
                }
            }
        }
    }
}

/// Asks about one entry until it is answered.
fn one(c: &Connection, item: &ReviewItem, input: &mut impl BufRead, echo: bool) -> Result<Outcome> {
    let id = item.card.summary.id;
    let mut etag = item.card.etag.clone();
    // A verify makes the whole file workspace memory: it waits until all of it was shown.
    let mut seen_all = render::shows_all(item);
    loop {
        let group = if item.variants.is_empty() {
            ""
        } else {
            "c(ombine the group) "
        };
        let prompt = if seen_all {
            format!("v(erify) {group}r(eject) m(erge) e(dit) s(kip) q(uit)? ")
        } else {
            format!("t(ext: read all to verify) {group}r(eject) m(erge) e(dit) s(kip) q(uit)? ")
        };
        let Some(answer) = ask(input, &prompt, echo)? else {
            return Ok(Outcome::Quit);
        };
        let result = match answer.as_str() {
            "t" | "text" => {
                println!("  whole text of {id}:");
                print!("{}", render::text(&item.text, usize::MAX));
                seen_all = true;
                continue;
            }
            "v" | "verify" if !seen_all => {
                println!(
                    "not verified: the text above is not all an agent would read of {id}; press t to read the whole file first"
                );
                continue;
            }
            "v" | "verify" => c
                .verify(&id, None, Some(&etag), false)
                .map(|_| format!("verified {id}")),
            "r" | "reject" => {
                let Some(reason) = ask(input, "reason? ", echo)? else {
                    return Ok(Outcome::Quit);
                };
                if reason.is_empty() {
                    println!("a rejection needs a reason; nothing was changed");
                    continue;
                }
                c.reject(&id, &reason, Some(&etag))
                    .map(|_| format!("rejected {id}"))
            }
            "c" | "combine" if !item.variants.is_empty() => {
                let Some(base) = ask(
                    input,
                    &format!(
                        "keep which card (1 to {}) as the base to edit? ",
                        item.variants.len() + 1
                    ),
                    echo,
                )?
                else {
                    return Ok(Outcome::Quit);
                };
                let Ok(n) = base.parse::<usize>() else {
                    println!("{base:?} is not a number from the group; nothing was changed");
                    continue;
                };
                let keep = combine::Keep::Base(n);
                match combine::run(c, item, keep, combine::Text::Editor, false, input) {
                    Ok(true) => return Ok(Outcome::Done),
                    Ok(false) => continue,
                    Err(e) => Err(e),
                }
            }
            "m" | "merge" => match merge_target(c, item, input, echo)? {
                Target::Quit => return Ok(Outcome::Quit),
                Target::None => continue,
                // A group goes into the target as one: none of its cards is left behind.
                Target::Card(target, verify) if !item.variants.is_empty() => {
                    let keep = combine::Keep::Card(target, verify);
                    combine::run(c, item, keep, combine::Text::Unchanged, true, input)
                        .map(|_| String::new())
                }
                Target::Card(target, verify) => c
                    .merge(&id, &target, verify, Some(&etag))
                    .map(|_| format!("merged {id} into {target}")),
            },
            "e" | "edit" => {
                match edit(c, &id, Some(&etag)) {
                    Ok(Some(new_tag)) => etag = new_tag,
                    Ok(None) => {}
                    Err(e) => println!("{e:#}"),
                }
                continue;
            }
            "s" | "skip" | "" => return Ok(Outcome::Skipped),
            "q" | "quit" => return Ok(Outcome::Quit),
            other => {
                println!("{other:?} is not an answer: v, t, r, m, e, s or q");
                continue;
            }
        };
        match result {
            Ok(message) => {
                if !message.is_empty() {
                    println!("{message}");
                }
                return Ok(Outcome::Done);
            }
            Err(e) if refusal(&e).is_some_and(|r| r.status.as_u16() == 412) => {
                println!(
                    "card {id} changed since it was shown; nothing was changed, and it stays in the queue: run `mop-curate review` again to see its new version"
                );
                return Ok(Outcome::Skipped);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The card a merge goes into.
enum Target {
    /// This card; an unverified one with the version the curator read, to verify it in
    /// the same action.
    Card(CardId, Option<String>),
    /// No target: nothing to do.
    None,
    /// The input ended.
    Quit,
}

/// Asks for a merge target (a number of the nearest list, or a card id). An unverified
/// target is shown whole and verified in the same action only if the curator says so
/// (only its author's tasks see it otherwise, and the server refuses the merge).
fn merge_target(
    c: &Connection,
    item: &ReviewItem,
    input: &mut impl BufRead,
    echo: bool,
) -> Result<Target> {
    let Some(into) = ask(input, "merge into (a number above, or a card id)? ", echo)? else {
        return Ok(Target::Quit);
    };
    let target = match into.parse::<usize>() {
        Ok(n) if (1..=item.nearest.len()).contains(&n) => Some(item.nearest[n - 1].id),
        _ => CardId::parse(&into).ok(),
    };
    let Some(target) = target else {
        println!(
            "{into:?} is neither a number from the nearest list nor a card id; nothing was changed"
        );
        return Ok(Target::None);
    };
    let details = c.details(&target)?;
    if !details.card.awaits_review() {
        return Ok(Target::Card(target, None));
    }
    println!("card {target} is unverified; its whole text:");
    print!("{}", render::text(&details.text, usize::MAX));
    let Some(answer) = ask(input, "verify it and merge into it? [y/N] ", echo)? else {
        return Ok(Target::Quit);
    };
    if matches!(answer.as_str(), "y" | "yes") {
        Ok(Target::Card(target, Some(details.card.etag)))
    } else {
        println!("nothing was changed");
        Ok(Target::None)
    }
}

/// Edits a card in `$VISUAL`/`$EDITOR` and saves it if it is still at `seen` (or, without
/// one, at the version opened). Returns the new version tag, or `None` when nothing
/// changed. Text that could not be saved stays in a file, named in the error.
/// Opens `text` in `$VISUAL` or `$EDITOR` (else vi), in a temporary file named with
/// `prefix`, and answers the file and what it holds when the editor exits successfully.
pub fn in_editor(text: &str, prefix: &str) -> Result<(tempfile::NamedTempFile, String)> {
    let mut file = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(".md")
        .tempfile()
        .context("cannot make a file to edit in")?;
    file.write_all(text.as_bytes())?;
    file.flush()?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".to_owned());
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(file.path())
        .status()
        .with_context(|| format!("cannot start the editor {editor:?} (set $EDITOR)"))?;
    if !status.success() {
        bail!("the editor {editor:?} failed ({status}); nothing was saved");
    }
    let edited = std::fs::read_to_string(file.path())
        .with_context(|| format!("cannot read back {}", file.path().display()))?;
    Ok((file, edited))
}

pub fn edit(c: &Connection, id: &CardId, seen: Option<&str>) -> Result<Option<String>> {
    let (text, current) = c.text(id)?;
    let etag = seen.unwrap_or(&current).to_owned();
    let (file, edited) = in_editor(&text, &format!("mop-card-{id}-"))?;
    if edited == text {
        println!("no change to card {id}");
        return Ok(None);
    }
    match c.update(id, edited, &etag) {
        Ok(change) => {
            println!("saved card {id} (revision {})", change.revision);
            Ok(change.etag)
        }
        Err(e) => {
            let (_, kept) = file.keep().context("cannot keep the edited text")?;
            let why = match refusal(&e) {
                Some(r) if r.status.as_u16() == 412 => format!(
                    "card {id} changed since you opened it, so your edit was not saved (nothing was overwritten)"
                ),
                _ => format!("{e:#}"),
            };
            bail!(
                "{why}. Your text is kept in {}: see the new version with `mop-curate show {id}`, then `mop-curate edit {id}` again",
                kept.display()
            )
        }
    }
}
