//! Garbage collection (generations neither current nor pinned, objects no kept generation
//! references, leftovers in `tmp/`) and re-hashing (bad objects go to `quarantine/`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::path::PathBuf;

use mop_cards::Manifest;
use mop_proto::control::VerifyReport;

use super::objects::hash_file;
use super::{Pool, PoolError, io_err};

/// What garbage collection removed, and what the pool holds after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Generations removed.
    pub generations: usize,
    /// Objects removed.
    pub objects: usize,
    /// Bytes the pool uses after collection (hardlinked files counted once), when known
    /// without walking it: the kept generations' objects as their manifests list them,
    /// their own files, and what is in `tmp/` and `quarantine/`.
    pub bytes: Option<u64>,
}

impl Pool {
    /// Removes generations that are neither current nor pinned nor claimed by a live
    /// build (see [`super::Claim`]), objects no remaining generation references, and
    /// leftovers in `tmp/`. `loaded` is a kept generation's manifest the caller holds
    /// already (the one just published), so it is not read and parsed again.
    ///
    /// `replaced` is the generation that was current before it, when the caller holds
    /// its manifest: if it is the only generation removed, only its objects can have lost
    /// their last reference, and they alone are looked at. Otherwise (a leftover, an
    /// unpinned generation, a start) every object is: at 100k cards that walk took about
    /// 100 ms of each sync. Objects a failed fetch left unreferenced wait for such a walk.
    pub fn collect(
        &self,
        pinned: &BTreeSet<String>,
        loaded: Option<(&str, &Manifest)>,
        replaced: Option<(&str, &Manifest)>,
    ) -> Result<GcReport, PoolError> {
        let _lock = self.lock(true)?;
        let mut report = GcReport::default();
        let current = self.current_name();
        let gens = self.paths().gens();
        let mut keep = Vec::new();
        let mut removed = Vec::new();
        for entry in fs::read_dir(&gens).map_err(io_err(&gens))? {
            let entry = entry.map_err(io_err(&gens))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let p = entry.path();
            if Some(&name) == current.as_ref() || pinned.contains(&name) {
                keep.push(name);
                continue;
            }
            match held(&p)? {
                Held::Claimed => keep.push(name),
                // A failed build removed it (under its claim, without the pool's lock).
                Held::Gone => {}
                Held::Free { dir: true } => {
                    fs::remove_dir_all(&p).map_err(io_err(&p))?;
                    report.generations += 1;
                    removed.push(name);
                }
                Held::Free { dir: false } => fs::remove_file(&p).map_err(io_err(&p))?,
            }
        }
        // The kept generations' manifests: the one the caller holds, the others read.
        let mut read = Vec::new();
        for name in &keep {
            if loaded.is_some_and(|(n, _)| n == name) {
                continue;
            }
            match self.generation(name) {
                Ok(g) => read.push(g.manifest),
                // A kept generation we cannot read (or a claimed one whose build has not
                // written its manifest yet): keep every object to be safe.
                Err(_) => return Ok(report),
            }
        }
        // Each referenced object with its size, and the kept generations' own files.
        let kept = loaded.map(|(_, m)| m).into_iter().chain(&read);
        let mut referenced: HashMap<&str, u64> = HashMap::new();
        for m in kept {
            referenced.extend(m.cards.iter().map(|c| (c.sha256.as_str(), c.size)));
        }
        let mut bytes = 0;
        let mut seen = HashSet::new();
        for name in &keep {
            let paths = self.paths().generation(name);
            bytes += files_size(&[paths.manifest()], &[paths.index()], &mut seen);
        }
        let mut remove = |path: PathBuf| -> Result<(), PoolError> {
            match fs::remove_file(&path) {
                Ok(()) => report.objects += 1,
                // Named by two cards of the replaced generation, or never fetched.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
            Ok(())
        };
        match replaced {
            Some((name, m)) if removed.iter().all(|r| r == name) => {
                for c in &m.cards {
                    if !referenced.contains_key(c.sha256.as_str()) {
                        remove(self.object_path(&c.sha256))?;
                    }
                }
            }
            _ => {
                let objects = self.paths().objects();
                for fan in fs::read_dir(&objects).map_err(io_err(&objects))? {
                    let fan = fan.map_err(io_err(&objects))?.path();
                    for obj in fs::read_dir(&fan).map_err(io_err(&fan))? {
                        let obj = obj.map_err(io_err(&fan))?;
                        let name = obj.file_name();
                        if !referenced.contains_key(name.to_string_lossy().as_ref()) {
                            remove(obj.path())?;
                        }
                    }
                }
            }
        }
        let tmp = self.paths().tmp();
        for entry in fs::read_dir(&tmp).map_err(io_err(&tmp))? {
            let p = entry.map_err(io_err(&tmp))?.path();
            let _ = fs::remove_file(&p);
        }
        bytes += referenced.values().sum::<u64>();
        bytes += files_size(
            &[],
            &[self.paths().tmp(), self.paths().quarantine()],
            &mut seen,
        );
        report.bytes = Some(bytes);
        Ok(report)
    }

    /// Re-hashes every object (moving bad ones to `quarantine/`), reads the manifests of
    /// the current and pinned generations, and lists the objects the current one lacks.
    pub fn verify(&self, pinned: &BTreeSet<String>) -> Result<VerifyReport, PoolError> {
        let _lock = self.lock(true)?;
        let mut report = VerifyReport {
            current: self.current_name(),
            ..Default::default()
        };
        let objects = self.paths().objects();
        for fan in fs::read_dir(&objects).map_err(io_err(&objects))? {
            let fan = fan.map_err(io_err(&objects))?.path();
            for obj in fs::read_dir(&fan).map_err(io_err(&fan))? {
                let obj = obj.map_err(io_err(&fan))?.path();
                let name = obj
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                report.objects_checked += 1;
                let ok = hash_file(&obj).is_ok_and(|h| h == name);
                if !ok {
                    let q = self.paths().quarantine().join(format!(
                        "{name}.{}",
                        jiff::Timestamp::now().as_millisecond()
                    ));
                    fs::rename(&obj, &q).map_err(io_err(&obj))?;
                    tracing::warn!(workspace = %self.workspace(), object = %name, "object failed its re-hash; quarantined");
                    report.bad_objects.push(name);
                }
            }
        }
        let mut names: Vec<String> = pinned.iter().cloned().collect();
        names.extend(report.current.clone());
        names.sort();
        names.dedup();
        for name in names {
            let Ok(g) = self.generation(&name) else {
                report
                    .damaged_files
                    .push(format!("gens/{name}/manifest.json"));
                continue;
            };
            // A card's file is its object, re-hashed above (and quarantined if bad).
            for e in &g.manifest.cards {
                if Some(&name) == report.current.as_ref() && !self.has_object(&e.sha256, e.size) {
                    report.missing_objects.push(e.sha256.clone());
                }
            }
        }
        report.missing_objects.sort();
        report.missing_objects.dedup();
        Ok(report)
    }
}

/// What holds an entry of `gens/`.
enum Held {
    /// A live build (its [`super::Claim`]).
    Claimed,
    /// Nothing: a leftover; `dir` is false for anything but a directory (a stray file,
    /// a symlink), which is never followed.
    Free { dir: bool },
    /// It is no longer there.
    Gone,
}

/// Whether a live build holds the entry of `gens/` at `path`.
fn held(path: &std::path::Path) -> Result<Held, PoolError> {
    use nix::errno::Errno;
    use std::os::unix::fs::OpenOptionsExt;
    let flags = nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_NOFOLLOW;
    let opened = fs::OpenOptions::new()
        .read(true)
        // Never blocks on a FIFO planted there.
        .custom_flags((flags | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(path);
    let dir = match opened {
        Ok(dir) => dir,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Held::Gone),
        // ENOTDIR, or ELOOP for a symlink (O_NOFOLLOW).
        Err(e)
            if matches!(
                e.raw_os_error().map(Errno::from_raw),
                Some(Errno::ENOTDIR | Errno::ELOOP)
            ) =>
        {
            return Ok(Held::Free { dir: false });
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    match dir.try_lock() {
        Ok(()) => Ok(Held::Free { dir: true }),
        Err(fs::TryLockError::WouldBlock) => Ok(Held::Claimed),
        Err(fs::TryLockError::Error(e)) => Err(io_err(path)(e)),
    }
}

/// The sizes of `files` and of the files directly in `dirs` (missing ones count 0), each
/// file once however many names it has (generations share index files): `seen` holds
/// the inodes counted so far.
fn files_size(files: &[PathBuf], dirs: &[PathBuf], seen: &mut HashSet<u64>) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let listed = dirs
        .iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path());
    files
        .iter()
        .cloned()
        .chain(listed)
        .filter_map(|p| fs::symlink_metadata(p).ok())
        .filter(|m| seen.insert(m.ino()))
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::super::tests::pool_with_cards;
    use super::*;

    /// With the replaced generation given, collection removes its objects that nothing
    /// else names and leaves the rest of the pool unwalked (a stray object stays); with
    /// anything else removed as well, or nothing given, it walks every object.
    #[test]
    fn a_replaced_generation_s_objects_are_the_ones_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, mut manifest) = pool_with_cards(dir.path(), 4);
        let first_manifest = manifest.clone();
        let first = pool
            .build_generation(std::sync::Arc::new(manifest.clone()), None)
            .unwrap();
        pool.publish(&first).unwrap();
        let dropped = manifest.cards.remove(0);
        manifest.revision = 2;
        let second = pool
            .build_generation(std::sync::Arc::new(manifest.clone()), None)
            .unwrap();
        pool.publish(&second).unwrap();
        // An object no generation names (a fetch whose build failed left it).
        let stray =
            b"---\nid: 00000000-0000-4000-8000-999999999999\ntype: fact\ntitle: S\n---\nS\n";
        let stray_sha = mop_cards::sha256_hex(stray);
        let mut w = pool.new_object(&stray_sha, stray.len() as u64).unwrap();
        w.write(stray).unwrap();
        w.finish().unwrap();
        let report = pool
            .collect(
                &BTreeSet::new(),
                Some((&second, &manifest)),
                Some((&first, &first_manifest)),
            )
            .unwrap();
        assert_eq!((report.generations, report.objects), (1, 1));
        assert!(!pool.has_object(&dropped.sha256, dropped.size));
        assert!(
            pool.has_object(&stray_sha, stray.len() as u64),
            "not walked"
        );
        for c in &manifest.cards {
            assert!(pool.has_object(&c.sha256, c.size), "still named");
        }
        // A leftover besides the replaced generation: every object is looked at.
        let third = pool
            .build_generation(std::sync::Arc::new(manifest.clone()), None)
            .unwrap();
        let report = pool
            .collect(
                &BTreeSet::new(),
                Some((&second, &manifest)),
                Some((&first, &first_manifest)),
            )
            .unwrap();
        assert_eq!((report.generations, report.objects), (1, 1));
        assert!(!pool.paths().generation(&third).dir().exists());
        assert!(!pool.has_object(&stray_sha, stray.len() as u64));
        assert!(pool.verify(&BTreeSet::new()).unwrap().is_clean());
    }

    #[test]
    fn build_publish_collect_keeps_current_and_pinned_only() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, mut manifest) = pool_with_cards(dir.path(), 3);
        let first = pool
            .build_generation(std::sync::Arc::new(manifest.clone()), None)
            .unwrap();
        pool.publish(&first).unwrap();
        assert_eq!(pool.current_name().as_deref(), Some(first.as_str()));
        // A second generation without card 0; the first stays only while pinned.
        let dropped = manifest.cards.remove(0);
        manifest.revision = 2;
        let second = pool
            .build_generation(std::sync::Arc::new(manifest.clone()), None)
            .unwrap();
        pool.publish(&second).unwrap();
        let pinned: BTreeSet<String> = [first.clone()].into();
        let report = pool.collect(&pinned, None, None).unwrap();
        assert_eq!((report.generations, report.objects), (0, 0));
        assert!(pool.has_object(&dropped.sha256, dropped.size), "pinned");
        let report = pool.collect(&BTreeSet::new(), None, None).unwrap();
        assert_eq!(
            report.bytes,
            Some(pool.usage()),
            "measured without walking the pool"
        );
        assert_eq!((report.generations, report.objects), (1, 1));
        assert!(!pool.has_object(&dropped.sha256, dropped.size));
        assert!(pool.generation(&second).is_ok());
        assert!(pool.verify(&BTreeSet::new()).unwrap().is_clean());
    }

    /// A generation a live build holds is not collected, by this pool or by another
    /// opened on its directory (as a second process would); a leftover beside it that no
    /// build holds (a killed daemon's) goes in the same pass; the build then ends intact.
    #[test]
    fn a_generation_being_built_is_not_collected_and_a_leftover_is() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, manifest) = pool_with_cards(dir.path(), 3);
        let manifest = std::sync::Arc::new(manifest);
        // The build waits for its last card's object, as if a fetch were still bringing it.
        let last = manifest.cards[2].sha256.clone();
        let (building, feed) = pool
            .start_generation(manifest.clone(), vec![last.clone()], None, None)
            .unwrap();
        let name = building.name().to_owned();
        let leftover = pool.paths().generation(&format!("{name}-killed"));
        fs::create_dir_all(leftover.index()).unwrap();
        let other = Pool::open(&super::super::tests::paths(dir.path()), "acme").unwrap();
        for collector in [&other, &pool] {
            let report = collector.collect(&BTreeSet::new(), None, None).unwrap();
            assert!(pool.paths().generation(&name).dir().exists(), "claimed");
            assert!(!leftover.dir().exists(), "unclaimed");
            fs::create_dir_all(leftover.index()).unwrap();
            assert_eq!(report.generations, 1);
        }
        // Strays are removed without being opened: a symlink to a generation, a FIFO
        // (which would block an open for reading).
        let gens = pool.paths().gens();
        std::os::unix::fs::symlink(&name, gens.join("link")).unwrap();
        nix::unistd::mkfifo(&gens.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        pool.collect(&BTreeSet::new(), None, None).unwrap();
        assert!(!gens.join("fifo").exists() && fs::symlink_metadata(gens.join("link")).is_err());
        let bytes = fs::read(pool.object_path(&last)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let arrived = super::super::Arrived {
            sha256: last,
            bytes,
        };
        rt.block_on(feed.hand_over(vec![arrived])).unwrap();
        drop(feed);
        let (claim, _) = building.finish().unwrap();
        pool.publish(claim.name()).unwrap();
        drop(claim);
        assert!(pool.verify(&BTreeSet::new()).unwrap().is_clean());
        // Published, it is kept as current; a leftover goes.
        fs::create_dir_all(leftover.index()).unwrap();
        let report = other.collect(&BTreeSet::new(), None, None).unwrap();
        assert_eq!(report.generations, 1);
        assert_eq!(pool.current_name(), Some(name));
    }

    #[test]
    fn verify_quarantines_a_bad_object_and_names_what_is_missing_or_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, manifest) = pool_with_cards(dir.path(), 2);
        let name = pool
            .build_generation(std::sync::Arc::new(manifest.clone()), None)
            .unwrap();
        pool.publish(&name).unwrap();
        let victim = &manifest.cards[1];
        let path = pool.object_path(&victim.sha256);
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        fs::write(&path, b"tampered").unwrap();
        let report = pool.verify(&BTreeSet::new()).unwrap();
        assert_eq!(report.bad_objects, std::slice::from_ref(&victim.sha256));
        assert_eq!(report.missing_objects, std::slice::from_ref(&victim.sha256));
        // The card's file is its object: nothing else of the generation is damaged.
        assert_eq!(report.damaged_files, Vec::<String>::new());
        assert_eq!(fs::read_dir(pool.paths().quarantine()).unwrap().count(), 1);
        // A generation's manifest that does not parse is named.
        let manifest_path = pool.paths().generation(&name).manifest();
        fs::set_permissions(&manifest_path, fs::Permissions::from_mode(0o640)).unwrap();
        fs::write(&manifest_path, b"{").unwrap();
        let report = pool.verify(&BTreeSet::new()).unwrap();
        assert_eq!(report.damaged_files, [format!("gens/{name}/manifest.json")]);
    }
}
