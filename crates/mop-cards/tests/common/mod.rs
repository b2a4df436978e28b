//! Builders for small hand-made workspaces, shared by the selection and MEMORY.md tests.
#![allow(dead_code)]

use mop_cards::{
    CardId, CardSummary, CardType, Catalog, Manifest, ManifestEntry, Rules, Scope, TaskContext,
    Trust, card_path,
};

pub const NOW: &str = "2026-11-29T00:00:00Z";

pub fn id(n: u32) -> CardId {
    CardId::parse(&format!("00000000-0000-4000-8000-{n:012}")).unwrap()
}

pub fn card(n: u32, card_type: CardType) -> ManifestEntry {
    ManifestEntry {
        summary: CardSummary {
            id: id(n),
            card_type,
            title: format!("card {n}"),
            description: None,
            labels: vec![],
            scope: Scope::default(),
            error_codes: vec![],
            stacks: vec![],
            importance: 0.5,
            created_at: Some("2026-11-01T00:00:00Z".parse().unwrap()),
            updated_at: None,
            enabled: true,
            superseded_by: None,
            supersedes: vec![],
            trust: Trust::Verified,
            provenance: None,
        },
        sha256: "0".repeat(64),
        size: 10,
        path: card_path(card_type, &id(n)),
        occurrence: 1,
        last_seen: None,
        inherited_from: None,
    }
}

pub fn with(mut e: ManifestEntry, f: impl FnOnce(&mut ManifestEntry)) -> ManifestEntry {
    f(&mut e);
    e
}

pub fn user(u: &str) -> impl FnOnce(&mut ManifestEntry) {
    let u = u.to_owned();
    move |e| e.summary.scope.user_id = Some(u)
}

pub fn asset(a: &str) -> impl FnOnce(&mut ManifestEntry) {
    let a = a.to_owned();
    move |e| e.summary.scope.asset_id = Some(a)
}

pub fn project(p: &str) -> impl FnOnce(&mut ManifestEntry) {
    let p = p.to_owned();
    move |e| e.summary.scope.project_id = Some(p)
}

pub fn for_agent(a: &str) -> impl FnOnce(&mut ManifestEntry) {
    let a = a.to_owned();
    move |e| e.summary.scope.agent = Some(a)
}

pub fn catalog(cards: Vec<ManifestEntry>) -> Catalog {
    let manifest = Manifest {
        epoch: "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e".into(),
        revision: 7,
        generated_at: NOW.parse().unwrap(),
        since: None,
        cards,
        removed: vec![],
        inherited: vec![],
    };
    Catalog::new(manifest, &Rules::default()).unwrap()
}

pub fn task(user: Option<&str>, asset: Option<&str>, title: &str) -> TaskContext {
    TaskContext {
        task_id: "t-1".into(),
        workspace: "acme".into(),
        origin_user_id: user.map(Into::into),
        asset_id: asset.map(Into::into),
        project_id: None,
        agent: None,
        title: title.into(),
        description: String::new(),
        labels: vec![],
    }
}
