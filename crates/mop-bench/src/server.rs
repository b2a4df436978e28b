//! `mop-bench server`: the card server under a load generator on loopback, side by side
//! with nginx in the same run.
//!
//! - Unchanged polls: `wrk` against `GET /manifest` with a matching `If-None-Match` (the
//!   server answers 304 from memory) and against nginx answering `If-None-Match` for a
//!   static file of the same size; the two alternate, round by round.
//! - Full manifest and delta at the workspace size: bytes (plain and gzip) and latency.

use mop_proto::routes::server;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mop_bench::{Section, median_f64, show, summarize, synth};

pub struct Options {
    pub cards: usize,
    pub rounds: usize,
    pub seconds: u64,
    pub connections: usize,
    pub seed: u64,
    /// The server on a PostgreSQL started for the run, instead of an SQLite file.
    pub postgres: bool,
}

fn wrk(url: &str, headers: &[(&str, &str)], o: &Options) -> Result<f64> {
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t1",
        &format!("-c{}", o.connections),
        &format!("-d{}s", o.seconds),
        "--latency",
    ]);
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    let out = cmd
        .arg(url)
        .output()
        .context("cannot run wrk (apt-get install wrk)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("Non-2xx or 3xx responses") {
        bail!("wrk saw error responses from {url}:\n{text}");
    }
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk output:\n{text}"))
}

fn median_latency(n: usize, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        f()?;
        samples.push(started.elapsed());
    }
    Ok(summarize(&mut samples).median)
}

pub fn run(o: &Options) -> Result<Section> {
    let tmp = tempfile::tempdir()?;
    let (ws, cards_dir) = synth::workspace_in(o.seed, o.cards, tmp.path())?;

    eprintln!("starting mop-server and importing");
    let (server, _pg) = crate::start_server(o.postgres, "[sync]\ncounter_publish_secs = 3600\n")?;
    let token = server.token("admin", &["bench"]);
    let out = server.import(&cards_dir, "bench");
    if !out.status.success() {
        bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let manifest_url = format!("{}{}", server.url, server::MANIFEST.path(&["bench"]));
    let plain = mop_testkit::http_builder()
        .gzip(false)
        .zstd(false)
        .build()?;
    let get = |url: &str, gzip: bool| -> Result<reqwest::blocking::Response> {
        let mut req = plain.get(url).bearer_auth(&token);
        if gzip {
            req = req.header("accept-encoding", "gzip");
        }
        Ok(req.send()?.error_for_status()?)
    };
    let first = Instant::now();
    let full = get(&manifest_url, false)?;
    let etag = full.headers()["etag"].to_str()?.to_owned();
    let full_bytes = full.bytes()?;
    let cold = first.elapsed();
    let full_gzip = get(&manifest_url, true)?.bytes()?.len();
    let full_latency = median_latency(20, || {
        get(&manifest_url, true)
            .and_then(|r| Ok(r.bytes()?))
            .map(drop)
    })?;

    // A 1 % change, then the delta from the old version.
    let old: mop_cards::Manifest = serde_json::from_slice(&full_bytes)?;
    let changed = (o.cards / 100).max(1);
    for card in ws.cards.iter().take(changed) {
        let mut c = card.clone();
        c.body.push_str("\nEdited for the delta benchmark.\n");
        plain
            .put(format!(
                "{}{}",
                server.url,
                server::CARD.path(&["bench", &c.summary.id.to_string()])
            ))
            .bearer_auth(&token)
            .body(mop_cards::render_card(&c))
            .send()?
            .error_for_status()?;
    }
    let delta_url = format!(
        "{manifest_url}?since={}",
        mop_proto::sync::Version::of(&old)
    );
    let delta_plain = get(&delta_url, false)?.bytes()?;
    let delta: mop_cards::Manifest = serde_json::from_slice(&delta_plain)?;
    // Changed cards that are disabled or superseded come back as removed ids.
    if delta.since.is_none() || delta.cards.len() + delta.removed.len() != changed {
        bail!(
            "expected a delta of {changed} cards, got {} + {} removed (since {:?})",
            delta.cards.len(),
            delta.removed.len(),
            delta.since
        );
    }
    let delta_gzip = get(&delta_url, true)?.bytes()?.len();
    let delta_latency = median_latency(20, || {
        get(&delta_url, true).and_then(|r| Ok(r.bytes()?)).map(drop)
    })?;
    let etag_now = get(&manifest_url, false)?.headers()["etag"]
        .to_str()?
        .to_owned();
    let _ = etag;

    // 304s: mop-server vs nginx, alternating.
    let nginx = crate::nginx::start(&tmp.path().join("nginx"), &[("manifest.json", &full_bytes)])?;
    let nginx_url = nginx.url("manifest.json");
    let nginx_etag = mop_testkit::http().get(&nginx_url).send()?.headers()["etag"]
        .to_str()?
        .to_owned();
    for (url, inm, auth) in [
        (&manifest_url, &etag_now, true),
        (&nginx_url, &nginx_etag, false),
    ] {
        let mut req = plain
            .get(url.as_str())
            .header("if-none-match", inm.as_str());
        if auth {
            req = req.bearer_auth(&token);
        }
        let status = req.send()?.status();
        if status != reqwest::StatusCode::NOT_MODIFIED {
            bail!("{url} answered {status} to a matching If-None-Match, not 304");
        }
    }
    let bearer = format!("Bearer {token}");
    let (mut mop_rps, mut nginx_rps) = (Vec::new(), Vec::new());
    for round in 1..=o.rounds {
        eprintln!("round {round}/{}: wrk {}s each", o.rounds, o.seconds);
        mop_rps.push(wrk(
            &manifest_url,
            &[("If-None-Match", &etag_now), ("Authorization", &bearer)],
            o,
        )?);
        nginx_rps.push(wrk(&nginx_url, &[("If-None-Match", &nginx_etag)], o)?);
    }
    let (m, n) = (median_f64(&mop_rps), median_f64(&nginx_rps));
    let mut sec = Section::new(format!(
        "Card server{}: unchanged polls, manifests and deltas at {} cards",
        if o.postgres {
            " on PostgreSQL (one replica)"
        } else {
            ""
        },
        o.cards
    ));
    sec.line(format!(
        "`wrk -t1 -c{c} -d{d}s` against `GET /manifest` with a matching `If-None-Match` \
         (mop-server answers 304 from memory, after checking the bearer token) and against \
         nginx answering `If-None-Match` for a static file of the same size, alternating, \
         {r} rounds. The load generator shares the machine's cores with the server.\n",
        c = o.connections,
        d = o.seconds,
        r = o.rounds
    ));
    sec.line("| measurement | value |\n|---|---:|");
    sec.line(format!(
        "| 304 answers/s, mop-server (median of {}) | {m:.0} |",
        o.rounds
    ));
    sec.line(format!(
        "| 304 answers/s, nginx static file, same run | {n:.0} |"
    ));
    sec.line(format!("| ratio mop-server / nginx | {:.2} |", m / n));
    sec.line(format!(
        "| full manifest, JSON bytes | {} |",
        full_bytes.len()
    ));
    sec.line(format!("| full manifest, gzip bytes | {full_gzip} |"));
    sec.line(format!(
        "| full manifest, first build after import | {} |",
        show(cold)
    ));
    sec.line(format!(
        "| full manifest, cached, median of 20 (gzip) | {} |",
        show(full_latency)
    ));
    sec.line(format!(
        "| delta after {changed} changed cards, JSON bytes | {} |",
        delta_plain.len()
    ));
    sec.line(format!("| delta, gzip bytes | {delta_gzip} |"));
    sec.line(format!(
        "| delta, median of 20 (gzip) | {} |",
        show(delta_latency)
    ));
    sec.line(format!(
        "\nrounds (answers/s): mop-server {mop_rps:.0?}, nginx {nginx_rps:.0?}"
    ));
    sec.figure(
        format!(
            "server.not_modified_vs_nginx.{}.{}",
            if o.postgres { "postgres" } else { "sqlite" },
            o.cards
        ),
        m / n,
        false,
    );
    sec.target(
        if o.postgres {
            "unchanged poll: a PostgreSQL-backed replica's 304/s vs nginx static 304/s"
        } else {
            "unchanged poll: mop-server 304/s vs nginx static 304/s"
        },
        "≥ 0.8×",
        format!("{:.2}× ({m:.0} vs {n:.0}/s)", m / n),
        m / n >= 0.8,
    );
    Ok(sec)
}
