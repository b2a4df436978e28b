//! The PostgreSQL engine, for several mop-server replicas on one database.
//!
//! The store's methods are synchronous (they run on blocking threads), so this engine
//! keeps a small tokio runtime of its own that drives the pool's connections
//! (tokio-postgres with deadpool-postgres); each call blocks on it.
//!
//! Writes keep SQLite's semantics: every write transaction first takes one
//! transaction-scoped advisory lock, so writes from all replicas run one at a time, as
//! SQLite's `BEGIN IMMEDIATE` does. Revisions are therefore allocated inside the writing
//! transaction, in order, and every replica gives the same ETag for the same state. Each
//! write also bumps the one-row `changes` counter and sends `NOTIFY mop_changes`, both
//! delivered at commit. Reads run in `REPEATABLE READ, READ ONLY` transactions: one
//! snapshot each.
//!
//! Replicas notice each other's writes through the counter: a watcher task reads it at
//! least once a second and at once when a notification arrives. Notifications are only a
//! wake-up (they are lost while the listening connection reconnects); the poll is what
//! makes a change seen.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::{AsyncMessage, IsolationLevel, NoTls};

use super::db::{DbError, Tx};
use super::schema::PG_MIGRATIONS;

/// The advisory lock every write transaction takes (any constant; "mop" in ASCII).
const WRITE_LOCK: i64 = 0x6d6f70;
/// The advisory lock schema migrations take, so replicas starting together migrate once.
const MIGRATE_LOCK: i64 = 0x6d6f70 + 1;
/// Connections per replica.
const POOL_SIZE: usize = 16;
/// How long a call waits for a connection before it fails as unavailable.
const CONNECT_WAIT: Duration = Duration::from_secs(5);
/// How often the change counter is read when no notification comes.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// A change counter not read for this long makes the replica not ready: it may be missing
/// other replicas' changes (a revoked token among them).
const POLL_STALE: Duration = Duration::from_secs(5);
/// Server-side bounds, so that no call waits forever on a stuck peer: one statement, a wait
/// for the write lock, a transaction left idle by a process that hung.
const SESSION_OPTIONS: &str = "-c statement_timeout=30000 -c lock_timeout=30000 \
                               -c idle_in_transaction_session_timeout=60000";

type Fail = (&'static str, DbError);

/// What a failed commit is called: its outcome is unknown when the connection broke.
pub(crate) const COMMIT: &str = "commit";

/// An open PostgreSQL database.
pub(crate) struct Postgres {
    pool: Pool,
    rt: Option<tokio::runtime::Runtime>,
    /// One writer of this process at a time asks for the advisory lock, so writers waiting
    /// for it hold one pooled connection, not all of them.
    writer: Mutex<()>,
    /// The `changes` counter as last read by the watcher.
    version: Arc<AtomicI64>,
    /// When the watcher last read it, in milliseconds since `started`.
    polled_at: Arc<AtomicU64>,
    started: Instant,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// `postgres://user@host:port/db`, without the password: what logs and errors show.
pub(crate) fn shown(url: &str) -> String {
    match url.parse::<tokio_postgres::Config>() {
        Ok(c) => {
            let host = c
                .get_hosts()
                .first()
                .map(|h| match h {
                    tokio_postgres::config::Host::Tcp(h) => h.clone(),
                    tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                })
                .unwrap_or_default();
            let port = c.get_ports().first().copied().unwrap_or(5432);
            format!(
                "postgres://{}@{host}:{port}/{}",
                c.get_user().unwrap_or(""),
                c.get_dbname().unwrap_or("")
            )
        }
        Err(_) => "postgres://(unparsable URL)".to_owned(),
    }
}

/// Runs blocking work: from a worker of a multi-threaded runtime (an async handler that
/// found a cache empty), the worker first hands its other tasks away.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl Postgres {
    /// Connects, brings the schema up to date and starts the watcher.
    pub(crate) fn open(url: &str) -> Result<Postgres, Fail> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| ("parse URL", e.into()))?;
        // A dead peer (a cut network, a frozen host) is noticed in seconds, not hours.
        config
            .options(SESSION_OPTIONS)
            .connect_timeout(CONNECT_WAIT)
            .keepalives_idle(Duration::from_secs(10))
            .tcp_user_timeout(Duration::from_secs(30))
            .application_name("mop-server");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mop-postgres")
            .enable_all()
            .build()
            .map_err(|e| ("start its runtime", DbError::Pool(e.to_string())))?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                // A connection the server closed is dropped when it comes back to the
                // pool; the request that found it closed got a 503.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .wait_timeout(Some(CONNECT_WAIT))
            .create_timeout(Some(CONNECT_WAIT))
            .recycle_timeout(Some(CONNECT_WAIT))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| ("create the pool", DbError::Pool(e.to_string())))?;
        let mut pg = Postgres {
            pool,
            rt: Some(rt),
            writer: Mutex::new(()),
            version: Arc::default(),
            polled_at: Arc::default(),
            started: Instant::now(),
            stop: None,
        };
        pg.migrate()?;
        let first = pg
            .read_version()
            .map_err(|e| ("read the change counter", e))?;
        pg.version.store(first, Ordering::SeqCst);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        pg.stop = Some(stop);
        pg.rt().spawn(watch(
            config,
            pg.version.clone(),
            pg.polled_at.clone(),
            pg.started,
            stopped,
        ));
        Ok(pg)
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt
            .as_ref()
            .expect("the runtime lives as long as the store")
    }

    fn client(&self) -> Result<deadpool_postgres::Object, Fail> {
        self.rt().block_on(self.pool.get()).map_err(|e| {
            let e = match e {
                deadpool_postgres::PoolError::Backend(e) => DbError::Connect(e),
                deadpool_postgres::PoolError::Timeout(_) => DbError::Pool(format!(
                    "none free or made within {} s",
                    CONNECT_WAIT.as_secs()
                )),
                other => DbError::Pool(other.to_string()),
            };
            ("connect", e)
        })
    }

    fn migrate(&self) -> Result<(), Fail> {
        blocking(|| {
            let mut client = self.client()?;
            let rt = self.rt();
            loop {
                let tx = rt
                    .block_on(client.transaction())
                    .map_err(|e| ("begin migration", e.into()))?;
                let version: i64 = rt
                    .block_on(async {
                        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
                            .await?;
                        tx.batch_execute(
                            "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)",
                        )
                        .await?;
                        let row = tx
                            .query_opt("SELECT version FROM schema_version", &[])
                            .await?;
                        Ok::<_, tokio_postgres::Error>(row.map_or(0, |r| r.get(0)))
                    })
                    .map_err(|e| ("read schema version", e.into()))?;
                let known = PG_MIGRATIONS.len() as i64;
                if version > known {
                    return Err((
                        "schema version",
                        DbError::SchemaTooNew {
                            found: version,
                            known,
                        },
                    ));
                }
                if version == known {
                    return Ok(());
                }
                rt.block_on(async {
                    tx.batch_execute(PG_MIGRATIONS[version as usize]).await?;
                    tx.execute("DELETE FROM schema_version", &[]).await?;
                    tx.execute(
                        "INSERT INTO schema_version (version) VALUES ($1)",
                        &[&(version + 1)],
                    )
                    .await?;
                    tx.commit().await
                })
                .map_err(|e| ("migrate", e.into()))?;
                tracing::info!(version = version + 1, "database schema migrated");
            }
        })
    }

    /// Runs `f` in one write transaction, committed only if `f` succeeds.
    pub(crate) fn write<T, E: From<Fail>>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        blocking(|| {
            let rt = self.rt();
            let _one_writer = self.writer.lock();
            let mut client = self.client()?;
            let tx = rt
                .block_on(client.transaction())
                .map_err(|e| E::from(("begin write", e.into())))?;
            rt.block_on(tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK]))
                .map_err(|e| E::from(("take the write lock", e.into())))?;
            let out = f(&Tx::postgres(&tx, rt.handle()))?;
            rt.block_on(async {
                tx.execute("UPDATE changes SET n = n + 1 WHERE id = 1", &[])
                    .await?;
                tx.batch_execute("NOTIFY mop_changes").await?;
                tx.commit().await
            })
            .map_err(|e| E::from((COMMIT, e.into())))?;
            Ok(out)
        })
    }

    /// Runs `f` in one read-only snapshot.
    pub(crate) fn read<T, E: From<Fail>>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        blocking(|| {
            let rt = self.rt();
            let mut client = self.client()?;
            let tx = rt
                .block_on(
                    client
                        .build_transaction()
                        .isolation_level(IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start(),
                )
                .map_err(|e| E::from(("begin read", e.into())))?;
            let out = f(&Tx::postgres(&tx, rt.handle()))?;
            rt.block_on(tx.commit())
                .map_err(|e| E::from(("end read", e.into())))?;
            Ok(out)
        })
    }

    fn read_version(&self) -> Result<i64, DbError> {
        blocking(|| {
            let client = self.client().map_err(|(_, e)| e)?;
            let row = self
                .rt()
                .block_on(client.query_one("SELECT n FROM changes WHERE id = 1", &[]))?;
            Ok(row.get(0))
        })
    }

    /// The change counter as the watcher last read it: changes when any replica (or the
    /// CLI) commits a write. Never blocks. An error when the watcher has not read it for
    /// [`POLL_STALE`]: this replica may be missing changes made elsewhere.
    pub(crate) fn data_version(&self) -> Result<i64, DbError> {
        let polled = Duration::from_millis(self.polled_at.load(Ordering::SeqCst));
        let since = self.started.elapsed().saturating_sub(polled);
        if since > POLL_STALE {
            return Err(DbError::Pool(format!(
                "the change counter was last read {} s ago; changes made through other replicas may be missed",
                since.as_secs()
            )));
        }
        Ok(self.version.load(Ordering::SeqCst))
    }

    /// Connections idle in the pool now.
    pub(crate) fn idle(&self) -> usize {
        self.pool.status().available
    }

    /// `VACUUM` of these tables (outside any transaction, as VACUUM must be).
    pub(crate) fn vacuum(&self, tables: &str) -> Result<(), DbError> {
        blocking(|| {
            let client = self.client().map_err(|(_, e)| e)?;
            self.rt()
                .block_on(client.batch_execute(&format!("VACUUM {tables}")))?;
            Ok(())
        })
    }

    /// True when the database answers a query now.
    pub(crate) fn ping(&self) -> Result<(), DbError> {
        blocking(|| {
            let client = self.client().map_err(|(_, e)| e)?;
            self.rt().block_on(client.simple_query("SELECT 1"))?;
            Ok(())
        })
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Dropping a runtime blocks; from inside another runtime that is not allowed.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Keeps `version` current: reads the counter every [`POLL_EVERY`], and at once when the
/// listening connection hears `mop_changes`. It has its own connection (a pool busy with
/// requests must not hold it up), made again whenever a read fails.
async fn watch(
    config: tokio_postgres::Config,
    version: Arc<AtomicI64>,
    polled_at: Arc<AtomicU64>,
    started: Instant,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let wake = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(listen(config.clone(), wake.clone()));
    let mut client: Option<tokio_postgres::Client> = None;
    loop {
        let read = async {
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                let (c, connection) = config.connect(NoTls).await.map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                client = Some(c);
            }
            let c = client.as_ref().expect("connected above");
            let row = c
                .query_one("SELECT n FROM changes WHERE id = 1", &[])
                .await
                .map_err(|e| e.to_string())?;
            Ok::<i64, String>(row.get(0))
        };
        match tokio::time::timeout(CONNECT_WAIT, read).await {
            Ok(Ok(n)) => {
                version.store(n, Ordering::SeqCst);
                polled_at.store(started.elapsed().as_millis() as u64, Ordering::SeqCst);
            }
            Ok(Err(e)) => {
                client = None;
                tracing::debug!(error = %e, "could not read the change counter");
            }
            Err(_) => {
                client = None;
                tracing::debug!("reading the change counter timed out");
            }
        }
        tokio::select! {
            _ = &mut stopped => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(POLL_EVERY) => {}
        }
    }
}

/// Holds a connection that `LISTEN`s on `mop_changes` and wakes the watcher on each
/// notification; reconnects (after a second) whenever the connection ends.
async fn listen(config: tokio_postgres::Config, wake: Arc<tokio::sync::Notify>) {
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let messages = async {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => return,
                        }
                    }
                };
                let subscribe = async {
                    if client.batch_execute("LISTEN mop_changes").await.is_ok() {
                        // Anything missed before the LISTEN took effect is caught here.
                        wake.notify_one();
                    }
                    std::future::pending::<()>().await
                };
                tokio::select! {
                    _ = messages => {}
                    _ = subscribe => {}
                }
            }
            Err(e) => tracing::debug!(error = %e, "could not connect to listen for changes"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_shown_url_has_no_password() {
        assert_eq!(
            super::shown("postgres://mop:s3cret@db.example:6543/cards"),
            "postgres://mop@db.example:6543/cards"
        );
        assert!(!super::shown("postgresql://u:pw@h/d?sslmode=disable").contains("pw"));
    }
}
