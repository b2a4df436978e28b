//! The daemon's Prometheus metrics (OpenMetrics text), served by `sockets::metrics` only
//! when `[metrics]` names a loopback port or a Unix socket: syncs by result and failures by kind per workspace,
//! generation build time, pool bytes per workspace, live tasks, prepare latency, and the
//! queue of agents' stores waiting for the server.
//!
//! Workspace names are labels (they are in the config, not secrets); no task id, user,
//! card or query ever is.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    workspace: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkspaceLabels {
    workspace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    syncs: Family<SyncLabels, Counter>,
    pool_bytes: Family<WorkspaceLabels, Gauge>,
    build: Histogram,
    prepare: Histogram,
    live_tasks: Gauge,
    store_replays: Family<ResultLabels, Counter>,
    queued_stores: Gauge,
    queued_bytes: Gauge,
    oldest_queued: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("mopd");
        let syncs = Family::<SyncLabels, Counter>::default();
        registry.register(
            "syncs",
            "Polls of the server by workspace and result: not_modified, modified, or the failure's kind",
            syncs.clone(),
        );
        let pool_bytes = Family::<WorkspaceLabels, Gauge>::default();
        registry.register(
            "pool_bytes",
            "Bytes a workspace's pool uses on disk",
            pool_bytes.clone(),
        );
        let build = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "generation_build_seconds",
            "Time to build and publish a generation (index, manifest, links)",
            build.clone(),
        );
        let prepare = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "prepare_seconds",
            "Time from a prepare request to its task's plan (selection, MEMORY.md, view)",
            prepare.clone(),
        );
        let live_tasks = Gauge::default();
        registry.register("live_tasks", "Tasks with a live view", live_tasks.clone());
        let store_replays = Family::<ResultLabels, Counter>::default();
        registry.register(
            "store_replays",
            "Tries to send a queued store, by result: the server's outcome (created, reinforced, …), refused, retry (the server could not take it yet) or dropped (past spool.max_age_secs)",
            store_replays.clone(),
        );
        let queued_stores = Gauge::default();
        registry.register(
            "queued_stores",
            "Agents' stores waiting on this host for the card server",
            queued_stores.clone(),
        );
        let queued_bytes = Gauge::default();
        registry.register(
            "queued_store_bytes",
            "Bytes the waiting stores take on disk",
            queued_bytes.clone(),
        );
        let oldest_queued = Gauge::default();
        registry.register(
            "oldest_queued_store_seconds",
            "Age of the oldest waiting store (0 when none waits)",
            oldest_queued.clone(),
        );
        Metrics {
            registry,
            syncs,
            pool_bytes,
            build,
            prepare,
            live_tasks,
            store_replays,
            queued_stores,
            queued_bytes,
            oldest_queued,
        }
    }

    /// Counts a try to send a queued store.
    pub fn store_replay(&self, result: &str) {
        self.store_replays
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Counts a poll: `not_modified`, `modified`, or a failure's kind (`unreachable`, …).
    pub fn sync(&self, workspace: &str, result: &str) {
        self.syncs
            .get_or_create(&SyncLabels {
                workspace: workspace.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Notes a workspace's pool size.
    pub fn pool_bytes(&self, workspace: &str, bytes: u64) {
        self.pool_bytes
            .get_or_create(&WorkspaceLabels {
                workspace: workspace.into(),
            })
            .set(bytes as i64);
    }

    /// Records a generation build's time.
    pub fn built(&self, took: Duration) {
        self.build.observe(took.as_secs_f64());
    }

    /// Records a prepare's time.
    pub fn prepared(&self, took: Duration) {
        self.prepare.observe(took.as_secs_f64());
    }

    /// The text exposition, with the live tasks and the store queue counted now.
    pub fn encode(&self, live_tasks: usize, queue: &mop_proto::status::SpoolInfo) -> String {
        self.live_tasks.set(live_tasks as i64);
        self.queued_stores.set(queue.queued as i64);
        self.queued_bytes.set(queue.bytes as i64);
        self.oldest_queued.set(queue.oldest_age_secs as i64);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
