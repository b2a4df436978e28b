//! The search index over the example workspace: English, Chinese and Japanese queries,
//! visibility masks, read-only opening, determinism, and refusal of damaged indexes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use mop_cards::{CardId, Rules, TaskContext};
use mop_search::{SearchError, SearchIndex, select_for_task};
use mop_testkit::{Generation, Workspace, build_generation, example_cards_dir, load_cards};

fn setup() -> (Workspace, Generation) {
    let ws = load_cards(
        &example_cards_dir(),
        "2026-11-29T00:00:00Z".parse().unwrap(),
    );
    let generation = build_generation(&ws, &Rules::default());
    (ws, generation)
}

fn task(user: Option<&str>, asset: Option<&str>) -> TaskContext {
    TaskContext {
        task_id: "t-1".into(),
        workspace: "acme".into(),
        origin_user_id: user.map(Into::into),
        asset_id: asset.map(Into::into),
        project_id: None,
        agent: None,
        title: "x".into(),
        description: String::new(),
        labels: vec![],
    }
}

/// Card ids of the hits for `query`, as seen by `t`.
fn hits(g: &Generation, t: &TaskContext, query: &str) -> Vec<CardId> {
    let visible = Arc::new(g.catalog.visible_set(t));
    g.index
        .search(query, 10, visible)
        .unwrap()
        .iter()
        .map(|h| g.catalog.card(h.ord).id)
        .collect()
}

#[test]
fn english_query_finds_the_runbook_first() {
    let (ws, g) = setup();
    let found = hits(
        &g,
        &task(None, None),
        "snapshot too old undo retention nightly ETL",
    );
    assert_eq!(
        found[0],
        ws.id_titled("ORA-01555 snapshot too old during the nightly ETL")
    );
}

#[test]
fn chinese_and_japanese_queries_find_their_cards() {
    let (ws, g) = setup();
    let zh = hits(&g, &task(None, None), "死锁");
    assert_eq!(zh.first(), Some(&ws.id_titled("ERROR 1213 死锁")), "{zh:?}");
    let zh2 = hits(&g, &task(None, None), "预发环境");
    assert_eq!(
        zh2.first(),
        Some(&ws.id_titled("生产数据库变更必须先在预发环境验证"))
    );
    let ja = hits(&g, &task(None, None), "文字化け");
    assert_eq!(ja.first(), Some(&ws.id_titled("文字化け")), "{ja:?}");
    // A Chinese word absent from every card finds nothing rather than noise.
    assert!(hits(&g, &task(None, None), "量子计算").is_empty());
}

#[test]
fn hits_respect_the_tasks_visibility() {
    let (ws, g) = setup();
    let cron = ws.id_titled("stop the cron first");
    let plans = ws.id_titled("Alice wants execution plans");
    // Control: the author sees her unverified card, alice sees her preference.
    assert!(hits(&g, &task(Some("bob"), None), "pause the invoicer cron").contains(&cron));
    assert!(hits(&g, &task(Some("alice"), None), "ALLSTATS execution plan").contains(&plans));
    // Everyone else does not, however well the text matches.
    assert!(!hits(&g, &task(Some("alice"), None), "pause the invoicer cron").contains(&cron));
    assert!(!hits(&g, &task(None, None), "pause the invoicer cron").contains(&cron));
    assert!(!hits(&g, &task(Some("bob"), None), "ALLSTATS execution plan").contains(&plans));
    // Asset-bound cards only for their asset.
    let pgb = ws.id_titled("SQLSTATE 53300 too many connections");
    assert!(
        hits(
            &g,
            &task(None, Some("pg-orders-01")),
            "too many clients PgBouncer"
        )
        .contains(&pgb)
    );
    assert!(
        !hits(
            &g,
            &task(None, Some("db-prod-01")),
            "too many clients PgBouncer"
        )
        .contains(&pgb)
    );
    // Disabled and superseded cards are never hits.
    assert!(
        !hits(&g, &task(None, None), "indent SQL tabs")
            .contains(&ws.id_titled("Indent SQL with tabs"))
    );
    assert!(
        !hits(&g, &task(None, None), "undo segments")
            .contains(&ws.id_titled("add more undo segments"))
    );
}

#[test]
fn stopword_only_and_empty_queries_find_nothing() {
    let (_, g) = setup();
    assert!(hits(&g, &task(None, None), "").is_empty());
    assert!(hits(&g, &task(None, None), "the and of").len() <= 10);
    assert!(hits(&g, &task(None, None), "!!! ???").is_empty());
}

fn snapshot(dir: &Path) -> BTreeMap<String, (u64, SystemTime)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (m.len(), m.modified().unwrap()),
            )
        })
        .collect()
}

#[test]
fn opening_and_searching_write_nothing() {
    let (_, g) = setup();
    let before = snapshot(g.dir.path());
    assert!(
        !before.keys().any(|k| k.ends_with(".lock")),
        "no lock files left by the build: {before:?}"
    );
    let index = SearchIndex::open(g.dir.path()).unwrap();
    let visible = Arc::new(g.catalog.visible_set(&task(None, None)));
    assert!(!index.search("oracle undo", 5, visible).unwrap().is_empty());
    drop(index);
    assert_eq!(snapshot(g.dir.path()), before);
}

#[test]
fn two_builds_give_identical_hits() {
    let (_, a) = setup();
    let (_, b) = setup();
    let t = task(Some("alice"), Some("db-prod-01"));
    for q in ["oracle deadlock", "死锁 invoices", "kubectl drain"] {
        let va = Arc::new(a.catalog.visible_set(&t));
        let vb = Arc::new(b.catalog.visible_set(&t));
        assert_eq!(
            a.index.search(q, 10, va).unwrap(),
            b.index.search(q, 10, vb).unwrap(),
            "{q}"
        );
    }
}

#[test]
fn damaged_indexes_are_refused_with_the_path() {
    let (ws, g) = setup();
    let meta = g.dir.path().join("mop-search.json");
    std::fs::write(&meta, "{\"format\": 99, \"docs\": 44}").unwrap();
    let err = SearchIndex::open(g.dir.path()).unwrap_err();
    assert!(matches!(err, SearchError::Invalid { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&g.dir.path().display().to_string()),
        "{err}"
    );
    std::fs::write(
        &meta,
        format!("{{\"format\": 1, \"docs\": {}}}", ws.cards.len() + 1),
    )
    .unwrap();
    assert!(matches!(
        SearchIndex::open(g.dir.path()),
        Err(SearchError::Invalid { .. })
    ));
    std::fs::remove_file(&meta).unwrap();
    assert!(matches!(
        SearchIndex::open(g.dir.path()),
        Err(SearchError::Io { .. })
    ));
    let empty = tempfile::tempdir().unwrap();
    assert!(SearchIndex::open(empty.path()).is_err());
}

#[test]
fn an_index_from_another_generation_is_refused() {
    let (ws, g) = setup();
    let mut smaller = load_cards(
        &example_cards_dir(),
        "2026-11-29T00:00:00Z".parse().unwrap(),
    );
    smaller.manifest.cards.pop();
    let other = build_generation(&smaller, &Rules::default());
    let err = select_for_task(
        &g.catalog,
        &other.index,
        &task(None, None),
        &Rules::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(&format!("{}", ws.cards.len() - 1)),
        "{err}"
    );
}

/// Hits as (card id, score bits): exact, so that no rounding difference hides.
fn scored(g: &Generation, t: &TaskContext, query: &str) -> Vec<(CardId, u32)> {
    let visible = Arc::new(g.catalog.visible_set(t));
    g.index
        .search(query, 50, visible)
        .unwrap()
        .iter()
        .map(|h| (g.catalog.card(h.ord).id, h.score.to_bits()))
        .collect()
}

/// The side channel of issue 13: BM25 statistics over the whole index let a task compare
/// scores and learn whether a word occurs in cards it cannot see. Bob's answers must be
/// exactly those of an index that never held alice's hidden cards, and a word found only
/// in them must answer exactly like a word found nowhere; alice (the control) finds them.
#[test]
fn answers_do_not_depend_on_cards_the_task_cannot_see() {
    let (ws, visible_only) = setup();
    let mut with_hidden = load_cards(
        &example_cards_dir(),
        "2026-11-29T00:00:00Z".parse().unwrap(),
    );
    // Alice's personal cards, long and full of words bob's queries use.
    for n in 0..4 {
        let id = format!("7e57c0de-0000-4000-8000-{n:012}");
        let raw = format!(
            "---\nid: {id}\ntype: pitfall\ntitle: Ledger undo ETL zqhiddenword {n}\nscope:\n  user_id: alice\n---\n{}\n",
            "ledger undo retention ETL nightly zqhiddenword snapshot ".repeat(40 + n)
        );
        let card = mop_cards::parse_card(raw.as_bytes()).unwrap();
        with_hidden
            .manifest
            .cards
            .push(mop_cards::ManifestEntry::for_card(&card, raw.as_bytes()));
        with_hidden.cards.insert(card.summary.id, card);
    }
    let g = build_generation(&with_hidden, &Rules::default());
    let bob = task(Some("bob"), None);
    for query in [
        "ledger undo retention",
        "snapshot too old during the nightly ETL",
        "ledger zqhiddenword",
        "zqhiddenword",
    ] {
        assert_eq!(
            scored(&g, &bob, query),
            scored(&visible_only, &bob, query),
            "{query:?}: bob's answer changed with alice's hidden cards"
        );
    }
    assert_eq!(
        scored(&g, &bob, "ledger zqhiddenword"),
        scored(&g, &bob, "ledger zqnowhereword"),
        "a hidden word answers like a word found nowhere"
    );
    assert!(scored(&g, &bob, "zqhiddenword").is_empty());
    // The control: alice sees her cards, so the same probe finds them, and her scores
    // for a shared word do count them.
    let alice = task(Some("alice"), None);
    assert_eq!(scored(&g, &alice, "zqhiddenword").len(), 4);
    assert_ne!(
        scored(&g, &alice, "ledger undo retention"),
        scored(&visible_only, &alice, "ledger undo retention")
    );
    let _ = ws;
}

/// The same property where a visible set leaves out some open cards too (the slow path:
/// every posting looked at): the answer is that of an index of exactly the visible cards.
#[test]
fn any_visible_set_answers_like_an_index_of_its_cards_alone() {
    let (ws, g) = setup();
    let bob = task(Some("bob"), Some("db-prod-01"));
    let full = g.catalog.visible_set(&bob);
    // Leave out every third visible card, open or not.
    let mut subset = mop_cards::VisibleSet::empty(g.catalog.len());
    let mut kept = Vec::new();
    for (i, ord) in full.without(&mop_cards::VisibleSet::empty(0)).enumerate() {
        if i % 3 != 0 {
            subset.insert(ord);
            kept.push(g.catalog.card(ord).id);
        }
    }
    let mut only = load_cards(
        &example_cards_dir(),
        "2026-11-29T00:00:00Z".parse().unwrap(),
    );
    only.manifest.cards.retain(|e| kept.contains(&e.summary.id));
    only.cards.retain(|id, _| kept.contains(id));
    let alone = build_generation(&only, &Rules::default());
    let everything = |g: &Generation| {
        let mut all = mop_cards::VisibleSet::empty(g.catalog.len());
        for ord in 0..g.catalog.len() as u32 {
            all.insert(ord);
        }
        Arc::new(all)
    };
    let subset = Arc::new(subset);
    for query in [
        "ledger undo retention",
        "ORA-01555 nightly ETL",
        "死锁 账单",
        "deadlock",
    ] {
        let ours: Vec<(CardId, u32)> = g
            .index
            .search(query, 50, subset.clone())
            .unwrap()
            .iter()
            .map(|h| (g.catalog.card(h.ord).id, h.score.to_bits()))
            .collect();
        let theirs: Vec<(CardId, u32)> = alone
            .index
            .search(query, 50, everything(&alone))
            .unwrap()
            .iter()
            .map(|h| (alone.catalog.card(h.ord).id, h.score.to_bits()))
            .collect();
        assert_eq!(ours, theirs, "{query:?}");
        assert!(
            !ours.is_empty() || query == "deadlock",
            "{query:?} found nothing"
        );
    }
    let _ = ws;
}
