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
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

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

type Fail = (&'static str, DbError);

/// An open PostgreSQL database.
pub(crate) struct Postgres {
    pool: Pool,
    rt: Option<tokio::runtime::Runtime>,
    /// The `changes` counter as last read by the watcher.
    version: Arc<AtomicI64>,
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
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| ("parse URL", e.into()))?;
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
            version: Arc::default(),
            stop: None,
        };
        pg.migrate()?;
        let first = pg
            .read_version()
            .map_err(|e| ("read the change counter", e))?;
        pg.version.store(first, Ordering::SeqCst);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        pg.stop = Some(stop);
        pg.rt()
            .spawn(watch(config, pg.pool.clone(), pg.version.clone(), stopped));
        Ok(pg)
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt
            .as_ref()
            .expect("the runtime lives as long as the store")
    }

    fn client(&self) -> Result<deadpool_postgres::Object, Fail> {
        self.rt()
            .block_on(self.pool.get())
            .map_err(|e| ("connect", DbError::Pool(e.to_string())))
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
            .map_err(|e| E::from(("commit", e.into())))?;
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
    /// CLI) commits a write. Never blocks.
    pub(crate) fn data_version(&self) -> i64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Connections idle in the pool now.
    pub(crate) fn idle(&self) -> usize {
        self.pool.status().available
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
/// listening connection hears `mop_changes`.
async fn watch(
    config: tokio_postgres::Config,
    pool: Pool,
    version: Arc<AtomicI64>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let wake = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(listen(config, wake.clone()));
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(POLL_EVERY) => {}
        }
        let read = async {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            let row = client
                .query_one("SELECT n FROM changes WHERE id = 1", &[])
                .await
                .map_err(|e| e.to_string())?;
            Ok::<i64, String>(row.get(0))
        };
        match read.await {
            Ok(n) => version.store(n, Ordering::SeqCst),
            Err(e) => tracing::debug!(error = %e, "could not read the change counter"),
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
