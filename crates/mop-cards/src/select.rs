//! Tier selection and ranking (OKF.md "Tiers" and "Ranking").
//!
//! A [`Catalog`] is built once per generation from its full manifest: it sorts the cards by
//! id (a card's position is its *ordinal*, shared with the search index), precomputes each
//! card's canonical codes and decayed importance, and indexes cards by user, asset,
//! project, agent kind, code and tag so a task touches only the cards that can concern it. [`Catalog::select`] then applies
//! the hard exclusions, assigns tiers and match classes, and ranks with one strict key.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;

use jiff::Timestamp;

use crate::card::{CardSummary, CardType};
use crate::config::{Rules, SelectionConfig};
use crate::id::CardId;
use crate::lines::{CardLine, Lines};
use crate::task::{TaskContext, TaskQuery};
use crate::wire::Manifest;

/// The tier a selected card is reported in; on the wire `"L0"`, `"L1"` or `"L2"`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Tier {
    /// Workspace baseline.
    L0,
    /// The requester's own.
    L1,
    /// Targeted: asset-bound or matched.
    L2,
}

impl Tier {
    /// `"L0"`, `"L1"` or `"L2"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::L0 => "L0",
            Tier::L1 => "L1",
            Tier::L2 => "L2",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The first ranking key: why a card is in the selection, most specific first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MatchClass {
    /// A `human_correction` card, however it was selected.
    HumanCorrection,
    /// Bound to the requester (L1).
    Own,
    /// One of its error codes is in the task.
    ErrorCode,
    /// Bound to the task's asset.
    Asset,
    /// One of its stacks or labels is a task label or word.
    StackOrLabel,
    /// A BM25 hit for the task text.
    Text,
    /// An unverified card of the requester's own (agent-stored, not yet checked by a
    /// person), however it matched: after every verified match, never a baseline.
    Unverified,
    /// Workspace baseline with no match.
    Baseline,
}

/// Selected-card counts per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierCounts(pub [usize; 3]);

impl TierCounts {
    fn add(&mut self, tier: Tier) {
        self.0[tier as usize] += 1;
    }

    /// The count for one tier.
    pub fn get(&self, tier: Tier) -> usize {
        self.0[tier as usize]
    }

    /// The total.
    pub fn total(&self) -> usize {
        self.0.iter().sum()
    }
}

impl fmt::Display for TierCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L0 {}, L1 {}, L2 {}", self.0[0], self.0[1], self.0[2])
    }
}

/// A BM25 hit for the task text: a card ordinal and its score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextHit {
    /// The card's ordinal in the catalog.
    pub ord: u32,
    /// Its score: BM25's, or with the dense ranker on the two rankings' fused score
    /// (reciprocal rank fusion). Only comparable with scores of the same search.
    pub score: f32,
}

/// A set of card ordinals, as a bitset: the cards a task may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleSet {
    words: Vec<u64>,
}

impl VisibleSet {
    /// An empty set with room for ordinals below `len`.
    pub fn empty(len: usize) -> Self {
        VisibleSet {
            words: vec![0; len.div_ceil(64)],
        }
    }

    /// Adds an ordinal (below the `len` the set was made for).
    pub fn insert(&mut self, ord: u32) {
        self.words[ord as usize / 64] |= 1 << (ord % 64);
    }

    /// True when every ordinal of `other` is in this set.
    pub fn covers(&self, other: &VisibleSet) -> bool {
        other
            .words
            .iter()
            .enumerate()
            .all(|(i, w)| w & !self.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// The ordinals in this set and not in `other`, in order (`other` may be empty).
    pub fn without<'a>(&'a self, other: &'a VisibleSet) -> impl Iterator<Item = u32> + 'a {
        self.words.iter().enumerate().flat_map(move |(i, w)| {
            let mut left = w & !other.words.get(i).copied().unwrap_or(0);
            std::iter::from_fn(move || {
                (left != 0).then(|| {
                    let bit = left.trailing_zeros();
                    left &= left - 1;
                    (i * 64) as u32 + bit
                })
            })
        })
    }

    /// Whether the card with this ordinal is in the set.
    pub fn contains(&self, ord: u32) -> bool {
        self.words
            .get(ord as usize / 64)
            .is_some_and(|w| w & (1 << (ord % 64)) != 0)
    }

    /// How many cards are in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// True when no card is in the set.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }
}

/// Per-card values that do not depend on the task. User, asset, project, agent and author
/// names are interned to numbers (0 = none) so the hard exclusions are integer compares.
///
/// Every candidate of every task reads this record, so it holds only what the exclusions,
/// tiers and ranking compare (28 bytes); the rest is in [`Cold`].
#[derive(Debug, Clone)]
struct Precomputed {
    live: bool,
    unverified: bool,
    card_type: CardType,
    user: u32,
    asset: u32,
    project: u32,
    agent: u32,
    /// The author of an unverified card (0: none, so no task may see it).
    author: u32,
    /// The card's place among all cards by the task-independent ranking keys (importance,
    /// occurrence, last seen, id): what ranking compares after match class and text score.
    rank: u32,
}

/// Per-card values read only for the cards a task mounts or lists.
#[derive(Debug, Clone)]
struct Cold {
    importance: f64,
    occurrence: u64,
    last_seen: Option<Timestamp>,
    id: CardId,
    /// 0: the workspace's own; else 1 + its index in [`Catalog::sources`].
    from: u16,
}

/// A task's user, asset, project and agent as interned numbers; names no card mentions
/// get `NOBODY`, which equals no card's number.
#[derive(Debug, Clone, Copy)]
struct TaskScope {
    user: u32,
    asset: u32,
    project: u32,
    agent: u32,
}

const NOBODY: u32 = u32::MAX;

/// Per-task match flags of one card.
const SEEN: u8 = 1;
const CODE: u8 = 2;
const TAG: u8 = 4;
const TEXT: u8 = 8;

/// Why a manifest cannot become a catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// A delta manifest lists only changes; a catalog needs the whole workspace.
    #[error("a catalog needs a full manifest, not a delta")]
    Delta,
    /// The same id appears twice.
    #[error("card {0} appears twice in the manifest")]
    DuplicateId(CardId),
    /// A card names an inherited workspace the manifest does not list.
    #[error("card {0} comes from an inherited workspace the manifest does not list")]
    UnknownSource(CardId),
}

/// One generation's cards, indexed for selection.
#[derive(Debug, Clone)]
pub struct Catalog {
    epoch: String,
    revision: u64,
    generated_at: Timestamp,
    /// What listings show of each card; the manifest entries themselves are not kept.
    lines: Lines,
    /// The inherited workspaces cards come from, in the order the manifest names them.
    sources: Vec<String>,
    pre: Vec<Precomputed>,
    cold: Vec<Cold>,
    names: HashMap<String, u32>,
    by_user: HashMap<u32, Vec<u32>>,
    by_asset: HashMap<u32, Vec<u32>>,
    by_author: HashMap<u32, Vec<u32>>,
    /// Verified cards bound to a project or an agent kind and to no user or asset: a
    /// project's (or an agent's) shared cards, which no other list reaches.
    by_project: HashMap<u32, Vec<u32>>,
    by_agent: HashMap<u32, Vec<u32>>,
    by_code: HashMap<String, Vec<u32>>,
    by_tag: HashMap<String, Vec<u32>>,
    /// Workspace baseline cards (live, verified, of a baseline type), best first.
    baseline: Vec<u32>,
    open: VisibleSet,
}

impl Catalog {
    /// Indexes a full manifest. "Now" for importance decay is its `generated_at`.
    pub fn new(mut manifest: Manifest, rules: &Rules) -> Result<Catalog, CatalogError> {
        manifest.cards.sort_unstable_by_key(|e| e.summary.id);
        Catalog::of(&manifest, rules)
    }

    /// [`Catalog::new`] of a manifest the caller keeps (a daemon's current generation):
    /// the catalog copies what it keeps of each card. One whose cards are not sorted by
    /// id (a generation's always are) is sorted in a copy first.
    pub fn of(manifest: &Manifest, rules: &Rules) -> Result<Catalog, CatalogError> {
        if manifest.is_delta() {
            return Err(CatalogError::Delta);
        }
        if !manifest.cards.is_sorted_by_key(|e| e.summary.id) {
            return Catalog::new(manifest.clone(), rules);
        }
        let entries = &manifest.cards;
        if let Some(w) = entries
            .windows(2)
            .find(|w| w[0].summary.id == w[1].summary.id)
        {
            return Err(CatalogError::DuplicateId(w[0].summary.id));
        }
        let now = manifest.generated_at;
        if let Some(e) = entries.iter().find(|e| {
            e.inherited_from
                .as_ref()
                .is_some_and(|w| !manifest.inherited.iter().any(|i| i.workspace == *w))
        }) {
            return Err(CatalogError::UnknownSource(e.summary.id));
        }
        let mut cat = Catalog {
            epoch: manifest.epoch.clone(),
            revision: manifest.revision,
            generated_at: now,
            sources: manifest
                .inherited
                .iter()
                .map(|i| i.workspace.clone())
                .collect(),
            pre: Vec::with_capacity(entries.len()),
            cold: Vec::with_capacity(entries.len()),
            names: HashMap::new(),
            by_user: HashMap::new(),
            by_asset: HashMap::new(),
            by_author: HashMap::new(),
            by_project: HashMap::new(),
            by_agent: HashMap::new(),
            by_code: HashMap::new(),
            by_tag: HashMap::new(),
            baseline: Vec::new(),
            open: VisibleSet::empty(entries.len()),
            lines: Lines::with_capacity(entries.len()),
        };
        for (i, e) in entries.iter().enumerate() {
            let ord = i as u32;
            let s = &e.summary;
            let live = s.is_live();
            let last_seen = e.last_seen.or(s.created_at);
            let pre = Precomputed {
                live,
                card_type: s.card_type,
                user: cat.intern(s.scope.user_id.as_deref()),
                asset: cat.intern(s.scope.asset_id.as_deref()),
                project: cat.intern(s.scope.project_id.as_deref()),
                agent: cat.intern(s.scope.agent.as_deref()),
                author: cat.intern(s.restricted_to_author()),
                unverified: s.is_unverified(),
                rank: 0,
            };
            let from = e.inherited_from.as_ref().map_or(0, |w| {
                1 + cat.sources.iter().position(|s| s == w).unwrap_or(0) as u16
            });
            cat.cold.push(Cold {
                from,
                id: s.id,
                occurrence: e.occurrence,
                importance: effective_importance(s.importance, last_seen, now, &rules.config),
                last_seen,
            });
            if live {
                cat.index_live(ord, &pre, s, rules);
            }
            cat.pre.push(pre);
            cat.lines.push(e);
        }
        cat.lines.shrink();
        let mut by_rank: Vec<u32> = (0..cat.pre.len() as u32).collect();
        by_rank.sort_unstable_by(|a, b| {
            let (a, b) = (&cat.cold[*a as usize], &cat.cold[*b as usize]);
            b.importance
                .total_cmp(&a.importance)
                .then(b.occurrence.cmp(&a.occurrence))
                .then(b.last_seen.cmp(&a.last_seen))
                // The task's own workspace wins ties with an inherited one.
                .then(a.from.cmp(&b.from))
                .then(a.id.cmp(&b.id))
        });
        for (rank, ord) in by_rank.into_iter().enumerate() {
            cat.pre[ord as usize].rank = rank as u32;
        }
        // Best first, as a task with no other match would rank them (human corrections,
        // then the rest).
        let class = |o: &u32| cat.pre[*o as usize].card_type != CardType::HumanCorrection;
        cat.baseline
            .sort_unstable_by_key(|o| (class(o), cat.pre[*o as usize].rank));
        Ok(cat)
    }

    /// Puts a live card into the lists a task reaches cards through.
    fn index_live(&mut self, ord: u32, pre: &Precomputed, s: &CardSummary, rules: &Rules) {
        for (map, key) in [
            (&mut self.by_user, pre.user),
            (&mut self.by_asset, pre.asset),
            (&mut self.by_author, pre.author),
        ] {
            if key != 0 {
                map.entry(key).or_default().push(ord);
            }
        }
        // A project's or an agent's cards bound to a user, an asset or an author are
        // reached through those lists; the rest through these.
        if pre.user == 0 && pre.asset == 0 && pre.author == 0 {
            for (map, key) in [
                (&mut self.by_project, pre.project),
                (&mut self.by_agent, pre.agent),
            ] {
                if key != 0 {
                    map.entry(key).or_default().push(ord);
                }
            }
        }
        if s.is_open() {
            self.open.insert(ord);
        }
        for code in &s.error_codes {
            push_unique(
                self.by_code.entry(rules.codes.normalize(code)).or_default(),
                ord,
            );
        }
        for tag in s.stacks.iter().chain(&s.labels) {
            push_unique(self.by_tag.entry(tag.clone()).or_default(), ord);
        }
        if s.scope.is_workspace() && s.card_type.is_baseline() && !pre.unverified {
            self.baseline.push(ord);
        }
    }

    fn intern(&mut self, name: Option<&str>) -> u32 {
        let Some(name) = name else { return 0 };
        let next = self.names.len() as u32 + 1;
        *self.names.entry(name.to_owned()).or_insert(next)
    }

    fn scope_of(&self, task: &TaskContext) -> TaskScope {
        let number = |name: Option<&String>| {
            name.and_then(|n| self.names.get(n.as_str()).copied())
                .unwrap_or(NOBODY)
        };
        TaskScope {
            user: number(task.origin_user_id.as_ref()),
            asset: number(task.asset_id.as_ref()),
            project: number(task.project_id.as_ref()),
            agent: number(task.agent.as_ref()),
        }
    }

    /// The inherited workspaces whose cards this catalog holds beside its own.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// The epoch of the manifest this catalog was built from.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The revision of the manifest this catalog was built from.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The manifest's `generated_at`: the "now" of importance decay.
    pub fn generated_at(&self) -> Timestamp {
        self.generated_at
    }

    /// What listings show of the card with this ordinal (ordinals follow the ids).
    pub fn card(&self, ord: u32) -> CardLine<'_> {
        let (p, c) = (&self.pre[ord as usize], &self.cold[ord as usize]);
        let (title, description, labels, sha256) = self.lines.get(ord as usize);
        CardLine {
            id: c.id,
            card_type: p.card_type,
            title,
            description,
            labels,
            occurrence: c.occurrence,
            last_seen: c.last_seen,
            unverified: p.unverified,
            sha256,
            from: c
                .from
                .checked_sub(1)
                .map(|i| self.sources[i as usize].as_str()),
        }
    }

    /// Every card, by ordinal.
    pub fn cards(&self) -> impl ExactSizeIterator<Item = CardLine<'_>> {
        (0..self.len() as u32).map(|ord| self.card(ord))
    }

    /// The ordinal of a card id.
    pub fn ord_of(&self, id: &CardId) -> Option<u32> {
        self.cold
            .binary_search_by(|c| c.id.cmp(id))
            .ok()
            .map(|i| i as u32)
    }

    /// Number of cards.
    pub fn len(&self) -> usize {
        self.pre.len()
    }

    /// True for an empty workspace.
    pub fn is_empty(&self) -> bool {
        self.pre.is_empty()
    }

    /// Whether a task may see a card at all: it is live, and no hard exclusion applies
    /// (bound to another user, asset, project or agent kind, or to any when the task has
    /// none, or an unverified card whose author is someone else).
    pub fn is_visible(&self, ord: u32, task: &TaskContext) -> bool {
        (ord as usize) < self.len() && self.visible_in(ord, self.scope_of(task))
    }

    fn visible_in(&self, ord: u32, scope: TaskScope) -> bool {
        let p = &self.pre[ord as usize];
        p.live
            && (p.user == 0 || p.user == scope.user)
            && (p.asset == 0 || p.asset == scope.asset)
            && (p.project == 0 || p.project == scope.project)
            && (p.agent == 0 || p.agent == scope.agent)
            // An unverified card reaches its author's tasks only; with no author, none.
            && (!p.unverified || (p.author != 0 && p.author == scope.user))
    }

    /// Every card the task may see; the search index filters text hits with it.
    pub fn visible_set(&self, task: &TaskContext) -> VisibleSet {
        let scope = self.scope_of(task);
        let mut set = self.open.clone();
        for ord in self.scoped_lists(scope).flatten() {
            if self.visible_in(*ord, scope) {
                set.insert(*ord);
            }
        }
        set
    }

    fn scoped_lists(&self, scope: TaskScope) -> impl Iterator<Item = &Vec<u32>> {
        [
            self.by_user.get(&scope.user),
            self.by_asset.get(&scope.asset),
            self.by_author.get(&scope.user),
            self.by_project.get(&scope.project),
            self.by_agent.get(&scope.agent),
        ]
        .into_iter()
        .flatten()
    }

    /// Selects and ranks the cards for a task. `hits` are the BM25 hits for the task text,
    /// best first, already limited to cards the task may see (they are checked again).
    pub fn select(
        &self,
        query: &TaskQuery<'_>,
        hits: &[TextHit],
        config: &SelectionConfig,
    ) -> Selection {
        let scope = self.scope_of(query.task);
        let text = self.qualified_hits(scope, hits, config);

        // Gather candidates with how each matched; a card may come from several lists.
        let mut flags = vec![0u8; self.len()];
        let mut candidates: Vec<u32> = Vec::new();
        let mut mark = |ord: u32, flag: u8| {
            let f = &mut flags[ord as usize];
            if *f == 0 {
                candidates.push(ord);
            }
            *f |= SEEN | flag;
        };
        for list in self.scoped_lists(scope) {
            list.iter().for_each(|o| mark(*o, 0));
        }
        for code in &query.codes {
            self.by_code
                .get(code)
                .into_iter()
                .flatten()
                .for_each(|o| mark(*o, CODE));
        }
        for word in &query.words {
            self.by_tag
                .get(word)
                .into_iter()
                .flatten()
                .for_each(|o| mark(*o, TAG));
        }
        text.iter().for_each(|h| mark(h.ord, TEXT));

        // Every candidate is counted in its tier; only the best `max_mounted` are kept, in
        // a heap whose top is the worst of them.
        let mut selected = TierCounts::default();
        let room = config
            .max_mounted
            .min(candidates.len() + self.baseline.len())
            .saturating_add(1);
        let mut best: BinaryHeap<RankKey> = BinaryHeap::with_capacity(room);
        for ord in candidates {
            let f = flags[ord as usize];
            let score = (f & TEXT != 0)
                .then(|| text.iter().find(|h| h.ord == ord).map_or(0.0, |h| h.score));
            let Some(key) = self.classify(ord, f, score, scope) else {
                continue;
            };
            selected.add(key.sel.tier);
            if best.len() < config.max_mounted {
                best.push(key);
            } else if best.peek().is_some_and(|worst| key < *worst) {
                best.pop();
                best.push(key);
            }
        }
        // The baseline cards nothing else matched: visible to every task, tier L0, and
        // ranked by keys that do not depend on the task, so `baseline` is in their order
        // and the walk stops at the first that would not be mounted.
        let unmatched = || self.baseline.iter().filter(|o| flags[**o as usize] == 0);
        selected.0[Tier::L0 as usize] += unmatched().count();
        for &ord in unmatched() {
            let key = self.classify(ord, 0, None, scope);
            debug_assert!(key.is_some(), "a baseline card is visible to every task");
            let Some(key) = key else { continue };
            if best.len() < config.max_mounted {
                best.push(key);
            } else if best.peek().is_some_and(|worst| key < *worst) {
                best.pop();
                best.push(key);
            } else {
                break;
            }
        }
        let picked = best.into_sorted_vec();
        let mut left_out = selected;
        for k in &picked {
            left_out.0[k.sel.tier as usize] -= 1;
        }
        Selection {
            cards: picked
                .into_iter()
                .map(|k| Selected {
                    importance: self.cold[k.sel.ord as usize].importance,
                    ..k.sel
                })
                .collect(),
            selected,
            left_out,
        }
    }

    /// The hits that may select by text: the first `text_candidates` visible ones scoring
    /// at least `min_text_ratio` of the best.
    fn qualified_hits(
        &self,
        scope: TaskScope,
        hits: &[TextHit],
        config: &SelectionConfig,
    ) -> Vec<TextHit> {
        let visible: Vec<TextHit> = hits
            .iter()
            .filter(|h| (h.ord as usize) < self.len() && self.visible_in(h.ord, scope))
            .take(config.text_candidates)
            .copied()
            .collect();
        let best = visible.iter().map(|h| h.score).fold(0.0f32, f32::max);
        visible
            .into_iter()
            .filter(|h| best > 0.0 && h.score >= best * config.min_text_ratio)
            .collect()
    }

    fn classify(
        &self,
        ord: u32,
        flags: u8,
        text_score: Option<f32>,
        scope: TaskScope,
    ) -> Option<RankKey> {
        if !self.visible_in(ord, scope) {
            return None;
        }
        // Only the compact precomputed record is read here: entries are large and cold.
        let p = &self.pre[ord as usize];
        // Visible and user-bound means bound to the requester; likewise for the asset.
        let own = p.user != 0;
        let asset = p.asset != 0;
        let code = flags & CODE != 0;
        let tag = flags & TAG != 0;
        let matched = code || tag || text_score.is_some();
        // Unverified cards are never baseline: only a person's verify makes them
        // workspace memory. A visible project's (or agent's) shared card of a baseline
        // type is that project's baseline, in L0 as a workspace card is.
        let baseline = !own && !asset && !p.unverified && p.card_type.is_baseline();
        if !(own || asset || matched || baseline) {
            return None;
        }
        let class = if p.unverified {
            MatchClass::Unverified
        } else if p.card_type == CardType::HumanCorrection {
            MatchClass::HumanCorrection
        } else if own {
            MatchClass::Own
        } else if code {
            MatchClass::ErrorCode
        } else if asset {
            MatchClass::Asset
        } else if tag {
            MatchClass::StackOrLabel
        } else if text_score.is_some() {
            MatchClass::Text
        } else {
            MatchClass::Baseline
        };
        let tier = if own {
            Tier::L1
        } else if asset || matched {
            Tier::L2
        } else {
            Tier::L0
        };
        Some(RankKey {
            sel: Selected {
                ord,
                tier,
                class,
                text_score: text_score.unwrap_or(0.0),
                // Filled in for the mounted cards only (ranking compares `rank`).
                importance: 0.0,
            },
            rank: p.rank,
        })
    }
}

/// A selected card with its ranking keys at hand, so comparing touches no other memory.
#[derive(Debug, Clone, Copy)]
struct RankKey {
    sel: Selected,
    /// [`Precomputed::rank`]: the keys after class and text score, in one number.
    rank: u32,
}

impl PartialEq for RankKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for RankKey {}
impl PartialOrd for RankKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for RankKey {
    /// The strict ranking order of OKF.md: `Less` ranks higher (class, then text score,
    /// then importance, occurrence, last seen and id, which `rank` holds).
    fn cmp(&self, b: &Self) -> Ordering {
        let a = self;
        a.sel
            .class
            .cmp(&b.sel.class)
            .then(b.sel.text_score.total_cmp(&a.sel.text_score))
            .then(a.rank.cmp(&b.rank))
    }
}

fn push_unique(list: &mut Vec<u32>, ord: u32) {
    if list.last() != Some(&ord) {
        list.push(ord);
    }
}

/// Importance after decay: untouched for `decay_grace_days` after `last_seen`, then halved
/// every `decay_half_life_days`, never below `decay_floor` (nor raised to it).
pub fn effective_importance(
    importance: f64,
    last_seen: Option<Timestamp>,
    now: Timestamp,
    config: &SelectionConfig,
) -> f64 {
    let Some(seen) = last_seen else {
        return importance;
    };
    let age_days = (now.as_millisecond() - seen.as_millisecond()) as f64 / 86_400_000.0;
    if age_days <= config.decay_grace_days {
        return importance;
    }
    let decayed = importance
        * 0.5f64.powf((age_days - config.decay_grace_days) / config.decay_half_life_days);
    decayed.max(config.decay_floor.min(importance))
}

/// One selected card with its ranking facts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selected {
    /// The card's ordinal in the catalog.
    pub ord: u32,
    /// The tier it is reported in.
    pub tier: Tier,
    /// Its match class (first ranking key).
    pub class: MatchClass,
    /// BM25 score, 0 when not a text hit.
    pub text_score: f32,
    /// Effective (decayed) importance.
    pub importance: f64,
}

/// The result of selection: the mounted cards in rank order, and counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// The first `max_mounted` selected cards, best first.
    pub cards: Vec<Selected>,
    /// All selected cards per tier, mounted or not.
    pub selected: TierCounts,
    /// Selected cards the mount cap left out, per tier.
    pub left_out: TierCounts,
}
