//! What a task's agent may ask of memory, decided in one place: which cards it may list,
//! read, retrieve and give its verdict on (the same hard exclusions as its view, over the generation the view
//! was built from: another user's, another asset's, another author's unverified cards do
//! not exist here, and a foreign id is "not found" like a missing one), and which stores
//! it may make (the task's provenance, which the agent cannot choose, under the store
//! rules of `mop_proto::sync::Provenance`; a store the server cannot take now waits
//! in the host's queue). What the agent did goes into the task's receipt.
//!
//! The agent socket (`sockets::agent`) only translates HTTP to these calls and their
//! answers back; `mop memory` and `mop mcp` are its clients.
//!
//! Must not decide what a task may see by itself: the catalog's visibility rules do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mop_cards::{CardId, CardLine};
use mop_proto::control::{FinishRequest, MAX_CAPTURED};
use mop_proto::error::codes;
use mop_proto::receipts::{
    Activity, FeedbackEvent, GetEvent, MAX_EVENTS, MAX_FEEDBACK_NOTE, MAX_NOTES_BYTES,
    RetrieveEvent, StoreEvent, StoreEventOutcome,
};
use mop_proto::sync::{
    CredentialFinding, StoreOutcome, StoreRequest, StoreResponse, credential_refusal, store_errors,
};
use mop_proto::{
    AgentCard, AgentStoreRequest, Binding, FeedbackRequest, FeedbackResponse, ListResponse,
    RetrieveRequest, RetrieveResponse, StoreStatus,
};

use crate::client::ClientError;
use crate::spool::{Queued, SpoolError};
use crate::tasks::{Lease, Task, Tasks};

/// Why an agent's request was not answered as asked: each kind with the HTTP status and
/// stable code its answer carries.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The request is malformed (400).
    #[error("{0}")]
    BadRequest(String),
    /// Nothing there, or nothing this task may see (404).
    #[error("{0}")]
    NotFound(String),
    /// Not now: the task's generation is not loaded, or the host cannot keep a store (503).
    #[error("{0}")]
    Unavailable(String),
    /// A fault of the daemon's (500).
    #[error("{0}")]
    Internal(String),
    /// A store refused, here or by the card server, with its code
    /// (`mop_proto::sync::store_errors`, or `queue_full`).
    #[error("{message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The stable code.
        code: String,
        /// What happened and what to do.
        message: String,
    },
}

impl AgentError {
    /// The HTTP status of its answer.
    pub fn status(&self) -> u16 {
        match self {
            AgentError::BadRequest(_) => 400,
            AgentError::NotFound(_) => 404,
            AgentError::Unavailable(_) => 503,
            AgentError::Internal(_) => 500,
            AgentError::Refused { status, .. } => *status,
        }
    }

    /// The stable code of its answer.
    pub fn code(&self) -> &str {
        match self {
            AgentError::Refused { code, .. } => code,
            other => codes::for_status(other.status()),
        }
    }
}

/// Credentials in `fields` (name, text), as the card server's screen finds them.
fn screen<'a>(fields: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<CredentialFinding> {
    mop_intake::secrets::Screen::builtin()
        .scan_fields(fields)
        .into_iter()
        .map(|f| CredentialFinding {
            kind: f.kind,
            field: f.field,
            line: f.line,
            column: f.column,
        })
        .collect()
}

/// The code of a store refused because the host's queue is full.
const QUEUE_FULL: &str = "queue_full";

/// One task's memory, as its agent reaches it.
pub struct TaskMemory {
    tasks: Arc<Tasks>,
    task: Arc<Task>,
    /// The server said this task made the most stores one task may make: later stores
    /// are refused here, so the task cannot spend the host's store budget that other
    /// tasks need.
    quota_reached: AtomicBool,
    /// Stores through this value are `mop run`'s captures at the task's end (marked so in
    /// the receipt), not the agent's own.
    captured: bool,
}

/// A card as `list` and `retrieve` show it: title and description with hidden characters
/// marked and no padding, so that neither can imitate the marks a listing adds.
fn agent_card(line: CardLine<'_>, mounted_at: Option<String>, score: Option<f32>) -> AgentCard {
    AgentCard {
        id: line.id,
        card_type: line.card_type,
        title: mop_cards::one_line_for_agent(line.title),
        description: line.description.map(mop_cards::one_line_for_agent),
        unverified: line.unverified,
        workspace: line.from.map(str::to_owned),
        mounted_at,
        score,
    }
}

impl TaskMemory {
    /// The memory of `task`.
    pub fn new(tasks: Arc<Tasks>, task: Arc<Task>) -> TaskMemory {
        TaskMemory {
            tasks,
            task,
            quota_reached: AtomicBool::new(false),
            captured: false,
        }
    }

    /// The memory of `task` as its runner's capture at the end stores into it.
    pub fn for_capture(tasks: Arc<Tasks>, task: Arc<Task>) -> TaskMemory {
        TaskMemory {
            captured: true,
            ..TaskMemory::new(tasks, task)
        }
    }

    /// Adds what the agent did to its task's receipt.
    fn record(&self, f: impl FnOnce(&mut Activity)) {
        let lease = self.task.lease();
        self.tasks
            .receipts()
            .record(&lease.task.task_id, lease.created_at, f);
    }

    fn record_store(&self, mut event: StoreEvent) {
        event.captured = self.captured;
        self.record(|a| Activity::push(&mut a.stores, &mut a.unlisted, event));
    }

    async fn loaded(&self) -> Result<Arc<crate::tasks::Loaded>, AgentError> {
        self.tasks
            .loaded_for(&self.task)
            .await
            .map_err(|e| AgentError::Unavailable(e.to_string()))
    }

    /// The task's mounted cards, and how many it may see in all.
    pub async fn list(&self) -> Result<ListResponse, AgentError> {
        let loaded = self.loaded().await?;
        let lease = self.task.lease();
        let visible = loaded.catalog.visible_set(&lease.task).len();
        let cards = lease
            .cards
            .iter()
            .filter_map(|c| {
                let line = loaded.catalog.card(loaded.catalog.ord_of(&c.id)?);
                Some(agent_card(line, Some(c.path.clone()), None))
            })
            .collect();
        Ok(ListResponse { cards, visible })
    }

    /// One card's file, if the task may see it.
    pub async fn card(&self, id: &str) -> Result<Vec<u8>, AgentError> {
        let Ok(id) = CardId::parse(id) else {
            return Err(AgentError::BadRequest(format!(
                "{:?} is not a card id (a UUID)",
                id.chars().take(80).collect::<String>()
            )));
        };
        let loaded = self.loaded().await?;
        let lease = self.task.lease();
        let record_get = |found: bool| {
            self.record(|a| {
                let event = GetEvent {
                    at: jiff::Timestamp::now(),
                    id,
                    found,
                };
                Activity::push(&mut a.gets, &mut a.unlisted, event)
            })
        };
        // Outside the task's scope looks exactly like missing.
        let Some(ord) = loaded
            .catalog
            .ord_of(&id)
            .filter(|ord| loaded.catalog.is_visible(*ord, &lease.task))
        else {
            record_get(false);
            return Err(AgentError::NotFound(format!("card {id} not found")));
        };
        let object = loaded.pool.object(loaded.catalog.card(ord).sha256);
        let bytes = std::fs::read(object)
            .map_err(|e| AgentError::Internal(format!("card {id} unreadable: {e}")))?;
        record_get(true);
        Ok(bytes)
    }

    /// The cards this task may see that best match `req.query`: every verified match
    /// first, then the unverified ones (as MEMORY.md lists them), with a coverage line.
    pub async fn retrieve(&self, req: RetrieveRequest) -> Result<RetrieveResponse, AgentError> {
        if req.query.trim().is_empty() || req.query.len() > 4096 {
            return Err(AgentError::BadRequest(
                "query must be 1 to 4096 bytes of text".into(),
            ));
        }
        let limit = req.limit.unwrap_or(10).clamp(1, 50);
        let loaded = self.loaded().await?;
        let lease = self.task.lease();
        let visible = loaded.catalog.visible_set(&lease.task);
        let searched = visible.len();
        // Each half is searched on its own, so a handful of unverified near-duplicates
        // cannot push a verified card out of the limit.
        let (mut verified, mut unverified) = (
            mop_cards::VisibleSet::empty(loaded.catalog.len()),
            mop_cards::VisibleSet::empty(loaded.catalog.len()),
        );
        for ord in visible.without(&mop_cards::VisibleSet::empty(0)) {
            if loaded.catalog.card(ord).unverified {
                unverified.insert(ord);
            } else {
                verified.insert(ord);
            }
        }
        let search = |limit: usize, set: mop_cards::VisibleSet| {
            loaded
                .index
                .search(&req.query, limit, Arc::new(set))
                .map_err(|e| AgentError::Internal(e.to_string()))
        };
        let mut hits = search(limit, verified)?;
        if hits.len() < limit {
            hits.extend(search(limit - hits.len(), unverified)?);
        }
        let hits: Vec<AgentCard> = hits
            .iter()
            .map(|h| {
                let line = loaded.catalog.card(h.ord);
                let mounted_at = lease
                    .cards
                    .iter()
                    .find(|c| c.id == line.id)
                    .map(|c| c.path.clone());
                agent_card(line, mounted_at, Some(h.score))
            })
            .collect();
        let query_hash = self.tasks.receipts().query_hash(&req.query);
        let hit_ids = hits.iter().map(|h| h.id).collect();
        self.record(|a| {
            let event = RetrieveEvent {
                at: jiff::Timestamp::now(),
                query_hash,
                hits: hit_ids,
            };
            Activity::push(&mut a.retrieves, &mut a.unlisted, event)
        });
        let mounted = lease.cards.len();
        let scope = format!(
            "the {searched} cards this task may see in workspace {} (revision {}); {mounted} of them are mounted in {}",
            lease.task.workspace, lease.revision, lease.profile.memory_dir
        );
        let coverage = if hits.is_empty() {
            format!(
                "No card matched. Searched {scope}. Try other words, or list what is mounted (memory_list, `mop memory list`)."
            )
        } else {
            format!(
                "Searched {scope}. Read a card in full before acting (memory_get, `mop memory get <id>`)."
            )
        };
        Ok(RetrieveResponse {
            hits,
            searched,
            mounted,
            coverage,
        })
    }

    /// A store from the agent: sent to the card server with the task's provenance, or
    /// kept in the host's queue when the server cannot take it now (outcome `queued`).
    pub async fn store(&self, req: AgentStoreRequest) -> Result<StoreResponse, AgentError> {
        let lease = self.task.lease();
        let refused = |status: u16, code: &str, message: String| {
            self.record_store(StoreEvent::refused(status, code));
            AgentError::Refused {
                status,
                code: code.to_owned(),
                message,
            }
        };
        let provenance = lease.task.provenance();
        // A task without a user is refused now rather than storing into the void: nobody
        // could see the card until a person verified it (OKF.md "Tiers").
        if let Err(e) = provenance.permits(&req.card.scope) {
            return Err(refused(403, store_errors::FORBIDDEN, e.to_string()));
        }
        if self.quota_reached.load(Ordering::Relaxed) {
            return Err(refused(
                429,
                store_errors::QUOTA,
                format!(
                    "task {} has made the most stores one task may make (the card server said so; limits.stores_per_task); \
                     nothing was stored. Fold what is left into fewer, fuller cards",
                    lease.task.task_id
                ),
            ));
        }
        let ws = lease.task.workspace.clone();
        let store_id = uuid::Uuid::new_v4().to_string();
        let request = StoreRequest {
            provenance,
            card: req.card,
        };
        let spool = self.tasks.spool().clone();
        // Stores of a workspace reach the server in the order agents made them: while
        // earlier ones wait, a new one waits behind them.
        if spool.has_waiting(&ws) {
            spool.wake();
            return self
                .queue(
                    &lease,
                    request,
                    store_id,
                    "stores queued before it still wait for the server",
                )
                .await;
        }
        let client = self.tasks.state().client();
        match client.store(&ws, &request, &store_id).await {
            Ok(mut r) => {
                r.store_id = Some(store_id.clone());
                tracing::info!(task = %lease.task.task_id, card = ?r.id, outcome = r.outcome.word(), "memory stored for a task");
                self.record_store(StoreEvent {
                    at: jiff::Timestamp::now(),
                    outcome: r.outcome.into(),
                    id: r.id,
                    status: None,
                    store_id: Some(store_id),
                    code: None,
                    captured: false,
                });
                Ok(r)
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(task = %lease.task.task_id, store = %store_id, error = %e, "the server cannot take a store now; queued on this host");
                self.queue(&lease, request, store_id, &e.to_string()).await
            }
            Err(ClientError::Status {
                status,
                code,
                message,
                ..
            }) => {
                // Counts and kinds only: never the card's text.
                tracing::info!(task = %lease.task.task_id, status, code = code.as_deref().unwrap_or("-"), "the server refused a store");
                let code = code.unwrap_or_else(|| "refused".into());
                if code == store_errors::QUOTA {
                    self.quota_reached.store(true, Ordering::Relaxed);
                }
                Err(refused(status, &code, message))
            }
            Err(e) => unreachable!("every other error is transient: {e}"),
        }
    }

    /// The agent's verdict on a card its task can see: kept in the task's receipt (one per
    /// card, the latest), reported with it, and counted by the server for curators. It
    /// never changes what any task is given.
    pub async fn feedback(&self, req: FeedbackRequest) -> Result<FeedbackResponse, AgentError> {
        let note = req
            .note
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty());
        if let Some(n) = &note {
            if n.chars().count() > MAX_FEEDBACK_NOTE
                || n.chars().any(|c| c.is_control() && c != '\n')
            {
                return Err(AgentError::BadRequest(format!(
                    "the note must be at most {MAX_FEEDBACK_NOTE} characters of text (no control characters but newlines); say what was wrong in a sentence"
                )));
            }
            let findings = screen(std::iter::once(("note", n.as_str())));
            if !findings.is_empty() {
                return Err(AgentError::Refused {
                    status: 422,
                    code: store_errors::CREDENTIAL.into(),
                    message: credential_refusal("the note", &findings),
                });
            }
        }
        let loaded = self.loaded().await?;
        let lease = self.task.lease();
        // Outside the task's scope looks exactly like missing, as for a get.
        if loaded
            .catalog
            .ord_of(&req.id)
            .is_none_or(|ord| !loaded.catalog.is_visible(ord, &lease.task))
        {
            return Err(AgentError::NotFound(format!("card {} not found", req.id)));
        }
        let mut event = FeedbackEvent {
            at: jiff::Timestamp::now(),
            id: req.id,
            verdict: req.verdict,
            note,
        };
        let mut replaced = false;
        let mut full = false;
        let mut unmet = false;
        let mut note_dropped = false;
        let given = lease.cards.iter().any(|c| c.id == req.id);
        self.record(|a| {
            // A verdict is on a card the agent relied on: one it was given or met.
            if !given && !a.met(&event.id) {
                unmet = true;
                return;
            }
            let others: usize = a
                .feedback
                .iter()
                .filter(|f| f.id != event.id)
                .filter_map(|f| f.note.as_ref())
                .map(String::len)
                .sum();
            if event
                .note
                .as_ref()
                .is_some_and(|n| others + n.len() > MAX_NOTES_BYTES)
            {
                event.note = None;
                note_dropped = true;
            }
            if let Some(old) = a.feedback.iter_mut().find(|f| f.id == event.id) {
                *old = event;
                replaced = true;
            } else if a.feedback.len() < MAX_EVENTS {
                a.feedback.push(event);
            } else {
                full = true;
            }
        });
        if unmet {
            return Err(AgentError::BadRequest(format!(
                "card {} was neither given to this task nor read by it: read it (memory_get) before you say whether it held",
                req.id
            )));
        }
        if full {
            return Err(AgentError::Refused {
                status: 429,
                code: store_errors::QUOTA.into(),
                message: format!(
                    "this task gave verdicts on {MAX_EVENTS} cards, the most one task may; nothing was recorded"
                ),
            });
        }
        tracing::info!(task = %lease.task.task_id, card = %req.id, verdict = req.verdict.as_str(), replaced, "feedback on a card");
        let kept = if note_dropped {
            format!(
                " Its note was not kept: this task's notes reached {MAX_NOTES_BYTES} bytes; keep the rest short."
            )
        } else {
            String::new()
        };
        Ok(FeedbackResponse {
            id: req.id,
            verdict: req.verdict,
            replaced,
            note: format!(
                "Recorded in this task's receipt. Curators see it with the card; it never changes what tasks are given.{kept}"
            ),
        })
    }

    /// `mop run`'s word at the task's end: how it ended, and the cards it captured, each
    /// stored as the agent's own stores are (this value is [`TaskMemory::for_capture`]).
    pub async fn finish(&self, req: FinishRequest) -> Vec<StoreEvent> {
        let lease = self.task.lease();
        let mut events = Vec::new();
        for c in req.cards.into_iter().take(MAX_CAPTURED) {
            let want = Binding {
                personal: c.personal,
                ..Binding::default()
            };
            let bound = AgentStoreRequest::bound(c.card, want, &lease.task.viewer());
            let refused = |status: u16, code: &str| StoreEvent {
                captured: true,
                ..StoreEvent::refused(status, code)
            };
            let event = match bound {
                Err(_) => {
                    let e = refused(403, store_errors::FORBIDDEN);
                    self.record_store(e.clone());
                    e
                }
                Ok(store) => match self.store(store).await {
                    Ok(r) => StoreEvent {
                        at: jiff::Timestamp::now(),
                        outcome: r.outcome.into(),
                        id: r.id,
                        status: None,
                        store_id: r.store_id,
                        code: None,
                        captured: true,
                    },
                    Err(e) => refused(e.status(), e.code()),
                },
            };
            events.push(event);
        }
        self.tasks
            .receipts()
            .update(&lease.task.task_id, lease.created_at, |r| {
                if req.outcome.is_some() {
                    r.outcome = req.outcome;
                }
                if req.exit_code.is_some() {
                    r.exit_code = req.exit_code;
                }
                if req.capture.is_some() {
                    r.capture = req.capture;
                }
            });
        tracing::info!(task = %lease.task.task_id, outcome = req.outcome.map_or("-", |o| o.as_str()), captured = events.len(), "task finished by its runner");
        events
    }

    /// Keeps a store on the host for the server, on disk before the agent hears `queued`.
    async fn queue(
        &self,
        lease: &Lease,
        request: StoreRequest,
        store_id: String,
        why: &str,
    ) -> Result<StoreResponse, AgentError> {
        // Before a store is kept on this host's disk, it is screened as the server screens
        // it: a credential is refused now (the same answer the server gives) instead of
        // waiting in the queue in the clear.
        let fields = request.card.text_fields();
        let findings = screen(fields.iter().map(|(name, text)| (*name, text.as_str())));
        if !findings.is_empty() {
            self.record_store(StoreEvent::refused(422, store_errors::CREDENTIAL));
            return Err(AgentError::Refused {
                status: 422,
                code: store_errors::CREDENTIAL.into(),
                message: credential_refusal("the card", &findings),
            });
        }
        let queued = Queued {
            store_id: store_id.clone(),
            workspace: lease.task.workspace.clone(),
            task_id: lease.task.task_id.clone(),
            prepared_at: lease.created_at,
            queued_at: jiff::Timestamp::now(),
            request,
        };
        let spool = self.tasks.spool().clone();
        let limits = self.tasks.state().config().spool.clone();
        let kept = tokio::task::spawn_blocking(move || spool.enqueue(&queued, &limits)).await;
        let event =
            |outcome: StoreEventOutcome, status: Option<u16>, code: Option<&str>| StoreEvent {
                at: jiff::Timestamp::now(),
                outcome,
                id: None,
                status,
                store_id: Some(store_id.clone()),
                code: code.map(str::to_owned),
                captured: false,
            };
        match kept {
            Ok(Ok(())) => {
                self.record_store(event(StoreEventOutcome::Queued, None, None));
                tracing::info!(task = %lease.task.task_id, store = %store_id, "store queued on this host");
                Ok(StoreResponse {
                    outcome: StoreOutcome::Queued,
                    id: None,
                    revision: 0,
                    audience: String::new(),
                    verified: None,
                    note: format!(
                        "Nothing is lost: this host keeps it on disk and sends it to the card server, once, when it can ({why}). \
                         Follow it with `mop memory store-status {store_id}`."
                    ),
                    store_id: Some(store_id.clone()),
                    previously_rejected: None,
                })
            }
            Ok(Err(SpoolError::Full(message))) => {
                self.record_store(event(
                    StoreEventOutcome::Refused,
                    Some(503),
                    Some(QUEUE_FULL),
                ));
                Err(AgentError::Refused {
                    status: 503,
                    code: QUEUE_FULL.into(),
                    message,
                })
            }
            Ok(Err(e)) => {
                tracing::error!(task = %lease.task.task_id, error = %e, "cannot queue a store");
                self.record_store(event(StoreEventOutcome::Failed, Some(503), None));
                Err(AgentError::Unavailable(format!(
                    "the card server cannot take the card now and this host could not keep it ({e}); nothing was stored: try again later"
                )))
            }
            Err(e) => Err(AgentError::Internal(e.to_string())),
        }
    }

    /// Where one of this task's queued stores stands.
    pub async fn store_status(&self, id: String) -> Result<StoreStatus, AgentError> {
        let lease = self.task.lease();
        let spool = self.tasks.spool().clone();
        let task = lease.task.task_id.clone();
        let found = tokio::task::spawn_blocking(move || spool.status(&id, &task, lease.created_at))
            .await
            .map_err(|e| AgentError::Internal(e.to_string()))?;
        found.ok_or_else(|| {
            AgentError::NotFound(
                "no queued store of this task has that id (a store answered at once was final: its answer said what happened)".into(),
            )
        })
    }
}
