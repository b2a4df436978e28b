//! The write path at fleet scale, tried as a team running many agent tasks would, with the
//! real mop-server, mopd, `mop run` in bubblewrap (runners are the unprivileged user
//! `moprunner`) and, for replicas, a real PostgreSQL:
//!
//! - credentials are refused with kind and place, never echoed, and found nowhere after
//!   (the control: look-alikes pass); admin writes are screened with an audited override;
//!   a card already stored can be found and deleted for good from every host;
//! - one same-lesson rule: a repeat reinforces the card the task sees (once per task),
//!   a verified card is named with how to read it, another author's card is grouped and
//!   never revealed, a merged card stands for what was merged into it, and no two
//!   lessons of the eval merge;
//! - a rejected lesson does not come back (near-identical text neither; another lesson
//!   does: the control; a lifted tombstone lets it back);
//! - retrieve lists verified matches first, through the CLI and MCP;
//! - stores survive an outage, a kill -9 of mopd and a replica failing mid-replay, each
//!   landing exactly once; the queue is bounded and old stores are dropped, counted.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use mop_testkit::credentials::{credentials, look_alikes};
use mop_testkit::faults::{Fault, FaultyProxy};
use mop_testkit::postgres::Postgres;
use mop_testkit::procs::output_text as text;
use mop_testkit::procs::{
    Daemon, DaemonOptions, Server, as_runner, bwrap_available, run, runner_user,
};
use mop_testkit::world::World;
use mop_testkit::{example_cards_dir, profiles_config};
use serde_json::{Value, json};

const WS: &str = "acme";
/// Limits high enough for the corpora (the per-task bound has its own test elsewhere).
const ROOMY: &str = "[limits]\nstores_per_task = 500\nstores_per_token_per_minute = 10000\nstores_per_task_per_minute = 10000\n";
/// The verified ORA-01555 runbook and correction of the example workspace.
const RUNBOOK: &str = "9433ba31-32a4-5061-ab60-1c11139dae4e";
const CORRECTION: &str = "1ecf3195-08e1-51b9-9e3b-b1b4e9c4d1b3";

mop_testkit::world_env! {
    /// The world of these tests: the example cards, a curator, and tasks by the runner user.
    Env {}
}

fn setup(server_config: &str, daemon_extra: &str) -> Option<Env> {
    let world = World::builder()
        .server_config(server_config)
        .daemon_config(daemon_extra)
        .curator("Carol Curator")
        .offline_recheck_secs(1)
        .start()?;
    Some(Env { world })
}

/// What `mop memory store` printed: its outcome word and the card id in `(…)`.
fn outcome(out: &Output) -> (String, Option<String>) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let first = stdout.lines().next().unwrap_or("");
    let word = first.split(':').next().unwrap_or("").to_owned();
    let id = first
        .rsplit_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .filter(|i| i.len() == 36)
        .map(str::to_owned);
    (word, id)
}

/// The `store id: …` line of a store's answer.
fn store_id(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("store id: ").map(str::to_owned))
        .unwrap_or_else(|| panic!("no store id: {}", text(out)))
}

impl Env {
    /// `mop run` of task `task` for `user` as the runner, running `script` in a sandbox
    /// whose working directory holds `files`.
    fn mop_run(&self, task: &str, user: &str, files: &[(String, String)], script: &str) -> Output {
        self.mop_run_in(&self.workdir(), task, user, files, script)
    }

    /// [`Env::mop_run`] in the working directory `w`, which the caller reads afterwards.
    fn mop_run_in(
        &self,
        w: &tempfile::TempDir,
        task: &str,
        user: &str,
        files: &[(String, String)],
        script: &str,
    ) -> Output {
        for (name, content) in files {
            let p = w.path().join(name);
            std::fs::write(&p, content).unwrap();
            nix::unistd::chown(&p, Some(self.uid.into()), Some(self.gid.into())).unwrap();
        }
        let socket = self.daemon.socket();
        let a: Vec<&OsStr> = [
            OsStr::new("run"),
            OsStr::new("--socket"),
            socket.as_os_str(),
            OsStr::new("--workdir"),
            w.path().as_os_str(),
        ]
        .into_iter()
        .chain(
            [
                "--workspace",
                WS,
                "--task-id",
                task,
                "--user",
                user,
                "--title",
                "Fix the nightly ETL",
                "--",
                "/bin/sh",
                "-c",
                script,
            ]
            .map(OsStr::new),
        )
        .collect();
        run(&mut as_runner(&a))
    }

    /// One store from a sandboxed task: `mop memory store` with this title and body.
    fn store(&self, task: &str, user: &str, kind: &str, title: &str, body: &str) -> Output {
        self.mop_run(
            task,
            user,
            &[
                ("title".into(), title.into()),
                ("body.md".into(), body.into()),
            ],
            &format!(
                "mop memory store --type {kind} --title \"$(cat title)\" --content-file body.md"
            ),
        )
    }

    /// A prepared task (`mop prepare --json`), whose agent socket the test then uses as
    /// the agent would, for follow-ups within one task.
    fn prepare(&self, task: &str, user: &str) -> Value {
        let socket = self.daemon.socket();
        let out = run(&mut as_runner(&[
            OsStr::new("prepare"),
            OsStr::new("--socket"),
            socket.as_os_str(),
            OsStr::new("--json"),
            OsStr::new("--workspace"),
            OsStr::new(WS),
            OsStr::new("--task-id"),
            OsStr::new(task),
            OsStr::new("--user"),
            OsStr::new(user),
            OsStr::new("--title"),
            OsStr::new("Fix the nightly ETL"),
        ]));
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `mop memory <args>` through a prepared task's agent socket.
    fn agent(&self, plan: &Value, args: &[&str], stdin: Option<&str>) -> Output {
        let mut a = vec![OsStr::new("memory")];
        a.extend(args.iter().map(OsStr::new));
        let mut cmd = as_runner(&a);
        cmd.env("MOP_AGENT_SOCKET", plan["agent_socket"].as_str().unwrap());
        match stdin {
            Some(input) => mop_testkit::procs::run_with_stdin(&mut cmd, input.as_bytes()),
            None => run(&mut cmd),
        }
    }

    fn agent_store(&self, plan: &Value, title: &str, body: &str) -> Output {
        self.agent(
            plan,
            &[
                "store",
                "--type",
                "pitfall",
                "--title",
                title,
                "--content-stdin",
            ],
            Some(body),
        )
    }

    fn api(&self, method: reqwest::Method, path: &str, body: Option<String>) -> (u16, Value) {
        let mut r = mop_testkit::http()
            .request(
                method,
                format!("{}/v1/workspaces/{WS}{path}", self.server.url),
            )
            .bearer_auth(&self.admin);
        if let Some(b) = body {
            r = r.body(b);
        }
        let r = r.send().unwrap();
        let code = r.status().as_u16();
        let text = r.text().unwrap();
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Every card of the workspace (archived ones too), by id.
    fn cards(&self) -> BTreeMap<String, Value> {
        let (code, page) = self.api(reqwest::Method::GET, "/cards?archived=true&limit=500", None);
        assert_eq!(code, 200, "{page}");
        page["cards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["summary"]["id"].as_str().unwrap().to_owned(), c.clone()))
            .collect()
    }

    /// The ids of the cards whose title contains `marker`.
    fn titled(&self, marker: &str) -> Vec<String> {
        self.cards()
            .into_iter()
            .filter(|(_, c)| c["summary"]["title"].as_str().unwrap().contains(marker))
            .map(|(id, _)| id)
            .collect()
    }

    fn status(&self) -> Value {
        self.daemon.status().1
    }

    /// Waits until mopd's queue of stores is empty.
    fn wait_queue_empty(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            let s = self.status();
            if s["stores"]["queued"] == 0 {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "stores still queued after {limit:?}: {}\n{}",
                s["stores"],
                self.daemon.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Every file under `dir`, read as bytes (missing ones skipped).
fn all_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() => {
                    if let Ok(b) = std::fs::read(&p) {
                        out.push((p.display().to_string(), b));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn credentials_are_refused_by_kind_and_place_and_found_nowhere_while_look_alikes_pass() {
    let Some(env) = setup(ROOMY, "") else { return };
    let creds = credentials(20261204);
    let alikes = look_alikes(20261204);
    let kinds: BTreeSet<&str> = creds.iter().filter_map(|s| s.kind).collect();
    assert!(creds.len() >= 30 && kinds.len() >= 15 && alikes.len() >= 30);
    // One sandboxed task per corpus stores every sample with `mop memory store`, as an
    // agent that pasted what it saw would; each answer is kept in the working directory.
    let mut files = Vec::new();
    for (i, s) in creds.iter().chain(&alikes).enumerate() {
        let (title, body) = if s.in_title {
            (
                s.text.clone(),
                "Seen while debugging the deploy.\n".to_owned(),
            )
        } else {
            (format!("Deploy note {i}"), format!("{}\n", s.text))
        };
        files.push((format!("t{i}"), title));
        files.push((format!("b{i}"), body));
    }
    let n = creds.len() + alikes.len();
    let script = format!(
        "i=0; while [ $i -lt {n} ]; do mop memory store --type fact --title \"$(cat t$i)\" --content-file b$i > o$i 2> e$i; echo $? > r$i; i=$((i+1)); done"
    );
    let w = env.workdir();
    let out = env.mop_run_in(&w, "paster", "alice", &files, &script);
    assert!(out.status.success(), "{}", text(&out));
    let read = |name: String| std::fs::read_to_string(w.path().join(name)).unwrap_or_default();
    let mut wrong = Vec::new();
    for (i, s) in creds.iter().chain(&alikes).enumerate() {
        let (rc, stdout, stderr) = (
            read(format!("r{i}")),
            read(format!("o{i}")),
            read(format!("e{i}")),
        );
        match s.kind {
            Some(kind) => {
                let field = if s.in_title { "in title" } else { "in body" };
                if rc.trim() == "0"
                    || !stderr.contains(kind)
                    || !stderr.contains(field)
                    || !stderr.contains("line")
                {
                    wrong.push(format!("{}: rc {rc:?}, stderr {stderr:?}", s.name));
                }
                if stderr.contains(&s.secret) || stdout.contains(&s.secret) {
                    wrong.push(format!("{}: the answer echoes the credential", s.name));
                }
            }
            None => {
                if rc.trim() != "0" || !stdout.starts_with("created:") {
                    wrong.push(format!(
                        "look-alike {}: rc {rc:?}, {stdout} {stderr}",
                        s.name
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Nothing of any credential anywhere: not in the database, the server's or the
    // daemon's logs, the host's pool, its receipts or its queue.
    env.daemon.sync(WS);
    let socket = env.daemon.socket();
    let receipt = run(&mut as_runner(&[
        OsStr::new("receipt"),
        OsStr::new("paster"),
        OsStr::new("--socket"),
        socket.as_os_str(),
        OsStr::new("--json"),
    ]));
    let mut places: Vec<(String, Vec<u8>)> = vec![
        ("server log".into(), env.server.log().into_bytes()),
        ("daemon log".into(), env.daemon.log().into_bytes()),
        ("receipt".into(), receipt.stdout.clone()),
    ];
    places.extend(all_bytes(env.server.dir.path()));
    places.extend(all_bytes(env.daemon.dir.path()));
    for s in &creds {
        for (place, bytes) in &places {
            assert!(
                !contains(bytes, &s.secret),
                "{}: the credential is in {place}",
                s.name
            );
        }
    }
    // The control: the look-alikes did arrive, in the database and the host's pool.
    let stored = all_bytes(env.daemon.dir.path());
    for s in alikes.iter().take(5) {
        let marker = s.text.lines().next().unwrap();
        assert!(
            stored.iter().any(|(_, b)| contains(b, marker)),
            "look-alike {} reached the pool",
            s.name
        );
    }
    // Refusals are in the receipt by kind (code), never by text.
    let r: Value = serde_json::from_slice(&receipt.stdout).unwrap();
    let refused = r["activity"]["stores"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["code"] == "credential")
        .count();
    assert_eq!(refused, creds.len(), "{r}");
}

#[test]
fn admin_writes_are_screened_with_an_audited_override_and_stored_credentials_are_deleted_for_good()
{
    let Some(env) = setup("", "") else { return };
    let secret = format!("ghp_{}", "Zq8Rk2Vn6Tw0Ym4Xp1Ls5Hd9Jf3Gc7Bb2Na6Ke");
    let id = "2d4c1a8e-5b3f-4e6a-9c7d-0f1e2a3b4c5d";
    let okf = format!(
        "---\nid: {id}\ntype: fact\ntitle: CI token for the release job\n---\nThe release job pushes with {secret}.\n"
    );
    // Refused, naming the kind and the place, never the value.
    let (code, body) = env.api(reqwest::Method::POST, "/cards", Some(okf.clone()));
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["error"], "credential");
    assert_eq!(body["findings"][0]["kind"], "github-pat");
    assert_eq!(body["findings"][0]["field"], "body");
    assert!(!body.to_string().contains(&secret));
    // The control: the same card without the token goes in.
    let clean_id = "2d4c1a8e-5b3f-4e6a-9c7d-0f1e2a3b4c5e";
    let clean = format!(
        "---\nid: {clean_id}\ntype: fact\ntitle: CI token for the release job\n---\nThe release job pushes with the token in vault kv/ci/release.\n"
    );
    let (code, body) = env.api(reqwest::Method::POST, "/cards", Some(clean));
    assert_eq!(code, 201, "{body}");
    // A deliberate override: stored, and the history says which kinds were allowed.
    let (code, body) = env.api(
        reqwest::Method::POST,
        "/cards?allow_credentials=true",
        Some(okf),
    );
    assert_eq!(code, 201, "{body}");
    let (_, history) = env.api(reqwest::Method::GET, &format!("/cards/{id}/history"), None);
    let detail = history[0]["detail"].as_str().unwrap_or("").to_owned();
    assert!(
        detail.contains("github-pat") && !detail.contains(&secret),
        "{detail}"
    );
    assert_eq!(history[0]["actor_name"], "Carol Curator");

    // It is listed by id and kind, without its value or title, by the server and by the
    // curator's API, and the curator's card view marks it.
    let out = run(&mut env.server.cli(&["credentials", "--workspace", WS]));
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && listed.contains(id) && listed.contains("github-pat"),
        "{}",
        text(&out)
    );
    assert!(
        !listed.contains(&secret) && !listed.contains(clean_id),
        "{listed}"
    );
    let (_, cards) = env.api(reqwest::Method::GET, "/credentials", None);
    assert_eq!(cards.as_array().unwrap().len(), 1, "{cards}");
    let (_, details) = env.api(reqwest::Method::GET, &format!("/cards/{id}/details"), None);
    assert_eq!(details["card"]["credentials"][0]["kind"], "github-pat");

    // Imports are screened the same way, and take the same override.
    let dir = tempfile::tempdir().unwrap();
    let other = "2d4c1a8e-5b3f-4e6a-9c7d-0f1e2a3b4c5f";
    let pillar = dir.path().join("facts/specs");
    std::fs::create_dir_all(&pillar).unwrap();
    std::fs::write(
        pillar.join(format!("{other}.md")),
        format!("---\nid: {other}\ntype: fact\ntitle: Mirror credentials\n---\nclone https://deploy:Xk29fLq7Wm3z@git.internal/org.git\n"),
    )
    .unwrap();
    let out = run(&mut env.server.cli(&[
        OsStr::new("import"),
        dir.path().as_os_str(),
        OsStr::new("--workspace"),
        OsStr::new(WS),
    ]));
    let report = text(&out);
    assert!(
        !out.status.success()
            && report.contains("url-password")
            && !report.contains("Xk29fLq7Wm3z"),
        "{report}"
    );
    let out = run(&mut env.server.cli(&[
        OsStr::new("import"),
        dir.path().as_os_str(),
        OsStr::new("--workspace"),
        OsStr::new(WS),
        OsStr::new("--allow-credentials"),
        OsStr::new(other),
    ]));
    assert!(out.status.success(), "{}", text(&out));

    // Deleted for good from mop-curate, with a reason: gone from the server and, at the
    // next sync, from every host's pool; the control card stays. (First, the host has it.)
    env.daemon.sync(WS);
    assert!(
        all_bytes(env.daemon.dir.path())
            .iter()
            .any(|(_, b)| contains(b, &secret)),
        "the overridden card reached the pool"
    );
    for card in [id, other] {
        let delete = ["delete", card, "--reason", "carried a credential", "--yes"];
        let out = run(&mut env.curate(&delete));
        assert!(out.status.success(), "{}", text(&out));
    }
    let (code, _) = env.api(reqwest::Method::GET, &format!("/cards/{id}"), None);
    assert_eq!(code, 404);
    let (_, history) = env.api(reqwest::Method::GET, &format!("/cards/{id}/history"), None);
    let last = history.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["action"], "hard_delete");
    assert!(
        last["detail"]
            .as_str()
            .unwrap()
            .contains("carried a credential"),
        "{last}"
    );
    env.daemon.sync(WS);
    let db = std::fs::read(env.server.db()).unwrap_or_default();
    for (place, bytes) in all_bytes(env.daemon.dir.path())
        .iter()
        .chain([("database".to_owned(), db)].iter())
    {
        assert!(!contains(bytes, &secret), "the token is still in {place}");
        assert!(
            !contains(bytes, "Xk29fLq7Wm3z"),
            "the password is still in {place}"
        );
    }
    assert!(env.cards().contains_key(clean_id), "the control card stays");
}

#[test]
fn a_verify_of_a_card_with_a_credential_needs_the_override() {
    let Some(env) = setup("", "") else { return };
    let id = "3e5d2b9f-6c4a-4f7b-8d8e-1a2b3c4d5e6f";
    let okf = format!(
        "---\nid: {id}\ntype: fact\ntitle: Slack alerts\ntrust: unverified\nprovenance:\n  user_id: alice\n---\nAlerts post with xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx.\n"
    );
    let (code, body) = env.api(
        reqwest::Method::POST,
        "/cards?allow_credentials=true",
        Some(okf),
    );
    assert_eq!(code, 201, "{body}");
    // One keystroke must not publish it to the workspace.
    let (code, body) = env.api(reqwest::Method::POST, &format!("/cards/{id}/verify"), None);
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["findings"][0]["kind"], "slack-bot-token");
    let (_, info) = env.api(reqwest::Method::GET, &format!("/cards/{id}/details"), None);
    assert_eq!(info["card"]["summary"]["trust"], "unverified");
    // The control: a deliberate verify with the override passes (and is audited).
    let (code, body) = env.api(
        reqwest::Method::POST,
        &format!("/cards/{id}/verify?allow_credentials=true"),
        None,
    );
    assert_eq!(code, 200, "{body}");
    let (_, history) = env.api(reqwest::Method::GET, &format!("/cards/{id}/history"), None);
    let last = history.as_array().unwrap().last().unwrap();
    assert!(
        last["detail"].as_str().unwrap().contains("slack-bot-token"),
        "{last}"
    );
}

#[test]
fn the_same_lesson_reinforces_what_a_task_sees_groups_what_it_cannot_and_reveals_nothing() {
    let Some(env) = setup(ROOMY, "") else { return };
    let lessons = mop_testkit::lessons::load();
    let undo = lessons
        .iter()
        .find(|l| l.id == "ora-undo-retention")
        .unwrap();
    let commit = lessons
        .iter()
        .find(|l| l.id == "ora-fetch-across-commit")
        .unwrap();
    let (t0, b0) = &undo.wordings[0];
    let (t1, b1) = &undo.wordings[1];

    let first = env.store("a1", "alice", "pitfall", t0, b0);
    assert_eq!(outcome(&first).0, "created", "{}", text(&first));
    let a = outcome(&first).1.unwrap();
    // Another task of alice's, the lesson reworded: her card is reinforced, and the
    // answer says it is not verified and how to read it.
    let again = env.store("a2", "alice", "pitfall", t1, b1);
    let said = String::from_utf8_lossy(&again.stdout).into_owned();
    assert_eq!(
        outcome(&again),
        ("reinforced".into(), Some(a.clone())),
        "{said}"
    );
    assert!(
        said.contains("has not verified it yet") && said.contains(&format!("mop memory get {a}")),
        "{said}"
    );
    // The same task again: it counts once.
    let plan = env.prepare("a3", "alice");
    let one = env.agent_store(&plan, t0, b0);
    assert_eq!(outcome(&one).0, "reinforced", "{}", text(&one));
    let twice = env.agent_store(&plan, t1, b1);
    assert_eq!(outcome(&twice).0, "unchanged", "{}", text(&twice));
    // The sibling lesson (the same error, another fix) is its own card.
    let (st, sb) = &commit.wordings[0];
    let sibling = env.store("a4", "alice", "pitfall", st, sb);
    assert_eq!(outcome(&sibling).0, "created", "{}", text(&sibling));
    assert_ne!(outcome(&sibling).1.as_deref(), Some(a.as_str()));

    // Bob cannot see alice's card: his copy of her exact text is a new card, his answer
    // names nothing of hers, and the server groups the two for the curators.
    let bob = env.store("b1", "bob", "pitfall", t0, b0);
    let bob_said = text(&bob);
    assert_eq!(outcome(&bob).0, "created", "{bob_said}");
    let b = outcome(&bob).1.unwrap();
    assert!(
        !bob_said.contains(&a) && !bob_said.contains("alice"),
        "{bob_said}"
    );
    let (_, details) = env.api(reqwest::Method::GET, &format!("/cards/{b}/details"), None);
    let members: Vec<&str> = details["card"]["duplicate_group"]["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no group: {details}"))
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(members, [a.as_str(), b.as_str()]);
    // The control: the group is the curators' view; alice's own card is untouched.
    let (_, mine) = env.api(reqwest::Method::GET, &format!("/cards/{a}/details"), None);
    assert_eq!(mine["card"]["summary"]["provenance"]["user_id"], "alice");

    // A verified card covers a lesson: the store names it, says it is verified, and says
    // how to read it.
    let runbook =
        std::fs::read_to_string(example_cards_dir().join(format!("runbooks/errors/{RUNBOOK}.md")))
            .unwrap();
    let body = mop_cards::card_body(runbook.as_bytes()).unwrap().to_owned();
    let covered = env.store(
        "c1",
        "carol",
        "error_resolution",
        "ORA-01555 snapshot too old during the nightly ETL.",
        &body.to_uppercase(),
    );
    let said = String::from_utf8_lossy(&covered.stdout).into_owned();
    assert_eq!(
        outcome(&covered),
        ("reinforced".into(), Some(RUNBOOK.into())),
        "{said}"
    );
    assert!(
        said.contains("A verified card already covers this lesson")
            && said.contains(&format!("mop memory get {RUNBOOK}")),
        "{said}"
    );

    // A merged card stands for the card it was merged into: its lesson reinforces that.
    let merged_text = (
        "Ledger ETL: watch the undo advisor",
        "Before the ledger ETL, check DBMS_UNDO_ADV.REQUIRED_RETENTION and the longest query in v$undostat; size undo for it.",
    );
    let x = env.store("c2", "carol", "pitfall", merged_text.0, merged_text.1);
    let x_id = outcome(&x).1.unwrap();
    let (code, body) = env.api(
        reqwest::Method::POST,
        &format!("/cards/{x_id}/merge"),
        Some(json!({"into": RUNBOOK}).to_string()),
    );
    assert_eq!(code, 200, "{body}");
    let later = env.store("c3", "carol", "pitfall", merged_text.0, merged_text.1);
    assert_eq!(
        outcome(&later),
        ("reinforced".into(), Some(RUNBOOK.into())),
        "{}",
        text(&later)
    );
}

#[test]
fn no_two_lessons_of_the_eval_merge_on_the_real_server() {
    // Every wording of every lesson of the eval, each from its own task of one author, as
    // the daemon sends them: a wording either reinforces its own lesson's card or makes a
    // new card, and never lands on another lesson's card.
    let server = Server::start_with(ROOMY);
    let node = server.token("node", &[WS]);
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let lessons = mop_testkit::lessons::load();
    assert!(lessons.len() >= 10 && lessons.iter().all(|l| l.wordings.len() >= 4));
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let (mut reinforced, mut stores) = (0, 0);
    for (li, l) in lessons.iter().enumerate() {
        for (wi, (title, body)) in l.wordings.iter().enumerate() {
            let r = mop_testkit::http()
                .post(format!("{}/v1/workspaces/{WS}/memories", server.url))
                .bearer_auth(&node)
                .json(&json!({
                    "provenance": {"task_id": format!("l{li}-w{wi}"), "user_id": "alice"},
                    "card": {"type": "pitfall", "title": title, "body": body}
                }))
                .send()
                .unwrap();
            let v: Value = r.json().unwrap();
            let id = v["id"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned();
            stores += 1;
            match v["outcome"].as_str().unwrap() {
                "created" => {
                    owner.entry(id.clone()).or_insert_with(|| l.id.clone());
                }
                "reinforced" => reinforced += 1,
                other => panic!("{other}: {v}"),
            }
            let of = owner
                .get(&id)
                .cloned()
                .unwrap_or_else(|| "an example card".into());
            assert_eq!(
                of, l.id,
                "wording {wi} of {} landed on a card of {of}",
                l.id
            );
        }
    }
    eprintln!("{reinforced} of {stores} stores reinforced a card of their own lesson");
    assert!(reinforced > 0);
}

#[test]
fn retrieve_lists_verified_matches_first_through_the_cli_and_mcp() {
    let Some(env) = setup(ROOMY, "") else { return };
    // Four unverified cards of alice's that match the query better than the runbook.
    for (i, fix) in [
        "shrink every batch to five thousand rows and commit after each one",
        "add a composite index on ledger entries by account and posting date",
        "split the long cursor into per day chunks driven from a work table",
        "run the heavy report queries against the standby replica instead",
    ]
    .iter()
    .enumerate()
    {
        let out = env.store(
            &format!("u{i}"),
            "alice",
            "pitfall",
            &format!("ORA-01555 undo retention note {i}"),
            &format!("ORA-01555 undo retention: {fix}."),
        );
        assert_eq!(outcome(&out).0, "created", "{}", text(&out));
    }
    env.daemon.sync(WS);
    let script = "mop memory retrieve 'ORA-01555 undo retention' --json --limit 5 > hits.json && \
        printf '%s\\n' \
        '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}' \
        '{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}' \
        '{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"memory_retrieve\",\"arguments\":{\"query\":\"ORA-01555 undo retention\",\"limit\":5}}}' \
        | (cat; sleep 2) | mop mcp > mcp.out";
    let w = env.workdir();
    let out = env.mop_run_in(&w, "reader", "alice", &[], script);
    assert!(out.status.success(), "{}", text(&out));
    let hits: Value =
        serde_json::from_str(&std::fs::read_to_string(w.path().join("hits.json")).unwrap())
            .unwrap();
    let order: Vec<(String, bool)> = hits["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["id"].as_str().unwrap().to_owned(),
                h["unverified"].as_bool().unwrap(),
            )
        })
        .collect();
    let first_unverified = order.iter().position(|(_, u)| *u).unwrap_or(order.len());
    assert!(
        order[..first_unverified]
            .iter()
            .any(|(id, _)| id == RUNBOOK),
        "{order:?}"
    );
    assert!(
        order[..first_unverified]
            .iter()
            .any(|(id, _)| id == CORRECTION),
        "{order:?}"
    );
    assert!(
        order[first_unverified..].iter().all(|(_, u)| *u),
        "verified after unverified: {order:?}"
    );
    // The control: alice's unverified cards are found too, after the verified ones.
    assert!(first_unverified < order.len(), "{order:?}");
    // MCP answers in the same order.
    let mcp = std::fs::read_to_string(w.path().join("mcp.out")).unwrap();
    let answer: Value = mcp
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["id"] == 2)
        .unwrap_or_else(|| panic!("no tools/call answer: {mcp}"));
    let ids: Vec<&str> = answer["result"]["structuredContent"]["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .map(|h| h["id"].as_str().unwrap())
        .collect();
    let cli: Vec<&str> = order.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, cli);
}

#[test]
fn a_rejected_lesson_does_not_come_back_until_a_curator_lifts_the_rejection() {
    let Some(env) = setup(ROOMY, "") else { return };
    let title = "Restart the primary to clear ORA-01555";
    let body = "When the nightly ETL fails with ORA-01555, restart the ledger primary; the error is gone after it comes back.";
    let first = env.store("r1", "alice", "error_resolution", title, body);
    let x = outcome(&first)
        .1
        .unwrap_or_else(|| panic!("{}", text(&first)));
    let (code, v) = env.api(
        reqwest::Method::POST,
        &format!("/cards/{x}/reject"),
        Some(
            json!({"reason": "a restart only hides it; see the ORA-01555 correction"}).to_string(),
        ),
    );
    assert_eq!(code, 200, "{v}");
    // The same words from a later task: refused, with when and why.
    let again = env.store("r2", "alice", "error_resolution", title, body);
    let said = text(&again);
    assert!(!again.status.success(), "{said}");
    assert!(
        said.contains("a curator rejected this lesson on")
            && said.contains("a restart only hides it"),
        "{said}"
    );
    // Near-identical text (case, punctuation, a word changed): refused too.
    let near = env.store(
        "r3",
        "alice",
        "pitfall",
        "restart the primary to clear ORA-01555.",
        "When the nightly ETL fails with ORA-01555, restart the ledger primary: the error is gone once it is back.",
    );
    assert!(!near.status.success(), "{}", text(&near));
    assert!(text(&near).contains("rejected"), "{}", text(&near));
    // The control: another lesson on the same error goes in.
    let other = env.store(
        "r4",
        "alice",
        "pitfall",
        "ORA-01555: the undo advisor says 4 h",
        "DBMS_UNDO_ADV.REQUIRED_RETENTION suggests 14400 s for the ledger; undo_retention is 10800.",
    );
    assert_eq!(outcome(&other).0, "created", "{}", text(&other));
    assert_eq!(env.titled("Restart the primary").len(), 1, "no new card");
    // The curator lifts the rejection; it is audited, and the lesson may come back.
    let (_, list) = env.api(reqwest::Method::GET, "/rejections", None);
    let rejection = list[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list[0]["card_id"], x.as_str());
    assert_eq!(list[0]["actor_name"], "Carol Curator");
    let (code, v) = env.api(
        reqwest::Method::POST,
        &format!("/rejections/{rejection}/lift"),
        None,
    );
    assert_eq!(code, 200, "{v}");
    let (_, history) = env.api(reqwest::Method::GET, &format!("/cards/{x}/history"), None);
    assert!(
        history
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["action"] == "lift-rejection"),
        "{history}"
    );
    let back = env.store("r5", "alice", "error_resolution", title, body);
    assert_eq!(outcome(&back).0, "created", "{}", text(&back));
}

#[test]
fn another_users_rejected_lesson_is_never_named_to_them_and_a_deleted_card_leaves_no_tombstone() {
    let Some(env) = setup(ROOMY, "") else { return };
    let title = "Personal: restart the primary to clear ORA-01555";
    let body = "When my nightly ETL fails with ORA-01555, I restart the ledger primary; the error is gone after it comes back.";
    // Alice's card, personal, rejected with a reason that names her.
    let mut a = vec![OsStr::new("memory")];
    a.extend(
        [
            "store",
            "--type",
            "pitfall",
            "--title",
            title,
            "--personal",
            "--content-stdin",
        ]
        .map(OsStr::new),
    );
    let mut cmd = as_runner(&a);
    // What `mop run` sets inside the sandbox: `--personal` binds to the task's user.
    cmd.env(
        "MOP_AGENT_SOCKET",
        env.prepare("n1", "alice")["agent_socket"].as_str().unwrap(),
    )
    .env("MOP_TASK_USER", "alice");
    let first = mop_testkit::procs::run_with_stdin(&mut cmd, body.as_bytes());
    let x = outcome(&first)
        .1
        .unwrap_or_else(|| panic!("{}", text(&first)));
    let (code, v) = env.api(
        reqwest::Method::POST,
        &format!("/cards/{x}/reject"),
        Some(json!({"reason": "alice's runbook note; a restart hides it"}).to_string()),
    );
    assert_eq!(code, 200, "{v}");
    // Bob stores the same words: created, and his answer names no rejection and no reason.
    let bob = env.store("n2", "bob", "pitfall", title, body);
    let said = text(&bob);
    assert_eq!(outcome(&bob).0, "created", "{said}");
    assert!(
        !said.contains("rejected") && !said.contains("alice"),
        "{said}"
    );
    // The curators see the mark on his card.
    let y = outcome(&bob).1.unwrap();
    let (_, details) = env.api(reqwest::Method::GET, &format!("/cards/{y}/details"), None);
    // Nor do his later stores of it answer otherwise than with no rejection at all: his
    // next task reinforces his own card once, then is told it already counted (a
    // rejection that changed the outcome would confirm his guess of what was rejected).
    let plan = env.prepare("n2b", "bob");
    let again = env.agent_store(&plan, title, body);
    assert_eq!(
        outcome(&again),
        ("reinforced".to_owned(), Some(y.clone())),
        "{}",
        text(&again)
    );
    let thrice = env.agent_store(&plan, title, body);
    assert_eq!(outcome(&thrice).0, "unchanged", "{}", text(&thrice));
    assert_eq!(
        details["card"]["previously_rejected"]["reason"],
        "alice's runbook note; a restart hides it"
    );
    // The control: alice's own repeat is refused with the reason.
    let again = env.agent_store(&env.prepare("n3", "alice"), title, body);
    assert!(
        text(&again).contains("a curator rejected this lesson"),
        "{}",
        text(&again)
    );
    // Deleted for good, the card takes its tombstone with it.
    let (code, v) = env.api(
        reqwest::Method::DELETE,
        &format!("/cards/{x}?reason=personal%20data"),
        None,
    );
    assert_eq!(code, 200, "{v}");
    let (_, list) = env.api(reqwest::Method::GET, "/rejections", None);
    assert_eq!(list.as_array().unwrap().len(), 0, "{list}");
    let back = env.agent_store(&env.prepare("n4", "alice"), title, body);
    assert_eq!(outcome(&back).0, "created", "{}", text(&back));
}

#[test]
fn an_idempotency_key_belongs_to_one_task() {
    let server = Server::start_with(ROOMY);
    let node = server.token("node", &[WS]);
    let send = |task: &str, title: &str| {
        let r = mop_testkit::http()
            .post(format!("{}/v1/workspaces/{WS}/memories", server.url))
            .bearer_auth(&node)
            .header("idempotency-key", "5f0c0d6a-1111-4222-8333-944455556666")
            .json(&json!({
                "provenance": {"task_id": task, "user_id": "alice"},
                "card": {"type": "pitfall", "title": title, "body": format!("{title}: the details of it.")}
            }))
            .send()
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    };
    let (code, first) = send("k1", "First lesson of the key");
    assert_eq!(code, 201, "{first}");
    // The same store again: its first answer, nothing new.
    let (code, again) = send("k1", "First lesson of the key");
    assert_eq!((code, &again["id"]), (200, &first["id"]), "{again}");
    // Another task's store under that key: refused, and told nothing of the first.
    let (code, other) = send("k2", "Another lesson entirely");
    assert_eq!(code, 409, "{other}");
    assert!(
        !other.to_string().contains(first["id"].as_str().unwrap()),
        "{other}"
    );
}

#[test]
fn a_server_set_to_queue_rejected_lessons_marks_them_for_the_curator() {
    let config = format!("{ROOMY}[intake]\non_rejected = \"queue\"\n");
    let Some(env) = setup(&config, "") else {
        return;
    };
    let title = "Restart the primary to clear ORA-01555";
    let body = "When the nightly ETL fails with ORA-01555, restart the ledger primary; the error is gone after it comes back.";
    let x = outcome(&env.store("q1", "alice", "error_resolution", title, body))
        .1
        .unwrap();
    let (code, v) = env.api(
        reqwest::Method::POST,
        &format!("/cards/{x}/reject"),
        Some(json!({"reason": "a restart only hides it"}).to_string()),
    );
    assert_eq!(code, 200, "{v}");
    let again = env.store("q2", "alice", "error_resolution", title, body);
    let said = text(&again);
    assert_eq!(outcome(&again).0, "created", "{said}");
    assert!(
        said.contains("previously rejected") && said.contains("a restart only hides it"),
        "{said}"
    );
    let y = outcome(&again).1.unwrap();
    let (_, queue) = env.api(reqwest::Method::GET, "/review", None);
    let item = queue["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["card"]["summary"]["id"] == y.as_str())
        .unwrap_or_else(|| panic!("{queue}"));
    assert_eq!(
        item["card"]["previously_rejected"]["reason"],
        "a restart only hides it"
    );
    // The control: an unrelated card in the queue carries no mark.
    let other = outcome(&env.store(
        "q3",
        "alice",
        "pitfall",
        "Check the undo advisor first",
        "DBMS_UNDO_ADV before changing retention.",
    ))
    .1
    .unwrap();
    let (_, queue) = env.api(reqwest::Method::GET, "/review", None);
    let item = queue["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["card"]["summary"]["id"] == other.as_str())
        .unwrap();
    assert!(item["card"].get("previously_rejected").is_none(), "{item}");
}

#[test]
fn stores_during_an_outage_are_queued_and_land_once_when_the_server_is_back() {
    let Some(mut env) = setup(ROOMY, "[spool]\nretry_max_secs = 1\n") else {
        return;
    };
    let plan = env.prepare("outage-1", "alice");
    env.server.stop();
    // Answered `queued`, with an id, and kept on disk.
    let out = env.agent_store(
        &plan,
        "Outage lesson one",
        "Rotate the ETL logs before the run.",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(outcome(&out).0, "queued", "{}", text(&out));
    let first = store_id(&out);
    assert!(
        text(&out).contains(&format!("mop memory store-status {first}")),
        "{}",
        text(&out)
    );
    // A sandboxed task's store is queued the same way, behind it.
    let sandboxed = env.store(
        "outage-2",
        "alice",
        "pitfall",
        "Outage lesson two",
        "Grow undo before the run.",
    );
    assert_eq!(outcome(&sandboxed).0, "queued", "{}", text(&sandboxed));
    // A credential is refused at once, as the server would, rather than kept on this
    // host's disk while the server is away.
    let secret = "ghp_Zq8Rk2Vn6Tw0Ym4Xp1Ls5Hd9Jf3Gc7Bb2Na6Ke";
    let leaked = env.agent_store(
        &plan,
        "Outage token",
        &format!("The job pushes with {secret}."),
    );
    assert!(!leaked.status.success(), "{}", text(&leaked));
    assert!(
        text(&leaked).contains("github-pat") && !text(&leaked).contains(secret),
        "{}",
        text(&leaked)
    );
    assert!(
        !all_bytes(env.daemon.dir.path())
            .iter()
            .any(|(_, b)| contains(b, secret)),
        "the credential is on the host's disk"
    );
    let s = env.status();
    assert_eq!(s["stores"]["queued"], 2, "{}", s["stores"]);
    assert!(s["stores"]["bytes"].as_u64().unwrap() > 0);
    assert!(s["stores"]["oldest_queued_at"].is_string());
    let human = String::from_utf8_lossy(&run(&mut env.daemon.ctl(&["status"])).stdout).into_owned();
    assert!(human.contains("2 waiting for the server"), "{human}");
    let follow = env.agent(&plan, &["store-status", &first], None);
    assert!(
        String::from_utf8_lossy(&follow.stdout).starts_with("queued:"),
        "{}",
        text(&follow)
    );
    // Another task cannot follow it.
    let other = env.prepare("outage-3", "alice");
    let foreign = env.agent(&other, &["store-status", &first], None);
    assert!(!foreign.status.success(), "{}", text(&foreign));

    env.server.start_again();
    env.wait_queue_empty(Duration::from_secs(30));
    assert_eq!(env.titled("Outage lesson one").len(), 1);
    assert_eq!(env.titled("Outage lesson two").len(), 1);
    let follow = env.agent(&plan, &["store-status", &first, "--json"], None);
    let st: Value =
        serde_json::from_slice(&follow.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&follow)));
    assert_eq!(
        (st["state"].as_str(), st["outcome"].as_str()),
        (Some("stored"), Some("created")),
        "{st}"
    );
    assert_eq!(
        st["id"].as_str(),
        env.titled("Outage lesson one").first().map(String::as_str)
    );
    // The receipt followed it: queued, then what the server did.
    let r = run(&mut as_runner(&[
        OsStr::new("receipt"),
        OsStr::new("outage-2"),
        OsStr::new("--socket"),
        env.daemon.socket().as_os_str(),
        OsStr::new("--json"),
    ]));
    let r: Value = serde_json::from_slice(&r.stdout).unwrap();
    let event = &r["activity"]["stores"][0];
    assert_eq!(event["outcome"], "created", "{r}");
    assert!(event["store_id"].is_string());
    assert_eq!(env.status()["stores"]["sent"], 2);
}

#[test]
fn a_store_whose_answer_was_lost_and_queued_stores_after_a_kill_9_each_land_exactly_once() {
    let (_, _) = match runner_user() {
        Some(ug) => ug,
        None => return,
    };
    if !bwrap_available() {
        return;
    }
    let server = Server::start_with(ROOMY);
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let admin = server.token_named("admin", &[WS], Some("Carol Curator"));
    let proxy = FaultyProxy::start(&server.url);
    let extra = format!("{}\n[spool]\nretry_max_secs = 1\n", profiles_config(&[]));
    let urls = [proxy.url.as_str()];
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            extra: &extra,
            urls: &urls,
            offline_recheck_secs: 1,
            ..Default::default()
        },
    );
    daemon.wait_synced();
    let mut env = Env {
        world: World::around(server, daemon, admin, &[WS]),
    };
    // The server applies the store and the answer is lost on the way back: the daemon
    // cannot know, so it queues the store and replays it with the same key.
    proxy.set(Fault::LoseStoreAnswers);
    let plan = env.prepare("lost-1", "alice");
    let out = env.agent_store(
        &plan,
        "Lost answer lesson",
        "Pin the ETL to the standby after 02:00.",
    );
    assert_eq!(outcome(&out).0, "queued", "{}", text(&out));
    assert_eq!(
        env.titled("Lost answer lesson").len(),
        1,
        "it reached the server"
    );
    proxy.set(Fault::None);
    env.wait_queue_empty(Duration::from_secs(30));
    assert_eq!(env.titled("Lost answer lesson").len(), 1, "exactly once");
    let follow = env.agent(&plan, &["store-status", &store_id(&out), "--json"], None);
    let st: Value = serde_json::from_slice(&follow.stdout).unwrap();
    assert_eq!(st["outcome"], "created", "the first answer again: {st}");
    assert_eq!(
        st["id"].as_str(),
        env.titled("Lost answer lesson").first().map(String::as_str)
    );

    // Stores queued while the server is down survive a kill -9 of the daemon.
    env.server.stop();
    for i in 0..3 {
        let out = env.store(
            &format!("k{i}"),
            "alice",
            "pitfall",
            &format!("Killed daemon lesson {i}"),
            &format!("Step {i} of the ETL recovery."),
        );
        assert_eq!(outcome(&out).0, "queued", "{}", text(&out));
    }
    env.daemon.kill9();
    env.daemon.spawn();
    assert_eq!(env.status()["stores"]["queued"], 3);
    env.server.start_again();
    env.wait_queue_empty(Duration::from_secs(30));
    for i in 0..3 {
        assert_eq!(
            env.titled(&format!("Killed daemon lesson {i}")).len(),
            1,
            "store {i}"
        );
    }
    // Sent in the order they were made.
    let (_, history) = env.api(reqwest::Method::GET, "/history", None);
    let stored: Vec<String> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["action"] == "store")
        .filter_map(|h| h["detail"].as_str().map(str::to_owned))
        .filter(|d| d.starts_with("task=k"))
        .collect();
    assert_eq!(
        stored.iter().map(|d| &d[..7]).collect::<Vec<_>>(),
        ["task=k0", "task=k1", "task=k2"]
    );
}

#[test]
fn a_replica_failing_mid_replay_leaves_every_store_exactly_once() {
    let Some(_) = runner_user() else {
        return;
    };
    if !bwrap_available() {
        return;
    }
    let pg = Postgres::start()
        .expect("PostgreSQL is not installed: apt-get install postgresql (CI installs it)");
    let mut a = Server::on_postgres(&pg.url(), ROOMY);
    let b = Server::on_postgres(&pg.url(), ROOMY);
    let out = run(&mut a.cli(&[
        OsStr::new("import"),
        example_cards_dir().as_os_str(),
        OsStr::new("--workspace"),
        OsStr::new(WS),
    ]));
    assert!(out.status.success(), "{}", text(&out));
    let admin = a.token_named("admin", &[WS], Some("Carol Curator"));
    let proxy = FaultyProxy::start(&a.url);
    let extra = format!("{}\n[spool]\nretry_max_secs = 1\n", profiles_config(&[]));
    let urls = [proxy.url.as_str(), b.url.as_str()];
    let daemon = Daemon::start(
        &a,
        DaemonOptions {
            extra: &extra,
            urls: &urls,
            offline_recheck_secs: 1,
            ..Default::default()
        },
    );
    daemon.wait_synced();
    // The test reads through replica B: A dies below.
    let env = Env {
        world: World::around(b, daemon, admin, &[WS]),
    };
    // The database restarts: both replicas answer 503, and every store is queued.
    pg.stop();
    let mut answers = Vec::new();
    for i in 0..6 {
        let out = env.store(
            &format!("f{i}"),
            "alice",
            "pitfall",
            &format!("Failover lesson {i}"),
            &format!("Failover step {i}."),
        );
        let (word, _) = outcome(&out);
        assert!(word == "queued" || word == "created", "{}", text(&out));
        answers.push(word);
    }
    assert!(answers.iter().all(|w| w == "queued"), "{answers:?}");
    // Back, but replica A applies each store and loses its answer, then dies mid-replay:
    // the daemon goes on to B with the same keys.
    pg.start_again();
    proxy.set(Fault::LoseStoreAnswers);
    let start = Instant::now();
    while env.titled("Failover lesson").len() < 2 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    a.kill9();
    env.wait_queue_empty(Duration::from_secs(60));
    for i in 0..6 {
        let ids = env.titled(&format!("Failover lesson {i}"));
        assert_eq!(ids.len(), 1, "store {i} once: {ids:?}");
    }
    let s = env.status();
    assert_eq!(s["stores"]["sent"], 6, "{}", s["stores"]);
    assert!(
        s["stores"]["refused"].as_array().unwrap().is_empty(),
        "{}",
        s["stores"]
    );
}

#[test]
fn the_queue_is_bounded_and_old_stores_are_dropped_and_counted() {
    let Some(mut env) = setup(
        ROOMY,
        "[spool]\nmax_per_task = 2\nmax_age_secs = 2\nretry_max_secs = 1\n",
    ) else {
        return;
    };
    let plan = env.prepare("bounded", "alice");
    env.server.stop();
    for i in 0..2 {
        let out = env.agent_store(&plan, &format!("Bounded {i}"), "text");
        assert_eq!(outcome(&out).0, "queued", "{}", text(&out));
    }
    let third = env.agent_store(&plan, "Bounded 2", "text");
    assert!(!third.status.success(), "{}", text(&third));
    assert!(
        text(&third).contains("spool.max_per_task"),
        "{}",
        text(&third)
    );
    // The control: another task still has room.
    let other = env.prepare("bounded-2", "alice");
    let out = env.agent_store(&other, "Bounded other", "text");
    assert_eq!(outcome(&out).0, "queued", "{}", text(&out));
    // Past spool.max_age_secs they are dropped: logged, counted, and followable.
    let first = store_id(&out);
    let start = Instant::now();
    while env.status()["stores"]["dropped"] != 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            env.status()["stores"]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    env.daemon.wait_log("a queued store was dropped unsent");
    let follow = env.agent(&other, &["store-status", &first], None);
    assert!(
        String::from_utf8_lossy(&follow.stdout).starts_with("dropped:"),
        "{}",
        text(&follow)
    );
    env.server.start_again();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        env.titled("Bounded").is_empty(),
        "nothing dropped was sent later"
    );
}

#[test]
fn with_an_embedding_model_the_server_reinforces_a_paraphrase_that_words_alone_miss() {
    use mop_intake::lesson::Thresholds;
    use mop_testkit::lessons::{items, load};
    // A pair of one lesson's wordings that words alone tell apart and the model does not.
    let model_dir = mop_testkit::embedding_model_dir();
    let model = mop_embed::Model::load(&model_dir).expect("the model loads");
    let lessons = load();
    let with = items(&lessons, "test", Some(&model));
    let words = Thresholds {
        dense_cosine: 2.0,
        ..Thresholds::default()
    };
    let (a, b) = with
        .iter()
        .enumerate()
        .flat_map(|(i, a)| with[i + 1..].iter().map(move |b| (a, b)))
        .find(|(a, b)| {
            a.0 == b.0
                && a.2.same_as(&b.2, &words).is_none()
                && a.2.same_as(&b.2, &Thresholds::default()).is_some()
        })
        .expect("the eval has such a pair");
    let text = |item: &(&str, usize, mop_intake::lesson::Lesson)| {
        lessons.iter().find(|l| l.id == item.0).unwrap().wordings[item.1].clone()
    };
    let ((t1, b1), (t2, b2)) = (text(a), text(b));
    let store = |server: &Server, node: &str, task: &str, title: &str, body: &str| -> Value {
        mop_testkit::http()
            .post(format!("{}/v1/workspaces/{WS}/memories", server.url))
            .bearer_auth(node)
            .json(&json!({
                "provenance": {"task_id": task, "user_id": "alice"},
                "card": {"type": "pitfall", "title": title, "body": body}
            }))
            .send()
            .unwrap()
            .json()
            .unwrap()
    };
    let config = format!("[intake]\nembedding_model = \"{}\"\n", model_dir.display());
    for (with_model, expected) in [(true, "reinforced"), (false, "created")] {
        let server = Server::start_with(if with_model { &config } else { "" });
        let node = server.token("node", &[WS]);
        let first = store(&server, &node, "p1", &t1, &b1);
        assert_eq!(first["outcome"], "created", "{first}");
        let second = store(&server, &node, "p2", &t2, &b2);
        assert_eq!(second["outcome"], expected, "model {with_model}: {second}");
        if with_model {
            assert_eq!(second["id"], first["id"]);
            assert!(
                server.log().contains("compares meaning too"),
                "{}",
                server.log()
            );
        }
    }
}
