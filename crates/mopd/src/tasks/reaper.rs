//! When leases end: a run lease when its runner process is provably gone, a TTL lease at
//! its time. Processes are read through [`Processes`] ([`ProcFs`] in the daemon), so the
//! decision ([`ended`]) is unit-tested against made-up processes.
//!
//! Decides only; releasing is [`super::Tasks::reap`]'s work.

use jiff::Timestamp;
use mop_proto::host::parse_start_time;

use super::leases::LeaseKind;

/// What `/proc` says of a runner process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// It runs, started at this time (clock ticks since boot).
    Running(u64),
    /// It is provably gone: no such process.
    Gone,
    /// Its status could not be read (out of descriptors, say): nothing is known, and a
    /// lease never ends on that.
    Unknown,
}

/// The processes of the host, as the reaper sees them.
pub trait Processes {
    /// The state of process `pid`.
    fn runner(&self, pid: u32) -> Runner;
}

/// The real processes, from `/proc/<pid>/stat`.
pub struct ProcFs;

impl Processes for ProcFs {
    fn runner(&self, pid: u32) -> Runner {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => parse_start_time(&stat).map_or(Runner::Unknown, Runner::Running),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Runner::Gone,
            // ESRCH: it exited between open and read.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Runner::Gone,
            Err(_) => Runner::Unknown,
        }
    }
}

/// Whether a run lease has ended: only when its runner is provably gone (no such
/// process, or the pid now belongs to a process started at another time).
pub fn run_lease_ended(start_time: u64, state: Runner) -> bool {
    match state {
        Runner::Gone => true,
        Runner::Running(t) => t != start_time,
        Runner::Unknown => false,
    }
}

/// The leases among `leases` (task id, how it ends) that have ended by `now`, each with
/// why.
pub fn ended<'a>(
    leases: impl IntoIterator<Item = (&'a str, &'a LeaseKind)>,
    processes: &dyn Processes,
    now: Timestamp,
) -> Vec<(String, String)> {
    leases
        .into_iter()
        .filter_map(|(id, kind)| {
            let why = match kind {
                LeaseKind::Run { pid, start_time } => {
                    run_lease_ended(*start_time, processes.runner(*pid))
                        .then(|| format!("runner pid {pid} exited"))
                }
                LeaseKind::Ttl { expires_at } => {
                    (*expires_at <= now).then(|| "lease expired".to_owned())
                }
            }?;
            Some((id.to_owned(), why))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Fake(HashMap<u32, Runner>);

    impl Processes for Fake {
        fn runner(&self, pid: u32) -> Runner {
            self.0.get(&pid).copied().unwrap_or(Runner::Gone)
        }
    }

    #[test]
    fn a_lease_ends_only_when_its_runner_is_provably_gone() {
        assert!(run_lease_ended(100, Runner::Gone));
        assert!(run_lease_ended(100, Runner::Running(101)), "pid reused");
        assert!(!run_lease_ended(100, Runner::Running(100)));
        assert!(
            !run_lease_ended(100, Runner::Unknown),
            "an unreadable /proc never ends a lease"
        );
    }

    #[test]
    fn ended_picks_gone_runners_recycled_pids_and_passed_ttls() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let processes = Fake(HashMap::from([
            (10, Runner::Running(500)),
            (11, Runner::Running(999)),
            (12, Runner::Unknown),
        ]));
        let run = |pid, start_time| LeaseKind::Run { pid, start_time };
        let ttl = |at: &str| LeaseKind::Ttl {
            expires_at: at.parse().unwrap(),
        };
        let leases = [
            ("alive", run(10, 500)),
            ("recycled", run(11, 500)),
            ("unreadable", run(12, 500)),
            ("gone", run(13, 500)),
            ("expired", ttl("2026-12-01T09:59:59Z")),
            ("due-now", ttl("2026-12-01T10:00:00Z")),
            ("later", ttl("2026-12-01T10:00:01Z")),
        ];
        let got = ended(leases.iter().map(|(id, k)| (*id, k)), &processes, now);
        assert_eq!(
            got,
            vec![
                ("recycled".to_owned(), "runner pid 11 exited".to_owned()),
                ("gone".to_owned(), "runner pid 13 exited".to_owned()),
                ("expired".to_owned(), "lease expired".to_owned()),
                ("due-now".to_owned(), "lease expired".to_owned()),
            ]
        );
    }

    #[test]
    fn this_process_runs_and_an_impossible_pid_is_gone() {
        assert_eq!(
            ProcFs.runner(std::process::id()),
            Runner::Running(mop_proto::host::own_start_time().unwrap())
        );
        // No pid is this large on Linux (pid_max ≤ 2^22).
        assert_eq!(ProcFs.runner(u32::MAX - 1), Runner::Gone);
    }
}
