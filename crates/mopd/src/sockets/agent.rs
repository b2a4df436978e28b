//! A task's agent socket: what an agent inside the sandbox can ask (through
//! `mop memory …`). Every answer stays within the task's scope: the same hard exclusions
//! as its view (another user's, another asset's, another author's unverified cards do
//! not exist here — a foreign id is "not found", like a missing one), over the
//! generation the task's view was built from. Stores go to the server with the task's
//! provenance, which the agent cannot choose.
//!
//! The socket lives in `<runtime_dir>/t/<task>/`; the sandbox binds that directory, so
//! after a daemon restart the socket is simply created again in the same place. It takes
//! connections from the task owner's uid only (the sandboxed agent runs as its runner), and
//! at most `sockets.agent_max_connections` of them: an agent that opens thousands only
//! closes its own idle ones.
//!
//! A store the server cannot take now is queued on the host ([`crate::spool`]) and
//! answered `queued` with its id, which `GET /v1/stores/{id}` follows.
//!
//! Must not decide what a task may see: the catalog's visibility rules do.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use mop_cards::{CardId, CardLine};
use mop_proto::receipts::{Activity, GetEvent, RetrieveEvent, StoreEvent};
use mop_proto::sync::{
    CredentialFinding, StoreOutcome, StoreProvenance, StoreRequest, StoreResponse,
    credential_refusal, store_errors,
};
use mop_proto::{AgentCard, AgentStoreRequest, ListResponse, RetrieveRequest, RetrieveResponse};
use tokio::net::UnixListener;

use super::{Admit, CheckedListener, error, error_with_code, guarded, json_required};
use crate::client::ClientError;
use crate::files::make_dir;
use crate::paths::AGENT_SOCKET;
use crate::spool::{Queued, SpoolError};
use crate::tasks::{AgentSockets, Task, Tasks};

/// Opens and serves the agent sockets of tasks.
#[derive(Clone)]
pub struct AgentServer {
    tasks: Arc<Tasks>,
}

impl AgentServer {
    /// Serves the sockets of `tasks`' tasks.
    pub fn new(tasks: Arc<Tasks>) -> AgentServer {
        AgentServer { tasks }
    }
}

impl AgentSockets for AgentServer {
    fn open(&self, task: Arc<Task>) -> std::io::Result<()> {
        let lease = task.lease();
        make_dir(&lease.socket_dir)?;
        let path = lease.socket_dir.join(AGENT_SOCKET);
        let _ = std::fs::remove_file(&path);
        let listener =
            CheckedListener::new(UnixListener::bind(&path)?, Admit::Owner(lease.owner_uid));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))?;
        let limits = self.tasks.state().config().socket_limits(true);
        let mut stop = task.stopped();
        let app = guarded(
            Router::new()
                .route("/v1/cards", get(list))
                .route("/v1/cards/{id}", get(card))
                .route("/v1/retrieve", post(retrieve))
                .route("/v1/store", post(store))
                .route("/v1/stores/{id}", get(store_status))
                .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") }),
        )
        .with_state(AgentState {
            tasks: self.tasks.clone(),
            task,
            quota_reached: Arc::default(),
        });
        tokio::spawn(mop_serve::serve(listener, app, limits, async move {
            let _ = stop.wait_for(|s| *s).await;
        }));
        Ok(())
    }
}

#[derive(Clone)]
struct AgentState {
    tasks: Arc<Tasks>,
    task: Arc<Task>,
    /// The server said this task made the most stores one task may make: later stores
    /// are refused here, so the task cannot spend the host's store budget that other
    /// tasks need.
    quota_reached: Arc<std::sync::atomic::AtomicBool>,
}

impl AgentState {
    /// Adds what the agent did to its task's receipt.
    fn record(&self, f: impl FnOnce(&mut Activity)) {
        let lease = self.task.lease();
        self.tasks
            .receipts()
            .record(&lease.task.task_id, lease.created_at, f);
    }

    fn record_get(&self, id: CardId, found: bool) {
        self.record(|a| {
            let event = GetEvent {
                at: jiff::Timestamp::now(),
                id,
                found,
            };
            Activity::push(&mut a.gets, &mut a.unlisted, event)
        });
    }

    fn record_store(&self, event: StoreEvent) {
        self.record(|a| Activity::push(&mut a.stores, &mut a.unlisted, event));
    }
}

async fn list(State(s): State<AgentState>) -> Response {
    let loaded = match s.tasks.loaded_for(&s.task).await {
        Ok(l) => l,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let lease = s.task.lease();
    let visible = loaded.catalog.visible_set(&lease.task).len();
    let cards = lease
        .cards
        .iter()
        .filter_map(|c| {
            let line = loaded.catalog.card(loaded.catalog.ord_of(&c.id)?);
            Some(agent_card(line, Some(c.path.clone()), None))
        })
        .collect();
    Json(ListResponse { cards, visible }).into_response()
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
        mounted_at,
        score,
    }
}

async fn card(State(s): State<AgentState>, UrlPath(id): UrlPath<String>) -> Response {
    let Ok(id) = CardId::parse(&id) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "{:?} is not a card id (a UUID)",
                id.chars().take(80).collect::<String>()
            ),
        );
    };
    let loaded = match s.tasks.loaded_for(&s.task).await {
        Ok(l) => l,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let lease = s.task.lease();
    // Outside the task's scope looks exactly like missing.
    let not_found = || {
        s.record_get(id, false);
        error(StatusCode::NOT_FOUND, format!("card {id} not found"))
    };
    let Some(ord) = loaded.catalog.ord_of(&id) else {
        return not_found();
    };
    if !loaded.catalog.is_visible(ord, &lease.task) {
        return not_found();
    }
    let rel = loaded.catalog.card(ord).path();
    match std::fs::read(loaded.tree.join(rel)) {
        Ok(bytes) => {
            s.record_get(id, true);
            let mut r = Response::new(axum::body::Body::from(bytes));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/markdown; charset=utf-8"),
            );
            r
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("card {id} unreadable: {e}"),
        ),
    }
}

async fn retrieve(State(s): State<AgentState>, body: Bytes) -> Response {
    let req: RetrieveRequest = match json_required(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if req.query.trim().is_empty() || req.query.len() > 4096 {
        return error(
            StatusCode::BAD_REQUEST,
            "query must be 1 to 4096 bytes of text",
        );
    }
    let limit = req.limit.unwrap_or(10).clamp(1, 50);
    let loaded = match s.tasks.loaded_for(&s.task).await {
        Ok(l) => l,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let lease = s.task.lease();
    let visible = loaded.catalog.visible_set(&lease.task);
    let searched = visible.len();
    // One order everywhere (OKF.md, as MEMORY.md lists them): every verified match first,
    // then the unverified ones. Each half is searched on its own, so a handful of
    // unverified near-duplicates cannot push a verified card out of the limit.
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
    let mut hits = match loaded.index.search(&req.query, limit, Arc::new(verified)) {
        Ok(h) => h,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if hits.len() < limit {
        match loaded
            .index
            .search(&req.query, limit - hits.len(), Arc::new(unverified))
        {
            Ok(h) => hits.extend(h),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
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
    let query_hash = s.tasks.receipts().query_hash(&req.query);
    let hit_ids = hits.iter().map(|h| h.id).collect();
    s.record(|a| {
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
    Json(RetrieveResponse {
        hits,
        searched,
        mounted,
        coverage,
    })
    .into_response()
}

async fn store(State(s): State<AgentState>, body: Bytes) -> Response {
    let req: AgentStoreRequest = match json_required(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let lease = s.task.lease();
    let refused = |status: StatusCode, code: &str, message: String| {
        s.record_store(StoreEvent {
            at: jiff::Timestamp::now(),
            outcome: "refused".into(),
            id: None,
            status: Some(status.as_u16()),
            store_id: None,
            code: Some(code.to_owned()),
        });
        error_with_code(status, code, message)
    };
    let provenance = StoreProvenance {
        task_id: lease.task.task_id.clone(),
        user_id: lease.task.origin_user_id.clone(),
        asset_id: lease.task.asset_id.clone(),
    };
    // A task without a user is refused now rather than storing into the void: nobody
    // could see the card until a person verified it (OKF.md "Tiers").
    if let Err(e) = provenance.permits(&req.card.scope) {
        return refused(
            StatusCode::FORBIDDEN,
            store_errors::FORBIDDEN,
            e.to_string(),
        );
    }
    if s.quota_reached.load(std::sync::atomic::Ordering::Relaxed) {
        return refused(
            StatusCode::TOO_MANY_REQUESTS,
            store_errors::QUOTA,
            format!(
                "task {} has made the most stores one task may make (the card server said so; limits.stores_per_task); \
                 nothing was stored. Fold what is left into fewer, fuller cards",
                lease.task.task_id
            ),
        );
    }
    let ws = lease.task.workspace.clone();
    let store_id = uuid::Uuid::new_v4().to_string();
    let request = StoreRequest {
        provenance,
        card: req.card,
    };
    let spool = s.tasks.spool().clone();
    // Stores of a workspace reach the server in the order agents made them: while earlier
    // ones wait, a new one waits behind them.
    if spool.has_waiting(&ws) {
        spool.wake();
        return queue(
            &s,
            &lease,
            request,
            store_id,
            "stores queued before it still wait for the server",
        )
        .await;
    }
    let client = s.tasks.state().client();
    match client.store(&ws, &request, &store_id).await {
        Ok(mut r) => {
            r.store_id = Some(store_id.clone());
            tracing::info!(task = %lease.task.task_id, card = ?r.id, outcome = r.outcome.word(), "memory stored for a task");
            s.record_store(StoreEvent {
                at: jiff::Timestamp::now(),
                outcome: r.outcome.word().into(),
                id: r.id,
                status: None,
                store_id: Some(store_id),
                code: None,
            });
            Json(r).into_response()
        }
        Err(e) if e.is_transient() => {
            tracing::warn!(task = %lease.task.task_id, store = %store_id, error = %e, "the server cannot take a store now; queued on this host");
            queue(&s, &lease, request, store_id, &e.to_string()).await
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
                s.quota_reached
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            refused(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                &code,
                message,
            )
        }
        Err(e) => unreachable!("every other error is transient: {e}"),
    }
}

/// Keeps a store on the host for the server, on disk before the agent hears `queued`.
async fn queue(
    s: &AgentState,
    lease: &crate::tasks::Lease,
    request: StoreRequest,
    store_id: String,
    why: &str,
) -> Response {
    // Before a store is kept on this host's disk, it is screened as the server screens it:
    // a credential is refused now (the same answer the server gives) instead of waiting in
    // the queue in the clear.
    let fields = request.card.text_fields();
    let findings: Vec<CredentialFinding> = mop_intake::secrets::Screen::builtin()
        .scan_fields(fields.iter().map(|(name, text)| (*name, text.as_str())))
        .into_iter()
        .map(|f| CredentialFinding {
            kind: f.kind,
            field: f.field,
            line: f.line,
            column: f.column,
        })
        .collect();
    if !findings.is_empty() {
        s.record_store(StoreEvent {
            at: jiff::Timestamp::now(),
            outcome: "refused".into(),
            id: None,
            status: Some(422),
            store_id: None,
            code: Some(store_errors::CREDENTIAL.into()),
        });
        return error_with_code(
            StatusCode::UNPROCESSABLE_ENTITY,
            store_errors::CREDENTIAL,
            credential_refusal("the card", &findings),
        );
    }
    let queued = Queued {
        store_id: store_id.clone(),
        workspace: lease.task.workspace.clone(),
        task_id: lease.task.task_id.clone(),
        prepared_at: lease.created_at,
        queued_at: jiff::Timestamp::now(),
        request,
    };
    let spool = s.tasks.spool().clone();
    let limits = s.tasks.state().config().spool.clone();
    let kept = tokio::task::spawn_blocking(move || spool.enqueue(&queued, &limits)).await;
    let event = |outcome: &str, status: Option<u16>, code: Option<&str>| StoreEvent {
        at: jiff::Timestamp::now(),
        outcome: outcome.into(),
        id: None,
        status,
        store_id: Some(store_id.clone()),
        code: code.map(str::to_owned),
    };
    match kept {
        Ok(Ok(())) => {
            s.record_store(event("queued", None, None));
            tracing::info!(task = %lease.task.task_id, store = %store_id, "store queued on this host");
            let answer = StoreResponse {
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
            };
            (StatusCode::ACCEPTED, Json(answer)).into_response()
        }
        Ok(Err(SpoolError::Full(message))) => {
            s.record_store(event("refused", Some(503), Some("queue_full")));
            error_with_code(StatusCode::SERVICE_UNAVAILABLE, "queue_full", message)
        }
        Ok(Err(e)) => {
            tracing::error!(task = %lease.task.task_id, error = %e, "cannot queue a store");
            s.record_store(event("failed", Some(503), None));
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the card server cannot take the card now and this host could not keep it ({e}); nothing was stored: try again later"
                ),
            )
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /v1/stores/{id}`: where one of this task's queued stores stands.
async fn store_status(State(s): State<AgentState>, UrlPath(id): UrlPath<String>) -> Response {
    let lease = s.task.lease();
    let spool = s.tasks.spool().clone();
    let task = lease.task.task_id.clone();
    let found =
        tokio::task::spawn_blocking(move || spool.status(&id, &task, lease.created_at)).await;
    match found {
        Ok(Some(status)) => Json(status).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "no queued store of this task has that id (a store answered at once was final: its answer said what happened)",
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
