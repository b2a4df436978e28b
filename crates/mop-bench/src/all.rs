//! `mop-bench all`: every benchmark in one run, written to BENCHMARKS.md with the machine,
//! the commands and a summary of the targets. `--smoke` runs the same code at tiny sizes
//! (CI runs it so the harness cannot rot); its figures mean nothing and say so.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use mop_bench::Section;

/// The heading of the figures table, which `--compare` reads back.
const FIGURES_HEADING: &str = "## Figures for the regression guard";
/// A figure this much worse than before is flagged.
const WORSE: f64 = 0.2;

/// `bench/all.sh --compare`: a small set of the benchmarks (engine at 1k and 10k cards,
/// cold sync, the server's 304s against nginx, task start), each figure set beside the
/// same figure in `baseline` (a BENCHMARKS.md). Flags, and fails on, any figure more than
/// 20 % worse. Figures the baseline lacks are shown without a verdict.
pub fn compare(baseline: &Path, out: &Path, seed: u64) -> Result<()> {
    let text = std::fs::read_to_string(baseline)
        .with_context(|| format!("cannot read the baseline {}", baseline.display()))?;
    let before = parse_figures(&text);
    if before.is_empty() {
        anyhow::bail!(
            "{} has no \"{FIGURES_HEADING}\" table: make it with a full bench/all.sh run first",
            baseline.display()
        );
    }
    let cards = 10_000;
    let mut sections = vec![crate::engine(&[1_000, cards], 200, 3, 3, seed)?];
    sections.extend(crate::sync::run(&crate::sync::Options {
        cards,
        rounds: 3,
        polls: 50,
        seed,
        callgrind: false,
        callgrind_out: None,
        hold: false,
    })?);
    sections.push(crate::server::run(&crate::server::Options {
        cards,
        rounds: 2,
        seconds: 3,
        connections: 32,
        seed,
        postgres: false,
    })?);
    sections.push(crate::run::run(&crate::run::Options {
        cards,
        iterations: 50,
        runners: 4,
        throughput_secs: 2,
        seed,
        hold: false,
    })?);
    let mut md = format!(
        "# Benchmark comparison\n\nThis run ({}) against {}. A figure more than {:.0} % \
         worse is flagged.\n\n| figure | before | now | change | |\n|---|---:|---:|---:|---|\n",
        jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
        baseline.display(),
        WORSE * 100.0
    );
    let mut worse = Vec::new();
    for f in sections.iter().flat_map(|s| &s.figures) {
        let Some(&old) = before.get(&f.key) else {
            let _ = writeln!(
                md,
                "| {} | – | {:.3} | | not in the baseline |",
                f.key, f.value
            );
            continue;
        };
        let change = if old == 0.0 { 0.0 } else { f.value / old - 1.0 };
        let is_worse = worse_than(old, f.value, f.lower_is_better);
        if is_worse {
            worse.push(f.key.clone());
        }
        let _ = writeln!(
            md,
            "| {} | {old:.3} | {:.3} | {:+.0} % | {} |",
            f.key,
            f.value,
            change * 100.0,
            if is_worse { "**worse**" } else { "" }
        );
    }
    write(out, &md)?;
    println!("{md}");
    if !worse.is_empty() {
        anyhow::bail!(
            "{} figure(s) more than {:.0} % worse than {}: {} (report: {})",
            worse.len(),
            WORSE * 100.0,
            baseline.display(),
            worse.join(", "),
            out.display()
        );
    }
    eprintln!(
        "no figure more than {:.0} % worse (report: {})",
        WORSE * 100.0,
        out.display()
    );
    Ok(())
}

/// True when `now` is more than [`WORSE`] worse than `before`.
fn worse_than(before: f64, now: f64, lower_is_better: bool) -> bool {
    if lower_is_better {
        now > before * (1.0 + WORSE)
    } else {
        now < before * (1.0 - WORSE)
    }
}

/// The figures table of a BENCHMARKS.md: key to value.
fn parse_figures(md: &str) -> std::collections::BTreeMap<String, f64> {
    md.lines()
        .skip_while(|l| l.trim() != FIGURES_HEADING)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            match cells.as_slice() {
                [key, value, _] => Some(((*key).to_owned(), value.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

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
    step("inherit", &mut || {
        Ok(vec![crate::inherit::run(&crate::inherit::Options {
            cards: if smoke { 200 } else { 10_000 },
            inherited: if smoke { 20 } else { 1_000 },
            tasks,
            rounds,
            seed,
        })?])
    })?;
    let cards = if smoke { 200 } else { 10_000 };
    step("sync", &mut || {
        crate::sync::run(&crate::sync::Options {
            cards,
            rounds: if smoke { 2 } else { 9 },
            polls: if smoke { 20 } else { 500 },
            seed,
            callgrind: true,
            callgrind_out: None,
            hold: false,
        })
    })?;
    // Syncs whose cost follows the change: 1 % edited at 10k cards, then 10 edited and a
    // counter batch at 100k.
    step("changes", &mut || {
        let sizes = if smoke {
            vec![(200, 2, None)]
        } else {
            vec![
                (
                    10_000,
                    100,
                    Some(crate::changes::Targets {
                        edited_wall: Some(100),
                        edited_cpu: Some(60),
                        counted_wall: None,
                    }),
                ),
                (
                    100_000,
                    10,
                    Some(crate::changes::Targets {
                        edited_wall: Some(150),
                        edited_cpu: None,
                        counted_wall: Some(50),
                    }),
                ),
            ]
        };
        sizes
            .into_iter()
            .map(|(cards, edited, targets)| {
                crate::changes::run(&crate::changes::Options {
                    cards,
                    edited,
                    counted: if smoke { 2 } else { 100 },
                    rounds: if smoke { 2 } else { 9 },
                    seed,
                    targets,
                })
            })
            .collect()
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
                            1_000, 10_000, 30_000, 60_000, 120_000, 240_000, 480_000, 1_000_000,
                            2_000_000,
                        ]
                    },
                    seconds: if smoke { 1 } else { 10 },
                    seed,
                    replicas,
                    postgres,
                    // The issue's figure is for one server.
                    scale_target: (!smoke && replicas == 1).then_some(1_000_000),
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
    // The dense ranker's recall and cost, with the model bench/all.sh installs.
    step("hybrid", &mut || {
        let model = std::env::var_os("MOP_EMBEDDING_MODEL").context(
            "MOP_EMBEDDING_MODEL is not set: bench/all.sh installs the model and sets it \
             (or run packaging/embedding/install-model.sh DIR and set it to DIR)",
        )?;
        crate::hybrid::run(&crate::hybrid::Options {
            model: model.into(),
            cards,
            tasks: if smoke { 20 } else { 200 },
            rounds: if smoke { 1 } else { 5 },
            builds: if smoke { 1 } else { 3 },
            prepares: if smoke { 10 } else { 100 },
            seed,
        })
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
            workspace_growth: if smoke { vec![1] } else { vec![1, 10] },
            seed,
        })?])
    })?;

    // The write path: the same-lesson eval (no server), then stores at the server.
    step("lessons", &mut || {
        let model = std::env::var_os("MOP_EMBEDDING_MODEL").map(std::path::PathBuf::from);
        Ok(vec![crate::lessons::run(model.as_deref())?])
    })?;
    step("store", &mut || {
        Ok(vec![crate::store::run(&crate::store::Options {
            cards: if smoke {
                vec![200]
            } else {
                vec![10_000, 100_000]
            },
            stores: if smoke { 50 } else { 2000 },
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
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
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
    let _ = writeln!(
        md,
        "{FIGURES_HEADING}\n\nThe numbers `bench/all.sh --compare` checks a later run against \
         (it flags any that got more than {:.0} % worse).\n\n| figure | value | better |\n|---|---:|---|",
        WORSE * 100.0
    );
    for f in sections.iter().flat_map(|s| &s.figures) {
        let _ = writeln!(
            md,
            "| {} | {:.3} | {} |",
            f.key,
            f.value,
            if f.lower_is_better { "lower" } else { "higher" }
        );
    }
    let _ = writeln!(md);
    let notes = mop_testkit::repo_root().join("bench/NOTES.md");
    if let Ok(text) = std::fs::read_to_string(&notes) {
        let _ = writeln!(md, "{}", text.trim_end());
        let _ = writeln!(md);
    }
    let _ = writeln!(
        md,
        "## Reproduce\n\n```sh\nbench/all.sh                 # installs nginx, wrk, curl if missing; writes BENCHMARKS.md\n\
         bench/all.sh --smoke --out /tmp/smoke.md   # the under-a-minute version CI runs\n```\n\n\
         Single benchmarks: `target/release/mop-bench <engine|sync|server|fleet|run|memory|hybrid|lessons|store> --help`."
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_reads_its_table_back_and_flags_only_past_twenty_percent() {
        let sections = vec![{
            let mut s = Section::new("x");
            s.figure("engine.index_build_ms.10000", 800.0, true);
            s.figure("server.not_modified_vs_nginx.sqlite.10000", 0.9, false);
            s
        }];
        let md = render(&sections, false, 1.0, true);
        let figures = parse_figures(&md);
        assert_eq!(figures.len(), 2);
        assert_eq!(figures["engine.index_build_ms.10000"], 800.0);
        // Times: 21 % slower is flagged, 19 % is not; faster never is.
        assert!(worse_than(800.0, 968.0, true));
        assert!(!worse_than(800.0, 952.0, true));
        assert!(!worse_than(800.0, 100.0, true));
        // Rates: 21 % fewer is flagged, 19 % is not.
        assert!(worse_than(0.9, 0.711, false));
        assert!(!worse_than(0.9, 0.729, false));
        assert!(parse_figures("# no table here\n").is_empty());
    }
}
