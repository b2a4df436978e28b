//! Running the card server in production, with the real binaries: health and readiness
//! probes, Prometheus metrics that a Prometheus parser reads, an online backup while the
//! server takes writes, native TLS with a certificate reloaded on SIGHUP, replicas on one
//! database that agree on ETags, and a daemon that fails over from a killed replica and
//! does not take a replica that is behind for a rollback.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mop_testkit::example_cards_dir;
use mop_testkit::faults::{Fault, FaultyProxy};
use mop_testkit::postgres::Postgres;
use mop_testkit::procs::{Daemon, DaemonOptions, Server, output_text, run};
use serde_json::{Value, json};

const WS: &str = "acme";

fn get(url: &str, token: Option<&str>, etag: Option<&str>) -> reqwest::blocking::Response {
    let mut req = mop_testkit::http().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(e) = etag {
        req = req.header("if-none-match", e);
    }
    req.send().unwrap()
}

fn store(server: &Server, node: &str, title: &str) -> Value {
    let r = mop_testkit::http()
        .post(format!("{}/v1/workspaces/{WS}/memories", server.url))
        .bearer_auth(node)
        .json(&json!({
            "provenance": {"task_id": format!("t-{}", title.len()), "user_id": "alice"},
            "card": {"type": "fact", "title": title, "labels": ["ops"], "body": format!("{title}.\n")}
        }))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "store: {}", r.status());
    r.json().unwrap()
}

/// The sum of the samples of `metric` with these labels (a histogram counts its
/// observations).
fn metric_sum(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        // The parser names an OpenMetrics counter's samples by the family name.
        .filter(|s| s.metric == metric || s.metric == metric.trim_end_matches("_total"))
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(sample_value)
        .sum()
}

fn sample_value(s: &prometheus_parse::Sample) -> f64 {
    match &s.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => *v,
        prometheus_parse::Value::Histogram(h) => h.last().map_or(0.0, |b| b.count),
        prometheus_parse::Value::Summary(_) => 0.0,
    }
}

#[test]
fn probes_answer_and_metrics_parse_with_counts_and_no_names() {
    let server = Server::start_with("[metrics]\nenabled = true\n");
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let node = server.token("node", &[WS]);
    let manifest = format!("{}/v1/workspaces/{WS}/manifest", server.url);
    let first = get(&manifest, Some(&node), None);
    assert_eq!(first.status().as_u16(), 200);
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    let epoch = first.json::<mop_cards::Manifest>().unwrap().epoch;
    for _ in 0..3 {
        assert_eq!(
            get(&manifest, Some(&node), Some(&etag)).status().as_u16(),
            304
        );
    }
    store(&server, &node, "Metrics probe card one");
    for (path, want) in [("/healthz", "ok"), ("/readyz", "ready")] {
        let r = get(&format!("{}{path}", server.url), None, None);
        assert_eq!(r.status().as_u16(), 200, "{path}");
        assert_eq!(r.json::<Value>().unwrap()["status"], want);
    }

    let r = get(&format!("{}/metrics", server.url), None, None);
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("openmetrics-text")
    );
    let text = r.text().unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("the exposition parses");

    let find = |metric: &str, labels: &[(&str, &str)]| metric_sum(&scrape, metric, labels);
    let route = "/v1/workspaces/:ws/manifest";
    assert_eq!(
        find(
            "mop_server_http_requests_total",
            &[("route", route), ("status", "304")]
        ),
        3.0,
        "{text}"
    );
    assert_eq!(
        find(
            "mop_server_http_requests_total",
            &[("route", route), ("status", "200")]
        ),
        1.0
    );
    assert_eq!(
        find(
            "mop_server_manifest_answers_total",
            &[("kind", "not_modified")]
        ),
        3.0
    );
    assert_eq!(
        find("mop_server_manifest_answers_total", &[("kind", "full")]),
        1.0
    );
    assert_eq!(find("mop_server_stores_total", &[("kind", "created")]), 1.0);
    assert!(
        find("mop_server_manifest_build_seconds", &[]) >= 1.0,
        "a build was timed"
    );
    assert!(
        find(
            "mop_server_http_request_duration_seconds",
            &[("route", route)]
        ) >= 4.0,
        "latencies of the manifest route: {text}"
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "mop_server_db_idle_readers")
    );
    // The review queue is counted per workspace, which the label names by a hash of its
    // name keyed with the database's epoch unless metrics.workspace_names is on (the name
    // itself is checked absent below).
    let label = mop_server::metrics::workspace_label(&epoch, WS);
    assert!(
        find("mop_server_review_queue_items", &[("workspace", &label)]) >= 1.0,
        "the stored card waits for review: {text}"
    );
    for secret in [WS, node.as_str(), "alice", "Metrics probe"] {
        assert!(!text.contains(secret), "{secret:?} in /metrics");
    }

    // The control: by default the same request finds nothing.
    let quiet = Server::start();
    assert_eq!(
        get(&format!("{}/metrics", quiet.url), None, None)
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        get(&format!("{}/healthz", quiet.url), None, None)
            .status()
            .as_u16(),
        200
    );
}

fn count_cards(db: &Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    conn.query_row("SELECT count(*) FROM cards", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn an_online_backup_is_consistent_while_stores_go_on() {
    let server = Server::start();
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let node = server.token("node", &[WS]);
    let before = count_cards(&server.db());
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("copy.db");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (url, node, stop) = (server.url.clone(), node.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 40 {
                let r = mop_testkit::http()
                    .post(format!("{url}/v1/workspaces/{WS}/memories"))
                    .bearer_auth(&node)
                    .json(&json!({
                        "provenance": {"task_id": format!("backup-{n}"), "user_id": "alice"},
                        "card": {"type": "fact", "title": format!("Written during the backup {n}"), "body": "x\n"}
                    }))
                    .send()
                    .unwrap();
                assert!(r.status().is_success());
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let out = run(&mut server.cli(&[std::ffi::OsStr::new("backup"), dest.as_os_str()]));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("integrity check ok"));
    let copied = count_cards(&dest);
    assert!(
        copied >= before && copied <= before + written,
        "{before} ≤ {copied} ≤ {before}+{written}"
    );
    // The copy is a working database: a server serves it and export reads it.
    let export = dir.path().join("export");
    let out = run(Command::new(mop_testkit::procs::bin("mop-server"))
        .args(["export", "--workspace", WS, "--db"])
        .arg(&dest)
        .arg(&export));
    assert!(out.status.success(), "{}", output_text(&out));
    // An existing copy is not overwritten without --force, and nothing is left behind.
    let size = std::fs::metadata(&dest).unwrap().len();
    let out = run(&mut server.cli(&[std::ffi::OsStr::new("backup"), dest.as_os_str()]));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--force"),
        "{}",
        output_text(&out)
    );
    assert_eq!(std::fs::metadata(&dest).unwrap().len(), size);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".mop-backup"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    let out = run(&mut server.cli(&[
        std::ffi::OsStr::new("backup"),
        dest.as_os_str(),
        std::ffi::OsStr::new("--force"),
    ]));
    assert!(out.status.success(), "{}", output_text(&out));
}

fn trusting(cert: &Path) -> reqwest::blocking::Client {
    let pem = std::fs::read(cert).unwrap();
    mop_testkit::http_builder()
        .tls_backend_rustls()
        .tls_certs_only([reqwest::Certificate::from_pem(&pem).unwrap()])
        .build()
        .unwrap()
}

#[test]
fn native_tls_serves_https_and_a_new_certificate_after_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let (cert1, key1) = mop_testkit::procs::self_signed(dir.path(), "first");
    let (cert2, key2) = mop_testkit::procs::self_signed(dir.path(), "second");
    let (live_cert, live_key) = (dir.path().join("live.crt"), dir.path().join("live.key"));
    std::fs::copy(&cert1, &live_cert).unwrap();
    std::fs::copy(&key1, &live_key).unwrap();
    let server = Server::start_with(&format!(
        "[server]\ntls_cert = {:?}\ntls_key = {:?}\n",
        live_cert.display().to_string(),
        live_key.display().to_string()
    ));
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );
    let health = format!("{}/healthz", server.url);
    let ok = |client: &reqwest::blocking::Client| {
        client
            .get(&health)
            .send()
            .is_ok_and(|r| r.status().is_success())
    };
    assert!(ok(&trusting(&cert1)), "https with the first certificate");
    assert!(!ok(&trusting(&cert2)), "the second is not served yet");
    let plain = format!(
        "http://{}/healthz",
        server.url.trim_start_matches("https://")
    );
    let plain_answered = mop_testkit::http()
        .get(&plain)
        .send()
        .is_ok_and(|r| r.status().is_success());
    assert!(!plain_answered, "plain HTTP gets nothing from a TLS port");

    // A bad file on SIGHUP keeps the certificate in force.
    std::fs::write(&live_cert, "not a certificate").unwrap();
    let pid = nix::unistd::Pid::from_raw(server.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(ok(&trusting(&cert1)), "still serving the first certificate");
    server.wait_log("not reloaded", 1);

    std::fs::copy(&cert2, &live_cert).unwrap();
    std::fs::copy(&key2, &live_key).unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok(&trusting(&cert2)) {
        assert!(
            Instant::now() < deadline,
            "the second certificate was not served; log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !ok(&trusting(&cert1)),
        "new connections no longer get the first"
    );
}

fn manifest_etag(server: &Server, token: &str) -> (String, u64) {
    let r = get(
        &format!("{}/v1/workspaces/{WS}/manifest", server.url),
        Some(token),
        None,
    );
    assert_eq!(r.status().as_u16(), 200);
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();
    let m: Value = r.json().unwrap();
    (etag, m["revision"].as_u64().unwrap())
}

#[test]
fn replicas_on_one_database_agree_within_two_seconds() {
    let a = Server::start();
    replicas_agree_within_two_seconds(&a);
}

#[test]
fn replicas_on_postgresql_agree_within_two_seconds() {
    let Some(pg) = Postgres::start() else { return };
    let a = Server::on_postgres(&pg.url(), "");
    replicas_agree_within_two_seconds(&a);
}

/// A card stored through one replica shows in the other's manifest within 2 s, with the
/// same ETag, both ways.
fn replicas_agree_within_two_seconds(a: &Server) {
    assert!(a.import(&example_cards_dir(), WS).status.success());
    let b = a.replica();
    let node = a.token("node", &[WS]);
    for (writer, reader) in [(a, &b), (&b, a)] {
        let stored = store(writer, &node, &format!("Stored through {}", writer.url));
        let revision = stored["revision"].as_u64().unwrap();
        let start = Instant::now();
        loop {
            let (etag, rev) = manifest_etag(reader, &node);
            if rev >= revision {
                let (etag_w, rev_w) = manifest_etag(writer, &node);
                assert_eq!(
                    (etag.clone(), rev),
                    (etag_w, rev_w),
                    "the same state, the same ETag"
                );
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "revision {revision} not visible through the other replica within 2 s (at {rev})"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("seen through the other replica after {:?}", start.elapsed());
    }
}

fn workspace(status: &Value) -> &Value {
    &status["workspaces"][0]
}

#[test]
fn a_daemon_fails_over_between_postgresql_replicas() {
    let Some(pg) = Postgres::start() else { return };
    let mut a = Server::on_postgres(&pg.url(), "");
    assert!(a.import(&example_cards_dir(), WS).status.success());
    let b = a.replica();
    fail_over_from_a_killed_replica(&mut a, &b);
}

/// A daemon reads A's manifest through a proxy that trickles it; A is killed mid-sync; the
/// daemon goes on with B and finishes a verified generation.
fn fail_over_from_a_killed_replica(a: &mut Server, b: &Server) -> Daemon {
    // A is reached through a proxy that trickles its answers: the daemon is still
    // reading A's manifest when A is killed.
    let proxy = FaultyProxy::start(&a.url);
    proxy.set(Fault::SlowDrip);
    let urls = [proxy.url.as_str(), b.url.as_str()];
    let daemon = Daemon::start(
        a,
        DaemonOptions {
            urls: &urls,
            interval_secs: 1,
            offline_recheck_secs: 1,
            ..Default::default()
        },
    );
    std::thread::sleep(Duration::from_millis(1500));
    let (_, status) = daemon.status();
    assert!(
        workspace(&status)["generation"].is_null(),
        "still syncing from A: {status:#}"
    );
    a.kill9();
    proxy.set(Fault::Reset);
    let status = daemon.wait_for("a generation from B", |s| {
        !workspace(s)["generation"].is_null()
    });
    let ws = workspace(&status);
    assert_eq!(ws["last_sync"]["server"], json!(b.url), "{status:#}");
    let out = run(&mut daemon.cli(&["verify"]));
    assert!(
        out.status.success(),
        "the generation verifies: {}",
        output_text(&out)
    );
    let (code, status) = daemon.status();
    assert_eq!(code, 0, "healthy after failing over: {status:#}");
    let text = String::from_utf8_lossy(&run(&mut daemon.ctl(&["status"])).stdout).into_owned();
    assert!(
        text.contains(&format!("from {}", b.url)),
        "status names the server: {text}"
    );
    daemon
}

#[test]
fn a_daemon_fails_over_from_a_killed_replica_and_waits_for_one_behind() {
    let mut a = Server::start();
    assert!(a.import(&example_cards_dir(), WS).status.success());
    let b = a.replica();
    let admin = a.token("admin", &[WS]);
    let daemon = fail_over_from_a_killed_replica(&mut a, &b);

    // A replica behind the held generation: a server on a page-for-page copy of the
    // database taken now (the same epoch, as a lagging replica has; a revision that stops
    // here). After the next change the daemon asks it first; it keeps its newer
    // generation, counts the answer as behind, asks the next server, and reports no
    // rollback.
    let copies = tempfile::tempdir().unwrap();
    let frozen = copies.path().join("frozen.db");
    {
        let src = rusqlite::Connection::open(b.db()).unwrap();
        src.backup(
            rusqlite::MAIN_DB,
            &frozen,
            None::<fn(rusqlite::backup::Progress)>,
        )
        .unwrap();
    }
    let behind = Server::on_database(&frozen, &b.config());
    let id = {
        let r = mop_testkit::http()
            .get(format!("{}/v1/workspaces/{WS}/cards?limit=1", b.url))
            .bearer_auth(&admin)
            .send()
            .unwrap();
        let page: Value = r.json().unwrap();
        page["cards"][0]["summary"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let newer = b.edit_card(WS, &admin, &id, "\nEdited after the copy was taken.\n");
    daemon.sync(WS);
    daemon.wait_for("the newer revision", |s| {
        workspace(s)["revision"] == json!(newer)
    });
    daemon.write_config(
        &b.url,
        DaemonOptions {
            urls: &[behind.url.as_str(), b.url.as_str()],
            interval_secs: 1,
            offline_recheck_secs: 1,
            ..Default::default()
        },
    );
    let status = daemon.wait_for("an answer from the replica behind", |s| {
        workspace(s)["stats"]["behind_answers"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    });
    let ws = workspace(&status);
    assert_eq!(ws["revision"], json!(newer), "the newer generation is kept");
    assert_eq!(ws["stats"]["rollbacks_refused"], json!(0), "{status:#}");
    assert!(ws["last_error"].is_null(), "no error: {status:#}");
    let status = daemon.wait_for("the next answer from the current replica", |s| {
        workspace(s)["last_sync"]["server"] == json!(b.url)
    });
    assert!(workspace(&status)["last_error"].is_null());
    let (code, _) = daemon.status();
    assert_eq!(code, 0);
}

#[test]
fn daemon_metrics_are_served_on_loopback_only_when_asked() {
    let server = Server::start();
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tokens = tempfile::tempdir().unwrap();
    let token_file = tokens.path().join("metrics.token");
    std::fs::write(&token_file, "scrape-token\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let extra = format!(
        "{}[metrics]\nlisten = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n",
        mop_testkit::profiles_config(&[]),
        token_file.display()
    );
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            extra: &extra,
            ..Default::default()
        },
    );
    daemon.wait_synced();
    daemon.sync(WS);
    let out = run(Command::new(mop_testkit::procs::bin("mop")).args([
        "prepare",
        "--socket",
        daemon.socket().to_str().unwrap(),
        "--workspace",
        WS,
        "--task-id",
        "metrics-task",
        "--user",
        "alice",
        "--title",
        "Nightly ETL fails with ORA-01555",
        "--json",
    ]));
    assert!(out.status.success(), "prepare: {}", output_text(&out));
    // A scrape without the token is refused (sandboxed tasks reach loopback ports).
    let url = format!("http://127.0.0.1:{port}/metrics");
    assert_eq!(get(&url, None, None).status().as_u16(), 401);
    assert_eq!(get(&url, Some("wrong"), None).status().as_u16(), 401);
    let text = get(&url, Some("scrape-token"), None).text().unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("the exposition parses");
    let find = |metric: &str, labels: &[(&str, &str)]| metric_sum(&scrape, metric, labels);
    assert!(
        find(
            "mopd_syncs_total",
            &[("workspace", WS), ("result", "modified")]
        ) >= 1.0,
        "{text}"
    );
    assert!(
        find("mopd_syncs_total", &[("workspace", WS)]) >= 2.0,
        "{text}"
    );
    assert!(
        find("mopd_pool_bytes", &[("workspace", WS)]) > 0.0,
        "{text}"
    );
    assert!(find("mopd_generation_build_seconds", &[]) >= 1.0, "{text}");
    assert_eq!(find("mopd_prepare_seconds", &[]), 1.0, "{text}");
    assert_eq!(find("mopd_live_tasks", &[]), 1.0, "{text}");
    for secret in ["metrics-task", "alice", "ORA-01555"] {
        assert!(!text.contains(secret), "{secret:?} in the daemon's metrics");
    }

    // Off by default: a daemon without [metrics] serves none; a public address, or a port
    // without a token, is refused when the config is read.
    let quiet = Daemon::start(&server, DaemonOptions::default());
    quiet.wait_synced();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "the control: the configured daemon's port is open"
    );
    assert!(!quiet.log().contains("metrics served"), "{}", quiet.log());
    quiet.write_config(
        &server.url,
        DaemonOptions {
            extra: "[metrics]\nlisten = \"0.0.0.0:9\"\n",
            ..Default::default()
        },
    );
    // The running daemon refuses the new file on reload (and keeps its config).
    quiet.wait_log("not a loopback address");
    quiet.write_config(
        &server.url,
        DaemonOptions {
            extra: "[metrics]\nlisten = \"127.0.0.1:9\"\n",
            ..Default::default()
        },
    );
    quiet.wait_log("needs metrics.token_file");
}

/// The PostgreSQL the coming store backend is tested against (issue 18): a real server
/// from Debian's package, started by the test itself on a free loopback port, two at once
/// without sharing anything.
#[test]
fn the_tests_start_their_own_postgresql_on_loopback() {
    let Some(first) = mop_testkit::postgres::Postgres::start() else {
        return;
    };
    let second = mop_testkit::postgres::Postgres::start().expect("a second cluster");
    assert_ne!(first.port, second.port);
    assert!(first.psql("SELECT version()").starts_with("PostgreSQL "));
    assert_eq!(first.psql("SHOW listen_addresses"), "127.0.0.1");
    first.psql("CREATE TABLE probe (n int); INSERT INTO probe VALUES (1)");
    assert_eq!(first.psql("SELECT count(*) FROM probe"), "1");
    assert_eq!(
        second.psql("SELECT to_regclass('probe') IS NULL"),
        "t",
        "the second cluster has no such table"
    );
    assert!(first.url().starts_with("postgres://mop@127.0.0.1:"));
}

/// One agent store with a unique title and task; the status and, when created, the id.
fn try_store(server: &Server, node: &str, n: usize) -> (u16, Option<String>) {
    let r = mop_testkit::http()
        .post(format!("{}/v1/workspaces/{WS}/memories", server.url))
        .bearer_auth(node)
        .timeout(Duration::from_secs(30))
        .json(&json!({
            "provenance": {"task_id": format!("load-{n}"), "user_id": "alice"},
            "card": {"type": "fact", "title": format!("Load store {n}"), "body": format!("Store {n}.\n")}
        }))
        .send();
    let Ok(r) = r else { return (0, None) };
    let status = r.status().as_u16();
    let body: Value = r.json().unwrap_or(Value::Null);
    let id = (body["outcome"] == json!("created"))
        .then(|| body["id"].as_str().map(str::to_owned))
        .flatten();
    (status, id)
}

#[test]
fn postgresql_restarting_under_load_answers_503_and_loses_no_created_store() {
    let Some(pg) = Postgres::start() else { return };
    let config = "[limits]\nstores_per_token_per_minute = 1000000\n";
    let a = Server::on_postgres(&pg.url(), config);
    assert!(a.import(&example_cards_dir(), WS).status.success());
    let b = a.replica();
    let node = a.token("node", &[WS]);
    let admin = a.token("admin", &[WS]);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let answers = std::sync::Mutex::new(Vec::new());
    let ready_while_down = std::thread::scope(|scope| {
        for server in [&a, &b] {
            let (stop, next, answers, node) = (&stop, &next, &answers, &node);
            scope.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let (status, id) = try_store(server, node, n);
                    answers.lock().unwrap().push((Instant::now(), status, id));
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
        std::thread::sleep(Duration::from_secs(1));
        pg.stop();
        let down = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        let ready = get(&format!("{}/readyz", a.url), None, None)
            .status()
            .as_u16();
        pg.start_again();
        let up = Instant::now();
        // The replicas recover by themselves: wait for stores that land after the restart.
        let recovered = loop {
            let landed = answers
                .lock()
                .unwrap()
                .iter()
                .filter(|(at, status, _)| *at > up && *status == 201)
                .count();
            if landed >= 10 {
                break true;
            }
            if up.elapsed() > Duration::from_secs(30) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(
            recovered,
            "no stores landed within 30 s of the restart; log:\n{}",
            a.log()
        );
        eprintln!("down for {:?}", up - down);
        ready
    });
    assert_eq!(ready_while_down, 503, "/readyz says the database is gone");
    let answers = answers.into_inner().unwrap();
    let count = |code: u16| answers.iter().filter(|(_, s, _)| *s == code).count();
    eprintln!(
        "{} stores: {} created, {} answered 503",
        answers.len(),
        count(201),
        count(503)
    );
    assert!(
        count(503) > 0,
        "writes were refused while PostgreSQL was down"
    );
    let other: Vec<u16> = answers
        .iter()
        .map(|(_, s, _)| *s)
        .filter(|s| ![201, 503].contains(s))
        .collect();
    assert!(
        other.is_empty(),
        "only 201 or 503: {other:?}; log:\n{}",
        a.log()
    );
    // Every store answered "created" is there, through either replica.
    let created: Vec<&String> = answers
        .iter()
        .filter_map(|(_, _, id)| id.as_ref())
        .collect();
    assert_eq!(created.len(), count(201));
    for (i, id) in created.iter().enumerate() {
        let server = if i % 2 == 0 { &a } else { &b };
        let r = get(
            &format!("{}/v1/workspaces/{WS}/cards/{id}", server.url),
            Some(&admin),
            None,
        );
        assert_eq!(
            r.status().as_u16(),
            200,
            "card {id} answered created is lost"
        );
    }
    assert_eq!(
        get(&format!("{}/readyz", b.url), None, None)
            .status()
            .as_u16(),
        200
    );
}

/// Every file under `dir`, by relative path, with its bytes.
fn tree(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// The ids of the first cards of a workspace's listing.
fn page_ids(server: &Server, admin: &str) -> Vec<String> {
    let page: Value = get(
        &format!("{}/v1/workspaces/{WS}/cards?limit=5", server.url),
        Some(admin),
        None,
    )
    .json()
    .unwrap();
    page["cards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["summary"]["id"].as_str().unwrap().to_owned())
        .collect()
}

fn export(server_cli: &mut Command, dest: &Path) {
    let out = run(server_cli
        .arg(dest)
        .args(["--workspace", WS, "--include-archived"]));
    assert!(out.status.success(), "export: {}", output_text(&out));
}

#[test]
fn a_migration_from_sqlite_to_postgresql_gives_a_byte_identical_export() {
    let Some(pg) = Postgres::start() else { return };
    let a = Server::start();
    assert!(a.import(&example_cards_dir(), WS).status.success());
    let node = a.token("node", &[WS]);
    let admin = a.token("admin", &[WS]);
    store(&a, &node, "Written by an agent before the migration");
    let page: Value = get(
        &format!("{}/v1/workspaces/{WS}/cards?limit=1", a.url),
        Some(&admin),
        None,
    )
    .json()
    .unwrap();
    let id = page["cards"][0]["summary"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    a.edit_card(WS, &admin, &id, "\nEdited before the migration.\n");
    // An archived card beside live ones: NULL and non-NULL in one column, which the two
    // engines sort differently.
    let archived = page_ids(&a, &admin)[1].clone();
    let r = mop_testkit::http()
        .post(format!(
            "{}/v1/workspaces/{WS}/cards/{archived}/archive",
            a.url
        ))
        .bearer_auth(&admin)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "archive: {}", r.status());
    let (etag, revision) = manifest_etag(&a, &node);
    let dirs = tempfile::tempdir().unwrap();
    export(&mut a.cli(&["export"]), &dirs.path().join("sqlite"));

    let migrate = |from: &std::ffi::OsStr, to: &str, extra: &[&str]| {
        let mut cmd = Command::new(mop_testkit::procs::bin("mop-server"));
        cmd.arg("migrate")
            .arg("--from")
            .arg(from)
            .args(["--to", to])
            .args(extra);
        run(&mut cmd)
    };
    let mut sqlite_url = std::ffi::OsString::from("sqlite:");
    sqlite_url.push(a.db());
    // A source that is not there (a typo) is refused before the target is touched, even
    // with --replace; no empty file is left behind.
    let typo = dirs.path().join("no-such.db");
    let mut typo_url = std::ffi::OsString::from("sqlite:");
    typo_url.push(&typo);
    let refused = migrate(&typo_url, &pg.url(), &["--replace"]);
    assert!(!refused.status.success());
    assert!(
        output_text(&refused).contains("no database at"),
        "{}",
        output_text(&refused)
    );
    assert!(!typo.exists());
    let out = migrate(&sqlite_url, &pg.url(), &[]);
    assert!(out.status.success(), "migrate: {}", output_text(&out));
    let text = output_text(&out);
    assert!(text.contains("row count and content hash match"), "{text}");
    assert!(
        text.contains("copied") && text.contains("rows of cards"),
        "progress: {text}"
    );
    // Again: nothing to do, nothing written.
    let again = migrate(&sqlite_url, &pg.url(), &[]);
    assert!(again.status.success(), "{}", output_text(&again));
    assert!(
        output_text(&again).contains("nothing was written"),
        "{}",
        output_text(&again)
    );

    let b = Server::on_postgres(&pg.url(), "");
    export(&mut b.cli(&["export"]), &dirs.path().join("postgres"));
    let (from_sqlite, from_pg) = (
        tree(&dirs.path().join("sqlite")),
        tree(&dirs.path().join("postgres")),
    );
    assert!(from_sqlite.len() > 10, "the example workspace and more");
    assert_eq!(from_sqlite, from_pg, "a byte-identical export");
    // The same epoch and revision: the fleet's ETags hold, and the old tokens work.
    assert_eq!(manifest_etag(&b, &node), (etag.clone(), revision));
    let r = get(
        &format!("{}/v1/workspaces/{WS}/manifest", b.url),
        Some(&node),
        Some(&etag),
    );
    assert_eq!(r.status().as_u16(), 304);
    let history: Value = get(
        &format!("{}/v1/workspaces/{WS}/cards/{id}/history", b.url),
        Some(&admin),
        None,
    )
    .json()
    .unwrap();
    assert!(history.to_string().contains("Test Curator"), "{history}");
    // New history rows go on after the copied ones.
    b.edit_card(WS, &admin, &id, "\nEdited after the migration.\n");

    // A target holding other data is refused and left as it was; --replace overwrites it.
    let other = Server::start();
    assert!(
        other
            .import(&example_cards_dir(), "globex")
            .status
            .success()
    );
    let mut other_url = std::ffi::OsString::from("sqlite:");
    other_url.push(other.db());
    let refused = migrate(&other_url, &pg.url(), &[]);
    assert!(!refused.status.success());
    let why = output_text(&refused);
    assert!(
        why.contains("is not empty") && why.contains("--replace"),
        "{why}"
    );
    assert_eq!(manifest_etag(&b, &node).1, revision + 1, "unchanged");
    let replaced = migrate(&other_url, &pg.url(), &["--replace"]);
    assert!(replaced.status.success(), "{}", output_text(&replaced));
}

/// Security round three (issue 30): a mop-server started by hand with the usual umask
/// (022, as README's quick start does) keeps its database files to itself. The attack:
/// another local user reads `mop.db`, `-wal` or `-shm` (a card may hold a password a
/// curator let through). The control: a file the same user made beside them with that
/// umask is readable by the other user, so the directory does not stop them.
#[test]
fn the_database_files_are_owner_only_whatever_the_umask() {
    let Some(_) = mop_testkit::procs::runner_user() else {
        return;
    };
    let server = Server::start_wrapped("", &["/bin/sh", "-c", "umask 022 && exec \"$0\" \"$@\""]);
    let node = server.token("node", &["acme"]);
    assert!(server.import(&example_cards_dir(), "acme").status.success());
    let r = mop_testkit::http()
        .post(format!("{}/v1/workspaces/acme/memories", server.url))
        .bearer_auth(&node)
        .json(&json!({"provenance": {"task_id": "t-1", "user_id": "alice"},
            "card": {"type": "fact", "title": "The reporting DSN", "body": "Reports read from the replica.\n"}}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let db = server.db();
    let dir = db.parent().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let control = dir.join("notes.txt");
    run(Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("umask 022 && echo hello > {}", control.display())));
    let read_as_other = |path: &Path| {
        run(mop_testkit::procs::runner_command("/bin/cat").arg(path))
            .status
            .success()
    };
    assert!(
        read_as_other(&control),
        "the control: the directory is open"
    );
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = std::path::PathBuf::from(name);
        let mode = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{}", path.display());
        assert!(!read_as_other(&path), "{} is readable", path.display());
    }
}
