//! The per-task cost of an organisation layer: a workspace's tasks selected over its own
//! cards alone, and over its cards composed with an inherited workspace's
//! ([`mop_cards::compose`], as mopd builds the generation), alternating in one run with
//! the same synthetic tasks, so both sides see the same machine.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use mop_bench::{Section, show, summarize, synth};
use mop_cards::{Catalog, Rules, compose, render_memory_md};
use mop_search::{SearchIndex, select_for_task};

/// What to run.
pub struct Options {
    /// The workspace's own cards.
    pub cards: usize,
    /// The inherited workspace's cards.
    pub inherited: usize,
    /// Distinct synthetic tasks.
    pub tasks: usize,
    /// Rounds of every task on each side (after one warm-up pass).
    pub rounds: usize,
    /// Seed of the synthetic data.
    pub seed: u64,
}

struct Side {
    catalog: Catalog,
    index: SearchIndex,
    _dir: tempfile::TempDir,
    samples: Vec<Duration>,
    selected: usize,
}

/// Runs the benchmark.
pub fn run(o: &Options) -> Result<Section> {
    let now = "2026-11-29T00:00:00Z".parse()?;
    let rules = Rules::default();
    eprintln!("[inherit] {} own cards, {} inherited", o.cards, o.inherited);
    let own = synth::workspace(o.seed, o.cards, now);
    let org = synth::workspace(o.seed ^ 0x0a9_0a9, o.inherited, now);
    let composed = compose(own.manifest.clone(), &[("org", &org.manifest)])?;
    let by_id: HashMap<_, _> = own
        .cards
        .iter()
        .chain(&org.cards)
        .map(|c| (c.summary.id, c))
        .collect();
    let mut sides = Vec::new();
    for manifest in [own.manifest.clone(), composed] {
        let catalog = Catalog::new(manifest, &rules)?;
        let dir = tempfile::tempdir()?;
        crate::timed_build(&catalog, &by_id, dir.path(), None)?;
        let index = SearchIndex::open(dir.path())?;
        sides.push(Side {
            catalog,
            index,
            _dir: dir,
            samples: Vec::with_capacity(o.tasks * o.rounds),
            selected: 0,
        });
    }
    let tasks = synth::tasks(o.seed, o.tasks, o.cards);
    for side in &mut sides {
        for t in &tasks {
            let sel = select_for_task(&side.catalog, &side.index, t, &rules)?;
            side.selected += sel.selected.total();
            std::hint::black_box(render_memory_md(&side.catalog, &sel, t, &rules.config));
        }
    }
    for _ in 0..o.rounds {
        for t in &tasks {
            // Alternating task by task: neither side runs on a quieter machine.
            for side in &mut sides {
                let started = Instant::now();
                let sel = select_for_task(&side.catalog, &side.index, t, &rules)?;
                let md = render_memory_md(&side.catalog, &sel, t, &rules.config);
                side.samples.push(started.elapsed());
                std::hint::black_box(md);
            }
        }
    }
    let [base, with] = &mut sides[..] else {
        unreachable!("two sides")
    };
    let (b, w) = (summarize(&mut base.samples), summarize(&mut with.samples));
    let mut sec =
        Section::new("Organisation layer: per-task selection with an inherited workspace");
    sec.line(format!(
        "The same {} synthetic tasks × {} rounds, alternating, over a workspace's {} own cards \
         alone and composed with an inherited workspace's {} cards (what mopd builds for a \
         workspace that inherits `org`): selection + ranking + MEMORY.md rendering against \
         each side's index, as in the card engine benchmark.\n",
        tasks.len(),
        o.rounds,
        o.cards,
        o.inherited
    ));
    sec.line("| cards | selected per task (mean) | per task median | per task p99 |");
    sec.line("|---|---:|---:|---:|");
    for (label, side, s) in [
        (format!("{} own", o.cards), &*base, &b),
        (
            format!("{} own + {} inherited", o.cards, o.inherited),
            &*with,
            &w,
        ),
    ] {
        sec.line(format!(
            "| {label} | {:.1} | {} | {} |",
            side.selected as f64 / tasks.len() as f64,
            show(s.median),
            show(s.p99)
        ));
    }
    let ratio = w.median.as_secs_f64() / b.median.as_secs_f64().max(1e-9);
    sec.line(format!(
        "\nWith the inherited workspace: ×{ratio:.2} the per-task median of the own cards alone."
    ));
    sec.target(
        &format!(
            "per-task select + rank + render at {} cards with {} inherited",
            o.cards, o.inherited
        ),
        "≤ 1 ms",
        show(w.median),
        w.median <= Duration::from_millis(1),
    );
    let key = format!("{}+{}", o.cards, o.inherited);
    sec.figure(
        format!("inherit.per_task_median_us.{key}"),
        w.median.as_secs_f64() * 1e6,
        true,
    );
    Ok(sec)
}
