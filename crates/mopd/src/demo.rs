//! `mopd demo`: the whole system on one machine in one command, for a first look.
//!
//! It needs no configuration and leaves nothing behind: everything lives in one temporary
//! directory. A `mop-server` (found next to this executable, like `mop`) on loopback is
//! seeded with the example cards built into this binary, a real `mopd run` child process
//! syncs them, and `mop run` starts an example task in a bubblewrap sandbox that prints its
//! `MEMORY.md` and tries to write into its memory directory. Then `mopd status` is shown
//! and everything is stopped and removed. Without bubblewrap the sandbox step is replaced
//! by `mop prepare`, with a hint on how to install it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use include_dir::{Dir, include_dir};
use mop_proto::control::Control;

/// The example workspace (`config/examples/cards`), built in so the demo needs no checkout.
static EXAMPLE_CARDS: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../../config/examples/cards");
/// The default sandbox profile, as packaged.
const DEFAULT_PROFILE: &str = include_str!("../../../bwrap-profiles/default.toml");

const WORKSPACE: &str = "acme";
const TASK_ID: &str = "demo-etl-7781";

/// What the demo's task runs inside the sandbox: show the index, then try to write.
const TASK_SCRIPT: &str = r#"echo "--- .claude/memory/MEMORY.md, as the agent sees it ---"
cat .claude/memory/MEMORY.md
echo "--- end of MEMORY.md ---"
echo "cards mounted: $(find .claude/memory -name '*.md' ! -name MEMORY.md | wc -l)"
if err=$( { echo note > .claude/memory/scratch.md; } 2>&1 ); then
  echo "writing into .claude/memory: SUCCEEDED (this should not happen)"; exit 1
else
  echo "writing into .claude/memory: refused (as intended): ${err##*: }"
fi"#;

/// Options of `mopd demo`.
#[derive(Debug, Default)]
pub struct DemoOptions {
    /// Keep the temporary directory (its path is printed) instead of removing it.
    pub keep: bool,
}

/// Runs the demo; returns whether every step worked.
pub fn run(opts: &DemoOptions) -> Result<bool> {
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    let (mop, server_exe) = (exe.with_file_name("mop"), exe.with_file_name("mop-server"));
    for needed in [&mop, &server_exe] {
        if !needed.is_file() {
            bail!(
                "the demo runs `mop` and `mop-server`, expected next to mopd at {}; build all \
                 three: cargo build --release -p mopd -p mop -p mop-server",
                needed.display()
            );
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("mop-demo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let root = dir.path().to_path_buf();
    println!(
        "mop demo: card server, host daemon and one sandboxed task, all under {}",
        root.display()
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut server = start_server(&server_exe, &root)?;

    let mut daemon = None;
    let outcome = (|| -> Result<bool> {
        let d = start_daemon(&exe, &root, &server)?;
        let socket = d.socket.clone();
        daemon = Some(d);
        step(2, "host daemon: mopd run, first sync");
        let cards = wait_for_sync(&rt, &socket, daemon.as_mut().expect("set above"))?;
        println!(
            "  synced workspace {WORKSPACE}: {cards} live cards in a verified pool \
             (disabled and superseded ones stay on the server)"
        );
        let ok = run_task(&mop, &root, &socket)?;
        step(5, "what ops see: mopd status");
        let status = Command::new(&exe)
            .args(["status", "--socket"])
            .arg(&socket)
            .status()
            .context("cannot run mopd status")?;
        Ok(ok && status.success())
    })();

    step(6, "cleaning up");
    if let Some(mut d) = daemon {
        d.stop();
    }
    terminate(&mut server.child, "card server");
    if opts.keep {
        let kept = dir.keep();
        println!("  kept {}", kept.display());
    } else {
        dir.close()
            .context("cannot remove the demo's temporary directory")?;
        println!("  removed {}", root.display());
    }
    let ok = outcome?;
    println!(
        "\n{}",
        if ok {
            "demo finished: every step worked"
        } else {
            "demo finished with a failed step (see above)"
        }
    );
    Ok(ok)
}

fn step(n: u32, what: &str) {
    println!("\n[{n}/6] {what}");
}

/// The card server child (`mop-server serve`): its URL and the node token for the
/// daemon. Stopped with SIGTERM, like the daemon.
struct Server {
    child: Child,
    url: String,
    token: String,
}

/// Runs one `mop-server` command to completion; its stdout, or an error with its stderr.
fn server_command(server: &Path, config: &Path, args: &[&std::ffi::OsStr]) -> Result<String> {
    let out = Command::new(server)
        .args(args)
        .arg("--config")
        .arg(config)
        // The demo's server is its own SQLite file, whatever database this shell names.
        .env_remove("MOP_DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", server.display()))?;
    if !out.status.success() {
        bail!(
            "mop-server {} failed ({}): {}",
            args.first().map_or("".into(), |a| a.to_string_lossy()),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn start_server(server: &Path, root: &Path) -> Result<Server> {
    step(1, "card server: mop-server on loopback");
    let cards_dir = root.join("cards");
    write_dir(&EXAMPLE_CARDS, &cards_dir)?;
    let db = root.join("server.db");
    let config = root.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndb = {:?}\nlisten = \"127.0.0.1:0\"\n",
            db.display().to_string()
        ),
    )?;
    let imported = server_command(
        server,
        &config,
        &[
            "import".as_ref(),
            cards_dir.as_os_str(),
            "--workspace".as_ref(),
            WORKSPACE.as_ref(),
        ],
    )?;
    let token = server_command(
        server,
        &config,
        &[
            "token".as_ref(),
            "create".as_ref(),
            "--role".as_ref(),
            "node".as_ref(),
            "--workspace".as_ref(),
            WORKSPACE.as_ref(),
            "--note".as_ref(),
            "mopd demo".as_ref(),
        ],
    )?;
    let log = std::fs::File::create(root.join("server.log"))?;
    let mut child = Command::new(server)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env_remove("MOP_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {} serve", server.display()))?;
    // Its first line names the address it listens on (port 0 picks a free one).
    let stdout = child.stdout.take().expect("piped above");
    let (line_tx, line_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = line_tx.send(line);
    });
    let line = line_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_default();
    let Some(url) = line.trim().strip_prefix("mop-server listening on ") else {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "the card server did not start within 10 s; its log is {}",
            root.join("server.log").display()
        );
    };
    println!("  {url}, workspace {WORKSPACE}: {imported}; one node token");
    Ok(Server {
        child,
        url: url.to_owned(),
        token,
    })
}

/// Stops a child with SIGTERM (as systemd does), killing it after 10 s.
fn terminate(child: &mut Child, what: &str) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            println!("  {what} stopped");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    println!("  {what} did not stop within 10 s; killed");
}

/// Writes the built-in cards out as an OKF directory.
fn write_dir(dir: &Dir<'_>, to: &Path) -> Result<()> {
    for file in dir.files() {
        let path = to.join(file.path());
        std::fs::create_dir_all(path.parent().expect("a file has a parent"))?;
        std::fs::write(&path, file.contents())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    for sub in dir.dirs() {
        write_dir(sub, to)?;
    }
    Ok(())
}

/// The `mopd run` child; stopped with SIGTERM like systemd does.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn stop(&mut self) {
        terminate(&mut self.child, "daemon");
    }
}

fn start_daemon(exe: &Path, root: &Path, server: &Server) -> Result<Daemon> {
    // The config's directory is one the sandbox must never see, so it is not the root
    // that holds the task's working directory.
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc)?;
    let token_file = etc.join("node.token");
    write_private(&token_file, server.token.as_bytes())?;
    let profiles = root.join("profiles");
    std::fs::create_dir_all(&profiles)?;
    std::fs::write(profiles.join("default.toml"), DEFAULT_PROFILE)?;
    // Short names: the agent sockets live under the runtime dir, and Unix socket paths
    // are limited to 108 bytes.
    let runtime_dir = root.join("run");
    let config = format!(
        "[server]\nurl = {url:?}\ntoken_file = {token:?}\n\n\
         [sync]\nworkspaces = [{WORKSPACE:?}]\ninterval_secs = 30\n\n\
         [paths]\ncache_dir = {cache:?}\nruntime_dir = {run:?}\nstate_dir = {state:?}\n\n\
         [tasks]\nprofile_dirs = [{profiles:?}]\n",
        url = server.url,
        token = token_file.display().to_string(),
        cache = root.join("cache").display().to_string(),
        run = runtime_dir.display().to_string(),
        state = root.join("state").display().to_string(),
        profiles = profiles.display().to_string(),
    );
    let config_path = etc.join("mopd.toml");
    std::fs::write(&config_path, config)?;
    let log = std::fs::File::create(root.join("mopd.log"))?;
    let child = Command::new(exe)
        .arg("run")
        .arg("--config")
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start mopd run")?;
    Ok(Daemon {
        child,
        socket: mopd::paths::Paths::new(&root.join("cache"), &root.join("state"), &runtime_dir)
            .control_socket(),
    })
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

/// Waits until the daemon has a generation of the workspace; returns its card count.
fn wait_for_sync(rt: &tokio::runtime::Runtime, socket: &Path, d: &mut Daemon) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(exit)) = d.child.try_wait() {
            bail!(
                "mopd run exited ({exit}) before its first sync; its log is {}",
                socket
                    .parent()
                    .and_then(Path::parent)
                    .map(|r| r.join("mopd.log").display().to_string())
                    .unwrap_or_default()
            );
        }
        if let Ok(report) = rt.block_on(Control::new(socket).status())
            && let Some(ws) = report.workspaces.first()
            && ws.revision.is_some()
        {
            return Ok(ws.cards as u64);
        }
        if Instant::now() > deadline {
            bail!("the daemon did not complete its first sync within 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The example task: the sandboxed run, or `mop prepare` when bubblewrap is missing.
fn run_task(mop: &Path, root: &Path, socket: &Path) -> Result<bool> {
    let workdir = root.join("work");
    std::fs::create_dir_all(&workdir)?;
    let task = [
        "--workspace",
        WORKSPACE,
        "--task-id",
        TASK_ID,
        "--user",
        "alice",
        "--asset",
        "db-prod-01",
        "--title",
        "Nightly ETL fails with ORA-01555 snapshot too old",
        "--description",
        "The ledger_nightly job aborted at 02:40 UTC with ora-1555 on LEDGER.ENTRIES.",
        "--label",
        "oracle",
    ];
    step(
        3,
        "task: user alice, asset db-prod-01, a ticket with error ORA-01555",
    );
    println!(
        "  mopd selects L0 (workspace baseline), L1 (alice's own) and L2 (db-prod-01, ORA-01555, text)"
    );
    let Ok(bwrap) = mop_proto::host::find_bwrap(Some(&workdir)) else {
        step(4, "sandbox: SKIPPED, bubblewrap (bwrap) is not installed");
        println!(
            "  install it to see the task run sandboxed:\n    Debian/Ubuntu: sudo apt-get install bubblewrap\n    Fedora/RHEL:   sudo dnf install bubblewrap\n  meanwhile the same task, prepared without a sandbox (mop prepare):"
        );
        return prepare_only(mop, socket, &task);
    };
    step(
        4,
        &format!(
            "sandbox: mop run -- /bin/sh …, in bubblewrap ({})",
            bwrap.display()
        ),
    );
    let status = Command::new(mop)
        .arg("run")
        .arg("--socket")
        .arg(socket)
        .arg("--workdir")
        .arg(&workdir)
        .args(task)
        .args(["--", "/bin/sh", "-c", TASK_SCRIPT])
        .status()
        .context("cannot start mop run")?;
    Ok(explain_run(status))
}

fn explain_run(status: ExitStatus) -> bool {
    match status.code() {
        Some(0) => {
            println!("  the task exited 0; its lease was released when mop run ended");
            true
        }
        Some(125) => {
            println!(
                "  the sandbox could not be set up (exit 125; the reason is above). Unprivileged \
                 bubblewrap needs user namespaces: see `mop doctor`."
            );
            false
        }
        _ => {
            println!("  the task failed ({status})");
            false
        }
    }
}

fn prepare_only(mop: &Path, socket: &Path, task: &[&str]) -> Result<bool> {
    let out = Command::new(mop)
        .arg("prepare")
        .arg("--socket")
        .arg(socket)
        .args(task)
        .arg("--json")
        .output()
        .context("cannot run mop prepare")?;
    if !out.status.success() {
        println!(
            "  mop prepare failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return Ok(false);
    }
    let plan: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("mop prepare printed no JSON plan")?;
    let memory_md = plan["memory_md"].as_str().unwrap_or_default();
    let text = std::fs::read_to_string(memory_md)
        .with_context(|| format!("cannot read the task's MEMORY.md {memory_md}"))?;
    println!("--- MEMORY.md of the prepared task ---\n{text}--- end of MEMORY.md ---");
    println!(
        "cards in the view: {}",
        plan["cards"].as_array().map_or(0, Vec::len)
    );
    let released = Command::new(mop)
        .arg("release")
        .arg("--socket")
        .arg(socket)
        .args(["--task-id", TASK_ID])
        .stdout(Stdio::null())
        .status()
        .context("cannot run mop release")?;
    // Without the sandbox the demo did not show the read-only mount: say so, not "ok".
    println!("  (the read-only memory directory is shown only with bubblewrap)");
    Ok(released.success())
}
