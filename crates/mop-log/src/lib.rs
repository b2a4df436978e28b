//! Logging setup shared by `mop-server`, `mopd` and `mop`.
//!
//! Under systemd, stderr is connected to the journal and `JOURNAL_STREAM` holds its
//! `device:inode`; then log records go to journald with their fields. Anywhere else they go
//! to stderr as readable lines. `RUST_LOG` overrides the default filter.
//!
//! mop never logs card text or tokens: counts, ids and hashes only. That rule is kept at
//! the call sites; this crate only decides where records go.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Where log records go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// The systemd journal.
    Journald,
    /// Human-readable lines on stderr.
    Stderr,
}

/// True when stderr is the stream `JOURNAL_STREAM` names (`<device>:<inode>`).
pub fn stderr_is_journal() -> bool {
    std::env::var("JOURNAL_STREAM").is_ok_and(|v| names_stderr(&v))
}

fn names_stderr(value: &str) -> bool {
    let Some((dev, ino)) = value.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match nix::sys::stat::fstat(std::io::stderr().as_fd()) {
        Ok(st) => st.st_dev == dev && st.st_ino == ino,
        Err(_) => false,
    }
}

/// Installs the global subscriber. `default_filter` applies when `RUST_LOG` is unset (for
/// example `"info"`). Returns where records go; falls back to stderr when the journal
/// socket cannot be opened.
pub fn init(default_filter: &str) -> Sink {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    if stderr_is_journal()
        && let Ok(journald) = tracing_journald::layer()
    {
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(journald)
            .try_init();
        return Sink::Journald;
    }
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_target(false),
        )
        .try_init();
    Sink::Stderr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_must_name_stderr() {
        let st = nix::sys::stat::fstat(std::io::stderr().as_fd()).unwrap();
        assert!(names_stderr(&format!("{}:{}", st.st_dev, st.st_ino)));
        assert!(!names_stderr(&format!("{}:{}", st.st_dev, st.st_ino + 1)));
        assert!(!names_stderr("garbage"));
        assert!(!names_stderr(""));
    }
}
