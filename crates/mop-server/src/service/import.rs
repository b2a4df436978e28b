//! A curator's import (`POST …/import`): the memory files agents and teams already keep,
//! read by `mop_intake::import`, entering the workspace by the write path's rules.
//!
//! - A section becomes an **unverified card with no author**: it reaches no task until a
//!   curator verifies it, and waits in the queue. Its provenance says who imported it from
//!   which file; its history names the curator.
//! - Memory enters once: a section whose lesson a verified card already holds is left
//!   out (naming that card), and so is one imported from the same file already; one that
//!   repeats an unverified card joins its duplicate group;
//!   one a curator rejected is left out with the rejection's reason; two sections of the
//!   same import with one lesson become one group.
//! - A section that carries a credential is left out, with the kinds (never the values).
//! - An OKF card is taken as it is, its id kept; one whose id exists is left out.
//! - A dry run decides exactly the same, and changes nothing.
//!
//! What is left out is reported; the rest goes in, in one transaction.

use mop_cards::{Card, CardId, Provenance, Scope, Trust, render_card};
use mop_intake::import::{Draft, Source, read_source};
use mop_intake::lesson::Lesson;
use mop_proto::curation::{ImportAnswer, ImportOutcome, ImportRequest, ImportSkip, ImportedCard};
use mop_proto::sync::NewCard;

use crate::store::cards::screen_admin;
use crate::store::db::Tx;
use crate::store::intake;
use crate::store::{Result, Store, StoreError};

/// Who imports: the curator's name for provenance, the actor for the audit rows.
#[derive(Debug, Clone, Copy)]
pub struct Importer<'a> {
    /// The admin token's name (its id when it has none).
    pub name: &'a str,
    /// The audit actor (`token:ID`).
    pub actor: &'a str,
    /// The workspaces composed with this one (`Inheritance::composed_with`): a card file
    /// whose id one of them holds is left out.
    pub composed_with: &'a [String],
}

/// A card ready to enter, and where it came from.
struct Entry {
    file: String,
    card: Card,
    raw: Vec<u8>,
    /// An OKF card, taken as written (no lesson rules).
    okf: bool,
}

/// Imports (or, with `dry_run`, plans) the request's files.
pub fn import(
    store: &Store,
    ws: &str,
    req: &ImportRequest,
    by: Importer<'_>,
) -> Result<ImportAnswer> {
    if let Some(u) = &req.user
        && !mop_cards::is_scope_id(u)
    {
        return Err(StoreError::Invalid(format!(
            "user {u:?} is not a valid user id (1 to 128 characters, no control characters)"
        )));
    }
    let mut skipped = Vec::new();
    let mut entries = Vec::new();
    for f in &req.files {
        read_file(
            f.path.as_str(),
            &f.text,
            req,
            by,
            &mut entries,
            &mut skipped,
        );
    }
    let mut answer = ImportAnswer {
        cards: Vec::new(),
        skipped,
        done: !req.dry_run,
        revision: None,
    };
    // A dry run decides in a read transaction exactly as the import would in its write.
    let run = |tx: &Tx<'_>| -> Result<()> {
        if !req.dry_run {
            store.open_workspace(tx, ws)?;
        }
        let mut batch = Batch::default();
        for entry in &entries {
            let within = (ws, by.composed_with);
            let Some(card) = admit(store, tx, within, entry, &mut batch, &mut answer.skipped)?
            else {
                continue;
            };
            if !req.dry_run {
                let detail = format!("from={}", entry.file);
                let change = store.insert_card(
                    tx,
                    ws,
                    &entry.card,
                    &entry.raw,
                    by.actor,
                    ("import", Some(&detail)),
                )?;
                if let Some(with) = &card.with {
                    store.group_with(tx, ws, &card.id, with)?;
                }
                answer.revision = Some(change.revision);
            }
            answer.cards.push(card);
        }
        Ok(())
    };
    if req.dry_run {
        store.read(run)?;
    } else {
        store.write(run)?;
    }
    Ok(answer)
}

/// The cards this import made (or, in a dry run, would make): what later sections are
/// compared with, so the dry run and the import decide alike.
#[derive(Default)]
struct Batch {
    /// Each card's lesson, id and whether it is verified (an OKF card may be).
    cards: Vec<(Lesson, CardId, bool)>,
}

impl Batch {
    fn has(&self, id: &CardId) -> bool {
        self.cards.iter().any(|(_, c, _)| c == id)
    }
}

/// Reads one file into entries, or says why it is skipped.
fn read_file(
    path: &str,
    text: &str,
    req: &ImportRequest,
    by: Importer<'_>,
    entries: &mut Vec<Entry>,
    skipped: &mut Vec<ImportSkip>,
) {
    let skip = |title: Option<String>, reason: String| ImportSkip {
        file: path.to_owned(),
        title,
        reason,
    };
    match read_source(path, text) {
        Source::Skip(reason) => skipped.push(skip(None, reason)),
        Source::Card(card) => {
            let raw = text.as_bytes().to_vec();
            entries.push(Entry {
                file: path.to_owned(),
                card: *card,
                raw,
                okf: true,
            });
        }
        Source::Drafts {
            drafts, refused, ..
        } => {
            for r in refused {
                skipped.push(skip(r.title, r.reason));
            }
            for d in drafts {
                let card = draft_card(d, path, req.user.as_deref(), by.name);
                let raw = render_card(&card).into_bytes();
                entries.push(Entry {
                    file: path.to_owned(),
                    card,
                    raw,
                    okf: false,
                });
            }
        }
    }
}

/// The card a draft becomes: unverified, no author, "imported by NAME from FILE".
fn draft_card(d: Draft, file: &str, user: Option<&str>, curator: &str) -> Card {
    let scope = Scope {
        user_id: user.filter(|_| d.personal).map(str::to_owned),
        ..Scope::default()
    };
    let fields = NewCard {
        card_type: d.card_type,
        title: d.title,
        description: d.description,
        labels: Vec::new(),
        error_codes: Vec::new(),
        stacks: Vec::new(),
        scope,
        body: d.body,
    };
    let provenance = Provenance {
        imported_by: Some(curator.to_owned()),
        imported_from: Some(file.to_owned()),
        ..Default::default()
    };
    fields.into_card(Trust::Unverified, Some(provenance), jiff::Timestamp::now())
}

/// Whether an entry goes in, and as what; a refusal is added to `skipped`.
fn admit(
    store: &Store,
    tx: &Tx<'_>,
    (ws, composed_with): (&str, &[String]),
    entry: &Entry,
    batch: &mut Batch,
    skipped: &mut Vec<ImportSkip>,
) -> Result<Option<ImportedCard>> {
    let s = &entry.card.summary;
    let mut skip = |reason: String| {
        skipped.push(ImportSkip {
            file: entry.file.clone(),
            title: Some(s.title.clone()),
            reason,
        });
        Ok(None)
    };
    if let Err(e) = entry.card.validate() {
        return skip(format!("not a valid card: {e}"));
    }
    if let Err(e) = screen_admin(&entry.raw, &s.id, &[]) {
        return skip(format!("{e}: edit the credential out of the file"));
    }
    let mut imported = ImportedCard {
        file: entry.file.clone(),
        id: s.id,
        card_type: s.card_type,
        title: s.title.clone(),
        outcome: ImportOutcome::Created,
        with: None,
    };
    let lesson = intake::lesson(&s.title, &entry.card.body);
    if entry.okf {
        if batch.has(&s.id) || store.find_row(tx, ws, &s.id)?.is_some() {
            return skip(format!(
                "card {} exists in workspace {ws} (or earlier in this import): edit it there instead",
                s.id
            ));
        }
        if let Some(other) = store.id_held_in(tx, composed_with, &s.id)? {
            return skip(crate::store::cards::id_taken(&s.id, &other).to_string());
        }
        batch.cards.push((lesson, s.id, s.trust == Trust::Verified));
        return Ok(Some(imported));
    }
    if let Some(stone) = store.rejected_lesson(tx, ws, &lesson)? {
        let r = stone.note;
        return skip(format!(
            "a curator rejected this lesson on {}: {} (lift rejection {} to import it)",
            r.at, r.reason, r.id
        ));
    }
    // The workspace's cards of the same lesson; this import's own are compared below.
    let mut matches: Vec<_> = store
        .same_lesson_cards(tx, ws, &lesson)?
        .into_iter()
        .filter(|m| !batch.has(&m.row.summary.id))
        .collect();
    matches.sort_by(|a, b| b.score.total_cmp(&a.score));
    if let Some(m) = matches
        .iter()
        .find(|m| m.row.summary.trust == Trust::Verified)
    {
        return skip(format!(
            "verified card {} holds the same lesson already",
            m.row.summary.id
        ));
    }
    let from = |m: &&crate::store::memories::Match| {
        let p = m.row.summary.provenance.as_ref();
        p.and_then(|p| p.imported_from.as_deref()) == Some(entry.file.as_str())
    };
    if let Some(m) = matches.iter().find(from) {
        // The same file imported again: the lesson is in the queue already.
        return skip(format!(
            "imported from this file already, as card {}",
            m.row.summary.id
        ));
    }
    let same = &store.intake_policy().same_lesson;
    let earlier = batch
        .cards
        .iter()
        .find(|(l, _, _)| lesson.same_as(l, same).is_some());
    if let Some((_, id, true)) = earlier {
        return skip(format!(
            "verified card {id}, earlier in this import, holds the same lesson"
        ));
    }
    let earlier = earlier.map(|(_, id, _)| *id);
    if let Some(with) = matches.first().map(|m| m.row.summary.id).or(earlier) {
        imported.outcome = ImportOutcome::Grouped;
        imported.with = Some(with);
    }
    batch.cards.push((lesson, s.id, false));
    Ok(Some(imported))
}
