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
        self.prepare_with(ws, task, user, asset, &[])
    }

    /// [`Env::prepare`] with more flags (`--project`, `--agent`).
    fn prepare_with(&self, ws: &str, task: &str, user: &str, asset: &str, more: &[&str]) -> Seen {
        let title = format!("Check {MARKER} before the nightly ETL");
        self.prepare_titled(ws, task, user, asset, &title, more)
    }

    /// The tier card `id` has in a task of `ws` whose text matches no card of this file's
    /// (so that a baseline card stays in L0), prepared and released.
    fn tier_unmatched(&self, ws: &str, user: &str, more: &[&str], id: &str) -> Option<String> {
        let task = format!("tier-{}", id_tail(id));
        let seen = self.prepare_titled(ws, &task, user, "db-prod-01", "Routine upkeep", more);
        self.release(&task);
        seen.plan["cards"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .map(|c| c["tier"].as_str().unwrap().to_owned())
    }

    fn prepare_titled(
        &self,
        ws: &str,
        task: &str,
        user: &str,
        asset: &str,
        title: &str,
        more: &[&str],
    ) -> Seen {
        let socket = self.daemon.socket();
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
            title,
            "--json",
        ]
        .into_iter()
        .chain(more.iter().copied())
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
        self.store_in(plan, None, title, body, flags)
    }

    /// [`Env::store`] from a task of `project`.
    fn store_in(
        &self,
        plan: &Value,
        project: Option<&str>,
        title: &str,
        body: &str,
        flags: &[&str],
    ) -> String {
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
        if let Some(p) = project {
            cmd.env("MOP_TASK_PROJECT", p);
        }
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

    /// A verified card a curator creates in `ws` with `mop-curate create <flags>`; its id.
    fn curated(&self, ws: &str, title: &str, flags: &[&str]) -> String {
        let mut args = vec!["create", "--title", title, "--body-file", "-"];
        args.extend(flags);
        let mut cmd = self.curate(&args);
        cmd.env("MOP_WORKSPACE", ws);
        let out = mop_testkit::procs::run_with_stdin(
            &mut cmd,
            format!("{MARKER}: {title}.\n").as_bytes(),
        );
        assert!(out.status.success(), "{}", text(&out));
        let said = String::from_utf8_lossy(&out.stdout);
        said.split("created card ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("no id in {said}"))
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

/// A task id made of a card id (its last part), unique per card.
fn id_tail(id: &str) -> &str {
    id.rsplit('-').next().unwrap_or(id)
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

/// Project and agent-kind scope, as a control experiment: each bound card reaches the
/// tasks of its project (or agent) by every way of looking, and no task of another project
/// or agent, nor one that names none. An agent's store binds to its own project only.
#[test]
fn project_and_agent_cards_reach_their_tasks_only() {
    let Some(env) = setup() else { return };
    let none: [&str; 0] = [];
    let project = env.curated(
        "acme",
        &format!("{MARKER} billing deploys need two approvals"),
        &["--type", "preference", "--project", "billing"],
    );
    let project_asset = env.curated(
        "acme",
        &format!("{MARKER} billing's ledger tables live on db-prod-01"),
        &[
            "--type",
            "fact",
            "--project",
            "billing",
            "--asset",
            "db-prod-01",
        ],
    );
    let claude = env.curated(
        "acme",
        &format!("{MARKER} Claude Code: run /compact before long migrations"),
        &["--type", "preference", "--agent", "claude"],
    );
    env.daemon.sync("acme");

    let billing = env.prepare_with(
        "acme",
        "billing",
        "alice",
        "db-prod-01",
        &["--project", "billing"],
    );
    let billing_other_asset = env.prepare_with(
        "acme",
        "billing-y",
        "alice",
        "pg-orders-01",
        &["--project", "billing"],
    );
    let search = env.prepare_with(
        "acme",
        "search",
        "alice",
        "db-prod-01",
        &["--project", "search"],
    );
    let no_project = env.prepare("acme", "no-project", "alice", "db-prod-01");
    let globex = env.prepare_with(
        "globex",
        "globex-billing",
        "alice",
        "db-prod-01",
        &["--project", "billing", "--agent", "claude"],
    );
    // The control: the project's tasks get both, the baseline card in L0.
    assert_eq!(billing.ways(&env, &project), ALL_WAYS, "billing's baseline");
    assert_eq!(
        billing.ways(&env, &project_asset),
        ALL_WAYS,
        "billing on db-prod-01"
    );
    assert_eq!(
        env.tier_unmatched("acme", "alice", &["--project", "billing"], &project)
            .as_deref(),
        Some("L0"),
        "billing's baseline"
    );
    assert_eq!(
        env.tier_unmatched("acme", "alice", &["--project", "billing"], &project_asset)
            .as_deref(),
        Some("L2"),
        "billing's card of the task's asset"
    );
    assert_eq!(billing_other_asset.ways(&env, &project), ALL_WAYS);
    assert_eq!(
        billing_other_asset.ways(&env, &project_asset),
        none,
        "billing's card of db-prod-01, on another asset"
    );
    for (seen, what) in [
        (&search, "another project"),
        (&no_project, "a task without a project"),
        (&globex, "another workspace"),
    ] {
        assert_eq!(seen.ways(&env, &project), none, "{what}");
        assert_eq!(seen.ways(&env, &project_asset), none, "{what}");
    }

    // Agent kind: the claude card reaches tasks run for Claude Code only; a task that
    // names no agent runs the profile's (generic).
    let as_claude = env.prepare_with(
        "acme",
        "as-claude",
        "alice",
        "db-prod-01",
        &["--agent", "claude"],
    );
    let as_codex = env.prepare_with(
        "acme",
        "as-codex",
        "alice",
        "db-prod-01",
        &["--agent", "codex"],
    );
    assert_eq!(as_claude.ways(&env, &claude), ALL_WAYS, "claude's card");
    assert_eq!(
        env.tier_unmatched("acme", "alice", &["--agent", "claude"], &claude)
            .as_deref(),
        Some("L0")
    );
    for (seen, what) in [
        (&as_codex, "codex"),
        (&no_project, "the profile's generic agent"),
        (&billing, "no --agent"),
        (&globex, "claude in another workspace"),
    ] {
        assert_eq!(seen.ways(&env, &claude), none, "{what}");
    }
    for task in [
        "billing",
        "billing-y",
        "search",
        "no-project",
        "as-claude",
        "as-codex",
    ] {
        env.release(task);
    }
    env.release("globex-billing");

    // An agent's store binds to its own task's project (the daemon's word, not the
    // agent's): billing's tasks see it, search's do not.
    let writer = env.prepare_with(
        "acme",
        "billing-writer",
        "alice",
        "db-prod-01",
        &["--project", "billing"],
    );
    let stored = env.store_in(
        &writer.plan,
        Some("billing"),
        &format!("{MARKER} billing's invoice job retries twice"),
        "the invoice job retries twice, then pages.",
        &["--project"],
    );
    let socket = PathBuf::from(writer.plan["agent_socket"].as_str().unwrap());
    let forged = json!({"card": {"type": "fact", "title": format!("{MARKER} forged"), "body": "x", "scope": {"project_id": "search"}}});
    let (code, body) = runner_socket_request(
        &socket,
        "POST",
        "/v1/store",
        Some(&serde_json::to_vec(&forged).unwrap()),
    );
    assert_eq!(code, 403, "{}", String::from_utf8_lossy(&body));
    // A task of no project cannot bind to one.
    let loose = env.prepare("acme", "loose-writer", "alice", "db-prod-01");
    let mut cmd = as_runner(&[
        OsStr::new("memory"),
        OsStr::new("store"),
        OsStr::new("--type"),
        OsStr::new("fact"),
        OsStr::new("--title"),
        OsStr::new("t"),
        OsStr::new("--project"),
        OsStr::new("--content-stdin"),
    ]);
    cmd.env(
        "MOP_AGENT_SOCKET",
        loose.plan["agent_socket"].as_str().unwrap(),
    );
    let out = mop_testkit::procs::run_with_stdin(&mut cmd, b"x\n");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("--project: this task has no project"),
        "{}",
        text(&out)
    );
    env.release("billing-writer");
    env.release("loose-writer");
    env.daemon.sync("acme");
    let billing = env.prepare_with(
        "acme",
        "billing-2",
        "alice",
        "pg-orders-01",
        &["--project", "billing"],
    );
    let search = env.prepare_with(
        "acme",
        "search-2",
        "alice",
        "pg-orders-01",
        &["--project", "search"],
    );
    assert_eq!(
        billing.ways(&env, &stored),
        ALL_WAYS,
        "its author in its project"
    );
    assert_eq!(
        search.ways(&env, &stored),
        none,
        "its author in another project"
    );
    let receipt = env.receipt("billing-2");
    assert_eq!(receipt.project_id.as_deref(), Some("billing"));
    assert_eq!(receipt.agent.as_deref(), Some("generic"));

    // The curator's filters and export know the project (and the agent kind).
    let ids_of = |args: &[&str]| -> BTreeSet<String> {
        let page: mop_proto::curation::CardPage = env.curate_as(args);
        page.cards
            .iter()
            .map(|c| c.summary.id.to_string())
            .collect()
    };
    let billing_cards = BTreeSet::from([project.clone(), project_asset.clone(), stored.clone()]);
    assert_eq!(
        ids_of(&["list", "--project", "billing", "--json"]),
        billing_cards
    );
    assert_eq!(
        ids_of(&["list", "--project", "search", "--json"]),
        BTreeSet::new()
    );
    assert_eq!(
        ids_of(&["list", "--agent", "claude", "--json"]),
        BTreeSet::from([claude.clone()])
    );
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("billing");
    let r = run(&mut env.curate(&["export", dir.to_str().unwrap(), "--project", "billing"]));
    assert!(r.status.success(), "{}", text(&r));
    let exported: BTreeSet<String> = card_files(&dir)
        .iter()
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_owned()))
        .collect();
    assert_eq!(exported, billing_cards);
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

/// The server config of the inheritance tests: acme and globex inherit `org`; initech
/// inherits nothing.
const INHERITANCE: &str = "[inheritance]\nacme = [\"org\"]\nglobex = [\"org\"]\n";
/// Org's card every inheriting task gets (a baseline preference).
const ORG_ALL: &str = "0a0a0a0a-0000-4000-8000-000000000001";
/// Org's card acme replaces with its own.
const ORG_REPLACED: &str = "0a0a0a0a-0000-4000-8000-000000000002";
/// Org's card bound to bob, whose rare word must not move alice's answers.
const ORG_BOB: &str = "0a0a0a0a-0000-4000-8000-000000000003";
/// Org's card an agent of alice stored there: it waits for org's curators and reaches no
/// task of a workspace that inherits org, not even alice's.
const ORG_UNVERIFIED: &str = "0a0a0a0a-0000-4000-8000-000000000004";
/// Acme's card that replaces [`ORG_REPLACED`].
const ACME_OVERRIDE: &str = "0a0a0a0a-0000-4000-8000-0000000000a1";
/// A card of acme alone.
const ACME_ONLY: &str = "0a0a0a0a-0000-4000-8000-0000000000a2";
/// A word only bob's org card holds.
const RARE: &str = "qqxylophonic";

/// An OKF preference file under `dir`, at its pillar path.
fn preference(dir: &std::path::Path, id: &str, title: &str, extra: &str, body: &str) {
    let path = dir.join(format!("conventions/preferences/{id}.md"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        &path,
        format!("---\nid: {id}\ntype: preference\ntitle: \"{title}\"\n{extra}---\n{body}\n"),
    )
    .unwrap();
}

/// acme, globex and initech hold the example cards; `org` holds three cards of its own,
/// and acme one that replaces one of them. The daemon syncs acme, globex and initech only,
/// with a node token of those three: `org` comes in as theirs to inherit.
fn setup_inheriting() -> Option<Env> {
    mop_testkit::procs::runner_user()?;
    let server = mop_testkit::procs::Server::start_with(INHERITANCE);
    let cards = tempfile::tempdir().unwrap();
    let (org, acme) = (cards.path().join("org"), cards.path().join("acme"));
    preference(
        &org,
        ORG_ALL,
        &format!("{MARKER} org: every commit message names its ticket"),
        "",
        &format!("{MARKER}: name the ticket in every commit message."),
    );
    preference(
        &org,
        ORG_REPLACED,
        &format!("{MARKER} org: the proxy is proxy-old:3128"),
        "",
        &format!("{MARKER}: use proxy-old:3128."),
    );
    preference(
        &org,
        ORG_BOB,
        "Bob prefers terse answers",
        "scope:\n  user_id: bob\n",
        &format!("Bob likes {RARE} answers."),
    );
    preference(
        &org,
        ORG_UNVERIFIED,
        &format!("{MARKER} org: alice's agent says restart the cache"),
        "trust: unverified\nprovenance:\n  task_id: org-task\n  user_id: alice\n",
        &format!("{MARKER}: restart the cache before a deploy."),
    );
    preference(
        &acme,
        ACME_OVERRIDE,
        &format!("{MARKER} acme: the proxy is proxy-acme:8080"),
        &format!("supersedes: [{ORG_REPLACED}]\n"),
        &format!("{MARKER}: acme's tasks use proxy-acme:8080."),
    );
    preference(
        &acme,
        ACME_ONLY,
        &format!("{MARKER} acme: deploys wait for the change board"),
        "",
        &format!("{MARKER}: acme deploys wait for the change board."),
    );
    let import = |dir: &std::path::Path, ws: &str| {
        let out = server.import(dir, ws);
        assert!(out.status.success(), "import {ws}: {}", text(&out));
    };
    import(&org, "org");
    for ws in ["acme", "globex", "initech"] {
        import(&mop_testkit::example_cards_dir(), ws);
    }
    import(&acme, "acme");
    let own = ["acme", "globex", "initech"];
    let admin = server.token("admin", &own);
    let daemon = mop_testkit::procs::Daemon::start(
        &server,
        mop_testkit::procs::DaemonOptions {
            workspaces: &own,
            extra: &mop_testkit::profiles_config(&[]),
            ..Default::default()
        },
    );
    daemon.wait_synced();
    Some(Env {
        world: World::around(server, daemon, admin, &own),
    })
}

/// The organisation layer as a control experiment: an `org` card reaches the tasks of the
/// workspaces that inherit it (acme, globex) by every way of looking, named as org's, and
/// no task of a workspace that does not (initech); an acme card never reaches globex;
/// acme's own card replaces an org card for acme's tasks only; and retrieve's answers over
/// the combined set depend on no card the task cannot see.
#[test]
fn inherited_cards_reach_the_inheriting_workspaces_only() {
    let Some(env) = setup_inheriting() else {
        return;
    };
    let none: [&str; 0] = [];
    let acme = env.prepare("acme", "acme-alice", "alice", "db-prod-01");
    let globex = env.prepare("globex", "globex-alice", "alice", "db-prod-01");
    let initech = env.prepare("initech", "initech-alice", "alice", "db-prod-01");

    // The organisation's card: in both inheriting workspaces' tasks, in L0, named as
    // org's in MEMORY.md and in retrieve; never in initech's.
    assert_eq!(acme.ways(&env, ORG_ALL), ALL_WAYS, "acme inherits org");
    // Org's unverified card came to the host with org's manifest (the control), and stays
    // out of alice's acme task all the same: only org's curators make it org's memory.
    let org_manifest: Value = mop_testkit::http()
        .get(format!("{}/v1/workspaces/org/manifest", env.server.url))
        .bearer_auth(&env.node)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(
        org_manifest.to_string().contains(ORG_UNVERIFIED),
        "{org_manifest}"
    );
    assert_eq!(acme.ways(&env, ORG_UNVERIFIED), none, "unverified in org");
    assert_eq!(globex.ways(&env, ORG_ALL), ALL_WAYS, "globex inherits org");
    assert_eq!(
        initech.ways(&env, ORG_ALL),
        none,
        "initech inherits nothing"
    );
    assert_eq!(
        env.tier_unmatched("acme", "alice", &[], ORG_ALL).as_deref(),
        Some("L0")
    );
    let line = acme
        .memory_md
        .lines()
        .find(|l| l.contains(ORG_ALL))
        .unwrap_or_else(|| panic!("{}", acme.memory_md));
    assert!(line.contains("_(from org)_"), "{line}");
    assert!(acme.memory_md.contains("inherits the cards of org"));
    let hit = acme.retrieved["hits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["id"] == ORG_ALL)
        .unwrap();
    assert_eq!(hit["workspace"], "org");
    // An own card carries no workspace.
    let own = acme.retrieved["hits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["id"] == ACME_ONLY)
        .unwrap();
    assert!(own.get("workspace").is_none(), "{own}");

    // Acme's card reaches acme only: globex inherits org, not acme.
    assert_eq!(acme.ways(&env, ACME_ONLY), ALL_WAYS);
    assert_eq!(
        globex.ways(&env, ACME_ONLY),
        none,
        "acme is not globex's to inherit"
    );

    // Acme overrides org's proxy card; globex, which does not, keeps it.
    assert_eq!(acme.ways(&env, ACME_OVERRIDE), ALL_WAYS);
    assert_eq!(acme.ways(&env, ORG_REPLACED), none, "replaced for acme");
    assert_eq!(globex.ways(&env, ORG_REPLACED), ALL_WAYS, "kept for globex");

    // Retrieve over the combined set: bob's org card is not alice's to see, and its rare
    // word answers like a word found nowhere; bob's own task finds it (the control).
    let ask = |seen: &Seen, q: &str| -> Value {
        let out = env.agent(&seen.plan, &["retrieve", q, "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let rare = ask(&acme, RARE);
    let nowhere = ask(&acme, "zzqqnowhere");
    assert_eq!(rare["hits"], json!([]));
    assert_eq!(rare["searched"], nowhere["searched"]);
    assert_eq!(
        rare["coverage"].as_str().unwrap().replace(RARE, "Q"),
        nowhere["coverage"]
            .as_str()
            .unwrap()
            .replace("zzqqnowhere", "Q")
    );
    assert_eq!(acme.ways(&env, ORG_BOB), none);
    let bob = env.prepare("acme", "acme-bob", "bob", "db-prod-01");
    let found = ask(&bob, RARE);
    assert_eq!(found["hits"][0]["id"], ORG_BOB, "{found}");
    assert_eq!(found["hits"][0]["workspace"], "org");

    // The inherited pool in `mopd status`, with its users, and each inheriting workspace's
    // line naming it.
    let (_, status) = env.daemon.status();
    let pools = status["workspaces"].as_array().unwrap();
    let org = pools
        .iter()
        .find(|w| w["workspace"] == "org")
        .unwrap_or_else(|| panic!("{status}"));
    assert_eq!(org["inherited_by"], json!(["acme", "globex"]));
    let acme_status = pools.iter().find(|w| w["workspace"] == "acme").unwrap();
    assert_eq!(acme_status["inherits"], json!(["org"]));
    assert_eq!(acme_status["inherited"][0]["workspace"], "org");
    let human = run(&mut env.daemon.ctl(&["status"]));
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("workspace org (inherited by acme, globex)"),
        "{human}"
    );
    assert!(human.contains("inherits     org (revision"), "{human}");
    let receipt = env.receipt("acme-alice");
    let card = receipt
        .cards
        .iter()
        .find(|c| c.id.to_string() == ORG_ALL)
        .unwrap();
    assert_eq!(card.workspace.as_deref(), Some("org"));
}

/// An org card changed by org's curator reaches the inheriting workspace's next tasks
/// after a sync, with no change in acme itself; the node token reads org only because acme
/// inherits it, and acme's curator reads org's cards but cannot change them.
#[test]
fn an_inherited_change_arrives_and_tokens_read_only_what_they_inherit() {
    let Some(env) = setup_inheriting() else {
        return;
    };
    let http = mop_testkit::http();
    let url = &env.server.url;
    let get = |token: &str, path: &str| {
        http.get(format!("{url}{path}"))
            .bearer_auth(token)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    // The node token of acme, globex and initech reads org's manifest (inherited); one of
    // initech alone does not (the control).
    assert_eq!(get(&env.node, "/v1/workspaces/org/manifest"), 200);
    // An admin token reads its own manifest, and org's cards only through the curation
    // reads below: org's manifest names its unverified cards too.
    assert_eq!(get(&env.admin, "/v1/workspaces/acme/manifest"), 200);
    assert_eq!(get(&env.admin, "/v1/workspaces/org/manifest"), 404);
    let initech_node = env.server.token("node", &["initech"]);
    assert_eq!(get(&initech_node, "/v1/workspaces/org/manifest"), 404);
    assert_eq!(get(&initech_node, "/v1/workspaces/initech/manifest"), 200);
    // Acme's curator reads org's card, and cannot change it.
    let card = format!("/v1/workspaces/org/cards/{ORG_ALL}");
    assert_eq!(get(&env.admin, &card), 200);
    let initech_admin = env.server.token("admin", &["initech"]);
    assert_eq!(get(&initech_admin, &card), 404);
    let disable = http
        .post(format!("{url}/v1/workspaces/org/cards/{ORG_ALL}/disable"))
        .bearer_auth(&env.admin)
        .json(&json!({"reason": "not ours"}))
        .send()
        .unwrap();
    assert_eq!(
        disable.status().as_u16(),
        404,
        "acme's curator cannot change org"
    );
    // What acme's curator reads of org is what acme's tasks inherit: org's verified cards,
    // not the cards waiting for org's curators, nor any card's history.
    let org_admin = env.server.token("admin", &["org"]);
    let unverified = format!("/v1/workspaces/org/cards/{ORG_UNVERIFIED}");
    assert_eq!(get(&org_admin, &unverified), 200, "org's own curator");
    assert_eq!(get(&env.admin, &unverified), 404);
    assert_eq!(get(&env.admin, &format!("{unverified}/details")), 404);
    let history = format!("{card}/history");
    assert_eq!(get(&org_admin, &history), 200, "org's own curator");
    assert_eq!(get(&env.admin, &history), 404);
    assert_eq!(
        get(&env.admin, "/v1/workspaces/org/cards?unverified=true"),
        404
    );
    let listed = http
        .get(format!("{url}/v1/workspaces/org/cards"))
        .bearer_auth(&env.admin)
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        listed.contains(ORG_ALL) && !listed.contains(ORG_UNVERIFIED),
        "{listed}"
    );

    // A card id one workspace holds cannot be made in a workspace composed with it (one
    // would hide the other in acme's tasks), in either direction; initech composes with
    // nobody, and a new id is fine (the controls).
    let create = |token: &str, ws: &str, id: &str| {
        http.post(format!("{url}/v1/workspaces/{ws}/cards"))
            .bearer_auth(token)
            .header("content-type", "text/markdown")
            .body(format!(
                "---\nid: {id}\ntype: fact\ntitle: Same id\n---\nA card of {ws}.\n"
            ))
            .send()
            .unwrap()
    };
    let r = create(&org_admin, "org", ACME_ONLY);
    assert_eq!(r.status().as_u16(), 409);
    let why = r.text().unwrap();
    assert!(
        why.contains("workspace acme") && why.contains("supersedes"),
        "{why}"
    );
    assert_eq!(create(&env.admin, "acme", ORG_ALL).status().as_u16(), 409);
    assert_eq!(
        create(&env.admin, "initech", ORG_ALL).status().as_u16(),
        201
    );
    let fresh = "0a0a0a0a-0000-4000-8000-0000000000f1";
    assert_eq!(create(&org_admin, "org", fresh).status().as_u16(), 201);
    // The same through `mop-server import` of a card directory.
    let dir = tempfile::tempdir().unwrap();
    preference(dir.path(), ORG_ALL, "Same id", "", "A copy of org's card.");
    let out = env.server.import(dir.path(), "acme");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("exists in workspace org"),
        "{}",
        text(&out)
    );
    let out = env.server.import(dir.path(), "initech");
    assert!(out.status.success(), "{}", text(&out));

    // Org's own curator disables the card; acme's next tasks no longer get it once the
    // daemon has synced (acme's revision did not move).
    let before = env.revision("acme");
    let r = http
        .post(format!("{url}/v1/workspaces/org/cards/{ORG_ALL}/disable"))
        .bearer_auth(&org_admin)
        .json(&json!({"reason": "moved to the handbook"}))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    let first = env.prepare("acme", "acme-before", "alice", "db-prod-01");
    assert_eq!(first.ways(&env, ORG_ALL), ALL_WAYS, "not synced yet");
    env.daemon.sync("acme");
    let after = env.prepare("acme", "acme-after", "alice", "db-prod-01");
    let none: [&str; 0] = [];
    assert_eq!(after.ways(&env, ORG_ALL), none);
    assert_eq!(env.revision("acme"), before, "acme itself did not change");

    // An own change arrives as a delta over the composed generation and keeps the
    // inherited cards: with acme's override disabled, org's proxy card is acme's again.
    let r = http
        .post(format!(
            "{url}/v1/workspaces/acme/cards/{ACME_OVERRIDE}/disable"
        ))
        .bearer_auth(&env.admin)
        .json(&json!({"reason": "the old proxy is back"}))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    env.daemon.sync("acme");
    let again = env.prepare("acme", "acme-again", "alice", "db-prod-01");
    assert_eq!(again.ways(&env, ACME_OVERRIDE), none);
    assert_eq!(again.ways(&env, ORG_REPLACED), ALL_WAYS);
    let (_, status) = env.daemon.status();
    let acme = status["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["workspace"] == "acme")
        .unwrap()
        .clone();
    assert!(acme["revision"].as_u64().unwrap() > before, "{acme}");
    assert_eq!(acme["last_error"], Value::Null, "{acme}");
}

/// An inherited pool is scrubbed like a configured one: damage to one of org's objects
/// (whose inode acme's pool shares) is found by `mopd verify` of org and of acme, each
/// repairs its own, and acme's repair never links the damaged copy back in.
#[test]
fn a_damaged_inherited_object_is_found_and_repaired_in_both_pools() {
    let Some(env) = setup_inheriting() else {
        return;
    };
    let verify = |ws: &str| {
        let out = run(&mut env.daemon.cli(&["verify", "--repair", "--workspace", ws]));
        (out.status.success(), text(&out))
    };
    // The control: both pools verify before anything is damaged.
    for ws in ["org", "acme"] {
        let (ok, out) = verify(ws);
        assert!(ok && out.contains(&format!("{ws}: ok")), "{out}");
    }
    let manifest: Value = mop_testkit::http()
        .get(format!("{}/v1/workspaces/org/manifest", env.server.url))
        .bearer_auth(&env.node)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let sha = manifest["cards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == ORG_ALL)
        .unwrap()["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let object = |ws: &str| {
        env.daemon
            .pool(ws)
            .join("objects")
            .join(&sha[..2])
            .join(&sha)
    };
    use std::os::unix::fs::MetadataExt;
    let (org_obj, acme_obj) = (object("org"), object("acme"));
    assert_eq!(
        std::fs::metadata(&org_obj).unwrap().ino(),
        std::fs::metadata(&acme_obj).unwrap().ino(),
        "acme's pool links org's object"
    );
    // Damage it in place: both pools now hold the damaged bytes.
    let mut bytes = std::fs::read(&org_obj).unwrap();
    bytes[0] ^= 0x20;
    let mut perms = std::fs::metadata(&org_obj).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
    std::fs::set_permissions(&org_obj, perms).unwrap();
    std::fs::write(&org_obj, &bytes).unwrap();

    // One `mopd verify --repair` of every pool: org's is repaired before acme's, whose
    // repair links org's object again.
    let all = text(&run(&mut env.daemon.cli(&["verify", "--repair"])));
    for ws in ["org", "acme"] {
        assert!(all.contains(&format!("{ws}: DAMAGED")), "{ws}: {all}");
    }
    assert!(all.contains(&sha), "{all}");
    for ws in ["org", "acme"] {
        let (ok, out) = verify(ws);
        assert!(
            ok && out.contains(&format!("{ws}: ok")),
            "{ws} after repair: {out}"
        );
    }
    assert_eq!(
        mop_cards::sha256_hex(&std::fs::read(&acme_obj).unwrap()),
        sha,
        "acme's pool holds the good bytes again"
    );
    let task = env.prepare("acme", "acme-repaired", "alice", "db-prod-01");
    assert_eq!(task.ways(&env, ORG_ALL), ALL_WAYS);
}
