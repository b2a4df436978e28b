//! Prepares racing generation swaps: 16 runners (the unprivileged `moprunner`, each a real
//! `mop prepare` / `mop release` process) loop while the server's workspace changes and the
//! daemon publishes a new generation 200 times (`MOP_STRESS_SWAPS` overrides the count).
//!
//! Every view handed out is checked while its task lives: its generation still exists (a
//! pinned generation is never collected), every card file in the view is byte-identical to
//! that generation's file, and the card edited by each swap carries exactly the edit of the
//! revision the plan names (no torn view mixes two generations). Three tasks stay alive
//! through all swaps; once released, their generations are collected (the control).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mop_testkit::procs::{Daemon, DaemonOptions, Server, as_runner, run, runner_user};
use mop_testkit::{card_files, example_cards_dir, load_cards};
use serde_json::Value;

const WS: &str = "acme";
const RUNNERS: usize = 16;
/// A workspace-wide fact every task of this test mounts (L0).
const EDITED: &str = "Production change windows";

struct Shared {
    socket: PathBuf,
    pool: PathBuf,
    /// Path of the edited card inside a tree or view.
    edited_path: String,
    /// Server revision → the swap number whose edit it carries (0: the original text).
    revisions: Mutex<HashMap<u64, u32>>,
}

fn mop(args: &[&str]) -> std::process::Output {
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    run(&mut as_runner(&a))
}

impl Shared {
    fn prepare(&self, task: &str) -> Value {
        let out = mop(&[
            "prepare",
            "--socket",
            self.socket.to_str().unwrap(),
            "--workspace",
            WS,
            "--task-id",
            task,
            "--user",
            "alice",
            "--asset",
            "db-prod-01",
            "--title",
            "Nightly ETL fails with ORA-01555",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "prepare {task}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn release(&self, task: &str) {
        let out = mop(&[
            "release",
            "--socket",
            self.socket.to_str().unwrap(),
            "--task-id",
            task,
        ]);
        assert!(
            out.status.success(),
            "release {task}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The checks of one live task's view; returns how many card files it compared.
    fn check_view(&self, plan: &Value) -> usize {
        let task = plan["task_id"].as_str().unwrap();
        let generation = plan["generation"].as_str().unwrap();
        let manifest = self
            .pool
            .join("gens")
            .join(generation)
            .join("manifest.json");
        let manifest: mop_cards::Manifest = serde_json::from_slice(
            &std::fs::read(&manifest).unwrap_or_else(|e| {
                panic!("{task}: generation {generation} is pinned by a live task but was collected: {e}")
            }),
        )
        .unwrap();
        // Each card's file is its object, found by the pinned manifest's hash.
        let objects: HashMap<String, PathBuf> = manifest
            .cards
            .iter()
            .map(|c| {
                let rel = mop_cards::card_path(c.summary.card_type, &c.summary.id);
                let object = self
                    .pool
                    .join("objects")
                    .join(&c.sha256[..2])
                    .join(&c.sha256);
                (rel, object)
            })
            .collect();
        let view = PathBuf::from(plan["view_dir"].as_str().unwrap());
        let mut compared = 0;
        for file in card_files(&view) {
            let rel = file.strip_prefix(&view).unwrap();
            if rel == Path::new("MEMORY.md") {
                continue;
            }
            let ours = std::fs::read(&file).unwrap();
            let object = objects
                .get(rel.to_str().unwrap())
                .unwrap_or_else(|| panic!("{task}: {} not in {generation}", rel.display()));
            let theirs = std::fs::read(object).unwrap_or_else(|e| {
                panic!(
                    "{task}: {} of {generation} was collected: {e}",
                    rel.display()
                )
            });
            assert!(
                ours == theirs,
                "{task}: {} differs from {generation}",
                rel.display()
            );
            compared += 1;
        }
        assert_eq!(compared, plan["cards"].as_array().unwrap().len(), "{task}");
        let revision = plan["revision"].as_u64().unwrap();
        let swap = self.revisions.lock().unwrap()[&revision];
        let edited = std::fs::read_to_string(view.join(&self.edited_path))
            .unwrap_or_else(|e| panic!("{task}: the edited card is not mounted: {e}"));
        let last = edited.lines().rev().find(|l| l.starts_with("swap "));
        let expected = (swap > 0).then(|| format!("swap {swap}"));
        assert_eq!(
            last.map(str::to_owned),
            expected,
            "{task}: revision {revision} must carry exactly swap {swap}'s edit"
        );
        let md = std::fs::read_to_string(plan["memory_md"].as_str().unwrap()).unwrap();
        assert!(md.contains(&format!("(revision {revision},")), "{task}");
        compared
    }
}

#[test]
fn sixteen_runners_racing_two_hundred_swaps_never_see_a_torn_view() {
    if runner_user().is_none() {
        return;
    }
    let swaps: u32 = std::env::var("MOP_STRESS_SWAPS")
        .ok()
        .map(|v| v.parse().expect("MOP_STRESS_SWAPS is a number"))
        .unwrap_or(200);
    let server = Server::start();
    let admin = server.token("admin", &[WS]);
    let node = server.token("node", &[WS]);
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let extra = mop_testkit::profiles_config(&[]);
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            extra: &extra,
            ..Default::default()
        },
    );
    daemon.wait_synced();

    let cards = load_cards(
        &example_cards_dir(),
        "2026-11-29T00:00:00Z".parse().unwrap(),
    );
    let edited_id = cards.id_titled(EDITED);
    let http = mop_testkit::http();
    let first_revision = server.revision(WS, &node);
    let shared = Arc::new(Shared {
        socket: daemon.socket(),
        pool: daemon.pool(WS),
        edited_path: cards.cards[&edited_id].path(),
        revisions: Mutex::new(HashMap::from([(first_revision, 0)])),
    });

    // Three tasks live through every swap.
    let long: Vec<Value> = (0..3)
        .map(|i| shared.prepare(&format!("long-{i}")))
        .collect();

    let done = Arc::new(AtomicBool::new(false));
    let views = Arc::new(AtomicUsize::new(0));
    let files = Arc::new(AtomicUsize::new(0));
    let runners: Vec<_> = (0..RUNNERS)
        .map(|r| {
            let (shared, done, views, files) =
                (shared.clone(), done.clone(), views.clone(), files.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !done.load(Ordering::Relaxed) {
                    let task = format!("r{r}-{n}");
                    let plan = shared.prepare(&task);
                    files.fetch_add(shared.check_view(&plan), Ordering::Relaxed);
                    // Hold the task a little while swaps go on, then check it again.
                    std::thread::sleep(Duration::from_millis(fastrand::u64(0..40)));
                    shared.check_view(&plan);
                    shared.release(&task);
                    views.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();

    let url = format!("{}/v1/workspaces/{WS}/cards/{edited_id}", server.url);
    let original = http
        .get(&url)
        .bearer_auth(&admin)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let started = Instant::now();
    for swap in 1..=swaps {
        let r = http
            .put(&url)
            .bearer_auth(&admin)
            .body(format!("{original}\nswap {swap}\n"))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().unwrap());
        let change: Value = r.json().unwrap();
        // Recorded before the daemon can see it: it syncs only when told to here.
        shared
            .revisions
            .lock()
            .unwrap()
            .insert(change["revision"].as_u64().unwrap(), swap);
        let out = daemon.sync(WS);
        assert!(
            out.starts_with("acme: ") && !out.contains("fail") && !out.contains("not modified"),
            "swap {swap}: {out}"
        );
    }
    let swap_time = started.elapsed();
    done.store(true, Ordering::Relaxed);
    for r in runners {
        r.join()
            .expect("a runner thread failed (its panic is above)");
    }
    let views = views.load(Ordering::Relaxed);
    let files = files.load(Ordering::Relaxed);
    eprintln!(
        "{swaps} swaps in {swap_time:?}; {views} views by {RUNNERS} runners, {files} card files compared"
    );
    assert!(
        views >= RUNNERS * 2,
        "the runners prepared too few views to mean anything: {views}"
    );

    // The long-lived tasks' generations survived every swap, and their views are intact.
    let pinned: Vec<String> = long
        .iter()
        .map(|p| p["generation"].as_str().unwrap().to_owned())
        .collect();
    for plan in &long {
        shared.check_view(plan);
    }
    // The control: once released, nothing pins them, and the next publish collects them.
    for i in 0..3 {
        shared.release(&format!("long-{i}"));
    }
    let r = http
        .put(&url)
        .bearer_auth(&admin)
        .body(format!("{original}\nswap final\n"))
        .send()
        .unwrap();
    assert!(r.status().is_success());
    daemon.sync(WS);
    let left: Vec<String> = std::fs::read_dir(shared.pool.join("gens"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for g in &pinned {
        assert!(
            !left.contains(g),
            "{g} was released and should be collected: {left:?}"
        );
    }
    assert!(left.len() <= 2, "unpinned generations pile up: {left:?}");
}
