//! Hostile requests on the daemon's two sockets (control: prepare; agent: store, retrieve,
//! get) and on the server: oversized bodies, deeply nested JSON, invalid UTF-8, NUL bytes,
//! path-like ids and 10 MB titles. Each must get a clear 4xx naming what is wrong, and
//! change nothing: no task, no directory, no card, no new revision; the daemon and server
//! keep serving afterwards (the control requests at the end of each test).

use std::path::Path;

use mop_testkit::world::World;
use serde_json::{Value, json};

const WS: &str = "acme";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One raw HTTP request on a Unix socket: status and body.
fn call(socket: &Path, method: &str, path: &str, body: Option<Vec<u8>>) -> (u16, String) {
    let (code, body) = rt()
        .block_on(mop_proto::client::request(socket, method, path, body))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    (code, String::from_utf8_lossy(&body).into_owned())
}

fn nested(depth: usize) -> Vec<u8> {
    let mut v = vec![b'['; depth];
    v.extend(std::iter::repeat_n(b']', depth));
    v
}

fn prepare_body(task_id: &str, workspace: &str, title: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "task": {"task_id": task_id, "workspace": workspace, "title": title, "origin_user_id": "alice"},
        "lease": {"kind": "ttl"}
    }))
    .unwrap()
}

mop_testkit::world_env! {
    /// The world of these tests: the example cards, and a daemon its probes speak to
    /// directly (no runner user or sandbox is needed).
    Env {}
}

fn setup() -> Env {
    let world = World::builder()
        .as_this_user()
        .start()
        .expect("a world of this user's starts anywhere");
    Env { world }
}

impl Env {
    fn revision(&self) -> u64 {
        self.server.revision(WS, &self.node)
    }

    fn task_dirs(&self) -> usize {
        std::fs::read_dir(self.daemon.dir.path().join("cache/tasks"))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

/// An oversized body: the socket answers 413 naming the limit, or, when it refused the
/// body before the client finished sending it, closes the connection (the client then
/// sees a write error). Either way nothing is buffered or acted on.
fn too_large(what: &str, socket: &Path, path: &str, body: Vec<u8>) {
    match rt().block_on(mop_proto::client::request(socket, "POST", path, Some(body))) {
        Ok((code, body)) => refused(
            what,
            (code, String::from_utf8_lossy(&body).into_owned()),
            413,
            &["256 KiB limit"],
        ),
        Err(e) => assert!(e.to_string().contains("writing"), "{what}: {e}"),
    }
}

/// Asserts a 4xx whose message contains every needle.
fn refused(what: &str, (code, body): (u16, String), status: u16, needles: &[&str]) {
    assert_eq!(code, status, "{what}: {body}");
    let message = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("{what}: not a JSON error: {body}"));
    for n in needles {
        assert!(message.contains(n), "{what}: {message:?} lacks {n:?}");
    }
}

#[test]
fn hostile_prepares_are_refused_and_change_nothing() {
    let env = setup();
    let socket = env.daemon.socket();
    let post = |body: Vec<u8>| call(&socket, "POST", "/v1/tasks", Some(body));
    let ten_mb = "t".repeat(10 * 1024 * 1024);

    too_large(
        "10 MB title",
        &socket,
        "/v1/tasks",
        prepare_body("t1", WS, &ten_mb),
    );
    too_large(
        "300 KiB title",
        &socket,
        "/v1/tasks",
        prepare_body("t1", WS, &"t".repeat(300 * 1024)),
    );
    refused(
        "nested JSON",
        post(nested(100_000)),
        400,
        &["invalid request"],
    );
    let mut bad_utf8 = prepare_body("t1", WS, "XX");
    let at = bad_utf8.windows(2).position(|w| w == b"XX").unwrap();
    bad_utf8[at] = 0xff;
    refused("invalid UTF-8", post(bad_utf8), 400, &["invalid request"]);
    refused(
        "NUL in the task id",
        post(prepare_body("a\0b", WS, "x")),
        400,
        &["task_id"],
    );
    refused(
        "NUL in the title",
        post(prepare_body("t1", WS, "x\0y")),
        400,
        &["title"],
    );
    for id in ["..", "../../etc", "a/b", ".hidden", "/abs"] {
        refused(id, post(prepare_body(id, WS, "x")), 400, &["task_id"]);
    }
    for ws in ["../acme", "acme/../x", "ACME"] {
        refused(ws, post(prepare_body("t1", ws, "x")), 400, &["workspace"]);
    }
    refused(
        "unknown workspace",
        post(prepare_body("t1", "other", "x")),
        404,
        &["other"],
    );
    refused(
        "100 KiB title",
        post(prepare_body("t1", WS, &"t".repeat(100 * 1024))),
        400,
        &["title"],
    );
    refused(
        "unknown field",
        post(br#"{"task":{"task_id":"t1","workspace":"acme","title":"x","root":true},"lease":{"kind":"ttl"}}"#.to_vec()),
        400,
        &["unknown field `root`"],
    );

    // Nothing happened: no task, no directory; and the daemon still prepares.
    let (_, status) = env.daemon.status();
    assert_eq!(status["tasks"].as_array().unwrap().len(), 0, "{status:#}");
    assert_eq!(env.task_dirs(), 0);
    let (code, body) = post(prepare_body("fine", WS, "Nightly ETL fails with ORA-01555"));
    assert_eq!(code, 201, "{body}");
}

#[test]
fn hostile_agent_requests_are_refused_and_store_nothing() {
    let env = setup();
    let (code, plan) = call(
        &env.daemon.socket(),
        "POST",
        "/v1/tasks",
        Some(prepare_body(
            "agent",
            WS,
            "Nightly ETL fails with ORA-01555",
        )),
    );
    assert_eq!(code, 201, "{plan}");
    let plan: Value = serde_json::from_str(&plan).unwrap();
    let agent = std::path::PathBuf::from(plan["agent_socket"].as_str().unwrap());
    let before = env.revision();
    let store = |card: Value| {
        call(
            &agent,
            "POST",
            "/v1/store",
            Some(serde_json::to_vec(&json!({ "card": card })).unwrap()),
        )
    };
    let ten_mb = "t".repeat(10 * 1024 * 1024);

    too_large(
        "10 MB title",
        &agent,
        "/v1/store",
        serde_json::to_vec(&json!({"card": {"type": "fact", "title": ten_mb, "body": "b"}}))
            .unwrap(),
    );
    refused(
        "nested JSON",
        call(&agent, "POST", "/v1/store", Some(nested(100_000))),
        400,
        &["invalid request"],
    );
    let mut bad_utf8 =
        serde_json::to_vec(&json!({"card": {"type": "fact", "title": "XX", "body": "b"}})).unwrap();
    let at = bad_utf8.windows(2).position(|w| w == b"XX").unwrap();
    bad_utf8[at] = 0xc3;
    refused(
        "invalid UTF-8",
        call(&agent, "POST", "/v1/store", Some(bad_utf8)),
        400,
        &["invalid request"],
    );
    refused(
        "NUL in the title",
        store(json!({"type": "fact", "title": "a\u{0}b", "body": "b"})),
        422,
        &["title"],
    );
    refused(
        "NUL in the body",
        store(json!({"type": "fact", "title": "t", "body": "a\u{0}b"})),
        422,
        &["body"],
    );
    refused(
        "long title",
        store(json!({"type": "fact", "title": "t".repeat(201), "body": "b"})),
        422,
        &["title"],
    );
    too_large(
        "10 MB query",
        &agent,
        "/v1/retrieve",
        serde_json::to_vec(&json!({ "query": ten_mb })).unwrap(),
    );
    // `mop memory store` refuses an oversized card itself, with what to do instead.
    let memory = |args: &[&str], stdin: &[u8]| {
        let mut cmd = std::process::Command::new(mop_testkit::procs::bin("mop"));
        cmd.arg("memory").args(args).env("MOP_AGENT_SOCKET", &agent);
        mop_testkit::procs::run_with_stdin(&mut cmd, stdin)
    };
    let out = memory(
        &["store", "--type", "fact", "--title", "t", "--content-stdin"],
        ten_mb.as_bytes(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("over 64 KiB") && stderr.contains("split it"),
        "{stderr}"
    );
    let long_title = "t".repeat(300);
    let out = memory(
        &[
            "store",
            "--type",
            "fact",
            "--title",
            &long_title,
            "--content-stdin",
        ],
        b"text",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--title is 300 characters; at most 200"),
        "{stderr}"
    );
    for path in [
        "/v1/cards/..%2F..%2Fetc%2Fpasswd",
        "/v1/cards/not-a-uuid",
        "/v1/cards/00000000-0000-4000-8000-00000000000A",
    ] {
        refused(path, call(&agent, "GET", path, None), 400, &["id"]);
    }
    refused(
        "an id no card has",
        call(
            &agent,
            "GET",
            "/v1/cards/00000000-0000-4000-8000-000000000999",
            None,
        ),
        404,
        &["00000000-0000-4000-8000-000000000999"],
    );

    // Nothing was stored; the socket still answers.
    assert_eq!(env.revision(), before);
    let (code, body) = call(
        &agent,
        "POST",
        "/v1/retrieve",
        Some(br#"{"query":"ORA-01555"}"#.to_vec()),
    );
    assert_eq!(code, 200, "{body}");
}

#[test]
fn hostile_server_requests_are_refused_and_change_nothing() {
    let env = setup();
    let admin = env.server.token("admin", &[WS]);
    let before = env.revision();
    let http = mop_testkit::http();
    let memories = format!("{}/v1/workspaces/{WS}/memories", env.server.url);
    let post = |url: &str, token: &str, body: Vec<u8>| {
        let r = http.post(url).bearer_auth(token).body(body).send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let store = |title: &str, body: &str| {
        serde_json::to_vec(&json!({"provenance": {"task_id": "t", "user_id": "alice"}, "card": {"type": "fact", "title": title, "body": body}}))
            .unwrap()
    };
    // An oversized body: 413 naming the limit, or the connection closed before the client
    // finished sending (the server refuses by Content-Length without reading the body).
    let too_large = |what: &str, url: &str, token: &str, body: Vec<u8>| match http
        .post(url)
        .bearer_auth(token)
        .body(body)
        .send()
    {
        Ok(r) => {
            let code = r.status().as_u16();
            refused(what, (code, r.text().unwrap()), 413, &["bytes"]);
        }
        Err(e) => assert!(format!("{e:?}").contains("BodyWrite"), "{what}: {e:?}"),
    };
    let ten_mb = "t".repeat(10 * 1024 * 1024);
    too_large("10 MB title", &memories, &env.node, store(&ten_mb, "b"));
    refused(
        "nested JSON",
        post(&memories, &env.node, nested(100_000)),
        400,
        &["invalid"],
    );
    let mut bad_utf8 = store("XX", "b");
    let at = bad_utf8.windows(2).position(|w| w == b"XX").unwrap();
    bad_utf8[at] = 0xff;
    refused(
        "invalid UTF-8",
        post(&memories, &env.node, bad_utf8),
        400,
        &["malformed JSON"],
    );
    refused(
        "NUL in the title",
        post(&memories, &env.node, store("a\0b", "b")),
        422,
        &["title"],
    );
    // The admin API takes OKF text: a 10 MB title, NUL bytes and invalid UTF-8 in it.
    let cards = format!("{}/v1/workspaces/{WS}/cards", env.server.url);
    let okf = |title: &str| {
        format!("---\nid: 7a3c9a52-55c4-4f8e-9d64-3f0b3b1c2d4e\ntype: fact\ntitle: {title}\n---\nBody.\n")
            .into_bytes()
    };
    too_large("10 MB OKF title", &cards, &admin, okf(&ten_mb));
    refused("NUL in OKF", post(&cards, &admin, okf("a\0b")), 422, &[]);
    let mut bad = okf("XX");
    let at = bad.windows(2).position(|w| w == b"XX").unwrap();
    bad[at] = 0xff;
    refused(
        "invalid UTF-8 OKF",
        post(&cards, &admin, bad),
        422,
        &["UTF-8"],
    );
    refused(
        "path-like id in OKF",
        post(
            &cards,
            &admin,
            b"---\nid: ../../etc/passwd\ntype: fact\ntitle: t\n---\nB\n".to_vec(),
        ),
        422,
        &["id"],
    );
    assert_eq!(env.revision(), before, "nothing changed the workspace");
    // The server still takes a good store.
    let (code, body) = post(&memories, &env.node, store("A fine card", "b"));
    assert_eq!(code, 201, "{body}");
    assert_eq!(env.revision(), before + 1);
}
