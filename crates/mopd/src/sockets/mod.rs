//! The daemon's Unix sockets: [`control`] (`<runtime_dir>/mopd.sock`, runners and
//! operators) and [`agent`] (one per task, inside its sandbox). Both accept through
//! [`CheckedListener`], which admits a peer by its credentials before it can send a byte,
//! and both answer errors as JSON through [`error`], with bodies capped by [`guarded`].
//! Connection caps and timeouts are `mop_serve`'s.
//!
//! Owns the HTTP side only: every decision about tasks, workspaces or the pool is made by
//! the modules it calls.

pub mod agent;
pub mod control;
pub mod metrics;

use std::io;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::{UnixListener, UnixStream};

/// The largest request body either socket accepts. A prepare, a store or a retrieve is a
/// few KiB; anything near this is a mistake or an attack, refused before it is buffered.
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;

/// A JSON error: `{"error": <reason phrase>, "message": …}`.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    error_with_code(
        status,
        mop_proto::error::codes::for_status(status.as_u16()),
        message,
    )
}

/// A JSON error answer with a stable code (a store refusal passes the server's on, so
/// agents and tests classify it by kind, never by its message).
pub fn error_with_code(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(mop_proto::error::ErrorBody::new(code, message)),
    )
        .into_response()
}

/// Parses a JSON request body, or answers 400 naming what is wrong. An empty body is the
/// request's default.
#[allow(clippy::result_large_err)]
pub fn json_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, Response> {
    if body.is_empty() {
        return Ok(T::default());
    }
    json_required(body)
}

/// Parses a JSON request body that must be there.
#[allow(clippy::result_large_err)]
pub fn json_required<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid request: {e}")))
}

/// Applies the size limit, and turns the plain-text rejections of axum's extractors
/// (an oversized or unreadable body) into JSON errors like every other answer.
pub fn guarded<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .layer(axum::middleware::map_response(json_rejections))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
}

async fn json_rejections(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return error(
            status,
            format!(
                "the request body is over the {} KiB limit",
                MAX_REQUEST_BYTES / 1024
            ),
        );
    }
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    error(status, String::from_utf8_lossy(&body).trim().to_owned())
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// Its uid.
    pub uid: u32,
    /// Its pid.
    pub pid: Option<i32>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, CheckedListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, CheckedListener>) -> Self {
        *stream.remote_addr()
    }
}

/// Whom a socket admits.
#[derive(Debug)]
pub enum Admit {
    /// Processes of this host, outside any sandbox: the peer's user namespace and pid
    /// namespace depth must be the daemon's own (the control socket).
    Host(HostIdentity),
    /// One uid only, a task's owner (its agent socket, reached from inside the sandbox).
    Owner(u32),
}

/// The daemon's own namespaces, which a host peer must share.
#[derive(Debug)]
pub struct HostIdentity {
    userns: u64,
    uid_map: String,
    pid_depth: usize,
}

impl HostIdentity {
    /// This process's.
    pub fn own() -> io::Result<HostIdentity> {
        Ok(HostIdentity {
            userns: userns_of("self")?,
            uid_map: uid_map_of("self")?,
            pid_depth: pid_ns_depth("self")?,
        })
    }
}

/// The inode of a process's user namespace. Reading it needs ptrace access to the
/// process, which an unprivileged mopd lacks for other users' processes.
fn userns_of(pid: &str) -> io::Result<u64> {
    Ok(std::fs::metadata(format!("/proc/{pid}/ns/user"))?.ino())
}

/// A process's uid map (world-readable): in the initial user namespace it is the identity
/// map; a process in a namespace of its own shows another one.
fn uid_map_of(pid: &str) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/uid_map"))
}

/// How deep a process's pid namespace is nested (the entries of `NSpid:` in its
/// world-readable status file). Every bwrap sandbox has a pid namespace of its own, so
/// a peer nested deeper than mopd is in a sandbox, whoever owns it.
fn pid_ns_depth(pid: &str) -> io::Result<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    nspid_depth(&status).ok_or_else(|| io::Error::other("no NSpid line"))
}

fn nspid_depth(status: &str) -> Option<usize> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|rest| rest.split_whitespace().count())
}

/// A Unix listener that admits peers by their credentials ([`Admit`]); the others are
/// closed at once, before they can send a byte.
pub struct CheckedListener {
    inner: UnixListener,
    admit: Admit,
    refused: u64,
}

impl CheckedListener {
    /// Wraps a bound listener.
    pub fn new(inner: UnixListener, admit: Admit) -> CheckedListener {
        CheckedListener {
            inner,
            admit,
            refused: 0,
        }
    }

    /// The peer of `stream` if it is admitted, else why not.
    fn check(&self, stream: &UnixStream) -> Result<Peer, (Option<Peer>, &'static str)> {
        let Ok(cred) = stream.peer_cred() else {
            return Err((None, "a connection whose peer credentials are unreadable"));
        };
        let peer = Peer {
            uid: cred.uid(),
            pid: cred.pid(),
        };
        let refusal = match &self.admit {
            Admit::Owner(uid) => (peer.uid != *uid)
                .then_some("an agent socket connection from another uid than the task's owner"),
            Admit::Host(own) => host_refusal(own, stream, peer),
        };
        match refusal {
            None => Ok(peer),
            Some(why) => Err((Some(peer), why)),
        }
    }
}

/// Whether a peer runs on the host as the daemon does (see [`Admit::Host`]).
fn host_refusal(own: &HostIdentity, stream: &UnixStream, peer: Peer) -> Option<&'static str> {
    let Some(pid) = peer.pid else {
        return Some("a control connection without a peer pid");
    };
    // Hold the peer while /proc/<pid> is read. SO_PEERPIDFD names the very process that
    // connected; before Linux 6.5 a pidfd opened now at least fixes which process the
    // reads below see.
    let pidfd = match crate::sys::peer_pidfd(stream) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
            match crate::sys::pidfd_open(pid) {
                Ok(fd) => fd,
                Err(_) => {
                    return Some("a control connection whose process exited before it was checked");
                }
            }
        }
        // ESRCH: the peer is gone already; its pid may belong to anyone now.
        Err(_) => return Some("a control connection whose process exited before it was checked"),
    };
    let pid_s = pid.to_string();
    // The user namespace: its inode when we may read it (root, or the same user), else the
    // uid map, which anyone may read. The pid namespace depth always.
    let userns_ok = match userns_of(&pid_s) {
        Ok(ns) => ns == own.userns,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            uid_map_of(&pid_s).is_ok_and(|m| m == own.uid_map)
        }
        Err(_) => false,
    };
    let pidns_ok = pid_ns_depth(&pid_s).is_ok_and(|d| d == own.pid_depth);
    if crate::sys::pidfd_exited(&pidfd) {
        Some("a control connection whose process exited while it was checked")
    } else if !userns_ok {
        Some("a control connection from another user namespace")
    } else if !pidns_ok {
        Some("a control connection from a nested pid namespace (a sandbox)")
    } else {
        None
    }
}

impl axum::serve::Listener for CheckedListener {
    type Io = UnixStream;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, _)) => match self.check(&stream) {
                    Ok(peer) => return (stream, peer),
                    Err((peer, why)) => {
                        // An agent flooding its own socket is logged once per hundred, so
                        // it cannot flood the journal; every refusal at the control socket
                        // (a sandbox escape attempt) is logged.
                        let owner_only = matches!(self.admit, Admit::Owner(_));
                        if !owner_only || self.refused.is_multiple_of(100) {
                            tracing::warn!(
                                peer_uid = ?peer.map(|p| p.uid),
                                peer_pid = ?peer.and_then(|p| p.pid),
                                refused = self.refused + 1,
                                "refused {why}"
                            );
                        }
                        self.refused += 1;
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(Peer {
            uid: nix::unistd::getuid().as_raw(),
            pid: Some(std::process::id() as i32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_depth_counts_nesting() {
        assert_eq!(nspid_depth("Name:\tx\nNSpid:\t4242\n"), Some(1));
        assert_eq!(nspid_depth("Name:\tx\nNSpid:\t4242\t7\t1\n"), Some(3));
        assert_eq!(nspid_depth("Name:\tx\n"), None);
        // This process can read its own status.
        assert!(pid_ns_depth("self").unwrap() >= 1);
    }

    #[tokio::test]
    async fn the_owner_rule_admits_its_uid_and_closes_others() {
        use axum::serve::Listener;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let me = nix::unistd::getuid().as_raw();
        // Control: the owner's own connection is admitted.
        let mut admits = CheckedListener::new(UnixListener::bind(&path).unwrap(), Admit::Owner(me));
        let _c = UnixStream::connect(&path).await.unwrap();
        let (_, peer) = admits.accept().await;
        assert_eq!(peer.uid, me);
        drop(admits);
        std::fs::remove_file(&path).unwrap();
        // Probe: the same connection to a socket owned by another uid is closed unread.
        let mut refuses =
            CheckedListener::new(UnixListener::bind(&path).unwrap(), Admit::Owner(me + 1));
        let mut c = UnixStream::connect(&path).await.unwrap();
        let accepted = tokio::time::timeout(Duration::from_millis(300), refuses.accept()).await;
        assert!(accepted.is_err(), "another uid's connection was admitted");
        assert_eq!(refuses.refused, 1);
        let mut buf = [0u8; 1];
        use tokio::io::AsyncReadExt;
        assert_eq!(
            c.read(&mut buf).await.unwrap(),
            0,
            "closed without an answer"
        );
    }
}
