//! Garbage collection (generations neither current nor pinned, objects no kept generation
//! references, leftovers in `tmp/`) and re-hashing (bad objects go to `quarantine/`).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::PathBuf;

use mop_cards::{Manifest, card_path};
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
    /// Removes generations that are neither current nor pinned, objects no remaining
    /// generation references, and leftovers in `tmp/`. `loaded` is a kept generation's
    /// manifest the caller holds already (the one just published), so it is not read and
    /// parsed again.
    pub fn collect(
        &self,
        pinned: &BTreeSet<String>,
        loaded: Option<(&str, &Manifest)>,
    ) -> Result<GcReport, PoolError> {
        let _lock = self.lock(true)?;
        let mut report = GcReport::default();
        let current = self.current_name();
        let gens = self.paths().gens();
        let mut keep = Vec::new();
        for entry in fs::read_dir(&gens).map_err(io_err(&gens))? {
            let entry = entry.map_err(io_err(&gens))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if Some(&name) == current.as_ref() || pinned.contains(&name) {
                keep.push(name);
            } else {
                let p = entry.path();
                fs::remove_dir_all(&p).map_err(io_err(&p))?;
                report.generations += 1;
            }
        }
        // Each referenced object with its size, and the kept generations' own files.
        let mut referenced: HashMap<String, u64> = HashMap::new();
        let mut bytes = 0;
        for name in &keep {
            let from_disk;
            let manifest = match loaded {
                Some((n, m)) if n == name => m,
                _ => match self.generation(name) {
                    Ok(g) => {
                        from_disk = g.manifest;
                        &from_disk
                    }
                    // A kept generation we cannot read: keep every object to be safe.
                    Err(_) => return Ok(report),
                },
            };
            referenced.extend(manifest.cards.iter().map(|c| (c.sha256.clone(), c.size)));
            let paths = self.paths().generation(name);
            bytes += files_size(&[paths.manifest()], &[paths.index()]);
        }
        let objects = self.paths().objects();
        for fan in fs::read_dir(&objects).map_err(io_err(&objects))? {
            let fan = fan.map_err(io_err(&objects))?.path();
            for obj in fs::read_dir(&fan).map_err(io_err(&fan))? {
                let obj = obj.map_err(io_err(&fan))?;
                let name = obj.file_name().to_string_lossy().into_owned();
                if !referenced.contains_key(&name) {
                    fs::remove_file(obj.path()).map_err(io_err(&obj.path()))?;
                    report.objects += 1;
                }
            }
        }
        let tmp = self.paths().tmp();
        for entry in fs::read_dir(&tmp).map_err(io_err(&tmp))? {
            let p = entry.map_err(io_err(&tmp))?.path();
            let _ = fs::remove_file(&p);
        }
        bytes += referenced.values().sum::<u64>();
        bytes += files_size(&[], &[self.paths().tmp(), self.paths().quarantine()]);
        report.bytes = Some(bytes);
        Ok(report)
    }

    /// Re-hashes every object (moving bad ones to `quarantine/`) and every file of the
    /// current and pinned generations.
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
            for e in &g.manifest.cards {
                let rel = card_path(e.summary.card_type, &e.summary.id);
                let file = g.tree().join(&rel);
                if !hash_file(&file).is_ok_and(|h| h == e.sha256) {
                    report.damaged_files.push(format!("gens/{name}/tree/{rel}"));
                }
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

/// The sizes of `files` and of the files directly in `dirs` (missing ones count 0).
fn files_size(files: &[PathBuf], dirs: &[PathBuf]) -> u64 {
    let size = |p: &std::path::Path| fs::symlink_metadata(p).map_or(0, |m| m.len());
    let listed = dirs
        .iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten());
    files.iter().map(|f| size(f)).sum::<u64>() + listed.map(|e| size(&e.path())).sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::super::tests::pool_with_cards;
    use super::*;

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
        let report = pool.collect(&pinned, None).unwrap();
        assert_eq!((report.generations, report.objects), (0, 0));
        assert!(pool.has_object(&dropped.sha256, dropped.size), "pinned");
        let report = pool.collect(&BTreeSet::new(), None).unwrap();
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

    #[test]
    fn verify_quarantines_a_bad_object_and_names_the_damaged_file() {
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
        assert_eq!(report.damaged_files.len(), 1, "{report:?}");
        assert_eq!(fs::read_dir(pool.paths().quarantine()).unwrap().count(), 1);
    }
}
