//! `mop-bench fleet`: mop-server under the polls of a simulated fleet of daemons, as one
//! process or as several server processes on one database (`--replicas`, the polls
//! spread over them in turn, their CPU summed).
//!
//! Each simulated host polls every 30 s with a conditional manifest request; 1 % of the
//! polls find a change (the host holds the previous version and gets a delta), the rest
//! get a 304. The generator is open-loop: request k is due at `k / rate` and its latency
//! counts from when it was due, so a slow server cannot hide its queue by slowing the
//! generator down. The rate steps up from 1,000 hosts until p99 passes the bound or the
//! server falls behind; the server's CPU comes from `/proc/<pid>/stat`.

use mop_proto::routes::server;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mop_bench::{Section, cpu_time, show, summarize, synth};
use mop_testkit::procs::Server;

pub struct Options {
    pub cards: usize,
    /// Host counts to try, ascending.
    pub hosts: Vec<usize>,
    /// Seconds per step.
    pub seconds: u64,
    pub seed: u64,
    /// Server processes on the one database.
    pub replicas: usize,
    /// The servers on a PostgreSQL started for the run, instead of an SQLite file.
    pub postgres: bool,
    /// The fleet the largest step within the bound must reach, reported as a target.
    pub scale_target: Option<usize>,
}

const WS: &str = "bench";
const POLL_SECS: f64 = 30.0;
const P99_BOUND: Duration = Duration::from_millis(50);

struct Step {
    hosts: usize,
    offered: f64,
    achieved: f64,
    p50: Duration,
    p99: Duration,
    changed: usize,
    errors: usize,
    server_cpu: f64,
}

pub fn run(o: &Options) -> Result<Section> {
    let tmp = tempfile::tempdir()?;
    let (ws, cards_dir) = synth::workspace_in(o.seed, o.cards, tmp.path())?;
    eprintln!("starting mop-server and importing");
    let (server, pg) = crate::start_server(o.postgres, "[sync]\ncounter_publish_secs = 3600\n")?;
    let admin = server.token("admin", &[WS]);
    let node = server.token("node", &[WS]);
    let out = server.import(&cards_dir, WS);
    if !out.status.success() {
        bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let replicas: Vec<Server> = (1..o.replicas.max(1)).map(|_| server.replica()).collect();
    let pids = std::iter::once(&server)
        .chain(&replicas)
        .map(|s| s.pid().context("server pid"))
        .collect::<Result<Vec<u32>>>()?;
    // PostgreSQL's CPU counts with the servers': it is part of what answers the fleet.
    let postmaster = pg.as_ref().and_then(|pg| pg.pid());
    let cpu = |pids: &[u32]| -> Result<Duration> {
        let servers = pids
            .iter()
            .map(|&p| cpu_time(p))
            .try_fold(Duration::ZERO, |sum, t| Ok::<_, anyhow::Error>(sum + t?))?;
        let database = match postmaster {
            Some(p) => mop_bench::cpu_time_tree(p)?,
            None => Duration::ZERO,
        };
        Ok(servers + database)
    };
    let http = mop_testkit::http_builder().build()?;
    let manifest = format!("{}{}", server.url, server::MANIFEST.path(&[WS]));
    let etag = |http: &reqwest::blocking::Client| -> Result<String> {
        Ok(http
            .get(&manifest)
            .bearer_auth(&node)
            .send()?
            .error_for_status()?
            .headers()["etag"]
            .to_str()?
            .to_owned())
    };
    // The version a host that missed one change holds: one card edited since.
    let old = etag(&http)?;
    let mut card = ws.cards[0].clone();
    card.body.push_str("\nEdited for the fleet benchmark.\n");
    http.put(format!(
        "{}{}",
        server.url,
        server::CARD.path(&[WS, &card.summary.id.to_string()])
    ))
    .bearer_auth(&admin)
    .body(mop_cards::render_card(&card))
    .send()?
    .error_for_status()?;
    let current = etag(&http)?;
    if current == old {
        bail!("the edit did not change the workspace's ETag");
    }
    let old_version = old.trim_start_matches("W/").trim_matches('"').to_owned();
    // Every replica has seen the edit (each notices another's writes within a second).
    for r in &replicas {
        let url = format!("{}{}", r.url, server::MANIFEST.path(&[WS]));
        let deadline = Instant::now() + Duration::from_secs(10);
        while http
            .get(&url)
            .bearer_auth(&node)
            .header("if-none-match", &current)
            .send()?
            .status()
            != reqwest::StatusCode::NOT_MODIFIED
        {
            if Instant::now() > deadline {
                bail!("replica {} did not see the edit within 10 s", r.url);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = reqwest::Client::builder()
        .gzip(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .build()?;
    let manifests = std::iter::once(&server)
        .chain(&replicas)
        .map(|s| format!("{}{}", s.url, server::MANIFEST.path(&[WS])))
        .collect();
    let poll = Arc::new(Poll {
        client,
        manifests,
        token: node.clone(),
        current,
        old,
        old_version,
    });

    let mut steps = Vec::new();
    for &hosts in &o.hosts {
        let rate = hosts as f64 / POLL_SECS;
        eprintln!(
            "fleet: {hosts} hosts = {rate:.0} polls/s for {}s",
            o.seconds
        );
        let cpu_before = cpu(&pids)?;
        let wall = Instant::now();
        let step = rt.block_on(drive(poll.clone(), rate, Duration::from_secs(o.seconds)));
        let server_cpu =
            cpu(&pids)?.saturating_sub(cpu_before).as_secs_f64() / wall.elapsed().as_secs_f64();
        let (mut lat, changed, errors, achieved) = step;
        let s = summarize(&mut lat);
        steps.push(Step {
            hosts,
            offered: rate,
            achieved,
            p50: s.median,
            p99: s.p99,
            changed,
            errors,
            server_cpu,
        });
        let last = steps.last().expect("pushed");
        if last.p99 > P99_BOUND || last.achieved < 0.9 * last.offered {
            break;
        }
    }

    let mut sec = Section::new(if o.postgres {
        format!(
            "Fleet: simulated daemons polling {} server processes on one PostgreSQL ({} cards)",
            o.replicas, o.cards
        )
    } else if o.replicas > 1 {
        format!(
            "Fleet: simulated daemons polling {} server processes on one database ({} cards)",
            o.replicas, o.cards
        )
    } else {
        format!(
            "Fleet: simulated daemons polling one server ({} cards)",
            o.cards
        )
    });
    sec.line(format!(
        "Each host polls every 30 s (`GET /manifest` with `If-None-Match`); 1 % of polls \
         find a change (the host holds the previous version and gets a delta of one card), \
         the others a 304. Open-loop generator (one thread, async, connection pool) on the \
         same machine as the server, so both share its cores; latency counts from when \
         each request was due. {} s per step; the steps stop once p99 passes {} ms or the \
         server falls 10 % behind.\n",
        o.seconds,
        P99_BOUND.as_millis()
    ));
    if o.postgres {
        sec.line(
            "Server CPU counts the mop-server processes and PostgreSQL (the postmaster and \
             its backends, living or ended) together.\n",
        );
    }
    sec.line("| hosts | polls/s offered | answered/s | deltas | errors | p50 | p99 | server CPU (cores) |");
    sec.line("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &steps {
        sec.line(format!(
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {:.3} |",
            s.hosts,
            s.offered,
            s.achieved,
            s.changed,
            s.errors,
            show(s.p50),
            show(s.p99),
            s.server_cpu
        ));
    }
    let good: Vec<&Step> = steps
        .iter()
        .filter(|s| s.p99 <= P99_BOUND && s.achieved >= 0.9 * s.offered && s.errors == 0)
        .collect();
    let best = good.iter().max_by_key(|s| s.hosts);
    if let Some(b) = best {
        let per_poll = b.server_cpu / b.achieved;
        let cpu_bound_hosts = (2.0 / per_poll) * POLL_SECS;
        sec.line(format!(
            "\nMeasured: {} hosts at p99 {} (the largest step within the bound). Server CPU \
             per poll there: {}; at that cost two whole cores would answer {:.0} polls/s, \
             i.e. about {:.0} hosts, an upper bound that ignores the load generator's own \
             share of this machine.",
            b.hosts,
            show(b.p99),
            show(Duration::from_secs_f64(per_poll)),
            2.0 / per_poll,
            cpu_bound_hosts
        ));
    }
    if let Some(first) = steps.first() {
        sec.target(
            &format!(
                "fleet of {} hosts, {}: p99",
                first.hosts,
                match (o.replicas, o.postgres) {
                    (1, false) => "one server".to_owned(),
                    (n, false) => format!("{n} servers on one SQLite file"),
                    (n, true) => format!("{n} replicas on one PostgreSQL"),
                }
            ),
            "< 50 ms",
            format!(
                "{} (server CPU {:.1} % of one core)",
                show(first.p99),
                first.server_cpu * 100.0
            ),
            first.p99 < P99_BOUND && first.errors == 0,
        );
    }
    if let Some(target) = o.scale_target {
        let reached = best.map_or(0, |b| b.hosts);
        sec.target(
            "simulated fleet polling one server: largest step with p99 < 50 ms",
            &format!("≥ {target} hosts"),
            match best {
                Some(b) => format!("{} hosts (p99 {})", b.hosts, show(b.p99)),
                None => "no step within the bound".to_owned(),
            },
            reached >= target,
        );
    }
    Ok(sec)
}

struct Poll {
    client: reqwest::Client,
    /// Each server process's manifest URL; poll k goes to `k % len`.
    manifests: Vec<String>,
    token: String,
    current: String,
    old: String,
    old_version: String,
}

/// Latencies, deltas served, errors, answered per second.
async fn drive(p: Arc<Poll>, rate: f64, length: Duration) -> (Vec<Duration>, usize, usize, f64) {
    let total = (rate * length.as_secs_f64()).ceil() as usize;
    let started = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..total {
        let due = started + Duration::from_secs_f64(k as f64 / rate);
        tokio::time::sleep_until(due).await;
        let p = p.clone();
        // Every 100th poll is a host that missed the last change.
        let stale = k % 100 == 0;
        tasks.spawn(async move {
            let manifest = &p.manifests[k % p.manifests.len()];
            let req = if stale {
                p.client
                    .get(format!("{manifest}?since={}", p.old_version))
                    .header("if-none-match", &p.old)
            } else {
                p.client.get(manifest).header("if-none-match", &p.current)
            };
            let res = req.bearer_auth(&p.token).send().await;
            let ok = match res {
                Ok(r) => {
                    let want = if stale { 200 } else { 304 };
                    let status = r.status().as_u16();
                    r.bytes().await.is_ok() && status == want
                }
                Err(_) => false,
            };
            (due.elapsed(), stale, ok)
        });
    }
    let mut lat = Vec::with_capacity(total);
    let (mut changed, mut errors) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok((d, stale, ok)) => {
                lat.push(d);
                changed += usize::from(stale && ok);
                errors += usize::from(!ok);
            }
            Err(_) => errors += 1,
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let answered = lat.len() as f64 / secs;
    (lat, changed, errors, answered)
}
