//! The store: every workspace's cards, objects, history, tokens and counters, on one of two
//! engines.
//!
//! SQLite (a file; the default, and what `mopd demo` and small teams use) or PostgreSQL
//! (for several stateless replicas; see `pg`). Both run the same queries through the
//! narrow interface in `db`, so each store method is written once. Every change is one
//! transaction that also bumps the workspace revision and writes its audit rows. Callers
//! run store methods on blocking threads.
//!
//! Card content lives once, in `objects`, keyed by (workspace, sha256); a card row points
//! at its current object. Objects no card references are kept for a retention window, so
//! a daemon that is mid-sync can still fetch what its manifest named.

pub(crate) mod alerts;
mod backup;
pub(crate) mod cards;
mod curation;
pub use curation::{QueuePage, QueueStats, summary_filter};
pub mod db;
pub(crate) mod intake;
pub(crate) mod memories;
mod migrate;
mod pg;
mod schema;
mod sqlite;
mod sync;
mod tokens;
mod usage;

use std::path::{Path, PathBuf};

use jiff::Timestamp;

pub use backup::{BackupReport, backup};
pub use cards::{CardChange, Expect, HistoryRow, ImportReport, Rejected};
use db::{DbError, OptionalExtension, Tx, params};
pub use intake::{IntakePolicy, OnRejected, set_embedding_model};
pub use migrate::{MigrateReport, TableCheck, migrate};
pub use sync::{BuiltManifest, ManifestKind};
pub use tokens::{NewToken, Role, TokenInfo, TokenRow, token_hash};

/// Where a database is: an SQLite file or a PostgreSQL URL.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// An SQLite file.
    Sqlite(PathBuf),
    /// A `postgres://` (or `postgresql://`) URL; it may hold a password, so it is never
    /// shown: see [`Database::shown`].
    Postgres(String),
}

impl Database {
    /// `postgres://…` or `postgresql://…` is PostgreSQL; `sqlite:PATH` or a bare path is
    /// SQLite.
    pub fn parse(s: &str) -> Database {
        let lower = s.get(..13).unwrap_or(s).to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Database::Postgres(s.to_owned())
        } else {
            Database::Sqlite(PathBuf::from(s.strip_prefix("sqlite:").unwrap_or(s)))
        }
    }

    /// How logs and errors name it: the file, or the URL without its password.
    pub fn shown(&self) -> String {
        match self {
            Database::Sqlite(p) => p.display().to_string(),
            Database::Postgres(url) => pg::shown(url),
        }
    }
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

/// Why a store operation failed. `NotFound` and `Invalid` are the caller's mistakes;
/// `Unavailable` is a database that cannot be reached now; the rest are the server's.
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
    /// The text carries credentials; nothing was stored. The message names each one's
    /// kind and place, never its value.
    #[error("{}", mop_proto::sync::credential_refusal(what, findings))]
    Credential {
        /// What was screened (`the card`, `card <id>`).
        what: String,
        /// Kinds and places.
        findings: Vec<mop_proto::sync::CredentialFinding>,
    },
    /// The lesson is one a curator rejected; nothing was stored.
    #[error(
        "a curator rejected this lesson on {}: {}; nothing was stored. Do not store it again; if the situation has changed, store what is new and say why",
        note.at, note.reason
    )]
    Rejected {
        /// When and why.
        note: mop_proto::sync::RejectionNote,
    },
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
    /// The database failed.
    #[error("database {db}: {context}: {source}")]
    Database {
        /// The database, as [`Database::shown`] names it.
        db: String,
        /// What was being done.
        context: &'static str,
        /// The error.
        source: DbError,
    },
    /// The database cannot be reached now (down, restarting); nothing was changed and the
    /// same request may succeed shortly.
    #[error(
        "database {db} is unavailable ({context}: {source}); nothing was changed: try again shortly"
    )]
    Unavailable {
        /// The database, as [`Database::shown`] names it.
        db: String,
        /// What was being done.
        context: &'static str,
        /// The error.
        source: DbError,
    },
    /// The connection broke while a change was being committed: it may or may not have
    /// been saved.
    #[error(
        "database {db}: the connection broke while committing ({source}); the change may or may not have been saved: read it back before trying again"
    )]
    CommitUnknown {
        /// The database, as [`Database::shown`] names it.
        db: String,
        /// The error.
        source: DbError,
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

impl StoreError {
    fn database(db: String, context: &'static str, source: DbError) -> StoreError {
        if let DbError::SchemaTooNew { found, known } = source {
            StoreError::TooNew {
                path: db,
                found,
                known,
            }
        } else if source.is_unavailable() && context == pg::COMMIT {
            StoreError::CommitUnknown { db, source }
        } else if source.is_unavailable() {
            StoreError::Unavailable {
                db,
                context,
                source,
            }
        } else {
            StoreError::Database {
                db,
                context,
                source,
            }
        }
    }
}

/// A `Result` with [`StoreError`].
pub type Result<T> = std::result::Result<T, StoreError>;

/// Why a transaction ended without a commit: the engine failed (with what it was doing,
/// before the store names the database), or the work inside returned an error.
enum Failed {
    Engine(&'static str, DbError),
    Work(StoreError),
}

impl From<(&'static str, DbError)> for Failed {
    fn from((context, e): (&'static str, DbError)) -> Failed {
        Failed::Engine(context, e)
    }
}

enum Engine {
    Sqlite(sqlite::Sqlite),
    Postgres(pg::Postgres),
}

/// The database.
pub struct Store {
    engine: Engine,
    /// The write path's settings.
    intake: IntakePolicy,
    shown: String,
    epoch: String,
    /// True when this open made the epoch: the database held no mop data before.
    created: bool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("db", &self.shown)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl Store {
    /// Opens (creating if needed) the SQLite database at `path`. The parent directory must
    /// exist.
    pub fn open(path: &Path) -> Result<Store> {
        Store::connect(&Database::Sqlite(path.to_owned()))
    }

    /// Opens a database, runs pending migrations and makes the epoch on first creation.
    pub fn connect(db: &Database) -> Result<Store> {
        let shown = db.shown();
        let fail =
            |(context, e): (&'static str, DbError)| StoreError::database(shown.clone(), context, e);
        let engine = match db {
            Database::Sqlite(path) => {
                let engine = sqlite::Sqlite::open(path).map_err(fail)?;
                engine.with_writer(|conn| schema::migrate(conn, &shown))?;
                Engine::Sqlite(engine)
            }
            Database::Postgres(url) => Engine::Postgres(pg::Postgres::open(url).map_err(fail)?),
        };
        let mut store = Store {
            engine,
            intake: IntakePolicy::default(),
            shown,
            epoch: String::new(),
            created: false,
        };
        (store.epoch, store.created) = store.write(|tx| {
            let e = store.err("epoch");
            let existing: Option<String> = tx
                .query_row(
                    "SELECT value FROM meta WHERE key = 'epoch'",
                    params![],
                    |r| r.get(0),
                )
                .optional()
                .map_err(&e)?;
            Ok(match existing {
                Some(epoch) => (epoch, false),
                None => {
                    let epoch = uuid::Uuid::new_v4().to_string();
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES ('epoch', ?1), ('created_at', ?2)",
                        params![epoch, now()],
                    )
                    .map_err(&e)?;
                    (epoch, true)
                }
            })
        })?;
        // Cards written before intake existed, or under other rules, get their facts now:
        // every later decision relies on them.
        let made = store.refresh_intake()?;
        if made > 0 {
            tracing::info!(
                cards = made,
                "intake facts (fingerprints, credentials) made for existing cards"
            );
        }
        Ok(store)
    }

    /// Opens a database that must exist and hold mop data already: an SQLite file that is
    /// not there is not created, and an empty database is refused.
    pub fn connect_existing(db: &Database) -> Result<Store> {
        if let Database::Sqlite(path) = db
            && !path.is_file()
        {
            return Err(StoreError::NotFound(format!(
                "no database at {}",
                path.display()
            )));
        }
        let store = Store::connect(db)?;
        if store.created {
            return Err(StoreError::NotFound(format!(
                "{} holds no mop data (it had no epoch)",
                store.shown
            )));
        }
        Ok(store)
    }

    /// The store with the write path's settings (the server's `[intake]`).
    pub fn with_intake(mut self, policy: IntakePolicy) -> Store {
        self.intake = policy;
        self
    }

    /// The write path's settings in force.
    pub fn intake(&self) -> &IntakePolicy {
        &self.intake
    }

    /// The database epoch: a UUID made when the database was created.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The SQLite file, when the store is one.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.engine {
            Engine::Sqlite(s) => Some(&s.path),
            Engine::Postgres(_) => None,
        }
    }

    /// The database as logs name it.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    fn err(&self, context: &'static str) -> impl Fn(DbError) -> StoreError + '_ {
        move |source| StoreError::database(self.shown.clone(), context, source)
    }

    fn failed(&self, failed: Failed) -> StoreError {
        match failed {
            Failed::Engine(context, source) => {
                StoreError::database(self.shown.clone(), context, source)
            }
            Failed::Work(e) => e,
        }
    }

    /// Runs `f` in one write transaction, committed only if `f` succeeds (else rolled
    /// back). Writes run one at a time, across replicas too.
    pub(crate) fn write<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T>) -> Result<T> {
        let f = |tx: &Tx<'_>| f(tx).map_err(Failed::Work);
        match &self.engine {
            Engine::Sqlite(s) => s.write(f),
            Engine::Postgres(p) => p.write(f),
        }
        .map_err(|e| self.failed(e))
    }

    /// Runs `f` in one read transaction (a consistent snapshot).
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T>) -> Result<T> {
        let f = |tx: &Tx<'_>| f(tx).map_err(Failed::Work);
        match &self.engine {
            Engine::Sqlite(s) => s.read(f),
            Engine::Postgres(p) => p.read(f),
        }
        .map_err(|e| self.failed(e))
    }

    /// After a hard delete, makes the deleted text leave what the database keeps besides
    /// its live rows. SQLite: copies the write-ahead log into the (zeroed) file and empties
    /// it; true when it completed. PostgreSQL: vacuums the tables that held the text, so
    /// the dead rows are cleared; copies in its WAL archive, standbys and backups are the
    /// operator's to expire (see README).
    pub(crate) fn checkpoint_truncate(&self) -> Result<bool> {
        match &self.engine {
            Engine::Sqlite(s) => s
                .checkpoint_truncate()
                .map_err(|e| self.err("checkpoint")(e.into())),
            Engine::Postgres(p) => p
                .vacuum("objects, history, cards")
                .map(|()| true)
                .map_err(self.err("vacuum")),
        }
    }

    /// Connections idle in the pool now.
    pub fn idle_readers(&self) -> usize {
        match &self.engine {
            Engine::Sqlite(s) => s.idle_readers(),
            Engine::Postgres(p) => p.idle(),
        }
    }

    /// A number that changes when another connection (another process or replica, or
    /// this process's writer) commits. Used to notice token and card changes made
    /// elsewhere.
    pub fn data_version(&self) -> Result<i64> {
        match &self.engine {
            Engine::Sqlite(s) => s
                .data_version()
                .map_err(|e| self.err("data_version")(e.into())),
            Engine::Postgres(p) => p.data_version().map_err(self.err("data_version")),
        }
    }

    /// Checks that the database answers now.
    pub fn ping(&self) -> Result<()> {
        match &self.engine {
            Engine::Sqlite(s) => s
                .data_version()
                .map(drop)
                .map_err(|e| self.err("ping")(e.into())),
            Engine::Postgres(p) => p.ping().map_err(self.err("ping")),
        }
    }
}

/// The current time as stored (see [`stamp`]).
pub(crate) fn now() -> String {
    stamp(Timestamp::now())
}

/// A timestamp as stored: RFC 3339 in UTC with exactly six fractional digits, so that
/// SQLite can compare stored times as strings (`23.5Z` would sort before `23Z`).
pub(crate) fn stamp(ts: Timestamp) -> String {
    mop_proto::time::Stamp(ts).to_string()
}

/// Ensures a workspace row exists.
pub(crate) fn ensure_workspace(tx: &Tx<'_>, ws: &str) -> db::Result<()> {
    tx.execute(
        "INSERT INTO workspaces (name, revision, history_floor, counters_dirty, created_at)
         VALUES (?1, 0, 0, 0, ?2) ON CONFLICT DO NOTHING",
        params![ws, now()],
    )?;
    Ok(())
}

/// Bumps a workspace's revision and returns the new one. Every change the manifest shows
/// calls this inside its own transaction, so revision and content never disagree.
pub(crate) fn bump(tx: &Tx<'_>, ws: &str) -> db::Result<u64> {
    ensure_workspace(tx, ws)?;
    tx.query_row(
        "UPDATE workspaces SET revision = revision + 1 WHERE name = ?1 RETURNING revision",
        params![ws],
        |r| r.get::<i64>(0).map(|v| v as u64),
    )
}
