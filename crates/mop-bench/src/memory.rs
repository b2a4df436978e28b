//! `mop-bench memory`: the daemon's resident memory after syncing workspaces and serving
//! prepares, and how it grows with the number of cards.

use std::time::Duration;

use anyhow::{Result, bail};
use mop_bench::{Section, show_bytes, synth};
use mop_testkit::procs::{Daemon, DaemonOptions, Server};

pub struct Options {
    /// Workspaces in the main measurement.
    pub workspaces: usize,
    /// Cards per workspace in the main measurement.
    pub cards: usize,
    /// Prepares served (each released) before reading the memory.
    pub prepares: usize,
    /// Single-workspace sizes for the growth table.
    pub growth: Vec<usize>,
    /// Workspace counts (of `cards` each) for the growth table.
    pub workspace_growth: Vec<usize>,
    pub seed: u64,
}

const TARGET: u64 = 64 * 1024 * 1024;
const PEAK_TARGET: u64 = 128 * 1024 * 1024;

pub struct Reading {
    pub workspaces: usize,
    pub cards: usize,
    pub mem: mop_bench::Memory,
}

fn measure(o: &Options, workspaces: usize, cards: usize) -> Result<Reading> {
    measure_with(o, workspaces, cards, None).map(|(r, _)| r)
}

/// The daemon's memory after syncing `workspaces` × `cards` and serving the prepares, with
/// `model` as its embedding model if given. Also returns how many of the workspaces'
/// current generations hold card vectors.
pub fn measure_with(
    o: &Options,
    workspaces: usize,
    cards: usize,
    model: Option<&std::path::Path>,
) -> Result<(Reading, usize)> {
    let tmp = tempfile::tempdir()?;
    let server = Server::start_with("[sync]\ncounter_publish_secs = 3600\n");
    let names: Vec<String> = (1..=workspaces).map(|i| format!("ws{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        // A different seed per workspace: no two share their cards.
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir)?;
        let (_, cards_dir) = synth::workspace_in(o.seed + i as u64, cards, &dir)?;
        let out = server.import(&cards_dir, name);
        if !out.status.success() {
            bail!("import failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    eprintln!("memory: {workspaces} × {cards} cards: syncing");
    let mut extra = format!(
        "[pool]\nmax_bytes = 17179869184\nverify_interval_secs = 0\n[tasks]\nprofile_dirs = [\"{}\"]\n",
        mop_testkit::repo_root().join("bwrap-profiles").display()
    );
    if let Some(m) = model {
        extra += &format!("[selection]\nembedding_model = \"{}\"\n", m.display());
    }
    let d = Daemon::start(
        &server,
        DaemonOptions {
            workspaces: &refs,
            extra: &extra,
            ..Default::default()
        },
    );
    d.wait_synced_within(Duration::from_secs(1800));
    let tasks = synth::tasks(o.seed, o.prepares, cards);
    eprintln!("memory: {} prepares", o.prepares);
    for (i, t) in tasks.iter().enumerate() {
        let ws = &names[i % names.len()];
        crate::run::prepare_and_release(&d.socket(), ws, &format!("mem-{i}"), t)?;
    }
    // Let the release work (view removal off the async workers) settle.
    std::thread::sleep(Duration::from_millis(500));
    let pid = d.pid().expect("running daemon");
    let mem = mop_bench::memory(pid)?;
    eprintln!("memory: {mem:?}");
    let with_vectors = names
        .iter()
        .filter(|ws| {
            let pool = d.pool(ws);
            std::fs::read_link(pool.join("current"))
                .ok()
                .and_then(|g| mop_embed::stored_fingerprint(&pool.join(g).join("index")))
                .is_some()
        })
        .count();
    Ok((
        Reading {
            workspaces,
            cards,
            mem,
        },
        with_vectors,
    ))
}

pub fn run(o: &Options) -> Result<Section> {
    let main = measure(o, o.workspaces, o.cards)?.mem;
    // Rows of `cards` cards per workspace by workspace count (the main one among them),
    // then one workspace of other sizes.
    let mut rows = vec![Reading {
        workspaces: o.workspaces,
        cards: o.cards,
        mem: main,
    }];
    for &n in &o.workspace_growth {
        rows.push(measure(o, n, o.cards)?);
    }
    rows.sort_by_key(|r| r.workspaces);
    for &n in &o.growth {
        rows.push(measure(o, 1, n)?);
    }
    let mut sec = Section::new("Daemon memory");
    sec.line(format!(
        "`VmRSS` and `VmHWM` of `mopd run` (from `/proc/<pid>/status`) after the first sync of \
         every workspace (distinct synthetic cards each) and {} `mop prepare` + `mop release` \
         pairs spread over them. The other rows repeat this with more or fewer workspaces, \
         then with one workspace of other sizes.\n",
        o.prepares
    ));
    sec.line(
        "| workspaces × cards | VmRSS | of which RssAnon (heap) | of which RssFile (mapped files) | VmHWM (peak) |\n|---|---:|---:|---:|---:|",
    );
    for r in &rows {
        sec.line(format!(
            "| {} × {} | {} | {} | {} | {} |",
            r.workspaces,
            r.cards,
            show_bytes(r.mem.rss),
            show_bytes(r.mem.anon),
            show_bytes(r.mem.file),
            show_bytes(r.mem.hwm)
        ));
    }
    let key = format!("{}x{}x{}", o.workspaces, o.cards, o.prepares);
    sec.figure(
        format!("memory.rss_mib.{key}"),
        main.rss as f64 / (1 << 20) as f64,
        true,
    );
    sec.figure(
        format!("memory.hwm_mib.{key}"),
        main.hwm as f64 / (1 << 20) as f64,
        true,
    );
    sec.target(
        &format!(
            "daemon VmRSS after {} × {} cards and {} prepares",
            o.workspaces, o.cards, o.prepares
        ),
        "≤ 64 MiB",
        format!("{} (peak {})", show_bytes(main.rss), show_bytes(main.hwm)),
        main.rss <= TARGET,
    );
    sec.target(
        &format!(
            "daemon peak VmHWM over {} × {} cards and {} prepares",
            o.workspaces, o.cards, o.prepares
        ),
        "≤ 128 MiB",
        show_bytes(main.hwm),
        main.hwm <= PEAK_TARGET,
    );
    Ok(sec)
}
