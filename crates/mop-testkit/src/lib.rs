//! The kit mop's whole-system tests (`tests/`) and benchmarks (`mop-bench`) build their
//! worlds with: the world most tests need ([`world`]: server, daemon, tokens and the
//! runner user, with typed helpers), real `mop-server` and `mopd` processes one by one
//! ([`procs`]), PostgreSQL clusters ([`postgres`]), network faults ([`faults`]), the evals
//! ([`eval`], [`lessons`]), a scripted model for the agent CLIs ([`model`]), credential samples ([`credentials`]), ARCHITECTURE.md's
//! "must not" rules as a test ([`rooms`]), and here: loading a card
//! directory (the example workspace under `config/examples/cards`) and building a real
//! generation from it, the catalog and a real search index in a temporary directory.

pub mod credentials;
pub mod eval;
pub mod faults;
pub mod lessons;
pub mod model;
pub mod postgres;
pub mod procs;
pub mod rooms;
pub mod world;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use mop_cards::{Card, CardId, Catalog, Manifest, ManifestEntry, Rules, parse_card};
use mop_search::{DenseState, IndexDoc, SearchIndex, build_index_with};

/// An HTTP client for tests. reqwest's TLS (rustls, needed by mopd) wants a crypto
/// provider installed first, even for plain-HTTP clients.
pub fn http() -> reqwest::blocking::Client {
    http_builder().build().expect("HTTP client")
}

/// A client builder, with the crypto provider installed.
pub fn http_builder() -> reqwest::blocking::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::blocking::Client::builder()
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/mop-testkit sits two levels below the repository root")
        .to_owned()
}

/// The example workspace's card directory.
pub fn example_cards_dir() -> PathBuf {
    repo_root().join("config/examples/cards")
}

/// A pool's current generation: its name, directory and manifest, after checking that
/// every card's object hashes to its manifest entry.
pub fn check_current_files(pool: &Path) -> (String, PathBuf, Manifest) {
    check_current_with(pool, |_, _| Ok(()))
}

/// [`check_current_files`], and then `more` on the generation's directory and manifest.
///
/// A running daemon may publish a newer generation meanwhile and remove this one at
/// once (nothing pins it: the test reads it behind the daemon's back). A check that
/// failed on a missing file (or in `more`) after `current` moved on and the checked
/// generation was removed is therefore made again on the new one; any other failure (a
/// file that does not hash to its entry, a failure while `current` stays put) is a real
/// one. Check before starting a daemon to leave no room for either.
pub fn check_current_with(
    pool: &Path,
    more: impl Fn(&Path, &Manifest) -> Result<(), String>,
) -> (String, PathBuf, Manifest) {
    let current = pool.join("current");
    let mut moved = 0;
    loop {
        let link = std::fs::read_link(&current).expect("current link");
        let dir = pool.join(&link);
        let checked =
            check_generation(&dir).and_then(|m| more(&dir, &m).map(|()| m).map_err(|w| (true, w)));
        match checked {
            Ok(manifest) => {
                let name = link.file_name().unwrap().to_string_lossy().into_owned();
                return (name, dir, manifest);
            }
            Err((true, why)) if moved < 20 && superseded(&current, &link, &dir) => {
                moved += 1;
                eprintln!(
                    "current moved on and {} was removed while it was checked ({why}); checking the new one",
                    dir.display()
                );
            }
            Err((_, why)) => panic!("{why}"),
        }
    }
}

/// Whether `current` no longer points at `link` and its directory `dir` is gone (a
/// removal under way is given two seconds).
fn superseded(current: &Path, link: &Path, dir: &Path) -> bool {
    if std::fs::read_link(current).ok().as_deref() == Some(link) {
        return false;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while dir.exists() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

/// Checks that every card's object of the generation in `dir` hashes to its manifest entry.
/// A failure says why, and whether it was a missing file.
fn check_generation(dir: &Path) -> Result<Manifest, (bool, String)> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| {
            let missing = e.kind() == std::io::ErrorKind::NotFound;
            (missing, format!("{}: {e}", path.display()))
        })
    };
    let path = dir.join("manifest.json");
    let manifest: Manifest = serde_json::from_slice(&read(&path)?)
        .map_err(|e| (false, format!("{}: {e}", path.display())))?;
    // A card's file is its object in the pool (`<pool>/gens/<generation>`).
    let objects = dir.join("../../objects");
    for e in &manifest.cards {
        let file = objects.join(&e.sha256[..2]).join(&e.sha256);
        if mop_cards::sha256_hex(&read(&file)?) != e.sha256 {
            let why = "content does not hash to its manifest entry";
            return Err((false, format!("{}: {why}", file.display())));
        }
    }
    Ok(manifest)
}

/// Daemon config lines pointing `[tasks] profile_dirs` at the repository's sandbox
/// profiles, then `more`: what a test that prepares tasks appends to the config.
pub fn profiles_config(more: &[&Path]) -> String {
    let dirs: Vec<String> = std::iter::once(repo_root().join("bwrap-profiles"))
        .chain(more.iter().map(|p| p.to_path_buf()))
        .map(|d| format!("\"{}\"", d.display()))
        .collect();
    format!("[tasks]\nprofile_dirs = [{}]\n", dirs.join(", "))
}

/// A workspace loaded from a card directory.
pub struct Workspace {
    /// Its manifest, as a server would publish it.
    pub manifest: Manifest,
    /// Each card, parsed.
    pub cards: HashMap<CardId, Card>,
}

/// Every `.md` file below `dir`, sorted.
pub fn card_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Loads a card directory; every file must be a valid card.
pub fn load_cards(dir: &Path, generated_at: Timestamp) -> Workspace {
    let mut entries = Vec::new();
    let mut cards = HashMap::new();
    for path in card_files(dir) {
        let bytes = std::fs::read(&path).unwrap();
        let card = parse_card(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        entries.push(ManifestEntry::for_card(&card, &bytes));
        cards.insert(card.summary.id, card);
    }
    Workspace {
        manifest: Manifest {
            epoch: "5f0c7a52-9d0e-4b8e-a7f1-3c2d1e0f9a8b".into(),
            revision: 1,
            generated_at,
            since: None,
            cards: entries,
            removed: vec![],
            inherited: Vec::new(),
        },
        cards,
    }
}

/// A built generation: catalog plus a real index on disk.
pub struct Generation {
    /// The catalog.
    pub catalog: Catalog,
    /// The opened index.
    pub index: SearchIndex,
    /// Where the index lives; removed on drop.
    pub dir: tempfile::TempDir,
}

/// Builds the catalog and the search index for a workspace.
pub fn build_generation(ws: &Workspace, rules: &Rules) -> Generation {
    build_generation_with(ws, rules, None).0
}

/// [`build_generation`], with the card vectors of `model` too, and the index opened with
/// it (so searches are hybrid when the state is [`DenseState::On`]).
pub fn build_generation_with(
    ws: &Workspace,
    rules: &Rules,
    model: Option<&std::sync::Arc<mop_embed::Model>>,
) -> (Generation, DenseState) {
    let catalog = Catalog::new(ws.manifest.clone(), rules).expect("valid manifest");
    let dir = tempfile::tempdir().unwrap();
    let docs = catalog.cards().enumerate().map(|(ord, c)| {
        let card = &ws.cards[&c.id];
        IndexDoc {
            ord: ord as u32,
            title: &card.summary.title,
            description: card.summary.description.as_deref().unwrap_or(""),
            labels: &card.summary.labels,
            body: std::borrow::Cow::Borrowed(&card.body),
            open: card.summary.is_open(),
        }
    });
    build_index_with(dir.path(), docs, model.map(|m| &**m)).expect("index builds");
    let (index, dense) =
        SearchIndex::open_with(dir.path(), model, rules.config.dense_min_similarity)
            .expect("index opens");
    (
        Generation {
            catalog,
            index,
            dir,
        },
        dense,
    )
}

/// The embedding model the retrieval tests use: the directory in `MOP_EMBEDDING_MODEL`,
/// as `.ci/run` installs it with `packaging/embedding/install-model.sh`. Panics without it
/// (these tests are never skipped).
pub fn embedding_model_dir() -> PathBuf {
    match std::env::var_os("MOP_EMBEDDING_MODEL") {
        Some(dir) => PathBuf::from(dir),
        None => panic!(
            "MOP_EMBEDDING_MODEL is not set: install the model with \
             packaging/embedding/install-model.sh DIR and set MOP_EMBEDDING_MODEL=DIR \
             (.ci/run does both)"
        ),
    }
}

impl Workspace {
    /// The id of the one card whose title contains `needle`.
    pub fn id_titled(&self, needle: &str) -> CardId {
        let found: Vec<CardId> = self
            .cards
            .values()
            .filter(|c| c.summary.title.contains(needle))
            .map(|c| c.summary.id)
            .collect();
        assert_eq!(found.len(), 1, "cards titled {needle:?}: {found:?}");
        found[0]
    }
}
