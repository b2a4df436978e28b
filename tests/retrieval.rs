//! The retrieval eval: BM25 alone against BM25 + the embedding model fused by reciprocal
//! rank fusion, in one run, over the example workspace plus the cards and queries of
//! `tests/eval/retrieval.toml` (paraphrases in English, Chinese and Japanese, exact
//! matches, exclusions). Prints recall@1 and recall@5 of both; fails if the hybrid loses
//! any exact match or ever returns an excluded card, or gains too little on paraphrases.
//!
//! Also the dense ranker's fail-closed cases: no vectors, another model's vectors, and
//! vectors of another dimension all leave the index on BM25 alone, with a reason.
//!
//! Needs the model `.ci/run` installs (`MOP_EMBEDDING_MODEL`).

use std::path::Path;
use std::sync::Arc;

use mop_cards::Rules;
use mop_embed::Model;
use mop_search::DenseState;
use mop_testkit::eval::{self, Eval, asker, id_of};
use mop_testkit::{Generation, build_generation_with, embedding_model_dir};

/// The paraphrase recall@5 the hybrid must add to BM25's, in points.
const MIN_PARAPHRASE_GAIN: f64 = 20.0;

fn model() -> Arc<Model> {
    let dir = embedding_model_dir();
    Arc::new(Model::load(&dir).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn hybrid_retrieval_finds_paraphrases_and_keeps_exact_matches_and_exclusions() {
    let report = eval::run(&model());
    println!("\n{}", report.table());
    assert!(
        report.paraphrases.queries >= 30,
        "the eval needs at least 30 paraphrases"
    );
    assert!(report.exclusions >= 3, "the eval needs exclusion cases");
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    let gain = report.paraphrase_gain();
    assert!(
        gain >= MIN_PARAPHRASE_GAIN,
        "the hybrid raised paraphrase recall@5 by {gain:.0} points; at least {MIN_PARAPHRASE_GAIN} are needed"
    );
}

/// mop-embed's compact Unigram tokenizer gives the ids the Hugging Face `tokenizers` crate
/// gives for the same `tokenizer.json`, on every text of the eval and the example cards,
/// and on text made to hit the normalizer's and the segmenter's edges. A difference would
/// put vectors in another space than the model's.
#[test]
fn the_models_tokenizer_matches_the_reference_implementation() {
    let dir = embedding_model_dir();
    let model = model();
    let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let unk = reference.token_to_id("<unk>");
    let expected = |text: &str| -> Vec<u32> {
        let mut end = text.len().min(1024);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let encoding = reference.encode_fast(&text[..end], false).unwrap();
        let mut ids: Vec<u32> = encoding
            .get_ids()
            .iter()
            .copied()
            .filter(|id| Some(*id) != unk)
            .collect();
        ids.truncate(512);
        ids
    };
    let e = Eval::load();
    let ws = e.corpus();
    let mut texts: Vec<String> = e.query.iter().map(|q| q.text.clone()).collect();
    for card in ws.cards.values() {
        let s = &card.summary;
        texts.push(format!(
            "{}\n{}\n{}\n{}",
            s.title,
            s.labels.join(" "),
            s.description.as_deref().unwrap_or(""),
            card.body
        ));
    }
    for edge in [
        "e\u{301}t\u{e9} caf\u{e9} na\u{ef}ve \u{212b}ngstr\u{f6}m",
        "line one\r\nline two\rthree\n\n\tfour\u{3000}five\u{a0}six",
        "\u{ff21}\u{ff22}\u{ff23} \u{ff11}\u{ff12}\u{ff13} \u{ff76}\u{ff9e} \u{2460}\u{2461} \u{fb01}le",
        "emoji \u{1f468}\u{200d}\u{1f469}\u{200d}\u{1f467} flags \u{1f1ef}\u{1f1f5}\u{1f1e8}\u{1f1f3}",
        "nul\u{0}byte and <s>special</s> tokens <unk> and <s/> not",
        "a\u{0308}\u{0301}b \u{0915}\u{094d}\u{0937} \u{0e01}\u{0e33} \u{1100}\u{1161}\u{11a8}",
        "\u{2581}already\u{2581}spaced \u{2581}\u{2581}twice",
        "ORA-01555 snapshot too old; SQLSTATE 40P01 deadlock_detected on tbl_1234",
        "快照过旧 夜间导出 スナップショットが古すぎます 야간 내보내기 오류",
        "\u{0600}1 \u{06dd}x \u{110bd}y",
        "",
        "   ",
    ] {
        texts.push(edge.to_owned());
    }
    // Long text: the kilobyte cut falls inside a multi-byte character.
    texts.push("日本語のテキスト".repeat(100));
    let mut compared = 0;
    for text in &texts {
        assert_eq!(model.token_ids(text), expected(text), "text {text:?}");
        compared += 1;
    }
    assert!(compared > 50, "only {compared} texts compared");
}

#[test]
fn hybrid_answers_are_deterministic_and_ignore_cards_the_task_cannot_see() {
    let e = Eval::load();
    let ws = e.corpus();
    let model = model();
    let (g, _) = build_generation_with(&ws, &Rules::default(), Some(&model));
    let (again, _) = build_generation_with(&ws, &Rules::default(), Some(&model));
    let visible = Arc::new(g.catalog.visible_set(&asker(Some("alice"))));
    for q in &e.query {
        let a = g.index.search(&q.text, 10, visible.clone()).unwrap();
        let b = again.index.search(&q.text, 10, visible.clone()).unwrap();
        assert_eq!(a, b, "{:?}", q.text);
    }
    // Without bob's card in the workspace at all, alice's answers are the same, to the
    // last bit of every score: his hidden card changes nothing she can observe.
    let mut without = e.corpus();
    let hidden = id_of("en-bob-secret");
    without.manifest.cards.retain(|c| c.summary.id != hidden);
    without.cards.remove(&hidden);
    let (alone, _) = build_generation_with(&without, &Rules::default(), Some(&model));
    let visible_alone = Arc::new(alone.catalog.visible_set(&asker(Some("alice"))));
    for q in &e.query {
        let ids = |g: &Generation, hits: Vec<mop_cards::TextHit>| {
            hits.into_iter()
                .map(|h| (g.catalog.card(h.ord).id, h.score.to_bits()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ids(&g, g.index.search(&q.text, 10, visible.clone()).unwrap()),
            ids(
                &alone,
                alone
                    .index
                    .search(&q.text, 10, visible_alone.clone())
                    .unwrap()
            ),
            "{:?}",
            q.text
        );
    }
}

/// Copies a model directory, so a test can change one file of it.
fn copy_model(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

#[test]
fn vectors_of_another_model_or_none_fail_closed_to_bm25() {
    let e = Eval::load();
    let ws = e.corpus();
    let model = model();
    let rules = Rules::default();
    let catalog = |g: &Generation| g.catalog.visible_set(&asker(None));
    // The paraphrases an index finds in its first five hits.
    let found = |index: &mop_search::SearchIndex, g: &Generation| -> Vec<String> {
        let visible = Arc::new(catalog(g));
        e.query
            .iter()
            .filter(|q| q.kind == "paraphrase")
            .filter(|q| {
                let target = e.target(&ws, q);
                index
                    .search(&q.text, 5, visible.clone())
                    .unwrap()
                    .iter()
                    .any(|h| g.catalog.card(h.ord).id == target)
            })
            .map(|q| q.text.clone())
            .collect()
    };

    // Control: built and opened with the same model, paraphrases are found.
    let (hybrid, state) = build_generation_with(&ws, &rules, Some(&model));
    assert_eq!(state, DenseState::On);
    assert!(hybrid.index.is_hybrid());
    assert!(
        found(&hybrid.index, &hybrid).len() >= 10,
        "control: the hybrid finds paraphrases"
    );

    // Built without a model, opened with one: no vectors, BM25 alone, and it says so.
    let (plain, _) = build_generation_with(&ws, &rules, None);
    let (reopened, state) =
        mop_search::SearchIndex::open_with(plain.dir.path(), Some(&model), 0.3).unwrap();
    let DenseState::FailedClosed(why) = &state else {
        panic!("{state:?}")
    };
    assert!(why.contains("without card vectors"), "{why}");
    assert!(!reopened.is_hybrid());
    assert_eq!(found(&reopened, &plain), Vec::<String>::new());

    // The same model's files, one value of its config changed: another fingerprint, so
    // the vectors are refused although the dimension agrees.
    let tmp = tempfile::tempdir().unwrap();
    let other_dir = tmp.path().join("other");
    copy_model(&embedding_model_dir(), &other_dir);
    let config = other_dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    json["model_id"] = "another-model".into();
    std::fs::write(&config, serde_json::to_vec(&json).unwrap()).unwrap();
    let other = Arc::new(Model::load(&other_dir).unwrap());
    assert_eq!(other.dim(), model.dim());
    let (index, state) =
        mop_search::SearchIndex::open_with(hybrid.dir.path(), Some(&other), 0.3).unwrap();
    let DenseState::FailedClosed(why) = &state else {
        panic!("{state:?}")
    };
    assert!(why.contains("another model"), "{why}");
    assert!(!index.is_hybrid());
    // The fallback really is BM25 alone: not one paraphrase is found.
    assert_eq!(found(&index, &hybrid), Vec::<String>::new());
}

#[test]
fn vectors_of_another_dimension_are_refused_before_any_query() {
    let e = Eval::load();
    let ws = e.corpus();
    let model = model();
    let rules = Rules::default();
    let (g, _) = build_generation_with(&ws, &rules, Some(&model));
    // The stored vectors claim another dimension (as a model swapped for a larger one
    // would leave them): refused on the dimension, whatever else matches.
    let meta_path = g.dir.path().join(mop_embed::VECTORS_META);
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    meta["fingerprint"]["dim"] = (model.dim() * 2).into();
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let (index, state) =
        mop_search::SearchIndex::open_with(g.dir.path(), Some(&model), 0.3).unwrap();
    let DenseState::FailedClosed(why) = &state else {
        panic!("{state:?}")
    };
    assert!(why.contains("dimension"), "{why}");
    assert!(!index.is_hybrid());

    // Damaged vectors (one byte flipped) fail closed too, naming the file.
    let (g, _) = build_generation_with(&ws, &rules, Some(&model));
    let bin = g.dir.path().join(mop_embed::VECTORS_FILE);
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&bin, bytes).unwrap();
    let (index, state) =
        mop_search::SearchIndex::open_with(g.dir.path(), Some(&model), 0.3).unwrap();
    let DenseState::FailedClosed(why) = &state else {
        panic!("{state:?}")
    };
    assert!(why.contains(mop_embed::VECTORS_FILE), "{why}");
    assert!(!index.is_hybrid());
}

/// How many of the eval's paraphrases `mop memory retrieve` finds in its first five hits,
/// asked inside a task prepared by the runner.
fn paraphrases_retrieved(
    d: &mop_testkit::procs::Daemon,
    e: &Eval,
    ws: &mop_testkit::Workspace,
    task: &str,
) -> usize {
    use mop_testkit::procs::{as_runner, output_text, run};
    use std::ffi::OsStr;
    let socket = d.socket();
    let args: Vec<&OsStr> = [
        "prepare",
        "--socket",
        socket.to_str().unwrap(),
        "--workspace",
        "acme",
        "--task-id",
        task,
        "--title",
        "look something up",
        "--json",
    ]
    .into_iter()
    .map(OsStr::new)
    .collect();
    let out = run(&mut as_runner(&args));
    assert!(out.status.success(), "{}", output_text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut found = 0;
    for q in e.query.iter().filter(|q| q.kind == "paraphrase") {
        let mut cmd = as_runner(&[
            OsStr::new("memory"),
            OsStr::new("retrieve"),
            OsStr::new(&q.text),
            OsStr::new("--json"),
            OsStr::new("--limit"),
            OsStr::new("5"),
        ]);
        cmd.env("MOP_AGENT_SOCKET", plan["agent_socket"].as_str().unwrap());
        let out = run(&mut cmd);
        assert!(out.status.success(), "{}", output_text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let target = e.target(ws, q).to_string();
        if v["hits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["id"] == target.as_str())
        {
            found += 1;
        }
    }
    let out = run(&mut as_runner(&[
        OsStr::new("release"),
        OsStr::new("--socket"),
        socket.as_os_str(),
        OsStr::new("--task-id"),
        OsStr::new(task),
    ]));
    assert!(out.status.success(), "{}", output_text(&out));
    found
}

#[test]
fn mopd_fails_closed_without_its_model_and_rebuilds_the_vectors_once_it_loads() {
    use mop_testkit::procs::{Daemon, DaemonOptions, Server, runner_user};
    if runner_user().is_none() {
        return;
    }
    let e = Eval::load();
    let ws = e.corpus();
    let cards = tempfile::tempdir().unwrap();
    e.write_cards(cards.path());
    let server = Server::start();
    for dir in [mop_testkit::example_cards_dir(), cards.path().to_owned()] {
        let out = server.import(&dir, "acme");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let profiles =
        mop_testkit::profiles_config(&[&mop_testkit::repo_root().join("tests/profiles")]);
    let absent = tempfile::tempdir().unwrap().path().join("no-model-here");
    let config = |model: &Path| {
        format!(
            "{profiles}\n[selection]\nembedding_model = \"{}\"\n",
            model.display()
        )
    };
    let missing = config(&absent);
    let d = Daemon::start(
        &server,
        DaemonOptions {
            extra: &missing,
            ..Default::default()
        },
    );
    d.wait_synced();

    // The model is missing: the daemon serves, ranks by BM25 alone, and says why.
    let (_, status) = d.status();
    let warned = |status: &serde_json::Value| {
        status["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|w| w["message"].as_str())
            .any(|m| m.contains("hybrid retrieval is off"))
    };
    let warning = status["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| {
            w["message"]
                .as_str()
                .unwrap()
                .contains("hybrid retrieval is off")
        })
        .unwrap_or_else(|| panic!("no warning: {status:#}"));
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .contains("no-model-here"),
        "{warning}"
    );
    let (_, generation, _) = mop_testkit::check_current_files(&d.pool("acme"));
    assert!(
        !generation
            .join("index")
            .join(mop_embed::VECTORS_META)
            .exists()
    );
    assert_eq!(paraphrases_retrieved(&d, &e, &ws, "bm25-only"), 0);

    // The model installed and named: the next poll rebuilds the current generation with
    // its vectors (the cards did not change), and the same questions find their cards.
    let real = embedding_model_dir();
    let installed = config(&real);
    d.write_config(
        &server.url,
        DaemonOptions {
            extra: &installed,
            ..Default::default()
        },
    );
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.wait_for("the model loaded", |v| !warned(v));
    d.sync("acme");
    let (_, generation, _) = mop_testkit::check_current_files(&d.pool("acme"));
    let stored = mop_embed::stored_fingerprint(&generation.join("index"))
        .expect("the rebuilt generation has card vectors");
    assert_eq!(&stored, model().fingerprint());
    assert!(
        d.log().contains("rebuilt the current generation"),
        "{}",
        d.log()
    );
    let found = paraphrases_retrieved(&d, &e, &ws, "hybrid");
    assert!(
        found >= 10,
        "mop memory retrieve found {found} of 30 paraphrases"
    );
    assert!(!warned(&d.status().1));
}
