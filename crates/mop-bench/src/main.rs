//! `mop-bench`: release-mode benchmarks of mop, each against a baseline in the same run.
//!
//! `mop-bench all` runs every benchmark and writes BENCHMARKS.md (`bench/all.sh` builds
//! and runs it; `--smoke` is the tiny version CI runs). The subcommands run one each:
//! `engine` (card engine), `sync` (cold, incremental, unchanged), `server` (304s vs nginx),
//! `fleet` (simulated daemons), `run` (task start vs bare bwrap, prepare throughput) and
//! `memory` (daemon RSS) and `hybrid` (the dense ranker's recall and cost).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use mop_bench::{Section, show, summarize, synth};
use mop_cards::{Catalog, Rules, render_memory_md};
use mop_search::{IndexDoc, SearchIndex, build_index_with, select_for_task};

mod all;
mod changes;
mod curation;
mod fleet;
mod hybrid;
mod inherit;
mod lessons;
mod memory;
mod nginx;
mod run;
mod server;
mod store;
mod sync;

#[derive(Parser)]
#[command(
    version,
    about = "Benchmarks of mop (run with cargo run --release -p mop-bench)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Card engine: index build and per-task select + rank + render at several sizes.
    Engine {
        /// Workspace sizes in cards, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
        sizes: Vec<usize>,
        /// Distinct synthetic tasks per size.
        #[arg(long, default_value_t = 200)]
        tasks: usize,
        /// Times each task is run (after one warm-up pass).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Index builds per size (the median is reported).
        #[arg(long, default_value_t = 3)]
        builds: usize,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Per-task select + rank + render over a workspace's cards alone and composed with an
    /// inherited workspace's, alternating in one run.
    Inherit {
        /// The workspace's own cards.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// The inherited workspace's cards.
        #[arg(long, default_value_t = 1_000)]
        inherited: usize,
        /// Distinct synthetic tasks.
        #[arg(long, default_value_t = 200)]
        tasks: usize,
        /// Times each task is run on each side (after one warm-up pass).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Write a synthetic workspace as an OKF card directory (for `mop-server import`).
    GenCards {
        /// Target directory (created).
        dir: std::path::PathBuf,
        /// Cards.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Task start: `mop run -- /bin/true` against bare bwrap with the same flags.
    Run {
        /// Cards in the workspace.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// Runs of each (alternating, after 5 warm-up runs).
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        /// Concurrent runners in the prepare + release throughput run.
        #[arg(long, default_value_t = 16)]
        runners: usize,
        /// Seconds of the throughput run.
        #[arg(long, default_value_t = 10)]
        throughput_secs: u64,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Instead of timing, print the `mop run` command line and keep the server and
        /// daemon up until stdin closes (for profiling with perf or strace).
        #[arg(long)]
        hold: bool,
    },
    /// Everything below, written to BENCHMARKS.md with the machine and the commands.
    All {
        /// Tiny sizes and short runs (under a minute): checks the harness, not the speed.
        #[arg(long)]
        smoke: bool,
        /// The regression guard: a small set of benchmarks, each figure compared with the
        /// same figure in --baseline; fails if any is more than 20 % worse. The report goes
        /// to --out (default bench-compare.md in $CARGO_TARGET_DIR, else in target/).
        #[arg(long, conflicts_with = "smoke")]
        compare: bool,
        /// The BENCHMARKS.md to compare against.
        #[arg(long, default_value = "BENCHMARKS.md")]
        baseline: std::path::PathBuf,
        /// Where to write the report [default: BENCHMARKS.md, or bench-compare.md in
        /// $CARGO_TARGET_DIR (else target/) with --compare].
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Syncs that follow the change: a warm daemon's wall and CPU time for one sync after
    /// a few cards are edited, and after a counter-only batch.
    Changes {
        /// Cards in the workspace.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// Cards edited per round.
        #[arg(long, default_value_t = 100)]
        edited: usize,
        /// Cards whose counters one batch changes.
        #[arg(long, default_value_t = 100)]
        counted: usize,
        /// Rounds of each kind.
        #[arg(long, default_value_t = 9)]
        rounds: usize,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Daemon sync: cold sync vs curl + tar from nginx (with CPU times), incremental bytes
    /// on the wire, CPU per unchanged poll. Needs nginx and curl (and valgrind with
    /// --callgrind).
    Sync {
        /// Cards in the workspace.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// Alternating rounds.
        #[arg(long, default_value_t = 9)]
        rounds: usize,
        /// Also count one cold sync's instructions under `valgrind --tool=callgrind`.
        #[arg(long)]
        callgrind: bool,
        /// Keep that run's callgrind profile in this file, for `callgrind_annotate`
        /// (implies --callgrind).
        #[arg(long, value_name = "FILE")]
        callgrind_out: Option<std::path::PathBuf>,
        /// Unchanged polls for the CPU measurement.
        #[arg(long, default_value_t = 500)]
        polls: usize,
        /// Instead of timing, print a daemon config that cold-syncs the workspace and keep
        /// the server up until stdin closes (for profiling cold syncs with perf or strace).
        #[arg(long)]
        hold: bool,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Fleet: simulated daemons polling one server every 30 s, 1 % finding a change.
    Fleet {
        /// Cards in the workspace.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// Host counts to step through (stops once p99 passes 50 ms).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1000,10000,30000,60000,120000,240000,480000,960000"
        )]
        hosts: Vec<usize>,
        /// Seconds per step.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Server processes on the one database, the polls spread over them in turn.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
        replicas: u16,
        /// Run the servers on a PostgreSQL started for the benchmark (its CPU is counted
        /// with theirs), instead of one SQLite file.
        #[arg(long)]
        postgres: bool,
    },
    /// Hybrid retrieval: the retrieval eval (BM25 alone vs hybrid), then the dense
    /// ranker's cost (model, index build, per task) against BM25 alone.
    Hybrid {
        /// The model2vec model directory (packaging/embedding/install-model.sh).
        #[arg(long, env = "MOP_EMBEDDING_MODEL")]
        model: std::path::PathBuf,
        /// Cards in the synthetic workspace.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// Distinct synthetic tasks.
        #[arg(long, default_value_t = 200)]
        tasks: usize,
        /// Times each task is run each way.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Index builds each way (the median is reported).
        #[arg(long, default_value_t = 3)]
        builds: usize,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Daemon memory after syncing several workspaces and serving prepares.
    Memory {
        /// Workspaces.
        #[arg(long, default_value_t = 5)]
        workspaces: usize,
        /// Cards per workspace.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// Prepares (each released).
        #[arg(long, default_value_t = 100)]
        prepares: usize,
        /// One-workspace sizes for the growth rows.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
        growth: Vec<usize>,
        /// Workspace counts (of --cards each) for the rows on growth with workspaces.
        #[arg(long, value_delimiter = ',', default_value = "1,10")]
        workspace_growth: Vec<usize>,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// The same-lesson rule: a threshold sweep on the eval's dev split, the choice scored
    /// once on its test split (tests/eval/same_lesson.toml).
    Lessons {
        /// Instead, count how many cards of a synthetic workspace of this size share a
        /// band key with a card (what a store's lookup reads).
        #[arg(long, value_name = "CARDS")]
        bands_of: Option<usize>,
        /// An embedding model: the dense half of the rule is swept and scored too.
        #[arg(long, value_name = "DIR", env = "MOP_EMBEDDING_MODEL")]
        model: Option<std::path::PathBuf>,
    },
    /// Agent stores at the card server (screening and the same-lesson rule): latency
    /// p50/p90/p99 in workspaces of several sizes.
    Store {
        /// Workspace sizes in cards, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
        cards: Vec<usize>,
        /// Stores timed per size (a fifth as many more warm up first).
        #[arg(long, default_value_t = 2000)]
        stores: usize,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Curation reads (queue page, card details, stale, search, a listing page) in a
    /// workspace whose queue holds many duplicate groups.
    Curation {
        /// Workspace sizes in cards, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
        cards: Vec<usize>,
        /// Unverified cards stored by agents.
        #[arg(long, default_value_t = 1000)]
        unverified: usize,
        /// Lessons they are stored as (each a duplicate group).
        #[arg(long, default_value_t = 200)]
        groups: usize,
        /// Reads of each kind timed per size (after one warm-up round).
        #[arg(long, default_value_t = 30)]
        iterations: usize,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Card server: 304 answers/s against nginx in the same run, manifest and delta sizes
    /// and latencies. Needs `wrk` and `nginx` (bench/server.sh installs them).
    Server {
        /// Cards in the workspace.
        #[arg(long, default_value_t = 10_000)]
        cards: usize,
        /// Alternating rounds of mop-server and nginx.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds per wrk run.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Concurrent connections per wrk run.
        #[arg(long, default_value_t = 32)]
        connections: usize,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Run the server on a PostgreSQL started for the benchmark, instead of SQLite.
        #[arg(long)]
        postgres: bool,
    },
}

/// A mop-server with `config`, on an SQLite file or on a PostgreSQL started for it (kept
/// alive by the second value).
pub(crate) fn start_server(
    postgres: bool,
    config: &str,
) -> Result<(
    mop_testkit::procs::Server,
    Option<mop_testkit::postgres::Postgres>,
)> {
    if !postgres {
        return Ok((mop_testkit::procs::Server::start_with(config), None));
    }
    let pg = mop_testkit::postgres::Postgres::start()
        .context("PostgreSQL is not installed: apt-get install postgresql")?;
    Ok((
        mop_testkit::procs::Server::on_postgres(&pg.url(), config),
        Some(pg),
    ))
}

fn main() -> Result<()> {
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: debug build; run with `cargo run --release -p mop-bench` for real figures"
        );
    }
    let section = match Cli::parse().command {
        Command::All {
            smoke,
            compare,
            baseline,
            out,
            seed,
        } => {
            return if compare {
                // Beside the build, wherever cargo puts it.
                let out = out.unwrap_or_else(|| {
                    std::env::var_os("CARGO_TARGET_DIR")
                        .map_or_else(|| "target".into(), std::path::PathBuf::from)
                        .join("bench-compare.md")
                });
                all::compare(&baseline, &out, seed)
            } else {
                all::run(smoke, &out.unwrap_or_else(|| "BENCHMARKS.md".into()), seed)
            };
        }
        Command::Engine {
            sizes,
            tasks,
            rounds,
            builds,
            seed,
        } => engine(&sizes, tasks, rounds.max(1), builds.max(1), seed)?,
        Command::Inherit {
            cards,
            inherited,
            tasks,
            rounds,
            seed,
        } => inherit::run(&inherit::Options {
            cards,
            inherited,
            tasks,
            rounds: rounds.max(1),
            seed,
        })?,
        Command::GenCards { dir, cards, seed } => {
            let ws = synth::workspace(seed, cards, "2026-11-29T00:00:00Z".parse()?);
            synth::write_dir(&ws, &dir)?;
            eprintln!(
                "wrote {cards} cards ({} bytes) to {}",
                ws.bytes,
                dir.display()
            );
            return Ok(());
        }
        Command::Changes {
            cards,
            edited,
            counted,
            rounds,
            seed,
        } => {
            let s = changes::run(&changes::Options {
                cards,
                edited,
                counted,
                rounds: rounds.max(1),
                seed,
                targets: None,
            })?;
            println!("{}", s.render());
            return Ok(());
        }
        Command::Sync {
            cards,
            rounds,
            callgrind,
            callgrind_out,
            polls,
            seed,
            hold,
        } => {
            for s in sync::run(&sync::Options {
                cards,
                rounds: rounds.max(1),
                polls: polls.max(1),
                seed,
                callgrind,
                callgrind_out,
                hold,
            })? {
                println!("{}", s.render());
            }
            return Ok(());
        }
        Command::Lessons { bands_of, model } => {
            match bands_of {
                Some(n) => lessons::band_candidates(n, 42),
                None => println!("{}", lessons::run(model.as_deref())?.render()),
            }
            return Ok(());
        }
        Command::Curation {
            cards,
            unverified,
            groups,
            iterations,
            seed,
        } => {
            let s = curation::run(&curation::Options {
                cards,
                unverified,
                groups: groups.max(1),
                iterations: iterations.max(2),
                seed,
            })?;
            println!("{}", s.render());
            return Ok(());
        }
        Command::Store {
            cards,
            stores,
            seed,
        } => {
            let s = store::run(&store::Options {
                cards,
                stores: stores.max(10),
                seed,
            })?;
            println!("{}", s.render());
            return Ok(());
        }
        Command::Hybrid {
            model,
            cards,
            tasks,
            rounds,
            builds,
            seed,
        } => {
            for s in hybrid::run(&hybrid::Options {
                model,
                cards,
                tasks,
                rounds: rounds.max(1),
                builds: builds.max(1),
                prepares: 100,
                seed,
            })? {
                println!("{}", s.render());
            }
            return Ok(());
        }
        Command::Fleet {
            cards,
            hosts,
            seconds,
            seed,
            replicas,
            postgres,
        } => fleet::run(&fleet::Options {
            cards,
            hosts,
            seconds: seconds.max(1),
            seed,
            replicas: usize::from(replicas),
            postgres,
            scale_target: None,
        })?,
        Command::Memory {
            workspaces,
            cards,
            prepares,
            growth,
            workspace_growth,
            seed,
        } => memory::run(&memory::Options {
            workspaces: workspaces.max(1),
            cards,
            prepares,
            growth,
            workspace_growth,
            seed,
        })?,
        Command::Run {
            cards,
            iterations,
            runners,
            throughput_secs,
            seed,
            hold,
        } => run::run(&run::Options {
            cards,
            iterations: iterations.max(1),
            runners: runners.max(1),
            throughput_secs: throughput_secs.max(1),
            seed,
            hold,
        })?,
        Command::Server {
            cards,
            rounds,
            seconds,
            connections,
            seed,
            postgres,
        } => server::run(&server::Options {
            cards,
            rounds: rounds.max(1),
            seconds: seconds.max(1),
            connections: connections.max(1),
            seed,
            postgres,
        })?,
    };
    println!("{}", section.render());
    Ok(())
}

/// Builds the index of a synthetic workspace into `dir` (with `model`'s vectors, if
/// given) and times it.
fn timed_build(
    catalog: &Catalog,
    by_id: &std::collections::HashMap<mop_cards::CardId, &mop_cards::Card>,
    dir: &Path,
    model: Option<&mop_embed::Model>,
) -> Result<Duration> {
    let docs = catalog.cards().enumerate().map(|(ord, c)| {
        let card = by_id[&c.id];
        IndexDoc {
            ord: ord as u32,
            title: &card.summary.title,
            description: card.summary.description.as_deref().unwrap_or(""),
            labels: &card.summary.labels,
            body: std::borrow::Cow::Borrowed(&card.body),
            open: card.summary.is_open(),
        }
    });
    let started = Instant::now();
    build_index_with(dir, docs, model)?;
    Ok(started.elapsed())
}

struct Row {
    cards: usize,
    bytes: u64,
    catalog: Duration,
    build: Duration,
    index_bytes: u64,
    per_task: mop_bench::Summary,
    search: mop_bench::Summary,
    selected: f64,
}

fn engine(
    sizes: &[usize],
    tasks: usize,
    rounds: usize,
    builds: usize,
    seed: u64,
) -> Result<Section> {
    let now = "2026-11-29T00:00:00Z".parse()?;
    let rules = Rules::default();
    let tasks_n = tasks;
    let mut rows = Vec::new();
    for &size in sizes {
        eprintln!("[{size} cards] generating workspace");
        let ws = synth::workspace(seed, size, now);

        let started = Instant::now();
        let catalog = Catalog::new(ws.manifest.clone(), &rules)?;
        let catalog_time = started.elapsed();

        let by_id: std::collections::HashMap<_, _> =
            ws.cards.iter().map(|c| (c.summary.id, c)).collect();
        let mut build_times = Vec::new();
        let mut kept = None;
        for b in 0..builds {
            eprintln!("[{size} cards] index build {}/{builds}", b + 1);
            let dir = tempfile::tempdir()?;
            build_times.push(timed_build(&catalog, &by_id, dir.path(), None)?);
            kept = Some(dir);
        }
        let dir = kept.context("at least one build")?;
        let index_bytes = dir_size(dir.path())?;
        let index = SearchIndex::open(dir.path())?;

        let tasks = synth::tasks(seed, tasks_n, size);
        eprintln!("[{size} cards] {} tasks x {rounds} rounds", tasks.len());
        let mut selected_total = 0usize;
        for t in &tasks {
            let sel = select_for_task(&catalog, &index, t, &rules)?;
            selected_total += sel.selected.total();
            std::hint::black_box(render_memory_md(&catalog, &sel, t, &rules.config));
        }
        let mut per_task = Vec::with_capacity(tasks.len() * rounds);
        let mut search = Vec::with_capacity(tasks.len() * rounds);
        for _ in 0..rounds {
            for t in &tasks {
                let started = Instant::now();
                let sel = select_for_task(&catalog, &index, t, &rules)?;
                let md = render_memory_md(&catalog, &sel, t, &rules.config);
                per_task.push(started.elapsed());
                std::hint::black_box(md);

                let started = Instant::now();
                let visible = Arc::new(catalog.visible_set(t));
                let hits = index.search(&t.search_text(), rules.config.text_candidates, visible)?;
                search.push(started.elapsed());
                std::hint::black_box(hits);
            }
        }
        rows.push(Row {
            cards: size,
            bytes: ws.bytes,
            catalog: catalog_time,
            build: summarize(&mut build_times).median,
            index_bytes,
            per_task: summarize(&mut per_task),
            search: summarize(&mut search),
            selected: selected_total as f64 / tasks.len() as f64,
        });
    }
    Ok(report(&rows, tasks_n, rounds))
}

fn report(rows: &[Row], tasks: usize, rounds: usize) -> Section {
    let mut sec = Section::new("Card engine: index build and per-task selection");
    sec.line(format!(
        "Per workspace size: catalog and BM25 index build, then {tasks} synthetic tasks × \
         {rounds} rounds of selection + ranking + MEMORY.md rendering against the built \
         index (the work `mopd` does for every prepare, minus the file tree).\n"
    ));
    sec.line(
        "| cards | card bytes | catalog build | index build (median) | index size | selected per task (mean) | per task median | per task p99 | of which BM25 search (median) |",
    );
    sec.line("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        sec.line(format!(
            "| {} | {:.1} MiB | {} | {} | {:.1} MiB | {:.1} | {} | {} | {} |",
            r.cards,
            r.bytes as f64 / (1 << 20) as f64,
            show(r.catalog),
            show(r.build),
            r.index_bytes as f64 / (1 << 20) as f64,
            r.selected,
            show(r.per_task.median),
            show(r.per_task.p99),
            show(r.search.median),
        ));
    }
    for r in rows {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        sec.figure(
            format!("engine.per_task_median_us.{}", r.cards),
            us(r.per_task.median),
            true,
        );
        sec.figure(
            format!("engine.index_build_ms.{}", r.cards),
            r.build.as_secs_f64() * 1e3,
            true,
        );
    }
    for r in rows.iter().filter(|r| r.cards >= 100_000) {
        sec.target(
            &format!("per-task select + rank + render at {} cards", r.cards),
            "≤ 2 ms",
            show(r.per_task.median),
            r.per_task.median <= Duration::from_millis(2),
        );
        sec.target(
            &format!("index build at {} cards", r.cards),
            "≤ 5 s",
            show(r.build),
            r.build <= Duration::from_secs(5),
        );
    }
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let cards = b.cards as f64 / a.cards as f64;
        let time = b.per_task.median.as_secs_f64() / a.per_task.median.as_secs_f64();
        sec.line(format!(
            "\nPer-task median {} → {} cards: ×{time:.2} time for ×{cards:.0} cards ({}).",
            a.cards,
            b.cards,
            if time <= cards {
                "sub-linear or linear"
            } else {
                "worse than linear"
            }
        ));
    }
    sec
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let m = e?.metadata()?;
        if !m.is_file() {
            bail!("unexpected non-file in index dir");
        }
        total += m.len();
    }
    Ok(total)
}
