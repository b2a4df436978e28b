//! `mopd demo`, run the way a newcomer runs it: as an unprivileged user, with no
//! configuration, in a fresh temporary directory that it must leave empty.

use std::os::unix::fs::chown;
use std::process::Output;

use mop_testkit::procs::{bin, bwrap_available, run, runner_command, runner_user};

/// `mopd demo` as the runner user, with TMPDIR in a directory of its own.
fn demo(env: &[(&str, &str)]) -> Option<(Output, tempfile::TempDir)> {
    let (uid, gid) = runner_user()?;
    let tmp = tempfile::tempdir().unwrap();
    chown(tmp.path(), Some(uid), Some(gid)).unwrap();
    let mut cmd = runner_command(bin("mopd"));
    cmd.arg("demo").env("TMPDIR", tmp.path());
    for (k, v) in env {
        cmd.env(k, v);
    }
    Some((run(&mut cmd), tmp))
}

fn text(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn daemon_pid(stdout: &str) -> i32 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("daemon ") && l.contains(", pid "))
        .expect("mopd status names the daemon's pid");
    line.split(", pid ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_demo_runs_a_sandboxed_task_and_leaves_nothing_behind() {
    if !bwrap_available() {
        return;
    }
    let Some((out, tmp)) = demo(&[]) else { return };
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The task's MEMORY.md, printed from inside the sandbox, holds alice's task: the
    // ORA-01555 runbook (L2 by error code) and alice's own correction (L1)…
    assert!(stdout.contains("# Memory for task demo-etl-7781"), "{t}");
    assert!(
        stdout.contains("ORA-01555 snapshot too old during the nightly ETL"),
        "{t}"
    );
    assert!(
        stdout.contains("Never gather statistics on db-prod-01"),
        "{t}"
    );
    // …and not bob's cards, though they are in the same synced pool: his preference (L1
    // for bob only) and his unverified agent card (visible to its author alone).
    assert!(stdout.contains("42 live cards in a verified pool"), "{t}");
    assert!(!stdout.contains("Bob prefers table-driven Go tests"), "{t}");
    assert!(
        !stdout.contains("ERROR 1205 when re-running invoices"),
        "{t}"
    );
    // The write into the memory directory failed inside; the same write worked outside
    // (the demo's own files were written by the same user).
    assert!(
        stdout
            .contains("writing into .claude/memory: refused (as intended): Read-only file system"),
        "{t}"
    );
    assert!(stdout.contains("mopd: healthy"), "{t}");
    assert!(stdout.contains("demo finished: every step worked"), "{t}");
    // Cleaned up: the temporary directory is empty and the daemon is gone.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let pid = daemon_pid(&stdout);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "mopd run {pid} still runs"
    );
}

#[test]
fn without_bubblewrap_the_demo_says_how_to_install_it_and_runs_the_rest() {
    let Some((out, tmp)) = demo(&[("MOP_BWRAP", "/nonexistent/bwrap")]) else {
        return;
    };
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("bubblewrap (bwrap) is not installed"),
        "{t}"
    );
    assert!(stdout.contains("apt-get install bubblewrap"), "{t}");
    assert!(stdout.contains("dnf install bubblewrap"), "{t}");
    assert!(
        stdout.contains("--- MEMORY.md of the prepared task ---"),
        "{t}"
    );
    assert!(
        stdout.contains("ORA-01555 snapshot too old during the nightly ETL"),
        "{t}"
    );
    assert!(stdout.contains("mopd: healthy"), "{t}");
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
}
