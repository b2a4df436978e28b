//! What `mop-curate` prints for people. Card text comes from agents and is hostile: every
//! card-supplied string is shown with control characters escaped, so a title cannot move
//! the cursor, recolour the terminal or fake a prompt.

use std::fmt::Write;

use mop_proto::curation::{
    CardDetails, CardInfo, CardPage, HistoryRow, ReviewItem, SearchResults, StaleCard, StaleReport,
    Usage,
};

/// Card text made safe for a terminal: every hidden character
/// ([`mop_cards::is_hidden_char`]) is shown escaped, so one line stays one line and reads as
/// it is.
pub fn safe(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if mop_cards::is_hidden_char(c) {
                c.escape_unicode().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// A card's text, each line made [`safe`] and marked as quoted card text, at most `max`
/// lines (then how many more there are).
pub fn text(text: &str, max: usize) -> String {
    let mut out = String::new();
    let lines: Vec<&str> = text.lines().collect();
    for line in lines.iter().take(max) {
        let _ = writeln!(out, "  │ {}", safe(line));
    }
    if lines.len() > max {
        let _ = writeln!(out, "  │ … {} more line(s)", lines.len() - max);
    }
    out
}

fn trust(c: &CardInfo) -> &'static str {
    c.standing().as_str()
}

/// How the tasks a card was delivered to ended, and what agents said of it: two lines.
pub fn verdicts(u: &Usage) -> String {
    let o = &u.outcomes_30d;
    let f = &u.feedback;
    let mut out = format!(
        "  outcomes     delivered to {} task(s) in 30 days: {} succeeded, {} failed, {} unknown (a correlation)\n  verdicts     helped {}/{}, wrong {}/{}, outdated {}/{} (7/30 days) from {} user(s) on {} host(s){}\n",
        u.delivered_30d,
        o.succeeded,
        o.failed,
        o.unknown,
        f.helped_7d,
        f.helped_30d,
        f.wrong_7d,
        f.wrong_30d,
        f.outdated_7d,
        f.outdated_30d,
        f.users_30d,
        f.hosts_30d,
        if f.flagged {
            format!("; FLAGGED by {} user(s)", f.against_users)
        } else {
            String::new()
        }
    );
    for n in &f.notes {
        let _ = writeln!(
            out,
            "    - {} {}{}: {}",
            n.at,
            n.verdict.as_str(),
            n.user_id
                .as_deref()
                .map(|u| format!(" by {}", safe(u)))
                .unwrap_or_default(),
            safe(&n.note)
        );
    }
    out
}

/// One line of usage.
pub fn usage(u: &Usage) -> String {
    let last = u.last_delivered_at.map_or_else(
        || "never delivered".to_owned(),
        |t| format!("last delivered {t}"),
    );
    format!(
        "delivered to {} task(s) in 7 days, {} in 30; retrieved by {} in 7 days, {} in 30; {last}; hosts: {}",
        u.delivered_7d,
        u.delivered_30d,
        u.retrieved_7d,
        u.retrieved_30d,
        if u.hosts.is_empty() {
            "none".to_owned()
        } else {
            u.hosts
                .iter()
                .map(|h| safe(h))
                .collect::<Vec<_>>()
                .join(", ")
        }
    )
}

/// A listing.
pub fn page(p: &CardPage) -> String {
    let mut out = String::new();
    if p.cards.is_empty() {
        let _ = writeln!(out, "no cards match ({} in all)", p.total);
        return out;
    }
    for c in &p.cards {
        let _ = writeln!(
            out,
            "{}  {:<16} {:<10} {}  [delivered {}/30d]",
            c.summary.id,
            c.summary.card_type.as_str(),
            trust(c),
            safe(&c.summary.title),
            c.usage.delivered_30d
        );
    }
    let _ = writeln!(
        out,
        "{}–{} of {}{}",
        p.offset + 1,
        p.offset + p.cards.len(),
        p.total,
        if p.offset + p.cards.len() < p.total {
            format!(" (next page: --offset {})", p.offset + p.cards.len())
        } else {
            String::new()
        }
    );
    out
}

/// A card's fields, provenance and usage.
pub fn card(c: &CardInfo) -> String {
    let s = &c.summary;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "card {}  ({}, {})",
        s.id,
        s.card_type.as_str(),
        trust(c)
    );
    let _ = writeln!(out, "  title        {}", safe(&s.title));
    if let Some(d) = &s.description {
        let _ = writeln!(out, "  description  {}", safe(d));
    }
    if !s.labels.is_empty() {
        let _ = writeln!(out, "  labels       {}", safe(&s.labels.join(", ")));
    }
    if !s.error_codes.is_empty() {
        let _ = writeln!(out, "  error codes  {}", safe(&s.error_codes.join(", ")));
    }
    if !s.stacks.is_empty() {
        let _ = writeln!(out, "  stacks       {}", safe(&s.stacks.join(", ")));
    }
    let _ = writeln!(out, "  importance   {}", s.importance);
    let scope: Vec<String> = s
        .scope
        .bindings()
        .map(|(axis, name)| format!("{axis} {}", safe(name)))
        .collect();
    let _ = writeln!(
        out,
        "  scope        {}",
        if scope.is_empty() {
            "whole workspace".to_owned()
        } else {
            scope.join(", ")
        }
    );
    if let Some(p) = &c.provenance {
        let field = |v: &Option<String>| v.as_deref().map_or_else(|| "-".to_owned(), safe);
        let _ = writeln!(
            out,
            "  provenance   task {}, user {}, asset {}, project {}, node token {}, stored {}",
            field(&p.source.task_id),
            field(&p.source.user_id),
            field(&p.source.asset_id),
            field(&p.source.project_id),
            field(&p.node_token),
            p.stored_at
                .map_or_else(|| "-".to_owned(), |t| t.to_string())
        );
    }
    let _ = writeln!(
        out,
        "  counters     occurrence {}, reinforced {} time(s){}",
        c.occurrence,
        c.reinforcements,
        c.last_seen
            .as_ref()
            .map(|t| format!(", last seen {t}"))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "  usage        {}", usage(&c.usage));
    out.push_str(&verdicts(&c.usage));
    if let Some(by) = &s.superseded_by {
        let _ = writeln!(out, "  superseded by {by}");
    }
    for f in &c.credentials {
        let _ = writeln!(
            out,
            "  CREDENTIAL   {f}: verifying would send it to every task; edit it out or `mop-curate delete {}`",
            s.id
        );
    }
    if let Some(r) = &c.previously_rejected {
        let _ = writeln!(
            out,
            "  PREVIOUSLY REJECTED  on {}: {} (rejection {}; `mop-curate lift {}` lets it back)",
            r.at,
            safe(&r.reason),
            r.id,
            r.id
        );
    }
    if let Some(g) = c.duplicate_group.as_ref().filter(|g| g.members.len() > 1) {
        let others: Vec<String> = g
            .members
            .iter()
            .filter(|m| **m != s.id)
            .map(ToString::to_string)
            .collect();
        let _ = writeln!(
            out,
            "  duplicates   stored {} times as the same lesson; also {}",
            g.members.len(),
            others.join(", ")
        );
    }
    for m in &c.merged {
        let p = m.provenance.as_ref();
        let field = |v: Option<&String>| v.map_or_else(|| "-".to_owned(), |s| safe(s));
        let _ = writeln!(
            out,
            "  replaced     {}  (task {}, user {}, asset {})",
            m.id,
            field(p.and_then(|p| p.task_id.as_ref())),
            field(p.and_then(|p| p.user_id.as_ref())),
            field(p.and_then(|p| p.asset_id.as_ref())),
        );
    }
    let _ = writeln!(out, "  version      {}", c.etag);
    out
}

/// A duplicate group's other waiting cards, numbered after the first (`1.`), each with
/// where it came from, its usage and how its text differs from the first's.
pub fn variants(item: &ReviewItem) -> String {
    let mut out = String::new();
    let Some(group) = item.group.as_ref().filter(|_| !item.variants.is_empty()) else {
        return out;
    };
    let _ = writeln!(
        out,
        "  group {group}: {} cards of one lesson wait together; 1. is the card above",
        item.variants.len() + 1
    );
    for (i, v) in item.variants.iter().enumerate() {
        let c = &v.card;
        let p = c.provenance.as_ref().map(|p| &p.source);
        let field = |v: Option<&String>| v.map_or_else(|| "-".to_owned(), |s| safe(s));
        let _ = writeln!(
            out,
            "  {}. {}  {}  user {}, task {}, asset {}; {}",
            i + 2,
            c.summary.id,
            safe(&c.summary.title),
            field(p.and_then(|p| p.user_id.as_ref())),
            field(p.and_then(|p| p.task_id.as_ref())),
            field(p.and_then(|p| p.asset_id.as_ref())),
            usage(&c.usage)
        );
        let d = mop_proto::curation::Differences::between(&item.text, &v.text);
        if d.is_empty() {
            let _ = writeln!(out, "       same text as 1.");
        }
        for l in &d.added {
            let _ = writeln!(out, "       + {}", safe(l));
        }
        for l in &d.missing {
            let _ = writeln!(out, "       - {}", safe(l));
        }
    }
    out
}

/// `show`: the card, its whole text and its versions.
pub fn details(d: &CardDetails) -> String {
    let mut out = card(&d.card);
    let _ = writeln!(out, "text:");
    out.push_str(&text(&d.text, usize::MAX));
    let _ = writeln!(out, "versions:");
    for h in &d.history {
        let _ = writeln!(out, "  {}", history_line(h));
    }
    out
}

fn who(h: &HistoryRow) -> String {
    match &h.actor_name {
        Some(name) => format!("{} ({})", safe(name), h.actor),
        None => h.actor.clone(),
    }
}

fn history_line(h: &HistoryRow) -> String {
    format!(
        "#{} {} {} by {}{}",
        h.seq,
        h.at,
        h.action,
        who(h),
        h.detail
            .as_ref()
            .map(|d| format!(" — {}", safe(d)))
            .unwrap_or_default()
    )
}

/// `history`: each change, and the diff of each change of the text.
pub fn history(rows: &[HistoryRow]) -> String {
    let mut out = String::new();
    let mut previous: Option<&str> = None;
    for h in rows {
        let _ = writeln!(out, "{}", history_line(h));
        if h.redacted {
            let _ = writeln!(out, "  (content redacted)");
            continue;
        }
        if let Some(text) = h.content.as_deref() {
            let diff = similar::TextDiff::from_lines(previous.unwrap_or(""), text);
            for change in diff.iter_all_changes() {
                let sign = match change.tag() {
                    similar::ChangeTag::Delete => "-",
                    similar::ChangeTag::Insert => "+",
                    similar::ChangeTag::Equal => continue,
                };
                let _ = writeln!(
                    out,
                    "  {sign} {}",
                    safe(change.value().trim_end_matches('\n'))
                );
            }
            previous = Some(text);
        }
    }
    out
}

/// Search hits.
pub fn search(r: &SearchResults) -> String {
    let mut out = String::new();
    for h in &r.hits {
        let c = &h.card;
        let _ = writeln!(
            out,
            "{:>7.2}  {}  {:<16} {:<10} {}",
            h.score,
            c.summary.id,
            c.summary.card_type.as_str(),
            trust(c),
            safe(&c.summary.title)
        );
    }
    let _ = writeln!(out, "{} hit(s) among {} card(s)", r.hits.len(), r.searched);
    out
}

fn stale_line(c: &StaleCard) -> String {
    format!(
        "  {}  {:<16} {}{}  (since {}{})",
        c.id,
        c.card_type.as_str(),
        safe(&c.title),
        if c.unverified { " [unverified]" } else { "" },
        c.created_at,
        c.last_delivered_at
            .map(|t| format!(", last delivered {t}"))
            .unwrap_or_else(|| ", never delivered".into())
    )
}

/// The staleness report.
pub fn stale(r: &StaleReport) -> String {
    let mut out = String::new();
    let days = r.days;
    let sections: [(String, &Vec<StaleCard>); 3] = [
        (
            format!("card(s) delivered to no task in {days} days"),
            &r.undelivered,
        ),
        (
            format!("card(s) bound to an asset no task named in {days} days"),
            &r.unnamed_assets,
        ),
        (
            format!("unverified card(s) older than {days} days"),
            &r.old_unverified,
        ),
    ];
    for (what, list) in sections {
        let _ = writeln!(out, "{} {what}:", list.len());
        for c in list {
            let _ = writeln!(out, "{}", stale_line(c));
            if let (Some(a), true) = (&c.asset_id, what.contains("bound to an asset")) {
                let _ = writeln!(
                    out,
                    "      asset {} last named {}",
                    safe(a),
                    c.asset_last_named_at
                        .map_or_else(|| "never".to_owned(), |t| t.to_string())
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "{} supersede chain(s) longer than {}:",
        r.long_chains.len(),
        r.chain
    );
    for c in &r.long_chains {
        let ids: Vec<String> = c.ids.iter().map(|i| i.to_string()).collect();
        let _ = writeln!(out, "  {} ← {}", safe(&c.title), ids.join(" → "));
    }
    let _ = writeln!(
        out,
        "{} card(s) delivered mostly to failing tasks in {days} days (a correlation, not a cause):",
        r.failing.len()
    );
    for f in &r.failing {
        let _ = writeln!(
            out,
            "{}\n      delivered to {} task(s): {} failed, {} succeeded, {} unknown",
            stale_line(&f.card),
            f.delivered,
            f.outcomes.failed,
            f.outcomes.succeeded,
            f.outcomes.unknown
        );
    }
    out
}

/// Lines of a card's text a review entry shows (`e` or `show` gives the rest).
pub const REVIEW_LINES: usize = 40;

/// Whether a review entry shows all an agent would read of the card: the entry prints the
/// raw file (hidden characters escaped, so the parts a rendered view leaves out are there
/// to read, and named in a note), and its whole text when it fits in [`REVIEW_LINES`].
/// Otherwise a verify waits until the curator has read the whole text (`t`).
pub fn shows_all(item: &ReviewItem) -> bool {
    item.text.lines().count() <= REVIEW_LINES
}

/// One review entry: the card, its text (what a verify makes workspace memory) and its
/// nearest cards, numbered for `merge`.
pub fn review_item(n: usize, total: usize, item: &ReviewItem) -> String {
    let mut out = format!("[{n}/{total}] ");
    if item.flagged {
        out.push_str(
            "FLAGGED: verified memory agents called wrong or outdated; edit it, archive it, or keep it (mop-curate keep ID)\n",
        );
    }
    out.push_str(&card(&item.card));
    if !item.unshown.is_empty() {
        out.push_str(
            "  NOTE: this card holds text a rendered view does not show; agents read it:\n",
        );
        for u in &item.unshown {
            let _ = writeln!(out, "    - {}", safe(u));
        }
    }
    out.push_str("  text:\n");
    out.push_str(&text(&item.text, REVIEW_LINES));
    out.push_str(&variants(item));
    if item.nearest.is_empty() {
        out.push_str("  nearest      none\n");
    } else {
        out.push_str("  nearest:\n");
        for (i, c) in item.nearest.iter().enumerate() {
            let _ = writeln!(
                out,
                "    {}. {}  {:<16} {}{}  (score {:.2})",
                i + 1,
                c.id,
                c.card_type.as_str(),
                safe(&c.title),
                if c.unverified { " [unverified]" } else { "" },
                c.score
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_text_cannot_reach_the_terminal_as_control_codes() {
        let title = "ok\u{1b}[2J\u{1b}]0;pwned\u{7}\nmop-curate> v";
        let shown = safe(title);
        assert!(!shown.chars().any(mop_cards::is_hidden_char), "{shown:?}");
        assert!(
            shown.contains("\\u{1b}[2J") && shown.contains("\\u{a}"),
            "{shown}"
        );
        // Bidi overrides and invisible characters cannot reorder or hide what follows.
        let tricky = "safe \u{202E}deifirev\u{202C} \u{200B}x\u{2028}y";
        let shown = safe(tricky);
        assert!(!shown.chars().any(mop_cards::is_hidden_char), "{shown:?}");
        assert!(
            shown.contains("\\u{202e}") && shown.contains("\\u{2028}"),
            "{shown}"
        );
        // Control: ordinary text, CJK included, is left alone.
        assert_eq!(safe("ORA-01555 快照过旧 — ok"), "ORA-01555 快照过旧 — ok");
    }
}
