//! Task projection end to end: the real mop-server, mopd and bwrap, with `mop` run as the
//! unprivileged user `moprunner` (group `mop`) through setpriv. Under CI these tests
//! require root (to create the user) and bubblewrap; they never skip there.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mop_testkit::procs::output_text as text;
use mop_testkit::procs::{
    Daemon, DaemonOptions, Server, as_runner, bin, bwrap_available, run, runner_command,
    runner_user,
};
use mop_testkit::world::World;
use mop_testkit::{Workspace, example_cards_dir, load_cards};
use serde_json::Value;

const WS: &str = "acme";

mop_testkit::world_env! {
    /// The world of these tests (the example cards, the tests' profiles), and the example
    /// cards as the tests expect them.
    Env {
        cards: Workspace,
    }
}

fn setup() -> Option<Env> {
    let world = World::builder().test_profiles().start()?;
    let cards = load_cards(
        &example_cards_dir(),
        "2026-11-29T00:00:00Z".parse().unwrap(),
    );
    Some(Env { world, cards })
}

impl Env {
    fn socket(&self) -> OsString {
        self.daemon.socket().into_os_string()
    }

    /// `mop <sub> --socket S <args…>` as the runner.
    fn mop(&self, sub: &str, args: &[&str]) -> Output {
        let mut a: Vec<&OsStr> = vec![OsStr::new(sub), OsStr::new("--socket")];
        let socket = self.socket();
        a.push(&socket);
        a.extend(args.iter().map(OsStr::new));
        run(&mut as_runner(&a))
    }

    /// `mop run` for alice on db-prod-01, as the runner, in `workdir`, with `script` for sh.
    fn run_task(&self, task_id: &str, workdir: &Path, script: &str) -> Output {
        self.run_cmd(self.mop_run(task_id, workdir, &[]), script)
    }

    fn mop_run(&self, task_id: &str, workdir: &Path, extra: &[&str]) -> Command {
        let socket = self.socket();
        let mut a: Vec<&OsStr> = vec![
            OsStr::new("run"),
            OsStr::new("--socket"),
            &socket,
            OsStr::new("--workdir"),
            workdir.as_os_str(),
            OsStr::new("--workspace"),
            OsStr::new(WS),
            OsStr::new("--task-id"),
            OsStr::new(task_id),
            OsStr::new("--user"),
            OsStr::new("alice"),
            OsStr::new("--asset"),
            OsStr::new("db-prod-01"),
            OsStr::new("--title"),
            OsStr::new("Nightly ETL fails with ORA-01555"),
        ];
        a.extend(extra.iter().map(OsStr::new));
        as_runner(&a)
    }

    fn run_cmd(&self, mut cmd: Command, script: &str) -> Output {
        cmd.args(["--", "/bin/sh", "-c", script])
            .env("MOP_TEST_SECRET", "s3cr3t-value");
        run(&mut cmd)
    }

    fn id(&self, title: &str) -> String {
        self.cards.id_titled(title).to_string()
    }

    fn path_of(&self, title: &str) -> String {
        self.cards.cards[&self.cards.id_titled(title)].path()
    }

    fn tasks(&self) -> Vec<Value> {
        let out = self.mop("tasks", &["--json"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    }
}

fn plan(env: &Env, task: &str, user: &str, asset: Option<&str>) -> Value {
    plan_titled(
        env,
        task,
        user,
        asset,
        "Nightly ETL fails with ORA-01555 on the ledger",
    )
}

fn plan_titled(env: &Env, task: &str, user: &str, asset: Option<&str>, title: &str) -> Value {
    let mut args = vec![
        "--workspace",
        WS,
        "--task-id",
        task,
        "--user",
        user,
        "--title",
        title,
        "--json",
    ];
    if let Some(a) = asset {
        args.extend(["--asset", a]);
    }
    let out = env.mop("prepare", &args);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn prepared_views_hold_the_tiers_and_nothing_excluded() {
    let Some(env) = setup() else { return };
    let p = plan(&env, "alice-etl", "alice", Some("db-prod-01"));
    for key in [
        "task_id",
        "workspace",
        "revision",
        "view_dir",
        "memory_md",
        "agent_socket",
        "expires_at",
        "cards",
    ] {
        assert!(!p[key].is_null(), "plan lacks {key}: {p:#}");
    }
    let view = PathBuf::from(p["view_dir"].as_str().unwrap());
    let md = std::fs::read_to_string(p["memory_md"].as_str().unwrap()).unwrap();
    let cards = p["cards"].as_array().unwrap();
    let tier = |title: &str| {
        cards
            .iter()
            .find(|c| c["id"] == env.id(title))
            .map(|c| c["tier"].as_str().unwrap().to_owned())
    };
    // Present, in their tiers.
    assert_eq!(
        tier("Never gather statistics on db-prod-01").as_deref(),
        Some("L1")
    );
    assert_eq!(
        tier("ORA-01555 snapshot too old during the nightly ETL").as_deref(),
        Some("L2")
    );
    assert_eq!(tier("Production change windows").as_deref(), Some("L0"));
    for c in cards {
        assert!(view.join(c["path"].as_str().unwrap()).is_file(), "{c}");
    }
    // Absent everywhere: view, index, retrieve, get.
    let absent = [
        "Carol: always pass --context",     // another user's card
        "pg-orders-01: PostgreSQL 15",      // another asset's card
        "Indent SQL with tabs",             // disabled
        "ORA-1555: add more undo segments", // superseded
        "stop the cron first",              // another author's unverified card
    ];
    let agent = |args: &[&str]| {
        let mut a: Vec<&OsStr> = vec![OsStr::new("memory")];
        a.extend(args.iter().map(OsStr::new));
        let mut cmd = as_runner(&a);
        cmd.env("MOP_AGENT_SOCKET", p["agent_socket"].as_str().unwrap());
        run(&mut cmd)
    };
    let missing = agent(&["get", "00000000-0000-4000-8000-000000000000"]);
    assert!(!missing.status.success());
    let missing_err = String::from_utf8_lossy(&missing.stderr)
        .replace("00000000-0000-4000-8000-000000000000", "<id>");
    for title in absent {
        let id = env.id(title);
        assert!(tier(title).is_none(), "{title} is in the plan");
        assert!(
            !view.join(env.path_of(title)).exists(),
            "{title} is in the view"
        );
        assert!(!md.contains(&id), "{title} is in MEMORY.md");
        let card = &env.cards.cards[&env.cards.id_titled(title)];
        let r = agent(&["retrieve", &card.summary.title, "--json"]);
        assert!(r.status.success(), "{}", text(&r));
        assert!(
            !String::from_utf8_lossy(&r.stdout).contains(&id),
            "{title} found by retrieve"
        );
        let g = agent(&["get", &id]);
        assert!(!g.status.success(), "{title} readable by id");
        assert_eq!(
            String::from_utf8_lossy(&g.stderr).replace(&id, "<id>"),
            missing_err,
            "a foreign id looks missing"
        );
    }
    // Control: bob's own task sees bob's unverified card; the pg task sees the pg card.
    let bob = plan_titled(
        &env,
        "bob-billing",
        "bob",
        Some("mysql-billing-02"),
        "Invoice batch hits ERROR 1205 lock wait timeout",
    );
    assert!(
        bob["cards"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == env.id("stop the cron first"))
    );
    let pg = plan(&env, "pg-task", "carol", Some("pg-orders-01"));
    let pg_ids: Vec<&str> = pg["cards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(pg_ids.contains(&env.id("pg-orders-01: PostgreSQL 15").as_str()));
    assert!(pg_ids.contains(&env.id("Carol: always pass --context").as_str()));
    // No user: no L1; no asset: no asset-bound cards.
    let out = env.mop(
        "prepare",
        &[
            "--workspace",
            WS,
            "--task-id",
            "anon",
            "--title",
            "ORA-01555",
            "--json",
        ],
    );
    let anon: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        anon["cards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["tier"] != "L1")
    );
    assert!(
        !anon["cards"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == env.id("db-prod-01: Oracle 19c"))
    );
}

#[test]
fn inside_the_sandbox() {
    let Some(env) = setup() else { return };
    let w = env.workdir();
    let card = env.path_of("ORA-01555 snapshot too old during the nightly ETL");
    let script = format!(
        r#"
echo "card: $(head -c 3 .claude/memory/{card})"
touch .claude/memory/new 2>&1 | sed 's/^/touch: /'
rm -f .claude/memory/MEMORY.md 2>&1 | sed 's/^/rm: /'
ls /proc > procs.out
cat /proc/[0-9]*/comm > comms.out
/bin/sh -c 'ls /proc/$$/fd' > fds.out
echo "pids: $(grep -cE '^[0-9]+$' procs.out)"
echo "comms: $(tr '\n' ' ' < comms.out)"
echo "fds: $(tr '\n' ' ' < fds.out)"
echo "env: $(env | cut -d= -f1 | sort | tr '\n' ' ')"
test -e {socket} && echo "control: reachable" || echo "control: unreachable"
test -e {cache} && echo "cache: reachable" || echo "cache: unreachable"
test -e {state} && echo "state: reachable" || echo "state: unreachable"
mop memory list >/dev/null && echo "agent: ok"
echo "whoami: $(id -u)"
"#,
        socket = env.daemon.socket().display(),
        cache = env.daemon.dir.path().join("cache").display(),
        state = env.daemon.dir.path().join("state").display(),
    );
    // Leak a descriptor into mop run on purpose: the sandbox must not see it.
    let mut cmd = Command::new("/bin/sh");
    let mop_run = env.mop_run("inside", w.path(), &[]);
    let mut line = vec![mop_run.get_program().to_owned()];
    line.extend(mop_run.get_args().map(|a| a.to_owned()));
    line.extend(["--", "/bin/sh", "-c", &script].map(OsString::from));
    cmd.arg("-c")
        .arg("exec 7</dev/null; ls /proc/$$/fd | tr '\\n' ' ' >&2; exec \"$@\"")
        .arg("sh")
        .args(&line);
    cmd.env("MOP_TEST_SECRET", "s3cr3t-value");
    let out = run(&mut cmd);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains('7'),
        "control: fd 7 was open in the runner: {t}"
    );
    assert!(stdout.contains("card: ---"), "reading a card works: {t}");
    assert!(
        stdout.contains("touch: touch: cannot touch '.claude/memory/new': Read-only file system"),
        "{t}"
    );
    assert!(
        stdout.contains("rm: rm: cannot remove '.claude/memory/MEMORY.md': Read-only file system"),
        "{t}"
    );
    let pids: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("pids: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        pids <= 3,
        "only the sandbox's own processes (bwrap, sh, ls): {t}"
    );
    let comms = stdout
        .lines()
        .find_map(|l| l.strip_prefix("comms: "))
        .unwrap();
    assert!(
        !comms.contains("mopd") && !comms.contains("mop-server"),
        "no host process visible: {t}"
    );
    let host_comm =
        std::fs::read_to_string(format!("/proc/{}/comm", env.daemon.pid().unwrap())).unwrap();
    assert_eq!(
        host_comm.trim(),
        "mopd",
        "control: the daemon is visible on the host"
    );
    assert_eq!(
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("fds: "))
            .unwrap()
            .trim(),
        "0 1 2",
        "{t}"
    );
    let names: Vec<&str> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("env: "))
        .unwrap()
        .split_whitespace()
        .collect();
    let allowed = [
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "LOGNAME",
        "MOP_AGENT_SOCKET",
        "MOP_MEMORY_DIR",
        "MOP_MEMORY_MD",
        "MOP_SAVED_DIR",
        "MOP_TASK_ASSET",
        "MOP_TASK_ID",
        "MOP_TASK_USER",
        "MOP_WORKDIR",
        "PATH",
        "PWD",
        "SHLVL",
        "TERM",
        "TZ",
        "USER",
        "_",
    ];
    for n in &names {
        assert!(
            allowed.contains(n),
            "{n} is not on the allowlist: {names:?}"
        );
    }
    assert!(
        !stdout.contains("MOP_TEST_SECRET") && !stdout.contains("s3cr3t"),
        "{t}"
    );
    for what in ["control", "cache", "state"] {
        assert!(stdout.contains(&format!("{what}: unreachable")), "{t}");
    }
    assert!(stdout.contains("agent: ok"), "{t}");
    assert!(
        stdout.contains(&format!("whoami: {}", env.uid)),
        "runs as the runner, not root: {t}"
    );
    // Control experiment outside the sandbox: the same paths are there.
    assert!(env.daemon.socket().exists() && env.daemon.dir.path().join("cache").exists());
    // Released when mop run exited (its held connection closed).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !env.tasks().is_empty() {
        assert!(Instant::now() < deadline, "not released: {:?}", env.tasks());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The log line follows the removal from the task list.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !env.daemon.log().contains("runner connection closed") {
        assert!(Instant::now() < deadline, "{}", env.daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn tiocsti_fails_inside_and_works_outside() {
    let Some(env) = setup() else { return };
    let probe = "import fcntl, os, termios, sys\ntry:\n    os.tcgetpgrp(0)\n    print('terminal: controlling')\nexcept OSError:\n    print('terminal: not controlling')\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n    print('TIOCSTI worked')\nexcept OSError as e:\n    print('TIOCSTI failed', e.errno)\n";
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(python) = python else {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "python3 is needed for the TIOCSTI test"
        );
        return;
    };
    // A pty of our own (CI has no terminal) as the controlling terminal of `setsid -c`.
    let run_on_pty = |cmd: &mut Command| -> String {
        let pty = nix::pty::openpty(None, None).unwrap();
        let slave = std::fs::File::from(pty.slave);
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        let status = cmd.status().unwrap();
        let mut out = Vec::new();
        let master = std::fs::File::from(pty.master);
        nix::fcntl::fcntl(
            &master,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let _ = std::io::Read::read_to_end(&mut &master, &mut out);
        format!("{status}: {}", String::from_utf8_lossy(&out))
    };
    let outside = run_on_pty(Command::new("setsid").args(["-c", python, "-c", probe]));
    assert!(
        outside.contains("TIOCSTI worked"),
        "control: TIOCSTI works on this host outside a sandbox: {outside}"
    );
    let w = env.workdir();
    let mut inner = Command::new("setsid");
    let mop_run = env.mop_run("tiocsti", w.path(), &[]);
    inner
        .arg("-c")
        .arg(mop_run.get_program())
        .args(mop_run.get_args())
        .args(["--", python, "-c", probe]);
    let inside = run_on_pty(&mut inner);
    assert!(inside.contains("TIOCSTI failed"), "{inside}");
    assert!(inside.contains("terminal: not controlling"), "{inside}");
    // --interactive keeps the controlling terminal (no --new-session): the seccomp filter
    // still refuses TIOCSTI, with EPERM.
    let mut inner = Command::new("setsid");
    let mop_run = env.mop_run("tiocsti-i", w.path(), &["--interactive"]);
    inner
        .arg("-c")
        .arg(mop_run.get_program())
        .args(mop_run.get_args())
        .args(["--", python, "-c", probe]);
    let interactive = run_on_pty(&mut inner);
    assert!(
        interactive.contains("TIOCSTI failed 1") && !interactive.contains("keeping --new-session"),
        "{interactive}"
    );
    assert!(
        interactive.contains("terminal: controlling"),
        "{interactive}"
    );
    // An agent CLI on a terminal (`--agent claude`, stdin a tty) gets its terminal the
    // same way, without --interactive, and TIOCSTI stays refused.
    let mut inner = Command::new("setsid");
    let mop_run = env.mop_run("tiocsti-agent", w.path(), &["--agent", "claude"]);
    inner
        .arg("-c")
        .arg(mop_run.get_program())
        .args(mop_run.get_args())
        .args(["--", python, "-c", probe]);
    let agent = run_on_pty(&mut inner);
    assert!(
        agent.contains("terminal: controlling") && agent.contains("TIOCSTI failed 1"),
        "{agent}"
    );
}

#[test]
fn a_view_is_a_snapshot_and_the_agent_socket_survives_a_daemon_restart() {
    let Some(mut env) = setup() else { return };
    let w = env.workdir();
    let title = "ORA-01555 snapshot too old during the nightly ETL";
    let card = env.path_of(title);
    let id = env.id(title);
    let script = format!(
        "cat .claude/memory/{card} > before; mop memory list > list1; touch ready; \
         while [ ! -e go ]; do sleep 0.1; done; \
         cat .claude/memory/{card} > after; mop memory get {id} > got; mop memory list > list2; echo done > finished"
    );
    let mut cmd = env.mop_run("snapshot", w.path(), &[]);
    cmd.args(["--", "/bin/sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    wait_file(&w.path().join("ready"));
    // The card changes on the server and the daemon publishes a new generation…
    env.server
        .edit_card(WS, &env.admin, &id, "\nEdited after the task started.");
    assert!(env.daemon.sync(WS).contains("modified"));
    // …and the daemon restarts while the task runs.
    assert!(env.daemon.stop());
    env.daemon.spawn();
    std::fs::write(w.path().join("go"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let read = |f: &str| {
        std::fs::read_to_string(w.path().join(f))
            .unwrap_or_else(|e| panic!("{f}: {e}; {}", text(&out)))
    };
    assert_eq!(
        read("before"),
        read("after"),
        "the running task's view did not change"
    );
    assert!(!read("after").contains("Edited after"));
    assert!(
        !read("got").contains("Edited after"),
        "get answers from the task's generation"
    );
    assert_eq!(
        read("list1"),
        read("list2"),
        "the agent socket answered after the restart"
    );
    // A task prepared now sees the new text.
    let p = plan(&env, "later", "alice", Some("db-prod-01"));
    let new_text =
        std::fs::read_to_string(PathBuf::from(p["view_dir"].as_str().unwrap()).join(&card))
            .unwrap();
    assert!(new_text.contains("Edited after"));
}

/// Waits until no task is live (a `mop run` task goes when its connection closes).
fn wait_no_tasks(env: &Env) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !env.tasks().is_empty() {
        assert!(Instant::now() < deadline, "tasks stayed: {:?}", env.tasks());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_file(p: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn refusals_symlinked_claude_fake_bwrap_bad_and_duplicate_task_ids() {
    let Some(env) = setup() else { return };
    // A symlinked .claude.
    let w = env.workdir();
    std::os::unix::fs::symlink("/tmp", w.path().join(".claude")).unwrap();
    let out = env.run_task("symlinked", w.path(), "true");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("symlink"),
        "{}",
        text(&out)
    );
    wait_no_tasks(&env);

    // A fake bwrap in the working directory, first on PATH, is never used.
    let w = env.workdir();
    let fake = w.path().join("bwrap");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\ntouch {}/fake-ran\nexec \"$@\"\n",
            w.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = env.mop_run("fake-bwrap", w.path(), &[]);
    cmd.env("PATH", format!("{}:/usr/bin:/bin", w.path().display()));
    let out = env.run_cmd(cmd, "echo ran");
    assert!(out.status.success(), "{}", text(&out));
    assert!(!w.path().join("fake-ran").exists(), "the fake bwrap ran");
    let mut cmd = env.mop_run("fake-only", w.path(), &[]);
    cmd.env("PATH", w.path());
    let out = env.run_cmd(cmd, "echo ran");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("inside the working directory"),
        "{}",
        text(&out)
    );

    // Invalid and duplicate task ids.
    let out = env.mop(
        "prepare",
        &["--workspace", WS, "--task-id", "../etc", "--title", "x"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("task_id"),
        "{}",
        text(&out)
    );
    plan(&env, "dup", "alice", None);
    let out = env.mop(
        "prepare",
        &["--workspace", WS, "--task-id", "dup", "--title", "x"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already live"),
        "{}",
        text(&out)
    );
}

#[test]
fn sigkill_of_mop_run_releases_its_lease() {
    let Some(env) = setup() else { return };
    let w = env.workdir();
    let mut cmd = env.mop_run("killed", w.path(), &[]);
    cmd.args(["--", "/bin/sleep", "60"]);
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.tasks().is_empty() {
        assert!(Instant::now() < deadline, "task never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    let view = env.daemon.dir.path().join("cache/tasks/killed/view");
    assert!(view.is_dir());
    // Control: the sandboxed command itself is running before the kill (bwrap's command
    // line names the task long before; kills that early are tests/sandbox.rs's).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !command_started("killed") {
        assert!(
            Instant::now() < deadline,
            "the sandboxed sleep never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // setpriv execs mop, so the child's pid is mop run's pid.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !env.tasks().is_empty() {
        assert!(
            Instant::now() < deadline,
            "lease not released: {:?}",
            env.tasks()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The view goes right after the task leaves the list.
    let deadline = Instant::now() + Duration::from_secs(5);
    while view.exists() {
        assert!(
            Instant::now() < deadline,
            "the view stayed after the lease went"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // bwrap and the command died with mop run (--die-with-parent).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !mop_testkit::procs::task_processes("killed").is_empty() {
        assert!(
            Instant::now() < deadline,
            "sandbox processes outlived mop run: {:?}",
            mop_testkit::procs::task_processes("killed")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !env.daemon.log().contains("runner connection closed") {
        assert!(Instant::now() < deadline, "{}", env.daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the sandboxed command of task `id` has started: a process whose environment
/// bwrap set up for it (bwrap's own command line names the task too, but not its environ).
fn command_started(id: &str) -> bool {
    let marker = format!("MOP_TASK_ID={id}\0");
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("environ"))
            .is_ok_and(|env| env.windows(marker.len()).any(|w| w == marker.as_bytes()))
    })
}

#[test]
fn store_from_inside_goes_to_the_server_with_the_tasks_provenance() {
    let Some(env) = setup() else { return };
    let w = env.workdir();
    let out = env.run_task(
        "storer",
        w.path(),
        "echo 'Check v$undostat before resizing undo.' | mop memory store --type pitfall --title 'Undo sizing needs v$undostat' --label undo --content-stdin --personal",
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("created:"), "{stdout}");
    let id = stdout.split('(').nth(1).unwrap().split(')').next().unwrap();
    let raw = mop_testkit::http()
        .get(format!("{}/v1/workspaces/{WS}/cards/{id}", env.server.url))
        .bearer_auth(&env.admin)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let card = mop_cards::parse_card(raw.as_bytes()).unwrap();
    let p = card.summary.provenance.unwrap();
    assert_eq!(
        (
            p.task_id.as_deref(),
            p.user_id.as_deref(),
            p.asset_id.as_deref()
        ),
        (Some("storer"), Some("alice"), Some("db-prod-01"))
    );
    assert_eq!(card.summary.scope.user_id.as_deref(), Some("alice"));
    assert_eq!(card.summary.trust, mop_cards::Trust::Unverified);
    // A task cannot bind a card to another user through its socket.
    let p = plan(&env, "forger", "alice", None);
    let body = serde_json::json!({"card": {"type": "fact", "title": "x", "body": "y", "scope": {"user_id": "bob"}}});
    let (code, answer) = mop_testkit::procs::runner_socket_request(
        Path::new(p["agent_socket"].as_str().unwrap()),
        "POST",
        "/v1/store",
        Some(&serde_json::to_vec(&body).unwrap()),
    );
    assert_eq!(code, 403, "{}", String::from_utf8_lossy(&answer));
}

#[test]
fn prepare_renew_release_and_leases_across_restarts() {
    let Some(mut env) = setup() else { return };
    let p = plan(&env, "ttl-task", "alice", None);
    assert_eq!(p["lease"]["kind"], "ttl");
    let first = p["expires_at"].as_str().unwrap().to_owned();
    let out = env.mop("renew", &["--task-id", "ttl-task", "--ttl", "999999"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&first));
    // A restart keeps the lease, the view and the agent socket.
    assert!(env.daemon.stop());
    env.daemon.spawn();
    let tasks = env.tasks();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert!(PathBuf::from(p["view_dir"].as_str().unwrap()).is_dir());
    let mut cmd = as_runner(&[OsStr::new("memory"), OsStr::new("list")]);
    cmd.env("MOP_AGENT_SOCKET", p["agent_socket"].as_str().unwrap());
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out));
    let status = env.daemon.wait_synced();
    assert_eq!(status["tasks"][0]["task_id"], "ttl-task");
    // The healthy summary counts the live tasks (it always said 0).
    assert_eq!(
        status["summary"], "1 workspace(s) in sync, 1 active task(s)",
        "{status:#}"
    );
    // Only its owner (or root) may release it.
    let out = env.mop("release", &["--task-id", "ttl-task"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(env.tasks().is_empty());
    assert!(!PathBuf::from(p["view_dir"].as_str().unwrap()).exists());
    let (_, status) = env.daemon.status();
    assert_eq!(
        status["summary"],
        "1 workspace(s) in sync, 0 active task(s)"
    );
}

#[test]
fn a_run_lease_names_its_runners_start_time_and_is_held_as_ndjson() {
    use mop_proto::control::{Control, ControlError};
    use mop_proto::{LeaseRequest, PrepareEvent, PrepareRequest};
    let Some(env) = setup() else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // This test process is the runner: the daemon sees its pid on the connection.
    let control = Control::new(env.daemon.socket());
    let request = |task_id: &str, start_time: u64| PrepareRequest {
        task: mop_cards::TaskContext {
            task_id: task_id.into(),
            workspace: WS.into(),
            origin_user_id: Some("alice".into()),
            asset_id: None,
            project_id: None,
            agent: None,
            title: "start time".into(),
            description: String::new(),
            labels: vec![],
        },
        lease: LeaseRequest::Run {
            pid: std::process::id(),
            start_time,
        },
        profile: None,
        workdir: None,
    };
    let own = mop_proto::host::own_start_time().unwrap();
    // Probe: the right pid with another start time (what a recycled pid looks like, and
    // what every `mop run` sent before: 0) is refused, naming the start time.
    for wrong in [0, own + 1] {
        match rt.block_on(control.prepare_held(&request("st-wrong", wrong))) {
            Err(ControlError::Answered { status, message }) => {
                assert_eq!(status, 400, "{message}");
                assert!(message.contains("start time"), "{message}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a run lease with start time {wrong} was granted"),
        }
    }
    assert!(env.tasks().is_empty());
    // Control: the real start time is granted. `prepare_held` also checks that the held
    // answer is labelled as what it is, newline-delimited JSON (it said json-seq).
    let mut held = rt
        .block_on(control.prepare_held(&request("st-right", own)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        rt.block_on(held.next()).unwrap(),
        Some(PrepareEvent::Reserved(_))
    ));
    match rt.block_on(held.next()).unwrap() {
        Some(PrepareEvent::Ready(plan)) => assert_eq!(plan.lease.pid, Some(std::process::id())),
        other => panic!("{other:?}"),
    }
    assert_eq!(env.tasks().len(), 1);
    // The lease lives with the held answer (its connection is driven by the runtime).
    drop(held);
    drop(rt);
    wait_no_tasks(&env);
}

#[test]
fn setup_failures_exit_125_and_doctor_names_fixes() {
    let Some(env) = setup() else { return };
    let w = env.workdir();
    // A profile whose bind source is missing: bwrap cannot set up the sandbox.
    let out = env.run_cmd(
        env.mop_run("broken", w.path(), &["--profile", "broken"]),
        "echo never",
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("could not be set up"),
        "{}",
        text(&out)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("never"));
    wait_no_tasks(&env);

    // doctor works for the runner, and finds mopd where its configuration puts it…
    let socket = env.daemon.socket();
    let conf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        conf.path(),
        format!(
            "[paths]\nruntime_dir = {:?}\n",
            socket.parent().unwrap().display().to_string()
        ),
    )
    .unwrap();
    std::fs::set_permissions(conf.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mopd_config = [OsStr::new("--mopd-config"), conf.path().as_os_str()];
    let out = run(&mut as_runner(
        &[&[OsStr::new("doctor")][..], &mopd_config].concat(),
    ));
    assert!(out.status.success(), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.starts_with("mop doctor: ok"), "{t}");
    assert!(
        t.contains(&format!("mopd: answers at {}", socket.display())),
        "{t}"
    );
    let out = run(&mut as_runner(
        &[&[OsStr::new("tasks")][..], &mopd_config].concat(),
    ));
    assert!(
        out.status.success(),
        "mop tasks found the socket: {}",
        text(&out)
    );
    // …and, with the daemon's socket elsewhere, says how to point mop at it.
    let elsewhere = [OsStr::new("--socket"), OsStr::new("/nonexistent/mopd.sock")];
    let out = run(&mut as_runner(
        &[&[OsStr::new("doctor")][..], &elsewhere].concat(),
    ));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(
        t.contains("mopd: UNREACHABLE") && t.contains("pass --socket PATH"),
        "{t}"
    );
    let out = run(&mut as_runner(
        &[&[OsStr::new("tasks")][..], &elsewhere].concat(),
    ));
    assert!(!out.status.success());
    assert!(text(&out).contains("MOP_SOCKET"), "{}", text(&out));
    // …names disabled user namespaces (a user namespace of our own, with its limit at 0)…
    let out = run(Command::new("unshare")
        .args(["--user", "--map-root-user", "/bin/sh", "-c"])
        .arg(format!(
            "echo 0 > /proc/sys/user/max_user_namespaces && exec {} doctor",
            bin("mop").display()
        )));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(
        t.contains("max_user_namespaces = 0") && t.contains("sysctl -w user.max_user_namespaces"),
        "{t}"
    );
    // …and a missing bwrap.
    let out = run(Command::new(bin("mop"))
        .arg("doctor")
        .env("PATH", "/nonexistent"));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("apt-get install bubblewrap"),
        "{}",
        text(&out)
    );
}

#[test]
fn profiles_that_expose_mop_are_refused() {
    let Some(env) = setup() else { return };
    let out = env.mop(
        "prepare",
        &[
            "--workspace",
            WS,
            "--task-id",
            "exposed",
            "--title",
            "x",
            "--profile",
            "exposes-tmp",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("belongs to mop") && err.contains("ro_paths"),
        "{err}"
    );
}

#[test]
fn an_unprivileged_daemon_serves_runners_of_another_uid_and_refuses_their_sandboxes() {
    // The packaged layout: mopd as an unprivileged user, the runner another user in
    // group mop. The daemon cannot read a runner's /proc/<pid>/ns/user then (EACCES), so
    // the refusal of sandboxed peers must come from the pid-namespace check.
    let Some(daemon_user) = mop_testkit::procs::daemon_user() else {
        return;
    };
    if runner_user().is_none() || !bwrap_available() {
        return;
    }
    let server = Server::start();
    let out = server.import(&example_cards_dir(), WS);
    assert!(out.status.success());
    let extra = mop_testkit::profiles_config(&[]);
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            extra: &extra,
            user: Some(daemon_user),
            ..Default::default()
        },
    );
    daemon.wait_synced();
    let pid = daemon.pid().unwrap();
    let owner = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = owner.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        !uid_line.contains("\t0\t"),
        "the daemon runs unprivileged: {uid_line}"
    );
    let socket = daemon.socket();
    let prepare = |id: &str| -> Vec<OsString> {
        [
            "prepare",
            "--socket",
            socket.to_str().unwrap(),
            "--workspace",
            WS,
            "--task-id",
            id,
            "--user",
            "alice",
            "--title",
            "ORA-01555 in the nightly ETL",
            "--json",
        ]
        .map(OsString::from)
        .to_vec()
    };

    // Outside a sandbox: the runner of another uid is served, and can read its view.
    let args = prepare("outside");
    let refs: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
    let out = run(&mut as_runner(&refs));
    assert!(out.status.success(), "{}", text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let memory_md = plan["memory_md"].as_str().unwrap();
    let read = run(runner_command("/bin/head").args(["-c", "9", memory_md]));
    assert_eq!(
        String::from_utf8_lossy(&read.stdout),
        "# Memory ",
        "{}",
        text(&read)
    );

    // Inside a bubblewrap sandbox, as the same runner, with the socket made reachable on
    // purpose (the real profiles never mount it): refused.
    let mut cmd = runner_command("bwrap");
    cmd.args([
        "--unshare-user",
        "--unshare-pid",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--",
    ])
    .arg(bin("mop"))
    .args(prepare("inside"));
    let out = run(&mut cmd);
    assert!(
        !out.status.success(),
        "a sandboxed peer was served: {}",
        text(&out)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    // The userns of another uid's process is unreadable to the daemon (EACCES): its uid
    // map tells it apart.
    while !daemon
        .log()
        .contains("refused a control connection from another user namespace")
    {
        assert!(Instant::now() < deadline, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = daemon.log();
    assert!(!log.contains("task=inside"), "{log}");

    // A user namespace alone, with no pid namespace of its own (`unshare --user`): the
    // pid-namespace check cannot see it, the uid map does. Control: the same command
    // outside it was served above.
    let mut cmd = runner_command("unshare");
    cmd.args(["--user", "--map-root-user"])
        .arg(bin("mop"))
        .args(prepare("userns-only"));
    let out = run(&mut cmd);
    assert!(
        !out.status.success(),
        "a peer in its own user namespace was served: {}",
        text(&out)
    );
    assert!(!daemon.log().contains("task=userns-only"));
}

#[test]
fn daemon_wide_operations_need_root_or_the_daemons_user() {
    let Some(daemon_user) = mop_testkit::procs::daemon_user() else {
        return;
    };
    let server = Server::start();
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            user: Some(daemon_user),
            ..Default::default()
        },
    );
    daemon.wait_synced();
    let socket = daemon.socket();
    let mopd_as = |who: Option<&str>, args: &[&str]| -> Output {
        let mut cmd = match who {
            Some("runner") => runner_command(bin("mopd")),
            Some(user) => {
                let mut c = Command::new("/usr/bin/setpriv");
                c.args(["--reuid", user, "--regid", "mop", "--init-groups", "--"])
                    .arg(bin("mopd"));
                c
            }
            None => Command::new(bin("mopd")),
        };
        // `verify` finds the daemon through its config; the others take the socket.
        if args[0] == "verify" {
            cmd.args(args).arg("--config").arg(daemon.config());
        } else {
            cmd.args(args).arg("--socket").arg(&socket);
        }
        run(&mut cmd)
    };
    // A runner (group mop) may look…
    assert!(mopd_as(Some("runner"), &["status"]).status.success());
    let out = mopd_as(Some("runner"), &["verify"]);
    assert!(out.status.success(), "{}", text(&out));
    // …but not force a sync, repair the pool or accept a new server epoch.
    for args in [
        &["sync", WS][..],
        &["verify", "--repair"],
        &["ack-epoch", WS],
    ] {
        let out = mopd_as(Some("runner"), args);
        assert!(
            !out.status.success(),
            "{args:?} as a runner: {}",
            text(&out)
        );
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            all.contains("needs root or the daemon's user"),
            "{args:?}: {all}"
        );
        // Control: root and the daemon's own user may.
        for who in [None, Some(daemon_user)] {
            let out = mopd_as(who, args);
            assert!(out.status.success(), "{args:?} as {who:?}: {}", text(&out));
        }
    }
}
