//! The daemon's Prometheus metrics (OpenMetrics text), served by `sockets::metrics` only
//! when `[metrics]` names a loopback port or a Unix socket: syncs by result and failures by kind per workspace,
//! generation build time, pool bytes per workspace, live tasks, and prepare latency.
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

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    syncs: Family<SyncLabels, Counter>,
    pool_bytes: Family<WorkspaceLabels, Gauge>,
    build: Histogram,
    prepare: Histogram,
    live_tasks: Gauge,
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
        Metrics {
            registry,
            syncs,
            pool_bytes,
            build,
            prepare,
            live_tasks,
        }
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

    /// The text exposition, with the live tasks counted now.
    pub fn encode(&self, live_tasks: usize) -> String {
        self.live_tasks.set(live_tasks as i64);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
