//! `mop-bench server`: the card server under a load generator on loopback, side by side
//! with nginx in the same run.
//!
//! - Unchanged polls: `wrk` against `GET /manifest` with a matching `If-None-Match` (the
//!   server answers 304 from memory) and against nginx answering `If-None-Match` for a
//!   static file of the same size; the two alternate, round by round.
//! - Full manifest and delta at the workspace size: bytes (plain and gzip) and latency.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mop_bench::{show, summarize, synth};
use mop_tests::procs::Server;

pub struct Options {
    pub cards: usize,
    pub rounds: usize,
    pub seconds: u64,
    pub connections: usize,
    pub seed: u64,
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

struct Nginx {
    child: Child,
    url: String,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn start_nginx(dir: &Path, file: &[u8]) -> Result<Nginx> {
    let root = dir.join("root");
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir_all(dir.join("logs"))?;
    std::fs::write(root.join("manifest.json"), file)?;
    let port = free_port()?;
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nworker_processes auto;\npid {pid};\nerror_log {err} warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {tmp};\n  proxy_temp_path {tmp};\n  \
             fastcgi_temp_path {tmp};\n  uwsgi_temp_path {tmp};\n  scgi_temp_path {tmp};\n  \
             server {{ listen 127.0.0.1:{port}; root {root}; etag on; }}\n}}\n",
            pid = dir.join("nginx.pid").display(),
            err = dir.join("logs/error.log").display(),
            tmp = dir.join("logs").display(),
            root = root.display(),
        ),
    )?;
    let child = Command::new("nginx")
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start nginx (apt-get install nginx)")?;
    let url = format!("http://127.0.0.1:{port}/manifest.json");
    let deadline = Instant::now() + Duration::from_secs(10);
    while mop_tests::http().get(&url).send().is_err() {
        if Instant::now() > deadline {
            bail!(
                "nginx did not start; see {}",
                dir.join("logs/error.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Nginx { child, url })
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

pub fn run(o: &Options) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (ws, cards_dir) = synth::workspace_in(o.seed, o.cards, tmp.path())?;

    eprintln!("starting mop-server and importing");
    let server = Server::start_with("[sync]\ncounter_publish_secs = 3600\n");
    let token = server.token("admin", &["bench"]);
    let out = server.import(&cards_dir, "bench");
    if !out.status.success() {
        bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let manifest_url = format!("{}/v1/workspaces/bench/manifest", server.url);
    let plain = mop_tests::http_builder().gzip(false).build()?;
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
                "{}/v1/workspaces/bench/cards/{}",
                server.url, c.summary.id
            ))
            .bearer_auth(&token)
            .body(mop_cards::render_card(&c))
            .send()?
            .error_for_status()?;
    }
    let delta_url = format!("{manifest_url}?since={}", old.version());
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
    let nginx = start_nginx(&tmp.path().join("nginx"), &full_bytes)?;
    let nginx_etag = mop_tests::http().get(&nginx.url).send()?.headers()["etag"]
        .to_str()?
        .to_owned();
    for (url, inm, auth) in [
        (&manifest_url, &etag_now, true),
        (&nginx.url, &nginx_etag, false),
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
        nginx_rps.push(wrk(&nginx.url, &[("If-None-Match", &nginx_etag)], o)?);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (m, n) = (med(&mut mop_rps.clone()), med(&mut nginx_rps.clone()));

    println!("## mop-server at {} cards\n", o.cards);
    println!("| measurement | value |\n|---|---:|");
    println!(
        "| 304 answers/s, mop-server (median of {} × {}s, wrk -t1 -c{}) | {m:.0} |",
        o.rounds, o.seconds, o.connections
    );
    println!("| 304 answers/s, nginx static file, same run | {n:.0} |");
    println!("| ratio mop-server / nginx | {:.2} |", m / n);
    println!("| full manifest, JSON bytes | {} |", full_bytes.len());
    println!("| full manifest, gzip bytes | {full_gzip} |");
    println!(
        "| full manifest, first build after import | {} |",
        show(cold)
    );
    println!(
        "| full manifest, cached, median of 20 (gzip) | {} |",
        show(full_latency)
    );
    println!(
        "| delta after {changed} changed cards, JSON bytes | {} |",
        delta_plain.len()
    );
    println!("| delta, gzip bytes | {delta_gzip} |");
    println!("| delta, median of 20 (gzip) | {} |", show(delta_latency));
    println!("\nrounds: mop-server {mop_rps:.0?}, nginx {nginx_rps:.0?}");
    Ok(())
}
