//! The mop binary without a daemon: help texts, clear errors, and `mop memory` outside a
//! sandbox. (Being an integration test of this package also makes `cargo nextest run
//! --workspace` build the `mop` binary that the whole-system tests in `tests/` run.)

use std::process::Command;

fn mop() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mop"))
}

#[test]
fn help_lists_runner_and_agent_commands() {
    let out = mop().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "prepare", "run", "release", "renew", "tasks", "doctor", "memory",
    ] {
        assert!(text.contains(cmd), "{cmd} missing:\n{text}");
    }
    let out = mop().args(["memory", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["retrieve", "get", "list", "store"] {
        assert!(text.contains(cmd), "{cmd} missing:\n{text}");
    }
}

#[test]
fn memory_commands_outside_a_task_say_so() {
    let out = mop()
        .args(["memory", "list"])
        .env_remove("MOP_AGENT_SOCKET")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("MOP_AGENT_SOCKET is not set"));
}

#[test]
fn prepare_without_a_daemon_names_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mopd.sock");
    let out = mop()
        .args([
            "prepare",
            "--workspace",
            "acme",
            "--task-id",
            "t1",
            "--title",
            "x",
            "--socket",
        ])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&socket.display().to_string()) && err.contains("not running"),
        "{err}"
    );
}

#[test]
fn store_type_errors_list_the_types() {
    let out = mop()
        .args([
            "memory",
            "store",
            "--type",
            "memo",
            "--title",
            "x",
            "--content-stdin",
        ])
        .env("MOP_AGENT_SOCKET", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("human_correction"));
}
