//! Syncs whose cost should follow the change, not the workspace: a few cards edited on
//! the server, and a counter batch (cards' counters published, no card text changed),
//! each followed by one sync of a warm daemon. Wall time per sync from the control
//! request to the published generation, and the daemon's CPU time.
//!
//! The counter batch is made the way agents make one: each of its cards gets pending
//! evidence (`pending_occurrence`, as a reinforcing store leaves it, written here straight
//! into the server's SQLite file), then the server publishes the batch through its own
//! `POST …/counters/publish`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mop_proto::routes::server;
use mop_testkit::procs::{Daemon, DaemonOptions, Server};

use crate::sync::{Control, WS};
use mop_bench::{Section, cpu_time, show, summarize, synth};

/// What to measure.
pub struct Options {
    /// Cards in the workspace.
    pub cards: usize,
    /// Cards edited per round.
    pub edited: usize,
    /// Cards whose counters a batch changes.
    pub counted: usize,
    /// Rounds of each kind.
    pub rounds: usize,
    pub seed: u64,
    /// The targets to report, if any.
    pub targets: Option<Targets>,
}

/// Targets, in milliseconds (walls are medians, CPU the mean per sync); `None` reports
/// no target for that figure.
#[derive(Clone, Copy)]
pub struct Targets {
    pub edited_wall: Option<u64>,
    pub edited_cpu: Option<u64>,
    pub counted_wall: Option<u64>,
}

/// One kind of round's figures.
struct Rounds {
    walls: Vec<Duration>,
    cpu: Duration,
}

pub fn run(o: &Options) -> Result<Section> {
    let tmp = tempfile::tempdir()?;
    let (ws, cards_dir) = synth::workspace_in(o.seed, o.cards, tmp.path())?;
    eprintln!(
        "changes: starting mop-server and importing {} cards",
        o.cards
    );
    let server = Server::start_with("[sync]\ncounter_publish_secs = 3600\n");
    let admin = server.token("admin", &[WS]);
    let out = server.import(&cards_dir, WS);
    if !out.status.success() {
        bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let extra = "[pool]\nmax_bytes = 17179869184\nverify_interval_secs = 0\n";
    let d = Daemon::start(
        &server,
        DaemonOptions {
            workspaces: &[WS],
            extra,
            ..Default::default()
        },
    );
    eprintln!("changes: the daemon's first (cold) sync");
    d.wait_synced_within(Duration::from_secs(1800));
    let ctl = Control::new(d.socket())?;
    // The daemon's start-up poll may still be running; one sync of our own waits it out.
    ctl.sync_now()?;
    let pid = d.pid().context("the daemon is not running")?;
    let http = mop_testkit::http_builder().build()?;
    let db = rusqlite::Connection::open(server.db())?;
    db.busy_timeout(Duration::from_secs(30))?;

    let mut next = 0usize;
    let edited = measure(&ctl, pid, o.rounds, "edited", |round| {
        for _ in 0..o.edited {
            let card = &ws.cards[next % ws.cards.len()];
            next += 1;
            let mut c = card.clone();
            c.body.push_str(&format!("\nEdited in round {round}.\n"));
            http.put(format!(
                "{}{}",
                server.url,
                server::CARD.path(&[WS, &c.summary.id.to_string()])
            ))
            .bearer_auth(&admin)
            .body(mop_cards::render_card(&c))
            .send()?
            .error_for_status()?;
        }
        Ok(())
    })?;
    let counted = measure(&ctl, pid, o.rounds, "counter batch", |round| {
        let ids: Vec<String> = (0..o.counted)
            .map(|k| {
                ws.cards[(round * o.counted + k) % ws.cards.len()]
                    .summary
                    .id
                    .to_string()
            })
            .collect();
        let tx = db.unchecked_transaction()?;
        for id in &ids {
            tx.execute(
                "UPDATE cards SET pending_occurrence = pending_occurrence + 1, \
                 pending_last_seen = strftime('%Y-%m-%dT%H:%M:%SZ', 'now') \
                 WHERE workspace = ?1 AND id = ?2",
                rusqlite::params![WS, id],
            )?;
        }
        tx.execute(
            "UPDATE workspaces SET counters_dirty = 1 WHERE name = ?1",
            rusqlite::params![WS],
        )?;
        tx.commit()?;
        let published: serde_json::Value = http
            .post(format!(
                "{}{}",
                server.url,
                server::COUNTERS_PUBLISH.path(&[WS])
            ))
            .bearer_auth(&admin)
            .send()?
            .error_for_status()?
            .json()?;
        if published["published"].as_u64() != Some(1) {
            bail!("the counter batch published nothing: {published}");
        }
        Ok(())
    })?;
    // Each sync logs its fetch, build, flush and collect times.
    if let Some(path) = std::env::var_os("MOP_BENCH_DAEMON_LOG") {
        std::fs::write(&path, d.log())
            .with_context(|| format!("cannot write {}", std::path::Path::new(&path).display()))?;
    }
    drop(d);

    let mut s = Section::new(format!(
        "Syncs that follow the change, at {} cards",
        o.cards
    ));
    s.line(format!(
        "A warm daemon, one sync (`POST /v1/workspaces/{WS}/sync` on its control socket, \
         which returns when the new generation is published) after each change on the \
         server: {} cards edited (new text), or a counter batch of {} cards (their \
         occurrence counters published by the server, no text changed). Wall time per sync; \
         CPU is the daemon's user + system time from `/proc/<pid>/stat` over all rounds of \
         a kind (10 ms ticks), divided by the rounds. {} rounds of each.\n",
        o.edited, o.counted, o.rounds
    ));
    s.line("| change | wall, median | wall, p99 | daemon CPU per sync |\n|---|---:|---:|---:|");
    let mut results = Vec::new();
    for (what, mut r) in [
        (format!("{} cards edited", o.edited), edited),
        (format!("counter batch of {} cards", o.counted), counted),
    ] {
        let t = summarize(&mut r.walls);
        let cpu = r.cpu / o.rounds.max(1) as u32;
        s.line(format!(
            "| {what} | {} | {} | {} |",
            show(t.median),
            show(t.p99),
            show(cpu)
        ));
        results.push((t.median, cpu));
    }
    if let Some(t) = o.targets {
        let n = o.cards;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        if let Some(max) = t.edited_cpu {
            let cpu = results[0].1;
            s.target(
                &format!("{} of {n} cards edited: daemon CPU per sync", o.edited),
                &format!("≤ {max} ms"),
                show(cpu),
                ms(cpu) <= max as f64,
            );
        }
        if let Some(max) = t.edited_wall {
            let wall = results[0].0;
            s.target(
                &format!("{} of {n} cards edited: sync wall time, median", o.edited),
                &format!("≤ {max} ms"),
                show(wall),
                ms(wall) <= max as f64,
            );
        }
        if let Some(max) = t.counted_wall {
            let wall = results[1].0;
            s.target(
                &format!("a counter-only change at {n} cards: sync wall time, median"),
                &format!("≤ {max} ms"),
                show(wall),
                ms(wall) <= max as f64,
            );
        }
    }
    Ok(s)
}

/// `rounds` rounds of `change` (given the round's number) then one timed sync each.
fn measure(
    ctl: &Control,
    pid: u32,
    rounds: usize,
    what: &str,
    mut change: impl FnMut(usize) -> Result<()>,
) -> Result<Rounds> {
    let mut r = Rounds {
        walls: Vec::new(),
        cpu: Duration::ZERO,
    };
    for round in 0..rounds {
        eprintln!("changes: {what}, round {}/{rounds}", round + 1);
        let before = ctl.generation().context("generation")?.0;
        change(round)?;
        let cpu = cpu_time(pid)?;
        let started = Instant::now();
        let result = ctl.sync_now()?;
        r.walls.push(started.elapsed());
        r.cpu += cpu_time(pid)?.saturating_sub(cpu);
        let after = ctl.generation().context("generation")?.0;
        if after == before || result == "not_modified" {
            bail!("the sync after a change ({what}) published nothing ({result})");
        }
    }
    Ok(r)
}
