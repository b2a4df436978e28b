//! The store's conformance suite: every case runs against both engines, a real SQLite file
//! and a real PostgreSQL (a fresh cluster per case, from Debian's `postgresql` package; under
//! `CI=true` a missing PostgreSQL fails instead of skipping).
//!
//! Covered: revisions and ETags (also as two servers on one database see them), deltas and
//! their history floor, agent-store dedup, audit rows written in the same transaction as
//! the change (a refused change leaves none), purge, object retention and hard delete,
//! tokens, migrations, conditional changes, receipts counted once, and the curation
//! queries (review queue, merge, reject, stale report).

use mop_cards::{CardId, sha256_hex};
use mop_server::service::curation::{self, CardState};
use mop_server::service::memories::{StoreLimits, store_memory};
use mop_server::store::{
    Database, Expect, ManifestKind, NewToken, Role, Store, StoreError, token_hash,
};
use mop_testkit::postgres::Postgres;

const WS: &str = "acme";

#[derive(Debug, Clone, Copy)]
enum Engine {
    Sqlite,
    Postgres,
}

/// A fresh, empty database of one engine, removed on drop.
struct Db {
    database: Database,
    _dir: tempfile::TempDir,
    pg: Option<Postgres>,
}

impl Db {
    fn fresh(engine: Engine) -> Db {
        let dir = tempfile::tempdir().unwrap();
        match engine {
            Engine::Sqlite => Db {
                database: Database::Sqlite(dir.path().join("mop.db")),
                _dir: dir,
                pg: None,
            },
            Engine::Postgres => {
                let pg = Postgres::start().expect(
                    "PostgreSQL is not installed: apt-get install postgresql (CI installs it)",
                );
                Db {
                    database: Database::parse(&pg.url()),
                    _dir: dir,
                    pg: Some(pg),
                }
            }
        }
    }

    /// A new connection to it, as another server process would open it.
    fn store(&self) -> Store {
        Store::connect(&self.database).unwrap()
    }

    /// One number from SQL, read outside the store.
    fn count(&self, sql: &str) -> i64 {
        match (&self.database, &self.pg) {
            (Database::Sqlite(path), _) => rusqlite::Connection::open(path)
                .unwrap()
                .query_row(sql, [], |r| r.get(0))
                .unwrap(),
            (Database::Postgres(_), Some(pg)) => pg.psql(sql).parse().unwrap(),
            _ => unreachable!(),
        }
    }

    /// Runs one SQL statement outside the store.
    fn exec(&self, sql: &str) {
        match (&self.database, &self.pg) {
            (Database::Sqlite(path), _) => {
                rusqlite::Connection::open(path)
                    .unwrap()
                    .execute(sql, [])
                    .unwrap();
            }
            (Database::Postgres(_), Some(pg)) => {
                pg.psql(sql);
            }
            _ => unreachable!(),
        }
    }

    fn schema_version(&self) -> i64 {
        match &self.database {
            Database::Sqlite(_) => self.count("PRAGMA user_version"),
            Database::Postgres(_) => self.count("SELECT version FROM schema_version"),
        }
    }

    fn set_schema_version(&self, v: i64) {
        match (&self.database, &self.pg) {
            (Database::Sqlite(path), _) => rusqlite::Connection::open(path)
                .unwrap()
                .pragma_update(None, "user_version", v)
                .unwrap(),
            (Database::Postgres(_), Some(pg)) => {
                pg.psql(&format!("UPDATE schema_version SET version = {v}"));
            }
            _ => unreachable!(),
        }
    }
}

fn card(id: &str, title: &str) -> (String, Vec<u8>) {
    let path = format!("facts/specs/{id}.md");
    (
        path,
        format!("---\nid: {id}\ntype: fact\ntitle: {title}\n---\nBody of {title}.\n").into_bytes(),
    )
}

const A: &str = "00000000-0000-4000-8000-00000000000a";
const B: &str = "00000000-0000-4000-8000-00000000000b";

fn open(engine: Engine) -> (Db, Store) {
    let db = Db::fresh(engine);
    let store = db.store();
    store
        .import(
            WS,
            vec![card(A, "Alpha"), card(B, "Beta")],
            "test",
            &[],
            &[],
        )
        .unwrap();
    (db, store)
}

/// An agent's store from task `task` of user `u`.
fn agent_store(task: &str, title: &str) -> mop_proto::sync::StoreRequest {
    mop_proto::sync::StoreRequest {
        provenance: mop_proto::sync::Provenance {
            task_id: Some(task.into()),
            user_id: Some("u".into()),
            ..Default::default()
        },
        card: mop_proto::sync::NewCard {
            card_type: mop_cards::CardType::Fact,
            title: title.into(),
            description: None,
            labels: vec![],
            error_codes: vec![],
            stacks: vec![],
            scope: Default::default(),
            body: "x".into(),
        },
    }
}

const LIMITS: StoreLimits = StoreLimits { stores_per_task: 2 };

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(#[test] fn $case() { super::$case(super::Engine::Sqlite) })*
        }
        mod postgres {
            $(#[test] fn $case() { super::$case(super::Engine::Postgres) })*
        }
    };
}

conformance!(
    two_servers_on_one_database_give_the_same_revisions_and_etags,
    agent_stores_are_deduplicated_and_audited_in_their_transaction,
    tokens_are_created_looked_up_and_revoked,
    the_review_queue_lists_unverified_cards_until_verified,
    a_hard_delete_leaves_no_content,
    archived_cards_are_purged_after_retention_and_history_redacted,
    released_objects_live_for_the_retention_window,
    deltas_fall_back_to_full_once_their_history_is_forgotten,
    migrations_are_versioned_and_newer_databases_refused,
    stored_times_compare_correctly_as_strings,
    a_delta_over_its_limit_gives_way_to_the_full_manifest,
    a_change_sent_with_an_old_version_is_refused_and_changes_nothing,
    a_receipt_counts_once_however_often_it_arrives,
    a_merge_carries_counters_and_chains_are_reported,
    rejecting_needs_a_reason_and_archives,
    a_verified_card_is_not_merged_where_fewer_tasks_see_it,
    the_queue_counts_come_from_the_per_row_flag_and_an_upgrade_fills_it,
    a_revert_restores_the_words_and_keeps_where_the_card_stands,
    verdicts_and_outcomes_count_per_card_and_flag_verified_memory,
);

fn two_servers_on_one_database_give_the_same_revisions_and_etags(engine: Engine) {
    let (db, one) = open(engine);
    let two = db.store();
    assert_eq!(one.epoch(), two.epoch());
    let a = CardId::parse(A).unwrap();
    let mut last = 0;
    // Writes alternate between the two; every one gets the next revision.
    for (n, store) in [&one, &two, &one, &two].into_iter().enumerate() {
        let change = curation::update_card(
            store,
            WS,
            &a,
            &card(A, &format!("Alpha {n}")).1,
            "test",
            Expect::Any,
            false,
        )
        .unwrap();
        assert!(change.revision > last, "{} after {last}", change.revision);
        last = change.revision;
    }
    let (m1, m2) = (
        one.manifest(WS, ManifestKind::Full).unwrap().manifest,
        two.manifest(WS, ManifestKind::Full).unwrap().manifest,
    );
    assert_eq!(m1.revision, last);
    assert_eq!(
        serde_json::to_string(&(&m1.epoch, m1.revision, &m1.cards)).unwrap(),
        serde_json::to_string(&(&m2.epoch, m2.revision, &m2.cards)).unwrap(),
        "the same manifest (but its generated_at), byte for byte"
    );
    assert_eq!(
        one.card_info(WS, &a).unwrap().etag,
        two.card_info(WS, &a).unwrap().etag
    );
    let revisions = |s: &Store| s.revisions().unwrap();
    assert_eq!(revisions(&one), revisions(&two));
}

fn agent_stores_are_deduplicated_and_audited_in_their_transaction(engine: Engine) {
    let (db, store) = open(engine);
    let history = || db.count("SELECT COUNT(*) FROM history");
    let cards = || db.count("SELECT COUNT(*) FROM cards");
    let (h0, c0) = (history(), cards());
    let first = store_memory(
        &store,
        WS,
        &agent_store("t1", "Lock  wait"),
        "token:n",
        LIMITS,
        None,
    )
    .unwrap();
    assert_eq!(first.outcome, mop_proto::sync::StoreOutcome::Created);
    assert_eq!((history(), cards()), (h0 + 1, c0 + 1));
    // The same title, folded, from another task: the same card, reinforced.
    let again = store_memory(
        &store,
        WS,
        &agent_store("t2", "lock wait"),
        "token:n",
        LIMITS,
        None,
    )
    .unwrap();
    assert_eq!(again.id, first.id);
    assert_eq!(cards(), c0 + 1, "no second card");
    let actions: Vec<String> = store
        .history(WS, first.id.as_ref().unwrap())
        .unwrap()
        .into_iter()
        .map(|h| h.action)
        .collect();
    assert_eq!(actions.first().map(String::as_str), Some("store"));
    let h1 = history();
    // A task over its limit is refused, and the refusal leaves no row at all: the count,
    // the card and the audit row are one transaction. Control: its first stores landed.
    store_memory(
        &store,
        WS,
        &agent_store("t3", "One"),
        "token:n",
        LIMITS,
        None,
    )
    .unwrap();
    store_memory(
        &store,
        WS,
        &agent_store("t3", "Two"),
        "token:n",
        LIMITS,
        None,
    )
    .unwrap();
    let (h2, c2) = (history(), cards());
    assert_eq!((h2, c2), (h1 + 2, c0 + 3));
    let refused = store_memory(
        &store,
        WS,
        &agent_store("t3", "Three"),
        "token:n",
        LIMITS,
        None,
    );
    assert!(matches!(refused, Err(StoreError::Limit(_))), "{refused:?}");
    assert_eq!((history(), cards()), (h2, c2));
}

fn tokens_are_created_looked_up_and_revoked(engine: Engine) {
    let db = Db::fresh(engine);
    let store = db.store();
    let workspaces = vec![WS.to_owned()];
    let (id, token) = store
        .create_token(&NewToken {
            role: Role::Admin,
            workspaces: &workspaces,
            note: Some("conformance"),
            name: Some("Carol"),
            expires_at: None,
            actor: "cli:token",
        })
        .unwrap();
    assert!(token.contains(&id));
    let table = store.token_table().unwrap();
    let (_, info) = table
        .iter()
        .find(|(hash, _)| *hash == token_hash(&token))
        .expect("looked up by the token's hash");
    assert_eq!(
        (info.role, info.name.as_deref(), info.revoked),
        (Role::Admin, Some("Carol"), false)
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM tokens WHERE hash LIKE 'mop_%'"),
        0
    );
    let listed = store.list_tokens().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].workspaces, workspaces);
    store.revoke_token(&id, "cli:token").unwrap();
    let table = store.token_table().unwrap();
    assert!(table.iter().all(|(_, t)| t.id != id || t.revoked));
    assert!(matches!(
        store.revoke_token("nosuchtoken", "cli:token"),
        Err(StoreError::NotFound(_))
    ));
    // Admin tokens must name a person; nothing is written when refused.
    let refused = store.create_token(&NewToken {
        role: Role::Admin,
        workspaces: &workspaces,
        note: None,
        name: None,
        expires_at: None,
        actor: "cli:token",
    });
    assert!(refused.is_err());
    assert_eq!(db.count("SELECT COUNT(*) FROM tokens"), 1);
}

fn the_review_queue_lists_unverified_cards_until_verified(engine: Engine) {
    let (_db, store) = open(engine);
    let one = store_memory(
        &store,
        WS,
        &agent_store("t1", "First"),
        "token:n",
        LIMITS,
        None,
    )
    .unwrap();
    let two = store_memory(
        &store,
        WS,
        &agent_store("t2", "Second"),
        "token:n",
        LIMITS,
        None,
    )
    .unwrap();
    let queue = store.review_queue(WS, None, None).unwrap();
    let (counts, page) = (queue.counts, queue.page);
    assert_eq!(
        (queue.entries, queue.cards),
        (2, 2),
        "two lessons, one card each"
    );
    let ids: Vec<CardId> = page
        .iter()
        .map(|(_, cards)| cards[0].0.summary.id)
        .collect();
    assert_eq!(
        ids,
        [one.id.unwrap(), two.id.unwrap()],
        "oldest first; imported cards are verified"
    );
    assert_eq!((counts.by_type.get("fact"), counts.under_1d), (Some(&2), 2));
    curation::verify(
        &store,
        WS,
        one.id.as_ref().unwrap(),
        None,
        "token:c",
        Expect::Any,
        false,
    )
    .unwrap();
    let page = store.review_queue(WS, None, None).unwrap().page;
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].1[0].0.summary.id, two.id.unwrap());
    assert!(page[0].1[0].1.contains("title: Second"), "with its text");
}

fn a_hard_delete_leaves_no_content(engine: Engine) {
    let (db, store) = open(engine);
    let a = CardId::parse(A).unwrap();
    let sha = sha256_hex(&card(A, "Alpha").1);
    store.hard_delete(WS, &a, "test", None).unwrap();
    assert!(matches!(
        store.card_text(WS, &a),
        Err(StoreError::NotFound(_))
    ));
    assert!(store.object(WS, &sha).unwrap().is_none());
    assert_eq!(
        db.count("SELECT COUNT(*) FROM history WHERE content LIKE '%Body of Alpha%'"),
        0
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM cards"), 1, "B stays");
}

fn archived_cards_are_purged_after_retention_and_history_redacted(engine: Engine) {
    let (db, store) = open(engine);
    let a = CardId::parse(A).unwrap();
    let before_archive = store
        .manifest(WS, ManifestKind::Full)
        .unwrap()
        .manifest
        .revision;
    curation::set_state(
        &store,
        WS,
        &a,
        CardState::Archive,
        None,
        "test",
        Expect::Any,
    )
    .unwrap();
    // Within the retention nothing is purged.
    assert_eq!(store.collect_garbage(3600, 3600, 3600).unwrap(), (0, 0));
    assert!(store.card_text(WS, &a).is_ok());
    // Past it, the card and its content go; its history keeps hashes only.
    let (purged, _) = store.collect_garbage(0, 3600, 3600).unwrap();
    assert_eq!(purged, 1);
    assert!(matches!(
        store.card_text(WS, &a),
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(
        db.count("SELECT COUNT(*) FROM objects"),
        1,
        "only B's object is left"
    );
    let history = store.history(WS, &a).unwrap();
    let actions: Vec<&str> = history.iter().map(|h| h.action.as_str()).collect();
    assert_eq!(actions, ["import-create", "archive", "purge"]);
    assert!(history.iter().all(|h| h.content.is_none()));
    assert!(history[0].redacted && history[0].sha256_after.is_some());
    // A daemon that last saw the workspace before the archive learns that A is gone.
    let delta = store
        .manifest(WS, ManifestKind::Delta(before_archive))
        .unwrap()
        .manifest;
    assert_eq!(delta.removed, vec![a]);
}

fn released_objects_live_for_the_retention_window(engine: Engine) {
    let (db, store) = open(engine);
    let b = CardId::parse(B).unwrap();
    let old_sha = sha256_hex(&card(B, "Beta").1);
    curation::update_card(
        &store,
        WS,
        &b,
        &card(B, "Beta two").1,
        "test",
        Expect::Any,
        false,
    )
    .unwrap();
    assert!(
        store.object(WS, &old_sha).unwrap().is_some(),
        "kept for daemons mid-sync"
    );
    assert_eq!(store.collect_garbage(3600, 3600, 3600).unwrap(), (0, 0));
    assert!(store.object(WS, &old_sha).unwrap().is_some());
    assert_eq!(store.collect_garbage(3600, 0, 3600).unwrap(), (0, 1));
    assert!(store.object(WS, &old_sha).unwrap().is_none());
    assert_eq!(
        db.count("SELECT COUNT(*) FROM objects"),
        2,
        "live objects are never collected"
    );
}

fn deltas_fall_back_to_full_once_their_history_is_forgotten(engine: Engine) {
    let (_db, store) = open(engine);
    let a = CardId::parse(A).unwrap();
    let old = store
        .manifest(WS, ManifestKind::Full)
        .unwrap()
        .manifest
        .revision;
    store.hard_delete(WS, &a, "test", None).unwrap();
    let delta = store
        .manifest(WS, ManifestKind::Delta(old))
        .unwrap()
        .manifest;
    assert_eq!(delta.since, Some(old));
    assert_eq!(delta.removed, vec![a]);
    // Forgetting the tombstone raises the floor: the old revision now gets a full manifest.
    store.collect_garbage(3600, 3600, 0).unwrap();
    let full = store
        .manifest(WS, ManifestKind::Delta(old))
        .unwrap()
        .manifest;
    assert_eq!(full.since, None);
    assert_eq!(full.cards.len(), 1);
    // A delta from the current revision still works.
    let now = full.revision;
    assert_eq!(
        store
            .manifest(WS, ManifestKind::Delta(now))
            .unwrap()
            .manifest
            .since,
        Some(now)
    );
}

fn migrations_are_versioned_and_newer_databases_refused(engine: Engine) {
    let db = Db::fresh(engine);
    let epoch = db.store().epoch().to_owned();
    assert_eq!(db.store().epoch(), epoch, "reopening keeps the epoch");
    assert_eq!(
        db.schema_version(),
        8,
        "migration 8: verdicts and task outcomes"
    );
    db.set_schema_version(99);
    let err = Store::connect(&db.database).unwrap_err();
    assert!(matches!(err, StoreError::TooNew { found: 99, .. }), "{err}");
    assert!(err.to_string().contains("upgrade mop-server"));
}

fn stored_times_compare_correctly_as_strings(engine: Engine) {
    // Reinforcements record last_seen; publishing keeps the later of two times even when
    // their fractional digits differ.
    let (_db, store) = open(engine);
    // Each reinforcement from another task: a task counts once per card.
    let req = |task: &str| mop_proto::sync::StoreRequest {
        provenance: mop_proto::sync::Provenance {
            task_id: Some(task.into()),
            user_id: Some("u".into()),
            ..Default::default()
        },
        card: mop_proto::sync::NewCard {
            card_type: mop_cards::CardType::Fact,
            title: "Same".into(),
            description: None,
            labels: vec![],
            error_codes: vec![],
            stacks: vec![],
            scope: Default::default(),
            body: "x".into(),
        },
    };
    let limits = StoreLimits {
        stores_per_task: 50,
    };
    let first = store_memory(&store, WS, &req("t0"), "test", limits, None).unwrap();
    for n in 1..4 {
        store_memory(&store, WS, &req(&format!("t{n}")), "test", limits, None).unwrap();
    }
    store.publish_counters(None).unwrap();
    let m = store.manifest(WS, ManifestKind::Full).unwrap().manifest;
    let e = m
        .cards
        .iter()
        .find(|c| Some(c.summary.id) == first.id)
        .unwrap();
    assert_eq!(e.occurrence, 4);
    assert!(e.last_seen.unwrap() >= e.summary.created_at.unwrap());
}

fn a_delta_over_its_limit_gives_way_to_the_full_manifest(engine: Engine) {
    let db = Db::fresh(engine);
    let store = db.store();
    let ids: Vec<String> = (0..100)
        .map(|n| format!("00000000-0000-4000-8000-{n:012}"))
        .collect();
    store
        .import(
            WS,
            ids.iter()
                .map(|id| card(id, &format!("Card {id}")))
                .collect(),
            "test",
            &[],
            &[],
        )
        .unwrap();
    let base = store
        .manifest(WS, ManifestKind::Full)
        .unwrap()
        .manifest
        .revision;
    let edit = |id: &str, n: u32| {
        let (_, text) = card(id, &format!("Card {id} edit {n}"));
        curation::update_card(
            &store,
            WS,
            &CardId::parse(id).unwrap(),
            &text,
            "test",
            Expect::Any,
            false,
        )
        .unwrap();
    };
    for id in &ids[..40] {
        edit(id, 1);
    }
    // 40 of 100 changed, the limit 50 (half, as the API asks): a delta.
    let delta = store.delta(WS, base, Some(50)).unwrap().expect("a delta");
    assert_eq!(
        (delta.manifest.since, delta.manifest.cards.len()),
        (Some(base), 40)
    );
    for id in &ids[40..60] {
        edit(id, 1);
    }
    // 60 of 100: over the limit, so no delta; without a limit, still a delta.
    assert!(store.delta(WS, base, Some(50)).unwrap().is_none());
    let d = store.delta(WS, base, None).unwrap().expect("a delta");
    assert_eq!(d.manifest.cards.len(), 60);
    let m = store.manifest(WS, ManifestKind::Full).unwrap().manifest;
    // A recent revision still gets its small delta.
    let recent = m.revision;
    edit(&ids[0], 2);
    let d = store.delta(WS, recent, Some(50)).unwrap().expect("a delta");
    assert_eq!(d.manifest.cards.len(), 1);
}

fn a_change_sent_with_an_old_version_is_refused_and_changes_nothing(engine: Engine) {
    let (_db, store) = open(engine);
    let b = CardId::parse(B).unwrap();
    let seen = store.card_info(WS, &b).unwrap().etag;
    let first = curation::update_card(
        &store,
        WS,
        &b,
        &card(B, "Beta two").1,
        "test",
        Expect::IfMatch(&seen),
        false,
    )
    .unwrap();
    assert!(first.changed);
    assert_ne!(first.etag.as_deref(), Some(seen.as_str()));
    // A second curator who read the same version.
    let late = curation::update_card(
        &store,
        WS,
        &b,
        &card(B, "Beta three").1,
        "test",
        Expect::IfMatch(&seen),
        false,
    );
    match late {
        Err(StoreError::Precondition { current, .. }) => {
            assert_eq!(Some(current), first.etag)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.card_text(WS, &b).unwrap().0, card(B, "Beta two").1);
    // Actions take the same condition; `*` and lists work as in HTTP.
    let refused = curation::set_state(
        &store,
        WS,
        &b,
        CardState::Disable,
        None,
        "test",
        Expect::IfMatch(&seen),
    );
    assert!(matches!(refused, Err(StoreError::Precondition { .. })));
    let list = format!("{seen}, {}", first.etag.unwrap());
    assert!(
        curation::set_state(
            &store,
            WS,
            &b,
            CardState::Disable,
            None,
            "test",
            Expect::IfMatch(&list)
        )
        .is_ok()
    );
    // Archiving changes no byte, but it changes the version.
    let before = store.card_info(WS, &b).unwrap().etag;
    curation::set_state(
        &store,
        WS,
        &b,
        CardState::Archive,
        None,
        "test",
        Expect::IfMatch("*"),
    )
    .unwrap();
    let archived = store.card_info(WS, &b).unwrap().etag;
    assert_ne!(before, archived);
}

fn receipt(task: &str, cards: &[&str], retrieved: &[&str]) -> mop_proto::receipts::Receipt {
    use mop_proto::receipts::*;
    let id = |s: &&str| CardId::parse(s).unwrap();
    Receipt {
        schema: RECEIPT_SCHEMA.into(),
        task_id: task.into(),
        workspace: WS.into(),
        host: "host-a".into(),
        generation: "e-1".into(),
        profile: "default".into(),
        user_id: Some("alice".into()),
        asset_id: Some("db-prod-01".into()),
        project_id: None,
        agent: None,
        prepared_at: jiff::Timestamp::now(),
        ended_at: None,
        cards: cards
            .iter()
            .enumerate()
            .map(|(i, c)| ReceiptCard {
                id: id(c),
                sha256: "0".repeat(64),
                tier: mop_cards::Tier::L0,
                rank: i as u32 + 1,
                mounted: true,
                listed: true,
                workspace: None,
            })
            .collect(),
        cards_unlisted: 0,
        left_out: [0; 3],
        activity: Activity {
            retrieves: vec![RetrieveEvent {
                at: jiff::Timestamp::now(),
                query_hash: "f".repeat(64),
                hits: retrieved.iter().map(id).collect(),
            }],
            ..Default::default()
        },
        outcome: None,
        exit_code: None,
        capture: None,
    }
}

fn a_receipt_counts_once_however_often_it_arrives(engine: Engine) {
    let (_db, store) = open(engine);
    let r1 = receipt("t1", &[A, B], &[A]);
    let r2 = receipt("t2", &[A], &[]);
    let first = store
        .ingest_receipts(WS, "tokn", &[r1.clone(), r2])
        .unwrap();
    assert_eq!((first.accepted, first.duplicates), (2, 0));
    let again = store
        .ingest_receipts(WS, "tokn", std::slice::from_ref(&r1))
        .unwrap();
    assert_eq!((again.accepted, again.duplicates), (0, 1));
    let a = store
        .card_info(WS, &CardId::parse(A).unwrap())
        .unwrap()
        .usage;
    assert_eq!((a.delivered_7d, a.delivered_30d, a.retrieved_7d), (2, 2, 1));
    assert_eq!(a.hosts, ["host-a"]);
    assert!(a.last_delivered_at.is_some());
    let b = store
        .card_info(WS, &CardId::parse(B).unwrap())
        .unwrap()
        .usage;
    assert_eq!((b.delivered_7d, b.retrieved_7d), (1, 0));
    // A bad receipt in a batch: nothing of the batch is counted.
    let mut bad = receipt("t3", &[A], &[]);
    bad.activity.retrieves[0].query_hash = "the query itself".into();
    let err = store
        .ingest_receipts(WS, "tokn", &[receipt("t4", &[B], &[]), bad])
        .unwrap_err();
    assert!(err.to_string().contains("query_hash"), "{err}");
    let b = store
        .card_info(WS, &CardId::parse(B).unwrap())
        .unwrap()
        .usage;
    assert_eq!(b.delivered_7d, 1);
    // Another workspace's receipt is refused.
    let mut other = receipt("t5", &[A], &[]);
    other.workspace = "globex".into();
    assert!(store.ingest_receipts(WS, "tokn", &[other]).is_err());
}

fn a_merge_carries_counters_and_chains_are_reported(engine: Engine) {
    let (_db, store) = open(engine);
    let (a, b) = (CardId::parse(A).unwrap(), CardId::parse(B).unwrap());
    let before = store.card_info(WS, &b).unwrap().occurrence;
    let merged = curation::merge(&store, WS, &a, &b, None, "token:tokc", Expect::Any).unwrap();
    assert!(merged.changed);
    assert_eq!(store.card_info(WS, &b).unwrap().occurrence, before + 1);
    assert_eq!(
        store.card_info(WS, &a).unwrap().summary.superseded_by,
        Some(b)
    );
    assert!(
        curation::merge(&store, WS, &b, &b, None, "t", Expect::Any).is_err(),
        "not into itself"
    );
    let actions: Vec<String> = store
        .history(WS, &b)
        .unwrap()
        .into_iter()
        .map(|h| h.action)
        .collect();
    assert!(actions.contains(&"merge".to_owned()), "{actions:?}");
    // A → B is a chain of two: longer than 1, not longer than 2.
    assert_eq!(
        store.stale(WS, 30, 1).unwrap().long_chains[0].ids,
        vec![a, b]
    );
    assert!(store.stale(WS, 30, 2).unwrap().long_chains.is_empty());
}

fn rejecting_needs_a_reason_and_archives(engine: Engine) {
    let (_db, store) = open(engine);
    let a = CardId::parse(A).unwrap();
    assert!(matches!(
        curation::reject(&store, WS, &a, "  ", "t", Expect::Any),
        Err(StoreError::Invalid(_))
    ));
    assert!(
        store.card_info(WS, &a).unwrap().archived_at.is_none(),
        "refused: unchanged"
    );
    curation::reject(&store, WS, &a, "duplicate", "t", Expect::Any).unwrap();
    assert!(store.card_info(WS, &a).unwrap().archived_at.is_some());
    let last = store.history(WS, &a).unwrap().pop().unwrap();
    assert_eq!(
        (last.action.as_str(), last.detail.as_deref()),
        ("reject", Some("reason=duplicate"))
    );
}

fn a_verified_card_is_not_merged_where_fewer_tasks_see_it(engine: Engine) {
    let (_db, store) = open(engine);
    let (a, b) = (CardId::parse(A).unwrap(), CardId::parse(B).unwrap());
    // B becomes bound to one asset; A (verified, whole workspace) may not fold into it.
    let (_, text) = card(B, "Beta");
    let bound = String::from_utf8(text)
        .unwrap()
        .replace("title: Beta\n", "title: Beta\nscope:\n  asset_id: db-1\n");
    curation::update_card(&store, WS, &b, bound.as_bytes(), "t", Expect::Any, false).unwrap();
    let err = curation::merge(&store, WS, &a, &b, None, "t", Expect::Any).unwrap_err();
    assert!(err.to_string().contains("narrower scope"), "{err}");
    assert!(
        store
            .card_info(WS, &a)
            .unwrap()
            .summary
            .superseded_by
            .is_none()
    );
    // Control: the other way round, into the wider card, is a merge.
    assert!(curation::merge(&store, WS, &b, &a, None, "t", Expect::Any).is_ok());
}

/// An unverified card of `id`, as an agent's store leaves it.
fn unverified(id: &str, title: &str) -> (String, Vec<u8>) {
    let path = format!("facts/specs/{id}.md");
    let text = format!(
        "---\nid: {id}\ntype: fact\ntitle: {title}\ntrust: unverified\n---\nBody of {title}.\n"
    );
    (path, text.into_bytes())
}

fn the_queue_counts_come_from_the_per_row_flag_and_an_upgrade_fills_it(engine: Engine) {
    const C: &str = "00000000-0000-4000-8000-00000000000c";
    const D: &str = "00000000-0000-4000-8000-00000000000d";
    const E: &str = "00000000-0000-4000-8000-00000000000e";
    let (db, store) = open(engine);
    let cards = vec![
        unverified(C, "Gamma"),
        unverified(D, "Delta"),
        unverified(E, "Epsilon"),
    ];
    store.import(WS, cards, "test", &[], &[]).unwrap();
    let waiting = |store: &Store| {
        let stats = store.queue_stats().unwrap();
        let ws = stats
            .iter()
            .find(|q| q.workspace == WS)
            .expect("the workspace is counted");
        (ws.items, ws.oldest.is_some())
    };
    // The two verified example cards do not wait; the three unverified ones do.
    assert_eq!(waiting(&store), (3, true));
    let (c, d, e) = (
        CardId::parse(C).unwrap(),
        CardId::parse(D).unwrap(),
        CardId::parse(E).unwrap(),
    );
    curation::reject(&store, WS, &e, "not a lesson", "t", Expect::Any).unwrap();
    assert_eq!(
        waiting(&store),
        (2, true),
        "a rejected card no longer waits"
    );
    // Merged into the other draft, verified in the same action: neither waits.
    // Verifying needs the version read: a stale one is refused and changes nothing.
    let stale = curation::merge(&store, WS, &d, &c, Some("\"0000\""), "t", Expect::Any);
    assert!(
        matches!(stale, Err(StoreError::Precondition { .. })),
        "{stale:?}"
    );
    assert_eq!(waiting(&store), (2, true));
    let seen = store.card_info(WS, &c).unwrap().etag;
    curation::merge(&store, WS, &d, &c, Some(&seen), "t", Expect::Any).unwrap();
    assert_eq!(waiting(&store), (0, false));

    // A database from before the flag: the upgrade fills it from each card's trust.
    curation::set_state(&store, WS, &c, CardState::Disable, None, "t", Expect::Any).unwrap();
    let f = "00000000-0000-4000-8000-00000000000f";
    store
        .import(WS, vec![unverified(f, "Zeta")], "test", &[], &[])
        .unwrap();
    drop(store);
    db.exec("DROP INDEX cards_awaiting");
    db.exec("ALTER TABLE cards DROP COLUMN awaiting");
    db.exec("DROP INDEX cards_superseded_by");
    db.exec("DROP INDEX cards_made");
    db.exec("ALTER TABLE cards DROP COLUMN superseded_by");
    db.exec("ALTER TABLE cards DROP COLUMN made_at");
    db.exec("DROP TABLE alerts");
    db.exec("DROP TABLE card_feedback");
    db.exec("DROP TABLE card_flags");
    db.exec("ALTER TABLE card_usage_days DROP COLUMN succeeded");
    db.exec("ALTER TABLE card_usage_days DROP COLUMN failed");
    db.set_schema_version(4);
    let upgraded = db.store();
    assert_eq!(db.schema_version(), 8);
    assert_eq!(
        upgraded.alert_counts().unwrap().pending,
        0,
        "migration 7 made the outbox"
    );
    assert_eq!(
        waiting(&upgraded),
        (1, true),
        "only the live unverified card waits"
    );
    // Migration 6 fills the per-row superseder: the card that stayed lists the merged one,
    // with its author.
    let kept = upgraded.card_info(WS, &c).unwrap();
    assert_eq!(
        kept.merged.iter().map(|m| m.id).collect::<Vec<_>>(),
        [d],
        "{kept:?}"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM cards WHERE made_at IS NULL"),
        0,
        "every row knows when its card was made"
    );
}

fn a_revert_restores_the_words_and_keeps_where_the_card_stands(engine: Engine) {
    const C: &str = "00000000-0000-4000-8000-00000000000c";
    const D: &str = "00000000-0000-4000-8000-00000000000d";
    let (_db, store) = open(engine);
    let cards = vec![unverified(C, "Gamma"), unverified(D, "Delta")];
    store.import(WS, cards, "test", &[], &[]).unwrap();
    let (c, d) = (CardId::parse(C).unwrap(), CardId::parse(D).unwrap());
    let draft_seq = store.history(WS, &c).unwrap()[0].seq;
    // D is merged into C, which is verified in the same action.
    let seen = store.card_info(WS, &c).unwrap().etag;
    curation::merge(&store, WS, &d, &c, Some(&seen), "t", Expect::Any).unwrap();
    // Reverting C to its draft text brings back its words, not its unverified standing:
    // D's lesson stays with every task.
    curation::revert(&store, WS, &c, draft_seq, "t", Expect::Any).unwrap();
    let info = store.card_info(WS, &c).unwrap();
    assert_eq!(info.summary.trust, mop_cards::Trust::Verified);
    let (text, _) = store.card_text(WS, &c).unwrap();
    assert!(String::from_utf8(text).unwrap().contains("Body of Gamma."));
    // Reverting the merged-away D to its draft does not bring it back to life (its
    // counters moved once).
    let d_seq = store.history(WS, &d).unwrap()[0].seq;
    curation::revert(&store, WS, &d, d_seq, "t", Expect::Any).unwrap();
    assert_eq!(
        store.card_info(WS, &d).unwrap().summary.superseded_by,
        Some(c)
    );
}

/// A receipt of `user`'s task on `host` that ended with `outcome`, with verdicts.
fn ended(
    task: &str,
    user: &str,
    host: &str,
    outcome: mop_proto::receipts::Outcome,
    verdicts: &[(&str, mop_proto::receipts::Verdict, Option<&str>)],
) -> mop_proto::receipts::Receipt {
    let mut r = receipt(task, &[A, B], &[]);
    r.user_id = Some(user.into());
    r.host = host.into();
    r.outcome = Some(outcome);
    r.activity.feedback = verdicts
        .iter()
        .map(|(id, verdict, note)| mop_proto::receipts::FeedbackEvent {
            at: jiff::Timestamp::now(),
            id: CardId::parse(id).unwrap(),
            verdict: *verdict,
            note: note.map(str::to_owned),
        })
        .collect();
    r
}

fn verdicts_and_outcomes_count_per_card_and_flag_verified_memory(engine: Engine) {
    use mop_proto::receipts::{Outcome, Verdict};
    let (_db, store) = open(engine);
    let (a, b) = (CardId::parse(A).unwrap(), CardId::parse(B).unwrap());
    let flagged = |store: &Store| -> Vec<CardId> {
        let q = store.review_queue(WS, None, None).unwrap();
        q.page
            .iter()
            .flat_map(|(_, cards)| cards.iter().map(|(c, _)| c.summary.id))
            .collect()
    };
    // One user says A is wrong, on two tasks: one user is not enough for a flag.
    store
        .ingest_receipts(
            WS,
            "tokn",
            &[
                ended(
                    "t1",
                    "alice",
                    "host-a",
                    Outcome::Failure,
                    &[(A, Verdict::Wrong, Some("the port is 5433 now"))],
                ),
                ended(
                    "t2",
                    "alice",
                    "host-b",
                    Outcome::Success,
                    &[(A, Verdict::Outdated, None), (B, Verdict::Helped, None)],
                ),
            ],
        )
        .unwrap();
    assert!(flagged(&store).is_empty(), "one user flagged nothing");
    // A second user agrees: A is a flag item; B, which helped, is not.
    let t3 = ended(
        "t3",
        "bob",
        "host-a",
        Outcome::Failure,
        &[(
            A,
            Verdict::Wrong,
            Some("the token is xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"),
        )],
    );
    store
        .ingest_receipts(WS, "tokn", std::slice::from_ref(&t3))
        .unwrap();
    assert_eq!(flagged(&store), [a]);
    let q = store.review_queue(WS, None, None).unwrap();
    assert_eq!((q.entries, q.counts.flagged), (1, 1));
    let u = store.card_info(WS, &a).unwrap().usage;
    let f = &u.feedback;
    assert_eq!((f.wrong_7d, f.outdated_7d, f.helped_7d), (2, 1, 0));
    assert_eq!((f.users_30d, f.hosts_30d, f.against_users), (2, 2, 2));
    assert!(f.flagged);
    // The note with a credential lost its text here too; the other is kept.
    let notes: Vec<&str> = f.notes.iter().map(|n| n.note.as_str()).collect();
    assert_eq!(notes, ["the port is 5433 now"]);
    assert_eq!(
        (
            u.delivered_30d,
            u.outcomes_30d.succeeded,
            u.outcomes_30d.failed,
            u.outcomes_30d.unknown
        ),
        (3, 1, 2, 0)
    );
    assert_eq!(
        store.card_info(WS, &b).unwrap().usage.feedback.helped_30d,
        1
    );
    // A receipt again counts nothing again.
    let again = store.ingest_receipts(WS, "tokn", &[t3]).unwrap();
    assert_eq!(again.duplicates, 1);
    assert_eq!(store.card_info(WS, &a).unwrap().usage.feedback.wrong_30d, 2);
    // Kept: the flag goes, and the history says who kept it and why.
    // A reason on many lines is refused; a stale version too; then kept.
    assert!(curation::keep(&store, WS, &a, Some("a\nb"), "token:tokc", Expect::Any).is_err());
    assert!(matches!(
        curation::keep(
            &store,
            WS,
            &a,
            None,
            "token:tokc",
            Expect::IfMatch("\"0000\"")
        ),
        Err(StoreError::Precondition { .. })
    ));
    assert!(!flagged(&store).is_empty(), "a refused keep kept nothing");
    curation::keep(
        &store,
        WS,
        &a,
        Some("checked, still right"),
        "token:tokc",
        Expect::Any,
    )
    .unwrap();
    assert!(flagged(&store).is_empty());
    assert_eq!(
        store
            .card_info(WS, &a)
            .unwrap()
            .usage
            .feedback
            .against_users,
        0
    );
    let history = store.card_details(WS, &a).unwrap().history;
    assert!(history.iter().any(|h| h.action == "keep"), "{history:?}");
    // A verdict on a card the task was neither given nor met counts nothing.
    let mut stray = ended(
        "s-1",
        "dave",
        "host-d",
        Outcome::Success,
        &[(B, Verdict::Wrong, None)],
    );
    stray.cards.retain(|c| c.id == a);
    store.ingest_receipts(WS, "tokn", &[stray]).unwrap();
    assert_eq!(store.card_info(WS, &b).unwrap().usage.feedback.wrong_30d, 0);
    // The stale report names a card delivered mostly to failing tasks once it had five.
    for (i, outcome) in [Outcome::Failure, Outcome::Failure, Outcome::Unknown]
        .iter()
        .enumerate()
    {
        store
            .ingest_receipts(
                WS,
                "tokn",
                &[ended(&format!("f{i}"), "carol", "host-c", *outcome, &[])],
            )
            .unwrap();
    }
    let report = store.stale(WS, 30, 3).unwrap();
    let failing: Vec<(CardId, u64, u64)> = report
        .failing
        .iter()
        .map(|f| (f.card.id, f.delivered, f.outcomes.failed))
        .collect();
    // A went to 7 tasks (the stray one too), B to 6: 4 of each failed.
    assert_eq!(failing, [(a, 7, 4), (b, 6, 4)]);
}
