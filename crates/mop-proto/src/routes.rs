//! Every HTTP path of mop, written once. A [`Route`] is the template a server routes
//! (`/v1/workspaces/{ws}/manifest`, axum's syntax) and the builder its clients fill
//! (`MANIFEST.path(&[ws])`), so a server and its clients cannot drift apart.
//!
//! Three APIs: [`server`] (mop-server, reached by mopd, `mop-curate` and the console's
//! tests), [`control`] (mopd's control socket, reached by `mop` and `mopd status`) and
//! [`agent`] (a task's agent socket, reached by `mop memory` and `mop mcp`).

/// One path template with `{name}` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route(&'static str);

impl Route {
    /// The template, for a router.
    pub const fn template(self) -> &'static str {
        self.0
    }

    /// The path with each `{name}` replaced, in order, by one of `args`. Callers pass ids
    /// that are already checked (workspace and task slugs, card UUIDs, sha256 hex), which
    /// need no escaping.
    ///
    /// # Panics
    /// When `args` has not exactly one value per parameter: a mistake in the caller's code.
    pub fn path(self, args: &[&str]) -> String {
        let mut out = String::with_capacity(self.0.len() + 64);
        let mut rest = self.0;
        let mut args = args.iter();
        while let Some(open) = rest.find('{') {
            let close = rest[open..].find('}').expect("a route's `{` is closed") + open;
            out.push_str(&rest[..open]);
            out.push_str(
                args.next()
                    .unwrap_or_else(|| panic!("{}: too few arguments", self.0)),
            );
            rest = &rest[close + 1..];
        }
        assert!(args.next().is_none(), "{}: too many arguments", self.0);
        out.push_str(rest);
        out
    }
}

/// Prometheus metrics, on mop-server and on mopd's metrics listener.
pub const METRICS: Route = Route("/metrics");

/// mop-server's HTTP API.
pub mod server {
    use super::Route;

    /// Liveness (and the server's identity for `mopd status`).
    pub const HEALTH: Route = Route("/v1/health");
    /// Liveness, the name load balancers expect.
    pub const HEALTHZ: Route = Route("/healthz");
    /// Readiness: the database answers.
    pub const READYZ: Route = Route("/readyz");
    /// A workspace's manifest (full, or a delta with `?since=`).
    pub const MANIFEST: Route = Route("/v1/workspaces/{ws}/manifest");
    /// One object by its sha256.
    pub const OBJECT: Route = Route("/v1/workspaces/{ws}/objects/{sha256}");
    /// Many objects in one answer.
    pub const OBJECTS_BATCH: Route = Route("/v1/workspaces/{ws}/objects/batch");
    /// An agent's store, forwarded by mopd.
    pub const MEMORIES: Route = Route("/v1/workspaces/{ws}/memories");
    /// Task receipts, reported by mopd.
    pub const RECEIPTS: Route = Route("/v1/workspaces/{ws}/receipts");
    /// Cards: create (POST) and list (GET).
    pub const CARDS: Route = Route("/v1/workspaces/{ws}/cards");
    /// The review queue.
    pub const REVIEW: Route = Route("/v1/workspaces/{ws}/review");
    /// Curation search.
    pub const SEARCH: Route = Route("/v1/workspaces/{ws}/search");
    /// Cards not used for a while.
    pub const STALE: Route = Route("/v1/workspaces/{ws}/stale");
    /// Cards whose text carries a credential.
    pub const CREDENTIALS: Route = Route("/v1/workspaces/{ws}/credentials");
    /// Rejection tombstones.
    pub const REJECTIONS: Route = Route("/v1/workspaces/{ws}/rejections");
    /// Lifting one tombstone.
    pub const REJECTION_LIFT: Route = Route("/v1/workspaces/{ws}/rejections/{id}/lift");
    /// One card: read, update, hard delete.
    pub const CARD: Route = Route("/v1/workspaces/{ws}/cards/{id}");
    /// One card's curation details.
    pub const CARD_DETAILS: Route = Route("/v1/workspaces/{ws}/cards/{id}/details");
    /// One card's history.
    pub const CARD_HISTORY: Route = Route("/v1/workspaces/{ws}/cards/{id}/history");
    /// A state change of one card (`verify`, `reject`, `archive`, `merge`, …).
    pub const CARD_ACTION: Route = Route("/v1/workspaces/{ws}/cards/{id}/{action}");
    /// A duplicate group's waiting cards, as one review entry.
    pub const GROUP: Route = Route("/v1/workspaces/{ws}/groups/{group}");
    /// A duplicate group made one card.
    pub const GROUP_COMBINE: Route = Route("/v1/workspaces/{ws}/groups/{group}/combine");
    /// One action on every card a filter matches: a preview, then the action.
    pub const BULK: Route = Route("/v1/workspaces/{ws}/bulk");
    /// Memory files (OKF cards, `CLAUDE.md`, `AGENTS.md`, agents' memory directories)
    /// imported as cards, or a dry run of it.
    pub const IMPORT: Route = Route("/v1/workspaces/{ws}/import");
    /// The cards a listing's filters match, as a gzipped tarball of OKF files.
    pub const EXPORT: Route = Route("/v1/workspaces/{ws}/export");
    /// A workspace's history.
    pub const WORKSPACE_HISTORY: Route = Route("/v1/workspaces/{ws}/history");
    /// Publishing the usage counters as a revision.
    pub const COUNTERS_PUBLISH: Route = Route("/v1/workspaces/{ws}/counters/publish");
}

/// mopd's control socket.
pub mod control {
    use super::Route;

    /// The status report.
    pub const STATUS: Route = Route("/v1/status");
    /// Sync one workspace now.
    pub const SYNC: Route = Route("/v1/workspaces/{ws}/sync");
    /// Accept a workspace's new epoch.
    pub const ACK_EPOCH: Route = Route("/v1/workspaces/{ws}/ack-epoch");
    /// Verify (and repair) one workspace's pool.
    pub const VERIFY: Route = Route("/v1/workspaces/{ws}/verify");
    /// Prepare a task (POST) and list them (GET).
    pub const TASKS: Route = Route("/v1/tasks");
    /// Release a task.
    pub const TASK: Route = Route("/v1/tasks/{id}");
    /// Renew a task's lease.
    pub const TASK_RENEW: Route = Route("/v1/tasks/{id}/renew");
    /// A task's receipt.
    pub const TASK_RECEIPT: Route = Route("/v1/tasks/{id}/receipt");
    /// How a task ended, and what `mop run` captured at its end.
    pub const TASK_FINISH: Route = Route("/v1/tasks/{id}/finish");
}

/// A task's agent socket.
pub mod agent {
    use super::Route;

    /// The task's cards.
    pub const CARDS: Route = Route("/v1/cards");
    /// One card's text.
    pub const CARD: Route = Route("/v1/cards/{id}");
    /// Retrieval over the task's cards.
    pub const RETRIEVE: Route = Route("/v1/retrieve");
    /// A store.
    pub const STORE: Route = Route("/v1/store");
    /// The agent's word on a card.
    pub const FEEDBACK: Route = Route("/v1/feedback");
    /// What became of a queued store.
    pub const STORE_STATUS: Route = Route("/v1/stores/{id}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_fills_its_parameters_in_order() {
        assert_eq!(
            server::CARD_ACTION.path(&["team", "abc", "verify"]),
            "/v1/workspaces/team/cards/abc/verify"
        );
        assert_eq!(control::STATUS.path(&[]), "/v1/status");
    }

    #[test]
    #[should_panic(expected = "too few arguments")]
    fn a_missing_argument_is_a_bug() {
        server::MANIFEST.path(&[]);
    }

    #[test]
    #[should_panic(expected = "too many arguments")]
    fn an_extra_argument_is_a_bug() {
        control::TASKS.path(&["x"]);
    }
}
