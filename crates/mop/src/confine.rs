//! What `mop run` adds to bubblewrap's namespaces: a seccomp filter, the go signal that
//! rides on it, Landlock's scoping of abstract Unix sockets, a fresh session keyring, and
//! the profile's resource limits.
//!
//! **The filter** answers `EPERM` to the system calls an agent has no business making and
//! that widen the kernel's attack surface or reach outside the sandbox: the key management
//! calls (the runner's keyrings), io_uring, userfaultfd, perf_event_open, bpf, kexec, the
//! new mount API, and the `TIOCSTI`/`TIOCLINUX` ioctls that push keystrokes into a
//! terminal. It is built with seccompiler and handed to bwrap with `--seccomp FD`.
//!
//! **The go signal.** bwrap reads the `--seccomp` descriptor to its end right before it
//! starts the command, and refuses a program whose length is not a multiple of 8 bytes.
//! So `mop run` writes all of the program but its last 4 bytes when it starts bwrap, and
//! the rest (then closes the pipe) once the daemon's plan has arrived. If `mop run` dies
//! in between, however it dies, the pipe closes on a truncated program and bwrap exits
//! without starting the command: no orphan, and the sandbox's setup still overlaps the
//! daemon's work. (`--block-fd`, used before, carries on at end-of-file.)
//!
//! **Abstract Unix sockets** live in the network namespace, which a profile with network
//! shares with the host. Landlock (ABI 6, Linux 6.12) scopes them: a process in a Landlock
//! domain cannot connect to an abstract socket made outside it. `mop run` enters such a
//! domain on the thread that starts bwrap, so the sandbox inherits it; `mop` itself uses no
//! abstract sockets. Older kernels cannot do this, and `mop doctor` says so.
//!
//! **TCP ports.** The same domain (Landlock ABI 4, Linux 6.7) lets the sandbox bind only
//! ports the kernel picks and the profile's `bind_ports`: an agent sharing the host's
//! network cannot take mop-server's or mopd's port while either restarts. Landlock's rules
//! are for TCP alone, so the seccomp filter refuses the stream sockets that accept TCP
//! clients without being TCP (MPTCP, SMC).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::OwnedFd;

use nix::libc;
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// The system calls the sandbox is refused, by name (for documentation and tests).
pub const DENIED_SYSCALLS: &[(&str, i64)] = &[
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("bpf", libc::SYS_bpf),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
];

/// ioctl requests the sandbox is refused: faking terminal input, and the console's
/// selection paste (which does the same on a virtual terminal).
// The request constants' type differs between C libraries (c_ulong or c_int).
#[allow(clippy::unnecessary_cast)]
pub const DENIED_IOCTLS: &[(&str, u64)] = &[
    ("TIOCSTI", libc::TIOCSTI as u64),
    ("TIOCLINUX", libc::TIOCLINUX as u64),
];

/// Sockets the sandbox may not create, as (what, argument index, value): MPTCP
/// (`IPPROTO_MPTCP`, 262) and SMC (`AF_SMC`, 43, or `IPPROTO_SMC`, 256) stream sockets
/// accept plain TCP clients but are not TCP to Landlock's bind rules, so any of them would
/// let an agent listen on mop-server's port after all; agents have plain TCP.
pub const DENIED_SOCKETS: &[(&str, u8, u64)] = &[
    ("IPPROTO_MPTCP", 2, 262),
    ("IPPROTO_SMC", 2, 256),
    ("AF_SMC", 0, 43),
];

/// The x32 ABI's system calls carry this bit in their number on x86_64. They match no
/// rule by number, so the filter refuses all of them.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The filter as raw `struct sock_filter` records, for bwrap's `--seccomp`.
pub fn seccomp_program() -> Result<Vec<u8>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no seccomp filter for this architecture: {e}"))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED_SYSCALLS
        .iter()
        .map(|(_, nr)| (*nr, Vec::new()))
        .collect();
    let ioctl_rules = DENIED_IOCTLS
        .iter()
        .map(|(_, request)| {
            // The request is an unsigned int: compare its low 32 bits only, so that high
            // bits set by the caller cannot slip past.
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *request)
                .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    rules.insert(libc::SYS_ioctl, ioctl_rules);
    let socket_rules = DENIED_SOCKETS
        .iter()
        .map(|(_, arg, value)| {
            SeccompCondition::new(*arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *value)
                .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    rules.insert(libc::SYS_socket, socket_rules);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let mut program: seccompiler::BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    if arch == TargetArch::x86_64 {
        // After the three-instruction architecture check, refuse every x32 call.
        let ins = |code: u32, jt: u8, jf: u8, k: u32| seccompiler::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        };
        program.splice(
            3..3,
            [
                ins(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
                ins(
                    libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
                    0,
                    1,
                    X32_SYSCALL_BIT,
                ),
                ins(
                    libc::BPF_RET | libc::BPF_K,
                    0,
                    0,
                    libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
                ),
            ],
        );
    }
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for i in &program {
        bytes.extend_from_slice(&i.code.to_ne_bytes());
        bytes.push(i.jt);
        bytes.push(i.jf);
        bytes.extend_from_slice(&i.k.to_ne_bytes());
    }
    Ok(bytes)
}

/// The writing end of the `--seccomp` pipe, holding back the program's last four bytes:
/// [`Gate::open`] lets the command start; dropping the gate (or dying) stops it.
pub struct Gate {
    pipe: std::fs::File,
    tail: Vec<u8>,
}

/// A pipe carrying `program` to bwrap, all of it written but the last four bytes: the
/// read end is bwrap's `--seccomp` descriptor.
pub fn gate(program: &[u8]) -> std::io::Result<(OwnedFd, Gate)> {
    assert!(
        program.len() >= 8 && program.len().is_multiple_of(8),
        "a BPF program"
    );
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let mut pipe = std::fs::File::from(write);
    let (head, tail) = program.split_at(program.len() - 4);
    // Far smaller than a pipe's buffer (at most 4096 instructions, 32 KiB): never blocks.
    pipe.write_all(head)?;
    Ok((
        read,
        Gate {
            pipe,
            tail: tail.to_vec(),
        },
    ))
}

impl Gate {
    /// Completes the program and closes the pipe: bwrap installs it and starts the
    /// command.
    pub fn open(mut self) -> std::io::Result<()> {
        self.pipe.write_all(&self.tail)
    }
}

/// Whether abstract Unix sockets outside the sandbox are out of its reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbstractSockets {
    /// A Landlock domain scopes them.
    Scoped,
    /// This kernel cannot scope them (why).
    Reachable(String),
}

/// Whether the sandbox may listen on the host's TCP ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TcpBind {
    /// Only ports the kernel picks (port 0) and the profile's `bind_ports`.
    Confined,
    /// Any free port (why: this kernel cannot confine binding).
    Open(String),
}

/// What the Landlock domain a shared-network sandbox runs in holds back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfinement {
    pub abstract_sockets: AbstractSockets,
    pub tcp_bind: TcpBind,
}

/// Enters a Landlock domain, on the calling thread (the one that then starts bwrap), that
/// scopes abstract Unix sockets and lets TCP sockets bind only to a port the kernel picks
/// (bind to port 0, or an implicit bind on connect) or to one of `bind_ports`.
///
/// Why binding: a sandbox sharing the host's network could otherwise take mop-server's or
/// mopd's metrics port the moment either stops, receive mopd's node token on its next
/// poll (or a curator's admin token in a copy of the console's login page), and keep the
/// real process from starting again. The ports the kernel picks come from
/// `net.ipv4.ip_local_port_range`, where no service's fixed port belongs.
/// File system access and outgoing connections are left alone.
pub fn confine_network(bind_ports: &[u16]) -> NetworkConfinement {
    use landlock::{
        AccessNet, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
    };
    let abi = crate::sys::landlock_abi();
    let status = Ruleset::default()
        .handle_access(AccessNet::BindTcp)
        .and_then(|r| r.scope(Scope::AbstractUnixSocket))
        .and_then(|r| r.create())
        .and_then(|r| {
            r.add_rules(
                std::iter::once(0)
                    .chain(bind_ports.iter().copied())
                    .map(|port| {
                        Ok::<_, landlock::RulesetError>(NetPort::new(port, AccessNet::BindTcp))
                    }),
            )
        })
        .and_then(|r| r.no_new_privs(true).restrict_self());
    match status {
        Ok(s) if s.ruleset == RulesetStatus::FullyEnforced => NetworkConfinement {
            abstract_sockets: AbstractSockets::Scoped,
            tcp_bind: TcpBind::Confined,
        },
        // Best effort: the features this kernel's ABI has are in force.
        Ok(s) if s.ruleset == RulesetStatus::PartiallyEnforced => NetworkConfinement {
            abstract_sockets: if abi.is_some_and(|v| v >= 6) {
                AbstractSockets::Scoped
            } else {
                AbstractSockets::Reachable(abstract_socket_gap())
            },
            tcp_bind: if abi.is_some_and(|v| v >= 4) {
                TcpBind::Confined
            } else {
                TcpBind::Open(tcp_bind_gap())
            },
        },
        Ok(_) => NetworkConfinement {
            abstract_sockets: AbstractSockets::Reachable(abstract_socket_gap()),
            tcp_bind: TcpBind::Open(tcp_bind_gap()),
        },
        Err(e) => NetworkConfinement {
            abstract_sockets: AbstractSockets::Reachable(format!(
                "Landlock refused the ruleset: {e}"
            )),
            tcp_bind: TcpBind::Open(format!("Landlock refused the ruleset: {e}")),
        },
    }
}

/// Why this kernel leaves abstract sockets reachable, for messages.
pub fn abstract_socket_gap() -> String {
    match crate::sys::landlock_abi() {
        Some(abi) if abi >= 6 => "Landlock did not enforce the scope".into(),
        Some(abi) => format!(
            "this kernel's Landlock is ABI {abi}; scoping abstract Unix sockets needs ABI 6 (Linux 6.12)"
        ),
        None => NO_LANDLOCK.into(),
    }
}

/// Why this kernel lets a sandbox bind any TCP port, for messages.
pub fn tcp_bind_gap() -> String {
    match crate::sys::landlock_abi() {
        Some(abi) if abi >= 4 => "Landlock did not enforce the TCP bind rules".into(),
        Some(abi) => format!(
            "this kernel's Landlock is ABI {abi}; confining TCP binds needs ABI 4 (Linux 6.7)"
        ),
        None => NO_LANDLOCK.into(),
    }
}

const NO_LANDLOCK: &str = "this kernel has no Landlock (it needs CONFIG_SECURITY_LANDLOCK and \"landlock\" in the lsm= list)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_is_whole_records_and_refuses_x32() {
        let p = seccomp_program().unwrap();
        assert!(p.len().is_multiple_of(8));
        // Every denied call appears as a comparison in the program.
        let ks: Vec<u32> = p
            .chunks(8)
            .map(|c| u32::from_ne_bytes(c[4..8].try_into().unwrap()))
            .collect();
        for (name, nr) in DENIED_SYSCALLS {
            assert!(ks.contains(&(*nr as u32)), "{name} missing");
        }
        for (name, request) in DENIED_IOCTLS {
            assert!(ks.contains(&(*request as u32)), "{name} missing");
        }
        if std::env::consts::ARCH == "x86_64" {
            assert!(ks.contains(&X32_SYSCALL_BIT));
        }
    }

    #[test]
    fn a_gate_holds_back_the_end_of_the_program() {
        use std::io::Read;
        let program = seccomp_program().unwrap();
        let (read, gate) = gate(&program).unwrap();
        let mut reader = std::fs::File::from(read);
        gate.open().unwrap();
        let mut all = Vec::new();
        reader.read_to_end(&mut all).unwrap();
        assert_eq!(all, program);
        // Dropped unopened: the reader sees a program cut short, never a whole one.
        let (read, gate) = self::gate(&program).unwrap();
        drop(gate);
        let mut cut = Vec::new();
        std::fs::File::from(read).read_to_end(&mut cut).unwrap();
        assert_eq!(cut.len(), program.len() - 4);
        assert!(!cut.len().is_multiple_of(8));
    }
}
