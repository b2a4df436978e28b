//! The `mop-curate` binary as a curator first meets it: `--version`, `--help`, and the
//! error for a missing server. (Also makes `cargo nextest run --workspace` build the
//! binary, which the whole-system tests in `tests/` run.)

use std::process::Command;

fn curate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mop-curate"))
        .args(args)
        .env_clear()
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("run mop-curate")
}

#[test]
fn version_help_and_a_missing_server_are_clear() {
    let out = curate(&["--version"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
    let out = curate(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for word in ["review", "MOP_SERVER_URL", "verify", "stale"] {
        assert!(help.contains(word), "{word} missing from --help:\n{help}");
    }
    let out = curate(&["list"]);
    assert!(!out.status.success(), "no server configured must fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MOP_SERVER_URL") || err.contains("--url"),
        "{err}"
    );
}
