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

/// Runs a command to completion with `input` on its stdin, capturing output.
pub fn run_with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // The program may stop reading early (a size limit): a broken pipe is its answer.
    match child.stdin.take().unwrap().write_all(input) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    child.wait_with_output().unwrap()
}

/// A running `mop-server` with its own temporary directory and database.
pub struct Server {
    child: Option<Child>,
    /// Base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    /// The temporary directory (database, config, logs).
    pub dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
    wrap: Vec<String>,
    /// Another server's database file or a PostgreSQL URL, for a replica (see
    /// [`Server::replica`]); else its own SQLite file in `dir`.
    shared_db: Option<std::ffi::OsString>,
}

/// A command line that runs what follows it with the soft descriptor limit a systemd
/// service gets by default (1024): `sh -c 'ulimit -Sn 1024; exec "$@"' sh …`.
pub const SYSTEMD_FD_LIMIT: &[&str] = &["/bin/sh", "-c", "ulimit -Sn 1024 && exec \"$@\"", "sh"];

impl Server {
    /// A workspace's current revision, from its manifest (any token that may read it).
    pub fn revision(&self, ws: &str, token: &str) -> u64 {
        let v: serde_json::Value = crate::http()
            .get(format!("{}/v1/workspaces/{ws}/manifest", self.url))
            .bearer_auth(token)
            .send()
            .unwrap()
            .json()
            .unwrap();
        v["revision"].as_u64().expect("a manifest has a revision")
    }

    /// Appends `extra` to a card's text through the admin API; returns the new revision.
    pub fn edit_card(&self, ws: &str, admin: &str, id: &str, extra: &str) -> u64 {
        let http = crate::http();
        let url = format!("{}/v1/workspaces/{ws}/cards/{id}", self.url);
        let raw = http
            .get(&url)
            .bearer_auth(admin)
            .send()
            .unwrap()
            .text()
            .unwrap();
        let r = http
            .put(&url)
            .bearer_auth(admin)
            .body(format!("{raw}{extra}\n"))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "edit {id}: {}", r.status());
        let v: serde_json::Value = r.json().unwrap();
        v["revision"].as_u64().expect("a change has a revision")
    }

    /// Starts a server with default settings.
    pub fn start() -> Server {
        Server::start_with("")
    }

    /// Starts a server with extra config TOML (e.g. `[sync]\ncounter_publish_secs = 1`).
    pub fn start_with(config: &str) -> Server {
        Server::start_wrapped(config, &[])
    }

    /// Starts a server through `wrap` (its command line is appended), for example
    /// [`SYSTEMD_FD_LIMIT`].
    pub fn start_wrapped(config: &str, wrap: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("server.toml"), config).expect("write config");
        Server::spawned(dir, wrap, None)
    }

    /// Starts a server in `dir` (which holds its `server.toml`), on `shared_db` or on its
    /// own SQLite file there.
    fn spawned(
        dir: tempfile::TempDir,
        wrap: &[&str],
        shared_db: Option<std::ffi::OsString>,
    ) -> Server {
        let mut s = Server {
            child: None,
            url: String::new(),
            dir,
            log: Arc::default(),
            wrap: wrap.iter().map(|s| s.to_string()).collect(),
            shared_db,
        };
        s.spawn();
        s
    }

    /// A second server process on this one's database and config: a replica.
    pub fn replica(&self) -> Server {
        Server::on_database(self.db_arg(), &self.config())
    }

    /// A server on a PostgreSQL database (`postgres://…`), with extra config TOML.
    pub fn on_postgres(url: &str, config: &str) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("server.toml"), config).expect("write config");
        Server::spawned(dir, &[], Some(url.into()))
    }

    /// A server on an existing database (a replica, or a restored backup): a file, or a
    /// PostgreSQL URL.
    pub fn on_database(db: impl AsRef<std::ffi::OsStr>, config: &Path) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::copy(config, dir.path().join("server.toml")).expect("copy config");
        Server::spawned(dir, &[], Some(db.as_ref().to_owned()))
    }

    /// Sends SIGKILL and waits (a crashed replica).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The database file (of an SQLite server).
    pub fn db(&self) -> PathBuf {
        PathBuf::from(self.db_arg())
    }

    /// What `--db` gets: the SQLite file, or the PostgreSQL URL.
    pub fn db_arg(&self) -> std::ffi::OsString {
        self.shared_db
            .clone()
            .unwrap_or_else(|| self.dir.path().join("mop.db").into())
    }

    /// The config file.
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("server.toml")
    }

    /// `mop-server <args…>` pointed at this server's config and database.
    pub fn cli<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(bin("mop-server"));
        cmd.args(args)
            .arg("--config")
            .arg(self.config())
            .arg("--db")
            .arg(self.db_arg());
        cmd
    }

    fn spawn(&mut self) {
        self.spawn_on("127.0.0.1:0");
    }

    /// Starts a server listening on `listen` (a fixed `127.0.0.1:PORT`, see [`fixed_port`]).
    pub fn start_listening(config: &str, listen: &str) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("server.toml"), config).expect("write config");
        let mut s = Server {
            child: None,
            url: String::new(),
            dir,
            log: Arc::default(),
            wrap: Vec::new(),
            shared_db: None,
        };
        s.spawn_on(listen);
        s
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("url has a port")
    }

    /// Starts again on the same port (after [`Server::stop`]), so daemons find it.
    pub fn start_again(&mut self) {
        let listen = format!("127.0.0.1:{}", self.port());
        for _ in 0..50 {
            if std::net::TcpListener::bind(&listen).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.spawn_on(&listen);
    }

    fn spawn_on(&mut self, listen: &str) {
        let mut line: Vec<std::ffi::OsString> = self.wrap.iter().map(Into::into).collect();
        line.push(bin("mop-server").into());
        let mut child = Command::new(&line[0])
            .args(&line[1..])
            .args(["serve", "--listen", listen])
            .arg("--config")
            .arg(self.config())
            .arg("--db")
            .arg(self.db_arg())
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

    /// The log once it holds `needle` at least `times` times (its lines reach the test
    /// through a reader thread, a moment after the answers they describe); fails after
    /// 10 s.
    pub fn wait_log(&self, needle: &str, times: usize) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.matches(needle).count() >= times {
                return log;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{needle:?} is not {times} times in the log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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

    /// True while the process runs.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Creates a token with the CLI (an admin token in the name of "Test Curator").
    pub fn token(&self, role: &str, workspaces: &[&str]) -> String {
        self.token_named(
            role,
            workspaces,
            (role == "admin").then_some("Test Curator"),
        )
    }

    /// Creates a token with the CLI, for a named person.
    pub fn token_named(&self, role: &str, workspaces: &[&str], name: Option<&str>) -> String {
        let mut args = vec!["token", "create", "--role", role];
        for w in workspaces {
            args.extend(["--workspace", w]);
        }
        if let Some(n) = name {
            args.extend(["--name", n]);
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

/// A running `mopd` with its own config, token file and directories.
pub struct Daemon {
    child: Option<Child>,
    /// Its directory: config, token, cache, state, run.
    pub dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
    env: Vec<(String, String)>,
    user: Option<String>,
    wrap: Vec<String>,
}

/// Options for [`Daemon::start`].
pub struct DaemonOptions<'a> {
    /// Workspaces to sync.
    pub workspaces: &'a [&'a str],
    /// Poll interval.
    pub interval_secs: u64,
    /// Offline re-check interval.
    pub offline_recheck_secs: u64,
    /// Extra TOML appended to the config.
    pub extra: &'a str,
    /// Run the daemon as this user (primary group `mop`), as the packaged unit does;
    /// `None` runs it as the test's own user.
    pub user: Option<&'a str>,
    /// A command the daemon is started through, its own command line appended (for
    /// example `unshare -m … sh -c '… exec "$@"' sh` to give it a mount namespace).
    pub wrap: &'a [&'a str],
    /// Server replicas to use (`server.urls`) instead of the one server's URL.
    pub urls: &'a [&'a str],
    /// Extra keys of `[server]` (for example `ca_file = "…"`).
    pub server_extra: &'a str,
}

impl Default for DaemonOptions<'_> {
    fn default() -> Self {
        DaemonOptions {
            workspaces: &["acme"],
            interval_secs: 3600,
            offline_recheck_secs: 3600,
            extra: "",
            user: None,
            wrap: &[],
            urls: &[],
            server_extra: "",
        }
    }
}

impl Daemon {
    /// Writes a config for `server` with a fresh node token and starts `mopd run`.
    pub fn start(server: &Server, options: DaemonOptions<'_>) -> Daemon {
        Daemon::start_with_env(server, options, &[])
    }

    /// Like [`Daemon::start`], with extra environment variables for the daemon.
    pub fn start_with_env(
        server: &Server,
        options: DaemonOptions<'_>,
        env: &[(&str, &str)],
    ) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let token = server.token("node", options.workspaces);
        let token_file = dir.path().join("node.token");
        std::fs::write(&token_file, token).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        if let Some(user) = options.user {
            // The daemon's own directory: its user owns it, group mop may traverse it.
            let u = nix::unistd::User::from_name(user)
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("no user {user}"));
            let out = run(Command::new("chown")
                .arg("-R")
                .arg(format!("{user}:mop"))
                .arg(dir.path()));
            assert!(out.status.success(), "chown: {out:?}");
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
            assert_eq!(
                std::fs::metadata(&token_file)
                    .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
                    .unwrap(),
                u.uid.as_raw()
            );
        }
        let d = Daemon {
            child: None,
            dir,
            log: Arc::default(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            user: options.user.map(str::to_owned),
            wrap: options.wrap.iter().map(|s| s.to_string()).collect(),
        };
        d.write_config(&server.url, options);
        let mut d = d;
        d.spawn();
        d
    }

    /// Rewrites the config file (a running daemon reloads it).
    pub fn write_config(&self, url: &str, o: DaemonOptions<'_>) {
        let p = self.dir.path();
        let list = o
            .workspaces
            .iter()
            .map(|w| format!("\"{w}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let server = if o.urls.is_empty() {
            format!("url = \"{url}\"")
        } else {
            format!("urls = {:?}", o.urls)
        };
        let text = format!(
            "[server]\n{server}\n{}\ntoken_file = \"{}\"\ntimeout_secs = 5\n\
             [sync]\nworkspaces = [{list}]\ninterval_secs = {}\noffline_recheck_secs = {}\nbackoff_max_secs = 2\n\
             [paths]\ncache_dir = \"{}\"\nruntime_dir = \"{}\"\nstate_dir = \"{}\"\n{}",
            o.server_extra,
            p.join("node.token").display(),
            o.interval_secs,
            o.offline_recheck_secs,
            p.join("cache").display(),
            p.join("run").display(),
            p.join("state").display(),
            o.extra,
        );
        // Write beside and rename, as an editor or config manager would.
        let tmp = p.join("mopd.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.config()).unwrap();
    }

    /// The config file.
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("mopd.toml")
    }

    /// The control socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/mopd.sock")
    }

    /// A workspace's pool directory.
    pub fn pool(&self, ws: &str) -> PathBuf {
        self.dir.path().join("cache/pools").join(ws)
    }

    /// `mopd <args…> --config <this config>`.
    pub fn cli(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("mopd"));
        cmd.args(args).arg("--config").arg(self.config());
        cmd
    }

    /// Starts the daemon process and waits for its socket.
    pub fn spawn(&mut self) {
        self.log.lock().unwrap().clear();
        let mut line: Vec<std::ffi::OsString> = self.wrap.iter().map(Into::into).collect();
        if let Some(user) = &self.user {
            line.extend(
                [
                    "/usr/bin/setpriv",
                    "--reuid",
                    user,
                    "--regid",
                    "mop",
                    "--init-groups",
                    "--",
                ]
                .map(Into::into),
            );
        }
        line.push(bin("mopd").into());
        let mut cmd = Command::new(&line[0]);
        cmd.args(&line[1..]);
        let mut child = cmd
            .arg("run")
            .arg("--config")
            .arg(self.config())
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mopd");
        let stderr = child.stderr.take().expect("stderr");
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !self.log().contains("mopd started") {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("mopd exited with {status}; log:\n{}", self.log());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "mopd did not start; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits up to ten seconds for the log to contain `needle` (a thread reads the
    /// daemon's stderr, so a line written before an answer may reach it after), and
    /// panics with the log if it does not.
    pub fn wait_log(&self, needle: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !self.log().contains(needle) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?} in the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends a signal.
    pub fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid() {
            kill(Pid::from_raw(pid as i32), sig).expect("signal mopd");
        }
    }

    /// SIGKILL, no cleanup.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait; returns whether it exited successfully.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("signal mopd");
        for _ in 0..400 {
            if let Some(status) = child.try_wait().expect("wait") {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = child.kill();
        panic!(
            "mopd did not stop within 10 s of SIGTERM; log:\n{}",
            self.log()
        );
    }

    /// `mopd <args…> --socket <this socket>` (works even while the config is broken).
    pub fn ctl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("mopd"));
        cmd.args(args).arg("--socket").arg(self.socket());
        cmd
    }

    /// `mopd sync <ws>`; returns its stdout.
    pub fn sync(&self, ws: &str) -> String {
        let out = run(&mut self.ctl(&["sync", ws]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `mopd status --json`, parsed, with the exit code.
    pub fn status(&self) -> (i32, serde_json::Value) {
        let out = run(&mut self.ctl(&["status", "--json"]));
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "status --json: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        (out.status.code().unwrap_or(-1), v)
    }

    /// Waits until `f(status)` holds.
    pub fn wait_for(
        &self,
        what: &str,
        f: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.wait_for_within(what, Duration::from_secs(30), f)
    }

    /// Waits until `f(status)` holds, at most `limit`.
    pub fn wait_for_within(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let (_, v) = self.status();
            if f(&v) {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; status: {v:#}\nlog:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl Daemon {
    /// Waits until every configured workspace has a generation (the first sync runs at
    /// start).
    pub fn wait_synced(&self) -> serde_json::Value {
        self.wait_synced_within(Duration::from_secs(30))
    }

    /// [`Daemon::wait_synced`] with a longer limit, for large workspaces.
    pub fn wait_synced_within(&self, limit: Duration) -> serde_json::Value {
        self.wait_for_within("first generation", limit, |v| {
            v["workspaces"]
                .as_array()
                .is_some_and(|ws| !ws.is_empty() && ws.iter().all(|w| w["generation"].is_string()))
        })
    }
}

/// The unprivileged runner user of the task tests: `moprunner`, in group `mop`. Created
/// when missing (which needs root). `None` means the tests cannot run here; under CI
/// (`CI=true`) that is a failure, never a skip.
pub fn runner_user() -> Option<(u32, u32)> {
    use nix::unistd::{Group, User};
    let ensure = || -> Result<(), String> {
        if Group::from_name("mop").ok().flatten().is_none() {
            let out = run(Command::new("groupadd").args(["-f", "mop"]));
            if !out.status.success() {
                return Err(format!(
                    "groupadd mop: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        if User::from_name("moprunner").ok().flatten().is_none() {
            let out = run(Command::new("useradd").args([
                "-m",
                "-G",
                "mop",
                "-s",
                "/bin/sh",
                "moprunner",
            ]));
            if !out.status.success() && User::from_name("moprunner").ok().flatten().is_none() {
                return Err(format!(
                    "useradd moprunner: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        Ok(())
    };
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if let Err(e) = ensure() {
        assert!(!ci, "CI=true: the runner user is required: {e}");
        eprintln!("skipping: cannot create the runner user ({e}); run as root");
        return None;
    }
    let u = User::from_name("moprunner").ok().flatten()?;
    Some((u.uid.as_raw(), u.gid.as_raw()))
}

/// An unprivileged system user for the daemon, `mopdaemon`, with primary group `mop`
/// (as the packaged `mop` user): created when missing, which needs root. `None` means
/// the tests cannot run here; under CI that is a failure.
pub fn daemon_user() -> Option<&'static str> {
    runner_user()?;
    let name = "mopdaemon";
    if nix::unistd::User::from_name(name).ok().flatten().is_none() {
        let out = run(Command::new("useradd").args([
            "--system",
            "--no-create-home",
            "--gid",
            "mop",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ]));
        if !out.status.success() && nix::unistd::User::from_name(name).ok().flatten().is_none() {
            let why = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(
                !std::env::var("CI").is_ok_and(|v| v == "true"),
                "CI=true: the daemon user is required: {why}"
            );
            eprintln!("skipping: cannot create the daemon user ({why}); run as root");
            return None;
        }
    }
    Some(name)
}

/// Whether bubblewrap is installed; under CI its absence is a failure.
pub fn bwrap_available() -> bool {
    let found = ["/usr/bin/bwrap", "/bin/bwrap"]
        .iter()
        .any(|p| Path::new(p).exists());
    if !found {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "CI=true: bubblewrap must be installed (.ci/run installs it)"
        );
        eprintln!("skipping: bubblewrap is not installed");
    }
    found
}

/// A finished command's status, stdout and stderr, for assertion messages.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `mop <args…>` run as the unprivileged runner user, through `setpriv`.
pub fn as_runner(args: &[&std::ffi::OsStr]) -> Command {
    let mut cmd = runner_command(bin("mop"));
    cmd.args(args);
    cmd
}

/// Any program run as the unprivileged runner user (`moprunner`, with its groups).
pub fn runner_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("/usr/bin/setpriv");
    cmd.args([
        "--reuid",
        "moprunner",
        "--regid",
        "moprunner",
        "--init-groups",
        "--",
    ]);
    cmd.arg(program);
    cmd
}

/// One HTTP request over a Unix socket, made by `curl` run as the runner user (the owner
/// of the tasks the tests prepare as that user): `(status, body)`.
pub fn runner_socket_request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> (u16, Vec<u8>) {
    socket_request_as(runner_command("curl"), socket, method, path, body)
}

/// The same request with `curl` started by `cmd` (for example as another user).
pub fn socket_request_as(
    mut cmd: Command,
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> (u16, Vec<u8>) {
    cmd.args([
        "-sS",
        "--max-time",
        "30",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ])
    .arg("--unix-socket")
    .arg(socket)
    .args(["-H", "content-type: application/json"]);
    if body.is_some() {
        cmd.args(["--data-binary", "@-"]);
    }
    cmd.arg(format!("http://mop{path}"));
    let out = match body {
        Some(b) => run_with_stdin(&mut cmd, b),
        None => run(&mut cmd),
    };
    let text = out.stdout;
    let split = text.iter().rposition(|b| *b == b'\n').unwrap_or(0);
    let code = String::from_utf8_lossy(&text[split..])
        .trim()
        .parse()
        .unwrap_or(0);
    (code, text[..split].to_vec())
}

/// Pids of the processes of task `id`: bwrap (its command line names the task) and what
/// it started in the sandbox (its environment does).
pub fn task_processes(id: &str) -> Vec<u32> {
    let env_marker = format!("MOP_TASK_ID={id}\0");
    let arg_marker = format!("MOP_TASK_ID\0{id}\0");
    let has = |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let read = |f: &str| std::fs::read(e.path().join(f)).unwrap_or_default();
            (has(&read("environ"), &env_marker) || has(&read("cmdline"), &arg_marker))
                .then_some(pid)
        })
        .collect()
}

/// A self-signed certificate for 127.0.0.1 with the given common name.
pub fn self_signed(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let out = run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj"])
        .arg(format!("/CN={name}"))
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        // An end-entity certificate (webpki refuses a CA certificate as a server's).
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "extendedKeyUsage=serverAuth", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    assert!(out.status.success(), "openssl: {}", output_text(&out));
    (cert, key)
}

/// A free loopback TCP port below `net.ipv4.ip_local_port_range`: a fixed port, as a
/// service listens on, that no bind to port 0 hands out.
pub fn fixed_port() -> u16 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let low: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
    // Start at a point that depends on the process, so that tests running at once rarely
    // try the same ports.
    let span = low - 20000;
    let start = 20000 + (std::process::id() as u16 % span);
    (0..span)
        .map(|i| 20000 + (start - 20000 + i) % span)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below the ephemeral range")
}
