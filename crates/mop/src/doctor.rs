//! `mop doctor`: runs bwrap for real, as the calling user, with the flags `mop run` uses,
//! and when it fails names the cause and the fix: bwrap missing, user namespaces disabled
//! by sysctl, Ubuntu's AppArmor restriction on unprivileged user namespaces, `/proc`
//! refused (a container with a masked /proc), or a bwrap too old for `--disable-userns`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;

use crate::sandbox::{SystemEntry, system_layout};

/// What the probe found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The bwrap used.
    pub bwrap: Option<PathBuf>,
    /// `bwrap --version`.
    pub version: Option<String>,
    /// True when a sandbox with mop's flags started and ran a command.
    pub ok: bool,
    /// What is wrong.
    pub problem: Option<String>,
    /// How to fix it.
    pub fix: Option<String>,
    /// The kernel's Landlock ABI (`None`: no Landlock).
    pub landlock_abi: Option<i32>,
    /// Whether sandboxes with a shared network are kept from the host's abstract Unix
    /// sockets (Landlock ABI 6 or later); when not, why.
    pub abstract_sockets: Shield,
    /// Whether sandboxes with a shared network are kept from listening on the host's fixed
    /// TCP ports (Landlock ABI 4 or later); when not, why.
    pub tcp_ports: Shield,
}

/// What `mop doctor` says of one thing a shared-network sandbox is kept from.
#[derive(Debug, Clone, Serialize)]
pub struct Shield {
    /// True when a sandbox sharing the host's network is kept from it.
    pub blocked: bool,
    /// One sentence for a person.
    pub detail: String,
}

/// Whether this kernel lets `mop run` keep sandboxes from binding the host's fixed ports.
pub fn tcp_ports(abi: Option<i32>) -> Shield {
    match abi {
        Some(v) if v >= 4 => Shield {
            blocked: true,
            detail: format!(
                "blocked: Landlock ABI {v} lets sandboxes that share the host's network bind only ports the kernel picks and their profile's bind_ports"
            ),
        },
        _ => Shield {
            blocked: false,
            detail: format!(
                "OPEN to sandboxes that share the host's network (the default profile): {}. An agent could take \
                 mop-server's port while it restarts: serve it over TLS with server.ca_file in mopd.toml, use the \
                 offline profile, or a kernel with Landlock ABI 4 (Linux 6.7 or later)",
                crate::confine::tcp_bind_gap()
            ),
        },
    }
}

/// Whether this kernel lets `mop run` scope abstract Unix sockets.
pub fn abstract_sockets(abi: Option<i32>) -> Shield {
    match abi {
        Some(v) if v >= 6 => Shield {
            blocked: true,
            detail: format!(
                "blocked: Landlock ABI {v} scopes the host's abstract Unix sockets away from sandboxes that share its network"
            ),
        },
        _ => Shield {
            blocked: false,
            detail: format!(
                "REACHABLE from sandboxes that share the host's network (the default profile): {}. Use the \
                 offline profile for untrusted agents, or a kernel with Landlock ABI 6 (Linux 6.12 or later)",
                crate::confine::abstract_socket_gap()
            ),
        },
    }
}

fn read_sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Maps bwrap's error text (and the host's sysctls) to a cause and a fix.
pub fn diagnose(stderr: &str, version: Option<&str>) -> (String, String) {
    let first = stderr
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("bwrap failed without a message")
        .trim();
    let namespace_trouble = [
        "Creating new namespace failed",
        "No permissions to create",
        "setting up uid map",
        "new namespace",
    ]
    .iter()
    .any(|n| stderr.contains(n));
    if namespace_trouble {
        if read_sysctl("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
            return (
                format!("user namespaces are disabled: user.max_user_namespaces = 0 ({first})"),
                "sysctl -w user.max_user_namespaces=15000, and persist it in /etc/sysctl.d/".into(),
            );
        }
        if read_sysctl("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
            return (
                format!(
                    "unprivileged user namespaces are disabled: kernel.unprivileged_userns_clone = 0 ({first})"
                ),
                "sysctl -w kernel.unprivileged_userns_clone=1, and persist it in /etc/sysctl.d/"
                    .into(),
            );
        }
        if read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
            == Some("1")
        {
            return (
                format!("AppArmor restricts unprivileged user namespaces (Ubuntu 24.04 and later) ({first})"),
                "install an AppArmor profile that lets /usr/bin/bwrap create user namespaces (apparmor ships \
                 bwrap-userns-restrict), or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
                    .into(),
            );
        }
        return (
            format!("bwrap cannot create a user namespace: {first}"),
            "check user.max_user_namespaces, kernel.unprivileged_userns_clone and AppArmor; inside a container, \
             run mop on the host instead"
                .into(),
        );
    }
    if stderr.contains("Can't mount proc") {
        return (
            format!("bwrap may not mount a new /proc ({first}); this happens in containers whose /proc is masked"),
            "run mop on the host, or give the container an unmasked /proc (docker: --security-opt systempaths=unconfined); \
             mop will not run a sandbox that can see host processes"
                .into(),
        );
    }
    if stderr.contains("disable-userns")
        && (stderr.contains("Unknown option") || stderr.contains("unrecognized"))
    {
        return (
            format!(
                "bwrap {} is too old: it lacks --disable-userns",
                version.unwrap_or("(unknown version)")
            ),
            "upgrade bubblewrap to 0.8 or newer".into(),
        );
    }
    (
        format!("bwrap failed: {first}"),
        "run `bwrap --unshare-user --proc /proc --dev /dev --ro-bind /usr /usr -- /usr/bin/true` and read its error".into(),
    )
}

/// Probes bwrap with mop's flags, and the kernel for Landlock.
pub fn probe(workdir: &Path) -> Report {
    let landlock_abi = crate::sys::landlock_abi();
    let bwrap = match mop_proto::host::find_bwrap(Some(workdir)) {
        Ok(b) => b,
        Err(problem) => {
            return Report {
                landlock_abi,
                abstract_sockets: abstract_sockets(landlock_abi),
                tcp_ports: tcp_ports(landlock_abi),
                bwrap: None,
                version: None,
                ok: false,
                fix: Some(
                    "apt-get install bubblewrap (or dnf install bubblewrap), then: mop doctor"
                        .into(),
                ),
                problem: Some(problem),
            };
        }
    };
    let version = Command::new(&bwrap)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|v| !v.is_empty());
    let profile =
        mop_proto::Profile::parse("doctor", Path::new("doctor"), "").expect("defaults parse");
    let mut cmd = Command::new(&bwrap);
    cmd.args([
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--disable-userns",
        "--clearenv",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
    ]);
    for e in system_layout(&profile) {
        match e {
            SystemEntry::RoBind(p) => cmd.arg("--ro-bind").arg(&p).arg(&p),
            SystemEntry::Symlink { target, path } => cmd.arg("--symlink").arg(target).arg(path),
        };
    }
    let truth = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("/usr/bin/true");
    cmd.args(["--", truth])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match cmd.output() {
        Ok(out) if out.status.success() => Report {
            landlock_abi,
            abstract_sockets: abstract_sockets(landlock_abi),
            tcp_ports: tcp_ports(landlock_abi),
            bwrap: Some(bwrap),
            version,
            ok: true,
            problem: None,
            fix: None,
        },
        Ok(out) => {
            let (problem, fix) =
                diagnose(&String::from_utf8_lossy(&out.stderr), version.as_deref());
            Report {
                landlock_abi,
                abstract_sockets: abstract_sockets(landlock_abi),
                tcp_ports: tcp_ports(landlock_abi),
                bwrap: Some(bwrap),
                version,
                ok: false,
                problem: Some(problem),
                fix: Some(fix),
            }
        }
        Err(e) => Report {
            landlock_abi,
            abstract_sockets: abstract_sockets(landlock_abi),
            tcp_ports: tcp_ports(landlock_abi),
            bwrap: Some(bwrap.clone()),
            version,
            ok: false,
            problem: Some(format!("cannot run {}: {e}", bwrap.display())),
            fix: Some("reinstall bubblewrap".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_failures_get_named_fixes() {
        let (p, f) = diagnose(
            "bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n",
            Some("bubblewrap 0.8.0"),
        );
        assert!(
            p.contains("/proc") && f.contains("unmasked /proc"),
            "{p} / {f}"
        );
        let (p, f) = diagnose(
            "bwrap: Unknown option --disable-userns\n",
            Some("bubblewrap 0.6.1"),
        );
        assert!(p.contains("0.6.1") && f.contains("0.8"), "{p} / {f}");
        let (p, _) = diagnose("bwrap: setting up uid map: Permission denied\n", None);
        assert!(p.contains("user namespace"), "{p}");
        let (p, f) = diagnose("bwrap: something new\n", None);
        assert!(
            p.contains("something new") && f.contains("bwrap --unshare-user"),
            "{p} / {f}"
        );
    }
}
