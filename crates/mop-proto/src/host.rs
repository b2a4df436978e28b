//! Host facts that the runner and the daemon must agree on: which `bwrap` to trust, so
//! that `mopd status` reports the very one `mop run` would use; and a process's start
//! time, which names a `mop run` lease's runner beside its (recyclable) pid.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Finds a `bwrap` that can be trusted: absolute, not inside the working directory (when
/// one is given), owned by root and writable by nobody else. `MOP_BWRAP` names one
/// explicitly.
pub fn find_bwrap(workdir: Option<&Path>) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match std::env::var_os("MOP_BWRAP") {
        Some(p) => vec![PathBuf::from(p)],
        None => std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join("bwrap")).collect())
            .unwrap_or_default(),
    };
    trusted_bwrap(candidates, workdir)
}

/// The first trustworthy of `candidates` (see [`find_bwrap`]).
fn trusted_bwrap(candidates: Vec<PathBuf>, workdir: Option<&Path>) -> Result<PathBuf, String> {
    let mut refused = Vec::new();
    for c in candidates {
        if !c.is_absolute() {
            refused.push(format!(
                "{}: relative PATH entries are ignored",
                c.display()
            ));
            continue;
        }
        let Ok(real) = std::fs::canonicalize(&c) else {
            continue;
        };
        if workdir.is_some_and(|w| real.starts_with(w) || c.starts_with(w)) {
            refused.push(format!("{}: inside the working directory", c.display()));
            continue;
        }
        let Ok(meta) = std::fs::metadata(&real) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            refused.push(format!(
                "{}: not owned by root, or writable by others",
                c.display()
            ));
            continue;
        }
        return Ok(real);
    }
    if refused.is_empty() {
        Err("bwrap is not installed (not found on PATH) → apt-get install bubblewrap (or dnf install bubblewrap), then: mop doctor".into())
    } else {
        Err(format!(
            "no trustworthy bwrap: refused {} → install bubblewrap system-wide (apt-get install bubblewrap)",
            refused.join("; ")
        ))
    }
}

/// The start time of a `/proc/<pid>/stat` line (field 22, clock ticks since boot).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse().ok()
}

/// This process's start time, as a `mop run` lease names it.
pub fn own_start_time() -> std::io::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    parse_start_time(&stat).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "/proc/self/stat has no start time",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bwrap_in_the_working_directory_or_writable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("bwrap");
        std::fs::write(&fake, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o777)).unwrap();
        let inside = trusted_bwrap(vec![fake.clone()], Some(dir.path())).unwrap_err();
        assert!(inside.contains("inside the working directory"), "{inside}");
        let writable = trusted_bwrap(vec![fake], None).unwrap_err();
        assert!(writable.contains("writable by others"), "{writable}");
        let relative = trusted_bwrap(vec![PathBuf::from("bin/bwrap")], None).unwrap_err();
        assert!(relative.contains("relative"), "{relative}");
        assert!(
            trusted_bwrap(vec![], None)
                .unwrap_err()
                .contains("not installed")
        );
    }

    #[test]
    fn start_times_parse() {
        let stat = "42 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19";
        assert_eq!(parse_start_time(stat), Some(777));
        assert_eq!(parse_start_time("garbage"), None);
        assert!(own_start_time().unwrap() > 0);
    }
}
