//! A read-only tantivy directory. Generations are immutable, and the daemon's view of
//! them may be on a read-only mount: opening an index must not create lock files or write
//! anything. Tantivy takes its meta lock only to keep garbage collection away while it
//! opens segments, and nothing collects an immutable generation, so the lock is a no-op.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tantivy::directory::error::{DeleteError, LockError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    Directory, DirectoryLock, FileHandle, Lock, MmapDirectory, WatchCallback, WatchHandle, WritePtr,
};

#[derive(Debug, Clone)]
pub(crate) struct ReadOnlyDirectory(pub(crate) MmapDirectory);

fn read_only(path: &Path) -> Arc<io::Error> {
    Arc::new(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "search index is read-only: refusing to write {}",
            path.display()
        ),
    ))
}

impl Directory for ReadOnlyDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        self.0.get_file_handle(path)
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        Err(DeleteError::IoError {
            io_error: read_only(path),
            filepath: path.to_owned(),
        })
    }

    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        self.0.exists(path)
    }

    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        Err(OpenWriteError::IoError {
            io_error: read_only(path),
            filepath: PathBuf::from(path),
        })
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        self.0.atomic_read(path)
    }

    fn atomic_write(&self, path: &Path, _data: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            read_only(path).to_string(),
        ))
    }

    fn sync_directory(&self) -> io::Result<()> {
        Ok(())
    }

    fn acquire_lock(&self, _lock: &Lock) -> Result<DirectoryLock, LockError> {
        Ok(DirectoryLock::from(Box::new(())))
    }

    fn watch(&self, _callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        Ok(WatchHandle::empty())
    }
}
