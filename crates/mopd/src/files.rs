//! The daemon's own directories and small files, made one way everywhere: directories
//! with mode 0750 (the group `mop` reads, nobody else), files replaced whole (written beside
//! in the same directory, then renamed over the old one), so a reader or a crash never sees
//! half a file. `durably` also flushes the file and its directory before it returns, for
//! what must survive a power cut the moment it is answered (queued stores).
//!
//! Must not know what the files hold: callers bring the bytes.

use std::fs::DirBuilder;
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Creates a directory (and missing parents) with mode 0750.
pub fn make_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o750).create(path)
}

/// Replaces `path` with `bytes` at once (a temporary file beside it, renamed into place),
/// making its directory first.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write(path, bytes, false)
}

/// [`replace`], flushed: on disk, file and directory entry, when this returns.
pub fn replace_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write(path, bytes, true)
}

/// [`replace`] with `value` as JSON (indented when `pretty`, for files people read).
pub fn replace_json(path: &Path, value: &impl serde::Serialize, pretty: bool) -> io::Result<()> {
    let bytes = if pretty {
        serde_json::to_vec_pretty(value)
    } else {
        serde_json::to_vec(value)
    }
    .map_err(io::Error::other)?;
    replace(path, &bytes)
}

fn write(path: &Path, bytes: &[u8], durably: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other(format!("{} has no directory", path.display())))?;
    make_dir(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    if durably {
        tmp.as_file().sync_all()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    if durably {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_are_replaced_whole_in_directories_of_the_daemons_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/c.json");
        replace_json(&path, &serde_json::json!({"x": 1}), false).unwrap();
        replace_durably(&path, b"{\"x\":2}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"x\":2}");
        let mode = std::fs::metadata(dir.path().join("a/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o750);
        // Nothing left beside it.
        assert_eq!(
            std::fs::read_dir(dir.path().join("a/b")).unwrap().count(),
            1
        );
    }
}
