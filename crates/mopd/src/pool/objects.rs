//! The pool's objects: card files by sha256, verified while they arrive, written once
//! (0440), never reopened for writing; nothing unverified is ever renamed into place. And
//! [`Linker`], which hardlinks objects into card trees (a generation's, a task's view).

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{Pool, PoolError, io_err, make_dir};

/// Writes one downloaded object: hashed while it streams, renamed into place only once
/// size and hash match. Dropping it unfinished leaves nothing behind.
pub struct ObjectWriter {
    tmp: tempfile::NamedTempFile,
    hasher: Sha256,
    written: u64,
    sha256: String,
    size: u64,
    dest: PathBuf,
}

impl ObjectWriter {
    /// Appends bytes; refuses more than the announced size.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), PoolError> {
        self.written += chunk.len() as u64;
        if self.written > self.size {
            return Err(PoolError::Verify {
                sha256: self.sha256.clone(),
                problem: format!("more than the announced {} bytes", self.size),
            });
        }
        self.hasher.update(chunk);
        self.tmp.write_all(chunk).map_err(io_err(self.tmp.path()))
    }

    /// Verifies and renames into place (0440).
    pub fn finish(self) -> Result<(), PoolError> {
        if self.written != self.size {
            return Err(PoolError::Verify {
                sha256: self.sha256,
                problem: format!("{} bytes instead of {}", self.written, self.size),
            });
        }
        let got = hex(&self.hasher.finalize());
        if got != self.sha256 {
            return Err(PoolError::Verify {
                sha256: self.sha256,
                problem: format!("content hashes to {got}"),
            });
        }
        let file = self.tmp.as_file();
        file.set_permissions(fs::Permissions::from_mode(0o440))
            .map_err(io_err(self.tmp.path()))?;
        // The fan-out directory exists for all but the first object in it: it is made
        // only when the rename says it is missing (two system calls fewer per object).
        let tmp = match self.tmp.persist_noclobber(&self.dest) {
            Ok(_) => return Ok(()),
            Err(e) if e.error.kind() == io::ErrorKind::NotFound => {
                make_dir(
                    self.dest
                        .parent()
                        .expect("objects have a fan-out directory"),
                )?;
                e.file
            }
            Err(e) => return persisted(&self.dest, Err(e)),
        };
        persisted(&self.dest, tmp.persist_noclobber(&self.dest).map(drop))
    }
}

/// The outcome of naming an object.
fn persisted(dest: &Path, result: Result<(), tempfile::PersistError>) -> Result<(), PoolError> {
    match result {
        Ok(()) => Ok(()),
        // Already there (fetched twice): the existing copy has the same name, hence content.
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(PoolError::Io {
            path: dest.display().to_string(),
            source: e.error,
        }),
    }
}

impl Pool {
    /// Where an object lives.
    pub fn object_path(&self, sha256: &str) -> PathBuf {
        self.paths().object(sha256)
    }

    /// True when the object is present with the expected size (its content is trusted:
    /// it was verified when written, and re-hashed by `verify`).
    pub fn has_object(&self, sha256: &str, size: u64) -> bool {
        fs::metadata(self.object_path(sha256)).is_ok_and(|m| m.is_file() && m.len() == size)
    }

    /// Starts writing an arriving object.
    pub fn new_object(&self, sha256: &str, size: u64) -> Result<ObjectWriter, PoolError> {
        let tmp_dir = self.paths().tmp();
        let tmp = tempfile::Builder::new()
            .prefix("obj-")
            .tempfile_in(&tmp_dir)
            .map_err(io_err(&tmp_dir))?;
        Ok(ObjectWriter {
            tmp,
            hasher: Sha256::new(),
            written: 0,
            sha256: sha256.to_owned(),
            size,
            dest: self.object_path(sha256),
        })
    }
}

/// Hardlinks files into a card tree, creating each parent (pillar) directory once.
#[derive(Debug)]
pub struct Linker {
    root: PathBuf,
    made: BTreeSet<PathBuf>,
}

impl Linker {
    /// Links into the tree at `root`.
    pub fn new(root: &Path) -> Linker {
        Linker {
            root: root.to_owned(),
            made: BTreeSet::new(),
        }
    }

    /// Links `source` at `rel` (a card path) inside the tree.
    pub fn link(&mut self, source: &Path, rel: &str) -> Result<(), PoolError> {
        let target = self.root.join(rel);
        let parent = target.parent().expect("card paths have a pillar directory");
        if !self.made.contains(parent) {
            make_dir(parent)?;
            self.made.insert(parent.to_owned());
        }
        fs::hard_link(source, &target).map_err(io_err(&target))
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// SHA-256 of a file, streamed.
pub fn hash_file(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_verified_before_they_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::open(&super::super::tests::paths(dir.path()), "acme").unwrap();
        let body = b"---\nid: x\n---\nbody\n";
        let sha = mop_cards::sha256_hex(body);
        // Wrong content under the name: refused, nothing named.
        let mut w = pool.new_object(&sha, body.len() as u64).unwrap();
        w.write(b"---\nid: y\n---\nbody\n").unwrap();
        assert!(matches!(w.finish(), Err(PoolError::Verify { .. })));
        assert!(!pool.has_object(&sha, body.len() as u64));
        // Too many bytes: refused as they arrive.
        let mut w = pool.new_object(&sha, 3).unwrap();
        assert!(w.write(body).is_err());
        // (A shadowed writer lives to the end of the scope: dropping it removes its file.)
        drop(w);
        // The right bytes, in pieces: named, 0440, hash checks out.
        let mut w = pool.new_object(&sha, body.len() as u64).unwrap();
        w.write(&body[..5]).unwrap();
        w.write(&body[5..]).unwrap();
        w.finish().unwrap();
        assert!(pool.has_object(&sha, body.len() as u64));
        let path = pool.object_path(&sha);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o440
        );
        assert_eq!(hash_file(&path).unwrap(), sha);
        // Nothing left over in tmp/.
        assert_eq!(fs::read_dir(pool.paths().tmp()).unwrap().count(), 0);
        // Linked into a tree twice over: the same inode.
        let mut linker = Linker::new(&dir.path().join("tree"));
        linker.link(&path, "facts/specs/x.md").unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            fs::metadata(dir.path().join("tree/facts/specs/x.md"))
                .unwrap()
                .ino(),
            fs::metadata(&path).unwrap().ino()
        );
    }
}
