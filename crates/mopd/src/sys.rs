//! The few system calls mopd needs that safe Rust does not offer, kept in one narrow
//! module: a pidfd of a Unix socket's peer, and whether the process behind a pidfd has
//! exited (a pidfd names one process for good, so a peer's pid cannot be recycled under a
//! check of `/proc/<pid>` without the check noticing); glibc's allocator tuning; and the
//! group `mop` on the files runners must reach.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// `SO_PEERPIDFD` (Linux 6.5): the same on x86_64, aarch64 and riscv64 (asm-generic).
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the process that connected `socket`, taken by the kernel at `connect(2)`:
/// `Err` with `ESRCH` when that process is gone already, and with `ENOPROTOOPT` on
/// kernels older than 6.5 (the caller then opens one by pid, see [`pidfd_open`]).
pub fn peer_pidfd(socket: &impl AsRawFd) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, a c_int of that size, and
    // updates `len`; the socket descriptor is borrowed for the call.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pidfd of process `pid` (Linux 5.3). Opened after the fact, it only proves that the
/// process it names is the one later checks read; the caller must have tied it to the
/// peer some other way.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// True once the process behind `pidfd` has exited (a pidfd polls readable then).
pub fn pidfd_exited(pidfd: &impl AsFd) -> bool {
    let mut poll = libc::pollfd {
        fd: pidfd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut poll, 1, 0) };
    r != 0 && poll.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// Hands freed memory back to the OS: after a build (the index builder's term table and
/// lists, the bodies) and after a new generation is loaded for prepares (its manifest JSON). glibc
/// keeps freed memory of its per-thread arenas for reuse, so without this the daemon's RSS
/// stays at the peak of its largest build (measured: 144 MiB instead of a fraction of it at
/// 10k cards).
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Tunes glibc's malloc once at start: two arenas, and a fixed threshold for giving large
/// blocks pages of their own (`mop-bench memory`, 5 × 10k cards: VmRSS 76 → 54 MiB, peak
/// 113 → 92 MiB with the threshold). By default glibc gives busy threads
/// arenas of their own (up to eight per core), and memory freed in one arena is not reused
/// by threads of another; the daemon's builds and loads run on tokio's blocking threads,
/// so a long-running daemon held freed memory in many arenas. Measured with
/// `mop-bench memory` (5 × 10k cards, 100 prepares): VmRSS 146 MiB before, 105 MiB with
/// two arenas. The daemon allocates little in parallel, so contention is not a concern.
pub fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any worker thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        // A fixed threshold: blocks of 128 KiB and more (parsed manifests, response
        // bodies, index buffers) always get pages of their own, returned to the kernel
        // when freed. glibc's default raises the threshold after the first such free, and
        // then those blocks came from the heap, where the generations loaded next were
        // placed among them and kept their pages.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Sets group `mop` on a path when that group exists (best effort: it needs root or
/// membership, which the packaged service has).
pub fn chgrp_mop(path: &std::path::Path) {
    if let Ok(Some(group)) = nix::unistd::Group::from_name("mop")
        && let Err(e) = nix::unistd::chown(path, None, Some(group.gid))
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot set group mop");
    }
}

/// This host's name, as receipts name the host (read once; `unknown-host` when the
/// kernel's name is not a usable id).
pub fn host_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|n| n.trim().to_owned())
            .ok()
            .filter(|n| mop_cards::is_scope_id(n))
            .unwrap_or_else(|| "unknown-host".to_owned())
    })
    .clone()
}

/// The CPU time (user and system) the calling thread has used.
pub fn thread_cpu_time() -> std::time::Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_THREAD).map_or(std::time::Duration::ZERO, |u| {
        let t = |v: nix::sys::time::TimeVal| {
            std::time::Duration::new(v.tv_sec() as u64, v.tv_usec() as u32 * 1000)
        };
        t(u.user_time()) + t(u.system_time())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_tells_a_live_process_from_an_exited_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let fd = pidfd_open(child.id() as i32).unwrap();
        assert!(!pidfd_exited(&fd));
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: its pid may be handed out again, but the pidfd still names the old one.
        assert!(pidfd_exited(&fd));
    }

    #[test]
    fn a_socket_peer_has_a_pidfd_of_its_own_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        match peer_pidfd(&a) {
            Ok(fd) => assert!(!pidfd_exited(&fd), "the peer is this process"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{e}"),
        }
    }
}
