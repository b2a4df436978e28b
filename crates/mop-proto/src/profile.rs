//! Sandbox profiles (`bwrap-profiles/*.toml`): what a task's sandbox shares with the host.
//!
//! The daemon loads them, fills in defaults and refuses a profile that would expose mop's
//! own directories (cache, state, runtime, config): a bind of such a directory, of anything
//! inside it, or of any directory containing it (`/`, `/var`, `/run`, `/etc` …). The
//! runner applies the resolved profile it receives in the plan.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// An extra bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bind {
    /// Host path.
    pub source: PathBuf,
    /// Path inside the sandbox (defaults to `source`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest: Option<PathBuf>,
    /// Read-write instead of read-only.
    #[serde(default)]
    pub writable: bool,
    /// Skip silently when the source does not exist.
    #[serde(default)]
    pub optional: bool,
}

/// A sandbox profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Its name (the file stem).
    #[serde(default)]
    pub name: String,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    /// Share the host's network; false gives the sandbox only a loopback interface.
    #[serde(default = "yes")]
    pub network: bool,
    /// Where the task's memory view appears, relative to the working directory.
    #[serde(default = "default_memory_dir")]
    pub memory_dir: String,
    /// Host paths mounted read-only at the same place, when they exist. `/bin`, `/lib`
    /// and friends are added as symlinks or binds to match the host.
    #[serde(default = "default_ro_paths")]
    pub ro_paths: Vec<PathBuf>,
    /// Environment variables passed through from the runner.
    #[serde(default = "default_env")]
    pub env_allow: Vec<String>,
    /// Extra binds.
    #[serde(default)]
    pub binds: Vec<Bind>,
    /// TCP ports a sandbox sharing the host's network may listen on, besides the ones the
    /// kernel picks (a bind to port 0). Every other port is refused (Landlock ABI 4), so
    /// that an agent cannot take mop-server's or mopd's port while either restarts.
    #[serde(default)]
    pub bind_ports: Vec<u16>,
    /// Allow user namespaces inside the sandbox (otherwise `--disable-userns`).
    #[serde(default)]
    pub nesting: bool,
    /// Run in a working directory that others may write (a shared checkout): `mop run`
    /// then warns instead of refusing. Off: the working directory and the memory
    /// directory's parents must be the runner's own and writable by nobody else.
    #[serde(default)]
    pub shared_workdir: bool,
    /// Resource limits applied inside the sandbox.
    #[serde(default)]
    pub limits: Limits,
    /// The agent CLI tasks of this profile run, so that `mop run` writes the files it
    /// loads (`mop run --agent` overrides it).
    #[serde(default)]
    pub agent: AgentKind,
    /// What `mop run` captures at a task's end: the agent CLI's own memory, and the
    /// working directory's memory files.
    #[serde(default)]
    pub capture: CaptureSettings,
}

/// A profile's `[capture]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureSettings {
    /// On (the default): `mop run --agent claude` turns Claude Code's auto memory on, into
    /// a directory private to the task, and stores what it wrote there as the task's
    /// stores at the end. Off (or `mop run --no-capture`): the CLI's own memory is turned
    /// off for the task, so nothing is written only to be lost.
    #[serde(default = "yes")]
    pub native_memory: bool,
    /// The task's edits to the working directory's `CLAUDE.md`, `CLAUDE.local.md` and
    /// `AGENTS.md`: `report` (the default) says so at exit and in the receipt; `propose`
    /// also proposes each new or changed section as a card. The files stay the runner's.
    #[serde(default)]
    pub workdir_memory: WorkdirMemory,
}

impl Default for CaptureSettings {
    fn default() -> Self {
        CaptureSettings {
            native_memory: true,
            workdir_memory: WorkdirMemory::Report,
        }
    }
}

/// What `mop run` does with a task's edits to the working directory's memory files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkdirMemory {
    /// Say which files changed, at exit and in the receipt.
    #[default]
    Report,
    /// That, and propose their new sections as cards.
    Propose,
}

/// Which agent CLI a task runs: it decides what `mop run` writes into the sandbox's
/// private home for the agent to load (see `mop-agent`'s `prime`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// Any program: `MOP_MEMORY_MD` in the environment, nothing written; `mop prime`
    /// prints the instructions for a runner that builds its own prompt.
    #[default]
    Generic,
    /// Claude Code: a user-level `CLAUDE.md` importing the task's `MEMORY.md`, and
    /// `mop mcp` in its MCP configuration.
    Claude,
    /// Codex CLI: `AGENTS.md`, and `mop mcp` in its `config.toml`.
    Codex,
}

impl AgentKind {
    /// Every kind, as profiles and `--agent` spell them.
    pub const NAMES: [&'static str; 3] = ["generic", "claude", "codex"];

    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            AgentKind::Generic => "generic",
            AgentKind::Claude => "claude",
            AgentKind::Codex => "codex",
        }
    }
}

impl std::str::FromStr for AgentKind {
    type Err = String;

    fn from_str(s: &str) -> Result<AgentKind, String> {
        match s {
            "generic" => Ok(AgentKind::Generic),
            "claude" => Ok(AgentKind::Claude),
            "codex" => Ok(AgentKind::Codex),
            _ => Err(format!(
                "unknown agent {s:?}: expected one of {}",
                AgentKind::NAMES.join(", ")
            )),
        }
    }
}

/// `[limits]` of a profile: resource limits set (soft and hard) on the sandbox's
/// processes. An absent key takes its default ([`Limits::effective`]), so every sandbox
/// is bounded; a profile raises one by naming a larger value. None goes above the
/// runner's own hard limit, which only root can raise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Most processes of the runner's user (`RLIMIT_NPROC`; the kernel counts them per
    /// user, the sandbox's included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nproc: Option<u64>,
    /// Most virtual memory per process, in bytes (`RLIMIT_AS`). Unset by default: it
    /// counts reservations that use no memory (a JavaScript runtime's WebAssembly memories
    /// reserve gigabytes each), so `data_bytes` bounds memory instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_space_bytes: Option<u64>,
    /// Most writable private memory (heap and data) per process, in bytes (`RLIMIT_DATA`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_bytes: Option<u64>,
    /// Most open files per process (`RLIMIT_NOFILE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
}

impl Limits {
    /// `nproc` when a profile names none. The kernel counts every process and thread of
    /// the runner's user on the host against it, not the sandbox's alone, so it is set
    /// where a busy runner never meets it and a fork bomb still stops (the host allows
    /// some 96,000 otherwise). A pids cgroup (`systemd-run --scope -p TasksMax=…`) bounds
    /// one task alone.
    pub const DEFAULT_NPROC: u64 = 16_384;
    /// `data_bytes` when a profile names none (16 GiB): bounds one runaway process.
    pub const DEFAULT_DATA_BYTES: u64 = 16 << 30;
    /// `open_files` when a profile names none.
    pub const DEFAULT_OPEN_FILES: u64 = 65_536;

    /// The limits in force: each named value, else its default (none for the address
    /// space).
    pub fn effective(&self) -> EffectiveLimits {
        EffectiveLimits {
            nproc: self.nproc.unwrap_or(Self::DEFAULT_NPROC),
            address_space_bytes: self.address_space_bytes,
            data_bytes: self.data_bytes.unwrap_or(Self::DEFAULT_DATA_BYTES),
            open_files: self.open_files.unwrap_or(Self::DEFAULT_OPEN_FILES),
        }
    }
}

/// The limits a sandbox runs with ([`Limits::effective`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveLimits {
    /// `RLIMIT_NPROC`.
    pub nproc: u64,
    /// `RLIMIT_AS`, in bytes, when a profile names it.
    pub address_space_bytes: Option<u64>,
    /// `RLIMIT_DATA`, in bytes.
    pub data_bytes: u64,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
}

fn yes() -> bool {
    true
}

fn default_memory_dir() -> String {
    ".claude/memory".into()
}

fn default_ro_paths() -> Vec<PathBuf> {
    [
        "/usr",
        "/etc/alternatives",
        "/etc/ssl",
        "/etc/ca-certificates",
        "/etc/pki",
        "/etc/resolv.conf",
        "/etc/hosts",
        "/etc/nsswitch.conf",
        "/etc/passwd",
        "/etc/group",
        "/etc/localtime",
        "/etc/os-release",
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}

fn default_env() -> Vec<String> {
    [
        "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "USER", "LOGNAME",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Why a profile is refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// No file with that name in any profile directory.
    #[error("no sandbox profile {name:?} in {dirs}; profiles are <name>.toml files")]
    NotFound {
        /// The name asked for.
        name: String,
        /// Where it was looked for.
        dirs: String,
    },
    /// The name is not a plain name.
    #[error("profile name {0:?} must be letters, digits, '-' or '_'")]
    BadName(String),
    /// The file is not valid TOML of the profile shape.
    #[error("profile {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A rule broken: the file, the key and why.
    #[error("profile {name}: {key}: {reason}")]
    Rule {
        /// The profile.
        name: String,
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
}

/// True when `a` is `b` or lies inside it (by path components, after normalisation).
fn within(a: &Path, b: &Path) -> bool {
    a.starts_with(b)
}

/// The first of `protected` that `path` would expose if it were mounted into a sandbox:
/// one inside it, or one containing it (both after lexical normalisation).
pub fn exposed_by<'a>(path: &Path, protected: &'a [PathBuf]) -> Option<&'a PathBuf> {
    let p = normal(path)?;
    protected
        .iter()
        .find(|guard| normal(guard).is_some_and(|g| within(&p, &g) || within(&g, &p)))
}

/// Removes `.` and resolves `..` lexically; refuses relative paths.
fn normal(p: &Path) -> Option<PathBuf> {
    if !p.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(s) => out.push(s),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

impl Profile {
    /// Parses a profile file's text.
    pub fn parse(name: &str, path: &Path, text: &str) -> Result<Profile, ProfileError> {
        let mut p: Profile = toml::from_str(text).map_err(|e| ProfileError::Parse {
            path: path.display().to_string(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        p.name = name.to_owned();
        Ok(p)
    }

    /// Finds `<name>.toml` in the first directory that has it.
    pub fn load(name: &str, dirs: &[PathBuf]) -> Result<Profile, ProfileError> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ProfileError::BadName(name.to_owned()));
        }
        for dir in dirs {
            let path = dir.join(format!("{name}.toml"));
            match std::fs::read_to_string(&path) {
                Ok(text) => return Profile::parse(name, &path, &text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(ProfileError::Parse {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Err(ProfileError::NotFound {
            name: name.to_owned(),
            dirs: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// Checks the profile against the directories it must never expose, and its own
    /// rules (absolute paths, a relative memory dir without `..`).
    pub fn check(&self, protected: &[PathBuf]) -> Result<(), ProfileError> {
        let rule = |key: String, reason: String| ProfileError::Rule {
            name: self.name.clone(),
            key,
            reason,
        };
        let md = Path::new(&self.memory_dir);
        if self.memory_dir.is_empty()
            || md.is_absolute()
            || md.components().any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(rule(
                "memory_dir".into(),
                "must be a relative path inside the working directory, without '.' or '..'".into(),
            ));
        }
        let protected: Vec<PathBuf> = protected.iter().filter_map(|p| normal(p)).collect();
        let mut sources: Vec<(String, &Path)> = self
            .ro_paths
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("ro_paths[{i}]"), p.as_path()))
            .collect();
        for (i, b) in self.binds.iter().enumerate() {
            sources.push((format!("binds[{i}].source"), b.source.as_path()));
            if let Some(d) = &b.dest {
                sources.push((format!("binds[{i}].dest"), d.as_path()));
            }
        }
        for (key, path) in sources {
            let Some(p) = normal(path) else {
                return Err(rule(
                    key,
                    format!("{} must be an absolute path", path.display()),
                ));
            };
            for guard in &protected {
                if within(&p, guard) || within(guard, &p) {
                    return Err(rule(
                        key,
                        format!(
                            "{} would expose {}, which belongs to mop; bind something narrower",
                            p.display(),
                            guard.display()
                        ),
                    ));
                }
            }
        }
        for (key, value, least) in [
            ("limits.nproc", self.limits.nproc, 1),
            (
                "limits.address_space_bytes",
                self.limits.address_space_bytes,
                16 << 20,
            ),
            ("limits.data_bytes", self.limits.data_bytes, 16 << 20),
            ("limits.open_files", self.limits.open_files, 16),
        ] {
            if value.is_some_and(|v| v < least) {
                return Err(rule(
                    key.into(),
                    format!(
                        "must be at least {least}; a smaller limit stops the sandbox from starting"
                    ),
                ));
            }
        }
        for (i, name) in self.env_allow.iter().enumerate() {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(rule(
                    format!("env_allow[{i}]"),
                    format!("{name:?} is not a variable name"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protected() -> Vec<PathBuf> {
        ["/var/cache/mopd", "/var/lib/mopd", "/run/mopd", "/etc/mopd"]
            .iter()
            .map(PathBuf::from)
            .collect()
    }

    #[test]
    fn shipped_profiles_load_and_pass() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bwrap-profiles");
        for name in ["default", "offline"] {
            let p = Profile::load(name, std::slice::from_ref(&dir)).unwrap();
            p.check(&protected()).unwrap();
            assert_eq!(p.name, name);
            assert_eq!(p.memory_dir, ".claude/memory");
        }
        assert!(
            Profile::load("default", std::slice::from_ref(&dir))
                .unwrap()
                .network
        );
        assert!(!Profile::load("offline", &[dir]).unwrap().network);
    }

    #[test]
    fn binds_that_expose_mop_are_refused() {
        for (bad, key) in [
            ("/", "ro_paths[1]"),
            ("/var", "ro_paths[1]"),
            ("/run", "ro_paths[1]"),
            ("/etc", "ro_paths[1]"),
            ("/var/cache/mopd/pools", "ro_paths[1]"),
            ("/var/cache/../cache/mopd", "ro_paths[1]"),
            ("/etc/mopd/node.token", "ro_paths[1]"),
        ] {
            let p = Profile {
                ro_paths: vec!["/usr".into(), bad.into()],
                ..Profile::parse("x", Path::new("x"), "").unwrap()
            };
            let err = p.check(&protected()).unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains("belongs to mop"),
                "{bad}: {err}"
            );
        }
        let with_bind = |source: &str, dest: Option<&str>| Profile {
            binds: vec![Bind {
                source: source.into(),
                dest: dest.map(Into::into),
                writable: false,
                optional: false,
            }],
            ..Profile::parse("x", Path::new("x"), "").unwrap()
        };
        assert!(with_bind("/opt/tools", None).check(&protected()).is_ok());
        assert!(with_bind("/var/lib", None).check(&protected()).is_err());
        assert!(
            with_bind("/opt/tools", Some("/run/mopd"))
                .check(&protected())
                .is_err()
        );
        assert!(with_bind("relative", None).check(&protected()).is_err());
    }

    #[test]
    fn workdirs_that_expose_mop_are_named() {
        let p = protected();
        for bad in ["/var", "/var/cache", "/var/cache/mopd/tasks/x", "/run", "/"] {
            assert!(exposed_by(Path::new(bad), &p).is_some(), "{bad}");
        }
        for fine in ["/home/alice/src", "/var/tmp/w", "/srv/checkouts/a"] {
            assert_eq!(exposed_by(Path::new(fine), &p), None, "{fine}");
        }
    }

    #[test]
    fn limits_parse_and_are_checked() {
        let p = Profile::parse(
            "x",
            Path::new("x"),
            "[limits]\nnproc = 256\nopen_files = 1024\naddress_space_bytes = 4294967296\n",
        )
        .unwrap();
        assert_eq!(p.limits.nproc, Some(256));
        p.check(&protected()).unwrap();
        let tiny = Profile::parse("x", Path::new("x"), "[limits]\nopen_files = 3\n").unwrap();
        assert!(
            tiny.check(&protected())
                .unwrap_err()
                .to_string()
                .contains("limits.open_files")
        );
        assert!(Profile::parse("x", Path::new("x"), "[limits]\nfiles = 3\n").is_err());
    }

    #[test]
    fn memory_dir_and_env_rules() {
        for bad in ["", "/abs", "../up", "a/../b", "./x"] {
            let p = Profile {
                memory_dir: bad.into(),
                ..Profile::parse("x", Path::new("x"), "").unwrap()
            };
            assert!(p.check(&protected()).is_err(), "{bad:?}");
        }
        let p = Profile {
            env_allow: vec!["A=B".into()],
            ..Profile::parse("x", Path::new("x"), "").unwrap()
        };
        assert!(p.check(&protected()).is_err());
        assert!(matches!(
            Profile::load("../etc/passwd", &[]),
            Err(ProfileError::BadName(_))
        ));
        assert!(matches!(
            Profile::load("nope", &[PathBuf::from("/nonexistent")]),
            Err(ProfileError::NotFound { .. })
        ));
        let err = Profile::parse("x", Path::new("/p/x.toml"), "networks = true")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/p/x.toml") && err.contains("networks"),
            "{err}"
        );
    }
}
