//! Tier selection, hard exclusions and ranking, on small hand-built workspaces where every
//! expected outcome can be stated exactly.

mod common;

use common::*;
use jiff::Timestamp;
use mop_cards::{
    CardId, CardType, Catalog, Manifest, ManifestEntry, MatchClass, Provenance, Rules,
    SelectionConfig, TaskContext, TaskQuery, TextHit, Tier, Trust, compose, effective_importance,
};

/// Selected (card number, tier, class) in rank order.
fn run(cat: &Catalog, t: &TaskContext, hits: &[(u32, f32)]) -> Vec<(u32, Tier, MatchClass)> {
    run_with(cat, t, hits, &SelectionConfig::default())
}

fn run_with(
    cat: &Catalog,
    t: &TaskContext,
    hits: &[(u32, f32)],
    config: &SelectionConfig,
) -> Vec<(u32, Tier, MatchClass)> {
    let rules = Rules::new(config.clone()).unwrap();
    let q = TaskQuery::new(t, &rules.codes);
    let hits: Vec<TextHit> = hits
        .iter()
        .map(|(n, score)| TextHit {
            ord: cat.ord_of(&id(*n)).unwrap(),
            score: *score,
        })
        .collect();
    cat.select(&q, &hits, config)
        .cards
        .iter()
        .map(|s| (num(cat, s.ord), s.tier, s.class))
        .collect()
}

fn num(cat: &Catalog, ord: u32) -> u32 {
    let s = cat.card(ord).id.to_string();
    s[24..].parse().unwrap()
}

fn nums(sel: &[(u32, Tier, MatchClass)]) -> Vec<u32> {
    let mut v: Vec<u32> = sel.iter().map(|s| s.0).collect();
    v.sort();
    v
}

#[test]
fn l0_is_unscoped_baseline_types_only() {
    let cat = catalog(vec![
        card(1, CardType::Fact),
        card(2, CardType::Preference),
        card(3, CardType::HumanCorrection),
        card(4, CardType::ReferenceDoc),
        card(5, CardType::ErrorResolution),
        card(6, CardType::Pitfall),
        card(7, CardType::Playbook),
    ]);
    let sel = run(&cat, &task(None, None, "unrelated words"), &[]);
    assert_eq!(nums(&sel), [1, 2, 3, 4]);
    assert!(sel.iter().all(|s| s.1 == Tier::L0));
}

#[test]
fn l1_is_the_requesters_own_and_needs_an_origin_user() {
    let cat = catalog(vec![
        with(card(1, CardType::Pitfall), user("alice")),
        with(
            with(card(2, CardType::Preference), user("alice")),
            asset("db-1"),
        ),
        with(card(3, CardType::Preference), user("bob")),
    ]);
    let alice = run(&cat, &task(Some("alice"), Some("db-1"), "x"), &[]);
    assert_eq!(
        alice.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>().len(),
        2
    );
    assert!(
        alice
            .iter()
            .all(|s| s.1 == Tier::L1 && s.2 == MatchClass::Own)
    );
    assert_eq!(nums(&alice), [1, 2]);
    // Bound to alice and to db-1: not for alice's task on another asset, or on none.
    assert_eq!(
        nums(&run(&cat, &task(Some("alice"), Some("db-2"), "x"), &[])),
        [1]
    );
    assert_eq!(nums(&run(&cat, &task(Some("alice"), None, "x"), &[])), [1]);
    // No origin user: no L1 at all.
    assert!(run(&cat, &task(None, Some("db-1"), "x"), &[]).is_empty());
}

#[test]
fn l2_asset_and_each_match_kind() {
    let cat = catalog(vec![
        with(card(1, CardType::Playbook), asset("db-1")),
        with(card(2, CardType::ErrorResolution), |e| {
            e.summary.error_codes = vec!["ora-1555".into()]
        }),
        with(card(3, CardType::Pitfall), |e| {
            e.summary.stacks = vec!["oracle".into()]
        }),
        with(card(4, CardType::Pitfall), |e| {
            e.summary.labels = vec!["etl".into()]
        }),
        card(5, CardType::Playbook),
        card(6, CardType::Pitfall),
    ]);
    let mut t = task(None, Some("db-1"), "ORA-01555 on Oracle");
    t.labels = vec!["ETL".into()];
    let sel = run(&cat, &t, &[(5, 3.0), (6, 0.1)]);
    let got: Vec<(u32, MatchClass)> = sel.iter().map(|s| (s.0, s.2)).collect();
    assert_eq!(
        got,
        [
            (2, MatchClass::ErrorCode),
            (1, MatchClass::Asset),
            (3, MatchClass::StackOrLabel),
            (4, MatchClass::StackOrLabel),
            (5, MatchClass::Text),
        ],
        "card 6 scores below min_text_ratio of the best hit"
    );
    assert!(sel.iter().all(|s| s.1 == Tier::L2));
}

#[test]
fn text_alone_selects_at_most_text_candidates() {
    let cards: Vec<_> = (1..=30).map(|n| card(n, CardType::Pitfall)).collect();
    let cat = catalog(cards);
    let hits: Vec<(u32, f32)> = (1..=30).map(|n| (n, 10.0 - n as f32 * 0.1)).collect();
    let sel = run(&cat, &task(None, None, "x"), &hits);
    assert_eq!(nums(&sel), (1..=10).collect::<Vec<_>>());
    let config = SelectionConfig {
        text_candidates: 3,
        ..Default::default()
    };
    assert_eq!(
        nums(&run_with(&cat, &task(None, None, "x"), &hits, &config)),
        [1, 2, 3]
    );
}

#[test]
fn hard_exclusions_hold_whatever_matches() {
    let ora = |e: &mut ManifestEntry| {
        e.summary.error_codes = vec!["ORA-01555".into()];
        e.summary.stacks = vec!["oracle".into()];
    };
    let cat = catalog(vec![
        with(with(card(1, CardType::HumanCorrection), user("bob")), ora),
        with(with(card(2, CardType::ErrorResolution), asset("db-2")), ora),
        with(with(card(3, CardType::ErrorResolution), ora), asset("db-1")),
        with(card(4, CardType::ErrorResolution), ora),
    ]);
    // Another user's card and another asset's card never appear, even as text hits.
    let sel = run(
        &cat,
        &task(Some("alice"), Some("db-1"), "ORA-01555 oracle"),
        &[(1, 9.0), (2, 9.0)],
    );
    assert_eq!(nums(&sel), [3, 4]);
    // A task with no asset gets no asset-bound card at all.
    let sel = run(
        &cat,
        &task(Some("alice"), None, "ORA-01555 oracle"),
        &[(3, 9.0)],
    );
    assert_eq!(nums(&sel), [4]);
    // The same cards are visible to their owners (control).
    assert_eq!(
        nums(&run(
            &cat,
            &task(Some("bob"), Some("db-2"), "ORA-01555"),
            &[]
        )),
        [1, 2, 4]
    );
    let t = task(Some("alice"), Some("db-1"), "x");
    let visible = cat.visible_set(&t);
    assert!(!visible.contains(cat.ord_of(&id(1)).unwrap()));
    assert!(!visible.contains(cat.ord_of(&id(2)).unwrap()));
    assert!(visible.contains(cat.ord_of(&id(3)).unwrap()));
    assert_eq!(visible.len(), 2);
}

#[test]
fn disabled_and_superseded_cards_never_take_part() {
    let cat = catalog(vec![
        with(card(1, CardType::Fact), |e| e.summary.enabled = false),
        with(card(2, CardType::Fact), |e| {
            e.summary.superseded_by = Some(id(3))
        }),
        card(3, CardType::Fact),
        with(with(card(4, CardType::Fact), user("alice")), |e| {
            e.summary.enabled = false
        }),
    ]);
    let sel = run(
        &cat,
        &task(Some("alice"), None, "card"),
        &[(1, 5.0), (2, 5.0)],
    );
    assert_eq!(nums(&sel), [3]);
    assert!(
        !cat.visible_set(&task(Some("alice"), None, "x"))
            .contains(cat.ord_of(&id(1)).unwrap())
    );
}

#[test]
fn unverified_cards_reach_only_their_author() {
    let agent = |author: Option<&str>| {
        let author = author.map(str::to_owned);
        move |e: &mut ManifestEntry| {
            e.summary.trust = Trust::Unverified;
            e.summary.provenance = Some(Provenance {
                task_id: Some("t-0".into()),
                user_id: author,
                ..Default::default()
            });
        }
    };
    let oracle = |e: &mut ManifestEntry| e.summary.stacks = vec!["oracle".into()];
    let cat = catalog(vec![
        // Alice's agent's fact: not baseline (unverified), matches nothing.
        with(card(1, CardType::Fact), agent(Some("alice"))),
        with(
            with(card(2, CardType::Pitfall), agent(Some("alice"))),
            oracle,
        ),
        // Stored by a task that named no user: nobody's, so no task's.
        with(
            with(card(3, CardType::HumanCorrection), agent(None)),
            oracle,
        ),
        // An agent-written "correction" is not a person's correction.
        with(
            with(card(4, CardType::HumanCorrection), agent(Some("alice"))),
            oracle,
        ),
        card(5, CardType::Fact),
    ]);
    let alice = run(&cat, &task(Some("alice"), None, "oracle"), &[]);
    assert_eq!(
        alice,
        [
            (2, Tier::L2, MatchClass::Unverified),
            (4, Tier::L2, MatchClass::Unverified),
            (5, Tier::L0, MatchClass::Baseline),
        ]
    );
    // Alice's retrieve still finds her unmatched card; nobody finds the authorless one.
    let visible = cat.visible_set(&task(Some("alice"), None, "x"));
    assert!(visible.contains(cat.ord_of(&id(1)).unwrap()));
    assert!(!visible.contains(cat.ord_of(&id(3)).unwrap()));
    for other in [Some("bob"), None] {
        let t = task(other, None, "oracle");
        assert_eq!(
            nums(&run(&cat, &t, &[(1, 3.0), (3, 3.0)])),
            [5],
            "{other:?}"
        );
        for n in 1..=4 {
            assert!(
                !cat.is_visible(cat.ord_of(&id(n)).unwrap(), &t),
                "{n} {other:?}"
            );
        }
    }
}

#[test]
fn a_card_is_reported_once_in_its_most_specific_tier() {
    let cat = catalog(vec![
        with(with(card(1, CardType::Fact), user("alice")), |e| {
            e.summary.stacks = vec!["oracle".into()]
        }),
        with(card(2, CardType::Fact), |e| {
            e.summary.stacks = vec!["oracle".into()]
        }),
        with(card(3, CardType::Fact), asset("db-1")),
    ]);
    let sel = run(
        &cat,
        &task(Some("alice"), Some("db-1"), "oracle"),
        &[(1, 2.0), (2, 2.0), (3, 1.0)],
    );
    let tiers: Vec<(u32, Tier)> = sel.iter().map(|s| (s.0, s.1)).collect();
    assert_eq!(tiers.len(), 3);
    assert!(tiers.contains(&(1, Tier::L1)));
    assert!(
        tiers.contains(&(2, Tier::L2)),
        "a matched baseline-type card is L2"
    );
    assert!(tiers.contains(&(3, Tier::L2)));
}

#[test]
fn class_is_the_first_ranking_key() {
    let ora = |e: &mut ManifestEntry| e.summary.error_codes = vec!["ORA-01555".into()];
    let cat = catalog(vec![
        card(1, CardType::Fact),                                          // baseline
        with(card(2, CardType::Pitfall), |e| e.summary.importance = 1.0), // text
        with(card(3, CardType::Pitfall), |e| {
            e.summary.stacks = vec!["oracle".into()]
        }), // stack
        with(card(4, CardType::Fact), asset("db-1")),                     // asset
        with(card(5, CardType::ErrorResolution), ora),                    // code
        with(card(6, CardType::Preference), user("alice")),               // own
        card(7, CardType::HumanCorrection),                               // correction
    ]);
    let sel = run(
        &cat,
        &task(Some("alice"), Some("db-1"), "ORA-01555 oracle"),
        &[(2, 50.0)],
    );
    assert_eq!(
        sel.iter().map(|s| s.0).collect::<Vec<_>>(),
        [7, 6, 5, 4, 3, 2, 1]
    );
    assert_eq!(
        sel.iter().map(|s| s.2).collect::<Vec<_>>(),
        [
            MatchClass::HumanCorrection,
            MatchClass::Own,
            MatchClass::ErrorCode,
            MatchClass::Asset,
            MatchClass::StackOrLabel,
            MatchClass::Text,
            MatchClass::Baseline
        ]
    );
}

#[test]
fn bm25_then_importance_then_occurrence_then_last_seen_then_id() {
    let stack = |e: &mut ManifestEntry| e.summary.stacks = vec!["oracle".into()];
    let cat = catalog(vec![
        // Same class (stack match). Card 1: best BM25, lowest everything else.
        with(with(card(1, CardType::Pitfall), stack), |e| {
            e.summary.importance = 0.1
        }),
        // Cards 2-6: no text score; ordered by importance, occurrence, last_seen, id.
        with(with(card(2, CardType::Pitfall), stack), |e| {
            e.summary.importance = 0.9
        }),
        with(with(card(3, CardType::Pitfall), stack), |e| {
            e.occurrence = 5
        }),
        with(with(card(4, CardType::Pitfall), stack), |e| {
            e.last_seen = Some("2026-11-20T00:00:00Z".parse().unwrap())
        }),
        with(card(6, CardType::Pitfall), stack),
        with(card(5, CardType::Pitfall), stack),
    ]);
    let sel = run(&cat, &task(None, None, "oracle"), &[(1, 4.0)]);
    assert_eq!(
        sel.iter().map(|s| s.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
}

#[test]
fn importance_decays_from_last_seen_with_grace_half_life_and_floor() {
    let c = SelectionConfig::default();
    let now: Timestamp = NOW.parse().unwrap();
    let days_ago = |d: i64| Some(Timestamp::from_second(now.as_second() - d * 86_400).unwrap());
    assert_eq!(
        effective_importance(0.8, days_ago(30), now, &c),
        0.8,
        "inside grace"
    );
    assert!(
        (effective_importance(0.8, days_ago(75), now, &c) - 0.4).abs() < 1e-9,
        "one half-life"
    );
    assert!(
        (effective_importance(0.8, days_ago(120), now, &c) - 0.2).abs() < 1e-9,
        "two half-lives"
    );
    assert_eq!(
        effective_importance(0.8, days_ago(3000), now, &c),
        0.10,
        "floor"
    );
    assert_eq!(
        effective_importance(0.05, days_ago(3000), now, &c),
        0.05,
        "never raised to the floor"
    );
    assert_eq!(
        effective_importance(0.8, None, now, &c),
        0.8,
        "never seen: no decay"
    );
    // The catalog uses generated_at, not the clock: an old card ranks below a fresh one.
    let cat = catalog(vec![
        with(card(1, CardType::Fact), |e| {
            e.summary.importance = 0.9;
            e.last_seen = Some("2025-01-01T00:00:00Z".parse().unwrap());
        }),
        with(card(2, CardType::Fact), |e| e.summary.importance = 0.6),
    ]);
    assert_eq!(
        run(&cat, &task(None, None, "x"), &[])
            .iter()
            .map(|s| s.0)
            .collect::<Vec<_>>(),
        [2, 1]
    );
}

#[test]
fn caps_count_what_they_leave_out_per_tier() {
    let mut cards: Vec<_> = (1..=8).map(|n| card(n, CardType::Fact)).collect();
    cards.push(with(card(9, CardType::Pitfall), user("alice")));
    cards.push(with(card(10, CardType::Pitfall), |e| {
        e.summary.stacks = vec!["oracle".into()]
    }));
    let cat = catalog(cards);
    let config = SelectionConfig {
        max_mounted: 4,
        table_rows: 2,
        ..Default::default()
    };
    let rules = Rules::new(config.clone()).unwrap();
    let t = task(Some("alice"), None, "oracle");
    let sel = cat.select(&TaskQuery::new(&t, &rules.codes), &[], &config);
    assert_eq!(sel.cards.len(), 4);
    assert_eq!(sel.selected.0, [8, 1, 1]);
    assert_eq!(sel.left_out.0, [6, 0, 0], "L1 and L2 outrank the baseline");
    assert_eq!(
        sel.cards
            .iter()
            .map(|s| num(&cat, s.ord))
            .collect::<Vec<_>>(),
        [9, 10, 1, 2]
    );
}

#[test]
fn selection_is_deterministic_under_input_order() {
    let make = |rev: bool| {
        let mut cards: Vec<_> = (1..=40)
            .map(|n| {
                with(
                    card(
                        n,
                        if n % 3 == 0 {
                            CardType::Fact
                        } else {
                            CardType::Pitfall
                        },
                    ),
                    |e| {
                        e.summary.stacks = vec!["oracle".into()];
                        e.summary.importance = f64::from(n % 4) / 4.0;
                    },
                )
            })
            .collect();
        if rev {
            cards.reverse();
        }
        catalog(cards)
    };
    let t = task(None, None, "oracle");
    let config = SelectionConfig {
        max_mounted: 7,
        table_rows: 3,
        ..Default::default()
    };
    assert_eq!(
        run_with(&make(false), &t, &[], &config),
        run_with(&make(true), &t, &[], &config)
    );
}

#[test]
fn duplicate_ids_and_deltas_are_refused() {
    let manifest = Manifest {
        epoch: "e".into(),
        revision: 1,
        generated_at: NOW.parse().unwrap(),
        since: None,
        cards: vec![card(1, CardType::Fact), card(1, CardType::Fact)],
        removed: vec![],
        inherited: Vec::new(),
    };
    assert!(Catalog::new(manifest.clone(), &Rules::default()).is_err());
    let delta = Manifest {
        since: Some(0),
        cards: vec![],
        ..manifest
    };
    assert!(Catalog::new(delta, &Rules::default()).is_err());
}

#[test]
fn catalog_visibility_agrees_with_the_per_card_rule() {
    let agent = |author: &str| {
        let author = author.to_owned();
        move |e: &mut ManifestEntry| {
            e.summary.trust = Trust::Unverified;
            e.summary.provenance = Some(Provenance {
                user_id: Some(author),
                ..Default::default()
            });
        }
    };
    let cards = vec![
        card(1, CardType::Fact),
        with(card(2, CardType::Fact), user("alice")),
        with(card(3, CardType::Fact), asset("db-1")),
        with(with(card(4, CardType::Fact), user("bob")), asset("db-1")),
        with(card(5, CardType::Fact), agent("alice")),
        with(with(card(6, CardType::Fact), agent("bob")), asset("db-2")),
        with(card(7, CardType::Fact), |e| e.summary.enabled = false),
        with(card(8, CardType::Fact), |e| {
            e.summary.trust = Trust::Unverified
        }),
    ];
    let mut cards = cards;
    cards.extend([
        with(card(9, CardType::Fact), project("billing")),
        with(
            with(card(10, CardType::Fact), project("billing")),
            user("alice"),
        ),
        with(
            with(card(11, CardType::Fact), project("search")),
            asset("db-1"),
        ),
        with(card(12, CardType::Fact), for_agent("claude")),
        with(
            with(card(13, CardType::Fact), for_agent("codex")),
            project("billing"),
        ),
        with(
            with(card(14, CardType::Fact), agent("bob")),
            project("search"),
        ),
    ]);
    let cat = catalog(cards.clone());
    for u in [None, Some("alice"), Some("bob"), Some("carol")] {
        for a in [None, Some("db-1"), Some("db-2"), Some("db-3")] {
            for p in [None, Some("billing"), Some("search"), Some("other")] {
                for k in [None, Some("claude"), Some("codex")] {
                    let mut t = task(u, a, "x");
                    t.project_id = p.map(Into::into);
                    t.agent = k.map(Into::into);
                    let visible = cat.visible_set(&t);
                    for e in &cards {
                        let ord = cat.ord_of(&e.summary.id).unwrap();
                        let rule = e.summary.is_visible_to(&t.viewer());
                        assert_eq!(cat.is_visible(ord, &t), rule, "{:?} {t:?}", e.summary.id);
                        assert_eq!(visible.contains(ord), rule, "{:?} {t:?}", e.summary.id);
                    }
                }
            }
        }
    }
}

#[test]
fn project_and_agent_cards_take_part_in_the_tiers_of_their_tasks_only() {
    let cat = catalog(vec![
        card(1, CardType::Preference),
        with(card(2, CardType::Preference), project("billing")),
        with(
            with(card(3, CardType::Preference), project("billing")),
            user("alice"),
        ),
        with(
            with(card(4, CardType::Fact), project("billing")),
            asset("db-1"),
        ),
        with(card(5, CardType::Pitfall), project("billing")),
        with(card(6, CardType::Preference), project("search")),
        with(card(7, CardType::Preference), for_agent("claude")),
        with(
            with(card(8, CardType::Preference), for_agent("claude")),
            project("search"),
        ),
    ]);
    let of = |p: Option<&str>, k: Option<&str>| {
        let mut t = task(Some("alice"), Some("db-1"), "x");
        t.project_id = p.map(Into::into);
        t.agent = k.map(Into::into);
        let mut got = run(&cat, &t, &[]);
        got.sort_by_key(|(n, ..)| *n);
        got.into_iter()
            .map(|(n, tier, _)| (n, tier))
            .collect::<Vec<_>>()
    };
    // No project and no agent: the workspace's own cards only.
    assert_eq!(of(None, None), vec![(1, Tier::L0)]);
    // billing's baseline in L0, alice's own in L1, db-1's in L2; a plain fact of billing
    // only when it matches, and search's convention never.
    assert_eq!(
        of(Some("billing"), None),
        vec![(1, Tier::L0), (2, Tier::L0), (3, Tier::L1), (4, Tier::L2)]
    );
    assert_eq!(of(Some("search"), None), vec![(1, Tier::L0), (6, Tier::L0)]);
    // The agent's card reaches tasks of that agent; with a project too, that project's.
    assert_eq!(of(None, Some("claude")), vec![(1, Tier::L0), (7, Tier::L0)]);
    assert_eq!(of(None, Some("codex")), vec![(1, Tier::L0)]);
    assert_eq!(
        of(Some("search"), Some("claude")),
        vec![(1, Tier::L0), (6, Tier::L0), (7, Tier::L0), (8, Tier::L0)]
    );
}

/// A manifest of `cards` at revision `rev`, as a server sends it.
fn manifest_of(cards: Vec<ManifestEntry>, rev: u64) -> Manifest {
    Manifest {
        epoch: "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e".into(),
        revision: rev,
        generated_at: NOW.parse().unwrap(),
        since: None,
        cards,
        removed: vec![],
        inherited: vec![],
    }
}

#[test]
fn composing_keeps_own_cards_and_lets_verified_own_cards_replace_inherited_ones() {
    let mut replaces = card(10, CardType::Preference);
    replaces.summary.supersedes = vec![id(21)];
    let mut unverified_replaces = card(11, CardType::Preference);
    unverified_replaces.summary.trust = Trust::Unverified;
    unverified_replaces.summary.supersedes = vec![id(22)];
    // A verified card of one project reaches that project's tasks only: the others would
    // be left with neither card, so it replaces nothing.
    let mut project_replaces = card(12, CardType::Preference);
    project_replaces.summary.scope.project_id = Some("web".into());
    project_replaces.summary.supersedes = vec![id(23)];
    let own = manifest_of(
        vec![
            card(1, CardType::Fact),
            replaces,
            unverified_replaces,
            project_replaces,
        ],
        7,
    );
    let mut agents_own = card(24, CardType::Fact);
    agents_own.summary.trust = Trust::Unverified;
    let org = manifest_of(
        vec![
            card(1, CardType::Pitfall), // the same id as an own card: the own one stays
            card(20, CardType::Fact),
            card(21, CardType::Fact), // replaced by own card 10
            card(22, CardType::Fact), // "replaced" by an unverified card: stays
            card(23, CardType::Fact), // "replaced" by a project's card: stays
            agents_own,               // unverified in org: stays there
        ],
        3,
    );
    let composed = compose(own.clone(), &[("org", &org)]).unwrap();
    let from: Vec<(CardId, Option<&str>)> = composed
        .cards
        .iter()
        .map(|e| (e.summary.id, e.inherited_from.as_deref()))
        .collect();
    assert_eq!(
        from,
        vec![
            (id(1), None),
            (id(10), None),
            (id(11), None),
            (id(12), None),
            (id(20), Some("org")),
            (id(22), Some("org")),
            (id(23), Some("org")),
        ]
    );
    assert_eq!(composed.cards[0].summary.card_type, CardType::Fact);
    assert_eq!(
        (composed.epoch.as_str(), composed.revision),
        (own.epoch.as_str(), 7)
    );
    assert_eq!(composed.inherited.len(), 1);
    assert_eq!(
        (composed.inherited[0].revision, composed.inherited[0].cards),
        (3, 3)
    );
    // The own part is what the server sent; a composed manifest is not composed again.
    assert_eq!(composed.own().cards, {
        let mut c = own.cards.clone();
        c.sort_by_key(|e| e.summary.id);
        c
    });
    assert!(compose(composed.clone(), &[]).is_err());
    assert!(compose(own, &[("org", &composed)]).is_err());
}

#[test]
fn an_own_card_wins_a_tie_and_inherited_cards_say_where_they_come_from() {
    // Same type, importance and dates: only the id and the source tell them apart, and
    // the inherited card has the lower id.
    let own = manifest_of(vec![card(5, CardType::Preference)], 1);
    let org = manifest_of(vec![card(4, CardType::Preference)], 1);
    let cat = Catalog::new(compose(own, &[("org", &org)]).unwrap(), &Rules::default()).unwrap();
    let order = |cat: &Catalog| -> Vec<u32> {
        run(cat, &task(None, None, "x"), &[])
            .iter()
            .map(|s| s.0)
            .collect()
    };
    assert_eq!(
        order(&cat),
        vec![5, 4],
        "own first, though its id is higher"
    );
    let inherited = cat.card(cat.ord_of(&id(4)).unwrap());
    assert_eq!(inherited.from, Some("org"));
    assert_eq!(cat.card(cat.ord_of(&id(5)).unwrap()).from, None);
    assert_eq!(cat.sources(), ["org".to_owned()]);
    // Without the composition the lower id wins the tie (the control).
    let plain = catalog(vec![
        card(5, CardType::Preference),
        card(4, CardType::Preference),
    ]);
    assert_eq!(order(&plain), vec![4, 5]);
}
