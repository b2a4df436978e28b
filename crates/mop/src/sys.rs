//! The few system calls `mop run` needs that safe Rust does not offer, kept in one narrow
//! module (as youki does): making every inherited descriptor close-on-exec, passing chosen
//! ones to bwrap, a fresh session keyring, resource limits set between fork and exec, and
//! asking the kernel for its Landlock ABI. Everything else goes through `nix` and `std`.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};

/// Marks every open descriptor above 2 close-on-exec, so nothing this process inherited
/// (a shell's leaked pipe, a terminal multiplexer's socket) reaches the sandbox.
pub fn cloexec_inherited() -> std::io::Result<usize> {
    let mut marked = 0;
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: `fd` came from /proc/self/fd just now; if it was the directory handle
        // read_dir used (already closed) fcntl fails with EBADF and is ignored. The borrow
        // lives only for this call and the descriptor is not closed here.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        if let Ok(flags) = fcntl(borrowed, FcntlArg::F_GETFD) {
            let flags = FdFlag::from_bits_truncate(flags);
            if !flags.contains(FdFlag::FD_CLOEXEC) {
                fcntl(borrowed, FcntlArg::F_SETFD(flags | FdFlag::FD_CLOEXEC))?;
                marked += 1;
            }
        }
    }
    Ok(marked)
}

/// Lets a descriptor survive exec, for bwrap to use (`--ro-bind-fd`, `--json-status-fd`).
pub fn inherit(fd: &OwnedFd) -> std::io::Result<RawFd> {
    let flags = FdFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFD)?);
    fcntl(fd, FcntlArg::F_SETFD(flags - FdFlag::FD_CLOEXEC))?;
    Ok(fd.as_raw_fd())
}

/// Gives this thread, and every process it starts from now on, a new anonymous session
/// keyring: the sandbox then possesses none of the runner's session keys.
pub fn join_fresh_session_keyring() -> std::io::Result<()> {
    const KEYCTL_JOIN_SESSION_KEYRING: nix::libc::c_long = 1;
    // SAFETY: keyctl(JOIN_SESSION_KEYRING, NULL) takes no pointer but the NULL name.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<nix::libc::c_char>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's Landlock ABI version, or `None` without Landlock.
pub fn landlock_abi() -> Option<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: nix::libc::c_uint = 1;
    // SAFETY: with a NULL attribute and size 0 this call only reports the ABI version.
    let v = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as i32)
}

/// Sets resource limits (soft and hard) in the child between fork and exec, so they apply
/// to bwrap and everything it starts, and not to `mop run` itself.
pub fn set_limits_on_exec(
    cmd: &mut std::process::Command,
    limits: Vec<(nix::sys::resource::Resource, u64)>,
) {
    use std::os::unix::process::CommandExt;
    if limits.is_empty() {
        return;
    }
    // SAFETY: the closure runs in the forked child before exec; setrlimit is
    // async-signal-safe and the closure allocates nothing (the Vec was built before).
    unsafe {
        cmd.pre_exec(move || {
            for (resource, value) in &limits {
                nix::sys::resource::setrlimit(*resource, *value, *value)
                    .map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
}
