//! `mop-bench curation`: what a curator waits for at fleet scale: the review queue's
//! first page, a card's details, the staleness report, search and a listing page.
//!
//! A release `mop-server` on an SQLite file holds a synthetic workspace (imported), and
//! then takes the agent stores a busy fleet makes: `groups` lessons, each stored by
//! `unverified / groups` users whose tasks cannot see each other's drafts, so each lesson
//! becomes a duplicate group of unverified cards in the queue. Each read is timed at the
//! client, request to whole answer, over one kept-alive connection, the kinds taken in
//! turn after a warm-up round. The same reads at two sizes show whether a read grows with
//! the workspace (a scan) or with its answer (an index).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mop_bench::{Section, show, summarize, synth};
use mop_proto::routes::server;
use serde_json::{Value, json};

pub struct Options {
    pub cards: Vec<usize>,
    pub unverified: usize,
    pub groups: usize,
    pub iterations: usize,
    pub seed: u64,
}

/// The reads timed, in the order they are taken.
const READS: [&str; 5] = ["queue page", "card details", "stale", "search", "list page"];

/// Stores `groups` lessons, each by `per` users: answers the ids made.
fn store_groups(
    http: &reqwest::blocking::Client,
    url: &str,
    node: &str,
    o: &Options,
    cards: usize,
) -> Result<Vec<String>> {
    let per = (o.unverified / o.groups.max(1)).max(1);
    let now = "2026-11-29T00:00:00Z".parse().expect("a valid timestamp");
    let mut ids = Vec::new();
    for g in 0..o.groups {
        let c = synth::card(o.seed ^ 0xc0de, g, cards, now);
        // A lesson long enough that one line of each user's own stays the same lesson.
        let shared = format!(
            "{}\n\nSeen again in lesson {g}: check the replica lag first.\n\
             Do not restart the service while it catches up.\n\
             Resume the batch jobs once the lag is under a second.\n",
            c.body.trim_end()
        );
        for k in 0..per {
            let req = json!({
                "provenance": {"task_id": format!("cur-{g}-{k}"), "user_id": format!("user-{k}")},
                "card": {"type": "fact", "title": c.summary.title,
                         "body": format!("{shared}User {k} adds one detail of their own.\n")}
            });
            let r = http.post(url).bearer_auth(node).json(&req).send()?;
            let status = r.status();
            let v: Value = r.json().unwrap_or(Value::Null);
            if !status.is_success() {
                bail!("store {g}/{k} answered {status}: {v}");
            }
            if let Some(id) = v["id"].as_str() {
                ids.push(id.to_owned());
            }
        }
    }
    Ok(ids)
}

pub fn run(o: &Options) -> Result<Section> {
    let mut section = Section::new("Curation reads at fleet scale");
    section.line(format!(
        "Each read is timed at the client from request to whole answer, over one kept-alive \
         connection, against a release mop-server on an SQLite file holding a synthetic workspace \
         plus {} unverified cards stored by agents as {} lessons (each by {} users whose tasks \
         could not see each other's drafts). The reads are taken in turn, {} of each per size after \
         a warm-up round: the review queue's first page (50 entries, each with its cards' text), \
         one card's details (a random card: its provenance, usage and history), the staleness \
         report (30 days), a search (a word from a random title) and a listing page (50 cards). \
         Then the queue page right after an agent's store (a new revision: the curation search index \
         behind each entry's nearest cards is rebuilt, in the request below 20,000 cards and in the \
         background above, while the previous index serves).\n",
        o.unverified,
        o.groups,
        (o.unverified / o.groups.max(1)).max(1),
        o.iterations
    ));
    section.line("| cards | read | p50 | p90 | max | answer bytes (median) |");
    section.line("|---|---|---|---|---|---|");
    let mut medians: Vec<(usize, &str, Duration)> = Vec::new();
    let mut notes = Vec::new();
    for &n in &o.cards {
        let tmp = tempfile::tempdir()?;
        let (ws, dir) = synth::workspace_in(o.seed, n, tmp.path())?;
        let server = mop_testkit::procs::Server::start_with(
            "[limits]\nstores_per_task = 1000000\nstores_per_token_per_minute = 100000000\nstores_per_task_per_minute = 100000000\n[sync]\ncounter_publish_secs = 3600\n",
        );
        let (node, admin) = (
            server.token("node", &["bench"]),
            server.token("admin", &["bench"]),
        );
        eprintln!("importing {n} cards");
        let out = server.import(&dir, "bench");
        if !out.status.success() {
            bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let http = mop_testkit::http_builder()
            .pool_max_idle_per_host(1)
            .timeout(Duration::from_secs(120))
            .build()
            .context("HTTP client")?;
        let base = &server.url;
        eprintln!("storing {} unverified cards", o.unverified);
        let started = Instant::now();
        let waiting = store_groups(
            &http,
            &format!("{base}{}", server::MEMORIES.path(&["bench"])),
            &node,
            o,
            n,
        )?;
        eprintln!("stored in {}", show(started.elapsed()));
        let get = |path: String| -> Result<usize> {
            let r = http
                .get(format!("{base}{path}"))
                .bearer_auth(&admin)
                .send()?;
            let status = r.status();
            let bytes = r.bytes()?.len();
            if !status.is_success() {
                bail!("GET {path} answered {status}");
            }
            Ok(bytes)
        };
        let queue: Value = http
            .get(format!(
                "{base}{}?limit=50",
                server::REVIEW.path(&["bench"])
            ))
            .bearer_auth(&admin)
            .send()?
            .json()?;
        notes.push(format!(
            "At {n} cards the queue held {} entries for {} waiting cards.",
            queue["total"], queue["cards"]
        ));
        let mut rng = synth::Rng::new(o.seed ^ 0xcafe);
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); READS.len()];
        let mut sizes: Vec<Vec<usize>> = vec![Vec::new(); READS.len()];
        for round in 0..=o.iterations {
            for (k, _) in READS.iter().enumerate() {
                let path = match k {
                    0 => format!("{}?limit=50", server::REVIEW.path(&["bench"])),
                    1 => {
                        let id = if rng.chance(0.5) {
                            ws.cards[rng.below(ws.cards.len())].summary.id.to_string()
                        } else {
                            waiting[rng.below(waiting.len())].clone()
                        };
                        server::CARD_DETAILS.path(&["bench", &id])
                    }
                    2 => format!("{}?days=30", server::STALE.path(&["bench"])),
                    3 => {
                        let title = &ws.cards[rng.below(ws.cards.len())].summary.title;
                        let word = title
                            .split_whitespace()
                            .find(|w| w.len() > 3)
                            .unwrap_or("replica");
                        format!(
                            "{}?q={}&limit=50",
                            server::SEARCH.path(&["bench"]),
                            word.trim_matches(|c: char| !c.is_alphanumeric())
                        )
                    }
                    _ => format!("{}?limit=50", server::CARDS.path(&["bench"])),
                };
                let t = Instant::now();
                let bytes = get(path)?;
                if round > 0 {
                    samples[k].push(t.elapsed());
                    sizes[k].push(bytes);
                }
            }
        }
        // The first view after a change: a store moved the revision, so the search index
        // behind the nearest cards is behind (rebuilt in the request below 20k cards, in
        // the background above, while the previous one serves).
        let mut after = Vec::new();
        let mut after_sizes = Vec::new();
        for i in 0..o.iterations.clamp(3, 10) {
            let req = json!({
                "provenance": {"task_id": format!("after-{i}"), "user_id": "user-after"},
                "card": {"type": "pitfall", "title": format!("Queue check {i}: the nightly {} job",
                             ws.cards[rng.below(ws.cards.len())].summary.title),
                         "body": format!("A new lesson number {i} for the queue after a change.\n")}
            });
            let url = format!("{base}{}", server::MEMORIES.path(&["bench"]));
            let r = http.post(&url).bearer_auth(&node).json(&req).send()?;
            if !r.status().is_success() {
                bail!("store after-{i} answered {}", r.status());
            }
            let t = Instant::now();
            after_sizes.push(get(format!(
                "{}?limit=50",
                server::REVIEW.path(&["bench"])
            ))?);
            after.push(t.elapsed());
        }
        samples.push(after);
        sizes.push(after_sizes);
        for (k, read) in READS
            .iter()
            .chain(["queue page after a store"].iter())
            .enumerate()
        {
            let mut v = samples[k].clone();
            let s = summarize(&mut v);
            v.sort();
            let p90 = v[v.len() * 9 / 10];
            let mut b = sizes[k].clone();
            b.sort_unstable();
            section.line(format!(
                "| {n} | {read} | {} | {} | {} | {} |",
                show(s.median),
                show(p90),
                show(*v.last().expect("samples")),
                b[b.len() / 2]
            ));
            section.figure(
                format!("curation.{}_p50_us.{n}", read.replace(' ', "_")),
                s.median.as_micros() as f64,
                true,
            );
            medians.push((n, read, s.median));
        }
        drop(server);
    }
    section.line("");
    for note in notes {
        section.line(note);
    }
    if let (Some(&small), Some(&large)) = (o.cards.iter().min(), o.cards.iter().max())
        && large > small
    {
        section.line(format!(
            "\nMedian at {large} cards over the median at {small} ({}× the cards):\n",
            large / small
        ));
        section.line("| read | ratio |");
        section.line("|---|---|");
        for read in READS.iter().chain(["queue page after a store"].iter()) {
            let at = |n: usize| {
                medians
                    .iter()
                    .find(|(m, r, _)| *m == n && *r == *read)
                    .map(|(_, _, d)| d.as_secs_f64())
            };
            if let (Some(a), Some(b)) = (at(small), at(large)) {
                section.line(format!("| {read} | {:.2} |", b / a));
            }
        }
    }
    if let Some(&(n, _, d)) = medians
        .iter()
        .filter(|(n, r, _)| *r == "queue page" && *n >= 100_000)
        .max_by_key(|(n, _, _)| *n)
    {
        section.target(
            &format!("median queue page at {n} cards"),
            "≤ 100 ms",
            show(d),
            d <= Duration::from_millis(100),
        );
    }
    Ok(section)
}
