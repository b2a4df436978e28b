//! One workspace's sync driven against a stand-in card server (the `CardServer` seam):
//! each answer the protocol allows, and the ones it must refuse, with the pool, the
//! status and the replica bookkeeping checked after each poll.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use mop_cards::{Manifest, ManifestEntry};
use mop_proto::receipts::{ReceiptBatch, ReceiptBatchResponse};
use mop_proto::status::{ErrorKind, SyncResult, WorkspaceStatus};
use mop_proto::sync::{StoreRequest, StoreResponse, Version, encode_batch_item};
use parking_lot::Mutex;

use super::{MAX_BEHIND, Syncer};
use crate::client::{Answer, Body, CardServer, ClientError, ManifestFetch};
use crate::config::MopdConfig;
use crate::pool::Pool;
use crate::state::State;

const WS: &str = "acme";
const EPOCH: &str = "0b6c1f3e-8d7a-4f43-9c1e-1f2a3b4c5d6e";
const OTHER_EPOCH: &str = "5f0c8f0e-1c2d-4e3f-8a9b-0c1d2e3f4a5b";

/// A card server that answers from a script: the manifest answers in order, and objects
/// from what it holds (or, for a sha listed in `forged`, other bytes).
#[derive(Default)]
struct Scripted {
    manifests: Mutex<VecDeque<Result<ManifestFetch, ClientError>>>,
    objects: Mutex<HashMap<String, Vec<u8>>>,
    forged: Mutex<Vec<String>>,
    /// The held version each manifest request named.
    asked_with: Mutex<Vec<Option<Version>>>,
    /// Every object asked for, in order.
    fetched: Mutex<Vec<String>>,
    replicas: usize,
    current: AtomicUsize,
    distrusted: AtomicUsize,
}

impl Scripted {
    fn with_replicas(replicas: usize) -> Arc<Scripted> {
        Arc::new(Scripted {
            replicas,
            ..Default::default()
        })
    }

    /// Answers the next manifest request with `m`, and holds its cards' objects.
    fn answer(&self, m: Manifest, objects: &[(ManifestEntry, Vec<u8>)]) {
        let mut held = self.objects.lock();
        for (e, bytes) in objects {
            held.insert(e.sha256.clone(), bytes.clone());
        }
        self.manifests.lock().push_back(Ok(ManifestFetch::Manifest {
            manifest: Box::new(m),
            inherits: Vec::new(),
        }));
    }

    fn answer_with(&self, answer: Result<ManifestFetch, ClientError>) {
        self.manifests.lock().push_back(answer);
    }

    fn body_of(&self, sha: &str) -> Option<Vec<u8>> {
        let bytes = self.objects.lock().get(sha).cloned()?;
        if self.forged.lock().iter().any(|f| f == sha) {
            let mut forged = bytes;
            forged.extend_from_slice(b"\nInjected by a proxy.\n");
            return Some(forged);
        }
        Some(bytes)
    }
}

impl CardServer for Scripted {
    fn manifest<'a>(
        &'a self,
        _ws: &'a str,
        held: Option<&'a Version>,
    ) -> Answer<'a, ManifestFetch> {
        self.asked_with.lock().push(held.cloned());
        let next = self
            .manifests
            .lock()
            .pop_front()
            .expect("the script has an answer for every poll");
        Box::pin(std::future::ready(next))
    }

    fn object<'a>(&'a self, _ws: &'a str, sha256: &'a str) -> Answer<'a, Body> {
        self.fetched.lock().push(sha256.to_owned());
        let answer = match self.body_of(sha256) {
            Some(b) => Ok(Body::from_chunks(vec![Bytes::from(b)])),
            None => Err(ClientError::Status {
                status: 404,
                code: None,
                message: "no such object".into(),
                retry_after: None,
            }),
        };
        Box::pin(std::future::ready(answer))
    }

    fn object_batch<'a>(&'a self, _ws: &'a str, sha256: Vec<String>) -> Answer<'a, Body> {
        let mut out = Vec::new();
        for sha in &sha256 {
            self.fetched.lock().push(sha.clone());
            encode_batch_item(&mut out, sha, self.body_of(sha).as_deref());
        }
        Box::pin(std::future::ready(Ok(Body::from_chunks(vec![
            Bytes::from(out),
        ]))))
    }

    fn store<'a>(
        &'a self,
        _ws: &'a str,
        _req: &'a StoreRequest,
        _key: &'a str,
    ) -> Answer<'a, StoreResponse> {
        unreachable!("sync never stores")
    }

    fn report_receipts<'a>(
        &'a self,
        _ws: &'a str,
        _batch: &'a ReceiptBatch,
    ) -> Answer<'a, ReceiptBatchResponse> {
        unreachable!("sync never reports receipts")
    }

    fn answered_by(&self) -> String {
        format!("replica-{}", self.current.load(Ordering::Relaxed))
    }

    fn servers(&self) -> usize {
        self.replicas
    }

    fn distrust_last_answer(&self) {
        self.distrusted.fetch_add(1, Ordering::Relaxed);
        let next = (self.current.load(Ordering::Relaxed) + 1) % self.replicas;
        self.current.store(next, Ordering::Relaxed);
    }
}

/// A card and its file.
fn card(i: u32, body: &str) -> (ManifestEntry, Vec<u8>) {
    let raw = format!(
        "---\nid: 00000000-0000-4000-8000-{i:012}\ntype: fact\ntitle: Card {i}\n---\n{body}\n"
    );
    let parsed = mop_cards::parse_card(raw.as_bytes()).unwrap();
    (
        ManifestEntry::for_card(&parsed, raw.as_bytes()),
        raw.into_bytes(),
    )
}

fn manifest(epoch: &str, revision: u64, cards: &[(ManifestEntry, Vec<u8>)]) -> Manifest {
    Manifest {
        epoch: epoch.into(),
        revision,
        generated_at: "2026-12-01T00:00:00Z".parse().unwrap(),
        since: None,
        cards: cards.iter().map(|(e, _)| e.clone()).collect(),
        removed: vec![],
        inherited: Vec::new(),
    }
}

/// A daemon's state and one workspace's syncer in a temporary directory, against `server`.
struct World {
    _dir: tempfile::TempDir,
    syncer: Syncer,
}

impl World {
    fn new(server: Arc<Scripted>) -> World {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let config: MopdConfig = toml::from_str(&format!(
            "[server]\nurl = \"http://127.0.0.1:9\"\n[sync]\nworkspaces = [\"{WS}\"]\n\
             [paths]\ncache_dir = \"{d}/cache\"\nstate_dir = \"{d}/state\"\nruntime_dir = \"{d}/run\"\n"
        ))
        .unwrap();
        let state = Arc::new(State::new(config, server, dir.path().join("mopd.toml")));
        let pool = Pool::open(state.paths(), WS).unwrap();
        let status = Arc::new(Mutex::new(WorkspaceStatus {
            workspace: WS.into(),
            ..Default::default()
        }));
        World {
            _dir: dir,
            syncer: Syncer::new(WS.into(), pool, status, state),
        }
    }

    fn poll(&self) -> Result<SyncResult, super::Failure> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let publishing = self.syncer.publishing.lock().await;
            self.syncer.sync_once(&publishing).await
        })
    }

    /// The current generation's version and card ids (with their sha256).
    fn current(&self) -> Option<(Version, Vec<(String, String)>)> {
        let g = self.syncer.pool.current().unwrap()?;
        let mut cards: Vec<(String, String)> = g
            .manifest
            .cards
            .iter()
            .map(|c| (c.summary.id.to_string(), c.sha256.clone()))
            .collect();
        cards.sort();
        Some((Version::of(&g.manifest), cards))
    }

    fn status(&self) -> WorkspaceStatus {
        self.syncer.status.lock().clone()
    }
}

fn ids(cards: &[&(ManifestEntry, Vec<u8>)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = cards
        .iter()
        .map(|(e, _)| (e.summary.id.to_string(), e.sha256.clone()))
        .collect();
    v.sort();
    v
}

#[test]
fn a_full_manifest_publishes_and_an_unchanged_poll_costs_one_304() {
    let server = Scripted::with_replicas(1);
    let w = World::new(server.clone());
    let cards = [card(1, "One."), card(2, "Two."), card(3, "Three.")];
    server.answer(manifest(EPOCH, 1, &cards), &cards);
    assert_eq!(w.poll().unwrap(), SyncResult::Modified);
    let (version, held) = w.current().expect("a generation is current");
    assert_eq!(version.revision, 1);
    assert_eq!(held, ids(&cards.iter().collect::<Vec<_>>()));
    let s = w.status();
    assert_eq!(s.revision, Some(1));
    assert_eq!(s.cards, 3);
    let last = s.last_sync.unwrap();
    assert_eq!(
        (last.result, last.http_status),
        (SyncResult::Modified, Some(200))
    );
    assert_eq!(last.server.as_deref(), Some("replica-0"));

    server.answer_with(Ok(ManifestFetch::NotModified {
        inherits: Vec::new(),
    }));
    assert_eq!(w.poll().unwrap(), SyncResult::NotModified);
    // The second request named the held version (a conditional, delta-capable poll).
    assert_eq!(
        server.asked_with.lock().clone(),
        [None, Some(version.clone())]
    );
    assert_eq!(w.current().unwrap().0, version);
    let s = w.status();
    assert_eq!(s.stats.not_modified, 1);
    assert_eq!(s.last_sync.unwrap().http_status, Some(304));
    assert_eq!(server.distrusted.load(Ordering::Relaxed), 0);
}

#[test]
fn a_delta_fetches_only_what_changed_and_drops_what_left() {
    let server = Scripted::with_replicas(1);
    let w = World::new(server.clone());
    let first = [card(1, "One."), card(2, "Two."), card(3, "Three.")];
    server.answer(manifest(EPOCH, 1, &first), &first);
    let [a, _, c] = &first;
    w.poll().unwrap();
    server.fetched.lock().clear();

    let changed = [card(2, "Two, corrected.")];
    let b2 = &changed[0];
    let mut delta = manifest(EPOCH, 2, &changed);
    delta.since = Some(1);
    delta.removed = vec![c.0.summary.id];
    server.answer(delta, &changed);
    assert_eq!(w.poll().unwrap(), SyncResult::Modified);
    let (version, held) = w.current().unwrap();
    assert_eq!(version.revision, 2);
    assert_eq!(held, ids(&[a, b2]));
    assert_eq!(*server.fetched.lock(), vec![b2.0.sha256.clone()]);
}

#[test]
fn an_older_revision_from_the_only_server_is_a_refused_rollback() {
    let server = Scripted::with_replicas(1);
    let w = World::new(server.clone());
    let cards = [card(1, "One.")];
    server.answer(manifest(EPOCH, 5, &cards), &cards);
    w.poll().unwrap();
    let before = w.current().unwrap();

    let old = [card(1, "One, as it was.")];
    server.answer(manifest(EPOCH, 4, &old), &old);
    let f = w.poll().unwrap_err();
    assert_eq!(f.kind, ErrorKind::Rollback);
    assert_eq!(w.current().unwrap(), before, "the held generation stays");
    let s = w.status();
    assert_eq!(s.last_error.unwrap().kind, ErrorKind::Rollback);
    assert_eq!(s.consecutive_failures, 1);
}

#[test]
fn a_new_epoch_replaces_the_pool_and_says_so() {
    let server = Scripted::with_replicas(1);
    let w = World::new(server.clone());
    let cards = [card(1, "One.")];
    server.answer(manifest(EPOCH, 9, &cards), &cards);
    w.poll().unwrap();
    assert!(w.status().epoch_warning.is_none());

    let restored = [card(1, "One."), card(4, "Four.")];
    server.answer(manifest(OTHER_EPOCH, 2, &restored), &restored);
    assert_eq!(w.poll().unwrap(), SyncResult::Modified);
    let (version, held) = w.current().unwrap();
    assert_eq!((version.epoch.as_str(), version.revision), (OTHER_EPOCH, 2));
    assert_eq!(held.len(), 2);
    let warning = w.status().epoch_warning.expect("the new epoch is reported");
    assert!(
        warning.contains(EPOCH) && warning.contains(OTHER_EPOCH),
        "{warning}"
    );
}

#[test]
fn a_replica_that_is_behind_is_passed_over_until_a_streak_counts_as_rollback() {
    let server = Scripted::with_replicas(2);
    let w = World::new(server.clone());
    let cards = [card(1, "One.")];
    server.answer(manifest(EPOCH, 7, &cards), &cards);
    w.poll().unwrap();
    let before = w.current().unwrap();

    let old = [card(1, "One, as it was.")];
    for round in 1..=MAX_BEHIND {
        server.answer(manifest(EPOCH, 6, &old), &old);
        assert_eq!(w.poll().unwrap(), SyncResult::NotModified, "round {round}");
        assert_eq!(server.distrusted.load(Ordering::Relaxed), round as usize);
        assert_eq!(w.current().unwrap(), before);
    }
    assert_eq!(w.status().stats.behind_answers, u64::from(MAX_BEHIND));
    // One more in a row is no longer a replica catching up.
    server.answer(manifest(EPOCH, 6, &old), &old);
    assert_eq!(w.poll().unwrap_err().kind, ErrorKind::Rollback);
    assert_eq!(w.current().unwrap(), before);

    // A current answer ends the streak.
    server.answer_with(Ok(ManifestFetch::NotModified {
        inherits: Vec::new(),
    }));
    w.poll().unwrap();
    server.answer(manifest(EPOCH, 6, &old), &old);
    assert_eq!(
        w.poll().unwrap(),
        SyncResult::NotModified,
        "a new streak starts"
    );
}

#[test]
fn an_object_that_is_not_what_the_manifest_names_publishes_nothing() {
    let server = Scripted::with_replicas(2);
    let w = World::new(server.clone());
    let cards = [card(1, "One."), card(2, "Two.")];
    server.forged.lock().push(cards[1].0.sha256.clone());
    server.answer(manifest(EPOCH, 1, &cards), &cards);
    let f = w.poll().unwrap_err();
    assert_eq!(f.kind, ErrorKind::BadResponse, "{}", f.message);
    assert!(w.current().is_none(), "nothing is published");
    let gens = std::fs::read_dir(w.syncer.pool.paths().gens())
        .unwrap()
        .count();
    assert_eq!(gens, 0, "no half-built generation is left");
    // With replicas, the server that sent it is not asked first next time.
    assert_eq!(server.distrusted.load(Ordering::Relaxed), 1);

    // The control: the same manifest with honest objects publishes.
    server.forged.lock().clear();
    server.answer(manifest(EPOCH, 1, &cards), &cards);
    assert_eq!(w.poll().unwrap(), SyncResult::Modified);
    assert_eq!(
        w.current().unwrap().1,
        ids(&cards.iter().collect::<Vec<_>>())
    );
}

#[test]
fn an_unreachable_server_is_recorded_without_a_server_name() {
    let server = Scripted::with_replicas(2);
    let w = World::new(server.clone());
    server.answer_with(Err(ClientError::Unreachable("connection refused".into())));
    let f = w.poll().unwrap_err();
    assert_eq!(f.kind, ErrorKind::Unreachable);
    assert!(!f.reached);
    let s = w.status();
    assert_eq!(s.last_error.unwrap().kind, ErrorKind::Unreachable);
    assert!(s.last_reached.is_none());
    // Nobody answered, so no replica is distrusted.
    assert_eq!(server.distrusted.load(Ordering::Relaxed), 0);
}
