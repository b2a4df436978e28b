//! `mop-bench all`: every benchmark in one run, written to BENCHMARKS.md with the machine,
//! the commands and a summary of the targets. `--smoke` runs the same code at tiny sizes
//! (CI runs it so the harness cannot rot); its figures mean nothing and say so.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use mop_bench::Section;

pub fn run(smoke: bool, out: &Path, seed: u64) -> Result<()> {
    let started = Instant::now();
    let mut sections: Vec<Section> = Vec::new();
    // The report is rewritten after every benchmark, so a failure late in a long run
    // keeps what was measured before it (marked incomplete).
    let mut step = |name: &str, f: &mut dyn FnMut() -> Result<Vec<Section>>| -> Result<()> {
        eprintln!("\n=== {name} ===");
        let t = Instant::now();
        let got = f().with_context(|| format!("benchmark {name}"))?;
        eprintln!("=== {name}: {:.1}s ===", t.elapsed().as_secs_f64());
        sections.extend(got);
        write(
            out,
            &render(&sections, smoke, started.elapsed().as_secs_f64(), false),
        )
    };
    let (sizes, tasks, rounds, builds): (Vec<usize>, _, _, _) = if smoke {
        (vec![200], 20, 1, 1)
    } else {
        (vec![1_000, 10_000, 100_000], 200, 5, 3)
    };
    step("engine", &mut || {
        Ok(vec![crate::engine(&sizes, tasks, rounds, builds, seed)?])
    })?;
    let cards = if smoke { 200 } else { 10_000 };
    step("sync", &mut || {
        crate::sync::run(&crate::sync::Options {
            cards,
            rounds: if smoke { 2 } else { 9 },
            polls: if smoke { 20 } else { 500 },
            seed,
            callgrind: true,
        })
    })?;
    // On SQLite, then as one replica on PostgreSQL, each against nginx in its own run.
    step("server", &mut || {
        [false, true]
            .into_iter()
            .map(|postgres| {
                crate::server::run(&crate::server::Options {
                    cards,
                    rounds: if smoke { 1 } else { 3 },
                    seconds: if smoke { 1 } else { 5 },
                    connections: if smoke { 4 } else { 32 },
                    seed,
                    postgres,
                })
            })
            .collect()
    })?;
    // One server, then two server processes on the same SQLite file, then two on one
    // PostgreSQL, in the same run.
    step("fleet", &mut || {
        [(1, false), (2, false), (2, true)]
            .into_iter()
            .map(|(replicas, postgres)| {
                crate::fleet::run(&crate::fleet::Options {
                    cards,
                    hosts: if smoke {
                        vec![1_000, 3_000]
                    } else {
                        vec![
                            1_000, 10_000, 30_000, 60_000, 120_000, 240_000, 480_000, 960_000,
                        ]
                    },
                    seconds: if smoke { 1 } else { 10 },
                    seed,
                    replicas,
                    postgres,
                })
            })
            .collect()
    })?;
    step("run", &mut || {
        Ok(vec![crate::run::run(&crate::run::Options {
            cards,
            iterations: if smoke { 5 } else { 200 },
            runners: if smoke { 4 } else { 16 },
            throughput_secs: if smoke { 1 } else { 10 },
            seed,
            hold: false,
        })?])
    })?;
    step("memory", &mut || {
        Ok(vec![crate::memory::run(&crate::memory::Options {
            workspaces: if smoke { 2 } else { 5 },
            cards,
            prepares: if smoke { 10 } else { 100 },
            growth: if smoke {
                vec![100]
            } else {
                vec![1_000, 10_000, 100_000]
            },
            seed,
        })?])
    })?;

    write(
        out,
        &render(&sections, smoke, started.elapsed().as_secs_f64(), true),
    )?;
    let missed = sections
        .iter()
        .flat_map(|s| &s.targets)
        .filter(|t| !t.met)
        .count();
    eprintln!(
        "\nwrote {} ({} sections, {missed} target(s) missed) in {:.0}s",
        out.display(),
        sections.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes beside and renames, so the file is always a whole report.
fn write(out: &Path, report: &str) -> Result<()> {
    let tmp = out.with_extension("md.tmp");
    std::fs::write(&tmp, report).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("cannot write {}", out.display()))
}

fn render(sections: &[Section], smoke: bool, secs: f64, complete: bool) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# mop benchmarks\n");
    if !complete {
        let _ = writeln!(
            md,
            "**Incomplete**: the run is still going, or stopped with an error after the \
             sections below.\n"
        );
    }
    if smoke {
        let _ = writeln!(
            md,
            "**Smoke run** (`mop-bench all --smoke`): tiny sizes and short runs that check \
             the harness works. These figures are not measurements of mop.\n"
        );
    }
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let _ = writeln!(
        md,
        "Produced by `bench/all.sh` (release build, then `mop-bench all`) on {} in {secs:.0} s.\n\n\
         - Machine: {}\n- Toolchain: {rustc}{}\n- Every comparison runs its two sides \
         alternately in the same run; figures are medians unless marked p99.\n",
        jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
        mop_bench::machine(),
        if cfg!(debug_assertions) {
            " (DEBUG build: not representative)"
        } else {
            ", release build"
        }
    );
    let _ = writeln!(md, "## Targets\n");
    let _ = writeln!(
        md,
        "| benchmark | target | this run | met |\n|---|---|---|---|"
    );
    for t in sections.iter().flat_map(|s| &s.targets) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            t.what,
            t.target,
            t.measured,
            if t.met { "yes" } else { "**no**" }
        );
    }
    let _ = writeln!(md);
    for s in sections {
        let _ = writeln!(md, "{}", s.render());
    }
    let notes = mop_tests::repo_root().join("bench/NOTES.md");
    if let Ok(text) = std::fs::read_to_string(&notes) {
        let _ = writeln!(md, "{}", text.trim_end());
        let _ = writeln!(md);
    }
    let _ = writeln!(
        md,
        "## Reproduce\n\n```sh\nbench/all.sh                 # installs nginx, wrk, curl if missing; writes BENCHMARKS.md\n\
         bench/all.sh --smoke --out /tmp/smoke.md   # the under-a-minute version CI runs\n```\n\n\
         Single benchmarks: `target/release/mop-bench <engine|sync|server|fleet|run|memory> --help`."
    );
    md
}
