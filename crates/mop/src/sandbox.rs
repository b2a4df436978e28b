//! Turning a plan into a bubblewrap command line, and the host checks around it: which
//! `bwrap` to trust, how the host's system directories look, and the sandbox's
//! environment. (The working directory's own checks are in [`crate::workdir`].)
//!
//! [`bwrap_args`] is a pure function of its inputs, so the exact argument list is unit
//! tested; the end-to-end tests run it against the real kernel.

use std::ffi::OsString;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use mop_proto::Profile;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;

use mop_proto::inside;
use mop_proto::inside::{AGENT_DIR, BIN_DIR, MEMORY_DIR, env};

/// How one host system path appears in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    /// Mounted read-only at the same place.
    RoBind(PathBuf),
    /// A symlink, as on merged-/usr hosts (`/bin -> usr/bin`).
    Symlink {
        /// Link target.
        target: PathBuf,
        /// Link path.
        path: PathBuf,
    },
}

/// The host's layout for a profile: its `ro_paths` that exist, then `/bin`, `/sbin`,
/// `/lib`, `/lib32`, `/lib64`, `/libx32` as symlinks or binds matching the host.
pub fn system_layout(profile: &Profile) -> Vec<SystemEntry> {
    let mut out: Vec<SystemEntry> = profile
        .ro_paths
        .iter()
        .filter(|p| p.exists())
        .map(|p| SystemEntry::RoBind(p.clone()))
        .collect();
    for dir in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        let p = Path::new(dir);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(p) {
                    out.push(SystemEntry::Symlink {
                        target,
                        path: p.to_owned(),
                    });
                }
            }
            Ok(m) if m.is_dir() && !profile.ro_paths.iter().any(|r| r == p) => {
                out.push(SystemEntry::RoBind(p.to_owned()))
            }
            _ => {}
        }
    }
    out
}

/// Everything `bwrap_args` needs.
pub struct Spec<'a> {
    /// The resolved profile.
    pub profile: &'a Profile,
    /// Host layout for it.
    pub system: &'a [SystemEntry],
    /// Working directory (absolute, canonical), bound read-write at the same place.
    pub workdir: &'a Path,
    /// O_PATH descriptor of the working directory that was checked (`--bind-fd`).
    pub workdir_fd: RawFd,
    /// O_PATH descriptors of the task's view: one for [`MEMORY_DIR`], one for the
    /// profile's memory dir inside the working directory (bwrap closes each after use).
    pub view_fds: [RawFd; 2],
    /// O_PATH descriptor of the agent socket's directory.
    pub socket_dir_fd: RawFd,
    /// O_PATH descriptor of the directory the agent CLI's own memory is captured in,
    /// bound read-write at [`inside::CAPTURE_DIR`].
    pub capture_fd: Option<RawFd>,
    /// Write end of the status pipe (`--json-status-fd`).
    pub status_fd: RawFd,
    /// Read end of the seccomp pipe (`--seccomp`): the filter, completed by `mop run` once
    /// the plan arrived (see [`crate::confine`]).
    pub seccomp_fd: RawFd,
    /// This `mop` binary, bound in as `/run/mop/bin/mop`.
    pub mop_exe: &'a Path,
    /// `--new-session` (TIOCSTI protection).
    pub new_session: bool,
    /// Directories to create for the agent's priming files (parents first).
    pub primed_dirs: &'a [PathBuf],
    /// The priming files: a descriptor bwrap copies from (`--file`), and the path.
    pub primed_files: &'a [(RawFd, PathBuf)],
    /// The command and its arguments.
    pub command: &'a [OsString],
}

/// The bwrap argument list for a task. The environment is not in it: `mop run` starts
/// bwrap with exactly the sandbox's environment, which bwrap passes on. Why: a command line
/// is readable by every local user in `/proc/<pid>/cmdline`, and the environment carries
/// what the runner passed (`--env ANTHROPIC_API_KEY`); `/proc/<pid>/environ` is its owner's.
pub fn bwrap_args(s: &Spec<'_>) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
        for i in items {
            a.push(i.as_ref().to_owned());
        }
    };
    push(&[
        &"--unshare-user",
        &"--unshare-pid",
        &"--unshare-ipc",
        &"--unshare-uts",
        &"--unshare-cgroup-try",
    ]);
    if !s.profile.network {
        push(&[&"--unshare-net"]);
    }
    push(&[&"--die-with-parent"]);
    if s.new_session {
        push(&[&"--new-session"]);
    }
    push(&[&"--cap-drop", &"ALL"]);
    if !s.profile.nesting {
        push(&[&"--disable-userns"]);
    }
    push(&[
        &"--proc", &"/proc", &"--dev", &"/dev", &"--tmpfs", &"/tmp", &"--tmpfs", &"/run",
    ]);
    for e in s.system {
        match e {
            SystemEntry::RoBind(p) => push(&[&"--ro-bind", p, p]),
            SystemEntry::Symlink { target, path } => push(&[&"--symlink", target, path]),
        }
    }
    for b in &s.profile.binds {
        if b.optional && !b.source.exists() {
            continue;
        }
        let dest = b.dest.as_ref().unwrap_or(&b.source);
        let flag = if b.writable { "--bind" } else { "--ro-bind" };
        push(&[&flag, &b.source, dest]);
    }
    let memory = s.workdir.join(&s.profile.memory_dir);
    let fd = |n: RawFd| n.to_string();
    let mop_in = Path::new(inside::MOP);
    push(&[&"--bind-fd", &fd(s.workdir_fd), &s.workdir]);
    push(&[&"--ro-bind-fd", &fd(s.view_fds[0]), &MEMORY_DIR]);
    push(&[&"--ro-bind-fd", &fd(s.view_fds[1]), &memory]);
    push(&[&"--ro-bind-fd", &fd(s.socket_dir_fd), &AGENT_DIR]);
    push(&[&"--ro-bind", &s.mop_exe, &mop_in]);
    push(&[&"--dir", &inside::SAVED_DIR]);
    if let Some(c) = s.capture_fd {
        push(&[&"--bind-fd", &fd(c), &inside::CAPTURE_DIR]);
    }
    for d in s.primed_dirs {
        push(&[&"--dir", d]);
    }
    for (f, path) in s.primed_files {
        push(&[&"--file", &fd(*f), path]);
    }
    push(&[&"--chdir", &s.workdir]);
    push(&[&"--json-status-fd", &fd(s.status_fd)]);
    push(&[&"--seccomp", &fd(s.seccomp_fd)]);
    push(&[&"--"]);
    for c in s.command {
        push(&[c]);
    }
    a
}

/// The sandbox's environment: the profile's allowlist copied from the runner, explicit
/// `--env NAME` / `--env NAME=VALUE`, and mop's own variables.
pub fn sandbox_env(
    profile: &Profile,
    runner: &[(String, String)],
    explicit: &[String],
    task_id: &str,
    workdir: &Path,
) -> Result<Vec<(String, String)>, String> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| {
        env.retain(|(x, _)| x != k);
        env.push((k.to_owned(), v));
    };
    let get = |k: &str| runner.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone());
    for name in &profile.env_allow {
        if let Some(v) = get(name) {
            set(name, v);
        }
    }
    for e in explicit {
        match e.split_once('=') {
            Some((k, v)) if valid_name(k) => set(k, v.to_owned()),
            None if valid_name(e) => {
                if let Some(v) = get(e) {
                    set(e, v);
                }
            }
            _ => return Err(format!("--env {e:?}: expected NAME or NAME=VALUE")),
        }
    }
    let path = get("PATH")
        .filter(|_| profile.env_allow.iter().any(|n| n == "PATH"))
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    set("PATH", format!("{BIN_DIR}:{path}"));
    set("HOME", workdir.display().to_string());
    set(env::AGENT_SOCKET, inside::AGENT_SOCKET.to_owned());
    set(env::TASK_ID, task_id.to_owned());
    set(env::WORKDIR, workdir.display().to_string());
    set(env::MEMORY_DIR, MEMORY_DIR.to_owned());
    set(env::MEMORY_MD, inside::MEMORY_MD.to_owned());
    set(env::SAVED_DIR, inside::SAVED_DIR.to_owned());
    Ok(env)
}

fn valid_name(k: &str) -> bool {
    !k.is_empty()
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !k.starts_with(|c: char| c.is_ascii_digit())
}

/// Opens a directory for `--ro-bind-fd`: `O_PATH|O_NOFOLLOW|O_DIRECTORY`, so a symlink is
/// refused rather than followed.
pub fn open_dir(path: &Path) -> Result<OwnedFd, String> {
    open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        format!(
            "cannot open {} as a directory (symlinks are refused): {e}",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(network: bool, nesting: bool) -> Profile {
        let mut p = Profile::parse("t", Path::new("t.toml"), "").unwrap();
        p.network = network;
        p.nesting = nesting;
        p.ro_paths = vec!["/usr".into()];
        p
    }

    fn spec_args(p: &Profile, new_session: bool) -> Vec<String> {
        let system = vec![
            SystemEntry::RoBind("/usr".into()),
            SystemEntry::Symlink {
                target: "usr/bin".into(),
                path: "/bin".into(),
            },
        ];
        let command = vec![OsString::from("/bin/true"), OsString::from("--x")];
        bwrap_args(&Spec {
            profile: p,
            system: &system,
            workdir: Path::new("/w"),
            workdir_fd: 4,
            view_fds: [5, 9],
            socket_dir_fd: 6,
            capture_fd: Some(11),
            status_fd: 7,
            seccomp_fd: 8,
            mop_exe: Path::new("/usr/bin/mop"),
            new_session,
            primed_dirs: &["/run/mop/home".into()],
            primed_files: &[(10, "/run/mop/home/.claude.json".into())],
            command: &command,
        })
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect()
    }

    #[test]
    fn the_full_argument_list() {
        let args = spec_args(&profile(true, false), true).join(" ");
        assert_eq!(
            args,
            "--unshare-user --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup-try \
             --die-with-parent --new-session --cap-drop ALL --disable-userns --proc /proc --dev /dev --tmpfs /tmp --tmpfs /run \
             --ro-bind /usr /usr --symlink usr/bin /bin --bind-fd 4 /w --ro-bind-fd 5 /run/mop/memory \
             --ro-bind-fd 9 /w/.claude/memory --ro-bind-fd 6 /run/mop/agent \
             --ro-bind /usr/bin/mop /run/mop/bin/mop --dir /run/mop/saved --bind-fd 11 /run/mop/capture --dir /run/mop/home \
             --file 10 /run/mop/home/.claude.json --chdir /w --json-status-fd 7 --seccomp 8 \
             -- /bin/true --x"
        );
    }

    #[test]
    fn profile_switches() {
        let offline = spec_args(&profile(false, false), true);
        assert!(offline.contains(&"--unshare-net".to_owned()));
        let nested = spec_args(&profile(true, true), true);
        assert!(!nested.contains(&"--disable-userns".to_owned()));
        let interactive = spec_args(&profile(true, false), false);
        assert!(!interactive.contains(&"--new-session".to_owned()));
    }

    #[test]
    fn environment_is_the_allowlist_plus_mops_own() {
        let p = profile(true, false);
        let runner: Vec<(String, String)> = [
            ("PATH", "/usr/bin"),
            ("LANG", "C.UTF-8"),
            ("SECRET", "x"),
            ("FOO", "bar"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let env = sandbox_env(
            &p,
            &runner,
            &["FOO".into(), "EXTRA=1".into()],
            "t-1",
            Path::new("/w"),
        )
        .unwrap();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert!(!names.contains(&"SECRET"));
        for n in [
            "PATH",
            "LANG",
            "FOO",
            "EXTRA",
            "HOME",
            "MOP_AGENT_SOCKET",
            "MOP_TASK_ID",
            "MOP_WORKDIR",
            "MOP_MEMORY_MD",
            "MOP_SAVED_DIR",
        ] {
            assert!(names.contains(&n), "{n} missing: {names:?}");
        }
        assert_eq!(
            env.iter().find(|(k, _)| k == "PATH").unwrap().1,
            "/run/mop/bin:/usr/bin"
        );
        assert!(sandbox_env(&p, &runner, &["A B".into()], "t", Path::new("/w")).is_err());
    }
}
