//! The embedded SQLite store.
//!
//! One writer connection (every change is one `BEGIN IMMEDIATE` transaction that also
//! bumps the workspace revision and writes its audit rows) and a small pool of readers;
//! WAL mode lets them run side by side. Callers run store methods on blocking threads.
//!
//! Card content lives once, in `objects`, keyed by (workspace, sha256); a card row points
//! at its current object. Objects no card references are kept for a retention window, so
//! a daemon that is mid-sync can still fetch what its manifest named.

mod backup;
mod cards;
mod curation;
mod memories;
mod schema;
mod sync;
mod tokens;
mod usage;

use parking_lot::Mutex;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use rusqlite::{
    Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params,
};

pub use backup::{BackupReport, backup};
pub use cards::{CardChange, CardState, Expect, HistoryRow, ImportReport, Rejected};
pub use memories::StoreLimits;
pub use sync::{BuiltManifest, ManifestKind};
pub use tokens::{NewToken, Role, TokenInfo, TokenRow, token_hash};

/// Why a store operation failed. `NotFound` and `Invalid` are the caller's mistakes; the
/// rest are the server's.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The thing does not exist (or is outside the caller's scope: they look the same).
    #[error("{0}")]
    NotFound(String),
    /// The request breaks a rule; the message names the field and the rule.
    #[error("{0}")]
    Invalid(String),
    /// The thing exists already.
    #[error("{0}")]
    Conflict(String),
    /// The caller may not do this at all (the message says why and what to do instead).
    #[error("{0}")]
    Forbidden(String),
    /// A configured limit was reached; nothing changed.
    #[error("{0}")]
    Limit(String),
    /// The card is no longer at the version the caller read (`If-Match`); nothing changed.
    #[error(
        "card {id} changed since you read it (its version is now {current}); nothing was saved: reload it, apply your change again and send the new version"
    )]
    Precondition {
        /// The card.
        id: mop_cards::CardId,
        /// Its version tag now.
        current: String,
    },
    /// SQLite failed.
    #[error("database {path}: {context}: {source}")]
    Sqlite {
        /// The database file.
        path: String,
        /// What was being done.
        context: &'static str,
        /// The error.
        source: rusqlite::Error,
    },
    /// The curation search index could not be built or searched.
    #[error("search index: {0}")]
    Index(String),
    /// The database file was made by a newer mop-server.
    #[error(
        "database {path} has schema version {found}, newer than this mop-server knows ({known}); upgrade mop-server"
    )]
    TooNew {
        /// The database file.
        path: String,
        /// Its schema version.
        found: i64,
        /// The newest this build knows.
        known: i64,
    },
}

/// A `Result` with [`StoreError`].
pub type Result<T> = std::result::Result<T, StoreError>;

/// Readers kept open for reuse.
const READER_POOL: usize = 8;

/// The database.
pub struct Store {
    path: PathBuf,
    epoch: String,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    /// `PRAGMA data_version` is per connection, so one connection is kept for it alone.
    watcher: Mutex<Connection>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl Store {
    /// Opens (creating if needed) the database at `path`, runs pending migrations and makes
    /// the epoch on first creation. The parent directory must exist.
    pub fn open(path: &Path) -> Result<Store> {
        let shown = path.display().to_string();
        let sqlite = |context| {
            let path = shown.clone();
            move |source| StoreError::Sqlite {
                path,
                context,
                source,
            }
        };
        let mut conn = Connection::open(path).map_err(sqlite("open"))?;
        configure(&conn).map_err(sqlite("configure"))?;
        schema::migrate(&mut conn, &shown)?;
        let epoch = {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sqlite("begin"))?;
            let existing: Option<String> = tx
                .query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(sqlite("read epoch"))?;
            let epoch = match existing {
                Some(e) => e,
                None => {
                    let e = uuid::Uuid::new_v4().to_string();
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES ('epoch', ?1), ('created_at', ?2)",
                        params![e, now()],
                    )
                    .map_err(sqlite("write epoch"))?;
                    e
                }
            };
            tx.commit().map_err(sqlite("commit"))?;
            epoch
        };
        let watcher = Connection::open(path).map_err(sqlite("open watcher"))?;
        configure(&watcher).map_err(sqlite("configure watcher"))?;
        Ok(Store {
            path: path.to_owned(),
            epoch,
            writer: Mutex::new(conn),
            readers: Mutex::new(Vec::new()),
            watcher: Mutex::new(watcher),
        })
    }

    /// The database epoch: a UUID made when the database was created.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, context: &'static str) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sqlite {
            path: self.path.display().to_string(),
            context,
            source,
        }
    }

    /// Runs `f` in one immediate (write) transaction, committed only if `f` succeeds.
    pub(crate) fn write<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut conn = self.writer.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err("begin write"))?;
        let out = f(&tx)?;
        tx.commit().map_err(self.err("commit"))?;
        Ok(out)
    }

    /// Copies the write-ahead log into the database file and empties it, so that old
    /// page images (which may hold deleted text) leave the WAL too. Readers in the middle
    /// of a snapshot can hold it up; it is tried a few times. True when it completed.
    pub(crate) fn checkpoint_truncate(&self) -> Result<bool> {
        let conn = self.writer.lock();
        for attempt in 0..20 {
            let busy: i64 = conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
                .map_err(self.err("checkpoint"))?;
            if busy == 0 {
                return Ok(true);
            }
            std::thread::sleep(std::time::Duration::from_millis(10 * (attempt + 1)));
        }
        Ok(false)
    }

    /// Runs `f` in one read transaction (a consistent snapshot) on a pooled connection.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let pooled = self.readers.lock().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(self.err("open reader"))?;
                configure(&c).map_err(self.err("configure reader"))?;
                c
            }
        };
        let out = (|| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Deferred)
                .map_err(self.err("begin read"))?;
            let out = f(&tx)?;
            tx.finish().map_err(self.err("end read"))?;
            Ok(out)
        })();
        let mut pool = self.readers.lock();
        if pool.len() < READER_POOL {
            pool.push(conn);
        }
        out
    }

    /// Reader connections idle in the pool now.
    pub fn idle_readers(&self) -> usize {
        self.readers.lock().len()
    }

    /// SQLite's `data_version`: changes when another connection (another process, or this
    /// process's writer) commits. Used to notice token and card changes made by the CLI.
    pub fn data_version(&self) -> Result<i64> {
        let conn = self.watcher.lock();
        conn.query_row("PRAGMA data_version", [], |r| r.get(0))
            .map_err(self.err("data_version"))
    }
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Deleted content is overwritten with zeros, so that a hard delete (personal data)
    // leaves no copy in free pages of the file.
    conn.pragma_update(None, "secure_delete", "ON")?;
    Ok(())
}

/// The current time as stored (see [`stamp`]).
pub(crate) fn now() -> String {
    stamp(Timestamp::now())
}

/// A timestamp as stored: RFC 3339 in UTC with exactly six fractional digits, so that
/// SQLite can compare stored times as strings (`23.5Z` would sort before `23Z`).
pub(crate) fn stamp(ts: Timestamp) -> String {
    const PRINTER: jiff::fmt::temporal::DateTimePrinter =
        jiff::fmt::temporal::DateTimePrinter::new().precision(Some(6));
    PRINTER.timestamp_to_string(&ts)
}

/// Ensures a workspace row exists.
pub(crate) fn ensure_workspace(tx: &Transaction<'_>, ws: &str) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT OR IGNORE INTO workspaces (name, revision, history_floor, counters_dirty, created_at)
         VALUES (?1, 0, 0, 0, ?2)",
        params![ws, now()],
    )?;
    Ok(())
}

/// Bumps a workspace's revision and returns the new one. Every change the manifest shows
/// calls this inside its own transaction, so revision and content never disagree.
pub(crate) fn bump(tx: &Transaction<'_>, ws: &str) -> rusqlite::Result<u64> {
    ensure_workspace(tx, ws)?;
    tx.query_row(
        "UPDATE workspaces SET revision = revision + 1 WHERE name = ?1 RETURNING revision",
        params![ws],
        |r| r.get::<_, i64>(0).map(|v| v as u64),
    )
}
