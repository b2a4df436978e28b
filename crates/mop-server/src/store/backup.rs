//! `mop-server backup`: a consistent copy of a live database, made with SQLite's online
//! backup API while the server keeps serving (it copies a page range at a time and starts
//! over only the pages a concurrent write changed). The copy is written under a temporary
//! name beside the destination, checked, synced and renamed into place, so a failed or
//! interrupted backup leaves no file that looks complete.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{Result, StoreError};

/// Pages copied per step; between steps the server's writers get the database.
const PAGES_PER_STEP: std::ffi::c_int = 1024;

/// What a backup copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupReport {
    /// Database pages copied.
    pub pages: u64,
    /// Bytes of the copy.
    pub bytes: u64,
}

fn sqlite<'a>(
    path: &'a Path,
    context: &'static str,
) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
    move |source| StoreError::Sqlite {
        path: path.display().to_string(),
        context,
        source,
    }
}

fn io(path: &Path, what: &str, e: std::io::Error) -> StoreError {
    StoreError::Invalid(format!("{what} {}: {e}", path.display()))
}

/// Copies the database at `db` to `dest` (which must not exist unless `replace`), calling
/// `progress(copied, total)` pages as it goes.
pub fn backup(
    db: &Path,
    dest: &Path,
    replace: bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<BackupReport> {
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
    let pages = {
        let mut out = Connection::open(tmp.path()).map_err(sqlite(tmp.path(), "open copy"))?;
        {
            use rusqlite::backup::{Backup, StepResult};
            let backup = Backup::new(&src, &mut out).map_err(sqlite(db, "start backup"))?;
            loop {
                let step = backup
                    .step(PAGES_PER_STEP)
                    .map_err(sqlite(db, "copy pages"))?;
                let p = backup.progress();
                let total = p.pagecount.max(0) as u64;
                progress(total - (p.remaining.max(0) as u64).min(total), total);
                match step {
                    StepResult::Done => break,
                    // Let the server's writers in between steps.
                    StepResult::More | StepResult::Busy | StepResult::Locked => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => std::thread::sleep(Duration::from_millis(5)),
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
        let pages: i64 = out
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(sqlite(tmp.path(), "count pages"))?;
        out.close()
            .map_err(|(_, e)| sqlite(tmp.path(), "close copy")(e))?;
        pages as u64
    };
    tmp.as_file()
        .sync_all()
        .map_err(|e| io(tmp.path(), "cannot sync", e))?;
    let bytes = tmp
        .as_file()
        .metadata()
        .map_err(|e| io(tmp.path(), "cannot stat", e))?
        .len();
    tmp.persist(dest)
        .map_err(|e| io(dest, "cannot move the copy to", e.error))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(BackupReport { pages, bytes })
}
