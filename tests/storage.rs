//! The daemon's storage failing under it: a full disk while a generation is written (a
//! small tmpfs in the daemon's own mount namespace), the cache directory deleted, and the
//! cache remounted read-only (root ignores permissions, not a read-only mount). In each
//! case the last good generation keeps serving or the daemon says plainly why it cannot,
//! `mopd status` names the cause, and the daemon recovers by itself once the disk does.
//! Also: kill -9 of the daemon in the middle of prepares leaves every view it handed out
//! valid, and the restarted daemon serves and cleans up.
//!
//! The daemon runs in a mount namespace of its own (`unshare -m`), so the test reads its
//! files through `/proc/<pid>/root`, which resolves paths in that namespace.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mop_cards::Manifest;
use mop_testkit::example_cards_dir;
use mop_testkit::procs::{Daemon, DaemonOptions, Server, run};
use serde_json::Value;

const WS: &str = "acme";

fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true"),
        "CI=true: the storage tests need root (mount namespaces, tmpfs)"
    );
    eprintln!("skipping: the storage tests need root");
    false
}

fn server() -> (Server, String) {
    let server = Server::start();
    let admin = server.token("admin", &[WS]);
    assert!(server.import(&example_cards_dir(), WS).status.success());
    (server, admin)
}

/// A path of the daemon's, as the daemon sees it (inside its mount namespace).
fn inside(d: &Daemon, path: &Path) -> PathBuf {
    let pid = d.pid().expect("daemon running");
    PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap())
}

/// Runs `script` with sh inside the daemon's mount namespace.
fn in_daemon_ns(d: &Daemon, script: &str) -> std::process::Output {
    let pid = d.pid().unwrap().to_string();
    let out = run(Command::new("nsenter").args(["-t", &pid, "-m", "--", "sh", "-c", script]));
    assert!(out.status.success(), "{script}: {out:?}");
    out
}

/// The current generation of the daemon's pool is complete: every card hashes to its
/// manifest entry, the index is there, and `mopd verify` (the daemon's own check of the
/// current and pinned generations) finds nothing wrong. Returns its name and manifest.
fn check_current(d: &Daemon) -> (String, Manifest) {
    let out = run(&mut d.cli(&["verify", "--json"]));
    assert!(out.status.success(), "mopd verify: {out:?}");
    let (name, dir, manifest) = mop_testkit::check_current_files(&inside(d, &d.pool(WS)));
    // Opening the index through /proc/<pid>/root is not possible (the directory is
    // canonicalized out of the namespace); its metadata must be there and sound.
    let meta = std::fs::read(dir.join("index/mop-search.json")).expect("index metadata");
    serde_json::from_slice::<Value>(&meta).expect("index metadata is JSON");
    (name, manifest)
}

fn workspace_status(d: &Daemon) -> Value {
    let (_, v) = d.status();
    v["workspaces"][0].clone()
}

/// `mop prepare` as root (the runner's uid does not matter here) for a TTL task.
fn prepare(d: &Daemon, task: &str) -> std::process::Output {
    run(Command::new(mop_testkit::procs::bin("mop")).args([
        "prepare",
        "--socket",
        d.socket().to_str().unwrap(),
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
    ]))
}

/// `unshare -m` with `mount_cmd` applied to the daemon's cache directory first (`$c`).
fn own_mount_ns(mount_cmd: &str) -> Vec<String> {
    // The wrapped command line is `mopd run --config <dir>/mopd.toml`: $4 is the config,
    // and the cache directory sits beside it.
    let script =
        format!("c=\"$(dirname \"$4\")/cache\"; mkdir -p \"$c\" && {mount_cmd} && exec \"$@\"");
    [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        &script,
        "sh",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn start_in_ns(server: &Server, extra: &str, wrap: &[String]) -> Daemon {
    let wrap: Vec<&str> = wrap.iter().map(String::as_str).collect();
    let d = Daemon::start(
        server,
        DaemonOptions {
            extra,
            wrap: &wrap,
            ..Default::default()
        },
    );
    d.wait_synced();
    d
}

#[test]
fn a_full_disk_keeps_the_last_generation_and_status_says_why() {
    if !require_root() {
        return;
    }
    let (server, admin) = server();
    let d = start_in_ns(
        &server,
        &mop_testkit::profiles_config(&[]),
        &own_mount_ns("mount -t tmpfs -o size=4m,mode=0750 tmpfs \"$c\""),
    );
    let pool = d.pool(WS);
    let (before, m0) = check_current(&d);
    // The namespace is the daemon's own: outside it the cache directory is empty.
    assert!(!pool.join("current").exists());

    // Fill the disk but for 160 KiB, then change eight cards by 60 KB each: the next
    // generation needs more room than there is.
    let cache = d.dir.path().join("cache");
    let filler = cache.join("filler");
    in_daemon_ns(
        &d,
        &format!(
            "dd if=/dev/zero of={0} bs=4k 2>/dev/null; truncate -s -160K {0}",
            filler.display()
        ),
    );
    let mut rev = 0;
    for e in &m0.cards[..8] {
        rev = server.edit_card(WS, &admin, &e.summary.id.to_string(), &"x".repeat(60_000));
    }
    let out = d.sync(WS);
    assert!(out.contains("sync failed"), "{out}");
    let w = workspace_status(&d);
    assert!(
        w.to_string().contains("No space left on device"),
        "status names the cause: {w:#}"
    );
    assert_eq!(
        (
            w["last_error"]["kind"].as_str(),
            w["stats"]["failures"].as_u64()
        ),
        (Some("local"), Some(1)),
        "{w:#}"
    );
    let (code, v) = d.status();
    assert_eq!(code, 1, "degraded");
    assert!(
        v.to_string().contains("free space on the cache filesystem"),
        "status says what to do: {v:#}"
    );
    // The last good generation is current, complete, and still serves prepares.
    let (still, _) = check_current(&d);
    assert_eq!(still, before);
    assert_ne!(w["revision"].as_u64(), Some(rev));
    let out = prepare(&d, "on-a-full-disk");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing half-written is left behind besides the current generation.
    let gens: Vec<_> = std::fs::read_dir(inside(&d, &pool.join("gens")))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(gens.len(), 1, "{gens:?}");
    assert_eq!(
        std::fs::read_dir(inside(&d, &pool.join("tmp")))
            .unwrap()
            .count(),
        0,
        "no partial downloads left"
    );

    // With no room at all a prepare fails, says why, and leaves no task behind.
    in_daemon_ns(
        &d,
        &format!(
            "dd if=/dev/zero of={}.2 bs=4k 2>/dev/null; true",
            filler.display()
        ),
    );
    let out = prepare(&d, "no-room");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("No space left on device"),
        "{stderr}"
    );
    assert!(!inside(&d, &cache.join("tasks/no-room")).exists());
    let (_, status) = d.status();
    let tasks: Vec<&str> = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["on-a-full-disk"]);

    // Room again: the next sync succeeds by itself.
    in_daemon_ns(&d, &format!("rm -f {0} {0}.2", filler.display()));
    let out = d.sync(WS);
    assert!(!out.contains("fail"), "{out}");
    let (after, m1) = check_current(&d);
    assert_ne!(after, before);
    assert_eq!(m1.revision, rev);
    let w = workspace_status(&d);
    assert_eq!(w["revision"].as_u64(), Some(rev), "{w:#}");
}

fn prepared_ok(d: &Daemon, task: &str) -> Value {
    let out = prepare(d, task);
    assert!(
        out.status.success(),
        "prepare {task}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every card file of a prepared view still parses and matches its plan entry's id.
fn check_view(view: &Path, plan: &Value) {
    for c in plan["cards"].as_array().unwrap() {
        let path = view.join(c["path"].as_str().unwrap());
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let card = mop_cards::parse_card(&bytes).unwrap();
        assert_eq!(card.summary.id.to_string(), c["id"].as_str().unwrap());
    }
}

#[test]
fn a_read_only_cache_refuses_writes_clearly_and_recovers_when_remounted() {
    if !require_root() {
        return;
    }
    let (server, admin) = server();
    let d = start_in_ns(
        &server,
        &mop_testkit::profiles_config(&[]),
        &own_mount_ns("mount --bind \"$c\" \"$c\""),
    );
    let cache = d.dir.path().join("cache");
    let (before, m0) = check_current(&d);
    let early = prepared_ok(&d, "before-ro");

    in_daemon_ns(&d, &format!("mount -o remount,bind,ro {}", cache.display()));
    let rev = server.edit_card(WS, &admin, &m0.cards[0].summary.id.to_string(), "read-only");
    let out = d.sync(WS);
    assert!(out.contains("sync failed"), "{out}");
    let w = workspace_status(&d);
    assert!(w.to_string().contains("Read-only file system"), "{w:#}");
    let (_, v) = d.status();
    assert!(
        v.to_string()
            .contains("remount the cache filesystem read-write"),
        "{v:#}"
    );
    assert_eq!(
        check_current(&d).0,
        before,
        "the last good generation is current"
    );
    // A new view cannot be written: the prepare says why and leaves no task.
    let out = prepare(&d, "while-ro");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("Read-only file system"),
        "{stderr}"
    );
    // A view handed out before is intact.
    check_view(
        &inside(&d, Path::new(early["view_dir"].as_str().unwrap())),
        &early,
    );

    in_daemon_ns(&d, &format!("mount -o remount,bind,rw {}", cache.display()));
    let out = d.sync(WS);
    assert!(!out.contains("fail"), "{out}");
    assert_eq!(check_current(&d).1.revision, rev);
    let later = prepared_ok(&d, "after-ro");
    assert_eq!(later["revision"].as_u64(), Some(rev));
    let (_, status) = d.status();
    let tasks: Vec<&str> = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["after-ro", "before-ro"]);
}

#[test]
fn a_deleted_cache_is_rebuilt_and_prepares_resume() {
    if !require_root() {
        return;
    }
    let (server, _admin) = server();
    let extra = mop_testkit::profiles_config(&[]);
    let d = Daemon::start(
        &server,
        DaemonOptions {
            extra: &extra,
            ..Default::default()
        },
    );
    d.wait_synced();
    let early = prepared_ok(&d, "before-rm");
    let early_view = PathBuf::from(early["view_dir"].as_str().unwrap());
    let cache = d.dir.path().join("cache");
    std::fs::remove_dir_all(&cache).unwrap();
    // Until the next sync a prepare says what happened and what to do.
    let out = prepare(&d, "in-between");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("was the cache directory deleted?")
            && stderr.contains("mopd sync acme"),
        "{stderr}"
    );

    // The server has not changed, yet the pool is gone: the next sync must notice and
    // fetch everything again instead of answering "not modified".
    let out = d.sync(WS);
    assert!(
        !out.contains("fail") && !out.contains("not modified"),
        "{out}"
    );
    let pool = d.pool(WS);
    let link = std::fs::read_link(pool.join("current")).expect("a new current generation");
    assert!(pool.join(link).join("manifest.json").is_file());
    let later = prepared_ok(&d, "after-rm");
    check_view(Path::new(later["view_dir"].as_str().unwrap()), &later);
    // The task whose view was deleted with the cache is still listed and can be released.
    assert!(!early_view.exists());
    let out = run(Command::new(mop_testkit::procs::bin("mop")).args([
        "release",
        "--socket",
        d.socket().to_str().unwrap(),
        "--task-id",
        "before-rm",
    ]));
    assert!(out.status.success(), "{out:?}");
    let w = workspace_status(&d);
    assert!(w["generation"].is_string(), "{w:#}");
    assert!(d.log().contains("pool"), "the daemon logs what it found");
}

#[test]
fn kill_9_during_prepares_leaves_every_handed_out_view_valid() {
    if !require_root() {
        return;
    }
    let (server, _admin) = server();
    let extra = mop_testkit::profiles_config(&[]);
    let mut d = Daemon::start(
        &server,
        DaemonOptions {
            extra: &extra,
            ..Default::default()
        },
    );
    d.wait_synced();
    let socket = d.socket();
    let stop = Arc::new(AtomicBool::new(false));
    let handed_out = Arc::new(Mutex::new(Vec::<Value>::new()));
    let refused = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let (socket, stop, handed_out, refused) = (
                socket.clone(),
                stop.clone(),
                handed_out.clone(),
                refused.clone(),
            );
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let task = format!("k{w}-{n}");
                    n += 1;
                    let out = run(Command::new(mop_testkit::procs::bin("mop")).args([
                        "prepare",
                        "--socket",
                        socket.to_str().unwrap(),
                        "--workspace",
                        WS,
                        "--task-id",
                        &task,
                        "--user",
                        "alice",
                        "--title",
                        "Nightly ETL fails with ORA-01555",
                        "--json",
                    ]));
                    if out.status.success() {
                        handed_out
                            .lock()
                            .unwrap()
                            .push(serde_json::from_slice(&out.stdout).unwrap());
                    } else {
                        refused.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect();
    let kills = 8;
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(fastrand::u64(100..400)));
        d.kill9();
        std::thread::sleep(Duration::from_millis(50));
        d.spawn();
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    // One more crash with everything at rest, then the daemon that stays up.
    d.kill9();
    d.spawn();
    let handed_out = handed_out.lock().unwrap();
    let refused = refused.load(Ordering::Relaxed);
    eprintln!(
        "{kills} kill -9s: {} prepares answered, {refused} refused or cut off",
        handed_out.len()
    );
    assert!(
        handed_out.len() > kills,
        "too few prepares to mean anything"
    );

    // Every view handed out is intact, and its lease survived every crash.
    let (_, status) = d.status();
    let listed: std::collections::BTreeSet<String> = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap().to_owned())
        .collect();
    for plan in handed_out.iter() {
        let task = plan["task_id"].as_str().unwrap();
        check_view(Path::new(plan["view_dir"].as_str().unwrap()), plan);
        assert!(
            Path::new(plan["memory_md"].as_str().unwrap()).is_file(),
            "{task}"
        );
        assert!(
            listed.contains(task),
            "{task} was handed out but its lease is gone"
        );
    }
    // Prepares cut off by a crash left nothing behind: the task directories are exactly
    // the listed tasks', and the pool verifies.
    let dirs: std::collections::BTreeSet<String> =
        std::fs::read_dir(d.dir.path().join("cache/tasks"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
    assert_eq!(
        dirs, listed,
        "task directories without a lease, or the reverse"
    );
    let sockets = std::fs::read_dir(d.dir.path().join("run/t"))
        .unwrap()
        .count();
    assert_eq!(
        sockets,
        listed.len(),
        "agent socket directories without a lease, or the reverse"
    );
    check_current(&d);
}
