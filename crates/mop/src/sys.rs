//! The few system calls `mop run` needs that safe Rust does not offer, kept in one narrow
//! module (as youki does): making every inherited descriptor close-on-exec, and passing
//! chosen ones to bwrap. Everything else goes through `nix` and `std`.

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
