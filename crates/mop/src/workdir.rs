//! The working directory of a `mop run`, claimed before the sandbox starts.
//!
//! The sandbox binds the working directory read-write and shows the task's memory view
//! inside it (`<workdir>/.claude/memory`). Whoever else can write that directory could
//! rename `.claude` during the run and plant a forged `.claude/memory`, so `mop run`:
//!
//! - refuses a working directory, or a directory on the way to the memory directory, that
//!   the runner does not own or that group or others may write (a profile with
//!   `shared_workdir = true` turns the refusal into a warning, for shared checkouts);
//! - refuses symlinks on the way to the memory directory, creating what is missing;
//! - allows one live task per working directory, and none in a directory inside another
//!   task's: it holds an exclusive `flock` on the working directory and a shared one on
//!   every directory above it for as long as it runs (the kernel drops them when it
//!   exits, however it exits);
//! - hands bwrap the directory it checked, as a descriptor (`--bind-fd`), so a rename of
//!   the path in between cannot put another directory in its place.
//!
//! The view is also mounted at `/run/mop/memory`, inside the sandbox's own `/run`, where no
//! writer of the working directory can replace it.

use std::os::fd::OwnedFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag, open, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};

/// A claimed working directory: checked, locked, and open for bwrap.
pub struct Workdir {
    /// An `O_PATH` descriptor of the directory that was checked, for `--bind-fd`.
    pub dir: OwnedFd,
    /// Held until `mop run` exits.
    _locks: Vec<Flock<OwnedFd>>,
    /// Warnings to show (a shared working directory allowed by the profile).
    pub warnings: Vec<String>,
    /// What an earlier run left where agents look for memory (see [`leftovers`]).
    pub leftovers: Vec<String>,
}

fn is(st: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == kind
}

/// Why `st` is not safe as the runner's own directory, if it is not.
fn unsafe_owner(st: &FileStat, uid: u32) -> Option<String> {
    if st.st_uid != uid {
        return Some(format!(
            "it belongs to uid {}, not to you (uid {uid})",
            st.st_uid
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Some(format!(
            "group or others may write it (mode {:o})",
            st.st_mode & 0o7777
        ));
    }
    None
}

impl Workdir {
    /// Claims `path` (absolute and canonical) for a task whose view appears at
    /// `memory_dir` inside it.
    pub fn claim(path: &Path, memory_dir: &str, shared: bool) -> Result<Workdir, String> {
        let uid = nix::unistd::geteuid().as_raw();
        let mut warnings = Vec::new();
        let mut check = |shown: &Path, st: &FileStat| -> Result<(), String> {
            let Some(why) = unsafe_owner(st, uid) else {
                return Ok(());
            };
            if shared {
                warnings.push(format!(
                    "{} is shared ({why}); the profile allows it (shared_workdir), but another writer could \
                     swap files the agent reads there. The memory view itself is also at /run/mop/memory, \
                     where nobody can replace it",
                    shown.display()
                ));
                Ok(())
            } else {
                Err(format!(
                    "refusing working directory {}: {why}. Another user or task could then replace the \
                     memory view during the run. Use a directory of your own (chmod go-w), or a profile \
                     with shared_workdir = true for shared checkouts",
                    shown.display()
                ))
            }
        };
        let dir = open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open working directory {}: {e}", path.display()))?;
        let st = fstat(&dir).map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
        check(path, &st)?;
        let bind = open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open working directory {}: {e}", path.display()))?;
        if fstat(&bind).map(|b| (b.st_dev, b.st_ino)) != Ok((st.st_dev, st.st_ino)) {
            return Err(format!(
                "working directory {} changed while it was checked; try again",
                path.display()
            ));
        }
        let mut locks = Vec::new();
        let busy = |what: String| {
            format!(
                "{what}: one live task per working directory, and none inside another task's; wait for \
                 it to end, or use another directory"
            )
        };
        locks.push(Flock::lock(dir, FlockArg::LockExclusiveNonblock).map_err(
            |(_, e)| match e {
                Errno::EWOULDBLOCK => busy(format!(
                    "another live task runs in {} or in a directory inside it",
                    path.display()
                )),
                e => format!("cannot lock working directory {}: {e}", path.display()),
            },
        )?);
        for above in path.ancestors().skip(1) {
            // A directory we may not read is no task's working directory of ours.
            let Ok(fd) = open(
                above,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            locks.push(Flock::lock(fd, FlockArg::LockSharedNonblock).map_err(
                |(_, e)| match e {
                    Errno::EWOULDBLOCK => busy(format!(
                        "a live task runs in {}, which contains {}",
                        above.display(),
                        path.display()
                    )),
                    e => format!("cannot lock {}: {e}", above.display()),
                },
            )?);
        }
        prepare_memory_dir(&bind, path, memory_dir, &mut check)?;
        let leftovers = leftovers(&bind, memory_dir);
        Ok(Workdir {
            dir: bind,
            _locks: locks,
            warnings,
            leftovers,
        })
    }
}

/// Makes sure `<workdir>/<memory_dir>` is a chain of real directories (creating missing
/// ones) and refuses a symlink along it, or a directory `check` rejects: a symlinked or
/// foreign `.claude` could otherwise point the read-only view's mount somewhere else.
fn prepare_memory_dir(
    workdir: &OwnedFd,
    shown_workdir: &Path,
    memory_dir: &str,
    check: &mut impl FnMut(&Path, &FileStat) -> Result<(), String>,
) -> Result<(), String> {
    let mut dir = openat(
        workdir,
        ".",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open {}: {e}", shown_workdir.display()))?;
    let mut shown = shown_workdir.to_owned();
    for comp in Path::new(memory_dir).components() {
        let name = comp.as_os_str();
        shown.push(name);
        match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if is(&st, SFlag::S_IFLNK) => {
                return Err(format!(
                    "refusing {}: it is a symlink; the memory directory must be a real directory inside the working directory",
                    shown.display()
                ));
            }
            Ok(st) if !is(&st, SFlag::S_IFDIR) => {
                return Err(format!(
                    "refusing {}: it is not a directory",
                    shown.display()
                ));
            }
            Ok(st) => check(&shown, &st)?,
            Err(Errno::ENOENT) => {
                mkdirat(&dir, name, Mode::from_bits_truncate(0o755))
                    .map_err(|e| format!("cannot create {}: {e}", shown.display()))?;
            }
            Err(e) => return Err(format!("cannot inspect {}: {e}", shown.display())),
        }
        dir = openat(
            &dir,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open {}: {e}", shown.display()))?;
    }
    Ok(())
}

/// The paths of the working directory where agents look for memory by habit, relative to
/// it: the old save directory `.memory/` (mop saves copies in the sandbox's own
/// `/run/mop/saved` now, so nothing there is a copy mop made), an index at the top, and the
/// profile's memory directory (the view covers it during a run; on disk it stays empty).
/// Each that holds something, as a line for the runner: nothing there is memory mop
/// delivered, whatever it claims, and a task could have left it for the next one.
pub fn leftovers(workdir: &OwnedFd, memory_dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    for path in [".memory", "MEMORY.md", memory_dir] {
        let Ok(st) = fstatat(workdir, path, AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        if !is(&st, SFlag::S_IFDIR) {
            out.push(format!("{path} (a file)"));
            continue;
        }
        let Ok(fd) = openat(
            workdir,
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Ok(mut dir) = nix::dir::Dir::from_fd(fd) else {
            continue;
        };
        let mut names: Vec<String> = dir
            .iter()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "." && n != "..")
            .collect();
        if names.is_empty() {
            continue;
        }
        names.sort();
        let shown: Vec<String> = names.iter().take(5).map(|n| format!("{n:?}")).collect();
        out.push(format!(
            "{path}/ holds {} entr{}: {}{}",
            names.len(),
            if names.len() == 1 { "y" } else { "ies" },
            shown.join(", "),
            if names.len() > shown.len() {
                ", …"
            } else {
                ""
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn private_dir() -> tempfile::TempDir {
        let w = tempfile::tempdir().unwrap();
        std::fs::set_permissions(w.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        w
    }

    #[test]
    fn memory_dir_symlinks_are_refused_and_missing_dirs_made() {
        let w = private_dir();
        Workdir::claim(w.path(), ".claude/memory", false).unwrap();
        assert!(w.path().join(".claude/memory").is_dir());
        let w2 = private_dir();
        std::os::unix::fs::symlink("/tmp", w2.path().join(".claude")).unwrap();
        let err = Workdir::claim(w2.path(), ".claude/memory", false)
            .err()
            .unwrap();
        assert!(err.contains("symlink"), "{err}");
        let w3 = private_dir();
        std::fs::create_dir(w3.path().join(".claude")).unwrap();
        std::os::unix::fs::symlink("/etc", w3.path().join(".claude/memory")).unwrap();
        let err = Workdir::claim(w3.path(), ".claude/memory", false)
            .err()
            .unwrap();
        assert!(err.contains("symlink"), "{err}");
    }

    #[test]
    fn writable_by_others_is_refused_unless_the_profile_shares_it() {
        let w = private_dir();
        std::fs::set_permissions(w.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = Workdir::claim(w.path(), ".claude/memory", false)
            .err()
            .unwrap();
        assert!(
            err.contains("group or others may write it") && err.contains("shared_workdir"),
            "{err}"
        );
        let shared = Workdir::claim(w.path(), ".claude/memory", true).unwrap();
        assert_eq!(shared.warnings.len(), 1, "{:?}", shared.warnings);
        drop(shared);
        // A writable .claude inside a private directory is refused too.
        let w = private_dir();
        std::fs::create_dir(w.path().join(".claude")).unwrap();
        std::fs::set_permissions(
            w.path().join(".claude"),
            std::fs::Permissions::from_mode(0o775),
        )
        .unwrap();
        let err = Workdir::claim(w.path(), ".claude/memory", false)
            .err()
            .unwrap();
        assert!(err.contains(".claude"), "{err}");
    }

    #[test]
    fn one_task_per_directory_and_none_nested() {
        let w = private_dir();
        let inner = w.path().join("sub");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
        let sibling = w.path().join("other");
        std::fs::create_dir(&sibling).unwrap();
        std::fs::set_permissions(&sibling, std::fs::Permissions::from_mode(0o755)).unwrap();

        let first = Workdir::claim(&inner, ".claude/memory", false).unwrap();
        let again = Workdir::claim(&inner, ".claude/memory", false)
            .err()
            .unwrap();
        assert!(
            again.contains("one live task per working directory"),
            "{again}"
        );
        let outer = Workdir::claim(w.path(), ".claude/memory", false)
            .err()
            .unwrap();
        assert!(outer.contains("inside it"), "{outer}");
        // Control: a sibling directory is free.
        let side = Workdir::claim(&sibling, ".claude/memory", false).unwrap();
        drop(side);
        drop(first);
        // Once the first task is gone, the outer directory is free too.
        Workdir::claim(w.path(), ".claude/memory", false).unwrap();
        let below = inner.join("deeper");
        std::fs::create_dir(&below).unwrap();
        std::fs::set_permissions(&below, std::fs::Permissions::from_mode(0o755)).unwrap();
        let outer = Workdir::claim(w.path(), ".claude/memory", false).unwrap();
        let nested = Workdir::claim(&below, ".claude/memory", false)
            .err()
            .unwrap();
        assert!(nested.contains("which contains"), "{nested}");
        drop(outer);
    }
}
