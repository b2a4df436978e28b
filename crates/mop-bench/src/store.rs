//! `mop-bench store`: how long an agent's store takes at the card server, with credential
//! screening and the same-lesson rule, in workspaces of several sizes.
//!
//! A release `mop-server` on an SQLite file holds a synthetic workspace (imported first);
//! the benchmark then sends stores one after another over one kept-alive connection, as a
//! host daemon does, each from its own task, and times each from request to answer. The
//! mix is a busy team's: new lessons (synthetic cards the workspace does not hold),
//! rewordings of cards it holds (case and punctuation changed, the reinforce path),
//! repeats of an earlier store from another task, and stores that carry a credential
//! (refused). A warm-up round runs first and is not counted.

use mop_proto::routes::server;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mop_bench::{Section, show, summarize, synth};
use serde_json::{Value, json};

pub struct Options {
    pub cards: Vec<usize>,
    pub stores: usize,
    pub seed: u64,
}

/// What one store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    New,
    Reworded,
    Repeat,
    Credential,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::New => "a new lesson",
            Kind::Reworded => "a rewording of a stored card",
            Kind::Repeat => "a repeat of an earlier store",
            Kind::Credential => "a card with a credential (refused)",
        }
    }
}

fn reword(text: &str) -> String {
    // The same words: case and punctuation changed, as agents restate a lesson.
    text.replace(['.', ',', ':'], " ").to_uppercase()
}

/// The stores to send: (kind, title, body).
fn mix(ws: &synth::Synthetic, seed: u64, count: usize) -> Vec<(Kind, String, String)> {
    let now = "2026-11-29T00:00:00Z".parse().expect("a valid timestamp");
    let mut rng = synth::Rng::new(seed ^ 0x5707e);
    let mut out: Vec<(Kind, String, String)> = Vec::with_capacity(count);
    for i in 0..count {
        let kind = match rng.below(10) {
            0..4 => Kind::New,
            4..7 => Kind::Reworded,
            7..9 if out
                .iter()
                .any(|s: &(Kind, String, String)| s.0 != Kind::Credential) =>
            {
                Kind::Repeat
            }
            7..9 => Kind::New,
            _ => Kind::Credential,
        };
        let (title, body) = match kind {
            Kind::New => {
                let c = synth::card(seed ^ 0xbeef, i, ws.cards.len(), now);
                (c.summary.title, c.body)
            }
            Kind::Reworded => {
                let c = &ws.cards[rng.below(ws.cards.len())];
                (reword(&c.summary.title), reword(&c.body))
            }
            Kind::Repeat => {
                // An earlier store that went in (a refused one is refused again).
                let earlier: Vec<&(Kind, String, String)> =
                    out.iter().filter(|s| s.0 != Kind::Credential).collect();
                let (_, t, b) = earlier[rng.below(earlier.len())].clone();
                (t, b)
            }
            Kind::Credential => {
                let c = synth::card(seed ^ 0xf00d, i, ws.cards.len(), now);
                (
                    c.summary.title,
                    format!(
                        "{}\n\nThe job authenticates with ghp_{:036x}.\n",
                        c.body,
                        rng.next_u64() as u128 * rng.next_u64() as u128
                    ),
                )
            }
        };
        out.push((kind, title, body));
    }
    out
}

pub fn run(o: &Options) -> Result<Section> {
    let mut section = Section::new("Agent stores: screening and the same-lesson rule");
    section.line(format!(
        "Each store is timed at the client from request to answer: {} stores per size after {} not counted, \
         each from its own task, one after another over one kept-alive connection (as a daemon sends them), \
         to a release mop-server on an SQLite file holding a synthetic workspace. The mix: 40 % new lessons, \
         30 % rewordings of stored cards (case and punctuation changed: the reinforce path), 20 % repeats \
         of an earlier store from another task, 10 % carrying a credential (refused). Every store is \
         screened (gitleaks' rules and mop's) and looked up by the same-lesson rule.\n",
        o.stores,
        o.stores / 5
    ));
    section.line("| cards | stores | p50 | p90 | p99 | max | created | reinforced | refused |");
    section.line("|---|---|---|---|---|---|---|---|---|");
    let mut by_kind_rows = Vec::new();
    for &n in &o.cards {
        let tmp = tempfile::tempdir()?;
        let (ws, dir) = synth::workspace_in(o.seed, n, tmp.path())?;
        let server = mop_testkit::procs::Server::start_with(
            "[limits]\nstores_per_task = 1000000\nstores_per_token_per_minute = 100000000\n[sync]\ncounter_publish_secs = 3600\n",
        );
        let node = server.token("node", &["bench"]);
        eprintln!("importing {n} cards");
        let started = Instant::now();
        let out = server.import(&dir, "bench");
        if !out.status.success() {
            bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        eprintln!("imported in {}", show(started.elapsed()));
        let http = mop_testkit::http_builder()
            .pool_max_idle_per_host(1)
            .build()
            .context("HTTP client")?;
        let url = format!("{}{}", server.url, server::MEMORIES.path(&["bench"]));
        let warm = o.stores / 5;
        let stores = mix(&ws, o.seed, warm + o.stores);
        let mut samples = Vec::with_capacity(o.stores);
        let mut kinds: std::collections::BTreeMap<Kind, Vec<Duration>> = Default::default();
        let mut outcomes: std::collections::BTreeMap<String, usize> = Default::default();
        for (i, (kind, title, body)) in stores.iter().enumerate() {
            let req = json!({
                "provenance": {"task_id": format!("bench-{i}"), "user_id": "bench-user"},
                "card": {"type": "pitfall", "title": title, "body": body}
            });
            let t = Instant::now();
            let r = http.post(&url).bearer_auth(&node).json(&req).send()?;
            let status = r.status().as_u16();
            let v: Value = r.json().unwrap_or(Value::Null);
            let took = t.elapsed();
            let outcome = match (status, v["outcome"].as_str(), v["error"].as_str()) {
                (200 | 201, Some(o), _) => o.to_owned(),
                (422, _, Some("credential")) => "refused".to_owned(),
                _ => bail!("store {i} ({}) answered {status}: {v}", kind.name()),
            };
            if (*kind == Kind::Credential) != (outcome == "refused") {
                bail!("store {i} ({}) answered {outcome}: {v}", kind.name());
            }
            if i >= warm {
                samples.push(took);
                kinds.entry(*kind).or_default().push(took);
                *outcomes.entry(outcome).or_default() += 1;
            }
        }
        let s = summarize(&mut samples);
        samples.sort();
        let p90 = samples[samples.len() * 9 / 10];
        let count = |k: &str| outcomes.get(k).copied().unwrap_or(0);
        section.line(format!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} |",
            o.stores,
            show(s.median),
            show(p90),
            show(s.p99),
            show(*samples.last().unwrap()),
            count("created"),
            count("reinforced") + count("unchanged"),
            count("refused"),
        ));
        section.figure(
            format!("store.p50_us.{n}"),
            s.median.as_micros() as f64,
            true,
        );
        section.figure(format!("store.p99_us.{n}"), s.p99.as_micros() as f64, true);
        if n >= 100_000 {
            section.target(
                &format!("store p99 at {n} cards (screening and the same-lesson rule)"),
                "≤ 50 ms",
                show(s.p99),
                s.p99 <= Duration::from_millis(50),
            );
        }
        for (kind, mut v) in kinds {
            let k = summarize(&mut v);
            by_kind_rows.push(format!(
                "| {n} | {} | {} | {} | {} |",
                kind.name(),
                v.len(),
                show(k.median),
                show(k.p99)
            ));
        }
        drop(server);
    }
    section.line("\nBy kind of store:\n");
    section.line("| cards | store | count | p50 | p99 |");
    section.line("|---|---|---|---|---|");
    for row in by_kind_rows {
        section.line(row);
    }
    Ok(section)
}
