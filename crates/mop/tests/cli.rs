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
        "prepare", "run", "release", "renew", "tasks", "doctor", "memory", "mcp", "prime",
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

#[test]
fn prime_prints_the_contract_for_each_agent_and_names_the_choices() {
    for (agent, tools) in [("claude", true), ("codex", true), ("generic", false)] {
        let out = mop().args(["prime", "--agent", agent]).output().unwrap();
        assert!(out.status.success(), "{agent}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("1. **Check the index first.**"), "{text}");
        assert!(
            text.contains("4. **Persist only through the store tool.**"),
            "{text}"
        );
        assert!(text.contains("/run/mop/memory/MEMORY.md"), "{text}");
        assert_eq!(
            text.contains("`memory_store` tool"),
            tools,
            "{agent}: {text}"
        );
    }
    let out = mop().args(["prime", "--agent", "gpt"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("claude") && err.contains("codex") && err.contains("generic"),
        "{err}"
    );
}

#[test]
fn mcp_without_a_daemon_answers_the_protocol_and_says_why_tools_fail() {
    use std::io::Write;
    let mut child = mop()
        .arg("mcp")
        .env("MOP_AGENT_SOCKET", "/nonexistent/agent.sock")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in [
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"memory_list","arguments":{}}}"#,
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    // Ends when its input does (after answering what it read).
    let started = std::time::Instant::now();
    let mut out = String::new();
    let mut stdout = child.stdout.take().unwrap();
    let mut reader = std::io::BufReader::new(&mut stdout);
    for _ in 0..2 {
        std::io::BufRead::read_line(&mut reader, &mut out).unwrap();
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let answers: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers[0]["result"]["serverInfo"]["name"], "mop");
    assert_eq!(answers[1]["result"]["isError"], true, "{}", answers[1]);
    let text = answers[1]["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("/nonexistent/agent.sock"), "{text}");
}
