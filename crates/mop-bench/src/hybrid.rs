//! `mop-bench hybrid`: what the dense ranker finds and what it costs. In one run: the
//! retrieval eval (recall of BM25 alone and of the hybrid, `mop_testkit::eval`), the model's
//! load time and resident size, and at N synthetic cards the index build and the per-task
//! select + rank + render without and with the dense ranker, alternating.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use mop_bench::{Section, show, show_bytes, summarize, synth};
use mop_cards::{Catalog, Rules, render_memory_md};
use mop_embed::Model;
use mop_search::{SearchIndex, select_for_task};

pub struct Options {
    pub model: PathBuf,
    pub cards: usize,
    pub tasks: usize,
    pub rounds: usize,
    pub builds: usize,
    /// Prepares served in the daemon memory measurement.
    pub prepares: usize,
    pub seed: u64,
}

/// The per-task budget with hybrid on, and the build budget including vectors.
const TASK_BUDGET_US: f64 = 1000.0;
const BUILD_BUDGET_MS: f64 = 2000.0;
/// Daemon memory readings each way (odd, for a median).
const MEMORY_ROUNDS: usize = 3;

pub fn run(o: &Options) -> Result<Vec<Section>> {
    let started = Instant::now();
    let model = Arc::new(Model::load(&o.model).with_context(|| "loading the embedding model")?);
    let load_time = started.elapsed();
    let model_files: u64 = ["config.json", "tokenizer.json", "model.safetensors"]
        .iter()
        .map(|f| std::fs::metadata(o.model.join(f)).map_or(0, |m| m.len()))
        .sum();

    eprintln!("hybrid: retrieval eval");
    let eval = mop_testkit::eval::run(&model);
    let mut recall = Section::new("Hybrid retrieval: what it finds");
    recall.line(format!(
        "The retrieval eval (`tests/retrieval.rs`, cards and queries in `tests/eval/retrieval.toml`): the example workspace plus {} cards, every query asked of BM25 alone and of BM25 + model {} fused by reciprocal rank fusion (k = 60), in one run. A paraphrase shares no search term with its card (checked).\n",
        mop_testkit::eval::Eval::load().card.len(),
        model.fingerprint(),
    ));
    recall.line(eval.table());
    recall.target(
        "hybrid: paraphrase recall@5 gain over BM25",
        "≥ +20 points",
        format!("{:+.0} points", eval.paraphrase_gain()),
        eval.paraphrase_gain() >= 20.0,
    );
    recall.target(
        "hybrid: exact matches and exclusions kept",
        "none lost",
        if eval.failures.is_empty() {
            "none lost".into()
        } else {
            format!("{} failures: {:?}", eval.failures.len(), eval.failures)
        },
        eval.failures.is_empty(),
    );
    recall.figure(
        "hybrid.paraphrase_recall5_gain",
        eval.paraphrase_gain(),
        false,
    );

    let now = "2026-11-29T00:00:00Z".parse()?;
    let rules = Rules::default();
    let size = o.cards;
    eprintln!("[{size} cards] generating workspace");
    let ws = synth::workspace(o.seed, size, now);
    let catalog = Catalog::new(ws.manifest.clone(), &rules)?;
    let by_id: std::collections::HashMap<_, _> =
        ws.cards.iter().map(|c| (c.summary.id, c)).collect();
    let (mut plain_builds, mut hybrid_builds) = (Vec::new(), Vec::new());
    let (mut plain_dir, mut hybrid_dir) = (None, None);
    for b in 0..o.builds {
        eprintln!("[{size} cards] index builds {}/{}", b + 1, o.builds);
        let dir = tempfile::tempdir()?;
        plain_builds.push(crate::timed_build(&catalog, &by_id, dir.path(), None)?);
        plain_dir = Some(dir);
        let dir = tempfile::tempdir()?;
        hybrid_builds.push(crate::timed_build(
            &catalog,
            &by_id,
            dir.path(),
            Some(&model),
        )?);
        hybrid_dir = Some(dir);
    }
    let plain = SearchIndex::open(plain_dir.context("a build")?.path())?;
    let hybrid_dir = hybrid_dir.context("a build")?;
    let (hybrid, state) = SearchIndex::open_with(
        hybrid_dir.path(),
        Some(&model),
        rules.config.dense_min_similarity,
    )?;
    anyhow::ensure!(
        hybrid.is_hybrid(),
        "the hybrid index is not hybrid: {state:?}"
    );

    let tasks = synth::tasks(o.seed, o.tasks, size);
    eprintln!(
        "[{size} cards] {} tasks x {} rounds, each both ways",
        tasks.len(),
        o.rounds
    );
    let (mut plain_times, mut hybrid_times) = (Vec::new(), Vec::new());
    // Warm-up pass, then alternating per task so both sides see the same machine.
    for t in &tasks {
        std::hint::black_box(select_for_task(&catalog, &plain, t, &rules)?);
        std::hint::black_box(select_for_task(&catalog, &hybrid, t, &rules)?);
    }
    for _ in 0..o.rounds {
        for t in &tasks {
            for (index, times) in [(&plain, &mut plain_times), (&hybrid, &mut hybrid_times)] {
                let started = Instant::now();
                let sel = select_for_task(&catalog, index, t, &rules)?;
                let md = render_memory_md(&catalog, &sel, t, &rules.config);
                times.push(started.elapsed());
                std::hint::black_box(md);
            }
        }
    }
    let plain_task = summarize(&mut plain_times);
    let hybrid_task = summarize(&mut hybrid_times);
    let plain_build = summarize(&mut plain_builds).median;
    let hybrid_build = summarize(&mut hybrid_builds).median;
    let vectors = hybrid.vector_bytes() as u64;
    let allowed_vectors = 4 * model.dim() as u64 * size as u64;

    // The daemon's memory with and without the model: one workspace of `size` cards
    // synced and 100 prepares served, each a fresh `mopd run`.
    let options = crate::memory::Options {
        workspaces: 1,
        cards: size,
        prepares: o.prepares,
        growth: Vec::new(),
        workspace_growth: Vec::new(),
        seed: o.seed,
    };
    // A daemon's RSS moves by several MiB between identical runs (heap layout, thread
    // stacks touched), so each side runs MEMORY_ROUNDS times, alternating, and the medians
    // are compared.
    let (mut without_rounds, mut with_rounds) = (Vec::new(), Vec::new());
    for round in 0..MEMORY_ROUNDS {
        for with_model in [round % 2 == 1, round % 2 == 0] {
            let model = with_model.then_some(o.model.as_path());
            eprintln!(
                "hybrid: daemon memory {} the model, round {}/{MEMORY_ROUNDS}",
                if with_model { "with" } else { "without" },
                round + 1
            );
            let (reading, vectored) = crate::memory::measure_with(&options, 1, size, model)?;
            if with_model {
                anyhow::ensure!(
                    vectored == 1,
                    "the daemon built no card vectors with the model"
                );
                with_rounds.push(reading.mem);
            } else {
                without_rounds.push(reading.mem);
            }
        }
    }
    let median = |v: &mut Vec<mop_bench::Memory>| {
        v.sort_by_key(|m| m.rss);
        v[v.len() / 2]
    };
    let rounds_rss = |v: &[mop_bench::Memory]| {
        v.iter()
            .map(|m| show_bytes(m.rss))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (rss_without, rss_with) = (rounds_rss(&without_rounds), rounds_rss(&with_rounds));
    let (without, with) = (median(&mut without_rounds), median(&mut with_rounds));
    let grown = with.rss.saturating_sub(without.rss);
    let allowed_rss = model_files + allowed_vectors;

    let mut cost = Section::new(format!("Hybrid retrieval: cost at {size} cards"));
    cost.line(format!(
        "Model {}: {} of files, loaded in {}. At {size} synthetic cards, {} index builds each way and {} tasks × {} rounds of select + rank + render, alternating BM25 alone and hybrid. Daemon memory: `mopd run` syncing one workspace of {size} cards and serving {} prepares, {MEMORY_ROUNDS} times without and {MEMORY_ROUNDS} times with `[selection] embedding_model`, alternating (medians).\n",
        model.fingerprint(),
        show_bytes(model_files),
        show(load_time),
        o.builds,
        tasks.len(),
        o.rounds,
        o.prepares,
    ));
    cost.line("| measurement | BM25 alone | hybrid | added |\n|---|---:|---:|---:|");
    cost.line(format!(
        "| index build (median) | {} | {} | {} |",
        show(plain_build),
        show(hybrid_build),
        show(hybrid_build.saturating_sub(plain_build)),
    ));
    cost.line(format!(
        "| per task, median | {} | {} | {} |",
        show(plain_task.median),
        show(hybrid_task.median),
        show(hybrid_task.median.saturating_sub(plain_task.median)),
    ));
    cost.line(format!(
        "| per task, p99 | {} | {} | {} |",
        show(plain_task.p99),
        show(hybrid_task.p99),
        show(hybrid_task.p99.saturating_sub(plain_task.p99)),
    ));
    cost.line(format!(
        "| card vectors in memory per loaded generation | | {} | (allowed {}: 4 B × {} dimensions × {size} cards) |",
        show_bytes(vectors),
        show_bytes(allowed_vectors),
        model.dim(),
    ));
    let task_us = hybrid_task.median.as_secs_f64() * 1e6;
    let build_ms = hybrid_build.as_secs_f64() * 1e3;
    cost.target(
        &format!("hybrid: per-task select + rank + render at {size} cards"),
        "≤ 1 ms",
        show(hybrid_task.median),
        task_us <= TASK_BUDGET_US,
    );
    cost.target(
        &format!("hybrid: index build at {size} cards, vectors included"),
        "≤ 2 s",
        show(hybrid_build),
        build_ms <= BUILD_BUDGET_MS,
    );
    cost.line(format!(
        "| daemon VmRSS (peak VmHWM) | {} ({}) | {} ({}) | {} (allowed {}: the model's files + the vectors' allowance) |",
        show_bytes(without.rss),
        show_bytes(without.hwm),
        show_bytes(with.rss),
        show_bytes(with.hwm),
        show_bytes(grown),
        show_bytes(allowed_rss),
    ));
    cost.line(format!(
        "\nDaemon VmRSS, round by round: without the model {rss_without}; with it {rss_with}."
    ));
    cost.target(
        "hybrid: daemon VmRSS growth with the model, one workspace",
        "≤ model files + 4 B × dimension × cards",
        format!("{} of {}", show_bytes(grown), show_bytes(allowed_rss)),
        grown <= allowed_rss,
    );
    cost.target(
        "hybrid: memory per loaded generation, beyond the model",
        "≤ 4 B × dimension × cards",
        format!("{} of {}", show_bytes(vectors), show_bytes(allowed_vectors)),
        vectors <= allowed_vectors,
    );
    cost.figure(format!("hybrid.per_task_us.{size}"), task_us, true);
    cost.figure(format!("hybrid.index_build_ms.{size}"), build_ms, true);
    Ok(vec![recall, cost])
}
