//! Security round three (issue 30), the high-severity chain: an agent in the default
//! profile (which shares the host's network) takes mop-server's loopback port while the
//! server restarts and catches mopd's node token on its next poll. Written as the attack,
//! each with its control:
//!
//! - in the default profile the agent cannot bind the server's or mopd's metrics port
//!   (Landlock), while a profile allowed to bind it catches the token over plain HTTP (the
//!   hole is real), and the real server starts again on its port;
//! - over TLS with a pinned certificate the same squatter gets a failed handshake and not
//!   one byte;
//! - on the server's Unix socket no local user can stand in for it, while the same user
//!   catches the token from a plain-HTTP loopback server.
//!
//! The real mop-server, mopd and bubblewrap; runners are the unprivileged user
//! `moprunner`.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mop_testkit::procs::output_text as text;
use mop_testkit::procs::{
    Daemon, DaemonOptions, Server, as_runner, bwrap_available, fixed_port, runner_user, self_signed,
};
use mop_testkit::world::World;
use mop_testkit::{example_cards_dir, profiles_config};
use serde_json::Value;

const WS: &str = "acme";
const PYTHON: &str = "/usr/bin/python3";

/// The squatter an agent would run: bind the port (retrying while it is taken), then
/// answer one connection, over TLS when given a certificate, and keep what arrived in
/// `captured` of the working directory. Prints what happened as JSON.
const SQUATTER: &str = r#"
import json, socket, ssl, sys, time
port = int(sys.argv[1]); cert = sys.argv[2] if len(sys.argv) > 2 else None
out = {"port": port}
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
deadline = time.time() + 10
while True:
    try:
        s.bind(("127.0.0.1", port)); out["bound"] = True; break
    except OSError as e:
        out["errno"] = e.errno
        if e.errno == 13 or time.time() > deadline:
            out["bound"] = False; print(json.dumps(out)); sys.exit(0)
        time.sleep(0.05)
s.listen(8)
# A port the kernel picks stays open to the agent (its own test servers).
e = socket.socket(); e.bind(("127.0.0.1", 0)); out["ephemeral"] = e.getsockname()[1]; e.close()
open("listening", "w").write("1")
s.settimeout(30)
got = b""
try:
    c, _ = s.accept()
    c.settimeout(10)
    if cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(cert, sys.argv[3])
        try:
            c = ctx.wrap_socket(c, server_side=True); out["handshake"] = True
        except (ssl.SSLError, OSError) as err:
            out["handshake"] = False; out["tls_error"] = str(err)[:200]
    if out.get("handshake", True):
        while b"\r\n\r\n" not in got:
            chunk = c.recv(65536)
            if not chunk: break
            got += chunk
except OSError as err:
    out["accept_error"] = str(err)
open("captured", "wb").write(got)
out["captured_bytes"] = len(got)
print(json.dumps(out))
"#;

/// Only binds, for each port given: the errno, or 0 when the bind worked; then the first
/// port again with the stream sockets that take TCP clients without being TCP (MPTCP and
/// SMC, through AF_INET and AF_SMC).
const BIND_PROBE: &str = r#"
import json, socket, sys
out = {}
def bind(key, family, proto, port):
    try:
        s = socket.socket(family, socket.SOCK_STREAM, proto)
    except OSError as e:
        out[key] = "socket:%d" % e.errno; return
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port)); out[key] = 0
    except OSError as e:
        out[key] = e.errno
    s.close()
for p in sys.argv[1:]:
    bind(p, socket.AF_INET, 0, int(p))
first = int(sys.argv[1])
bind("mptcp", socket.AF_INET, 262, first)
bind("smc", socket.AF_INET, 256, first)
bind("af_smc", 43, 0, first)
print(json.dumps(out))
"#;

mop_testkit::world_env! {
    /// The world of these tests (its server and daemon on fixed ports), and its profiles.
    Env {
        /// Profiles written for this test (`squatter`: allowed to bind the ports in use).
        _profiles: tempfile::TempDir,
    }
}

/// A server on a fixed loopback port (as packaged: 8731, below the ephemeral range), a
/// daemon with its metrics on another fixed port, and a profile `squatter` that may bind
/// both: the control.
fn setup(server_config: &str, tls: Option<&Path>) -> Option<(Env, u16)> {
    runner_user()?;
    if !bwrap_available() {
        return None;
    }
    let port = fixed_port();
    let server = Server::start_listening(server_config, &format!("127.0.0.1:{port}"));
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let metrics = fixed_port();
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("squatter.toml"),
        format!(
            "description = \"the control: a profile that lets tasks listen on the server's port\"\nbind_ports = [{port}, {metrics}]\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(profiles.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let metrics_token = profiles.path().join("metrics.token");
    std::fs::write(&metrics_token, "metrics-scrape-token\n").unwrap();
    std::fs::set_permissions(&metrics_token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let extra = format!(
        "{}[metrics]\nlisten = \"127.0.0.1:{metrics}\"\ntoken_file = \"{}\"\n",
        profiles_config(&[profiles.path()]),
        metrics_token.display()
    );
    let ca = tls.map(|c| format!("ca_file = \"{}\"", c.display()));
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            extra: &extra,
            server_extra: ca.as_deref().unwrap_or(""),
            ..Default::default()
        },
    );
    daemon.wait_synced();
    let admin = server.token("admin", &[WS]);
    Some((
        Env {
            world: World::around(server, daemon, admin, &[WS]),
            _profiles: profiles,
        },
        metrics,
    ))
}

impl Env {
    /// `mop run` of `command` as the runner, in `profile`.
    fn mop_run(&self, task: &str, workdir: &Path, profile: &str, command: &[&OsStr]) -> Command {
        let task = self.world.task(task).user("alice").title("x");
        let command: Vec<&str> = command
            .iter()
            .map(|c| c.to_str().expect("UTF-8 arguments"))
            .collect();
        let a = self
            .world
            .run_args(&task, workdir, &["--profile", profile], &command);
        let refs: Vec<&OsStr> = a.iter().map(OsString::as_os_str).collect();
        let mut cmd = as_runner(&refs);
        cmd.stdin(Stdio::null());
        cmd
    }

    /// The squatter started in `profile`, waiting to bind `port`.
    fn squat(&self, task: &str, w: &Path, profile: &str, port: u16, tls: &[&Path]) -> Child {
        let port = port.to_string();
        let mut command: Vec<&OsStr> = vec![PYTHON.as_ref(), "-c".as_ref(), SQUATTER.as_ref()];
        command.push(port.as_ref());
        command.extend(tls.iter().map(|p| p.as_os_str()));
        self.mop_run(task, w, profile, &command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// The squatter's report.
fn report(child: Child) -> Value {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

/// Waits until the squatter listens (its `listening` file).
fn wait_listening(w: &Path, child: &mut Child) {
    let start = Instant::now();
    while !w.join("listening").exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the squatter ended ({status}) before it listened");
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn node_token(daemon: &Daemon) -> String {
    let config = std::fs::read_to_string(daemon.config()).unwrap();
    let path = config
        .lines()
        .find_map(|l| l.strip_prefix("token_file = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap()
        .to_owned();
    std::fs::read_to_string(PathBuf::from(path))
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn an_agent_cannot_take_the_servers_or_the_metrics_port_and_the_server_starts_again() {
    let Some((mut env, metrics)) = setup("", None) else {
        return;
    };
    let port = env.server.port();
    let token = node_token(&env.daemon);
    // The server stops for an upgrade: its port is free.
    assert!(env.server.stop());

    // The attack, in the default profile: both ports refused by Landlock (EACCES, even the
    // metrics port mopd holds: the refusal comes before the kernel looks whether it is in
    // use), while a port the kernel picks still works.
    let w = env.workdir();
    let (p, m) = (port.to_string(), metrics.to_string());
    let out = mop_testkit::procs::run(&mut env.mop_run(
        "squat-default",
        w.path(),
        "default",
        &[
            PYTHON.as_ref(),
            "-c".as_ref(),
            BIND_PROBE.as_ref(),
            p.as_ref(),
            m.as_ref(),
            "0".as_ref(),
        ],
    ));
    assert!(out.status.success(), "{}", text(&out));
    let probe: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    eprintln!("default profile, binds: {probe}");
    assert_eq!(probe[&p], 13, "the server's port: {probe}");
    assert_eq!(probe[&m], 13, "mopd's metrics port: {probe}");
    assert_eq!(probe["0"], 0, "a port the kernel picks: {probe}");
    // Nor through a stream socket that takes TCP clients without being TCP.
    for other in ["mptcp", "smc", "af_smc"] {
        assert_eq!(
            probe[other], "socket:1",
            "{other} refused by seccomp: {probe}"
        );
    }
    // The control: the same user outside any sandbox takes the free port with MPTCP.
    let out = mop_testkit::procs::run(
        mop_testkit::procs::runner_command(PYTHON).args(["-c", BIND_PROBE, &p]),
    );
    let outside: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(
        outside["mptcp"], 0,
        "MPTCP takes the port outside: {outside}"
    );
    let w = env.workdir();
    let squatter = env.squat("squat-default-2", w.path(), "default", port, &[]);
    let r = report(squatter);
    assert_eq!(r["bound"], false, "{r}");
    assert_eq!(r["errno"], 13, "{r}");

    // The control: a profile that lists both ports. The metrics port is mopd's (in use);
    // the server's port is free, and the squatter there catches mopd's next poll with the
    // node token: the hole the default profile now closes.
    let out = mop_testkit::procs::run(&mut env.mop_run(
        "squat-allowed-probe",
        w.path(),
        "squatter",
        &[
            PYTHON.as_ref(),
            "-c".as_ref(),
            BIND_PROBE.as_ref(),
            m.as_ref(),
        ],
    ));
    let probe: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(probe[&m], 98, "EADDRINUSE, not a refusal: {probe}");
    let w = env.workdir();
    let mut squatter = env.squat("squat-allowed", w.path(), "squatter", port, &[]);
    wait_listening(w.path(), &mut squatter);
    let synced = env.daemon.sync(WS);
    let r = report(squatter);
    eprintln!("squatter allowed to bind: {r}; mopd: {synced}");
    assert_eq!(r["bound"], true, "{r}");
    assert!(r["ephemeral"].as_u64().unwrap() > 0, "{r}");
    let captured = String::from_utf8_lossy(&std::fs::read(w.path().join("captured")).unwrap())
        .to_ascii_lowercase();
    assert!(
        captured.contains(&format!(
            "authorization: bearer {}",
            token.to_ascii_lowercase()
        )),
        "control: over plain HTTP the squatter gets the node token: {captured:?}"
    );

    // The real server starts again on its port (nothing holds it), and mopd syncs.
    env.server.start_again();
    assert_eq!(env.server.port(), port);
    let synced = env.daemon.sync(WS);
    assert!(
        synced.starts_with("acme: ") && !synced.contains("fail"),
        "{synced}"
    );
    // mop doctor says this kernel confines binding.
    let out = mop_testkit::procs::run(&mut as_runner(&["doctor".as_ref(), "--json".as_ref()]));
    let doctor: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doctor["tcp_ports"]["blocked"], true, "{doctor}");
}

#[test]
fn over_tls_with_a_pinned_certificate_the_token_never_reaches_a_squatter() {
    let certs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(certs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (cert, key) = self_signed(certs.path(), "mop-server");
    // The squatter's own certificate for the same address and name: all an impostor can
    // make without the server's key.
    let (fake_cert, fake_key) = self_signed(certs.path(), "mop-server-impostor");
    for f in [&fake_cert, &fake_key] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let Some((mut env, _)) = setup(
        &format!(
            "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
            cert.display(),
            key.display()
        ),
        Some(&cert),
    ) else {
        return;
    };
    assert!(env.server.url.starts_with("https://"), "{}", env.server.url);
    let port = env.server.port();
    assert!(env.server.stop());

    // Even where a profile lets the agent bind the port, mopd sends its token only after
    // the peer proved to hold the pinned certificate's key: the impostor gets a failed
    // handshake and not one byte of a request.
    let w = env.workdir();
    // The impostor's certificate and key, in its working directory (the sandbox's /tmp is
    // its own).
    let (in_cert, in_key) = (w.path().join("impostor.crt"), w.path().join("impostor.key"));
    std::fs::copy(&fake_cert, &in_cert).unwrap();
    std::fs::copy(&fake_key, &in_key).unwrap();
    let mut squatter = env.squat(
        "squat-tls",
        w.path(),
        "squatter",
        port,
        &[&in_cert, &in_key],
    );
    wait_listening(w.path(), &mut squatter);
    let synced = env.daemon.sync(WS);
    let r = report(squatter);
    eprintln!("TLS squatter: {r}; mopd: {synced}");
    assert_eq!(r["bound"], true, "{r}");
    assert_eq!(
        r["handshake"], false,
        "mopd refused the impostor's certificate: {r}"
    );
    assert_eq!(r["captured_bytes"], 0, "{r}");
    assert!(synced.contains("fail"), "{synced}");

    // The control: the real server, back on its port with the pinned certificate, gets
    // the token and answers.
    env.server.start_again();
    let synced = env.daemon.sync(WS);
    assert!(
        synced.starts_with("acme: ") && !synced.contains("fail"),
        "{synced}"
    );
}

#[test]
fn a_ca_file_is_only_for_https_and_must_hold_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    let token = dir.path().join("node.token");
    std::fs::write(&token, "t\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let check = |url: &str, ca: &Path| {
        let config = dir.path().join("mopd.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nurl = \"{url}\"\nca_file = \"{}\"\ntoken_file = \"{}\"\n[sync]\nworkspaces = [\"acme\"]\n",
                ca.display(),
                token.display()
            ),
        )
        .unwrap();
        // A bad config stops the daemon before it does anything.
        mop_testkit::procs::run(
            Command::new(mop_testkit::procs::bin("mopd"))
                .arg("run")
                .arg("--config")
                .arg(&config),
        )
    };
    let out = check("http://127.0.0.1:8731", &bad);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("server.ca_file is set but server.url"),
        "{}",
        text(&out)
    );
    let out = check("https://127.0.0.1:8731", &bad);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("server.ca_file: {}", bad.display())),
        "{}",
        text(&out)
    );
}

/// Binds a Unix socket at the path given, then reports the errno (0 when it worked).
const UNIX_BIND_PROBE: &str = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.bind(sys.argv[1]); print(json.dumps({"errno": 0}))
except OSError as e:
    print(json.dumps({"errno": e.errno}))
"#;

/// A co-located mop-server on its Unix socket: only mop-server can create the socket in
/// its own directory, so while the server is down a local user (here the runner's uid,
/// outside any sandbox) can neither take its place nor catch the node token, and the real
/// server comes back on it. The control: the same user, with the server on plain HTTP on
/// loopback, takes the port and catches the token.
#[test]
fn on_the_servers_unix_socket_no_local_user_can_stand_in_for_it() {
    if runner_user().is_none() {
        return;
    }
    // mop-server's own directory (the packaged unit's /run/mop-server): root's, 0755.
    let run = tempfile::tempdir().unwrap();
    std::fs::set_permissions(run.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = run.path().join("api.sock");
    let mut server = Server::start_with(&format!("[server]\nsocket = \"{}\"\n", socket.display()));
    assert!(server.import(&example_cards_dir(), WS).status.success());
    let url = format!("unix:{}", socket.display());
    let daemon = Daemon::start(
        &server,
        DaemonOptions {
            urls: &[&url],
            ..Default::default()
        },
    );
    daemon.wait_synced();
    let (_, status) = daemon.status();
    assert_eq!(status["daemon"]["server_url"], url.as_str(), "{status}");

    assert!(server.stop());
    let out = mop_testkit::procs::run(
        mop_testkit::procs::runner_command(PYTHON)
            .args(["-c", UNIX_BIND_PROBE])
            .arg(&socket),
    );
    let probe: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(probe["errno"], 13, "EACCES: {probe}");
    let synced = daemon.sync(WS);
    assert!(synced.contains("fail"), "{synced}");
    server.start_again();
    let synced = daemon.sync(WS);
    assert!(
        synced.starts_with("acme: ") && !synced.contains("fail"),
        "{synced}"
    );

    // The control: plain HTTP on a loopback port, the same user, outside any sandbox.
    let port = fixed_port();
    let mut plain = Server::start_listening("", &format!("127.0.0.1:{port}"));
    assert!(plain.import(&example_cards_dir(), WS).status.success());
    let daemon = Daemon::start(&plain, DaemonOptions::default());
    daemon.wait_synced();
    let token = node_token(&daemon);
    assert!(plain.stop());
    let w = tempfile::tempdir().unwrap();
    let (uid, gid) = runner_user().unwrap();
    nix::unistd::chown(w.path(), Some(uid.into()), Some(gid.into())).unwrap();
    let mut squatter = mop_testkit::procs::runner_command(PYTHON)
        .args(["-c", SQUATTER, &port.to_string()])
        .current_dir(w.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(w.path(), &mut squatter);
    daemon.sync(WS);
    let r = report(squatter);
    assert_eq!(r["bound"], true, "{r}");
    let captured = String::from_utf8_lossy(&std::fs::read(w.path().join("captured")).unwrap())
        .to_ascii_lowercase();
    assert!(
        captured.contains(&format!(
            "authorization: bearer {}",
            token.to_ascii_lowercase()
        )),
        "control: over plain HTTP a local user gets the node token: {captured:?}"
    );
}

#[test]
fn a_unix_server_url_must_be_in_a_directory_only_its_owner_writes() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("node.token");
    std::fs::write(&token, "t\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let config = dir.path().join("mopd.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nurl = \"unix:{}/api.sock\"\ntoken_file = \"{}\"\n[sync]\nworkspaces = [\"acme\"]\n",
            open.path().display(),
            token.display()
        ),
    )
    .unwrap();
    let out = mop_testkit::procs::run(
        Command::new(mop_testkit::procs::bin("mopd"))
            .arg("run")
            .arg("--config")
            .arg(&config),
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("anyone could put a socket there"),
        "{}",
        text(&out)
    );
}
