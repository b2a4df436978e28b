//! Security round three (issue 30): no tenant starves the others. Each test is the attack
//! with its control experiment, against the real binaries:
//!
//! - one task storing in a loop cannot spend its host's whole store budget (the server
//!   takes each task's share first);
//! - one runner uid cannot take every task slot of a host (`tasks.max_tasks_per_uid`);
//! - one workspace's admin, logging in over and over with many tokens, cannot end another
//!   workspace's console sessions;
//! - console logins that fail are logged with their source (never the token), throttled per
//!   source (without locking out a valid token) and counted in the metrics.

use std::process::Command;

use mop_testkit::procs::{
    Daemon, DaemonOptions, Server, as_runner, output_text as text, run, runner_user,
};
use mop_testkit::{example_cards_dir, http, http_builder, profiles_config};
use serde_json::{Value, json};

const WS: &str = "acme";

/// A store as mopd sends it for a task: the host's node token, the task's provenance.
fn store(server: &Server, node: &str, task: &str, n: usize) -> (u16, Value) {
    let r = http()
        .post(format!("{}/v1/workspaces/{WS}/memories", server.url))
        .bearer_auth(node)
        .json(&json!({
            "provenance": {"task_id": task, "user_id": "alice"},
            "card": {"type": "fact", "title": format!("Lesson {n} of task {task}"),
                     "body": format!("Distinct lesson number {n} about replica {n} lag.\n")},
        }))
        .send()
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().unwrap_or(Value::Null))
}

/// 30 stores in a row from one task, then one from another task of the same host: how
/// many of the flood were created, and the other task's answer.
fn flood_then_bob(server: &Server) -> (usize, (u16, Value)) {
    let node = server.token("node", &[WS]);
    let created = (0..30)
        .filter(|n| store(server, &node, "agent-in-a-loop", *n).0 == 201)
        .count();
    (created, store(server, &node, "bob-task", 99))
}

#[test]
fn one_task_storing_in_a_loop_leaves_its_hosts_other_tasks_their_share() {
    let server = Server::start_with(
        "[limits]\nstores_per_token_per_minute = 20\nstores_per_task_per_minute = 5\n",
    );
    let (created, (code, answer)) = flood_then_bob(&server);
    assert_eq!(created, 5, "the looping task got its share and no more");
    assert_eq!(code, 201, "bob's store is taken: {answer}");
    // What the looping task was told.
    let node = server.token("node", &[WS]);
    for n in 0..5 {
        store(&server, &node, "second-loop", n);
    }
    let (code, answer) = store(&server, &node, "second-loop", 5);
    assert_eq!(code, 429, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("limits.stores_per_task_per_minute"),
        "{answer}"
    );

    // The control: the same flood where a task's share is the whole host's budget (as
    // before): the loop spends all of it and bob's store is refused.
    let open = Server::start_with(
        "[limits]\nstores_per_token_per_minute = 20\nstores_per_task_per_minute = 20\n",
    );
    let (created, (code, answer)) = flood_then_bob(&open);
    assert_eq!(created, 20);
    assert_eq!(code, 429, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("limits.stores_per_token_per_minute"),
        "{answer}"
    );
}

/// `mop prepare` of a bare task (24 h lease) by `cmd`'s user.
fn prepare(daemon: &Daemon, mut cmd: Command, task: &str) -> (bool, String) {
    cmd.arg("prepare")
        .arg("--socket")
        .arg(daemon.socket())
        .args([
            "--workspace",
            WS,
            "--task-id",
            task,
            "--title",
            "x",
            "--json",
        ]);
    let out = run(&mut cmd);
    (out.status.success(), text(&out))
}

/// A daemon allowing 12 tasks, `per_uid` of them to one uid; the runner prepares until
/// refused (at most 12), then root prepares one. Returns how many the runner got, and
/// root's answer.
fn runner_fills_then_root(server: &Server, per_uid: usize) -> (usize, (bool, String)) {
    let extra = format!(
        "{}max_tasks = 12\nmax_tasks_per_uid = {per_uid}\n",
        profiles_config(&[])
    );
    let daemon = Daemon::start(
        server,
        DaemonOptions {
            extra: &extra,
            ..Default::default()
        },
    );
    daemon.wait_synced();
    let mut got = 0;
    for i in 0..12 {
        let (ok, said) = prepare(&daemon, as_runner(&[]), &format!("flood-{i}"));
        if !ok {
            assert!(said.contains("503") || said.contains("max_tasks"), "{said}");
            break;
        }
        got += 1;
    }
    let root = Command::new(mop_testkit::procs::bin("mop"));
    (got, prepare(&daemon, root, "root-task"))
}

#[test]
fn one_runner_cannot_take_every_task_slot() {
    if runner_user().is_none() {
        return;
    }
    let server = Server::start();
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let (got, (ok, said)) = runner_fills_then_root(&server, 4);
    assert_eq!(got, 4, "the runner's share");
    assert!(ok, "another uid still prepares: {said}");
    // What the runner is told at its limit.
    // The control: one uid may take all 12 slots; then nobody else gets one.
    let (got, (ok, said)) = runner_fills_then_root(&server, 12);
    assert_eq!(got, 12);
    assert!(!ok, "{said}");
    assert!(said.contains("tasks.max_tasks allows"), "{said}");
}

#[test]
fn a_runner_at_its_share_is_told_which_limit_and_what_to_do() {
    if runner_user().is_none() {
        return;
    }
    let server = Server::start();
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let extra = format!("{}max_tasks_per_uid = 1\n", profiles_config(&[]));
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            extra: &extra,
            ..Default::default()
        },
    );
    daemon.wait_synced();
    assert!(prepare(&daemon, as_runner(&[]), "first").0);
    let (ok, said) = prepare(&daemon, as_runner(&[]), "second");
    assert!(!ok);
    assert!(
        said.contains("tasks.max_tasks_per_uid") && said.contains("mop release"),
        "{said}"
    );
}

/// A client that keeps cookies out of it (each login is a new browser).
fn browserless() -> reqwest::blocking::Client {
    http_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Logs in with `token`; the session cookie.
fn login(server: &Server, token: &str) -> String {
    let r = browserless()
        .post(format!("{}/console/login", server.url))
        .form(&[("token", token)])
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 303, "login");
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    cookie.split(';').next().unwrap().to_owned()
}

/// Whether the session still opens workspace `ws`'s queue.
fn session_lives(server: &Server, cookie: &str, ws: &str) -> bool {
    let r = browserless()
        .get(format!("{}/console/w/{ws}", server.url))
        .header("cookie", cookie)
        .send()
        .unwrap();
    r.status().as_u16() == 200
}

#[test]
fn one_workspaces_admin_cannot_log_out_anothers_curators() {
    let server = Server::start_with("[console]\nmax_sessions = 40\n");
    let a = server.token_named("admin", &["a"], Some("Alice of A"));
    let a_session = login(&server, &a);
    // Workspace b's admin mints 10 tokens and logs in 200 times.
    let b_tokens: Vec<String> = (0..10)
        .map(|i| server.token_named("admin", &["b"], Some(&format!("b{i}"))))
        .collect();
    let b_first = login(&server, &b_tokens[0]);
    for i in 0..200 {
        login(&server, &b_tokens[i % 10]);
    }
    assert!(
        session_lives(&server, &a_session, "a"),
        "a's curator is still logged in"
    );
    // The control: the table was full, and b's own oldest session made room.
    assert!(
        !session_lives(&server, &b_first, "b"),
        "b's first session ended"
    );
}

#[test]
fn failed_console_logins_are_logged_throttled_and_counted() {
    let server = Server::start_with(
        "[console]\nlogin_failures_per_minute = 10\ntrusted_proxies = [\"127.0.0.1\"]\n[metrics]\nenabled = true\n",
    );
    let admin = server.token_named("admin", &[WS], Some("Carol Curator"));
    let client = browserless();
    let attempt = |token: &str, from: Option<&str>| {
        let mut r = client
            .post(format!("{}/console/login", server.url))
            .form(&[("token", token)]);
        if let Some(ip) = from {
            r = r.header("x-forwarded-for", ip);
        }
        r.send().unwrap().status().as_u16()
    };
    // The control before the attack: the right token logs in from this source.
    assert_eq!(attempt(&admin, Some("198.51.100.7")), 303);
    let guesses: Vec<u16> = (0..300)
        .map(|i| attempt(&format!("wrong-token-{i:04}"), Some("198.51.100.7")))
        .collect();
    assert!(
        guesses[..10].iter().all(|&c| c == 401),
        "{:?}",
        &guesses[..12]
    );
    assert!(
        guesses[10..].iter().all(|&c| c == 429),
        "{:?}",
        &guesses[..12]
    );
    // Throttled, that source still logs in with the right token (nobody can lock the
    // curators behind a proxy out by failing on purpose), and so does another source.
    assert_eq!(attempt(&admin, Some("198.51.100.7")), 303);
    assert_eq!(attempt(&admin, Some("203.0.113.9")), 303);
    // Another source's wrong token is its own first failure.
    assert_eq!(attempt("wrong-token-elsewhere", Some("203.0.113.9")), 401);
    // Every failure logged with its source, never a token.
    let log = server.wait_log("console login failed", 11);
    let failures = log.matches("console login failed").count();
    assert_eq!(failures, 11, "{log}");
    assert!(log.contains("198.51.100.7"), "{log}");
    assert!(!log.contains("wrong-token"), "a token in the log");
    assert!(!log.contains(&admin), "a token in the log");
    // And counted.
    let metrics = http()
        .get(format!("{}/metrics", server.url))
        .send()
        .unwrap()
        .text()
        .unwrap();
    for (outcome, n) in [("refused", 11), ("throttled", 290), ("ok", 3)] {
        let line = format!("mop_server_console_logins_total{{kind=\"{outcome}\"}} {n}");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
}
