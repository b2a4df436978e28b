//! `mop-bench sync`: the daemon's side of the protocol against its baselines, in one run.
//!
//! - Cold sync: a real `mopd run` with an empty pool, from process start until its status
//!   shows the verified generation, against `curl` of one tarball of the same card files
//!   from nginx piped into `tar -x`, then `sync`. The two alternate, round by round, on
//!   the same filesystem.
//! - Incremental sync after 1 % of the cards changed: bytes on the wire (a counting proxy
//!   between daemon and server, HTTP headers included) against the changed cards' bytes
//!   plus the delta manifest, and the time of `POST /v1/workspaces/{ws}/sync`.
//! - Unchanged polls: the daemon's CPU time and wire bytes per poll that ends in a 304.

use mop_proto::routes::{control, server};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mop_bench::{CountingProxy, Section, cpu_time, show, show_bytes, summarize, synth};
use mop_testkit::procs::{Daemon, DaemonOptions, Server, bin};

pub struct Options {
    pub cards: usize,
    pub rounds: usize,
    pub polls: usize,
    pub seed: u64,
    /// Count one cold sync's instructions under callgrind (needs valgrind).
    pub callgrind: bool,
    /// Keep that run's profile here, for `callgrind_annotate` (implies `callgrind`).
    pub callgrind_out: Option<std::path::PathBuf>,
    /// Print a cold-sync config and hold the server up instead of timing.
    pub hold: bool,
}

/// One timed side of a cold-sync round.
struct Cost {
    wall: Duration,
    user: Duration,
    sys: Duration,
}

/// Flushes dirty pages (untimed), so the next timed side starts clean.
fn flush() -> Result<()> {
    let status = Command::new("sync").status().context("cannot run sync")?;
    if !status.success() {
        bail!("sync failed: {status}");
    }
    Ok(())
}

/// Empties the daemon's cache and state, so its next start is a cold sync.
/// Gives the daemon an empty cache and state directory by moving the last round's aside.
fn empty_pool(d: &Daemon) -> Result<()> {
    for sub in ["cache", "state"] {
        set_aside(&d.dir.path().join(sub))?;
    }
    Ok(())
}

/// Moves `dir` into a `set-aside` directory beside it instead of deleting it; everything
/// set aside is deleted with the benchmark's temporary directories, after the timing.
/// On a journal-less ext4 (these machines' root file system) the inode allocator passes
/// over inodes freed in the last minute, so a side that starts right after tens of
/// thousands of files were deleted pays for that deletion: mopd's fetch stored its first
/// batches of 500 objects in 140 ms and its last in 10 ms when rounds deleted the last
/// pool first.
fn set_aside(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let parent = dir
        .parent()
        .context("a directory to set aside has a parent")?;
    let aside = parent.join("set-aside");
    std::fs::create_dir_all(&aside)?;
    let n = std::fs::read_dir(&aside)?.count();
    let name = dir
        .file_name()
        .context("a directory to set aside has a name")?;
    std::fs::rename(dir, aside.join(format!("{}-{n}", name.to_string_lossy())))?;
    Ok(())
}

/// Waits until the daemon's status shows a generation of `live` cards.
fn wait_generation(ctl: &Control, live: u64, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if let Some((_, cards)) = ctl.generation() {
            if cards != live {
                bail!("cold sync published {cards} cards, expected {live}");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("cold sync did not finish within {} s", within.as_secs());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One cold sync by a fresh `mopd run`: its wall time, and its CPU until the generation.
fn cold_mopd(d: &Daemon, ctl: &Control, live: u64) -> Result<Cost> {
    empty_pool(d)?;
    flush()?;
    let started = Instant::now();
    let child = spawn_mopd(&d.config())?;
    wait_generation(ctl, live, Duration::from_secs(600))?;
    let wall = started.elapsed();
    let (user, sys) = mop_bench::cpu_times(child.id())?;
    stop(child);
    Ok(Cost { wall, user, sys })
}

/// Instructions (callgrind's `Ir`, every thread) of one cold sync by `mopd run`.
fn callgrind_cold(
    d: &Daemon,
    ctl: &Control,
    live: u64,
    tmp: &Path,
    keep: Option<&Path>,
) -> Result<u64> {
    eprintln!("cold sync under callgrind (slow)");
    empty_pool(d)?;
    let out = keep.map_or_else(|| tmp.join("callgrind.out"), Path::to_path_buf);
    let child = Command::new("valgrind")
        .args(["--tool=callgrind", "--quiet"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(bin("mopd"))
        .arg("run")
        .arg("--config")
        .arg(d.config())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot run valgrind (apt-get install valgrind; bench/all.sh installs it)")?;
    wait_generation(ctl, live, Duration::from_secs(3600))?;
    stop(child);
    let text = std::fs::read_to_string(&out)
        .with_context(|| format!("no callgrind output at {}", out.display()))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no instruction total in the callgrind output")
}

pub(crate) const WS: &str = "bench";

/// Control-socket requests from the benchmark itself (no `mopd` process per call).
pub(crate) struct Control {
    rt: tokio::runtime::Runtime,
    socket: std::path::PathBuf,
}

impl Control {
    /// Requests to the daemon whose control socket is `socket`.
    pub(crate) fn new(socket: std::path::PathBuf) -> Result<Control> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Control { rt, socket })
    }

    fn get(&self, method: &str, path: &str) -> Option<serde_json::Value> {
        match self
            .rt
            .block_on(mop_proto::client::request(&self.socket, method, path, None))
        {
            Ok((200, body)) => serde_json::from_slice(&body).ok(),
            _ => None,
        }
    }

    /// The workspace's generation and card count, once it has one.
    pub(crate) fn generation(&self) -> Option<(String, u64)> {
        let v = self.get("GET", &control::STATUS.path(&[]))?;
        let w = &v["workspaces"][0];
        Some((w["generation"].as_str()?.to_owned(), w["cards"].as_u64()?))
    }

    /// One sync of the workspace, waited for; its result.
    pub(crate) fn sync_now(&self) -> Result<String> {
        let v = self
            .get("POST", &control::SYNC.path(&[WS]))
            .context("sync request failed")?;
        match v["result"].as_str() {
            Some("failed") | None => bail!("sync failed: {v}"),
            Some(r) => Ok(r.to_owned()),
        }
    }
}

/// Where the daemons' logs go: `MOP_BENCH_DAEMON_LOG` names a file to append them to
/// (each cold sync logs its fetch, build and flush times), else nowhere.
fn daemon_log() -> Result<Stdio> {
    match std::env::var_os("MOP_BENCH_DAEMON_LOG") {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("cannot open {}", Path::new(&path).display()))?;
            Ok(file.into())
        }
        None => Ok(Stdio::null()),
    }
}

fn spawn_mopd(config: &Path) -> Result<Child> {
    Command::new(bin("mopd"))
        .arg("run")
        .arg("--config")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(daemon_log()?)
        .spawn()
        .context("cannot start mopd")
}

fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

fn timed_sh(script: &str) -> Result<Duration> {
    let started = Instant::now();
    let status = Command::new("/bin/sh").arg("-c").arg(script).status()?;
    let took = started.elapsed();
    if !status.success() {
        bail!("`{script}` failed: {status}");
    }
    Ok(took)
}

pub fn run(o: &Options) -> Result<Vec<Section>> {
    let tmp = tempfile::tempdir()?;
    let (ws, cards_dir) = synth::workspace_in(o.seed, o.cards, tmp.path())?;
    eprintln!("starting mop-server and importing");
    let server = Server::start_with("[sync]\ncounter_publish_secs = 3600\n");
    let admin = server.token("admin", &[WS]);
    let out = server.import(&cards_dir, WS);
    if !out.status.success() {
        bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    // The baseline's tarball: the same card files, served by nginx.
    let tar_path = tmp.path().join("cards.tar");
    let status = Command::new("tar")
        .arg("-cf")
        .arg(&tar_path)
        .arg("-C")
        .arg(&cards_dir)
        .arg(".")
        .status()?;
    if !status.success() {
        bail!("tar -cf failed");
    }
    let tar_bytes = std::fs::read(&tar_path)?;
    let nginx = crate::nginx::start(&tmp.path().join("nginx"), &[("cards.tar", &tar_bytes)])?;
    let tar_url = nginx.url("cards.tar");

    // A daemon config for the workspace; the cold rounds start its process themselves.
    let extra = "[pool]\nmax_bytes = 17179869184\nverify_interval_secs = 0\n";
    let mut d = Daemon::start(
        &server,
        DaemonOptions {
            workspaces: &[WS],
            extra,
            ..Default::default()
        },
    );
    // What a complete cold sync publishes: the cards the server lists as live.
    let live = d.wait_synced_within(Duration::from_secs(1800))["workspaces"][0]["cards"]
        .as_u64()
        .context("card count in status")?;
    d.stop();
    if o.hold {
        empty_pool(&d)?;
        println!("{}", d.config().display());
        eprintln!(
            "a cold sync: empty {}/cache and {}/state, then `mopd run --config` the file \
             above; close stdin (Ctrl-D) to end",
            d.dir.path().display(),
            d.dir.path().display()
        );
        std::io::copy(&mut std::io::stdin(), &mut std::io::sink())?;
        return Ok(Vec::new());
    }
    let ctl = Control::new(d.socket())?;

    // 1. Cold sync, alternating. Each side starts from flushed dirty pages (an untimed
    // `sync` first), so neither pays for the other's writeback; the order alternates too.
    let mut mop_rounds: Vec<Cost> = Vec::new();
    let mut base_rounds: Vec<Cost> = Vec::new();
    for round in 1..=o.rounds {
        eprintln!("cold sync round {round}/{}", o.rounds);
        let mop_first = round % 2 == 1;
        for side in [mop_first, !mop_first] {
            flush()?;
            if side {
                mop_rounds.push(cold_mopd(&d, &ctl, live)?);
            } else {
                let into = tmp.path().join(format!("untar-{round}"));
                std::fs::create_dir_all(&into)?;
                let (user0, sys0) = mop_bench::children_cpu_times();
                let wall = timed_sh(&format!(
                    "curl -sSf '{tar_url}' | tar -xf - -C '{}' && sync",
                    into.display()
                ))?;
                let (user1, sys1) = mop_bench::children_cpu_times();
                base_rounds.push(Cost {
                    wall,
                    user: user1.saturating_sub(user0),
                    sys: sys1.saturating_sub(sys0),
                });
                set_aside(&into)?;
            }
        }
    }
    let instructions = match o.callgrind || o.callgrind_out.is_some() {
        true => Some(callgrind_cold(
            &d,
            &ctl,
            live,
            tmp.path(),
            o.callgrind_out.as_deref(),
        )?),
        false => None,
    };
    let walls = |v: &[Cost]| v.iter().map(|c| c.wall).collect::<Vec<_>>();
    let (m, b) = (
        summarize(&mut walls(&mop_rounds)),
        summarize(&mut walls(&base_rounds)),
    );
    let ratio = m.median.as_secs_f64() / b.median.as_secs_f64();
    // Quiet rounds: the baseline within twice its fastest round (a round the machine's other
    // work slowed takes several times longer); the ratio there is the median of mopd's
    // time over the baseline's, round by round.
    let fastest = base_rounds
        .iter()
        .map(|c| c.wall)
        .min()
        .expect("rounds ≥ 1");
    let quiet: Vec<(Duration, Duration)> = mop_rounds
        .iter()
        .zip(&base_rounds)
        .filter(|(_, base)| base.wall <= fastest * 2)
        .map(|(mop, base)| (mop.wall, base.wall))
        .collect();
    let quiet_ratio = {
        let mut r: Vec<f64> = quiet
            .iter()
            .map(|(mop, base)| mop.as_secs_f64() / base.as_secs_f64())
            .collect();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    let mut cold = Section::new(format!("Cold sync of {} cards into an empty pool", o.cards));
    cold.line(format!(
        "mop: `mopd run` with an empty cache and state directory, from process start until \
         its status shows the verified generation ({live} live cards: manifest, objects \
         fetched in batches and hashed while streaming, search index, `syncfs`, atomic \
         swap). Baseline: `curl` of one tarball of the same {} card files ({}) from nginx \
         piped into `tar -x`, then `sync`. {} rounds, the order alternating; before each \
         side an untimed `sync` flushes what is dirty, so neither side pays for the other's \
         writeback, and no round deletes the last round's files (they are moved aside and \
         deleted after the timing), so neither pays for freeing inodes. CPU: mopd's user and \
         system time from `/proc/<pid>/stat` at the end of its sync (start-up included); \
         the baseline's from `getrusage` of its shell and children (curl, tar, sync).\n",
        o.cards,
        show_bytes(tar_bytes.len() as u64),
        o.rounds
    ));
    cold.line("| side | min | median | max | user CPU (median) | system CPU (median) |");
    cold.line("|---|---:|---:|---:|---:|---:|");
    for (name, rounds) in [
        ("mopd cold sync", &mop_rounds),
        ("curl + tar -x + sync", &base_rounds),
    ] {
        let mut wall = walls(rounds);
        wall.sort();
        let med = |mut v: Vec<Duration>| {
            v.sort();
            v[v.len() / 2]
        };
        cold.line(format!(
            "| {name} | {} | {} | {} | {} | {} |",
            show(wall[0]),
            show(wall[wall.len() / 2]),
            show(wall[wall.len() - 1]),
            show(med(rounds.iter().map(|c| c.user).collect())),
            show(med(rounds.iter().map(|c| c.sys).collect())),
        ));
    }
    cold.line(format!(
        "| ratio of medians, all rounds | {ratio:.2}× | | | | |"
    ));
    cold.line(format!(
        "| ratio in quiet rounds (baseline within 2× its fastest; {} of {}) | {quiet_ratio:.2}× | | | | |",
        quiet.len(),
        o.rounds
    ));
    if let Some(ir) = instructions {
        cold.line(format!(
            "\nInstructions for one cold sync under `valgrind --tool=callgrind` (mopd from \
             start until the generation is published, all threads; independent of this \
             machine's I/O noise): **{:.1} M**.",
            ir as f64 / 1e6
        ));
    }
    cold.line(format!(
        "\nrounds (mopd / baseline wall): {}",
        mop_rounds
            .iter()
            .zip(&base_rounds)
            .map(|(m, b)| format!("{} / {}", show(m.wall), show(b.wall)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    cold.target(
        &format!(
            "cold sync of {} cards vs curl + tar + sync, quiet rounds",
            o.cards
        ),
        "≤ 1.5×",
        format!(
            "{quiet_ratio:.2}× (all rounds {ratio:.2}×: {} vs {})",
            show(m.median),
            show(b.median)
        ),
        quiet_ratio <= 1.5,
    );
    let mop_user = {
        let mut u: Vec<Duration> = mop_rounds.iter().map(|c| c.user).collect();
        u.sort();
        u[u.len() / 2]
    };
    cold.figure(
        format!("sync.cold_quiet_ratio.{}", o.cards),
        quiet_ratio,
        true,
    );
    cold.figure(
        format!("sync.cold_user_cpu_ms.{}", o.cards),
        mop_user.as_secs_f64() * 1e3,
        true,
    );
    if let Some(ir) = instructions {
        cold.figure(
            format!("sync.cold_instructions_m.{}", o.cards),
            ir as f64 / 1e6,
            true,
        );
    }
    // The goal is set at 10k cards; other sizes report the figure without a verdict.
    if o.cards == 10_000 {
        cold.target(
            "mopd user CPU for a cold sync of 10000 cards",
            "≤ 0.4 s",
            show(mop_user),
            mop_user <= Duration::from_millis(400),
        );
    }

    // 2. and 3. run against one daemon that talks to the server through a counting proxy.
    let upstream: std::net::SocketAddr = server
        .url
        .trim_start_matches("http://")
        .parse()
        .context("server address")?;
    let proxy = CountingProxy::start(upstream)?;
    d.write_config(
        &format!("http://{}", proxy.addr),
        DaemonOptions {
            workspaces: &[WS],
            extra,
            ..Default::default()
        },
    );
    let child = spawn_mopd(&d.config())?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while ctl.generation().is_none() {
        if Instant::now() > deadline {
            bail!("the daemon did not sync within 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = child.id();
    // The status shows the pool's generation at once, while the daemon's start-up poll
    // may still be running; one sync of our own waits it out, so the rounds below do
    // not race it.
    ctl.sync_now()?;

    // 2. Incremental: 1 % of the cards change on the server, then one sync.
    let changed = (o.cards / 100).max(1);
    let http = mop_testkit::http_builder().gzip(true).build()?;
    let mut wire = Vec::new();
    let mut cards_bytes = Vec::new();
    let mut delta_bytes = Vec::new();
    let mut times = Vec::new();
    for round in 0..o.rounds {
        eprintln!("incremental sync round {}/{}", round + 1, o.rounds);
        let before = ctl.generation().context("generation")?.0;
        let version = server_version(&http, &server.url, &admin)?;
        let mut bytes = 0u64;
        for k in 0..changed {
            let card = &ws.cards[(round * changed + k) % ws.cards.len()];
            let mut c = card.clone();
            c.body
                .push_str(&format!("\nEdited in incremental round {round}.\n"));
            let text = mop_cards::render_card(&c);
            bytes += text.len() as u64;
            http.put(format!(
                "{}{}",
                server.url,
                server::CARD.path(&[WS, &c.summary.id.to_string()])
            ))
            .bearer_auth(&admin)
            .body(text)
            .send()?
            .error_for_status()?;
        }
        // The delta manifest as the daemon gets it (gzip), measured apart.
        let delta = http
            .get(format!(
                "{}{}?since={version}",
                server.url,
                server::MANIFEST.path(&[WS])
            ))
            .bearer_auth(&admin)
            .header("accept-encoding", "gzip")
            .send()?
            .error_for_status()?;
        let delta_len = delta
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let delta_len = match delta_len {
            Some(n) => n,
            None => delta.bytes()?.len() as u64,
        };
        proxy.take();
        let started = Instant::now();
        let result = ctl.sync_now()?;
        times.push(started.elapsed());
        let (up, down) = proxy.take();
        let after = ctl.generation().context("generation")?.0;
        if after == before || result == "not_modified" {
            bail!("the incremental sync published nothing ({result})");
        }
        wire.push(up + down);
        cards_bytes.push(bytes);
        delta_bytes.push(delta_len);
    }
    let med = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (w, c, dm) = (med(&wire), med(&cards_bytes), med(&delta_bytes));
    let allowed = (c as f64 * 1.1) as u64 + dm;
    let t = summarize(&mut times);
    let mut inc = Section::new(format!(
        "Incremental sync after 1 % of {} cards changed",
        o.cards
    ));
    inc.line(format!(
        "{changed} cards edited on the server, then one `POST /v1/workspaces/{WS}/sync` on \
         the daemon (it returns when the new generation is published). Bytes on the wire are \
         counted by a TCP proxy between daemon and server, both directions, HTTP headers \
         included. The delta manifest's size is what the server sends for `?since=` with \
         gzip. Medians of {} rounds.\n",
        o.rounds
    ));
    inc.line("| measurement | value |\n|---|---:|");
    inc.line(format!("| changed cards' bytes | {} |", show_bytes(c)));
    inc.line(format!("| delta manifest (gzip) | {} |", show_bytes(dm)));
    inc.line(format!(
        "| bytes on the wire, both directions | {} |",
        show_bytes(w)
    ));
    inc.line(format!(
        "| wire / changed bytes | {:.2}× |",
        w as f64 / c as f64
    ));
    inc.line(format!(
        "| sync time, median / p99 | {} / {} |",
        show(t.median),
        show(t.p99)
    ));
    inc.target(
        "incremental sync (1 %): bytes on the wire",
        "≤ 1.1 × changed bytes + manifest",
        format!(
            "{} vs allowed {} ({} changed + {} manifest)",
            show_bytes(w),
            show_bytes(allowed),
            show_bytes(c),
            show_bytes(dm)
        ),
        w <= allowed,
    );

    // 3. Unchanged polls: daemon CPU and wire bytes per 304.
    ctl.sync_now()?;
    proxy.take();
    let cpu_before = cpu_time(pid)?;
    let started = Instant::now();
    for _ in 0..o.polls {
        let r = ctl.sync_now()?;
        if r != "not_modified" {
            bail!("an unchanged poll answered {r}");
        }
    }
    let elapsed = started.elapsed();
    let cpu = cpu_time(pid)?.saturating_sub(cpu_before);
    let (up, down) = proxy.take();
    stop(child);
    let mut poll = Section::new("Unchanged polls: the daemon's cost");
    poll.line(format!(
        "{} polls of an unchanged {}-card workspace, each triggered through the control \
         socket (`POST …/sync`, which waits for the answer); the server answers 304. CPU \
         time is the daemon's user + system time from `/proc/<pid>/stat` (10 ms ticks, so \
         only the total over all polls is meaningful), and includes serving the control \
         requests.\n",
        o.polls, o.cards
    ));
    poll.line("| measurement | value |\n|---|---:|");
    poll.line(format!(
        "| daemon CPU per poll | {} |",
        show(cpu / o.polls.max(1) as u32)
    ));
    poll.line(format!(
        "| wall time per poll (control request + 304) | {} |",
        show(elapsed / o.polls.max(1) as u32)
    ));
    poll.line(format!(
        "| bytes on the wire per poll, both directions | {} |",
        show_bytes((up + down) / o.polls.max(1) as u64)
    ));
    Ok(vec![cold, inc, poll])
}

/// The workspace's current `<epoch>-<revision>`, from the manifest's ETag.
fn server_version(http: &reqwest::blocking::Client, url: &str, token: &str) -> Result<String> {
    let r = http
        .get(format!("{url}{}", server::MANIFEST.path(&[WS])))
        .bearer_auth(token)
        .send()?
        .error_for_status()?;
    let etag = r.headers()["etag"].to_str()?.to_owned();
    Ok(etag.trim_start_matches("W/").trim_matches('"').to_owned())
}
