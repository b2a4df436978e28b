//! Isolation as a control experiment (DESIGN.md): a unique marker card stored as user A on
//! asset X must be in A's views and answers on X, and absent from user B's, from asset Y's
//! and from another workspace's, through every way a task can look (the plan, the view's
//! files, MEMORY.md, `mop memory list`, `retrieve` and `get` by id); B's selection must not
//! change. Stores go through the agent socket, as an agent's would. Runners are the
//! unprivileged user `moprunner`; the real mop-server and mopd run on loopback.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Output;

use mop_testkit::card_files;
use mop_testkit::procs::output_text as text;
use mop_testkit::procs::{as_runner, run, runner_socket_request};
use mop_testkit::world::World;
use serde_json::{Value, json};

const MARKER: &str = "zqvmarker7731";

mop_testkit::world_env! {
    /// The world of these tests: two workspaces of the example cards; tasks are prepared, not
    /// run, so no sandbox is needed.
    Env {}
}

fn setup() -> Option<Env> {
    let world = World::builder()
        .workspaces(&["acme", "globex"])
        .without_sandbox()
        .start()?;
    Some(Env { world })
}

/// What one task can see, gathered every way a task can look.
struct Seen {
    plan: Value,
    /// Card ids in the plan.
    planned: BTreeSet<String>,
    /// Card ids of the files in the view directory.
    files: BTreeSet<String>,
    memory_md: String,
    listed: String,
    retrieved: Value,
}

impl Env {
    fn prepare(&self, ws: &str, task: &str, user: &str, asset: &str) -> Seen {
        let socket = self.daemon.socket();
        let title = format!("Check {MARKER} before the nightly ETL");
        let args: Vec<&OsStr> = [
            "prepare",
            "--socket",
            socket.to_str().unwrap(),
            "--workspace",
            ws,
            "--task-id",
            task,
            "--user",
            user,
            "--asset",
            asset,
            "--title",
            &title,
            "--json",
        ]
        .into_iter()
        .map(OsStr::new)
        .collect();
        let out = run(&mut as_runner(&args));
        assert!(out.status.success(), "{}", text(&out));
        let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
        let planned = plan["cards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect();
        let view = PathBuf::from(plan["view_dir"].as_str().unwrap());
        let files = card_files(&view)
            .iter()
            .filter_map(|p| {
                let name = p.file_name()?.to_str()?;
                name.strip_suffix(".md")
                    .filter(|n| *n != "MEMORY")
                    .map(str::to_owned)
            })
            .collect();
        let memory_md = std::fs::read_to_string(plan["memory_md"].as_str().unwrap()).unwrap();
        let listed = self.agent(&plan, &["list", "--json"]);
        assert!(listed.status.success(), "{}", text(&listed));
        let retrieved = self.agent(&plan, &["retrieve", MARKER, "--json", "--limit", "50"]);
        assert!(retrieved.status.success(), "{}", text(&retrieved));
        Seen {
            planned,
            files,
            memory_md,
            listed: String::from_utf8_lossy(&listed.stdout).into_owned(),
            retrieved: serde_json::from_slice(&retrieved.stdout).unwrap(),
            plan,
        }
    }

    /// `mop memory <args>` as the runner, inside the task (its agent socket).
    fn agent(&self, plan: &Value, args: &[&str]) -> Output {
        let mut a = vec![OsStr::new("memory")];
        a.extend(args.iter().map(OsStr::new));
        let mut cmd = as_runner(&a);
        cmd.env("MOP_AGENT_SOCKET", plan["agent_socket"].as_str().unwrap());
        run(&mut cmd)
    }

    fn release(&self, task: &str) {
        let socket = self.daemon.socket();
        let out = run(&mut as_runner(&[
            OsStr::new("release"),
            OsStr::new("--socket"),
            socket.as_os_str(),
            OsStr::new("--task-id"),
            OsStr::new(task),
        ]));
        assert!(out.status.success(), "{}", text(&out));
    }

    /// Stores a card through the agent socket of alice's task on db-prod-01; returns its id.
    fn store(&self, plan: &Value, title: &str, body: &str, flags: &[&str]) -> String {
        let mut args = vec![
            "store",
            "--type",
            "pitfall",
            "--title",
            title,
            "--label",
            MARKER,
            "--content-stdin",
        ];
        args.extend(flags);
        let mut a = vec![OsStr::new("memory")];
        a.extend(args.iter().map(OsStr::new));
        let mut cmd = as_runner(&a);
        // What `mop run` sets inside the sandbox; the daemon checks it against the task.
        cmd.env("MOP_AGENT_SOCKET", plan["agent_socket"].as_str().unwrap())
            .env("MOP_TASK_USER", "alice")
            .env("MOP_TASK_ASSET", "db-prod-01");
        let out =
            mop_testkit::procs::run_with_stdin(&mut cmd, format!("{MARKER}: {body}\n").as_bytes());
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.starts_with("created:"), "{stdout}");
        stdout
            .split('(')
            .nth(1)
            .unwrap()
            .split(')')
            .next()
            .unwrap()
            .to_owned()
    }

    fn revision(&self, ws: &str) -> u64 {
        self.server.revision(ws, &self.node)
    }

    fn server_has(&self, ws: &str, id: &str) -> bool {
        let r = mop_testkit::http()
            .get(format!("{}/v1/workspaces/{ws}/cards/{id}", self.server.url))
            .bearer_auth(&self.admin)
            .send()
            .unwrap();
        r.status().is_success()
    }
}

impl Seen {
    /// Whether card `id` reaches this task in any way, and through which.
    fn ways(&self, env: &Env, id: &str) -> Vec<&'static str> {
        let mut ways = Vec::new();
        if self.planned.contains(id) {
            ways.push("plan");
        }
        if self.files.contains(id) {
            ways.push("view file");
        }
        if self.memory_md.contains(id) {
            ways.push("MEMORY.md");
        }
        if self.listed.contains(id) {
            ways.push("list");
        }
        if self.retrieved["hits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["id"] == id)
        {
            ways.push("retrieve");
        }
        if env.agent(&self.plan, &["get", id]).status.success() {
            ways.push("get");
        }
        ways
    }
}

const ALL_WAYS: [&str; 6] = ["plan", "view file", "MEMORY.md", "list", "retrieve", "get"];

#[test]
fn a_marker_card_reaches_its_user_and_asset_and_nobody_else() {
    let Some(env) = setup() else { return };

    // Before: what bob on the same asset, and alice on another asset, are given.
    let bob_before = env.prepare("acme", "bob-before", "bob", "db-prod-01");
    env.release("bob-before");

    // Alice's task on db-prod-01 stores two marker cards through its agent socket: one bound
    // to her and the asset, one unbound (an unverified agent card reaches only its author).
    let writer = env.prepare("acme", "alice-writer", "alice", "db-prod-01");
    let bound = env.store(
        &writer.plan,
        &format!("{MARKER} undo sizing for the ledger"),
        "the ledger job needs a larger undo tablespace.",
        &["--personal", "--asset"],
    );
    // Another lesson (the same one would reinforce the first card).
    let unbound = env.store(
        &writer.plan,
        &format!("{MARKER} ledger job checklist"),
        "before the job: stop the replica, run it, compare row counts after.",
        &[],
    );
    env.release("alice-writer");
    assert!(env.server_has("acme", &bound) && env.server_has("acme", &unbound));
    assert!(!env.server_has("globex", &bound) && !env.server_has("globex", &unbound));
    env.daemon.sync("acme");

    let alice_x = env.prepare("acme", "alice-x", "alice", "db-prod-01");
    let alice_y = env.prepare("acme", "alice-y", "alice", "pg-orders-01");
    let bob_x = env.prepare("acme", "bob-x", "bob", "db-prod-01");
    let alice_globex = env.prepare("globex", "alice-globex", "alice", "db-prod-01");

    // Present where it belongs, by every way of looking…
    assert_eq!(alice_x.ways(&env, &bound), ALL_WAYS, "alice on db-prod-01");
    assert_eq!(
        alice_x.ways(&env, &unbound),
        ALL_WAYS,
        "alice's own agent card"
    );
    assert_eq!(
        alice_y.ways(&env, &unbound),
        ALL_WAYS,
        "unbound: alice anywhere"
    );
    // …and absent everywhere else.
    let none: [&str; 0] = [];
    assert_eq!(
        alice_y.ways(&env, &bound),
        none,
        "asset-bound: not on pg-orders-01"
    );
    assert_eq!(bob_x.ways(&env, &bound), none, "user-bound: not bob's");
    assert_eq!(
        bob_x.ways(&env, &unbound),
        none,
        "unverified: only its author"
    );
    assert_eq!(alice_globex.ways(&env, &bound), none, "another workspace");
    assert_eq!(alice_globex.ways(&env, &unbound), none, "another workspace");
    // Nothing of the marker text reaches bob or the other workspace at all.
    for seen in [&bob_x, &alice_globex] {
        assert!(!seen.memory_md.contains(MARKER), "{}", seen.memory_md);
        assert_eq!(seen.retrieved["hits"].as_array().unwrap().len(), 0);
    }
    assert!(alice_x.memory_md.contains(MARKER));

    // Bob's selection did not change: same cards, same tiers, same MEMORY.md apart from
    // the task id and revision lines.
    assert_eq!(bob_x.plan["cards"], bob_before.plan["cards"]);
    let strip = |md: &str, task: &str| md.replace(task, "T");
    let lines = |md: String| -> Vec<String> {
        md.lines()
            .filter(|l| !l.contains("revision"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        lines(strip(&bob_x.memory_md, "bob-x")),
        lines(strip(&bob_before.memory_md, "bob-before"))
    );
}

#[test]
fn a_task_cannot_store_a_card_for_another_user_asset_or_workspace() {
    let Some(env) = setup() else { return };
    let alice = env.prepare("globex", "alice-forger", "alice", "db-prod-01");
    let socket = PathBuf::from(alice.plan["agent_socket"].as_str().unwrap());
    let before = (env.revision("acme"), env.revision("globex"));
    // The requests come from the task's owner, as its agent's would.
    let store = |scope: Value| {
        let body = json!({"card": {"type": "fact", "title": format!("{MARKER} forged"), "body": "x", "scope": scope}});
        runner_socket_request(
            &socket,
            "POST",
            "/v1/store",
            Some(&serde_json::to_vec(&body).unwrap()),
        )
    };
    for scope in [
        json!({"user_id": "bob"}),
        json!({"asset_id": "pg-orders-01"}),
        json!({"user_id": "alice", "asset_id": "pg-orders-01"}),
        json!({"user_id": "bob", "asset_id": "db-prod-01"}),
    ] {
        let (code, body) = store(scope.clone());
        assert_eq!(code, 403, "{scope}: {}", String::from_utf8_lossy(&body));
    }
    // A workspace cannot be named at all: the request has no such field.
    let body = json!({"card": {"type": "fact", "title": "t", "body": "x"}, "workspace": "acme"});
    let (code, _) = runner_socket_request(
        &socket,
        "POST",
        "/v1/store",
        Some(&serde_json::to_vec(&body).unwrap()),
    );
    assert_eq!(code, 400);
    assert_eq!(
        (env.revision("acme"), env.revision("globex")),
        before,
        "no refused store changed either workspace"
    );
    // Control: the same socket's own store lands in its own workspace only.
    let (code, body) = store(json!({"user_id": "alice", "asset_id": "db-prod-01"}));
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let id = serde_json::from_slice::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(env.server_has("globex", &id));
    assert!(!env.server_has("acme", &id));
    assert_eq!(env.revision("acme"), before.0);
}

/// The side channel: retrieve scores computed over the whole index tell a task whether a
/// word occurs in cards it cannot see. Bob's answers must not move when alice's personal
/// cards full of his query words arrive, and a word found only in them must answer like a
/// word found nowhere. The control: alice's own task finds them by that word.
#[test]
fn retrieve_answers_do_not_depend_on_cards_the_task_cannot_see() {
    let Some(env) = setup() else { return };
    let retrieve = |plan: &Value, query: &str| -> Value {
        let out = env.agent(plan, &["retrieve", query, "--json", "--limit", "50"]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let queries = ["ledger undo retention", "nightly ETL snapshot too old"];
    let bob_1 = env.prepare("acme", "bob-1", "bob", "db-prod-01");
    let before: Vec<Value> = queries
        .iter()
        .map(|q| retrieve(&bob_1.plan, q)["hits"].clone())
        .collect();
    env.release("bob-1");

    let alice = env.prepare("acme", "alice-secret", "alice", "db-prod-01");
    // Three lessons (with words of their own each: the same lesson would be one card).
    let own = [
        "alpha bravo charlie delta echo",
        "foxtrot golf hotel india juliet",
        "kilo lima mike november oscar",
    ];
    for (n, words) in own.iter().enumerate() {
        let title = format!("Ledger undo retention notes zqhiddenword {n}");
        let mut cmd = as_runner(
            &[
                "memory",
                "store",
                "--type",
                "pitfall",
                "--title",
                &title,
                "--personal",
                "--content-stdin",
            ]
            .map(OsStr::new),
        );
        cmd.env(
            "MOP_AGENT_SOCKET",
            alice.plan["agent_socket"].as_str().unwrap(),
        )
        .env("MOP_TASK_USER", "alice");
        let body = format!("ledger undo retention nightly ETL snapshot zqhiddenword {words} ")
            .repeat(30 + n);
        let out = mop_testkit::procs::run_with_stdin(&mut cmd, body.as_bytes());
        assert!(out.status.success(), "{}", text(&out));
    }
    env.release("alice-secret");
    env.daemon.sync("acme");

    let bob_2 = env.prepare("acme", "bob-2", "bob", "db-prod-01");
    assert_ne!(bob_2.plan["revision"], bob_1.plan["revision"]);
    for (q, was) in queries.iter().zip(&before) {
        assert_eq!(
            &retrieve(&bob_2.plan, q)["hits"],
            was,
            "{q:?}: bob's hits or scores moved when alice's hidden cards arrived"
        );
    }
    let hidden = retrieve(&bob_2.plan, "ledger zqhiddenword");
    let nowhere = retrieve(&bob_2.plan, "ledger zqnowhereword");
    assert_eq!(
        hidden, nowhere,
        "a hidden word answers like a word found nowhere"
    );
    assert_eq!(
        retrieve(&bob_2.plan, "zqhiddenword"),
        retrieve(&bob_2.plan, "zqnowhereword")
    );
    // Control: where the cards are visible, the same probe finds them.
    let alice_2 = env.prepare("acme", "alice-2", "alice", "db-prod-01");
    let found = retrieve(&alice_2.plan, "zqhiddenword");
    assert_eq!(found["hits"].as_array().unwrap().len(), 3, "{found}");
    assert_ne!(
        retrieve(&alice_2.plan, "ledger zqhiddenword"),
        retrieve(&alice_2.plan, "ledger zqnowhereword")
    );
}
