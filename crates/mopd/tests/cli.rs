//! The mopd binary's command line without a running daemon: help, and the unreachable
//! answers of `status` (exit 2, saying whether the socket is missing).
//!
//! (Being an integration test of this package also makes `cargo nextest run --workspace`
//! build the `mopd` binary that the whole-system tests in `tests/` run.)

use std::process::Command;

fn mopd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mopd"))
}

#[test]
fn help_names_every_command() {
    let out = mopd().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "status", "sync", "verify", "ack-epoch"] {
        assert!(text.contains(cmd), "{cmd} missing from --help:\n{text}");
    }
}

#[test]
fn status_without_a_daemon_exits_2_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mopd.sock");
    let out = mopd()
        .args(["status", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("does not exist") && text.contains("systemctl start mopd"),
        "{text}"
    );
    // A socket file nobody listens on: refusing.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let out = mopd()
        .args(["status", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["reason"], "socket_refusing");
}

#[test]
fn run_refuses_a_token_file_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("node.token");
    std::fs::write(&token, "mop_x_y").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.path().join("mopd.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nurl = \"http://127.0.0.1:9\"\ntoken_file = \"{}\"\n[sync]\nworkspaces = [\"acme\"]\n[paths]\ncache_dir = \"{d}/c\"\nruntime_dir = \"{d}/r\"\nstate_dir = \"{d}/s\"\n",
            token.display(),
            d = dir.path().display()
        ),
    )
    .unwrap();
    let out = mopd()
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("readable by others") && err.contains("chmod 0600"),
        "{err}"
    );
}
