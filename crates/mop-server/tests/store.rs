//! The store without HTTP: purge after archive retention, object retention, the delta
//! history floor, migrations, conditional changes, receipts counted once, merges and the
//! staleness report, on a real SQLite file.

use mop_cards::{CardId, sha256_hex};
use mop_server::store::{CardState, Expect, ManifestKind, Store, StoreError};

const WS: &str = "acme";

fn card(id: &str, title: &str) -> (String, Vec<u8>) {
    let path = format!("facts/specs/{id}.md");
    (
        path,
        format!("---\nid: {id}\ntype: fact\ntitle: {title}\n---\nBody of {title}.\n").into_bytes(),
    )
}

const A: &str = "00000000-0000-4000-8000-00000000000a";
const B: &str = "00000000-0000-4000-8000-00000000000b";

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("mop.db")).unwrap();
    store
        .import(WS, vec![card(A, "Alpha"), card(B, "Beta")], "test")
        .unwrap();
    (dir, store)
}

fn object_count(store: &Store) -> i64 {
    let conn = rusqlite::Connection::open(store.path()).unwrap();
    conn.query_row("SELECT COUNT(*) FROM objects", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn archived_cards_are_purged_after_retention_and_history_redacted() {
    let (_dir, store) = open();
    let a = CardId::parse(A).unwrap();
    let before_archive = store
        .manifest(WS, ManifestKind::Full)
        .unwrap()
        .manifest
        .revision;
    store
        .set_state(WS, &a, CardState::Archive, "test", Expect::Any)
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
    assert_eq!(object_count(&store), 1, "only B's object is left");
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

#[test]
fn released_objects_live_for_the_retention_window() {
    let (_dir, store) = open();
    let b = CardId::parse(B).unwrap();
    let old_sha = sha256_hex(&card(B, "Beta").1);
    store
        .update_card(WS, &b, &card(B, "Beta two").1, "test", Expect::Any)
        .unwrap();
    assert!(
        store.object(WS, &old_sha).unwrap().is_some(),
        "kept for daemons mid-sync"
    );
    assert_eq!(store.collect_garbage(3600, 3600, 3600).unwrap(), (0, 0));
    assert!(store.object(WS, &old_sha).unwrap().is_some());
    assert_eq!(store.collect_garbage(3600, 0, 3600).unwrap(), (0, 1));
    assert!(store.object(WS, &old_sha).unwrap().is_none());
    assert_eq!(object_count(&store), 2, "live objects are never collected");
}

#[test]
fn deltas_fall_back_to_full_once_their_history_is_forgotten() {
    let (_dir, store) = open();
    let a = CardId::parse(A).unwrap();
    let old = store
        .manifest(WS, ManifestKind::Full)
        .unwrap()
        .manifest
        .revision;
    store.hard_delete(WS, &a, "test").unwrap();
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

#[test]
fn migrations_are_versioned_and_newer_databases_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mop.db");
    let epoch = Store::open(&path).unwrap().epoch().to_owned();
    assert_eq!(
        Store::open(&path).unwrap().epoch(),
        epoch,
        "reopening keeps the epoch"
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 3, "migration 3: the curation loop");
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::TooNew { found: 99, .. }), "{err}");
    assert!(err.to_string().contains("upgrade mop-server"));
}

#[test]
fn stored_times_compare_correctly_as_strings() {
    // Reinforcements record last_seen; publishing keeps the later of two times even when
    // their fractional digits differ.
    let (_dir, store) = open();
    // Each reinforcement from another task: a task counts once per card.
    let req = |task: &str| mop_proto::sync::StoreRequest {
        provenance: mop_proto::sync::StoreProvenance {
            task_id: task.into(),
            user_id: Some("u".into()),
            asset_id: None,
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
    let limits = mop_server::store::StoreLimits {
        stores_per_task: 50,
    };
    let first = store.store_memory(WS, &req("t0"), "test", limits).unwrap();
    for n in 1..4 {
        store
            .store_memory(WS, &req(&format!("t{n}")), "test", limits)
            .unwrap();
    }
    store.publish_counters(None).unwrap();
    let m = store.manifest(WS, ManifestKind::Full).unwrap().manifest;
    let e = m.cards.iter().find(|c| c.summary.id == first.id).unwrap();
    assert_eq!(e.occurrence, 4);
    assert!(e.last_seen.unwrap() >= e.summary.created_at.unwrap());
}

#[test]
fn a_delta_over_its_limit_gives_way_to_the_full_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("mop.db")).unwrap();
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
        )
        .unwrap();
    let base = store
        .manifest(WS, ManifestKind::Full)
        .unwrap()
        .manifest
        .revision;
    let edit = |id: &str, n: u32| {
        let (_, text) = card(id, &format!("Card {id} edit {n}"));
        store
            .update_card(WS, &CardId::parse(id).unwrap(), &text, "test", Expect::Any)
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

#[test]
fn a_change_sent_with_an_old_version_is_refused_and_changes_nothing() {
    let (_dir, store) = open();
    let b = CardId::parse(B).unwrap();
    let seen = store.card_info(WS, &b).unwrap().etag;
    let first = store
        .update_card(
            WS,
            &b,
            &card(B, "Beta two").1,
            "test",
            Expect::IfMatch(&seen),
        )
        .unwrap();
    assert!(first.changed);
    assert_ne!(first.etag.as_deref(), Some(seen.as_str()));
    // A second curator who read the same version.
    let late = store.update_card(
        WS,
        &b,
        &card(B, "Beta three").1,
        "test",
        Expect::IfMatch(&seen),
    );
    match late {
        Err(StoreError::Precondition { current, .. }) => {
            assert_eq!(Some(current), first.etag)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.card_text(WS, &b).unwrap().0, card(B, "Beta two").1);
    // Actions take the same condition; `*` and lists work as in HTTP.
    let refused = store.set_state(WS, &b, CardState::Disable, "test", Expect::IfMatch(&seen));
    assert!(matches!(refused, Err(StoreError::Precondition { .. })));
    let list = format!("{seen}, {}", first.etag.unwrap());
    assert!(
        store
            .set_state(WS, &b, CardState::Disable, "test", Expect::IfMatch(&list))
            .is_ok()
    );
    // Archiving changes no byte, but it changes the version.
    let before = store.card_info(WS, &b).unwrap().etag;
    store
        .set_state(WS, &b, CardState::Archive, "test", Expect::IfMatch("*"))
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
        prepared_at: jiff::Timestamp::now(),
        ended_at: None,
        cards: cards
            .iter()
            .enumerate()
            .map(|(i, c)| ReceiptCard {
                id: id(c),
                sha256: "0".repeat(64),
                tier: "L0".into(),
                rank: i as u32 + 1,
                mounted: true,
                listed: true,
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
    }
}

#[test]
fn a_receipt_counts_once_however_often_it_arrives() {
    let (_dir, store) = open();
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

#[test]
fn a_merge_carries_counters_and_chains_are_reported() {
    let (_dir, store) = open();
    let (a, b) = (CardId::parse(A).unwrap(), CardId::parse(B).unwrap());
    let before = store.card_info(WS, &b).unwrap().occurrence;
    let merged = store.merge(WS, &a, &b, "token:tokc", Expect::Any).unwrap();
    assert!(merged.changed);
    assert_eq!(store.card_info(WS, &b).unwrap().occurrence, before + 1);
    assert_eq!(
        store.card_info(WS, &a).unwrap().summary.superseded_by,
        Some(b)
    );
    assert!(
        store.merge(WS, &b, &b, "t", Expect::Any).is_err(),
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

#[test]
fn rejecting_needs_a_reason_and_archives() {
    let (_dir, store) = open();
    let a = CardId::parse(A).unwrap();
    assert!(matches!(
        store.reject(WS, &a, "  ", "t", Expect::Any),
        Err(StoreError::Invalid(_))
    ));
    assert!(
        store.card_info(WS, &a).unwrap().archived_at.is_none(),
        "refused: unchanged"
    );
    store.reject(WS, &a, "duplicate", "t", Expect::Any).unwrap();
    assert!(store.card_info(WS, &a).unwrap().archived_at.is_some());
    let last = store.history(WS, &a).unwrap().pop().unwrap();
    assert_eq!(
        (last.action.as_str(), last.detail.as_deref()),
        ("reject", Some("reason=duplicate"))
    );
}

#[test]
fn a_verified_card_is_not_merged_where_fewer_tasks_see_it() {
    let (_dir, store) = open();
    let (a, b) = (CardId::parse(A).unwrap(), CardId::parse(B).unwrap());
    // B becomes bound to one asset; A (verified, whole workspace) may not fold into it.
    let (_, text) = card(B, "Beta");
    let bound = String::from_utf8(text)
        .unwrap()
        .replace("title: Beta\n", "title: Beta\nscope:\n  asset_id: db-1\n");
    store
        .update_card(WS, &b, bound.as_bytes(), "t", Expect::Any)
        .unwrap();
    let err = store.merge(WS, &a, &b, "t", Expect::Any).unwrap_err();
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
    assert!(store.merge(WS, &b, &a, "t", Expect::Any).is_ok());
}
