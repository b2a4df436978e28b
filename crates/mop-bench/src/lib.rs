//! Benchmark harness for mop: synthetic workspaces ([`synth`]) and small statistics
//! helpers. Benchmarks run in release builds and report medians and p99s; they are never
//! timed tests, because shared machines are noisy.

pub mod synth;

use std::time::Duration;

/// Median and p99 of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// The median.
    pub median: Duration,
    /// The 99th percentile (nearest rank).
    pub p99: Duration,
    /// Number of samples.
    pub n: usize,
}

/// Summarises samples; panics on an empty set.
pub fn summarize(samples: &mut [Duration]) -> Summary {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    let rank =
        |q: f64| samples[((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    Summary {
        median: rank(0.5),
        p99: rank(0.99),
        n: samples.len(),
    }
}

/// A duration in a unit that reads well: µs below 10 ms, ms below 10 s, s above.
pub fn show(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10_000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000_000.0 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// One benchmark's part of BENCHMARKS.md: a Markdown body and the targets it judged.
#[derive(Debug, Default)]
pub struct Section {
    /// The heading.
    pub title: String,
    /// What was measured, how, and the table of results (Markdown).
    pub body: String,
    /// The targets of the issue this section measured.
    pub targets: Vec<Target>,
    /// Figures the regression guard (`mop-bench all --compare`) compares run to run.
    pub figures: Vec<Figure>,
}

/// One number a later run is compared against: a stable key, the value, its unit, and
/// which way is better.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Stable across runs, e.g. `engine.per_task_median_us.10000`.
    pub key: String,
    /// The value.
    pub value: f64,
    /// True when a smaller value is better (times, bytes); false for rates and ratios
    /// where more is better.
    pub lower_is_better: bool,
}

/// A target and how the run did against it.
#[derive(Debug, Clone)]
pub struct Target {
    /// What is compared, e.g. "cold sync of 10k cards vs curl + tar".
    pub what: String,
    /// The target, e.g. "≤ 1.5×".
    pub target: String,
    /// The figure this run measured.
    pub measured: String,
    /// Whether it was met.
    pub met: bool,
}

impl Section {
    /// A section with a heading.
    pub fn new(title: impl Into<String>) -> Section {
        Section {
            title: title.into(),
            ..Section::default()
        }
    }

    /// Appends a line to the body.
    pub fn line(&mut self, text: impl AsRef<str>) {
        self.body.push_str(text.as_ref());
        self.body.push('\n');
    }

    /// Records a target.
    pub fn target(&mut self, what: &str, target: &str, measured: String, met: bool) {
        self.targets.push(Target {
            what: what.into(),
            target: target.into(),
            measured,
            met,
        });
    }

    /// Records a figure for the regression guard.
    pub fn figure(&mut self, key: impl Into<String>, value: f64, lower_is_better: bool) {
        self.figures.push(Figure {
            key: key.into(),
            value,
            lower_is_better,
        });
    }

    /// The section as Markdown.
    pub fn render(&self) -> String {
        format!("## {}\n\n{}\n", self.title, self.body.trim_end())
    }
}

/// Median of floats (upper median); panics on an empty set.
pub fn median_f64(v: &[f64]) -> f64 {
    assert!(!v.is_empty(), "no samples");
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU time (user + system) a process has used so far, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> std::io::Result<Duration> {
    let f = stat_fields(pid)?;
    Ok(ticks(&f[11]) + ticks(&f[12]))
}

/// User and system CPU time a process has used so far, apart.
pub fn cpu_times(pid: u32) -> std::io::Result<(Duration, Duration)> {
    let f = stat_fields(pid)?;
    Ok((ticks(&f[11]), ticks(&f[12])))
}

/// User and system CPU time of this process's children that ended and were waited for:
/// the difference around one `Command::status()` is that command's cost, its own children
/// included.
pub fn children_cpu_times() -> (Duration, Duration) {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage of children works");
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    (d(usage.user_time()), d(usage.system_time()))
}

/// CPU time of a process and all its children, living or gone: for a server that forks a
/// process per connection (PostgreSQL). Children that ended count through the parent's
/// `cutime`/`cstime`, living ones through their own times.
pub fn cpu_time_tree(pid: u32) -> std::io::Result<Duration> {
    let f = stat_fields(pid)?;
    let mut total = ticks(&f[11]) + ticks(&f[12]) + ticks(&f[13]) + ticks(&f[14]);
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may end between the listing and the read.
        if let Ok(c) = stat_fields(child)
            && c[1].parse::<u32>().ok() == Some(pid)
        {
            total += cpu_time_tree(child).unwrap_or_default();
        }
    }
    Ok(total)
}

/// The fields of `/proc/<pid>/stat` after the command name (state is `[0]`, ppid `[1]`).
fn stat_fields(pid: u32) -> std::io::Result<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name is in parentheses and may contain spaces.
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .ok_or_else(|| std::io::Error::other("unreadable /proc stat"))?;
    Ok(rest.split_whitespace().map(str::to_owned).collect())
}

fn ticks(field: impl AsRef<str>) -> Duration {
    // USER_HZ is 100 on every Linux architecture mop supports.
    Duration::from_millis(field.as_ref().parse::<u64>().unwrap_or(0) * 10)
}

/// Resident memory of a process, in bytes, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss: u64,
    /// `VmHWM`: the peak of `VmRSS`.
    pub hwm: u64,
    /// `RssAnon`: heap and stacks.
    pub anon: u64,
    /// `RssFile`: mapped files (the binary, mmapped indexes).
    pub file: u64,
}

/// The resident memory of a process.
pub fn memory(pid: u32) -> std::io::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |k| k * 1024)
    };
    Ok(Memory {
        rss: kb("VmRSS:"),
        hwm: kb("VmHWM:"),
        anon: kb("RssAnon:"),
        file: kb("RssFile:"),
    })
}

/// Bytes in a unit that reads well.
pub fn show_bytes(b: u64) -> String {
    let b = b as f64;
    if b < 10.0 * 1024.0 {
        format!("{b:.0} B")
    } else if b < 10.0 * 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    }
}

/// The machine, for the head of BENCHMARKS.md.
pub fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or("?".into(), |k| format!("{:.1} GiB", k as f64 / 1048576.0));
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".into());
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    format!("{cpu}, {cores} cores available, {mem} RAM; {os}, kernel {kernel}")
}

/// A TCP proxy on loopback that counts the bytes passing each way: "bytes on the wire"
/// between a daemon and the server, HTTP headers included.
pub struct CountingProxy {
    /// Where clients connect.
    pub addr: std::net::SocketAddr,
    to_server: std::sync::Arc<std::sync::atomic::AtomicU64>,
    to_client: std::sync::Arc<std::sync::atomic::AtomicU64>,
    _rt: tokio::runtime::Runtime,
}

impl CountingProxy {
    /// Starts a proxy to `upstream`.
    pub fn start(upstream: std::net::SocketAddr) -> std::io::Result<CountingProxy> {
        use std::sync::Arc;
        use std::sync::atomic::AtomicU64;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let to_server = Arc::new(AtomicU64::new(0));
        let to_client = Arc::new(AtomicU64::new(0));
        let (up, down) = (to_server.clone(), to_client.clone());
        rt.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (up, down) = (up.clone(), down.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, up), pump(sr, cw, down));
                });
            }
        });
        Ok(CountingProxy {
            addr,
            to_server,
            to_client,
            _rt: rt,
        })
    }

    /// Bytes sent (to the server, to the client) since the last call; resets both.
    pub fn take(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (
            self.to_server.swap(0, Ordering::SeqCst),
            self.to_client.swap(0, Ordering::SeqCst),
        )
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                count.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}
