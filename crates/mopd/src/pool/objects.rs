//! The pool's objects: card files by sha256, verified while they arrive, written once
//! (0440), never reopened for writing; nothing unverified is ever renamed into place. And
//! [`Linker`], which hardlinks objects into a task's view at their OKF paths.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{Pool, PoolError, io_err, make_dir};

/// Takes one downloaded object: hashed while it streams, kept in memory (a card file is
/// at most 1 MiB), and written and named in the pool only once size and hash match, so an
/// object that fails verification never reaches the disk. Dropping it unfinished leaves
/// nothing behind.
///
/// The bytes go into an unnamed file (`O_TMPFILE` in `tmp/`, created 0440) with one write
/// and are linked into `objects/`: one directory entry per object, where a named
/// temporary file costs a second one made and removed in `tmp/`, and a `chmod`. File
/// systems without `O_TMPFILE` get the named temporary file.
pub struct ObjectWriter {
    bytes: Vec<u8>,
    hasher: Sha256,
    sha256: String,
    size: u64,
    dest: PathBuf,
    tmp_dir: PathBuf,
}

impl ObjectWriter {
    /// Appends bytes; refuses more than the announced size.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), PoolError> {
        if (self.bytes.len() + chunk.len()) as u64 > self.size {
            return Err(PoolError::Verify {
                sha256: self.sha256.clone(),
                problem: format!("more than the announced {} bytes", self.size),
            });
        }
        self.hasher.update(chunk);
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// Verifies the object, writes it and names it in the pool (0440); returns its bytes.
    pub fn finish(self) -> Result<Vec<u8>, PoolError> {
        if self.bytes.len() as u64 != self.size {
            return Err(PoolError::Verify {
                sha256: self.sha256,
                problem: format!("{} bytes instead of {}", self.bytes.len(), self.size),
            });
        }
        let got = mop_cards::hex(&self.hasher.finalize());
        if got != self.sha256 {
            return Err(PoolError::Verify {
                sha256: self.sha256,
                problem: format!("content hashes to {got}"),
            });
        }
        store(&self.tmp_dir, &self.dest, &self.bytes)?;
        Ok(self.bytes)
    }
}

/// Writes verified `bytes` and names them `dest` (0440).
fn store(tmp_dir: &Path, dest: &Path, bytes: &[u8]) -> Result<(), PoolError> {
    use std::os::unix::fs::OpenOptionsExt;
    // The fan-out directory exists for all but the first object in it: it is made only
    // when naming the object says it is missing (two system calls fewer each).
    let fan_out = || make_dir(dest.parent().expect("objects have a fan-out directory"));
    let unnamed = fs::OpenOptions::new()
        .write(true)
        .mode(0o440)
        .custom_flags(libc::O_TMPFILE)
        .open(tmp_dir);
    let mut file = match unnamed {
        Ok(file) => file,
        // Not supported by this file system (or kernel): a named temporary file.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            let mut tmp = tempfile::Builder::new()
                .prefix("obj-")
                .tempfile_in(tmp_dir)
                .map_err(io_err(tmp_dir))?;
            tmp.write_all(bytes).map_err(io_err(tmp.path()))?;
            tmp.as_file()
                .set_permissions(fs::Permissions::from_mode(0o440))
                .map_err(io_err(tmp.path()))?;
            let tmp = match tmp.persist_noclobber(dest) {
                Ok(_) => return Ok(()),
                Err(e) if e.error.kind() == io::ErrorKind::NotFound => {
                    fan_out()?;
                    e.file
                }
                Err(e) => return persisted(dest, Err(e)),
            };
            return persisted(dest, tmp.persist_noclobber(dest).map(drop));
        }
        Err(e) => return Err(io_err(tmp_dir)(e)),
    };
    file.write_all(bytes).map_err(io_err(tmp_dir))?;
    let link = || {
        use std::os::fd::AsRawFd;
        let from = format!("/proc/self/fd/{}", file.as_raw_fd());
        nix::unistd::linkat(
            nix::fcntl::AT_FDCWD,
            from.as_str(),
            nix::fcntl::AT_FDCWD,
            dest,
            nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
        )
        .map_err(io::Error::from)
    };
    let linked = match link() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fan_out()?;
            link()
        }
        other => other,
    };
    match linked {
        // Already there (fetched twice): the same name, hence the same content.
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(io_err(dest)(e)),
        _ => Ok(()),
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

    /// Gives this pool the objects of `entries` it lacks, as hardlinks of `from`'s (the pool
    /// of a workspace this one inherits): a composed generation then builds from this pool
    /// alone. Each is hashed before it is linked, so that damage in the inherited pool is
    /// never linked back in after this pool's scrub took a damaged link out (the two
    /// share the inode). Returns the objects that are damaged there, which are not linked.
    pub fn import_objects(
        &self,
        from: &Pool,
        entries: &[&mop_cards::ManifestEntry],
    ) -> Result<Vec<String>, PoolError> {
        let mut damaged = Vec::new();
        for e in entries {
            if self.has_object(&e.sha256, e.size) {
                continue;
            }
            if !from.has_object(&e.sha256, e.size) {
                return Err(PoolError::MissingObject(format!(
                    "{} (card {} of inherited workspace {})",
                    e.sha256,
                    e.summary.id,
                    from.workspace()
                )));
            }
            let (source, dest) = (from.object_path(&e.sha256), self.object_path(&e.sha256));
            if hash_file(&source).map_err(io_err(&source))? != e.sha256 {
                damaged.push(e.sha256.clone());
                continue;
            }
            make_dir(dest.parent().expect("objects have a fan-out directory"))?;
            match fs::hard_link(&source, &dest) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(&dest)(e)),
            }
        }
        Ok(damaged)
    }

    /// Starts taking an arriving object of `size` bytes (at most 1 MiB: the fetcher's
    /// decoder refuses larger ones).
    pub fn new_object(&self, sha256: &str, size: u64) -> Result<ObjectWriter, PoolError> {
        Ok(ObjectWriter {
            bytes: Vec::with_capacity(size.min(1 << 20) as usize),
            hasher: Sha256::new(),
            sha256: sha256.to_owned(),
            size,
            dest: self.object_path(sha256),
            tmp_dir: self.paths().tmp(),
        })
    }
}

/// Hardlinks objects into a card directory (a task's view), creating each parent (pillar)
/// directory once.
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
    Ok(mop_cards::hex(&hasher.finalize()))
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
