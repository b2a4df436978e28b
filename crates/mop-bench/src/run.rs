//! `mop-bench run`: the cost `mop run` adds to starting a sandbox. In one run, alternating,
//! `mop run -- /bin/true` (prepare against a 10k-card workspace, bwrap, release) and bare
//! bwrap with the same flags (taken from `mop run --dry-run`, the view and the working
//! directory bound by path instead of by descriptor, and without mop's seccomp filter).

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mop_bench::{Section, show, summarize, synth};
use mop_testkit::procs::{Daemon, DaemonOptions, Server, bin};

pub struct Options {
    pub cards: usize,
    pub iterations: usize,
    /// Concurrent runners in the prepare + release throughput run.
    pub runners: usize,
    /// Seconds of the throughput run.
    pub throughput_secs: u64,
    pub seed: u64,
    pub hold: bool,
}

/// `mop prepare --json` then `mop release` for one task, as a runner does.
pub fn prepare_and_release(
    socket: &std::path::Path,
    ws: &str,
    task_id: &str,
    task: &mop_cards::TaskContext,
) -> Result<()> {
    let mut prep = Command::new(bin("mop"));
    prep.arg("prepare").arg("--socket").arg(socket).args([
        "--workspace",
        ws,
        "--task-id",
        task_id,
        "--title",
        &task.title,
        "--json",
    ]);
    if let Some(u) = &task.origin_user_id {
        prep.args(["--user", u]);
    }
    if let Some(a) = &task.asset_id {
        prep.args(["--asset", a]);
    }
    let out = prep.output()?;
    if !out.status.success() {
        bail!(
            "mop prepare failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new(bin("mop"))
        .arg("release")
        .arg("--socket")
        .arg(socket)
        .args(["--task-id", task_id])
        .output()?;
    if !out.status.success() {
        bail!(
            "mop release failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Builds a fresh command for each timed run.
type MakeCommand<'a> = Box<dyn Fn() -> Command + 'a>;

fn timed(cmd: &mut Command) -> Result<Duration> {
    let started = Instant::now();
    let status = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status()?;
    let took = started.elapsed();
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(took)
}

pub fn run(o: &Options) -> Result<Section> {
    let tmp = tempfile::tempdir()?;
    let (_ws, cards_dir) = synth::workspace_in(o.seed, o.cards, tmp.path())?;
    let server = Server::start();
    let out = server.import(&cards_dir, "bench");
    if !out.status.success() {
        bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let profiles = mop_testkit::repo_root().join("bwrap-profiles");
    let extra = format!(
        "[tasks]\nprofile_dirs = [\"{}\"]\n[pool]\nmax_bytes = 17179869184\n",
        profiles.display()
    );
    eprintln!("starting mopd and syncing");
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            workspaces: &["bench"],
            extra: &extra,
            ..Default::default()
        },
    );
    daemon.wait_synced_within(Duration::from_secs(1800));
    let workdir = tempfile::tempdir()?;
    let task = synth::tasks(o.seed, 1, o.cards).remove(0);
    let socket = daemon.socket();
    let task_flags = |cmd: &mut Command| {
        cmd.arg("--socket")
            .arg(&socket)
            .args(["--workspace", "bench", "--title", &task.title]);
        if let Some(u) = &task.origin_user_id {
            cmd.args(["--user", u]);
        }
        if let Some(a) = &task.asset_id {
            cmd.args(["--asset", a]);
        }
    };

    // The flags mop run uses, and a long-lived view to bind by path for the baseline.
    let mut dry = Command::new(bin("mop"));
    dry.arg("run")
        .arg("--dry-run")
        .arg("--workdir")
        .arg(workdir.path());
    task_flags(&mut dry);
    dry.args(["--", "/bin/true"]);
    let out = dry.output()?;
    if !out.status.success() {
        bail!(
            "mop run --dry-run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dry: serde_json::Value = serde_json::from_slice(&out.stdout).context("dry-run output")?;
    let mut prep = Command::new(bin("mop"));
    prep.args(["prepare", "--task-id", "baseline", "--json"]);
    task_flags(&mut prep);
    let prep_out = prep.output()?;
    if !prep_out.status.success() {
        bail!(
            "mop prepare failed: {}",
            String::from_utf8_lossy(&prep_out.stderr)
        );
    }
    let plan: serde_json::Value = serde_json::from_slice(&prep_out.stdout)?;
    let fd = |v: &serde_json::Value| v.to_string();
    let view_fds: Vec<String> = dry["fds"]["view"]
        .as_array()
        .context("fds.view")?
        .iter()
        .map(fd)
        .collect();
    let (workdir_fd, sock_fd) = (
        fd(&dry["fds"]["workdir"]),
        fd(&dry["fds"]["agent_socket_dir"]),
    );
    let args: Vec<String> = dry["args"]
        .as_array()
        .context("args")?
        .iter()
        .map(|a| a.as_str().unwrap_or("").to_owned())
        .collect();
    let mut baseline: Vec<OsString> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--bind-fd" if args[i + 1] == workdir_fd => {
                baseline.extend([
                    "--bind".into(),
                    args[i + 2].clone().into(),
                    args[i + 2].clone().into(),
                ]);
                i += 3;
            }
            "--ro-bind-fd" if view_fds.contains(&args[i + 1]) => {
                baseline.extend([
                    "--ro-bind".into(),
                    plan["view_dir"].as_str().unwrap().into(),
                    args[i + 2].clone().into(),
                ]);
                i += 3;
            }
            "--ro-bind-fd" if args[i + 1] == sock_fd => {
                baseline.extend([
                    "--ro-bind".into(),
                    plan["agent_socket_dir"].as_str().unwrap().into(),
                    args[i + 2].clone().into(),
                ]);
                i += 3;
            }
            // The status pipe is mop's; the seccomp filter (and its go signal) is mop's
            // work, so the baseline goes without it.
            "--json-status-fd" | "--seccomp" => i += 2,
            a => {
                baseline.push(a.into());
                i += 1;
            }
        }
    }
    let bwrap = dry["bwrap"].as_str().context("bwrap path")?.to_owned();
    let selected: usize = plan["selected"].as_array().map_or(0, |a| {
        a.iter().filter_map(|v| v.as_u64()).sum::<u64>() as usize
    });
    let mounted = plan["cards"].as_array().map_or(0, |a| a.len());

    // What is timed, alternating within each iteration so drift hits all alike. The
    // last two rows are a breakdown: starting the mop binary, and a prepare (reserve,
    // select, view, plan) without a sandbox.
    let mop_run = || {
        let mut m = Command::new(bin("mop"));
        m.arg("run").arg("--workdir").arg(workdir.path());
        task_flags(&mut m);
        m.args(["--", "/bin/true"]);
        m
    };
    let commands: Vec<(&str, MakeCommand)> = vec![
        (
            "bare bwrap, same flags, `/bin/true`",
            Box::new(|| {
                let mut c = Command::new(&bwrap);
                c.args(&baseline);
                c
            }),
        ),
        (
            "`mop run -- /bin/true` (prepare + bwrap + release)",
            Box::new(mop_run),
        ),
        (
            "breakdown: `mop --version` (process start)",
            Box::new(|| {
                let mut c = Command::new(bin("mop"));
                c.arg("--version");
                c
            }),
        ),
        (
            "breakdown: `mop run --dry-run` (prepare, no sandbox)",
            Box::new(|| {
                let mut c = Command::new(bin("mop"));
                c.arg("run")
                    .arg("--dry-run")
                    .arg("--workdir")
                    .arg(workdir.path());
                task_flags(&mut c);
                c.args(["--", "/bin/true"]);
                c
            }),
        ),
    ];
    if o.hold {
        println!("{:?}", mop_run());
        eprintln!("holding the server and daemon up; close stdin (Ctrl-D) to end");
        std::io::copy(&mut std::io::stdin(), &mut std::io::sink())?;
        return Ok(Section::new("held"));
    }
    for _ in 0..5 {
        for (_, make) in &commands {
            timed(&mut make())?;
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); commands.len()];
    for i in 0..o.iterations {
        if i % 50 == 0 {
            eprintln!("iteration {i}/{}", o.iterations);
        }
        for (k, (_, make)) in commands.iter().enumerate() {
            samples[k].push(timed(&mut make())?);
        }
    }
    let summaries: Vec<_> = samples.iter_mut().map(|s| summarize(s)).collect();
    let (b, m) = (&summaries[0], &summaries[1]);
    let added = m.median.saturating_sub(b.median);
    let added_p99 = m.p99.saturating_sub(b.p99);
    let (allowed, allowed_p99) = (Duration::from_millis(2), Duration::from_millis(4));

    // Prepare + release throughput: concurrent runners, each a loop of the two commands.
    eprintln!(
        "throughput: {} runners for {}s",
        o.runners, o.throughput_secs
    );
    let tasks = synth::tasks(o.seed, 64, o.cards);
    let stop_at = Instant::now() + Duration::from_secs(o.throughput_secs);
    let started = Instant::now();
    let counts: Vec<Result<usize>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..o.runners)
            .map(|r| {
                let (tasks, socket) = (&tasks, &socket);
                scope.spawn(move || -> Result<usize> {
                    let mut n = 0;
                    while Instant::now() < stop_at {
                        let t = &tasks[(r * 7 + n) % tasks.len()];
                        prepare_and_release(socket, "bench", &format!("tp-{r}-{n}"), t)?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a runner thread panicked"))
            })
            .collect()
    });
    let elapsed = started.elapsed();
    let mut pairs = 0;
    for c in counts {
        pairs += c?;
    }
    let per_sec = pairs as f64 / elapsed.as_secs_f64();

    let mut sec = Section::new(format!("Task start at {} cards", o.cards));
    sec.line(format!(
        "Alternating in one run, {} iterations each after 5 warm-ups: `mop run -- /bin/true` \
         (prepare against the workspace, bwrap, release) and bare bwrap with the same flags \
         (taken from `mop run --dry-run`, the view and working directory bound by path instead \
         of by descriptor, without mop's seccomp filter, guard and keyring), plus two breakdown rows. Then {} runners, each looping `mop prepare --json` + \
         `mop release` as separate processes for {} s.\n",
        o.iterations, o.runners, o.throughput_secs
    ));
    sec.line("| command | median | p99 |\n|---|---:|---:|");
    for ((name, _), s) in commands.iter().zip(&summaries) {
        sec.line(format!("| {name} | {} | {} |", show(s.median), show(s.p99)));
    }
    sec.line(format!(
        "\nAdded by mop run: {} median ({:.2}×; allowed {}), {} at p99 (allowed {}). \
         Task selection: {selected} cards selected, {mounted} mounted.",
        show(added),
        m.median.as_secs_f64() / b.median.as_secs_f64(),
        show(allowed),
        show(added_p99),
        show(allowed_p99),
    ));
    sec.line(format!(
        "\nPrepare + release with {} concurrent runners: {pairs} pairs in {:.1} s = **{per_sec:.0} pairs/s**.",
        o.runners,
        elapsed.as_secs_f64()
    ));
    sec.figure(
        format!("run.added_us.{}", o.cards),
        added.as_secs_f64() * 1e6,
        true,
    );
    sec.target(
        "`mop run -- /bin/true` vs bare bwrap, median",
        "≤ +2 ms",
        format!(
            "+{} ({:.2}×; {} vs {})",
            show(added),
            m.median.as_secs_f64() / b.median.as_secs_f64(),
            show(m.median),
            show(b.median)
        ),
        added <= allowed,
    );
    sec.target(
        "`mop run -- /bin/true` vs bare bwrap, p99",
        "≤ +4 ms",
        format!("+{} ({} vs {})", show(added_p99), show(m.p99), show(b.p99)),
        added_p99 <= allowed_p99,
    );
    Ok(sec)
}
