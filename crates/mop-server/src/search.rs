//! The server's own BM25 index of each workspace (mop-search, the same ranker the daemons
//! use), for curators: the nearest cards of a review entry and `search`. Built on first use
//! from every card, archived ones too (`search --archived` finds them; a review entry's
//! nearest cards leave them out), in a temporary directory, and rebuilt when the
//! workspace's revision has moved; one build per workspace at a time. A large workspace's
//! index is rebuilt in the background while the previous one serves. A search reads every
//! card's statistics (the engine's fast path) and keeps the hits its filter admits; a
//! review entry's nearest cards are remembered while the index serves.

use std::collections::HashMap;
use std::sync::Arc;

use mop_cards::{CardSummary, VisibleSet};
use mop_search::{IndexDoc, SearchIndex, build_index};
use parking_lot::Mutex;

use crate::store::{Store, StoreError};

/// One workspace's index at one revision.
pub struct WorkspaceIndex {
    /// The revision it was built from.
    pub revision: u64,
    /// The cards, by ordinal.
    pub cards: Vec<CardSummary>,
    /// Whether each card (by ordinal) is archived.
    archived: Vec<bool>,
    /// Every card: the search's fast path (its statistics need no pass over the postings).
    all: Arc<VisibleSet>,
    /// Nearest cards already found for a card at this revision (a queue page is read
    /// again and again between changes).
    nearest: Mutex<HashMap<mop_cards::CardId, Vec<(usize, f32)>>>,
    index: SearchIndex,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for WorkspaceIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspaceIndex")
            .field("revision", &self.revision)
            .field("cards", &self.cards.len())
            .finish()
    }
}

impl WorkspaceIndex {
    /// The best `limit` cards for `text` among those `keep` admits (given each card and
    /// whether it is archived), as (ordinal, score).
    pub fn search(
        &self,
        text: &str,
        limit: usize,
        keep: impl Fn(&CardSummary, bool) -> bool,
    ) -> Result<Vec<(usize, f32)>, StoreError> {
        let fail = |e: mop_search::SearchError| StoreError::Index(format!("search failed: {e}"));
        let kept = |ord: u32| {
            let ord = ord as usize;
            keep(&self.cards[ord], self.archived[ord])
        };
        // Over every card first (scored by every card's statistics, as curators see them
        // all), keeping the admitted hits: cheap while they are among the best few. A
        // filter that admits too few of them restricts the search to the admitted cards.
        let n = self.cards.len();
        let mut want = (limit * 4).max(32);
        while limit > 0 && want < n / 4 {
            let hits = self
                .index
                .search(text, want, self.all.clone())
                .map_err(fail)?;
            let found: Vec<(usize, f32)> = hits
                .iter()
                .filter(|h| kept(h.ord))
                .take(limit)
                .map(|h| (h.ord as usize, h.score))
                .collect();
            if found.len() == limit || hits.len() < want {
                return Ok(found);
            }
            want *= 4;
        }
        self.search_within(text, limit, keep)
    }

    /// The best `limit` cards for a card's `text` among those `keep` admits, remembered
    /// for the card while this index serves (its revision fixes the answer).
    pub fn nearest(
        &self,
        card: mop_cards::CardId,
        text: &str,
        limit: usize,
        keep: impl Fn(&CardSummary, bool) -> bool,
    ) -> Result<Vec<(usize, f32)>, StoreError> {
        if let Some(hits) = self.nearest.lock().get(&card) {
            return Ok(hits.clone());
        }
        let hits = self.search(text, limit, keep)?;
        let mut memo = self.nearest.lock();
        // Bounded: a workspace's queue is what is asked for, not every card.
        if memo.len() >= NEAREST_MEMO {
            memo.clear();
        }
        memo.insert(card, hits.clone());
        Ok(hits)
    }

    /// How many cards `keep` admits.
    pub fn count(&self, keep: impl Fn(&CardSummary, bool) -> bool) -> usize {
        self.cards
            .iter()
            .zip(&self.archived)
            .filter(|(c, a)| keep(c, **a))
            .count()
    }

    /// The search restricted to the cards `keep` admits (their statistics only).
    fn search_within(
        &self,
        text: &str,
        limit: usize,
        keep: impl Fn(&CardSummary, bool) -> bool,
    ) -> Result<Vec<(usize, f32)>, StoreError> {
        let mut visible = VisibleSet::empty(self.cards.len());
        for (ord, (card, archived)) in self.cards.iter().zip(&self.archived).enumerate() {
            if keep(card, *archived) {
                visible.insert(ord as u32);
            }
        }
        let hits = self
            .index
            .search(text, limit, Arc::new(visible))
            .map_err(|e| StoreError::Index(format!("search failed: {e}")))?;
        Ok(hits.iter().map(|h| (h.ord as usize, h.score)).collect())
    }
}

/// Most cards whose nearest cards one index remembers.
const NEAREST_MEMO: usize = 4096;

/// An index of more cards than this that is behind the workspace is rebuilt in the
/// background while requests read the one it replaces (a 100k-card build takes seconds,
/// and a busy fleet changes the workspace every few): search and nearest cards lag a
/// change by one build, and what they name is read fresh from the rows.
const BACKGROUND_REBUILD_CARDS: usize = 20_000;

/// The indexes of the workspaces curators have searched.
#[derive(Debug)]
pub struct SearchCache {
    /// Where index directories are made: `curation-index/<random>/` beside the database,
    /// so several server processes on one database keep theirs apart.
    dir: std::path::PathBuf,
    /// `<random>.lock`, locked for as long as this process runs: how another process
    /// tells a live server's indexes from those a killed one left.
    _lock: Option<std::fs::File>,
    built: Built,
    building: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The built indexes by workspace, shared with background rebuilds, and how many times
/// indexes were dropped (a build that began before a drop must not be served after it).
#[derive(Debug, Default, Clone)]
struct Built {
    indexes: Arc<Mutex<HashMap<String, Arc<WorkspaceIndex>>>>,
    drops: Arc<std::sync::atomic::AtomicU64>,
}

impl SearchCache {
    /// Indexes under `base/<random>/`. What servers that are gone left under `base` (a
    /// killed server leaves its last indexes behind) is removed; a running one's (its lock
    /// file is locked) is not touched.
    pub fn new(base: std::path::PathBuf) -> SearchCache {
        use fs2::FileExt;
        let _ = owner_only_dir(&base);
        if let Ok(entries) = std::fs::read_dir(&base) {
            for entry in entries.flatten() {
                let path = entry.path();
                let (dir, lock) = if path.extension().is_some_and(|e| e == "lock") {
                    (path.with_extension(""), path)
                } else {
                    (path.clone(), path.with_extension("lock"))
                };
                // Alive while its process holds the lock; a lock file nobody holds, or
                // none at all, marks what a gone process left.
                let alive =
                    std::fs::File::open(&lock).is_ok_and(|f| f.try_lock_exclusive().is_err());
                if !alive {
                    let _ = std::fs::remove_dir_all(&dir);
                    let _ = std::fs::remove_file(&lock);
                }
            }
        }
        let name = uuid::Uuid::new_v4().simple().to_string();
        let dir = base.join(&name);
        let lock = std::fs::File::create(base.join(format!("{name}.lock")))
            .ok()
            .filter(|f| f.try_lock_exclusive().is_ok());
        if lock.is_none() {
            tracing::warn!(dir = %base.display(), "cannot lock a curation index directory; another server may remove it");
        }
        SearchCache {
            dir,
            _lock: lock,
            built: Built::default(),
            building: Mutex::default(),
        }
    }

    /// Drops the index of `ws`, or of every workspace: after a hard delete or a purge the
    /// removed text must not stay searchable (nor on disk) until the next rebuild.
    pub fn forget(&self, ws: Option<&str>) {
        let mut built = self.built.indexes.lock();
        self.built
            .drops
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match ws {
            Some(ws) => {
                built.remove(ws);
            }
            None => built.clear(),
        }
    }

    /// The index of `ws` at `revision` or later, built now if needed.
    pub async fn get(
        &self,
        store: &Arc<Store>,
        ws: &str,
        revision: u64,
    ) -> Result<Arc<WorkspaceIndex>, StoreError> {
        let fresh = |c: &HashMap<String, Arc<WorkspaceIndex>>| {
            c.get(ws).filter(|i| i.revision >= revision).cloned()
        };
        let current = self.built.indexes.lock().get(ws).cloned();
        if let Some(i) = current.as_ref().filter(|i| i.revision >= revision) {
            return Ok(i.clone());
        }
        let lock = self
            .building
            .lock()
            .entry(ws.to_owned())
            .or_default()
            .clone();
        if let Some(stale) = current.filter(|i| i.cards.len() > BACKGROUND_REBUILD_CARDS) {
            // One rebuild at a time, in the background; until it is done, the last index.
            if let Ok(guard) = lock.clone().try_lock_owned() {
                let (store, name, dir, built) = (
                    store.clone(),
                    ws.to_owned(),
                    self.dir.clone(),
                    self.built.clone(),
                );
                tokio::spawn(async move {
                    let _one_build = guard;
                    if let Err(e) = build_into(&built, store, &name, dir, true).await {
                        tracing::warn!(workspace = %name, error = %e, "curation search index rebuild failed");
                    }
                });
            }
            return Ok(stale);
        }
        let _one_build = lock.lock().await;
        if let Some(i) = fresh(&self.built.indexes.lock()) {
            return Ok(i);
        }
        build_into(&self.built, store.clone(), ws, self.dir.clone(), false).await
    }
}

/// Builds the index of `ws` and makes it the one served; a background rebuild
/// (`replace_only`) only replaces one still served, since an index dropped meanwhile was
/// dropped for a hard delete or a purge its build may predate.
async fn build_into(
    built: &Built,
    store: Arc<Store>,
    ws: &str,
    dir: std::path::PathBuf,
    replace_only: bool,
) -> Result<Arc<WorkspaceIndex>, StoreError> {
    let name = ws.to_owned();
    let drops = built.drops.load(std::sync::atomic::Ordering::SeqCst);
    let started = std::time::Instant::now();
    let index = tokio::task::spawn_blocking(move || build(&store, &name, &dir))
        .await
        .map_err(|e| StoreError::Index(format!("build failed: {e}")))??;
    tracing::info!(
        workspace = ws,
        cards = index.cards.len(),
        revision = index.revision,
        millis = started.elapsed().as_millis() as u64,
        "curation search index built"
    );
    let index = Arc::new(index);
    let mut served = built.indexes.lock();
    let dropped = built.drops.load(std::sync::atomic::Ordering::SeqCst) != drops;
    if !dropped && (!replace_only || served.contains_key(ws)) {
        served.insert(ws.to_owned(), index.clone());
    }
    Ok(index)
}

fn build(store: &Store, ws: &str, under: &std::path::Path) -> Result<WorkspaceIndex, StoreError> {
    let (revision, cards) = store.searchable_cards(ws)?;
    let io = |e: std::io::Error| {
        StoreError::Index(format!(
            "cannot make a directory for it in {}: {e}",
            under.display()
        ))
    };
    owner_only_dir(under).map_err(io)?;
    let dir = tempfile::Builder::new()
        .prefix(&format!("{ws}-"))
        .tempdir_in(under)
        .map_err(io)?;
    let docs = cards
        .iter()
        .enumerate()
        .map(|(ord, (s, body, _))| IndexDoc {
            ord: ord as u32,
            title: &s.title,
            description: s.description.as_deref().unwrap_or(""),
            labels: &s.labels,
            body: std::borrow::Cow::Borrowed(body),
            // Curators see every card: statistics over all of them.
            open: true,
        });
    let fail = |e: mop_search::SearchError| StoreError::Index(format!("build failed: {e}"));
    build_index(dir.path(), docs).map_err(fail)?;
    let index = SearchIndex::open(dir.path()).map_err(fail)?;
    let mut all = VisibleSet::empty(cards.len());
    for ord in 0..cards.len() {
        all.insert(ord as u32);
    }
    Ok(WorkspaceIndex {
        revision,
        all: Arc::new(all),
        nearest: Mutex::default(),
        archived: cards.iter().map(|(_, _, archived)| *archived).collect(),
        cards: cards.into_iter().map(|(s, _, _)| s).collect(),
        index,
        _dir: dir,
    })
}

/// Makes `dir` (and what is missing above it) readable by the server's user alone: the
/// indexes hold card text, whatever the umask.
fn owner_only_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
