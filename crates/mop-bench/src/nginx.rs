//! nginx on loopback serving a directory: the static-file baseline of the sync and poll
//! benchmarks.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A running nginx; killed when dropped.
pub struct Nginx {
    child: Child,
    base: String,
}

impl Nginx {
    /// The URL of a served file.
    pub fn url(&self, file: &str) -> String {
        format!("{}/{file}", self.base)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: the master then stops its workers. A killed master
        // leaves them running, orphaned, with the port still bound.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts nginx in `dir` serving `files` (name, bytes) with ETags.
pub fn start(dir: &Path, files: &[(&str, &[u8])]) -> Result<Nginx> {
    let root = dir.join("root");
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir_all(dir.join("logs"))?;
    for (name, bytes) in files {
        std::fs::write(root.join(name), bytes)?;
    }
    let port = free_port()?;
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nworker_processes auto;\npid {pid};\nerror_log {err} warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {tmp};\n  proxy_temp_path {tmp};\n  \
             fastcgi_temp_path {tmp};\n  uwsgi_temp_path {tmp};\n  scgi_temp_path {tmp};\n  \
             server {{ listen 127.0.0.1:{port}; root {root}; etag on; }}\n}}\n",
            pid = dir.join("nginx.pid").display(),
            err = dir.join("logs/error.log").display(),
            tmp = dir.join("logs").display(),
            root = root.display(),
        ),
    )?;
    let child = Command::new("nginx")
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start nginx (apt-get install nginx)")?;
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while mop_testkit::http().get(&base).send().is_err() {
        if Instant::now() > deadline {
            bail!(
                "nginx did not start; see {}",
                dir.join("logs/error.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Nginx { child, base })
}
