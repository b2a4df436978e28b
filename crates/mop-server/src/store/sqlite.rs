//! The SQLite engine: one writer connection (every change is one `BEGIN IMMEDIATE`
//! transaction) and a small pool of readers; WAL mode lets them run side by side.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::db::{self, Tx};

/// Readers kept open for reuse.
const READER_POOL: usize = 8;

/// An open SQLite database.
pub(crate) struct Sqlite {
    pub(crate) path: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    /// `PRAGMA data_version` is per connection, so one connection is kept for it alone.
    watcher: Mutex<Connection>,
}

/// Makes the database file (if missing) and takes every permission but the owner's off
/// it, whatever the umask: it holds every card, and a card may carry what a curator let
/// through. SQLite gives the `-wal` and `-shm` files it makes the main file's mode.
fn owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o700))?;
        tracing::warn!(path = %path.display(), "the database file was readable by others; it is owner-only now");
    }
    // A `-wal` or `-shm` left by an older version keeps its own mode: narrow it too.
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        if let Ok(meta) = std::fs::symlink_metadata(&side)
            && meta.is_file()
            && meta.permissions().mode() & 0o077 != 0
        {
            std::fs::set_permissions(&side, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

impl Sqlite {
    /// Opens (creating if needed) the file and brings its schema up to date.
    pub(crate) fn open(path: &Path) -> Result<Sqlite, (&'static str, db::DbError)> {
        let at = |context| move |e: rusqlite::Error| (context, db::DbError::from(e));
        owner_only(path).map_err(|e| ("make the database file owner-only", e.into()))?;
        let conn = Connection::open(path).map_err(at("open"))?;
        configure(&conn).map_err(at("configure"))?;
        let watcher = Connection::open(path).map_err(at("open watcher"))?;
        configure(&watcher).map_err(at("configure watcher"))?;
        Ok(Sqlite {
            path: path.to_owned(),
            writer: Mutex::new(conn),
            readers: Mutex::new(Vec::new()),
            watcher: Mutex::new(watcher),
        })
    }

    /// Runs `f` in one immediate (write) transaction, committed only if `f` succeeds.
    pub(crate) fn write<T, E: From<(&'static str, db::DbError)>>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let at = |context| move |e: rusqlite::Error| E::from((context, db::DbError::from(e)));
        let mut conn = self.writer.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(at("begin write"))?;
        let out = f(&Tx::sqlite(&tx))?;
        tx.commit().map_err(at("commit"))?;
        Ok(out)
    }

    /// Runs `f` in one read transaction (a consistent snapshot) on a pooled connection.
    pub(crate) fn read<T, E: From<(&'static str, db::DbError)>>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let at = |context| move |e: rusqlite::Error| E::from((context, db::DbError::from(e)));
        let pooled = self.readers.lock().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(at("open reader"))?;
                configure(&c).map_err(at("configure reader"))?;
                c
            }
        };
        let out = (|| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Deferred)
                .map_err(at("begin read"))?;
            let out = f(&Tx::sqlite(&tx))?;
            tx.finish().map_err(at("end read"))?;
            Ok(out)
        })();
        let mut pool = self.readers.lock();
        if pool.len() < READER_POOL {
            pool.push(conn);
        }
        out
    }

    /// Copies the write-ahead log into the database file and empties it, so that old
    /// page images (which may hold deleted text) leave the WAL too. Readers in the middle
    /// of a snapshot can hold it up; it is tried a few times. True when it completed.
    pub(crate) fn checkpoint_truncate(&self) -> rusqlite::Result<bool> {
        let conn = self.writer.lock();
        for attempt in 0..20 {
            let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
            if busy == 0 {
                return Ok(true);
            }
            std::thread::sleep(std::time::Duration::from_millis(10 * (attempt + 1)));
        }
        Ok(false)
    }

    /// Reader connections idle in the pool now.
    pub(crate) fn idle_readers(&self) -> usize {
        self.readers.lock().len()
    }

    /// SQLite's `data_version`: changes when another connection (another process, or this
    /// process's writer) commits.
    pub(crate) fn data_version(&self) -> rusqlite::Result<i64> {
        self.watcher
            .lock()
            .query_row("PRAGMA data_version", [], |r| r.get(0))
    }

    /// Runs `f` on the writer connection (migrations, the epoch).
    pub(crate) fn with_writer<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> T {
        f(&mut self.writer.lock())
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
    // Reads through a memory map instead of a read(2) and a copy per page: object
    // batches read tens of MB of card bodies. The writes still go through the WAL.
    conn.pragma_update(None, "mmap_size", MMAP_BYTES)?;
    Ok(())
}

/// How much of the database file SQLite reads through a memory map.
const MMAP_BYTES: i64 = 1 << 30;
