//! `mopd demo`: the whole system on one machine in one command, for a first look.
//!
//! It needs no configuration and leaves nothing behind: everything lives in one temporary
//! directory. An embedded card server on loopback is seeded with the example cards built
//! into this binary, a real `mopd run` child process syncs them, and `mop run` (found next
//! to this executable) starts an example task in a bubblewrap sandbox that prints its
//! `MEMORY.md` and tries to write into its memory directory. Then `mopd status` is shown
//! and everything is stopped and removed. Without bubblewrap the sandbox step is replaced
//! by `mop prepare`, with a hint on how to install it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use include_dir::{Dir, include_dir};

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
    let mop = exe.with_file_name("mop");
    if !mop.is_file() {
        bail!(
            "the demo runs `mop`, expected next to mopd at {}; build both: cargo build --release -p mopd -p mop",
            mop.display()
        );
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

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(&rt, &root, stop_rx)?;

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
    let _ = stop_tx.send(());
    rt.shutdown_timeout(Duration::from_secs(5));
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

/// The embedded server: its URL and the node token for the daemon.
struct Server {
    url: String,
    token: String,
}

fn start_server(
    rt: &tokio::runtime::Runtime,
    root: &Path,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<Server> {
    step(1, "card server: embedded mop-server on loopback");
    let cards_dir = root.join("cards");
    write_dir(&EXAMPLE_CARDS, &cards_dir)?;
    let db = root.join("server.db");
    let store = mop_server::store::Store::open(&db)
        .with_context(|| format!("cannot create the demo database {}", db.display()))?;
    let (files, skipped) = mop_server::transfer::read_card_dir(&cards_dir, |_| {})?;
    if !skipped.is_empty() {
        bail!("{} built-in example cards were unreadable", skipped.len());
    }
    let report = store.import(WORKSPACE, files, "demo:import")?;
    if !report.rejected.is_empty() {
        bail!(
            "{} built-in example cards were rejected",
            report.rejected.len()
        );
    }
    let (_, token) = store.create_token(
        mop_server::store::Role::Node,
        &[WORKSPACE.to_owned()],
        Some("mopd demo"),
    )?;
    drop(store);

    let mut config = mop_server::config::ServerConfig::default();
    config.server.db = db;
    config.server.listen = "127.0.0.1:0".parse().expect("valid address");
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let serving = rt.spawn(mop_server::server::serve_until(
        config,
        move |addr| {
            let _ = addr_tx.send(addr);
        },
        async move {
            let _ = stop.await;
        },
    ));
    let addr = match addr_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(addr) => addr,
        Err(_) => {
            let why = rt
                .block_on(serving)
                .map_err(anyhow::Error::from)
                .and_then(|r| r)
                .err()
                .map_or_else(|| "no address within 10 s".to_owned(), |e| format!("{e:#}"));
            bail!("the embedded card server did not start: {why}");
        }
    };
    println!(
        "  http://{addr}, workspace {WORKSPACE}: {} example cards imported (revision {}), one node token",
        report.created, report.revision
    );
    Ok(Server {
        url: format!("http://{addr}"),
        token,
    })
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
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                println!("  daemon stopped");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        println!("  daemon did not stop within 10 s; killed");
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
        socket: runtime_dir.join("mopd.sock"),
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
        if let Ok((200, body)) =
            rt.block_on(crate::control::request(socket, "GET", "/v1/status", None))
        {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let ws = &v["workspaces"][0];
            if ws["revision"].is_u64() {
                return Ok(ws["cards"].as_u64().unwrap_or(0));
            }
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
    let bwrap = std::env::var_os("MOP_BWRAP")
        .map(PathBuf::from)
        .or_else(|| crate::status::find_bwrap().map(PathBuf::from));
    let Some(bwrap) = bwrap.filter(|b| b.is_file()) else {
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
