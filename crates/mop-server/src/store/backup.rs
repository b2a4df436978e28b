//! `mop-server backup`: a consistent copy of a live database, made with SQLite's online
//! backup API while the server keeps serving. All pages are copied in one step, inside
//! one read transaction: in WAL mode that blocks no writer, and a stream of writes cannot
//! make it start over. The copy is written under a temporary name beside the
//! destination, checked, given its own epoch, synced and renamed into place, so a failed
//! or interrupted backup leaves no file that looks complete.
//!
//! Why a new epoch: a restored copy goes back in time. Had it kept the epoch, the
//! revisions written after the restore would repeat numbers daemons already hold with
//! other contents, and a daemon would take the new history for the old. With its own
//! epoch, daemons see a different database and replace their cards (with a warning).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{Result, StoreError};

/// What a backup copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    /// Database pages copied.
    pub pages: u64,
    /// Bytes of the copy.
    pub bytes: u64,
    /// The epoch of the database copied.
    pub source_epoch: String,
    /// The copy's own epoch.
    pub epoch: String,
}

fn sqlite<'a>(
    path: &'a Path,
    context: &'static str,
) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
    move |source| StoreError::Database {
        db: path.display().to_string(),
        context,
        source: source.into(),
    }
}

fn io(path: &Path, what: &str, e: std::io::Error) -> StoreError {
    StoreError::Invalid(format!("{what} {}: {e}", path.display()))
}

/// Copies the database at `db` to `dest` (which must not exist unless `replace`).
pub fn backup(db: &Path, dest: &Path, replace: bool) -> Result<BackupReport> {
    if !db.is_file() {
        return Err(StoreError::NotFound(format!(
            "no database at {} (pass --db or set server.db)",
            db.display()
        )));
    }
    if dest.exists() && !replace {
        return Err(StoreError::Conflict(format!(
            "{} already exists; choose a new name or pass --force to replace it",
            dest.display()
        )));
    }
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".mop-backup-")
        .tempfile_in(dir)
        .map_err(|e| io(dir, "cannot create a file in", e))?;
    let src = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(sqlite(db, "open for backup"))?;
    src.busy_timeout(Duration::from_secs(10))
        .map_err(sqlite(db, "configure"))?;
    let (pages, source_epoch, epoch) = {
        let mut out = Connection::open(tmp.path()).map_err(sqlite(tmp.path(), "open copy"))?;
        {
            use rusqlite::backup::{Backup, StepResult};
            let backup = Backup::new(&src, &mut out).map_err(sqlite(db, "start backup"))?;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                // -1: every page in one step, one read transaction.
                match backup.step(-1).map_err(sqlite(db, "copy pages"))? {
                    StepResult::Done => break,
                    _ if std::time::Instant::now() > deadline => {
                        return Err(StoreError::Invalid(format!(
                            "the database {} stayed locked for a minute; try again",
                            db.display()
                        )));
                    }
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        let check: String = out
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(sqlite(tmp.path(), "check copy"))?;
        if check != "ok" {
            return Err(StoreError::Invalid(format!(
                "the copy failed its integrity check ({check}); nothing was written to {}",
                dest.display()
            )));
        }
        let source_epoch: String = out
            .query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| {
                r.get(0)
            })
            .map_err(sqlite(tmp.path(), "read epoch"))?;
        let epoch = uuid::Uuid::new_v4().to_string();
        out.execute_batch("BEGIN IMMEDIATE")
            .map_err(sqlite(tmp.path(), "begin"))?;
        for (key, value) in [
            ("epoch", epoch.as_str()),
            ("backup_of", source_epoch.as_str()),
            ("backup_at", &super::now()),
        ] {
            out.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                rusqlite::params![key, value],
            )
            .map_err(sqlite(tmp.path(), "write epoch"))?;
        }
        out.execute_batch("COMMIT")
            .map_err(sqlite(tmp.path(), "commit"))?;
        let pages: i64 = out
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(sqlite(tmp.path(), "count pages"))?;
        out.close()
            .map_err(|(_, e)| sqlite(tmp.path(), "close copy")(e))?;
        (pages as u64, source_epoch, epoch)
    };
    tmp.as_file()
        .sync_all()
        .map_err(|e| io(tmp.path(), "cannot sync", e))?;
    let bytes = tmp
        .as_file()
        .metadata()
        .map_err(|e| io(tmp.path(), "cannot stat", e))?
        .len();
    let persisted = if replace {
        tmp.persist(dest)
    } else {
        // Refused, not replaced, if the name appeared meanwhile.
        tmp.persist_noclobber(dest)
    };
    persisted.map_err(|e| io(dest, "cannot move the copy to", e.error))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(BackupReport {
        pages,
        bytes,
        source_epoch,
        epoch,
    })
}
