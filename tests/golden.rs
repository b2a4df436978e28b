//! MEMORY.md for three example tasks over the example workspace, pinned byte for byte in
//! `tests/golden/`. Run with `MOP_BLESS=1` to rewrite the files after an intended change,
//! and review the diff.

use mop_cards::{CardType, Rules, TaskContext, Tier, render_memory_md};
use mop_search::select_for_task;
use mop_testkit::{
    Generation, Workspace, build_generation, example_cards_dir, load_cards, repo_root,
};

fn workspace() -> Workspace {
    load_cards(
        &example_cards_dir(),
        "2026-11-29T00:00:00Z".parse().unwrap(),
    )
}

fn task(
    id: &str,
    user: Option<&str>,
    asset: Option<&str>,
    title: &str,
    description: &str,
    labels: &[&str],
) -> TaskContext {
    TaskContext {
        task_id: id.into(),
        workspace: "acme".into(),
        origin_user_id: user.map(Into::into),
        asset_id: asset.map(Into::into),
        project_id: None,
        agent: None,
        title: title.into(),
        description: description.into(),
        labels: labels.iter().map(|l| l.to_string()).collect(),
    }
}

fn etl_task() -> TaskContext {
    task(
        "etl-7781",
        Some("alice"),
        Some("db-prod-01"),
        "Nightly ETL fails with ORA-01555 snapshot too old",
        "The ledger_nightly job aborted at 02:40 UTC with ora-1555 on LEDGER.ENTRIES. Find the cause and propose a fix.",
        &["oracle", "etl"],
    )
}

fn api_task() -> TaskContext {
    task(
        "api-1320",
        Some("bob"),
        None,
        "Add errx error codes to the billing API invoice endpoints",
        "The new endpoint POST /invoices/{id}/void needs error codes for locked and already-void invoices. Write Go tests.",
        &["go", "backend"],
    )
}

fn billing_task() -> TaskContext {
    task(
        "bill-4470",
        None,
        Some("mysql-billing-02"),
        "账单批处理死锁 ERROR 1213 and lock waits",
        "billing-invoicer hit ERROR 1213 deadlocks and Error Code: 1205 lock wait timeouts overnight; 需要分析死锁原因。",
        &["mysql"],
    )
}

/// Renders and compares with the golden file; returns the selection's (id, tier) pairs.
fn check(generation: &Generation, t: &TaskContext) -> Vec<(mop_cards::CardId, Tier)> {
    let rules = Rules::default();
    let sel = select_for_task(&generation.catalog, &generation.index, t, &rules).unwrap();
    let md = render_memory_md(&generation.catalog, &sel, t, &rules.config);
    let again = render_memory_md(
        &generation.catalog,
        &select_for_task(&generation.catalog, &generation.index, t, &rules).unwrap(),
        t,
        &rules.config,
    );
    assert_eq!(md, again, "rendering twice gives the same bytes");
    let path = repo_root()
        .join("tests/golden")
        .join(format!("{}.md", t.task_id));
    if std::env::var_os("MOP_BLESS").is_some() {
        std::fs::write(&path, &md).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with MOP_BLESS=1 to create it)",
            path.display()
        )
    });
    assert!(
        md == want,
        "{} differs from the rendered index:\n{md}",
        path.display()
    );
    sel.cards
        .iter()
        .map(|s| (generation.catalog.card(s.ord).id, s.tier))
        .collect()
}

#[test]
fn etl_task_for_alice_on_db_prod_01() {
    let ws = workspace();
    let generation = build_generation(&ws, &Rules::default());
    let sel = check(&generation, &etl_task());
    let tier_of = |title: &str| {
        sel.iter()
            .find(|(id, _)| *id == ws.id_titled(title))
            .map(|s| s.1)
    };
    assert_eq!(
        tier_of("Never gather statistics on db-prod-01"),
        Some(Tier::L1)
    );
    assert_eq!(tier_of("Alice wants execution plans"), Some(Tier::L1));
    assert_eq!(
        tier_of("ORA-01555 snapshot too old during the nightly ETL"),
        Some(Tier::L2)
    );
    assert_eq!(tier_of("db-prod-01: Oracle 19c"), Some(Tier::L2));
    assert_eq!(
        tier_of("Undo advisor suggests"),
        Some(Tier::L2),
        "alice's own unverified card"
    );
    assert_eq!(tier_of("Production change windows"), Some(Tier::L0));
    assert_eq!(
        tier_of("ORA-1555: add more undo segments"),
        None,
        "superseded"
    );
    assert_eq!(tier_of("Indent SQL with tabs"), None, "disabled");
    assert_eq!(
        tier_of("stop the cron first"),
        None,
        "bob's unverified card"
    );
    assert_eq!(
        tier_of("Carol: always pass --context"),
        None,
        "carol's card"
    );
    assert_eq!(
        tier_of("pg-orders-01: PostgreSQL 15"),
        None,
        "another asset"
    );
    // Every correction the task may see ranks above everything else, whatever its tier.
    let types: Vec<_> = sel
        .iter()
        .map(|(id, _)| ws.cards[id].summary.card_type)
        .collect();
    let corrections = types
        .iter()
        .filter(|t| **t == CardType::HumanCorrection)
        .count();
    assert_eq!(corrections, 4);
    assert!(
        types[..corrections]
            .iter()
            .all(|t| *t == CardType::HumanCorrection),
        "{types:?}"
    );
}

#[test]
fn api_task_for_bob_without_asset() {
    let ws = workspace();
    let generation = build_generation(&ws, &Rules::default());
    let sel = check(&generation, &api_task());
    let has = |title: &str| sel.iter().any(|(id, _)| *id == ws.id_titled(title));
    assert!(has("API error codes must be defined via errx"));
    assert!(has("Bob prefers table-driven Go tests"));
    assert!(
        has("stop the cron first"),
        "bob's own unverified card reaches bob's tasks"
    );
    assert!(!has("Undo advisor suggests"), "alice's unverified card");
    assert!(
        !has("mysql-billing-02: MySQL 8.0"),
        "no asset, no asset-bound cards"
    );
}

#[test]
fn billing_task_with_chinese_text_and_no_user() {
    let ws = workspace();
    let generation = build_generation(&ws, &Rules::default());
    let sel = check(&generation, &billing_task());
    let tier_of = |title: &str| {
        sel.iter()
            .find(|(id, _)| *id == ws.id_titled(title))
            .map(|s| s.1)
    };
    assert_eq!(tier_of("ERROR 1213 死锁"), Some(Tier::L2));
    assert_eq!(
        tier_of("ERROR 1205 lock wait timeout in the invoice batch"),
        Some(Tier::L2)
    );
    assert_eq!(tier_of("mysql-billing-02: MySQL 8.0"), Some(Tier::L2));
    assert_eq!(
        tier_of("Dave reviews every billing data fix"),
        None,
        "personal card, task has no user"
    );
    assert_eq!(
        tier_of("stop the cron first"),
        None,
        "unverified card of bob"
    );
    assert!(sel.iter().all(|(_, t)| *t != Tier::L1), "no user, no L1");
}
