//! The retrieval eval: BM25 alone against BM25 + an embedding model fused by reciprocal
//! rank fusion, in one run, over the example workspace plus the cards and queries of
//! `tests/eval/retrieval.toml` (paraphrases in English, Chinese and Japanese, exact
//! matches, exclusions). `tests/retrieval.rs` asserts on it; `mop-bench hybrid` prints its
//! table into BENCHMARKS.md.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use mop_cards::{CardId, Rules, TaskContext, TextHit};
use mop_embed::Model;
use mop_search::{DenseState, query_terms};
use serde::Deserialize;

use crate::{Generation, Workspace, build_generation_with, example_cards_dir, load_cards};

/// The eval file.
#[derive(Deserialize)]
pub struct Eval {
    /// Cards added to the example workspace.
    pub card: Vec<EvalCard>,
    /// The queries.
    pub query: Vec<EvalQuery>,
}

/// A card of the eval.
#[derive(Deserialize)]
pub struct EvalCard {
    /// Its key (a stable id is made of it).
    pub key: String,
    /// Title.
    pub title: String,
    /// Description.
    pub description: String,
    /// Body.
    pub body: String,
    /// Set: a personal card of this user.
    pub user: Option<String>,
}

/// A query of the eval.
#[derive(Clone, Deserialize)]
pub struct EvalQuery {
    /// paraphrase, exact or exclusion.
    pub kind: String,
    /// A card key of the eval file, or (with `example = true`) a part of an example
    /// card's title.
    pub target: String,
    /// See `target`.
    #[serde(default)]
    pub example: bool,
    /// The query text.
    pub text: String,
    /// Who asks (none: a task with no user).
    pub user: Option<String>,
}

impl Eval {
    /// Reads `tests/eval/retrieval.toml`.
    pub fn load() -> Eval {
        let path = crate::repo_root().join("tests/eval/retrieval.toml");
        toml::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Writes the eval cards into `dir` as OKF card files (for `mop-server import`).
    pub fn write_cards(&self, dir: &std::path::Path) {
        for c in &self.card {
            let scope = match &c.user {
                Some(u) => format!("scope:\n  user_id: {u}\n"),
                None => String::new(),
            };
            let kind = if c.user.is_some() {
                "preference"
            } else {
                "fact"
            };
            let text = format!(
                "---\nid: {}\ntype: {kind}\ntitle: {}\ndescription: {}\n{scope}importance: 0.5\ncreated_at: 2026-11-01T00:00:00Z\n---\n{}\n",
                id_of(&c.key),
                serde_json::to_string(&c.title).unwrap(),
                serde_json::to_string(&c.description).unwrap(),
                c.body
            );
            // At the path its type and id give, as `mop-server import` wants.
            let card = mop_cards::parse_card(text.as_bytes())
                .unwrap_or_else(|e| panic!("eval card {}: {e}", c.key));
            let path = dir.join(mop_cards::card_path(
                card.summary.card_type,
                &card.summary.id,
            ));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    /// The example workspace plus the eval cards, as one workspace.
    pub fn corpus(&self) -> Workspace {
        let dir = tempfile::tempdir().unwrap();
        self.write_cards(dir.path());
        let at = "2026-11-29T00:00:00Z".parse().unwrap();
        let mut ws = load_cards(&example_cards_dir(), at);
        let extra = load_cards(dir.path(), at);
        ws.manifest.cards.extend(extra.manifest.cards);
        ws.manifest.cards.sort_by_key(|e| e.summary.id);
        ws.cards.extend(extra.cards);
        ws
    }

    /// The card a query is after.
    pub fn target(&self, ws: &Workspace, q: &EvalQuery) -> CardId {
        if q.example {
            ws.id_titled(&q.target)
        } else {
            id_of(&q.target)
        }
    }
}

/// A stable id for an eval card's key.
pub fn id_of(key: &str) -> CardId {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(key.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    // A version 5 style UUID (name-based), variant 1.
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    CardId::from_uuid(uuid::Uuid::from_bytes(b))
}

/// A task of `user` (none: no user).
pub fn asker(user: Option<&str>) -> TaskContext {
    TaskContext {
        task_id: "t-eval".into(),
        workspace: "acme".into(),
        origin_user_id: user.map(Into::into),
        asset_id: None,
        project_id: None,
        agent: None,
        title: "x".into(),
        description: String::new(),
        labels: vec![],
    }
}

/// Every term a card can be found by.
pub fn card_terms(ws: &Workspace, id: CardId) -> BTreeSet<String> {
    let c = &ws.cards[&id];
    let text = format!(
        "{}\n{}\n{}\n{}",
        c.summary.title,
        c.summary.labels.join(" "),
        c.summary.description.as_deref().unwrap_or(""),
        c.body
    );
    query_terms(&text)
}

/// 1-based rank of `target` in the first `k` hits, by BM25 alone and by the index's own
/// search (the hybrid, when its dense ranker is on).
pub fn ranks(
    g: &Generation,
    text: &str,
    user: Option<&str>,
    target: CardId,
    k: usize,
) -> (Option<usize>, Option<usize>) {
    let visible = Arc::new(g.catalog.visible_set(&asker(user)));
    let rank = |hits: Vec<TextHit>| {
        hits.iter()
            .position(|h| g.catalog.card(h.ord).id == target)
            .map(|p| p + 1)
    };
    (
        rank(g.index.bm25(text, k, visible.clone()).unwrap()),
        rank(g.index.search(text, k, visible).unwrap()),
    )
}

/// Hits at 1 and at 5 of a set of queries, for both rankers.
#[derive(Default, Clone)]
pub struct Tally {
    /// Queries counted.
    pub queries: usize,
    /// BM25 alone: hits at 1, at 5.
    pub bm25: [usize; 2],
    /// Hybrid: hits at 1, at 5.
    pub hybrid: [usize; 2],
}

impl Tally {
    fn add(&mut self, (bm25, hybrid): (Option<usize>, Option<usize>)) {
        self.queries += 1;
        for (i, k) in [1, 5].into_iter().enumerate() {
            self.bm25[i] += usize::from(bm25.is_some_and(|r| r <= k));
            self.hybrid[i] += usize::from(hybrid.is_some_and(|r| r <= k));
        }
    }

    /// A count as a percentage of the queries.
    pub fn pct(&self, n: usize) -> f64 {
        100.0 * n as f64 / self.queries.max(1) as f64
    }

    fn row(&self, name: &str) -> String {
        format!(
            "| {name} | {} | {:.0} % | {:.0} % | {:.0} % | {:.0} % |",
            self.queries,
            self.pct(self.bm25[0]),
            self.pct(self.hybrid[0]),
            self.pct(self.bm25[1]),
            self.pct(self.hybrid[1]),
        )
    }
}

/// What one run of the eval measured.
pub struct Report {
    /// Paraphrases per language (en, ja, zh).
    pub paraphrase: BTreeMap<&'static str, Tally>,
    /// All paraphrases.
    pub paraphrases: Tally,
    /// Exact matches.
    pub exact: Tally,
    /// Exclusion queries, and their owner's control runs (hybrid column: hits at 50).
    pub exclusions: usize,
    /// Everything that must not happen: a lost exact match, an excluded card returned,
    /// an owner denied his own card, a paraphrase sharing a term with its card.
    pub failures: Vec<String>,
}

impl Report {
    /// Paraphrase recall@5, hybrid minus BM25, in points.
    pub fn paraphrase_gain(&self) -> f64 {
        self.paraphrases.pct(self.paraphrases.hybrid[1])
            - self.paraphrases.pct(self.paraphrases.bm25[1])
    }

    /// The recall table, Markdown.
    pub fn table(&self) -> String {
        let mut t = String::from(
            "| queries | n | recall@1 BM25 | recall@1 hybrid | recall@5 BM25 | recall@5 hybrid |\n|---|---:|---:|---:|---:|---:|\n",
        );
        for (lang, tally) in &self.paraphrase {
            t += &tally.row(&format!("paraphrase, {lang}"));
            t.push('\n');
        }
        t += &self.paraphrases.row("paraphrase, all");
        t.push('\n');
        t += &self.exact.row("exact match");
        t.push('\n');
        t += &format!(
            "| exclusion (the card must never come back) | {} | {} | | | |\n",
            self.exclusions,
            if self.failures.iter().any(|f| f.starts_with("exclusion ")) {
                "**violated**"
            } else {
                "never returned, by either"
            }
        );
        t
    }
}

fn language(text: &str) -> &'static str {
    if text.chars().any(|c| matches!(c, '\u{3040}'..='\u{30ff}')) {
        "ja"
    } else if text.chars().any(|c| matches!(c, '\u{4e00}'..='\u{9fff}')) {
        "zh"
    } else {
        "en"
    }
}

/// Runs every query against one generation built with `model`'s vectors.
pub fn run(model: &Arc<Model>) -> Report {
    let e = Eval::load();
    let ws = e.corpus();
    let (g, dense) = build_generation_with(&ws, &Rules::default(), Some(model));
    assert_eq!(dense, DenseState::On, "the eval's index must be hybrid");
    let mut report = Report {
        paraphrase: BTreeMap::new(),
        paraphrases: Tally::default(),
        exact: Tally::default(),
        exclusions: 0,
        failures: Vec::new(),
    };
    for q in &e.query {
        let target = e.target(&ws, q);
        let user = q.user.as_deref();
        match q.kind.as_str() {
            "paraphrase" => {
                // A paraphrase shares no search term with its card, or BM25 could find it.
                let shared: Vec<_> = query_terms(&q.text)
                    .intersection(&card_terms(&ws, target))
                    .cloned()
                    .collect();
                if !shared.is_empty() {
                    report.failures.push(format!(
                        "paraphrase {:?} shares {shared:?} with its card",
                        q.text
                    ));
                }
                let r = ranks(&g, &q.text, user, target, 5);
                report
                    .paraphrase
                    .entry(language(&q.text))
                    .or_default()
                    .add(r);
                report.paraphrases.add(r);
            }
            "exact" => {
                let (bm25, hybrid) = ranks(&g, &q.text, user, target, 5);
                report.exact.add((bm25, hybrid));
                // The hybrid may not lose what BM25 found, at 1 or at 5.
                for k in [1, 5] {
                    if bm25.is_some_and(|r| r <= k) && hybrid.is_none_or(|r| r > k) {
                        report.failures.push(format!(
                            "exact {:?}: BM25 rank {bm25:?}, hybrid rank {hybrid:?} (lost at {k})",
                            q.text
                        ));
                    }
                }
            }
            "exclusion" => {
                report.exclusions += 1;
                // The asker never gets the card, from either ranker, at any depth...
                let (bm25, hybrid) = ranks(&g, &q.text, user, target, 50);
                if bm25.is_some() || hybrid.is_some() {
                    report.failures.push(format!(
                        "exclusion {:?}: {user:?} saw the card (BM25 {bm25:?}, hybrid {hybrid:?})",
                        q.text
                    ));
                }
                // ...while its owner, asking the same, does (the control).
                let owner = e
                    .card
                    .iter()
                    .find(|c| c.key == q.target)
                    .and_then(|c| c.user.as_deref());
                let (_, seen) = ranks(&g, &q.text, owner, target, 50);
                if seen.is_none() {
                    report.failures.push(format!(
                        "control of exclusion {:?}: the owner {owner:?} did not get the card",
                        q.text
                    ));
                }
            }
            other => report.failures.push(format!(
                "query kind {other:?} is not paraphrase, exact or exclusion"
            )),
        }
    }
    report
}
