//! A real PostgreSQL for the tests that need one: Debian's `postgresql` package, a fresh
//! cluster made with `initdb` in a temporary directory and run with `pg_ctl` as the
//! unprivileged `postgres` user, listening on a free loopback port only. Stopped (fast)
//! and removed when dropped. Under `CI=true` a missing installation fails the test
//! instead of skipping it (`.ci/run` installs the package).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running PostgreSQL server.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

/// The newest installed server's `bin` directory.
fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

/// Runs a command as the `postgres` user.
fn as_postgres(program: &Path) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--"]).arg(program);
    cmd
}

fn ok(what: &str, out: std::io::Result<Output>) {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Postgres {
    /// Starts a fresh cluster, or `None` (outside CI) when PostgreSQL is not installed.
    pub fn start() -> Option<Postgres> {
        let Some(bin) = bin_dir() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "PostgreSQL must be installed under CI (.ci/run installs the postgresql package)"
            );
            eprintln!("skipping: PostgreSQL is not installed (apt-get install postgresql)");
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("mop-pg-")
            .tempdir()
            .expect("temp dir");
        ok(
            "chown the cluster directory",
            Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .output(),
        );
        let data = dir.path().join("data");
        ok(
            "initdb",
            as_postgres(&bin.join("initdb"))
                .args(["-A", "trust", "-U", "mop", "-E", "UTF8", "--no-sync", "-D"])
                .arg(&data)
                .output(),
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let pg = Postgres { dir, bin, port };
        pg.start_again();
        ok(
            "createdb",
            Command::new(pg.bin.join("createdb"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-U",
                    "mop",
                    "mop",
                ])
                .output(),
        );
        Some(pg)
    }

    /// Starts the server (again, after [`Postgres::stop`]) on the same port and data.
    pub fn start_again(&self) {
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        ok(
            "pg_ctl start",
            as_postgres(&self.bin.join("pg_ctl"))
                .args(["start", "-w", "-t", "30", "-D"])
                .arg(self.dir.path().join("data"))
                .args(["-l"])
                .arg(self.dir.path().join("log"))
                .args(["-o", &options])
                .output(),
        );
    }

    /// Stops the server (fast: open connections are ended).
    pub fn stop(&self) {
        ok(
            "pg_ctl stop",
            as_postgres(&self.bin.join("pg_ctl"))
                .args(["stop", "-m", "fast", "-w", "-D"])
                .arg(self.dir.path().join("data"))
                .output(),
        );
    }

    /// The postmaster's process id (its backends are its children).
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.path().join("data/postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// A connection URL for database `mop` as user `mop`.
    pub fn url(&self) -> String {
        format!("postgres://mop@127.0.0.1:{}/mop", self.port)
    }

    /// Runs SQL with `psql` and returns its unaligned output.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "mop",
                "-d",
                "mop",
            ])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .args(["stop", "-m", "fast", "-w", "-D"])
            .arg(self.dir.path().join("data"))
            .output();
    }
}
