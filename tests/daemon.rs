//! mopd end to end: the real mop-server and mopd binaries on loopback with temporary
//! directories.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mop_cards::Manifest;
use mop_testkit::example_cards_dir;
use mop_testkit::procs::{Daemon, DaemonOptions, Server, run};
use serde_json::Value;

const WS: &str = "acme";

/// A server with the example workspace and an admin token.
fn server() -> (Server, String) {
    let server = Server::start();
    let admin = server.token("admin", &[WS]);
    let out = server.import(&example_cards_dir(), WS);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (server, admin)
}

/// Checks that `current` is a complete generation: every card file hashes to its manifest
/// entry, and the index opens. Returns the manifest.
fn check_current(pool: &Path) -> Manifest {
    let (_, _, manifest) = mop_testkit::check_current_with(pool, |dir, manifest| {
        let index = mop_search::SearchIndex::open(&dir.join("index"))
            .map_err(|e| format!("index of {}: {e}", dir.display()))?;
        let (docs, cards) = (index.num_docs(), manifest.cards.len() as u64);
        if docs != cards {
            return Err(format!(
                "index of {}: {docs} documents for {cards} cards",
                dir.display()
            ));
        }
        Ok(())
    });
    manifest
}

fn ws_status(v: &Value) -> &Value {
    &v["workspaces"][0]
}

fn admin_post(server: &Server, token: &str, path: &str, body: Option<Value>) {
    let mut req = mop_testkit::http()
        .post(format!("{}/v1/workspaces/{WS}{path}", server.url))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.text().unwrap());
}

fn admin_edit(server: &Server, token: &str, id: &str, extra: &str) {
    server.edit_card(WS, token, id, extra);
}

fn live_ids(m: &Manifest) -> Vec<String> {
    m.cards.iter().map(|c| c.summary.id.to_string()).collect()
}

#[test]
fn first_sync_unchanged_poll_and_incremental_change() {
    let (server, admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    // The first sync runs as the daemon starts.
    d.wait_synced();
    let (code, v) = d.status();
    assert_eq!(code, 0, "{v:#}");
    let w = ws_status(&v);
    let m = check_current(&d.pool(WS));
    assert_eq!(w["cards"], m.cards.len());
    assert_eq!(
        m.cards.len(),
        42,
        "44 example cards minus one disabled and one superseded"
    );
    assert_eq!(w["stats"]["objects_fetched"], 42);
    let bytes_after_first = w["stats"]["object_bytes"].as_u64().unwrap();

    // Permissions: directories 0750, objects 0440, socket 0660.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for dir in ["cache", "state", "run"] {
        assert_eq!(mode(&d.dir.path().join(dir)), 0o750, "{dir}");
    }
    let obj = &m.cards[0].sha256;
    assert_eq!(
        mode(&d.pool(WS).join("objects").join(&obj[..2]).join(obj)),
        0o440
    );
    assert_eq!(mode(&d.socket()), 0o660);

    // Unchanged: a 304, and no object bytes move.
    assert_eq!(d.sync(WS).trim(), format!("{WS}: not modified"));
    let (_, v) = d.status();
    let w = ws_status(&v);
    assert_eq!(w["last_sync"]["http_status"], 304);
    assert_eq!(w["stats"]["not_modified"], 1);
    assert_eq!(w["stats"]["object_bytes"], bytes_after_first);

    // Two cards change: exactly two objects are fetched, through a delta.
    let (a, b) = (
        &m.cards[0].summary.id.to_string(),
        &m.cards[1].summary.id.to_string(),
    );
    admin_edit(&server, &admin, a, "Edited once.");
    admin_edit(&server, &admin, b, "Edited too.");
    assert_eq!(d.sync(WS).trim(), format!("{WS}: modified"));
    let (_, v) = d.status();
    assert_eq!(ws_status(&v)["stats"]["objects_fetched"], 44);
    let m2 = check_current(&d.pool(WS));
    assert_eq!(m2.revision, m.revision + 2);
    assert_eq!(live_ids(&m2), live_ids(&m));
    // Old generations and unreferenced objects are collected.
    assert_eq!(
        std::fs::read_dir(d.pool(WS).join("gens")).unwrap().count(),
        1
    );
    let objects: usize = std::fs::read_dir(d.pool(WS).join("objects"))
        .unwrap()
        .map(|f| std::fs::read_dir(f.unwrap().path()).unwrap().count())
        .sum();
    assert_eq!(objects, 42);
}

#[test]
fn superseded_and_disabled_cards_leave_the_next_generation() {
    let (server, admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    d.sync(WS);
    let m = check_current(&d.pool(WS));
    let (a, b, newer) = (
        m.cards[0].summary.id,
        m.cards[1].summary.id,
        m.cards[2].summary.id,
    );
    admin_post(&server, &admin, &format!("/cards/{a}/disable"), None);
    admin_post(
        &server,
        &admin,
        &format!("/cards/{b}/supersede"),
        Some(serde_json::json!({"by": newer.to_string()})),
    );
    d.sync(WS);
    let m2 = check_current(&d.pool(WS));
    assert_eq!(m2.cards.len(), m.cards.len() - 2);
    for gone in [a, b] {
        assert!(!live_ids(&m2).contains(&gone.to_string()));
    }
    // The pool keeps exactly the objects of the new generation's cards: the disabled
    // card's file was collected with the generation that named it.
    let held: std::collections::BTreeSet<String> = walk(&d.pool(WS).join("objects"))
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let named: std::collections::BTreeSet<String> =
        m2.cards.iter().map(|c| c.sha256.clone()).collect();
    assert_eq!(held, named);
    assert!(!held.contains(&m.cards[0].sha256));
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn server_outage_degrades_status_and_recovers_by_itself() {
    let (mut server, admin) = server();
    let d = Daemon::start(
        &server,
        DaemonOptions {
            interval_secs: 1,
            offline_recheck_secs: 1,
            ..Default::default()
        },
    );
    d.wait_for("first generation", |v| {
        ws_status(v)["generation"].is_string()
    });
    let before = check_current(&d.pool(WS));
    assert!(server.stop());
    let v = d.wait_for("failing sync", |v| {
        ws_status(v)["last_sync"]["result"] == "failed"
    });
    let (code, v2) = d.status();
    assert_eq!(code, 1, "degraded exits 1: {v2:#}");
    assert_eq!(v["healthy"], false);
    let problem = &v2["problems"][0];
    assert!(
        problem["message"].as_str().unwrap().contains("unreachable"),
        "{problem}"
    );
    assert!(
        problem["next"]
            .as_str()
            .unwrap()
            .starts_with("curl -sS http://127.0.0.1:"),
        "{problem}"
    );
    let human = run(&mut d.ctl(&["status"]));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.starts_with("mopd: DEGRADED"), "{text}");
    assert!(
        text.contains("→ curl -sS"),
        "each problem ends with the next command: {text}"
    );
    // Still serving the last good generation.
    assert_eq!(check_current(&d.pool(WS)).revision, before.revision);

    server.start_again();
    admin_edit(
        &server,
        &admin,
        &before.cards[0].summary.id.to_string(),
        "Changed during the outage.",
    );
    let v = d.wait_for("recovery", |v| {
        v["healthy"] == true && ws_status(v)["revision"] == before.revision + 1
    });
    assert_eq!(ws_status(&v)["consecutive_failures"], 0);
    assert_eq!(d.status().0, 0);
}

#[test]
fn restart_while_offline_serves_at_once() {
    let (mut server, _admin) = server();
    let mut d = Daemon::start(&server, DaemonOptions::default());
    d.sync(WS);
    let m = check_current(&d.pool(WS));
    assert!(server.stop());
    assert!(d.stop(), "clean exit on SIGTERM; log:\n{}", d.log());
    assert!(!d.socket().exists(), "socket removed at shutdown");
    d.spawn();
    let (code, v) = d.status();
    let w = ws_status(&v);
    assert_eq!(
        w["revision"], m.revision,
        "the last good generation is there at once: {v:#}"
    );
    assert_eq!(w["cards"], m.cards.len());
    // Degraded once the first poll of the absent server has failed.
    let (mut code, mut v) = (code, v);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while code != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "degraded while the server is away: {v:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
        (code, v) = d.status();
    }
    assert_eq!(check_current(&d.pool(WS)).revision, m.revision);
}

/// An upgrade from a version whose index format this one cannot read: the daemon rebuilds
/// its current generation from the pool alone, with the server away, and serves from the
/// rebuilt one. The old index is refused by this version's reader (the control).
#[test]
fn an_index_of_an_earlier_format_is_rebuilt_without_the_server() {
    let (mut server, _admin) = server();
    let profiles =
        mop_testkit::profiles_config(&[&mop_testkit::repo_root().join("tests/profiles")]);
    let mut d = Daemon::start(
        &server,
        DaemonOptions {
            extra: &profiles,
            ..Default::default()
        },
    );
    d.sync(WS);
    let m = check_current(&d.pool(WS));
    let before = ws_status(&d.status().1)["generation"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(server.stop());
    assert!(d.stop(), "{}", d.log());
    // What an earlier version left: a tantivy index (format 3) in the current generation.
    let index = d.pool(WS).join("gens").join(&before).join("index");
    for f in std::fs::read_dir(&index).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    std::fs::write(
        index.join("mop-search.json"),
        format!("{{\"format\": 3, \"docs\": {}}}", m.cards.len()),
    )
    .unwrap();
    std::fs::write(index.join("meta.json"), "{}").unwrap();
    let refused = mop_search::SearchIndex::open(&index).unwrap_err();
    assert!(refused.to_string().contains("earlier mop"), "{refused}");

    d.spawn();
    let v = d.wait_for("a rebuilt generation", |v| {
        ws_status(v)["generation"]
            .as_str()
            .is_some_and(|g| g != before)
    });
    assert_eq!(ws_status(&v)["revision"], m.revision);
    let rebuilt = check_current(&d.pool(WS));
    assert_eq!(live_ids(&rebuilt), live_ids(&m));
    assert!(
        d.log()
            .contains("rebuilt the current generation with this version's search index format"),
        "{}",
        d.log()
    );
    // A task is served from it, with the server still away.
    let out = run(std::process::Command::new(mop_testkit::procs::bin("mop"))
        .arg("prepare")
        .arg("--socket")
        .arg(d.socket())
        .args([
            "--workspace",
            WS,
            "--task-id",
            "t-upgrade",
            "--user",
            "alice",
        ])
        .args(["--title", "Nightly ETL fails with ORA-01555", "--json"]));
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!plan["cards"].as_array().unwrap().is_empty(), "{plan:#}");
}

#[test]
fn a_lower_revision_is_refused_and_a_new_epoch_accepted_with_a_warning() {
    let (mut server, admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    d.sync(WS);
    // Keep a copy of the database at this revision.
    assert!(server.stop());
    let old_db = server.dir.path().join("old.db");
    std::fs::copy(server.db(), &old_db).unwrap();
    server.start_again();
    let m = check_current(&d.pool(WS));
    admin_edit(
        &server,
        &admin,
        &m.cards[0].summary.id.to_string(),
        "Newer.",
    );
    d.sync(WS);
    let newer = check_current(&d.pool(WS));
    assert_eq!(newer.revision, m.revision + 1);

    // The server comes back from the old copy: same epoch, lower revision.
    assert!(server.stop());
    std::fs::copy(&old_db, server.db()).unwrap();
    server.start_again();
    let out = d.sync(WS);
    assert!(
        out.contains("sync failed") && out.contains("rollback"),
        "{out}"
    );
    let (code, v) = d.status();
    assert_eq!(code, 1);
    assert_eq!(ws_status(&v)["stats"]["rollbacks_refused"], 1);
    assert_eq!(
        check_current(&d.pool(WS)).revision,
        newer.revision,
        "the newer generation stays"
    );

    // Rebuilt elsewhere: a new epoch is accepted, with a warning status keeps showing.
    assert!(server.stop());
    let db = rusqlite::Connection::open(server.db()).unwrap();
    db.execute(
        "UPDATE meta SET value = '11111111-2222-4333-8444-555555555555' WHERE key = 'epoch'",
        [],
    )
    .unwrap();
    drop(db);
    server.start_again();
    assert_eq!(d.sync(WS).trim(), format!("{WS}: modified"));
    let after = check_current(&d.pool(WS));
    assert_eq!(after.epoch, "11111111-2222-4333-8444-555555555555");
    assert_eq!(after.revision, m.revision);
    let (code, v) = d.status();
    assert_eq!(code, 0, "a new epoch is a warning, not a failure: {v:#}");
    let warning = &v["warnings"][0];
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .contains("epoch changed"),
        "{warning}"
    );
    assert_eq!(warning["next"], format!("mopd ack-epoch {WS}"));
    assert!(d.log().contains("new server epoch accepted"));
    assert!(run(&mut d.ctl(&["ack-epoch", WS])).status.success());
    assert!(d.status().1["warnings"].as_array().unwrap().is_empty());
}

#[test]
fn corrupted_objects_are_detected_and_fetched_again() {
    let (server, _admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    d.sync(WS);
    let m = check_current(&d.pool(WS));
    let victim = &m.cards[3];
    let object = d
        .pool(WS)
        .join("objects")
        .join(&victim.sha256[..2])
        .join(&victim.sha256);
    // Root ignores the 0440 mode; flip bytes in place, as a failing disk would.
    let mut bytes = std::fs::read(&object).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();

    let out = run(&mut d.cli(&["verify"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("DAMAGED") && text.contains(&victim.sha256),
        "{text}"
    );
    assert!(text.contains("mopd verify --repair"), "{text}");
    let out = run(&mut d.cli(&["verify", "--repair"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("repaired"), "{text}");
    check_current(&d.pool(WS));
    let out = run(&mut d.cli(&["verify"]));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let quarantined = std::fs::read_dir(d.pool(WS).join("quarantine"))
        .unwrap()
        .count();
    assert_eq!(quarantined, 1);
}

#[test]
fn the_daemon_scrubs_its_pool_by_itself() {
    let (server, _admin) = server();
    let d = Daemon::start(
        &server,
        DaemonOptions {
            extra: "[pool]\nverify_interval_secs = 1\n",
            ..Default::default()
        },
    );
    d.sync(WS);
    let m = check_current(&d.pool(WS));
    let victim = &m.cards[5];
    let object = d
        .pool(WS)
        .join("objects")
        .join(&victim.sha256[..2])
        .join(&victim.sha256);
    std::fs::write(&object, b"garbage").unwrap();
    d.wait_for("scrub", |v| {
        ws_status(v)["stats"]["objects_quarantined"] == 1
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = run(&mut d.cli(&["verify"]));
        if out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not repaired: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    check_current(&d.pool(WS));
}

#[test]
fn status_exit_codes_and_unreachable_daemon() {
    let (server, _admin) = server();
    let mut d = Daemon::start(&server, DaemonOptions::default());
    d.sync(WS);
    assert_eq!(d.status().0, 0);
    let human = run(&mut d.ctl(&["status"]));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.starts_with("mopd: healthy"), "{text}");
    for needle in [
        "workspace acme",
        "revision",
        "cards",
        "pool",
        "last sync",
        "304",
        "server       reached",
        "last error   none",
        "tasks",
        "sandbox",
        "config",
        "up ",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let (_, v) = d.status();
    assert_eq!(v["schema"], 1);

    // Killed: the socket file stays but nothing answers.
    d.kill9();
    let out = run(&mut d.ctl(&["status"]));
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("refuses connections") && text.contains("systemctl restart mopd"),
        "{text}"
    );
    // No socket at all.
    std::fs::remove_file(d.socket()).unwrap();
    let out = run(&mut d.ctl(&["status", "--json"]));
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["reason"], "socket_missing");
    assert!(v["message"].as_str().unwrap().contains("does not exist"));
}

#[test]
fn peers_in_another_user_namespace_are_refused() {
    let (server, _admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    d.wait_synced();
    // Control: the same command from our namespace works.
    assert_eq!(d.status().0, 0);
    let out = run(std::process::Command::new("unshare")
        .args(["--user", "--map-root-user"])
        .arg(mop_testkit::procs::bin("mopd"))
        .args(["status", "--socket"])
        .arg(d.socket()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("UNREACHABLE"), "{text}");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The daemon logs the refusal as it closes the connection: the line may reach the
    // log reader after the client has its answer.
    d.wait_log("refused a control connection from another user namespace");
}

#[test]
fn bad_configs_are_refused_at_start_and_kept_out_on_reload() {
    let (server, _admin) = server();
    let d = Daemon::start(
        &server,
        DaemonOptions {
            workspaces: &["acme", "globex"],
            ..Default::default()
        },
    );
    d.wait_for("both workspaces", |v| {
        v["workspaces"].as_array().unwrap().len() == 2
    });
    let out = run(std::process::Command::new(mop_testkit::procs::bin("mopd"))
        .args(["run", "--config"])
        .arg(d.dir.path().join("missing.toml")));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
    let bad = d.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[server]\nurl = \"ftp://x\"\n[sync]\nworkspaces = [\"acme\"]\n",
    )
    .unwrap();
    let out = run(std::process::Command::new(mop_testkit::procs::bin("mopd"))
        .args(["run", "--config"])
        .arg(&bad));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("bad.toml") && err.contains("server.url"),
        "{err}"
    );

    // A bad edit of the running config is logged, the running config kept.
    std::fs::write(d.config(), "[server]\nurl = 3\n").unwrap();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !d.log().contains("new configuration refused") {
        assert!(std::time::Instant::now() < deadline, "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(d.status().1["workspaces"].as_array().unwrap().len(), 2);

    // A good edit (no signal: the file watch notices) drops globex and removes its pool.
    d.sync("globex");
    assert!(d.pool("globex").exists());
    d.write_config(
        &server.url,
        DaemonOptions {
            workspaces: &["acme"],
            ..Default::default()
        },
    );
    let v = d.wait_for("reload", |v| v["workspaces"].as_array().unwrap().len() == 1);
    assert_eq!(v["workspaces"][0]["workspace"], "acme");
    // Status follows the new config at once; the pool goes once globex's worker stopped.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.pool("globex").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped workspace's pool is removed\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(d.log().contains("configuration reloaded"));
}

#[test]
fn kill_9_during_syncs_always_leaves_a_complete_generation() {
    let (server, admin) = server();
    let mut d = Daemon::start(
        &server,
        DaemonOptions {
            interval_secs: 1,
            ..Default::default()
        },
    );
    d.sync(WS);
    let ids = live_ids(&check_current(&d.pool(WS)));
    let mut killed_mid_build = 0;
    for round in 0..50 {
        // Change the workspace, then kill the daemon at a random moment of its next sync.
        admin_edit(
            &server,
            &admin,
            &ids[round % ids.len()],
            &format!("Round {round}."),
        );
        let pid = d.pid().unwrap();
        let trigger = std::thread::spawn({
            let cmd = d.cli(&["sync", WS]).get_program().to_owned();
            let config = d.config();
            move || {
                let _ = std::process::Command::new(cmd)
                    .args(["sync", WS, "--config"])
                    .arg(config)
                    .output();
            }
        });
        // Half the rounds kill at a random moment (any phase of the sync); the other half
        // the moment a new generation directory appears, so that some kills land inside
        // a build however fast the machine builds.
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(fastrand_ms(round)));
        } else {
            wait_for_a_new_generation(&d.pool(WS).join("gens"));
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        d.kill9();
        let _ = trigger.join();
        if std::fs::read_dir(d.pool(WS).join("gens")).unwrap().count() > 1 {
            killed_mid_build += 1;
        }
        // What the killed daemon left: `current` is complete (checked with no daemon
        // running, so nothing moves meanwhile), and after the restart every file verifies.
        check_current(&d.pool(WS));
        d.spawn();
        let out = run(&mut d.cli(&["verify"]));
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // The run reaches the newest revision once left alone.
    d.sync(WS);
    let (_, v) = d.status();
    let latest: Value = mop_testkit::http()
        .get(format!("{}/v1/workspaces/{WS}/manifest", server.url))
        .bearer_auth(&admin)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(ws_status(&v)["revision"], latest["revision"]);
    eprintln!("kill -9 rounds that left a partial generation behind: {killed_mid_build}/50");
    assert!(
        killed_mid_build > 0,
        "no kill landed inside a generation build; the test proved nothing"
    );
}

/// Returns once `gens` holds more than one entry (a build under way), or after 3 s.
fn wait_for_a_new_generation(gens: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        if std::fs::read_dir(gens).map_or(0, |d| d.count()) > 1 {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A spread of kill delays (0–400 ms) that is the same on every run.
fn fastrand_ms(round: usize) -> u64 {
    ((round as u64 * 7919) % 41) * 10
}

#[test]
fn the_pool_quota_refuses_a_sync_with_a_clear_log_line() {
    let (server, _admin) = server();
    let d = Daemon::start(
        &server,
        DaemonOptions {
            extra: "[pool]\nmax_bytes = 4096\n",
            ..Default::default()
        },
    );
    let v = d.wait_for("quota failure", |v| {
        ws_status(v)["last_error"]["kind"] == "quota"
    });
    let problem = &v["problems"][0];
    assert!(
        problem["message"]
            .as_str()
            .unwrap()
            .contains("pool.max_bytes = 4096"),
        "{problem}"
    );
    assert!(
        problem["next"].as_str().unwrap().contains("max_bytes"),
        "{problem}"
    );
    assert!(d.log().contains("pool quota"), "{}", d.log());
    assert!(ws_status(&v)["generation"].is_null());
}

#[test]
fn systemd_notifications_ready_status_watchdog_stopping() {
    use std::os::unix::net::UnixDatagram;
    let (server, _admin) = server();
    let sock_dir = tempfile::tempdir().unwrap();
    let sock_path = sock_dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut d = Daemon::start_with_env(
        &server,
        DaemonOptions::default(),
        &[
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "1000000"),
        ],
    );
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !(seen.contains("READY=1")
        && seen.contains("STATUS=1 workspace(s) in sync")
        && seen.contains("WATCHDOG=1"))
    {
        let n = sock
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification ({e}); so far: {seen}"));
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        seen.push('\n');
    }
    // READY comes only once the pool is usable.
    assert!(d.status().1["workspaces"][0]["generation"].is_string());
    assert!(d.stop());
    let mut tail = String::new();
    while let Ok(n) = sock.recv(&mut buf) {
        tail.push_str(&String::from_utf8_lossy(&buf[..n]));
        if tail.contains("STOPPING=1") {
            break;
        }
    }
    assert!(tail.contains("STOPPING=1"), "{tail}");
}

#[test]
fn a_misbehaving_network_is_refused_and_the_last_good_generation_keeps_serving() {
    use mop_testkit::faults::{Fault, FaultyProxy};
    let (server, admin) = server();
    let proxy = FaultyProxy::start(&server.url);
    let d = Daemon::start(&server, DaemonOptions::default());
    d.wait_synced();
    d.write_config(&proxy.url, DaemonOptions::default());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !d.log().contains("configuration reloaded") {
        assert!(std::time::Instant::now() < deadline, "{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Control: through the proxy, unspoiled, a change arrives.
    let m = check_current(&d.pool(WS));
    let id = m.cards[0].summary.id.to_string();
    admin_edit(&server, &admin, &id, "First edit, through the proxy.");
    assert_eq!(d.sync(WS).trim(), format!("{WS}: modified"));

    let faults = [
        Fault::CaptivePortal,
        Fault::Truncate,
        Fault::LongContentLength,
        Fault::FlipObjectByte,
        Fault::Reset,
        Fault::SlowDrip,
        Fault::StaleManifest,
    ];
    for (round, fault) in faults.iter().enumerate() {
        // A change waits on the server, so the spoiled answers matter.
        admin_edit(&server, &admin, &id, &format!("Edit {round}."));
        let held = check_current(&d.pool(WS));
        proxy.set(*fault);
        let before = proxy.spoiled();
        let logged = |d: &Daemon| {
            d.log()
                .matches("sync failed; serving the last good")
                .count()
        };
        let lines = logged(&d);
        let out = d.sync(WS);
        assert!(proxy.spoiled() > before, "{fault:?} spoiled nothing");
        assert!(out.contains("sync failed"), "{fault:?}: {out}\n{}", d.log());
        // The same failure again is not logged again.
        assert!(d.sync(WS).contains("sync failed"), "{fault:?}");
        assert_eq!(logged(&d), lines + 1, "{fault:?} logged once:\n{}", d.log());
        // Refused: the last good generation is still current and whole.
        let now = check_current(&d.pool(WS));
        assert_eq!(now.revision, held.revision, "{fault:?} changed the pool");
        let (code, v) = d.status();
        assert_eq!(code, 1, "{fault:?}: status is degraded: {v:#}");
        assert_eq!(ws_status(&v)["last_sync"]["result"], "failed", "{fault:?}");
        // Back to a clean network: the change arrives.
        proxy.set(Fault::None);
        assert_eq!(
            d.sync(WS).trim(),
            format!("{WS}: modified"),
            "{fault:?}: {}",
            d.log()
        );
    }
    let (_, v) = d.status();
    let failures = ws_status(&v)["stats"]["failures"].as_u64().unwrap();
    assert!(failures >= faults.len() as u64, "failures counted: {v:#}");
}

/// A server that answers every request with `manifest` and the ETag that matches it (one
/// request per connection).
fn fake_manifest_server(manifest: String) -> String {
    let v: Value = serde_json::from_str(&manifest).unwrap();
    let etag = format!("W/\"{}-{}\"", v["epoch"].as_str().unwrap(), v["revision"]);
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && c.read(&mut b).is_ok_and(|n| n == 1) {
                head.push(b[0]);
            }
            let _ = c.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\netag: {etag}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{manifest}",
                    manifest.len()
                )
                .as_bytes(),
            );
        }
    });
    url
}

/// The server's epoch names a directory in every host's pool (`gens/<epoch>-<rev>`): a
/// hostile server (or a proxy in between) sending `../..` must not name a path outside
/// it. Control: the same answer with a UUID epoch is taken.
#[test]
fn an_epoch_that_is_not_a_uuid_names_no_path() {
    let (server, _admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    d.wait_synced();
    let escape = tempfile::tempdir().unwrap();
    let target = escape.path().join("pwned");
    let pool = d.pool(WS);
    // From pool/gens/, enough `..` to reach the root, then the target.
    let ups = "../".repeat(pool.join("gens").components().count());
    let bad_epoch = format!(
        "{ups}{}",
        target.display().to_string().trim_start_matches('/')
    );
    let answer = |epoch: &str| {
        serde_json::json!({
            "epoch": epoch, "revision": 99, "generated_at": "2026-11-29T00:00:00Z", "cards": []
        })
        .to_string()
    };
    let before = std::fs::read_dir(pool.join("gens")).unwrap().count();
    let fake = fake_manifest_server(answer(&bad_epoch));
    d.write_config(&fake, DaemonOptions::default());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    d.wait_log("configuration reloaded");
    let out = d.sync(WS);
    assert!(out.contains("failed"), "{out}");
    d.wait_log("is not a UUID");
    assert!(
        std::fs::read_dir(escape.path()).unwrap().next().is_none(),
        "nothing was created outside the pool"
    );
    assert_eq!(
        std::fs::read_dir(pool.join("gens")).unwrap().count(),
        before
    );

    // Control: a UUID epoch (a new one: accepted with a warning) makes a generation.
    let good = "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e";
    let fake = fake_manifest_server(answer(good));
    let reloads = d.log().matches("configuration reloaded").count();
    d.write_config(&fake, DaemonOptions::default());
    while d.log().matches("configuration reloaded").count() == reloads {
        assert!(std::time::Instant::now() < deadline + Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = d.sync(WS);
    assert!(out.contains("modified"), "{out}\n{}", d.log());
    assert!(pool.join("gens").join(format!("{good}-99")).is_dir());
}

#[test]
fn status_warns_when_the_token_would_cross_a_network_in_the_clear() {
    let (server, _admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    d.wait_synced();
    let plain = |v: &Value| {
        v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["message"].as_str().unwrap().contains("over plain HTTP"))
    };
    // Control: plain HTTP on loopback is fine.
    assert!(!plain(&d.status().1));
    // A documentation address (TEST-NET-1): never reached, but named in the warning.
    d.write_config("http://192.0.2.10:8731", DaemonOptions::default());
    let v = d.wait_for("the plain-HTTP warning", plain);
    let text = run(&mut d.ctl(&["status"]));
    let shown = String::from_utf8_lossy(&text.stdout);
    assert!(
        shown.contains("192.0.2.10") && shown.contains("https://"),
        "{shown}\n{v}"
    );
}

/// Every file that may hold bytes of the database: the file, its WAL and shared memory.
fn db_files_contain(server: &Server, needle: &[u8]) -> Vec<PathBuf> {
    let db = server.db();
    [
        db.clone(),
        db.with_extension("db-wal"),
        db.with_extension("db-shm"),
    ]
    .into_iter()
    .filter(|p| std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)))
    .collect()
}

fn tree_contains(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    walk(dir)
        .into_iter()
        .filter(|p| std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)))
        .collect()
}

/// A hard delete is for personal data: its text must be recoverable nowhere — not in
/// the database file, its WAL or free pages, not in any earlier version's object, not in
/// the daemon's pool after its next sync. Control: before the delete, the same search
/// finds the text in each of those places.
#[test]
fn a_hard_delete_leaves_the_text_recoverable_nowhere() {
    let (server, admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    d.wait_synced();
    let marker = b"zqpersonal-5551234-alice-home-address";
    let id = "3b0e8a9c-1d2f-4e5a-8b7c-6d5e4f3a2b1c";
    let okf = |n: u32| {
        format!(
            "---\nid: {id}\ntype: fact\ntitle: Alice's contact {n}\nscope:\n  user_id: alice\n---\n{} version {n}\n",
            String::from_utf8_lossy(marker)
        )
    };
    let http = mop_testkit::http();
    let cards = format!("{}/v1/workspaces/{WS}/cards", server.url);
    let r = http
        .post(&cards)
        .bearer_auth(&admin)
        .body(okf(1))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    for n in 2..=3 {
        let r = http
            .put(format!("{cards}/{id}"))
            .bearer_auth(&admin)
            .body(okf(n))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().unwrap());
    }
    let history: Vec<Value> = http
        .get(format!("{cards}/{id}/history"))
        .bearer_auth(&admin)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let shas: Vec<String> = history
        .iter()
        .filter_map(|r| r["sha256_after"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(shas.len(), 3);
    d.sync(WS);
    // Control: the text is there, everywhere it should be.
    assert!(!db_files_contain(&server, marker).is_empty());
    assert!(!tree_contains(&d.pool(WS), marker).is_empty());
    let node = server.token("node", &[WS]);
    let object = |sha: &str| {
        http.get(format!("{}/v1/workspaces/{WS}/objects/{sha}", server.url))
            .bearer_auth(&node)
            .send()
            .unwrap()
            .status()
    };
    for sha in &shas {
        assert_eq!(object(sha), reqwest::StatusCode::OK, "version {sha} before");
    }

    let r = http
        .delete(format!("{cards}/{id}"))
        .bearer_auth(&admin)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    // Every version's object is gone at once (not after the retention window)…
    for sha in &shas {
        assert_eq!(
            object(sha),
            reqwest::StatusCode::NOT_FOUND,
            "version {sha} after"
        );
    }
    // …and no byte of the text is left in the database's files.
    assert_eq!(db_files_contain(&server, marker), Vec::<PathBuf>::new());
    // The daemon drops it on its next sync.
    d.sync(WS);
    assert_eq!(tree_contains(&d.pool(WS), marker), Vec::<PathBuf>::new());
    assert_eq!(tree_contains(d.dir.path(), marker), Vec::<PathBuf>::new());
}

#[test]
fn mopd_sync_asks_the_daemon_for_its_workspaces_when_the_config_is_unreadable() {
    let (server, _admin) = server();
    let d = Daemon::start(&server, DaemonOptions::default());
    d.wait_synced();
    let mopd = mop_testkit::procs::bin("mopd");
    let out = run(std::process::Command::new(&mopd)
        .args(["sync", "--config", "/nonexistent/mopd.toml", "--socket"])
        .arg(d.socket()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("acme: "), "{stdout}");
    // Control: with neither a socket nor a configuration, there is no daemon to ask.
    let out =
        run(std::process::Command::new(&mopd).args(["sync", "--config", "/nonexistent/mopd.toml"]));
    assert!(!out.status.success());
}

/// A reload that points mopd at another card server polls it at once and drops the old
/// server's error; a reload that leaves the server alone waits for the next poll as before
/// (the control).
#[test]
fn a_reload_that_changes_the_server_polls_it_at_once() {
    let (server, _admin) = server();
    const NOWHERE: &[&str] = &["http://127.0.0.1:1"];
    let options = |urls: &'static [&'static str], interval_secs: u64| DaemonOptions {
        urls,
        interval_secs,
        offline_recheck_secs: 600,
        ..Default::default()
    };
    let d = Daemon::start(&server, options(NOWHERE, 300));
    let failing = |v: &Value| !v["workspaces"][0]["last_error"].is_null();
    d.wait_for("the unreachable server's error", failing);
    // Control: a reload that keeps the server does not poll (the next is ten minutes off).
    d.write_config(&server.url, options(NOWHERE, 301));
    d.wait_log("configuration reloaded");
    std::thread::sleep(Duration::from_secs(2));
    let (_, v) = d.status();
    assert!(
        failing(&v) && v["workspaces"][0]["generation"].is_null(),
        "{v}"
    );
    // The server changes: polled at once, and the old error is gone.
    d.write_config(&server.url, options(&[], 301));
    let v = d.wait_for_within("a sync from the new server", Duration::from_secs(20), |v| {
        !v["workspaces"][0]["generation"].is_null()
    });
    assert!(v["workspaces"][0]["last_error"].is_null(), "{v}");
}
