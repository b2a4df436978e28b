//! A misbehaving network between a daemon and the real server: a loopback proxy that
//! forwards each request to mop-server and can spoil the answer in the ways real networks
//! and middleboxes do (a captive portal's HTML, truncated bodies, wrong lengths, flipped
//! bytes, resets, slow drips, replays of an old manifest).
//!
//! One request per connection: the proxy adds `Connection: close`, reads the whole
//! answer, spoils it if asked, and closes. That keeps it small and is legal HTTP/1.1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How answers are spoiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward unchanged.
    None,
    /// Manifest requests get a 200 HTML login page, as from a captive portal.
    CaptivePortal,
    /// Every answer loses the second half of its body; Content-Length is kept.
    Truncate,
    /// Every answer claims 100 more bytes than it has.
    LongContentLength,
    /// Object answers get one byte flipped in their body (a wrong sha256).
    FlipObjectByte,
    /// Every answer is cut after half its bytes by a TCP reset.
    Reset,
    /// Every answer trickles out one byte per 50 ms.
    SlowDrip,
    /// Manifest requests get a replay of the first 200 manifest answer forwarded (an
    /// old revision, or a delta from a revision no longer held).
    StaleManifest,
    /// Store requests (`POST …/memories`) reach the server, which applies them, and
    /// their answers are lost: the connection is reset before a byte of it comes back.
    LoseStoreAnswers,
}

/// The proxy; stops accepting when dropped (the thread ends with the process).
pub struct FaultyProxy {
    /// Where the daemon should connect: `http://127.0.0.1:<port>`.
    pub url: String,
    state: Arc<Mutex<State>>,
}

struct State {
    fault: Fault,
    first_manifest: Option<Vec<u8>>,
    spoiled: u64,
}

impl FaultyProxy {
    /// Starts a proxy to `upstream` (`http://127.0.0.1:<port>`).
    pub fn start(upstream: &str) -> FaultyProxy {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .parse()
            .expect("upstream address");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            fault: Fault::None,
            first_manifest: None,
            spoiled: 0,
        }));
        let s = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = serve(client, upstream, &s);
                });
            }
        });
        FaultyProxy { url, state }
    }

    /// Sets the fault for the answers from now on.
    pub fn set(&self, fault: Fault) {
        self.state.lock().unwrap().fault = fault;
    }

    /// How many answers were spoiled so far.
    pub fn spoiled(&self) -> u64 {
        self.state.lock().unwrap().spoiled
    }
}

fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
    }
    Ok(head)
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

fn serve(mut client: TcpStream, upstream: SocketAddr, state: &Mutex<State>) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let head = String::from_utf8_lossy(&read_head(&mut client)?).into_owned();
    let mut body = vec![
        0u8;
        header(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    ];
    client.read_exact(&mut body)?;
    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
    let mut request: String = head
        .lines()
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    request.push_str("Connection: close\r\n\r\n");
    let mut server = TcpStream::connect(upstream)?;
    server.write_all(request.as_bytes())?;
    server.write_all(&body)?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer)?;

    let is_manifest = path.contains("/manifest");
    let is_object = path.contains("/objects");
    let fault = {
        let mut s = state.lock().unwrap();
        if is_manifest && s.first_manifest.is_none() && answer.starts_with(b"HTTP/1.1 200") {
            s.first_manifest = Some(answer.clone());
        }
        let f = s.fault;
        let applies = match f {
            Fault::None => false,
            Fault::CaptivePortal | Fault::StaleManifest => is_manifest,
            Fault::FlipObjectByte => is_object && answer.starts_with(b"HTTP/1.1 200"),
            Fault::LoseStoreAnswers => path.contains("/memories"),
            _ => true,
        };
        if applies {
            s.spoiled += 1;
            if f == Fault::StaleManifest {
                answer = s.first_manifest.clone().unwrap_or(answer);
            }
            f
        } else {
            Fault::None
        }
    };
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(answer.len(), |p| p + 4);
    match fault {
        Fault::None | Fault::StaleManifest => client.write_all(&answer)?,
        Fault::CaptivePortal => {
            let page =
                b"<html><head><title>Hotel WiFi</title></head><body>Please log in</body></html>";
            client.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    page.len()
                )
                .as_bytes(),
            )?;
            client.write_all(page)?;
        }
        Fault::Truncate => {
            let keep = split + (answer.len() - split) / 2;
            client.write_all(&answer[..keep])?;
        }
        Fault::LongContentLength => {
            let head = String::from_utf8_lossy(&answer[..split]).into_owned();
            let len = answer.len() - split;
            let head: String = head
                .lines()
                .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("content-length:"))
                .map(|l| format!("{l}\r\n"))
                .collect();
            client.write_all(format!("{head}content-length: {}\r\n\r\n", len + 100).as_bytes())?;
            client.write_all(&answer[split..])?;
        }
        Fault::FlipObjectByte => {
            if answer.len() > split {
                let last = answer.len() - 1;
                answer[last] ^= 0x20;
            }
            client.write_all(&answer)?;
        }
        Fault::LoseStoreAnswers => {
            linger_zero(&client);
            return Ok(());
        }
        Fault::Reset => {
            client.write_all(&answer[..answer.len() / 2])?;
            // SO_LINGER 0 turns the close into a reset.
            linger_zero(&client);
            return Ok(());
        }
        Fault::SlowDrip => {
            for b in &answer {
                client.write_all(std::slice::from_ref(b))?;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(())
}

/// Sets SO_LINGER to zero so closing the socket sends a reset.
fn linger_zero(stream: &TcpStream) {
    let _ = nix::sys::socket::setsockopt(
        stream,
        nix::sys::socket::sockopt::Linger,
        &nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
}
