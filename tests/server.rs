//! mop-server end to end: the real binary on 127.0.0.1:0 with a temporary database, a real
//! HTTP client, and the CLI for tokens, import and export.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use mop_cards::{CardId, Manifest};
use mop_proto::sync::{StoreOutcome, StoreResponse, Version, decode_batch};
use mop_testkit::procs::{Server, run};
use mop_testkit::{card_files, example_cards_dir};
use reqwest::StatusCode;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::{Value, json};

const WS: &str = "acme";

struct Api {
    http: Client,
    url: String,
    token: String,
}

impl Api {
    fn new(server: &Server, token: &str) -> Api {
        Api {
            http: mop_testkit::http(),
            url: server.url.clone(),
            token: token.to_owned(),
        }
    }

    fn req(&self, method: reqwest::Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token)
    }

    fn get(&self, path: &str) -> Response {
        self.req(reqwest::Method::GET, path).send().unwrap()
    }

    fn post_json(&self, path: &str, body: &Value) -> Response {
        self.req(reqwest::Method::POST, path)
            .json(body)
            .send()
            .unwrap()
    }

    fn post(&self, path: &str) -> Response {
        self.req(reqwest::Method::POST, path).send().unwrap()
    }

    /// The full manifest and its ETag.
    fn manifest(&self, ws: &str) -> (String, Manifest) {
        let r = self.get(&format!("/v1/workspaces/{ws}/manifest"));
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "{}",
            r.text().unwrap_or_default()
        );
        let etag = r.headers()["etag"].to_str().unwrap().to_owned();
        (etag, r.json().unwrap())
    }

    fn revision(&self, ws: &str) -> u64 {
        self.manifest(ws).1.revision
    }

    fn store(
        &self,
        user: Option<&str>,
        asset: Option<&str>,
        title: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        self.store_in("t-1", user, asset, title, body)
    }

    /// A store from task `task`.
    fn store_in(
        &self,
        task: &str,
        user: Option<&str>,
        asset: Option<&str>,
        title: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        let r = self.post_json(
            &format!("/v1/workspaces/{WS}/memories"),
            &json!({
                "provenance": {"task_id": task, "user_id": user, "asset_id": asset},
                "card": {"type": "pitfall", "title": title, "body": body, "labels": ["etl"]}
            }),
        );
        (r.status(), r.json().unwrap())
    }
}

fn stored(v: &Value) -> StoreResponse {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

/// A server with the example workspace imported, and admin and node tokens.
fn setup(config: &str) -> (Server, Api, Api) {
    let server = Server::start_with(config);
    let admin = server.token("admin", &[WS]);
    let node = server.token("node", &[WS]);
    let out = server.import(&example_cards_dir(), WS);
    assert!(
        out.status.success(),
        "import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (a, n) = (Api::new(&server, &admin), Api::new(&server, &node));
    (server, a, n)
}

fn example_card(title_part: &str) -> (CardId, Vec<u8>) {
    for path in card_files(&example_cards_dir()) {
        let bytes = std::fs::read(&path).unwrap();
        let card = mop_cards::parse_card(&bytes).unwrap();
        if card.summary.title.contains(title_part) {
            return (card.summary.id, bytes);
        }
    }
    panic!("no example card titled {title_part:?}");
}

#[test]
fn etag_and_if_none_match() {
    let (_server, admin, node) = setup("");
    let (etag, m) = node.manifest(WS);
    assert!(etag.starts_with("W/\""), "{etag}");
    assert_eq!(etag, format!("W/\"{}-{}\"", m.epoch, m.revision));
    let opaque = etag.trim_start_matches("W/");
    let manifest_url = format!("/v1/workspaces/{WS}/manifest");
    let with = |inm: &str| {
        node.req(reqwest::Method::GET, &manifest_url)
            .header("if-none-match", inm)
            .send()
            .unwrap()
    };
    for inm in [
        etag.clone(),
        opaque.to_owned(),
        format!("W/\"nope\", {etag}"),
        "*".to_owned(),
    ] {
        let r = with(&inm);
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "If-None-Match: {inm}");
        assert_eq!(r.headers()["etag"].to_str().unwrap(), etag);
        assert!(r.bytes().unwrap().is_empty(), "304 has no body");
    }
    for inm in [
        "W/\"nope\"",
        &format!("W/\"{}-{}\"", m.epoch, m.revision + 1),
        "garbage",
    ] {
        assert_eq!(with(inm).status(), StatusCode::OK, "If-None-Match: {inm}");
    }
    // After a change the old tag no longer matches and the new one does.
    let (id, _) = example_card("Indent SQL with tabs");
    let r = admin.post(&format!("/v1/workspaces/{WS}/cards/{id}/enable"));
    assert_eq!(r.status(), StatusCode::OK);
    let r = with(&etag);
    assert_eq!(r.status(), StatusCode::OK);
    let new_etag = r.headers()["etag"].to_str().unwrap().to_owned();
    assert_ne!(new_etag, etag);
    assert_eq!(with(&new_etag).status(), StatusCode::NOT_MODIFIED);
}

fn done(r: Response) -> (StatusCode, String) {
    (r.status(), r.text().unwrap_or_default())
}

#[test]
fn every_kind_of_change_bumps_the_revision_once() {
    let (_server, admin, node) = setup("");
    let (a, _) = example_card("Production change windows");
    let (b, _) = example_card("Backup policy");
    let (undo, _) = example_card("Undo advisor suggests");
    let cards = format!("/v1/workspaces/{WS}/cards");
    let rev = std::cell::Cell::new(node.revision(WS));
    let expect_bump = |what: &str, (status, text): (StatusCode, String)| {
        assert!(status.is_success(), "{what}: {status} {text}");
        let now = node.revision(WS);
        assert_eq!(now, rev.get() + 1, "{what} bumps the revision by one");
        rev.set(now);
        text
    };
    let new_id = "0b1e3a6c-1111-4222-8333-944455566677";
    let raw = format!("---\nid: {new_id}\ntype: fact\ntitle: A new fact\n---\nBody.\n");
    expect_bump(
        "create",
        done(
            admin
                .req(reqwest::Method::POST, &cards)
                .body(raw.clone())
                .send()
                .unwrap(),
        ),
    );
    let raw2 = raw.replace("Body.", "Body, edited.");
    let put = |body: String| {
        admin
            .req(reqwest::Method::PUT, &format!("{cards}/{new_id}"))
            .body(body)
            .send()
            .unwrap()
    };
    expect_bump("update", done(put(raw2.clone())));
    expect_bump("disable", done(admin.post(&format!("{cards}/{a}/disable"))));
    expect_bump("enable", done(admin.post(&format!("{cards}/{a}/enable"))));
    expect_bump(
        "verify",
        done(admin.post(&format!("{cards}/{undo}/verify"))),
    );
    expect_bump(
        "supersede",
        done(admin.post_json(&format!("{cards}/{b}/supersede"), &json!({"by": new_id}))),
    );
    expect_bump("archive", done(admin.post(&format!("{cards}/{a}/archive"))));
    expect_bump(
        "unarchive",
        done(admin.post(&format!("{cards}/{a}/unarchive"))),
    );
    let body = |title: &str, text: &str| {
        let (status, v) = node.store(Some("alice"), None, title, text);
        (status, v.to_string())
    };
    let created = expect_bump(
        "store (created)",
        body("Check undo before the ETL", "Look at v$undostat."),
    );
    assert!(created.contains("\"created\""), "{created}");
    let another = expect_bump(
        "store (another lesson, same title)",
        body("Check undo before the ETL", "Also check the tablespace."),
    );
    assert!(another.contains("\"created\""), "{another}");

    // Identical writes change nothing.
    let before = node.revision(WS);
    let (status, text) = done(put(raw2.clone()));
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("\"changed\":false"), "{text}");
    assert_eq!(node.revision(WS), before);

    // A reinforcement (from another task: a task counts once per card) changes counters
    // only: no bump until counters are published.
    let (_, v) = node.store_in(
        "t-2",
        Some("alice"),
        None,
        "check  undo before the etl",
        "Look at v$undostat.",
    );
    assert_eq!(stored(&v).outcome, StoreOutcome::Reinforced, "{v}");
    assert_eq!(
        node.revision(WS),
        before,
        "reinforcement is not published yet"
    );
    let (status, _) = done(admin.post(&format!("/v1/workspaces/{WS}/counters/publish")));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        node.revision(WS),
        before + 1,
        "one revision publishes the batch"
    );
    let (_, m) = node.manifest(WS);
    let card = m
        .cards
        .iter()
        .find(|c| Some(c.summary.id) == stored(&v).id)
        .unwrap();
    assert_eq!(card.occurrence, 2);

    rev.set(node.revision(WS));
    expect_bump(
        "hard delete",
        done(
            admin
                .req(reqwest::Method::DELETE, &format!("{cards}/{new_id}"))
                .send()
                .unwrap(),
        ),
    );
}

#[test]
fn deltas_and_cards_leaving_the_manifest() {
    let (_server, admin, node) = setup("");
    let (_, full) = node.manifest(WS);
    let since = Version::of(&full).to_string();
    let (disabled, _) = example_card("Production change windows");
    let (superseded, _) = example_card("Backup policy");
    let (newer, _) = example_card("Point-in-time recovery");
    let (archived, _) = example_card("Database naming conventions");
    let (verified, _) = example_card("Undo advisor suggests");
    let cards = format!("/v1/workspaces/{WS}/cards");
    assert!(
        admin
            .post(&format!("{cards}/{disabled}/disable"))
            .status()
            .is_success()
    );
    assert!(
        admin
            .post_json(
                &format!("{cards}/{superseded}/supersede"),
                &json!({"by": newer.to_string()})
            )
            .status()
            .is_success()
    );
    assert!(
        admin
            .post(&format!("{cards}/{archived}/archive"))
            .status()
            .is_success()
    );
    assert!(
        admin
            .post(&format!("{cards}/{verified}/verify"))
            .status()
            .is_success()
    );

    let (_, now) = node.manifest(WS);
    let ids: BTreeSet<CardId> = now.cards.iter().map(|c| c.summary.id).collect();
    for gone in [disabled, superseded, archived] {
        assert!(!ids.contains(&gone), "{gone} left the manifest");
    }
    assert!(ids.contains(&verified));
    assert_eq!(now.cards.len(), full.cards.len() - 3);

    let r = node.get(&format!("/v1/workspaces/{WS}/manifest?since={since}"));
    assert_eq!(r.status(), StatusCode::OK);
    let delta: Manifest = r.json().unwrap();
    assert_eq!(delta.since, Some(full.revision));
    assert_eq!(delta.revision, now.revision);
    let removed: BTreeSet<CardId> = delta.removed.iter().copied().collect();
    assert_eq!(
        removed,
        [disabled, superseded, archived].into_iter().collect()
    );
    let changed: Vec<CardId> = delta.cards.iter().map(|c| c.summary.id).collect();
    assert_eq!(
        changed,
        vec![verified],
        "only the verified card changed and stayed live"
    );
    assert_eq!(delta.cards[0].summary.trust, mop_cards::Trust::Verified);

    // A delta from the current version is empty; one from another epoch is the full manifest.
    let r = node.get(&format!(
        "/v1/workspaces/{WS}/manifest?since={}",
        Version::of(&now)
    ));
    let empty: Manifest = r.json().unwrap();
    assert!(empty.cards.is_empty() && empty.removed.is_empty() && empty.since.is_some());
    let other = format!("00000000-0000-4000-8000-000000000000-{}", full.revision);
    let r = node.get(&format!("/v1/workspaces/{WS}/manifest?since={other}"));
    let m: Manifest = r.json().unwrap();
    assert_eq!(m.since, None);
    assert_eq!(m.cards.len(), now.cards.len());
    // A malformed since is a clear 400.
    let r = node.get(&format!("/v1/workspaces/{WS}/manifest?since=yesterday"));
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().unwrap().contains("since"));
}

#[test]
fn store_dedup_outcomes_and_the_author_only_rule() {
    let (_server, admin, node) = setup("");
    let title = "Batch deletes lag the replica";
    let (s, v) = node.store(Some("alice"), None, title, "Delete 10k rows at a time.");
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let first = stored(&v);
    assert_eq!(first.outcome, StoreOutcome::Created);
    let first_id = first.id.expect("a created card");
    let (_, v) = node.store_in(
        "t-2",
        Some("alice"),
        None,
        "batch DELETES lag the   replica",
        "Delete 10k rows\nat a time.",
    );
    assert_eq!(
        stored(&v),
        StoreResponse {
            outcome: StoreOutcome::Reinforced,
            id: first.id,
            revision: first.revision,
            audience: "unverified: only tasks of user alice see it, until a curator verifies it"
                .into(),
            verified: Some(false),
            note: format!(
                "Card {first_id}, which your tasks stored before, says the same; a curator has not verified it yet. Read it with `mop memory get {first_id}` and store only what is new."
            ),
            store_id: None,
            previously_rejected: None,
        }
    );
    // The same title with another lesson is another card: one rule decides what is the
    // same (the title alone would merge two fixes of one error).
    let (_, v) = node.store(Some("alice"), None, title, "Pause when lag passes 30 s.");
    assert_eq!(stored(&v).outcome, StoreOutcome::Created);
    assert_ne!(stored(&v).id, first.id);
    let text = admin
        .get(&format!("/v1/workspaces/{WS}/cards/{first_id}"))
        .text()
        .unwrap();
    assert!(
        text.contains("Delete 10k rows at a time.")
            && !text.contains("Pause when lag passes 30 s."),
        "{text}"
    );
    assert!(text.contains("trust: unverified"), "{text}");

    // Bob cannot see alice's unverified card: the same text makes a new card for bob.
    let (_, v) = node.store(Some("bob"), None, title, "Delete 10k rows at a time.");
    let bobs = stored(&v);
    assert_eq!(bobs.outcome, StoreOutcome::Created);
    assert_ne!(bobs.id, first.id);
    let (_, m) = node.manifest(WS);
    let entry = m.cards.iter().find(|c| c.summary.id == first_id).unwrap();
    assert_eq!(entry.summary.restricted_to_author(), Some("alice"));
    assert_eq!(
        entry
            .summary
            .provenance
            .as_ref()
            .unwrap()
            .task_id
            .as_deref(),
        Some("t-1")
    );

    // Once verified, an equal store reinforces it, and new text never rewrites it.
    assert!(
        admin
            .post(&format!("/v1/workspaces/{WS}/cards/{first_id}/verify"))
            .status()
            .is_success()
    );
    let verified_text = admin
        .get(&format!("/v1/workspaces/{WS}/cards/{first_id}"))
        .text()
        .unwrap();
    let (_, v) = node.store_in(
        "t-carol",
        Some("carol"),
        None,
        title,
        &mop_cards::parse_card(verified_text.as_bytes())
            .unwrap()
            .body,
    );
    assert_eq!(stored(&v).outcome, StoreOutcome::Reinforced);
    assert_eq!(stored(&v).id, first.id);
    let (_, v) = node.store(Some("alice"), None, title, "Something new.");
    assert_eq!(stored(&v).outcome, StoreOutcome::Created);
    assert_eq!(
        admin
            .get(&format!("/v1/workspaces/{WS}/cards/{first_id}"))
            .text()
            .unwrap(),
        verified_text
    );

    // A task may bind a card only to its own user and asset.
    let r = node.post_json(
        &format!("/v1/workspaces/{WS}/memories"),
        &json!({"provenance": {"task_id": "t-2", "user_id": "alice", "asset_id": "db-prod-01"},
                "card": {"type": "fact", "title": "x", "body": "y", "scope": {"user_id": "bob"}}}),
    );
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().unwrap().contains("scope.user_id"));
    let r = node.post_json(
        &format!("/v1/workspaces/{WS}/memories"),
        &json!({"provenance": {"task_id": "t-2", "user_id": "alice", "asset_id": "db-prod-01"},
                "card": {"type": "fact", "title": "x", "body": "y", "scope": {"asset_id": "pg-orders-01"}}}),
    );
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().unwrap().contains("scope.asset_id"));
}

#[test]
fn other_workspaces_answer_404_like_missing_things() {
    let (server, admin, node) = setup("");
    let other_admin = Api::new(&server, &server.token("admin", &["globex"]));
    let out = server.import(&example_cards_dir(), "globex");
    assert!(out.status.success());
    let (_, m) = node.manifest(WS);
    let card = &m.cards[0];
    let missing_ws = node.get("/v1/workspaces/nowhere/manifest");
    assert_eq!(missing_ws.status(), StatusCode::NOT_FOUND);
    let missing_body: Value = missing_ws.json().unwrap();
    let other_ws = node.get("/v1/workspaces/globex/manifest");
    assert_eq!(other_ws.status(), StatusCode::NOT_FOUND);
    let other_body: Value = other_ws.json().unwrap();
    assert_eq!(other_body["error"], missing_body["error"]);
    assert_eq!(other_body["message"], "workspace globex not found");
    // Objects and cards of another workspace: 404 through the wrong token, 200 through the right one.
    assert_eq!(
        node.get(&format!("/v1/workspaces/globex/objects/{}", card.sha256))
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        admin
            .get(&format!("/v1/workspaces/globex/cards/{}", card.summary.id))
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        other_admin
            .get(&format!("/v1/workspaces/globex/cards/{}", card.summary.id))
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        other_admin
            .get(&format!("/v1/workspaces/{WS}/cards/{}", card.summary.id))
            .status(),
        StatusCode::NOT_FOUND
    );
    // A missing card id in scope looks the same as one in another workspace.
    let r = admin.get(&format!(
        "/v1/workspaces/{WS}/cards/00000000-0000-4000-8000-000000000000"
    ));
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // Node tokens cannot use admin endpoints.
    let r = node.get(&format!("/v1/workspaces/{WS}/cards/{}", card.summary.id));
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().unwrap().contains("admin token"));
}

#[test]
fn objects_single_batch_and_retention() {
    let (_server, admin, node) = setup("");
    let (_, m) = node.manifest(WS);
    let e = &m.cards[0];
    let r = node.get(&format!("/v1/workspaces/{WS}/objects/{}", e.sha256));
    assert_eq!(r.status(), StatusCode::OK);
    let bytes = r.bytes().unwrap();
    assert_eq!(mop_cards::sha256_hex(&bytes), e.sha256);
    assert_eq!(bytes.len() as u64, e.size);

    let mut shas: Vec<String> = m.cards.iter().map(|c| c.sha256.clone()).collect();
    shas.push("f".repeat(64));
    let r = node.post_json(
        &format!("/v1/workspaces/{WS}/objects/batch"),
        &json!({"sha256": shas}),
    );
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["content-type"],
        mop_proto::sync::OBJECT_BATCH_TYPE
    );
    let items = decode_batch(&r.bytes().unwrap(), 1 << 20).unwrap();
    assert_eq!(items.len(), shas.len());
    for (sha, body) in &items[..items.len() - 1] {
        assert_eq!(&mop_cards::sha256_hex(body.as_ref().unwrap()), sha);
    }
    assert_eq!(
        items.last().unwrap().1,
        None,
        "unknown object reported missing"
    );

    assert_eq!(
        node.get(&format!("/v1/workspaces/{WS}/objects/nothex"))
            .status(),
        StatusCode::BAD_REQUEST
    );
    let r = node.post_json(
        &format!("/v1/workspaces/{WS}/objects/batch"),
        &json!({"sha256": ["../x"]}),
    );
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // After an update the old object stays fetchable for the retention window.
    let raw = admin
        .get(&format!("/v1/workspaces/{WS}/cards/{}", e.summary.id))
        .text()
        .unwrap();
    let r = admin
        .req(
            reqwest::Method::PUT,
            &format!("/v1/workspaces/{WS}/cards/{}", e.summary.id),
        )
        .body(format!("{raw}\nMore.\n"))
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        node.get(&format!("/v1/workspaces/{WS}/objects/{}", e.sha256))
            .status(),
        StatusCode::OK
    );
}

#[test]
fn sync_answers_are_compressed_as_asked_zstd_first() {
    use std::io::Read;
    let (server, _admin, node) = setup("");
    let raw = mop_testkit::http_builder()
        .gzip(false)
        .zstd(false)
        .build()
        .unwrap();
    let url = format!("{}/v1/workspaces/{WS}/manifest", server.url);
    let get = |accept: Option<&str>| {
        let mut r = raw.get(&url).bearer_auth(&node.token);
        if let Some(a) = accept {
            r = r.header("accept-encoding", a);
        }
        r.send().unwrap()
    };
    let plain = get(None);
    assert!(plain.headers().get("content-encoding").is_none());
    let plain = plain.bytes().unwrap();
    let zipped = get(Some("gzip"));
    assert_eq!(zipped.headers()["content-encoding"], "gzip");
    let zipped = zipped.bytes().unwrap();
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&zipped[..])
        .read_to_end(&mut unzipped)
        .unwrap();
    assert_eq!(unzipped, plain);
    // zstd when the client takes it (the daemon asks for both), never when refused.
    for accept in ["gzip, zstd", "zstd", "zstd;q=0.5, gzip"] {
        let z = get(Some(accept));
        assert_eq!(z.headers()["content-encoding"], "zstd", "{accept}");
        let z = z.bytes().unwrap();
        assert_eq!(zstd::decode_all(&z[..]).unwrap(), plain, "{accept}");
        assert!(
            z.len() * 2 < plain.len(),
            "zstd {} vs plain {}",
            z.len(),
            plain.len()
        );
    }
    assert_eq!(
        get(Some("zstd;q=0, gzip")).headers()["content-encoding"],
        "gzip"
    );
    assert!(
        get(Some("zstd;q=0"))
            .headers()
            .get("content-encoding")
            .is_none()
    );
    assert!(
        zipped.len() * 2 < plain.len(),
        "gzip {} vs plain {}",
        zipped.len(),
        plain.len()
    );

    // Object batches too: the same items whatever the coding.
    let (_, m) = node.manifest(WS);
    let shas: Vec<String> = m.cards.iter().map(|c| c.sha256.clone()).collect();
    let batch = |accept: &str| {
        let r = raw
            .post(format!("{}/v1/workspaces/{WS}/objects/batch", server.url))
            .bearer_auth(&node.token)
            .header("accept-encoding", accept)
            .json(&json!({ "sha256": shas }))
            .send()
            .unwrap();
        let coding = r
            .headers()
            .get("content-encoding")
            .map(|v| v.to_str().unwrap().to_owned());
        (coding, r.bytes().unwrap())
    };
    let (coding, plain) = batch("identity");
    assert_eq!(coding, None);
    let (coding, z) = batch("gzip, zstd");
    assert_eq!(coding.as_deref(), Some("zstd"));
    assert_eq!(zstd::decode_all(&z[..]).unwrap(), plain);
    assert_eq!(decode_batch(&plain, 1 << 20).unwrap().len(), shas.len());
}

#[test]
fn audit_rows_for_every_mutation() {
    let (_server, admin, node) = setup("");
    let (a, _) = example_card("Production change windows");
    let (unverified, _) = example_card("Undo advisor suggests");
    let cards = format!("/v1/workspaces/{WS}/cards");
    for (card, action) in [
        (a, "disable"),
        (a, "enable"),
        (unverified, "verify"),
        (a, "archive"),
        (a, "unarchive"),
    ] {
        let (status, text) = done(admin.post(&format!("{cards}/{card}/{action}")));
        assert!(
            status.is_success(),
            "{action}: {status} {text}\n{}",
            _server.log()
        );
    }
    let (_, v) = node.store(Some("alice"), None, "A note", "Text.");
    let id = stored(&v).id.expect("a stored card");
    node.store_in("t-2", Some("alice"), None, "A note", "Text.");
    // Another lesson: its own card, not a change of the first.
    node.store(Some("alice"), None, "A note", "More text.");
    assert!(
        admin
            .post(&format!("/v1/workspaces/{WS}/counters/publish"))
            .status()
            .is_success()
    );
    assert!(
        admin
            .req(reqwest::Method::DELETE, &format!("{cards}/{id}"))
            .send()
            .unwrap()
            .status()
            .is_success()
    );

    let rows: Vec<Value> = admin
        .get(&format!("/v1/workspaces/{WS}/history"))
        .json()
        .unwrap();
    let actions: Vec<&str> = rows.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(
        &actions[..2],
        ["token_create", "token_create"],
        "tokens are audited too"
    );
    let imports = actions.iter().filter(|a| **a == "import-create").count();
    assert_eq!(imports, card_files(&example_cards_dir()).len());
    assert_eq!(
        &actions[2 + imports..],
        [
            "disable",
            "enable",
            "verify",
            "archive",
            "unarchive",
            "store",
            "reinforce",
            "store",
            "publish_counters",
            "hard_delete"
        ]
    );
    // The hard delete redacted the card's history, keeping hashes.
    let rows: Vec<Value> = admin.get(&format!("{cards}/{id}/history")).json().unwrap();
    let actions: Vec<&str> = rows.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["store", "reinforce", "hard_delete"]);
    for r in &rows {
        assert!(r["content"].is_null(), "{r}");
    }
    for r in &rows[..2] {
        assert_eq!(r["redacted"], true, "{r}");
    }
    assert!(rows[0]["sha256_after"].is_string());
    assert_eq!(
        admin.get(&format!("{cards}/{id}")).status(),
        StatusCode::NOT_FOUND
    );
}

#[test]
fn import_export_round_trip_is_byte_exact() {
    let (server, _admin, _node) = setup("");
    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("export");
    let r = run(&mut server.cli(&[
        std::ffi::OsStr::new("export"),
        target.as_os_str(),
        "--workspace".as_ref(),
        WS.as_ref(),
    ]));
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let read = |dir: &std::path::Path| -> BTreeMap<String, Vec<u8>> {
        card_files(dir)
            .into_iter()
            .map(|p| {
                (
                    p.strip_prefix(dir).unwrap().display().to_string(),
                    std::fs::read(&p).unwrap(),
                )
            })
            .collect()
    };
    let original = read(&example_cards_dir());
    let exported = read(&target);
    assert_eq!(
        original.keys().collect::<Vec<_>>(),
        exported.keys().collect::<Vec<_>>()
    );
    for (k, v) in &original {
        assert!(exported[k] == *v, "{k} differs after import and export");
    }
    // Exporting into a non-empty directory is refused.
    let r = run(&mut server.cli(&[
        std::ffi::OsStr::new("export"),
        target.as_os_str(),
        "--workspace".as_ref(),
        WS.as_ref(),
    ]));
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("not empty"));
}

#[test]
fn import_reports_each_rejected_file_and_imports_the_rest() {
    let server = Server::start();
    let admin = Api::new(&server, &server.token("admin", &[WS]));
    let dir = tempfile::tempdir().unwrap();
    let good = "1528fa6d-2786-4c33-9e4e-a2e4e84ca7d7";
    let write = |rel: &str, text: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        &format!("facts/specs/{good}.md"),
        &format!("---\nid: {good}\ntype: fact\ntitle: Good\n---\nok\n"),
    );
    write("facts/specs/bad-yaml.md", "---\nid: [unclosed\n---\nx\n");
    let misplaced = "2528fa6d-2786-4c33-9e4e-a2e4e84ca7d7";
    write(
        &format!("docs/{misplaced}.md"),
        &format!("---\nid: {misplaced}\ntype: fact\ntitle: Wrong place\n---\nx\n"),
    );
    let no_title = "3528fa6d-2786-4c33-9e4e-a2e4e84ca7d7";
    write(
        &format!("facts/specs/{no_title}.md"),
        &format!("---\nid: {no_title}\ntype: fact\n---\nx\n"),
    );
    let out = server.import(dir.path(), WS);
    assert!(!out.status.success(), "a partial import exits non-zero");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad-yaml.md") && stderr.contains("frontmatter YAML"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("docs/{misplaced}.md"))
            && stderr.contains(&format!("facts/specs/{misplaced}.md")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{no_title}.md")) && stderr.contains("`title` is required"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("1 created") && stdout.contains("3 rejected"),
        "{stdout}"
    );
    let (_, m) = admin.manifest(WS);
    assert_eq!(m.cards.len(), 1);
    assert_eq!(m.cards[0].summary.title, "Good");
}

#[test]
fn restart_keeps_everything() {
    let (mut server, admin, node) = setup("");
    let (_, v) = node.store(Some("alice"), None, "Kept", "Across restarts.");
    let id = stored(&v).id.expect("a stored card");
    let (etag, before) = node.manifest(WS);
    server.restart();
    let node = Api::new(&server, &node.token);
    let admin = Api::new(&server, &admin.token);
    let (etag2, after) = node.manifest(WS);
    assert_eq!(etag, etag2, "same epoch and revision");
    assert_eq!(before.cards, after.cards);
    assert_eq!(
        admin
            .get(&format!("/v1/workspaces/{WS}/cards/{id}"))
            .status(),
        StatusCode::OK
    );
    let rows: Vec<Value> = admin
        .get(&format!("/v1/workspaces/{WS}/cards/{id}/history"))
        .json()
        .unwrap();
    assert_eq!(rows.len(), 1);
}

#[test]
fn tokens_missing_invalid_and_revoked() {
    let server = Server::start();
    let node_token = server.token("node", &[WS]);
    let url = format!("{}/v1/workspaces/{WS}/manifest", server.url);
    let http = mop_testkit::http();
    let check = |r: Response, needle: &str| {
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().unwrap();
        assert_eq!(v["error"], "unauthorized");
        assert!(v["message"].as_str().unwrap().contains(needle), "{v}");
    };
    check(http.get(&url).send().unwrap(), "missing bearer token");
    check(
        http.get(&url)
            .header("authorization", "Basic abc")
            .send()
            .unwrap(),
        "Bearer",
    );
    check(
        http.get(&url)
            .bearer_auth("mop_tokdeadbeef_0000")
            .send()
            .unwrap(),
        "not valid",
    );
    assert_eq!(
        http.get(&url)
            .bearer_auth(&node_token)
            .send()
            .unwrap()
            .status(),
        StatusCode::OK
    );

    let list = run(&mut server.cli(&["token", "list", "--json"]));
    let rows: Vec<Value> = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(rows.len(), 1);
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains(&node_token),
        "list never shows secrets"
    );
    let id = rows[0]["id"].as_str().unwrap();
    assert!(
        run(&mut server.cli(&["token", "revoke", id]))
            .status
            .success()
    );
    // The running server notices the CLI's change within a second or so.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = http.get(&url).bearer_auth(&node_token).send().unwrap();
        if r.status() == StatusCode::UNAUTHORIZED {
            check(r, "revoked");
            break;
        }
        assert!(Instant::now() < deadline, "revocation not noticed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The revocation is in the audit history, once: revoking again writes nothing.
    assert!(
        run(&mut server.cli(&["token", "revoke", id]))
            .status
            .success()
    );
    let admin = server.token("admin", &[WS]);
    let rows: Vec<Value> = http
        .get(format!("{}/v1/workspaces/{WS}/history", server.url))
        .bearer_auth(&admin)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let revokes: Vec<&Value> = rows
        .iter()
        .filter(|r| r["action"] == "token_revoke")
        .collect();
    assert_eq!(revokes.len(), 1, "{rows:?}");
    assert!(
        revokes[0]["detail"].as_str().unwrap().contains(id),
        "{:?}",
        revokes[0]
    );
    assert!(
        !server.log().contains(&node_token),
        "the log never shows a token"
    );
}

#[test]
fn bad_requests_get_clear_json_errors() {
    let server = Server::start_with("[server]\nmax_body_bytes = 8192\n");
    let node = Api::new(&server, &server.token("node", &[WS]));
    let admin = Api::new(&server, &server.token("admin", &[WS]));
    let memories = format!("/v1/workspaces/{WS}/memories");
    let expect = |r: Response, status: StatusCode, needle: &str| {
        assert_eq!(r.status(), status, "expected {status} for {needle}");
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().unwrap();
        assert!(
            v["message"].as_str().unwrap().contains(needle),
            "{v} lacks {needle:?}"
        );
    };
    let raw = |body: &str| {
        node.req(reqwest::Method::POST, &memories)
            .body(body.to_owned())
            .send()
            .unwrap()
    };
    expect(
        raw("{\"provenance\": "),
        StatusCode::BAD_REQUEST,
        "malformed JSON",
    );
    expect(raw("\u{0}\u{1}"), StatusCode::BAD_REQUEST, "malformed JSON");
    let ok_card = json!({"type": "fact", "title": "t", "body": "b"});
    let r = node.post_json(
        &memories,
        &json!({"provenance": {"task_id": "t"}, "card": ok_card, "extra": 1}),
    );
    expect(r, StatusCode::BAD_REQUEST, "unknown field `extra`");
    let r = node.post_json(
        &memories,
        &json!({"provenance": {"task_id": "t", "user": "bob"}, "card": ok_card}),
    );
    expect(r, StatusCode::BAD_REQUEST, "unknown field `user`");
    let r = node.post_json(
        &memories,
        &json!({"provenance": {"task_id": 5}, "card": ok_card}),
    );
    expect(r, StatusCode::BAD_REQUEST, "invalid type");
    let r = node.post_json(&memories, &json!({"provenance": {"task_id": "t"}, "card": {"type": "memo", "title": "t", "body": "b"}}));
    expect(r, StatusCode::BAD_REQUEST, "unknown variant `memo`");
    let r = node.post_json(
        &memories,
        &json!({"provenance": {"task_id": "../x"}, "card": ok_card}),
    );
    expect(r, StatusCode::UNPROCESSABLE_ENTITY, "task_id");
    let r = node.post_json(&memories, &json!({"provenance": {"task_id": "t"}, "card": {"type": "fact", "title": "t", "body": ""}}));
    expect(r, StatusCode::UNPROCESSABLE_ENTITY, "body is empty");
    let big = json!({"provenance": {"task_id": "t"}, "card": {"type": "fact", "title": "t", "body": "x".repeat(9000)}});
    expect(
        node.post_json(&memories, &big),
        StatusCode::PAYLOAD_TOO_LARGE,
        "8192",
    );
    expect(
        admin.get(&format!("/v1/workspaces/{WS}/cards/not-a-uuid")),
        StatusCode::BAD_REQUEST,
        "not a UUID",
    );
    expect(
        admin.get(&format!("/v1/workspaces/{WS}/cards/..%2F..%2Fetc")),
        StatusCode::BAD_REQUEST,
        "path",
    );
    let r = admin
        .req(reqwest::Method::POST, &format!("/v1/workspaces/{WS}/cards"))
        .body("no frontmatter")
        .send()
        .unwrap();
    expect(r, StatusCode::UNPROCESSABLE_ENTITY, "frontmatter");
    expect(
        node.get("/v1/nothing"),
        StatusCode::NOT_FOUND,
        "no such endpoint",
    );
    // Nothing above changed the workspace.
    assert_eq!(node.revision(WS), 0);
}

#[test]
fn a_failure_inside_a_transaction_leaves_nothing_behind() {
    let (server, admin, node) = setup("");
    let (_, before) = node.manifest(WS);
    let history_before: Vec<Value> = admin
        .get(&format!("/v1/workspaces/{WS}/history"))
        .json()
        .unwrap();
    // Make the audit insert, the last write of every mutation, fail inside its transaction.
    let db = rusqlite::Connection::open(server.db()).unwrap();
    db.execute_batch("CREATE TRIGGER fail_audit BEFORE INSERT ON history BEGIN SELECT RAISE(ABORT, 'injected failure'); END;")
        .unwrap();
    let (status, v) = node.store(Some("alice"), None, "Never written", "Should roll back.");
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_eq!(v["error"], "internal");
    let (a, _) = example_card("Production change windows");
    assert_eq!(
        admin
            .post(&format!("/v1/workspaces/{WS}/cards/{a}/disable"))
            .status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let failed_import = server.import(&example_cards_dir(), "fresh");
    assert!(!failed_import.status.success());
    db.execute_batch("DROP TRIGGER fail_audit;").unwrap();

    let (_, after) = node.manifest(WS);
    assert_eq!(after.revision, before.revision, "no revision was bumped");
    assert_eq!(after.cards, before.cards, "no card changed");
    let cards: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM cards WHERE title_key = 'never written'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(cards, 0);
    let objects: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM objects WHERE workspace = 'fresh'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(objects, 0, "the failed import wrote no object");
    let history_after: Vec<Value> = admin
        .get(&format!("/v1/workspaces/{WS}/history"))
        .json()
        .unwrap();
    assert_eq!(history_after.len(), history_before.len());
    // And the same store works once the fault is gone.
    let (status, _) = node.store(Some("alice"), None, "Never written", "Now it is.");
    assert_eq!(status, StatusCode::CREATED);
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let mut server = Server::start();
    assert!(
        server.stop(),
        "exit status 0 after SIGTERM; log:\n{}",
        server.log()
    );
    assert!(
        server.log().contains("mop-server stopped"),
        "{}",
        server.log()
    );
}

/// Admin tokens name a person (the audit says who did what), tokens may expire, and `token
/// list` shows each token's last use.
#[test]
fn tokens_carry_names_expire_and_show_their_last_use() {
    let mut server = Server::start();
    let nameless = run(&mut server.cli(&["token", "create", "--role", "admin", "--workspace", WS]));
    assert!(!nameless.status.success());
    assert!(
        String::from_utf8_lossy(&nameless.stderr).contains("needs --name"),
        "{}",
        String::from_utf8_lossy(&nameless.stderr)
    );
    let bad = run(&mut server.cli(&[
        "token",
        "create",
        "--role",
        "node",
        "--workspace",
        WS,
        "--expires-in",
        "soon",
    ]));
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a duration"));
    let create = |args: &[&str]| {
        let mut all = vec!["token", "create", "--workspace", WS];
        all.extend(args);
        let out = run(&mut server.cli(&all));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let short = create(&["--role", "node", "--expires-in", "2s"]);
    let lasting = create(&[
        "--role",
        "admin",
        "--name",
        "Dana Reviewer",
        "--expires-in",
        "90d",
    ]);
    let url = format!("{}/v1/workspaces/{WS}/manifest", server.url);
    let http = mop_testkit::http();
    // Control: both work now.
    for t in [&short, &lasting] {
        assert_eq!(
            http.get(&url).bearer_auth(t).send().unwrap().status(),
            StatusCode::OK
        );
    }
    std::thread::sleep(Duration::from_millis(2500));
    let r = http.get(&url).bearer_auth(&short).send().unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let v: Value = r.json().unwrap();
    assert!(v["message"].as_str().unwrap().contains("expired"), "{v}");
    assert_eq!(
        http.get(&url)
            .bearer_auth(&lasting)
            .send()
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // Uses are written at most once a minute, and at shutdown.
    assert!(server.stop());
    let list = run(&mut server.cli(&["token", "list", "--json"]));
    let rows: Vec<Value> = serde_json::from_slice(&list.stdout).unwrap();
    let admin = rows.iter().find(|r| r["role"] == "admin").unwrap();
    assert_eq!(admin["name"], "Dana Reviewer");
    assert!(
        admin["expires_at"].is_string() && admin["last_used_at"].is_string(),
        "{admin}"
    );
    let text =
        String::from_utf8_lossy(&run(&mut server.cli(&["token", "list"])).stdout).into_owned();
    assert!(
        text.contains("Dana Reviewer") && text.contains("expired"),
        "{text}"
    );
}
