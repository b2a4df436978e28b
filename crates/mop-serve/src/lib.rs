//! HTTP/1.1 serving with bounded connections, for every listener mop has: the card
//! server's TCP port and the daemon's control and agent sockets.
//!
//! `axum::serve` accepts without limit and never times a client out, so a flood of idle or
//! half-open connections fills the descriptor table, and then everything else that needs a
//! descriptor fails too (`/proc` reads, the database, other sockets). [`serve`] bounds it:
//!
//! - at most [`Limits::max_connections`] are open. At the cap, a new connection closes the
//!   oldest one that has no request in progress (an idle, slow or half-open client), or is
//!   closed itself when every open connection is busy;
//! - a new connection has [`Limits::header_timeout`] from connecting to send its whole
//!   first request head, and a later head must be complete within that time of its first
//!   byte (slowloris);
//! - a kept-alive connection waits at most [`Limits::idle_timeout`] for its next request;
//! - a request body must arrive within [`Limits::body_timeout`] of its head.
//!
//! A response that streams for a long time (the daemon's held prepare answer) keeps its
//! connection busy: it is neither timed out nor evicted. Shutdown is explicit: when the
//! `shutdown` future resolves, no connection is accepted any more, idle ones close, busy
//! ones finish their response (for at most 30 s, and the deadlines above still apply to
//! the others), and [`serve`] returns once all are gone.

pub mod tls;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tower::Service;

/// How many connections a listener keeps, and how long it waits for its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once (at least 1).
    pub max_connections: usize,
    /// Time to send a request head: from connecting for the first request, from the
    /// head's first byte for later ones.
    pub header_timeout: Duration,
    /// Time a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Time a request body may take to arrive, from its head.
    pub body_timeout: Duration,
}

/// A descriptor budget: `reserve` less than the soft `RLIMIT_NOFILE`, at least `floor`,
/// for callers that size `max_connections` from what the process may open.
pub fn connections_for_fd_limit(reserve: usize, floor: usize) -> usize {
    let soft = rlimit_nofile().unwrap_or(1024);
    soft.saturating_sub(reserve).max(floor)
}

fn rlimit_nofile() -> Option<usize> {
    // /proc is enough here and needs no unsafe code: "Max open files  <soft>  <hard>  files".
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves and every
/// connection has closed. Each request carries `ConnectInfo<L::Addr>` for its handler.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) where
    L: axum::serve::Listener,
    L::Addr: Clone + Send + Sync + 'static,
{
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let registry = Arc::new(Registry::default());
    let mut accepting = stop.clone();
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped(&mut accepting) => break,
        };
        let Some(conn) = registry.admit(limits.max_connections.max(1)) else {
            // Every open connection is in the middle of a request: this one waits for
            // none of them.
            drop(io);
            continue;
        };
        tokio::spawn(connection(
            io,
            peer,
            conn,
            router.clone(),
            limits,
            stop.clone(),
            registry.clone(),
        ));
    }
    drop(listener);
    registry.drained().await;
}

/// Resolves once the stop signal is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// What a connection is waiting for when it is not busy with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The first request's head, since connecting.
    First,
    /// The next request on a kept-alive connection.
    Idle,
    /// The rest of a request head whose first byte came.
    Head,
}

/// One open connection, as the registry and its own task see it.
struct Conn {
    id: u64,
    /// Requests in progress (head read, response not yet fully sent).
    busy: AtomicUsize,
    wait: Mutex<(Wait, Instant)>,
    /// Wakes the connection's task to close it (evicted at the cap).
    evict: Notify,
    /// Bumped by every change of `wait`, so the connection's task sees one without a
    /// wake-up of its own (see [`connection`]). That holds because every change is made
    /// inside hyper's poll of the connection, on its own task: the reader sees a head's
    /// first byte, and hyper drops a sent response's body (and its [`BusyGuard`]). A change
    /// made on another task (a guard moved into a spawned task, an upgrade) would need a
    /// waker here.
    version: AtomicU64,
}

impl Conn {
    fn set_wait(&self, wait: Wait) {
        *self.wait.lock() = (wait, Instant::now());
        self.version.fetch_add(1, Ordering::Release);
    }

    fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// When the connection must close if nothing changes; `None` while it is busy.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        if self.busy.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let (wait, since) = *self.wait.lock();
        Some(
            since
                + match wait {
                    Wait::First | Wait::Head => limits.header_timeout,
                    Wait::Idle => limits.idle_timeout,
                },
        )
    }

    fn begin_request(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::SeqCst);
        BusyGuard(self.clone())
    }
}

/// Holds a connection busy for one request, until its response body is done or dropped.
struct BusyGuard(Arc<Conn>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.set_wait(Wait::Idle);
        }
    }
}

/// The open connections by age (ids only grow), for eviction at the cap.
#[derive(Default)]
struct Registry {
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    evicted: AtomicU64,
    last_warned: Mutex<Option<Instant>>,
    empty: Notify,
}

impl Registry {
    /// Registers a new connection, first making room at the cap by evicting the oldest
    /// idle one. `None` when every open connection is busy.
    fn admit(&self, max: usize) -> Option<Arc<Conn>> {
        let mut conns = self.conns.lock();
        if conns.len() >= max {
            let oldest_idle = conns
                .iter()
                .find(|(_, c)| c.busy.load(Ordering::SeqCst) == 0)
                .map(|(id, _)| *id);
            let victim = oldest_idle.and_then(|id| conns.remove(&id));
            let evicted = self.evicted.fetch_add(1, Ordering::Relaxed) + 1;
            self.warn_at_cap(max, evicted, victim.is_some());
            victim?.evict.notify_one();
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            busy: AtomicUsize::new(0),
            wait: Mutex::new((Wait::First, Instant::now())),
            evict: Notify::new(),
            version: AtomicU64::new(0),
        });
        conns.insert(id, conn.clone());
        Some(conn)
    }

    /// One warning per ten seconds at most while connections are being turned away.
    fn warn_at_cap(&self, max: usize, total: u64, evicted_one: bool) {
        let mut last = self.last_warned.lock();
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!(
                max_connections = max,
                turned_away = total,
                evicted_idle = evicted_one,
                "connection cap reached: closing idle connections to admit new ones (a flood?)"
            );
        }
    }

    fn remove(&self, id: u64) {
        let mut conns = self.conns.lock();
        conns.remove(&id);
        if conns.is_empty() {
            self.empty.notify_waiters();
        }
    }

    async fn drained(&self) {
        loop {
            let notified = self.empty.notified();
            if self.conns.lock().is_empty() {
                return;
            }
            notified.await;
        }
    }
}

async fn connection<Io, Addr>(
    io: Io,
    peer: Addr,
    conn: Arc<Conn>,
    router: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    registry: Arc<Registry>,
) where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    Addr: Clone + Send + Sync + 'static,
{
    let service_conn = conn.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let guard = service_conn.begin_request();
        let mut router = router.clone();
        let peer = peer.clone();
        async move {
            let (mut parts, body) = request.into_parts();
            parts.extensions.insert(ConnectInfo(peer));
            let body = axum::body::Body::new(DeadlineBody {
                inner: body,
                until: Instant::now() + limits.body_timeout,
                timer: None,
            });
            let response = match router.call(hyper::Request::from_parts(parts, body)).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(response.map(|inner| {
                axum::body::Body::new(GuardedBody {
                    inner,
                    _guard: guard,
                })
            }))
        }
    });
    let io = Tracked {
        inner: io,
        conn: conn.clone(),
    };
    let http = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // Our own deadlines below: hyper's would also end idle kept-alive connections at
        // the header timeout.
        .header_read_timeout(None)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service);
    let mut http = std::pin::pin!(http);
    match watch_over(http.as_mut(), &conn, &limits, Some(&mut stop)).await {
        End::Closed(Some(e)) => tracing::debug!(error = %e, "connection ended with an error"),
        End::Stopping => {
            http.as_mut().graceful_shutdown();
            // The connection's deadlines still hold while it drains: a client in the middle
            // of a slow head could otherwise keep the shutdown waiting for all of `DRAIN`.
            let _ =
                tokio::time::timeout(DRAIN, watch_over(http.as_mut(), &conn, &limits, None)).await;
        }
        End::Closed(None) | End::Evicted | End::TimedOut => {}
    }
    registry.remove(conn.id);
}

/// How long a shutdown waits for a busy connection to finish its response.
const DRAIN: Duration = Duration::from_secs(30);

/// Drives the connection `http` until it ends, its deadline passes with nothing in
/// progress, it is evicted, or (with `stop`) the listener shuts down.
///
/// One timer per connection, moved only when the deadline comes earlier. `wait` changes
/// inside `http`'s poll (a head's first byte, a response sent), so each change is seen right
/// after it, in the same poll, with no wake-up and no timer of its own; a deadline that
/// moved later is found when the timer fires early, and re-armed.
async fn watch_over<F>(
    mut http: Pin<&mut F>,
    conn: &Conn,
    limits: &Limits,
    stop: Option<&mut watch::Receiver<bool>>,
) -> End
where
    F: Future<Output = Result<(), hyper::Error>>,
{
    let evicted = conn.evict.notified();
    let stopping = async move {
        match stop {
            Some(stop) => stopped(stop).await,
            None => std::future::pending().await,
        }
    };
    let (mut evicted, mut stopping) = (std::pin::pin!(evicted), std::pin::pin!(stopping));
    let far = || Instant::now() + Duration::from_secs(3600);
    let mut armed = conn.deadline(limits).unwrap_or_else(far);
    let mut timer = std::pin::pin!(tokio::time::sleep_until(armed));
    let mut seen = conn.version();
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = http.as_mut().poll(cx) {
            return Poll::Ready(End::Closed(result.err()));
        }
        if evicted.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Evicted);
        }
        if stopping.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Stopping);
        }
        loop {
            let now_seen = conn.version();
            if now_seen != seen {
                seen = now_seen;
                if let Some(d) = conn.deadline(limits).filter(|d| *d < armed) {
                    armed = d;
                    timer.as_mut().reset(d);
                }
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            match conn.deadline(limits) {
                Some(d) if d <= Instant::now() => return Poll::Ready(End::TimedOut),
                d => {
                    armed = d.unwrap_or_else(far);
                    timer.as_mut().reset(armed);
                }
            }
        }
    })
    .await
}

/// Why a connection's task ends.
enum End {
    /// The client closed it, or hyper ended it (with the error, if any).
    Closed(Option<hyper::Error>),
    /// Closed at the cap to make room.
    Evicted,
    /// A deadline passed with nothing in progress.
    TimedOut,
    /// The listener is shutting down: finish what is in progress.
    Stopping,
}

/// The connection's byte stream, noting when a request head starts to arrive.
struct Tracked<Io> {
    inner: Io,
    conn: Arc<Conn>,
}

impl<Io: AsyncRead + Unpin> AsyncRead for Tracked<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        // Only a kept-alive connection's next head starts a clock of its own: the first
        // head is still within the time it got at connecting (a byte sent just before that
        // ran out must not buy a whole new `header_timeout`).
        if buf.filled().len() > before && self.conn.busy.load(Ordering::SeqCst) == 0 {
            let idle = self.conn.wait.lock().0 == Wait::Idle;
            if idle {
                self.conn.set_wait(Wait::Head);
            }
        }
        result
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Tracked<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A request body that fails once its deadline passes (a client trickling a body). Its
/// timer starts only when the body is waited for: most requests have none, or one that
/// arrived with the head.
struct DeadlineBody {
    inner: Incoming,
    until: Instant,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The error of a request body that did not arrive in time.
#[derive(Debug)]
pub struct BodyTimeout;

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimeout {}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let until = self.until;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its connection busy until it is sent or dropped.
struct GuardedBody {
    inner: axum::body::Body,
    _guard: BusyGuard,
}

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    fn limits(max: usize) -> Limits {
        Limits {
            max_connections: max,
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(900),
            body_timeout: Duration::from_millis(300),
        }
    }

    async fn start(limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", get(|| async { "ok" })).route(
            "/echo",
            axum::routing::post(|body: Bytes| async move { body }),
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(serve(listener, app, limits, async move {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    async fn get_ok(stream: &mut TcpStream) -> bool {
        if stream
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .is_err()
        {
            return false;
        }
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        buf[..n].starts_with(b"HTTP/1.1 200")
    }

    /// True when the peer closed the connection (read gives EOF or a reset).
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(3), stream.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn silent_and_slow_clients_are_closed_and_idle_ones_later() {
        let (addr, _stop) = start(limits(100)).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let started = Instant::now();
        assert!(closed(&mut silent).await);
        assert!(closed(&mut slow).await);
        assert!(started.elapsed() < Duration::from_millis(900));
        // A kept-alive client gets the longer idle time between requests.
        let mut kept = TcpStream::connect(addr).await.unwrap();
        assert!(get_ok(&mut kept).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            get_ok(&mut kept).await,
            "still open within the idle timeout"
        );
        let idle = Instant::now();
        assert!(closed(&mut kept).await);
        assert!(idle.elapsed() >= Duration::from_millis(700));
    }

    #[tokio::test]
    async fn at_the_cap_new_connections_evict_idle_ones() {
        let (addr, _stop) = start(limits(4)).await;
        let mut flood = Vec::new();
        for _ in 0..20 {
            flood.push(TcpStream::connect(addr).await.unwrap());
        }
        // The newest connection is served although the cap is long passed…
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        assert!(get_ok(&mut fresh).await);
        // …and the oldest idle ones were closed to make room.
        assert!(closed(&mut flood[0]).await);
    }

    #[tokio::test]
    async fn a_trickled_body_times_out() {
        let (addr, _stop) = start(limits(10)).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nab")
            .await
            .unwrap();
        let mut buf = vec![0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let answer = String::from_utf8_lossy(&buf[..n]);
        assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
        // Control: a whole body is echoed.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nab")
            .await
            .unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("ab"));
    }

    #[tokio::test]
    async fn shutdown_waits_for_connections_to_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new().route("/", get(|| async { "ok" }));
        let server = tokio::spawn(serve(listener, app, limits(10), async move {
            let _ = rx.await;
        }));
        let mut kept = TcpStream::connect(addr).await.unwrap();
        assert!(get_ok(&mut kept).await);
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(2), server)
            .await
            .expect("serve returns once its idle connection is closed")
            .unwrap();
        assert!(closed(&mut kept).await);
    }

    #[tokio::test]
    async fn the_first_head_must_be_complete_within_the_header_timeout_of_connecting() {
        let limits = Limits {
            header_timeout: Duration::from_millis(1000),
            ..limits(10)
        };
        let (addr, _stop) = start(limits).await;
        // A head that begins just before the time is up gets no fresh header timeout.
        let mut late = TcpStream::connect(addr).await.unwrap();
        let connected = Instant::now();
        tokio::time::sleep(Duration::from_millis(800)).await;
        late.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        assert!(closed(&mut late).await);
        let lasted = connected.elapsed();
        assert!(
            lasted < Duration::from_millis(1600),
            "closed {lasted:?} after connecting; a fresh header timeout from the first byte would be 1.8 s"
        );
        // Control: the whole head at the same moment is answered.
        let mut prompt = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(get_ok(&mut prompt).await);
    }

    #[tokio::test]
    async fn a_shutdown_finishes_busy_responses_and_does_not_wait_for_slow_heads() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new().route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(600)).await;
                "ok"
            }),
        );
        let server = tokio::spawn(serve(listener, app, limits(10), async move {
            let _ = rx.await;
        }));
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut trickling = TcpStream::connect(addr).await.unwrap();
        trickling.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(()).unwrap();
        // The busy connection's response still comes…
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(3), busy.read(&mut buf))
            .await
            .expect("the busy response is finished")
            .unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        // …the half-sent head is closed at its deadline, and serve returns long before the
        // 30 s a drain may take.
        assert!(closed(&mut trickling).await);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serve returns once the busy response is done and the slow head timed out")
            .unwrap();
    }

    #[test]
    fn the_descriptor_budget_follows_the_soft_limit() {
        let n = connections_for_fd_limit(100, 16);
        assert!(n >= 16);
        assert_eq!(
            connections_for_fd_limit(usize::MAX, 16),
            16,
            "never below the floor"
        );
    }
}
