//! Prometheus metrics, served at `/metrics` in the OpenMetrics text format: requests by
//! route and status with latency histograms, manifest answers by kind (the share of 304s
//! is `not_modified` over all of them), full manifest builds and their time, stores by
//! outcome, how much of the database is in use (store calls running off the async
//! workers, reader connections idle in the pool), and each workspace's review queue
//! (cards waiting, duplicate groups among them, the oldest one's age), read at each scrape.
//!
//! Labels are bounded: a route is its pattern (`/v1/workspaces/:ws/manifest`), never the
//! path a client sent, so no card id or token appears. The queue gauges name workspaces
//! from the server's own table, never from a request.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Store calls now running on the blocking threads (each holds a database connection).
pub static DB_BUSY: LazyLock<Gauge> = LazyLock::new(Gauge::default);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkspaceLabels {
    workspace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// A workspace as the metrics name it unless `metrics.workspace_names` is on: `sha256:`
/// and the first 12 hex digits of the SHA-256 of the database's epoch, a newline and the
/// name. The epoch (random per database, shown by `mopd status`) keys it, so a reader of
/// the port cannot test guessed names against it.
pub fn workspace_label(epoch: &str, workspace: &str) -> String {
    let keyed = format!("{epoch}\n{workspace}");
    format!("sha256:{}", &mop_cards::sha256_hex(keyed.as_bytes())[..12])
}

fn latency_buckets() -> Histogram {
    // 100 µs to about 3 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram, fn() -> Histogram>,
    manifests: Family<KindLabels, Counter>,
    manifest_builds: Histogram,
    stores: Family<KindLabels, Counter>,
    console_logins: Family<KindLabels, Counter>,
    db_idle_readers: Gauge,
    queue_items: Family<WorkspaceLabels, Gauge>,
    queue_groups: Family<WorkspaceLabels, Gauge>,
    queue_oldest: Family<WorkspaceLabels, Gauge>,
    queue_flagged: Family<WorkspaceLabels, Gauge>,
    alerts: Family<KindLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("mop_server");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route pattern, method and status",
            requests.clone(),
        );
        let latency: Family<RouteLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_buckets);
        registry.register(
            "http_request_duration_seconds",
            "Time to answer a request (head ready), by route pattern",
            latency.clone(),
        );
        let manifests = Family::<KindLabels, Counter>::default();
        registry.register(
            "manifest_answers",
            "Manifest answers by kind: not_modified (304), delta, full",
            manifests.clone(),
        );
        let manifest_builds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "manifest_build_seconds",
            "Time to build, serialize and compress a full manifest (once per revision)",
            manifest_builds.clone(),
        );
        let stores = Family::<KindLabels, Counter>::default();
        registry.register(
            "stores",
            "Memory stores from tasks, by outcome",
            stores.clone(),
        );
        let console_logins = Family::<KindLabels, Counter>::default();
        registry.register(
            "console_logins",
            "Console login attempts, by outcome: ok, refused (a wrong, revoked, expired or node token), throttled (a source over console.login_failures_per_minute)",
            console_logins.clone(),
        );
        registry.register(
            "db_busy_calls",
            "Store calls running now, each holding a database connection",
            DB_BUSY.clone(),
        );
        let db_idle_readers = Gauge::default();
        registry.register(
            "db_idle_readers",
            "Reader connections idle in the pool",
            db_idle_readers.clone(),
        );
        let queue_items = Family::<WorkspaceLabels, Gauge>::default();
        registry.register(
            "review_queue_items",
            "Cards waiting for a curator (live and unverified), by workspace",
            queue_items.clone(),
        );
        let queue_groups = Family::<WorkspaceLabels, Gauge>::default();
        registry.register(
            "review_queue_groups",
            "Duplicate groups (one lesson stored by tasks that could not see each other's cards) with a card waiting, by workspace",
            queue_groups.clone(),
        );
        let queue_oldest = Family::<WorkspaceLabels, Gauge>::default();
        registry.register(
            "review_queue_oldest_age_seconds",
            "How long the card waiting longest has waited (0 when none waits), by workspace",
            queue_oldest.clone(),
        );
        let queue_flagged = Family::<WorkspaceLabels, Gauge>::default();
        registry.register(
            "review_queue_flagged",
            "Verified cards in the review queue because agents of enough distinct users called them wrong or outdated, by workspace",
            queue_flagged.clone(),
        );
        let alerts = Family::<KindLabels, Gauge>::default();
        registry.register(
            "alert_webhook_events",
            "Alert webhook events by state: pending (waiting for delivery or a retry), delivered, failed (given up after alerts.max_attempts)",
            alerts.clone(),
        );
        Metrics {
            registry,
            alerts,
            requests,
            latency,
            manifests,
            manifest_builds,
            stores,
            console_logins,
            db_idle_readers,
            queue_items,
            queue_groups,
            queue_oldest,
            queue_flagged,
        }
    }

    /// Counts a manifest answer: `not_modified`, `delta` or `full`.
    pub fn manifest(&self, kind: &str) {
        self.manifests
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    /// Records a full manifest build's time.
    pub fn manifest_built(&self, took: Duration) {
        self.manifest_builds.observe(took.as_secs_f64());
    }

    /// Counts a store by its outcome (`created`, `reinforced`, …).
    pub fn store(&self, outcome: &str) {
        self.stores
            .get_or_create(&KindLabels {
                kind: outcome.into(),
            })
            .inc();
    }

    /// Counts a console login attempt by its outcome (`ok`, `refused`, `throttled`).
    pub fn console_login(&self, outcome: &str) {
        self.console_logins
            .get_or_create(&KindLabels {
                kind: outcome.into(),
            })
            .inc();
    }

    /// The text exposition, with the idle readers, the review queues and the alert
    /// webhook's events read now; the queues' workspaces named (`names`), or by
    /// [`workspace_label`] under `epoch`.
    pub fn encode(
        &self,
        idle_readers: usize,
        queues: &[crate::store::QueueStats],
        alerts: Option<crate::store::alerts::AlertCounts>,
        names: bool,
        epoch: &str,
    ) -> String {
        self.db_idle_readers.set(idle_readers as i64);
        self.alerts.clear();
        if let Some(a) = alerts {
            for (kind, n) in [
                ("pending", a.pending),
                ("delivered", a.delivered),
                ("failed", a.failed),
            ] {
                self.alerts
                    .get_or_create(&KindLabels { kind: kind.into() })
                    .set(n as i64);
            }
        }
        // A workspace gone since the last scrape leaves no stale series behind.
        self.queue_items.clear();
        self.queue_groups.clear();
        self.queue_oldest.clear();
        self.queue_flagged.clear();
        let now = jiff::Timestamp::now();
        for q in queues {
            let labels = WorkspaceLabels {
                workspace: if names {
                    q.workspace.clone()
                } else {
                    workspace_label(epoch, &q.workspace)
                },
            };
            self.queue_items.get_or_create(&labels).set(q.items as i64);
            self.queue_groups
                .get_or_create(&labels)
                .set(q.groups as i64);
            let age = q.oldest.map_or(0, |t| (now - t.0).as_secs().max(0));
            self.queue_oldest.get_or_create(&labels).set(age);
            self.queue_flagged
                .get_or_create(&labels)
                .set(q.flagged as i64);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl Metrics {
    /// Counts and times one answered request. `route` is the matched pattern (or
    /// "unmatched"), never the path a client sent.
    pub fn observe_request(&self, route: Option<&str>, method: &str, status: u16, took: Duration) {
        // `:ws` rather than `{ws}`: braces inside a label value trip some exposition parsers.
        let route = route.map_or_else(
            || "unmatched".to_owned(),
            |p| p.replace('{', ":").replace('}', ""),
        );
        self.latency
            .get_or_create(&RouteLabels {
                route: route.clone(),
            })
            .observe(took.as_secs_f64());
        self.requests
            .get_or_create(&RequestLabels {
                route,
                method: method.to_owned(),
                status,
            })
            .inc();
    }
}
