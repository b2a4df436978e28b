//! The `mop-server` binary's command line as an operator meets it: `--help` names the
//! commands and both engines, and `migrate` says what is missing before it touches
//! anything. (Also makes `cargo nextest run --workspace` build the binary, which the
//! whole-system tests in `tests/` run.)

use std::process::Command;

fn server(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mop-server"))
        .args(args)
        .env_remove("MOP_DATABASE_URL")
        .output()
        .expect("run mop-server")
}

#[test]
fn help_names_the_commands_and_both_engines() {
    let out = server(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for word in ["serve", "token", "import", "backup", "migrate", "export"] {
        assert!(help.contains(word), "{word} missing from --help:\n{help}");
    }
    let out = server(&["migrate", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--from",
        "--to",
        "--replace",
        "MOP_DATABASE_URL",
        "postgres://",
    ] {
        assert!(
            help.contains(word),
            "{word} missing from migrate --help:\n{help}"
        );
    }
}

#[test]
fn migrate_without_a_target_or_source_says_what_to_do_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let from = format!("sqlite:{}", missing.display());
    let out = server(&["migrate", "--from", &from]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--to") && err.contains("MOP_DATABASE_URL"),
        "{err}"
    );
    // A target given, the source missing: refused, and no file appears at either path.
    let target = dir.path().join("target.db");
    let to = format!("sqlite:{}", target.display());
    let out = server(&["migrate", "--from", &from, "--to", &to, "--replace"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no database at"), "{err}");
    assert!(!missing.exists() && !target.exists());
}
