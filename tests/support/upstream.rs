//! Test upstreams on loopback for the node's proxy and forward-auth tests: an HTTP server
//! (HTTP/1.1 or HTTP/2 with prior knowledge) that records what it saw and echoes bodies as
//! they stream, and raw TCP servers that hang or reset.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A request the upstream received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: http::Method,
    /// The path and query.
    pub path: String,
    pub version: http::Version,
    pub headers: http::HeaderMap,
}

/// A running upstream; its task ends when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests it saw.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

type Reply = Response<BoxBody<Bytes, hyper::Error>>;

/// The length of the `/big` answer.
pub const BIG_BYTES: u64 = 64 * 1024 * 1024;

/// A body of zeros, 64 KiB at a time.
struct Zeros(u64);

impl hyper::body::Body for Zeros {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.0.min(64 * 1024);
        self.0 -= n;
        let piece = Bytes::from(vec![0u8; n as usize]);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(piece))))
    }
}

fn reply(request: Request<Incoming>, seen: &Mutex<Vec<Seen>>) -> Reply {
    seen.lock().unwrap().push(Seen {
        method: request.method().clone(),
        path: request
            .uri()
            .path_and_query()
            .map_or("", |pq| pq.as_str())
            .to_string(),
        version: request.version(),
        headers: request.headers().clone(),
    });
    let version = format!("{:?}", request.version());
    if request.uri().path().contains("/big") {
        // 64 MiB of zeros, made as they are sent.
        return Response::builder()
            .body(
                Zeros(BIG_BYTES)
                    .map_err(|never: std::convert::Infallible| match never {})
                    .boxed(),
            )
            .unwrap();
    }
    if request.uri().path().contains("/echo") {
        // The body goes back as it arrives.
        return Response::builder()
            .header("x-upstream-version", version)
            .body(request.into_body().boxed())
            .unwrap();
    }
    let mut builder = Response::builder()
        .header("x-upstream", "1")
        .header("x-upstream-version", version);
    if request.version() == http::Version::HTTP_11 {
        // Hop-by-hop fields the node must not pass on.
        builder = builder
            .header("connection", "x-up-hop")
            .header("x-up-hop", "1")
            .header("keep-alive", "timeout=30")
            .header("proxy-authenticate", "Basic");
    }
    builder
        .body(
            Full::new(Bytes::from_static(b"upstream ok\n"))
                .map_err(|never| match never {})
                .boxed(),
        )
        .unwrap()
}

/// Start an upstream on an ephemeral loopback port: a path with `/echo` streams the request
/// body back, one with `/big` answers 64 MiB of zeros, anything else `200 upstream ok` (with
/// hop-by-hop fields over HTTP/1.1).
pub async fn start(http2: bool) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let recorded = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let seen = Arc::clone(&recorded);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = reply(request, &seen);
                    async move { Ok::<_, hyper::Error>(response) }
                });
                let io = TokioIo::new(stream);
                if http2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                }
            });
        }
    });
    Upstream { addr, seen, task }
}

/// A TCP server that accepts and reads but never answers; returns its address and how many
/// connections it accepted.
pub async fn hanging() -> (SocketAddr, Arc<Mutex<usize>>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(Mutex::new(0));
    let count = Arc::clone(&accepted);
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            *count.lock().unwrap() += 1;
            held.push(tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }));
        }
    });
    (addr, accepted, task)
}

/// A TCP server that reads a request's first bytes, then resets the connection.
pub async fn resetting() -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let mut buf = [0u8; 16];
            let _ = stream.read(&mut buf).await;
            let _ = stream.set_zero_linger();
            drop(stream);
        }
    });
    (addr, task)
}

/// A TCP server that answers each connection's first request `200 ok` (kept alive, as far
/// as the client can tell), then closes the connection `linger` later without a word; returns
/// its address and how many requests it answered.
pub async fn closing_when_idle(
    linger: Duration,
) -> (SocketAddr, Arc<Mutex<usize>>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answered = Arc::new(Mutex::new(0));
    let count = Arc::clone(&answered);
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n";
                if stream.write_all(answer).await.is_ok() {
                    *count.lock().unwrap() += 1;
                }
                tokio::time::sleep(linger).await;
            });
        }
    });
    (addr, answered, task)
}

/// A loopback address where nothing listens.
pub fn refusing() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// The body of the scripted upstream's `/length` answer: 200,000 bytes, `a` to `z` over
/// and over.
pub fn scripted_length_body() -> Vec<u8> {
    (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect()
}

/// A TCP server that answers each request with a canned HTTP/1.1 exchange chosen by its
/// path, written in pieces (so a client must put heads and chunks together across reads):
/// `/length` (a `Content-Length` body larger than a read), `/chunked` (chunk extensions and
/// a trailer), `/chunked-and-length` (chunks and a `Content-Length` that is not theirs),
/// `/interim` (two 1xx answers before the final one), `/nocontent` (204), `/close`
/// (HTTP/1.0, the body runs to the close), `/garbage` (not HTTP), `/two-lengths` (two
/// different `Content-Length` values), `/cut` (the connection closes mid-body), `/bare-lf`
/// (chunks whose lines end in a bare LF, which the node refuses), `/brief` (`Keep-Alive: timeout=1`), `/drop` (the connection closes with no answer; counted in [`scripted_drops`]); a `HEAD` gets the
/// head alone. Returns its address and how many connections it accepted.
pub async fn scripted() -> (SocketAddr, Arc<Mutex<usize>>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(Mutex::new(0));
    let count = Arc::clone(&accepted);
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            *count.lock().unwrap() += 1;
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let end = loop {
                        if let Some(at) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        match stream.read(&mut buf).await {
                            Ok(n) if n > 0 => pending.extend_from_slice(&buf[..n]),
                            _ => return,
                        }
                    };
                    let head = String::from_utf8_lossy(&pending[..end]).to_string();
                    pending.drain(..end);
                    let mut line = head.split(' ');
                    let method = line.next().unwrap_or("").to_string();
                    let path = line.next().unwrap_or("").to_string();
                    let (mut pieces, close) = scripted_answer(&path);
                    if method == "HEAD" {
                        // The head alone.
                        let whole = pieces.concat();
                        let at = whole.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                        pieces = vec![whole[..at + 4].to_vec()];
                    }
                    for piece in &pieces {
                        if stream.write_all(piece).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    if close {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted, task)
}

/// How many `/s/drop` requests the `scripted` servers of this test binary have read.
pub fn scripted_drops() -> usize {
    DROPS.load(Ordering::SeqCst)
}

static DROPS: AtomicUsize = AtomicUsize::new(0);

/// The pieces `scripted` writes for `path`, and whether it closes the connection after.
fn scripted_answer(path: &str) -> (Vec<Vec<u8>>, bool) {
    let split = |text: &[u8], at: &[usize]| {
        let mut pieces = Vec::new();
        let mut from = 0;
        for &to in at {
            pieces.push(text[from..to].to_vec());
            from = to;
        }
        pieces.push(text[from..].to_vec());
        pieces
    };
    match path {
        "/s/length" => {
            let mut answer =
                b"HTTP/1.1 200 OK\r\ncontent-length: 200000\r\nx-kind: length\r\n\r\n".to_vec();
            answer.extend(scripted_length_body());
            (split(&answer, &[20, 70, 100_000]), false)
        }
        "/s/chunked" => {
            let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n\
                5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 11\r\n\r\n";
            (split(answer, &[30, 66, 70, 80, 85, 92, 100]), false)
        }
        "/s/interim" => {
            let answer =
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n\
                HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok";
            (split(answer, &[10, 25, 60]), false)
        }
        "/s/chunked-and-length" => {
            let answer =
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n\
                5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
            (split(answer, &[40, 75]), true)
        }
        "/s/nocontent" => (
            vec![b"HTTP/1.1 204 No Content\r\nx-kind: none\r\n\r\n".to_vec()],
            false,
        ),
        "/s/close" => (
            split(
                b"HTTP/1.0 200 OK\r\nx-kind: close\r\n\r\nuntil the close",
                &[35],
            ),
            true,
        ),
        "/s/two-lengths" => (
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd".to_vec()],
            true,
        ),
        "/s/brief" => (
            vec![
                b"HTTP/1.1 200 OK\r\nkeep-alive: timeout=1\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            ],
            false,
        ),
        "/s/bare-lf" => (
            split(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\n0\n\n",
                &[48, 51],
            ),
            false,
        ),
        "/s/drop" => {
            DROPS.fetch_add(1, Ordering::SeqCst);
            (Vec::new(), true)
        }
        "/s/cut" => (
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort".to_vec()],
            true,
        ),
        _ => (vec![b"SPDY/9 banana\r\n\r\n".to_vec()], true),
    }
}
