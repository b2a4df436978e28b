//! Real processes for whole-system tests: find the workspace's binaries, start
//! `mop-server` on 127.0.0.1:0 with a temporary database, talk to it over real HTTP.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A binary of this workspace from the same build as the running executable: next to it
/// (a benchmark binary in `target/<profile>/`) or one level up (a test in
/// `target/<profile>/deps/`). `cargo nextest run --workspace` builds every binary first.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let here = exe.parent().expect("executable directory");
    let candidates = [
        here.join(name),
        here.parent().map(|p| p.join(name)).unwrap_or_default(),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{name} is missing next to {}: build the workspace binaries first (cargo build --workspace)",
                exe.display()
            )
        })
}

/// Runs a command to completion, capturing output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// A running `mop-server` with its own temporary directory and database.
pub struct Server {
    child: Option<Child>,
    /// Base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    /// The temporary directory (database, config, logs).
    pub dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts a server with default settings.
    pub fn start() -> Server {
        Server::start_with("")
    }

    /// Starts a server with extra config TOML (e.g. `[sync]\ncounter_publish_secs = 1`).
    pub fn start_with(config: &str) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("server.toml"), config).expect("write config");
        let mut s = Server {
            child: None,
            url: String::new(),
            dir,
            log: Arc::default(),
        };
        s.spawn();
        s
    }

    /// The database file.
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("mop.db")
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("server.toml")
    }

    /// `mop-server <args…>` pointed at this server's config and database.
    pub fn cli<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(bin("mop-server"));
        cmd.args(args)
            .arg("--config")
            .arg(self.config())
            .arg("--db")
            .arg(self.db());
        cmd
    }

    fn spawn(&mut self) {
        let mut child = Command::new(bin("mop-server"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .arg("--config")
            .arg(self.config())
            .arg("--db")
            .arg(self.db())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mop-server");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let _ = reader.read_to_end(&mut Vec::new());
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "mop-server did not report its address; log:\n{}",
                    self.log()
                )
            });
        let url = line
            .trim()
            .strip_prefix("mop-server listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}; log:\n{}", self.log()))
            .to_owned();
        self.url = url;
        self.child = Some(child);
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends SIGTERM and waits; returns whether it exited successfully.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("signal mop-server");
        for _ in 0..200 {
            if let Some(status) = child.try_wait().expect("wait") {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        panic!(
            "mop-server did not stop within 10 s of SIGTERM; log:\n{}",
            self.log()
        );
    }

    /// Stops (SIGTERM) and starts again on the same database, on a new port.
    pub fn restart(&mut self) {
        assert!(self.stop(), "clean exit on SIGTERM; log:\n{}", self.log());
        self.spawn();
    }

    /// Creates a token with the CLI.
    pub fn token(&self, role: &str, workspaces: &[&str]) -> String {
        let mut args = vec!["token", "create", "--role", role];
        for w in workspaces {
            args.extend(["--workspace", w]);
        }
        let out = run(&mut self.cli(&args));
        assert!(
            out.status.success(),
            "token create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Imports a card directory with the CLI.
    pub fn import(&self, dir: &Path, ws: &str) -> Output {
        run(&mut self.cli(&[
            std::ffi::OsStr::new("import"),
            dir.as_os_str(),
            "--workspace".as_ref(),
            ws.as_ref(),
        ]))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
