//! The few system calls `mop run` needs that safe Rust does not offer, kept in one narrow
//! module (as youki does): making every inherited descriptor close-on-exec, passing chosen
//! ones to bwrap, a fresh session keyring, resource limits set between fork and exec,
//! asking the kernel for its Landlock ABI, and forking the guard. Everything else goes through `nix` and `std`.

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

/// Prepares bwrap's start, between fork and exec: the resource limits (soft and hard), so
/// they apply to bwrap and everything it starts and not to `mop run` itself; and a
/// parent-death signal armed before exec.
///
/// Why the signal here: bwrap's own `--die-with-parent` arms it only once bwrap runs, so a
/// `mop run` killed while bwrap was still being exec'd left a bwrap that went on, and
/// that could fork the sandbox after the guard's cut-off. Armed in the fork, the signal
/// covers bwrap from its first instruction (it survives exec of a binary that gains no
/// privileges); the parent check closes the moment between fork and arming.
pub fn prepare_bwrap_exec(
    cmd: &mut std::process::Command,
    limits: Vec<(nix::sys::resource::Resource, u64)>,
) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec; prctl, getppid and
    // setrlimit are async-signal-safe and the closure allocates nothing (the Vec was built
    // before).
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("mop run ended before bwrap started"));
            }
            for (resource, value) in &limits {
                nix::sys::resource::setrlimit(*resource, *value, *value)
                    .map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
}

/// The number of threads of this process, from `/proc/self/status`.
fn threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

/// Starts [`crate::guard::watch`] for `task_id` in a fork of this process: no exec, so
/// it costs a fork instead of a whole process start. The child gets its own process group,
/// the read end of a new pipe as stdin, `/dev/null` as stdout, keeps stderr, and closes
/// every other descriptor (it holds none of the sandbox's). Returns the pipe's write end,
/// or `None` when this process has more than one thread (a fork would copy only this
/// one) or its descriptors cannot be listed; the caller then starts `mop __guard`.
pub fn fork_guard(task_id: &str) -> std::io::Result<Option<std::fs::File>> {
    use nix::unistd::{ForkResult, Pid, dup2_stdin, dup2_stdout, setpgid};
    if threads() != Some(1) {
        return Ok(None);
    }
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    // Listed before the fork, when a failure can still fall back to the exec'd guard.
    let Some(open) = open_descriptors() else {
        return Ok(None);
    };
    // SAFETY: this process has one thread (checked just above, and nothing here starts
    // another), so the child is a whole copy of it and may run any code, allocation
    // included, as the parent could.
    match unsafe { nix::unistd::fork() }? {
        ForkResult::Parent { child } => {
            // Both sides set the group, so no terminal signal can reach the guard in
            // between.
            let _ = setpgid(child, child);
            Ok(Some(std::fs::File::from(write)))
        }
        ForkResult::Child => {
            let watched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                drop(write);
                let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
                let ready = dup2_stdin(&read).and_then(|_| dup2_stdout(&null));
                drop(read);
                drop(null);
                if ready.is_ok() {
                    for fd in open.into_iter().filter(|fd| *fd > 2) {
                        let _ = nix::unistd::close(fd);
                    }
                    crate::guard::watch(task_id);
                }
            }));
            // SAFETY: _exit ends the process at once: neither `mop run`'s destructors
            // nor its exit handlers run in the guard, whatever happened above.
            unsafe { nix::libc::_exit(i32::from(watched.is_err())) }
        }
    }
}

/// Every open descriptor of this process, from `/proc/self/fd` (without the one that
/// listing used).
fn open_descriptors() -> Option<Vec<RawFd>> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    let listed: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // The directory's own descriptor is closed by now: keep only those still open.
    Some(
        listed
            .into_iter()
            .filter(|fd| {
                // SAFETY: borrowed only for this F_GETFD, which fails for a closed one.
                let borrowed = unsafe { BorrowedFd::borrow_raw(*fd) };
                fcntl(borrowed, FcntlArg::F_GETFD).is_ok()
            })
            .collect(),
    )
}
