//! The client side of mopd's Unix sockets (the control socket and agent sockets): one
//! HTTP/1.1 request per connection, with errors that say whether the daemon is missing,
//! refusing, or forbidden.

use std::io;
use std::path::{Path, PathBuf};

use http_body_util::BodyExt;
use tokio::net::UnixStream;

/// Why the daemon could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket file does not exist: the daemon is not running.
    #[error(
        "mopd is not running: the socket {0} does not exist → systemctl start mopd (or: mopd run); if mopd's socket is elsewhere, pass --socket PATH (or set MOP_SOCKET)"
    )]
    Missing(PathBuf),
    /// The socket exists but nothing accepts connections.
    #[error(
        "mopd is not answering: the socket {0} exists but refuses connections → systemctl restart mopd"
    )]
    Refused(PathBuf),
    /// The caller may not use the socket.
    #[error("permission denied on {0} → run as root or as a member of group mop")]
    Denied(PathBuf),
    /// Anything else.
    #[error("control socket {path}: {message}")]
    Other {
        /// The socket.
        path: PathBuf,
        /// What happened.
        message: String,
    },
    /// The daemon answered with an error status; its message says why and what to do.
    #[error("{message} ({status})")]
    Answered {
        /// The HTTP status.
        status: u16,
        /// The daemon's message.
        message: String,
    },
    /// The daemon's answer does not parse (a daemon of another version?).
    #[error("the daemon's answer is unreadable: {0}")]
    Unreadable(String),
}

impl ControlError {
    /// The error for a non-success answer: the JSON body's `message`, else its text.
    pub fn answered(status: u16, body: &[u8]) -> ControlError {
        ControlError::Answered {
            status,
            message: crate::error::ErrorBody::message_of(body),
        }
    }

    /// True when the daemon could not be reached at all (not running, not answering, or
    /// not ours to use), as opposed to an answer it gave.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ControlError::Missing(_)
                | ControlError::Refused(_)
                | ControlError::Denied(_)
                | ControlError::Other { .. }
        )
    }
}

/// One request to the daemon: returns the status code and body.
async fn send(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<hyper::Response<hyper::body::Incoming>, ControlError> {
    let stream = match UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e) => {
            return Err(match e.kind() {
                io::ErrorKind::NotFound => ControlError::Missing(socket.to_owned()),
                io::ErrorKind::ConnectionRefused => ControlError::Refused(socket.to_owned()),
                io::ErrorKind::PermissionDenied => ControlError::Denied(socket.to_owned()),
                _ => ControlError::Other {
                    path: socket.to_owned(),
                    message: e.to_string(),
                },
            });
        }
    };
    let other = |m: String| ControlError::Other {
        path: socket.to_owned(),
        message: m,
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| other(e.to_string()))?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "mopd")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.unwrap_or_default(),
        )))
        .map_err(|e| other(e.to_string()))?;
    sender
        .send_request(req)
        .await
        .map_err(|e| other(e.to_string()))
}

/// One request to the daemon: returns the status code and body.
pub async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<(u16, Vec<u8>), ControlError> {
    let response = send(socket, method, path, body).await?;
    let status = response.status().as_u16();
    Ok((status, read_all(socket, response.into_body()).await?))
}

/// One request to the daemon that must succeed: the body of a 2xx answer, or the
/// daemon's refusal as [`ControlError::Answered`].
pub async fn request_ok(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<Vec<u8>, ControlError> {
    let (code, answer) = request(socket, method, path, body).await?;
    if !(200..300).contains(&code) {
        return Err(ControlError::answered(code, &answer));
    }
    Ok(answer)
}

/// One request to the daemon that must succeed, with its JSON answer read as `T`.
pub async fn request_json<T: serde::de::DeserializeOwned>(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<T, ControlError> {
    let answer = request_ok(socket, method, path, body).await?;
    serde_json::from_slice(&answer)
        .map_err(|e| ControlError::Unreadable(format!("{method} {path}: {e}")))
}

/// A whole response body.
async fn read_all(socket: &Path, body: hyper::body::Incoming) -> Result<Vec<u8>, ControlError> {
    let collected = body.collect().await.map_err(|e| ControlError::Other {
        path: socket.to_owned(),
        message: e.to_string(),
    })?;
    Ok(collected.to_bytes().to_vec())
}

/// A held answer: newline-separated JSON documents on a response the daemon keeps open.
/// What the daemon granted lasts as long as this value (or this process) lives;
/// dropping it closes the connection.
pub struct Hold {
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
    path: std::path::PathBuf,
}

impl Hold {
    /// The next document, or `None` when the daemon ended the answer.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, ControlError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Ok(Some(line[..line.len() - 1].to_vec()));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(ControlError::Other {
                        path: self.path.clone(),
                        message: e.to_string(),
                    });
                }
                None => return Ok(None),
            }
        }
    }
}

/// A request answered by a held stream of documents (a `mop run` prepare). An error
/// status comes back with its whole body and no hold.
pub async fn request_held(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<(u16, Vec<u8>, Option<Hold>), ControlError> {
    let response = send(socket, method, path, body).await?;
    let status = response.status().as_u16();
    let response_type = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.into_body();
    if !(200..300).contains(&status) {
        return Ok((status, read_all(socket, body).await?, None));
    }
    let content_type = response_type.as_deref().unwrap_or("none");
    if content_type != crate::control::HELD_PREPARE_TYPE {
        return Err(ControlError::Unreadable(format!(
            "{method} {path}: a held answer must be {}, not {content_type}",
            crate::control::HELD_PREPARE_TYPE
        )));
    }
    Ok((
        status,
        Vec::new(),
        Some(Hold {
            body,
            buffer: Vec::new(),
            path: socket.to_owned(),
        }),
    ))
}
