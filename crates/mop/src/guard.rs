//! The guard of a `mop run`: a small process that outlives it and ends its sandbox if
//! `mop run` dies without saying it is done (SIGKILL, OOM).
//!
//! `--die-with-parent` alone leaves two windows in bwrap 0.8 (and later versions): killed
//! after its monitor process armed its parent-death signal and before it let the sandbox's
//! first process go on, that process waits forever; killed in the moment after the go
//! signal and before the sandbox's pid 1 armed its own parent-death signal, pid 1 lives on
//! and the command runs as an orphan. The seccomp gate ([`crate::confine`]) keeps the
//! command from starting before the go signal; the guard closes the rest. bwrap's own
//! monitor process is covered from its fork on: `mop run` arms its parent-death signal
//! before exec ([`crate::sys::prepare_bwrap_exec`]), so no bwrap outlives `mop run` long
//! enough to fork a sandbox after the guard's cut-off.
//!
//! `mop run` starts the guard before bwrap, in a process group of its own (so terminal
//! signals do not reach it), with the read end of a pipe as its stdin: as a fork of
//! itself while it has a single thread (a process start fewer on every run), else as
//! `mop __guard`. A forked guard keeps `mop run`'s command line, so a supervisor that
//! kills by pattern (`pkill -f 'mop run'`) reaches it too; kill the runner by its pid,
//! or its whole cgroup, which holds the sandbox as well. On a normal end
//! `mop run` writes `d` and the guard exits. On end-of-file without it, the guard kills
//! every process of the task that started before that moment: bwrap's processes and what
//! runs in the sandbox (their environment names the task).
//! Killing the sandbox's pid 1 ends its whole pid namespace.

use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

/// The byte `mop run` sends when it ends normally.
pub const DONE: u8 = b'd';

/// `mop __guard --task-id T`: waits on stdin, then cleans up if need be.
pub fn run(task_id: &str) -> ExitCode {
    watch(task_id);
    ExitCode::SUCCESS
}

/// The guard's work: waits on stdin for [`DONE`]; on end-of-file without it, ends the
/// task's processes.
pub fn watch(task_id: &str) {
    let mut byte = [0u8; 1];
    if matches!(std::io::stdin().read(&mut byte), Ok(1) if byte[0] == DONE) {
        return;
    }
    let cutoff = ticks_since_boot();
    let mut quiet_scans = 0;
    let mut killed = 0;
    // A process may be forking while we look: scan until two scans in a row find nothing.
    for _ in 0..100 {
        let victims = task_processes(task_id, cutoff);
        if victims.is_empty() {
            quiet_scans += 1;
            if quiet_scans == 2 {
                break;
            }
        } else {
            quiet_scans = 0;
        }
        for pid in victims {
            if nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
            {
                killed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if killed > 0 {
        // Not eprintln!: stderr's reader may have died with `mop run`, and a failed write
        // must not panic here.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "mop: mop run of task {task_id} ended without cleaning up; its guard ended {killed} sandbox process(es)"
        );
    }
}

/// Clock ticks since boot, the unit of `/proc/<pid>/stat`'s start time.
fn ticks_since_boot() -> u64 {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    let secs: f64 = uptime
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::MAX / 1e6);
    (secs * hz) as u64 + 1
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Processes of task `task_id` (of this uid: no other may be signalled anyway) that
/// started no later than `cutoff`, so that a new task reusing the id is left alone.
fn task_processes(task_id: &str, cutoff: u64) -> Vec<i32> {
    let in_environ = format!("MOP_TASK_ID={task_id}\0");
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            if pid == me {
                return None;
            }
            let dir = e.path();
            let read = |f: &str| std::fs::read(dir.join(f)).ok();
            let started =
                mop_proto::host::parse_start_time(&String::from_utf8_lossy(&read("stat")?))?;
            let ours = read("environ").is_some_and(|c| contains(&c, in_environ.as_bytes()));
            (ours && started <= cutoff).then_some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_finds_a_tasks_processes_by_their_environment_and_leaves_others() {
        let task = format!("guard-test-{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("MOP_TASK_ID", &task)
            .spawn()
            .unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .env("MOP_TASK_ID", format!("{task}-other"))
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let now = ticks_since_boot();
        assert_eq!(task_processes(&task, now), [child.id() as i32]);
        // One started after the cutoff is not the dead run's.
        assert!(task_processes(&task, 0).is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
