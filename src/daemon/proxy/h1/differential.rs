//! The node's HTTP/1.1 client against hyper's, on the same bytes from an upstream.
//!
//! Each case is an upstream's answer as bytes: interim 1xx heads, a final head whose framing
//! fields may agree with its body, contradict it or be malformed (`Content-Length` exact, off
//! by one, repeated, as a list, invalid; `Transfer-Encoding` in many spellings; both), a body
//! by length, in chunks (extensions, trailers, upper-case sizes, bad sizes, a missing last
//! chunk, bare LF and CR) or to the close, bytes after the body, bare LF line endings,
//! obs-fold lines, or garbage. A loopback server writes them in random pieces (yielding
//! between some) to one connection of the node's client ([`exchange`]) and one of hyper's
//! (`hyper::client::conn::http1`), for a `GET` or a `HEAD`.
//!
//! The property: the node never accepts an answer hyper refuses; where both accept, they
//! agree on the status, the version, the fields the node hands on (hyper's fields less the
//! hop-by-hop ones, those `Connection` names, and `Content-Length` beside a
//! `Transfer-Encoding`: [`handed_on`]), the whole body and the trailers. Refusing more than
//! hyper is allowed. The count of cases is `PROPTEST_CASES` (512 by default); a failing case
//! is saved beside this file (`differential.proptest-regressions`) and replayed first by later
//! runs.

use std::sync::atomic::{AtomicU64, Ordering};

use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use super::*;

mod cases;

pub(super) use cases::{Case, case};

/// What a client made of an answer: read whole, or refused (why).
pub(super) type Outcome = Result<Accepted, String>;

/// An answer a client read whole.
#[derive(Debug, PartialEq)]
pub(super) struct Accepted {
    pub(super) status: u16,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    pub(super) trailers: Option<HeaderMap>,
}

/// A loopback upstream that reads one request's head, writes `bytes` in `pieces`, and
/// closes its side.
async fn upstream(bytes: Vec<u8>, pieces: Vec<(usize, bool)>) -> (std::net::SocketAddr, Server) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.set_nodelay(true).unwrap();
        let mut request = Vec::new();
        let mut piece = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut piece).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&piece[..n]),
            }
        }
        let mut rest = &bytes[..];
        for &(size, pause) in pieces.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (now, later) = rest.split_at(size.min(rest.len()));
            if stream.write_all(now).await.is_err() {
                return;
            }
            rest = later;
            if pause {
                tokio::task::yield_now().await;
            }
        }
        let _ = stream.shutdown().await;
        // Read until the client closes, so that closing here sends no reset.
        while let Ok(n) = stream.read(&mut piece).await {
            if n == 0 {
                break;
            }
        }
    });
    (addr, Server(task))
}

/// The upstream's task, ended when dropped.
struct Server(tokio::task::JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The pool of the node's client, for the test: connections are closed.
struct Closer;

impl Keeper for Closer {
    fn keep(&self, conn: Conn) {
        drop(conn);
    }
}

fn request_method(head: bool) -> Method {
    if head { Method::HEAD } else { Method::GET }
}

/// What the node's client makes of `bytes` from an upstream (written in `pieces`), as the
/// answer to a `GET` (a `HEAD` if `head`).
pub(super) async fn through_node(
    bytes: Vec<u8>,
    pieces: Vec<(usize, bool)>,
    head: bool,
) -> Outcome {
    let (addr, _server) = upstream(bytes, pieces).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let request = Request::builder()
        .method(request_method(head))
        .uri("/")
        .header(http::header::HOST, "upstream")
        .body(Relay::request(
            Body::empty(),
            None,
            Duration::from_secs(5),
            None,
        ))
        .unwrap();
    let response = match exchange(Conn::new(stream), request, &Arc::new(Closer)).await {
        Ok(response) => response,
        Err(Failed::Failure(failure)) => return Err(failure.to_string()),
        Err(Failed::Retry(_)) => return Err("retry".into()),
    };
    let (parts, answer) = response.into_parts();
    let (body, trailers) = match answer {
        Answer::Whole(body) => (body, None),
        Answer::Streamed(streamed) => match streamed.collect().await {
            Ok(collected) => {
                let trailers = collected.trailers().cloned();
                (collected.to_bytes(), trailers)
            }
            Err(error) => return Err(format!("body: {error}")),
        },
    };
    Ok(Accepted {
        status: parts.status.as_u16(),
        version: parts.version,
        headers: parts.headers,
        body,
        trailers,
    })
}

/// What hyper's client makes of the same, its fields as the node would hand them on.
async fn through_hyper(bytes: Vec<u8>, pieces: Vec<(usize, bool)>, head: bool) -> Outcome {
    let (addr, _server) = upstream(bytes, pieces).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(error) => return Err(format!("handshake: {error}")),
        };
    let driver = tokio::spawn(connection);
    let request = Request::builder()
        .method(request_method(head))
        .uri("/")
        .header(http::header::HOST, "upstream")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let outcome = match sender.send_request(request).await {
        Err(error) => Err(format!("{error}")),
        Ok(response) => {
            let (parts, body) = response.into_parts();
            match body.collect().await {
                Err(error) => Err(format!("body: {error}")),
                Ok(collected) => {
                    let trailers = collected.trailers().cloned();
                    Ok(Accepted {
                        status: parts.status.as_u16(),
                        version: parts.version,
                        headers: handed_on(parts.headers),
                        body: collected.to_bytes(),
                        trailers,
                    })
                }
            }
        }
    };
    driver.abort();
    outcome
}

/// The fields of hyper's answer the node is expected to hand on: all but the hop-by-hop ones
/// (`Connection` and the fields it names, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`,
/// `Transfer-Encoding`, `Upgrade`), and without `Content-Length` when a
/// `Transfer-Encoding` came with it. Written here from the RFC, not taken from the node.
fn handed_on(mut headers: HeaderMap) -> HeaderMap {
    let coded = headers.contains_key(TRANSFER_ENCODING);
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|token| {
            !token.eq_ignore_ascii_case("close") && !token.eq_ignore_ascii_case("keep-alive")
        })
        .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
    let proxies: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxies {
        headers.remove(name);
    }
    if coded {
        headers.remove(CONTENT_LENGTH);
    }
    headers
}

/// How the cases went, printed at the end.
static BOTH_ACCEPTED: AtomicU64 = AtomicU64::new(0);
static ONLY_HYPER_ACCEPTED: AtomicU64 = AtomicU64::new(0);
static BOTH_REFUSED: AtomicU64 = AtomicU64::new(0);

async fn check(case: &Case) -> Result<(), TestCaseError> {
    let bytes = case.bytes();
    let limit = Duration::from_secs(10);
    let (pieces, head) = (case.pieces.clone(), case.head_request);
    let ours = tokio::time::timeout(limit, through_node(bytes.clone(), pieces.clone(), head))
        .await
        .map_err(|_| TestCaseError::fail("the node's client hung on an upstream that closed"))?;
    let theirs = tokio::time::timeout(limit, through_hyper(bytes.clone(), pieces, head))
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
    let shown = if bytes.len() > 2000 {
        format!("{} … ({} bytes)", bytes[..2000].escape_ascii(), bytes.len())
    } else {
        bytes.escape_ascii().to_string()
    };
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) => {
            BOTH_ACCEPTED.fetch_add(1, Ordering::Relaxed);
            prop_assert_eq!(ours, theirs, "the clients differ on {}", shown);
        }
        (Ok(ours), Err(why)) => {
            return Err(TestCaseError::fail(format!(
                "the node accepted it ({} with {} bytes of body), hyper refused it ({why}): \
                 {shown}",
                ours.status,
                ours.body.len()
            )));
        }
        (Err(_), Ok(_)) => {
            ONLY_HYPER_ACCEPTED.fetch_add(1, Ordering::Relaxed);
        }
        (Err(_), Err(_)) => {
            BOTH_REFUSED.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The configuration: `PROPTEST_CASES` or 512 cases, a failure saved beside this file
/// (`differential.proptest-regressions`).
fn config() -> Config {
    Config {
        source_file: Some(file!()),
        ..crate::testing::proptest_config(512)
    }
}

#[test]
fn the_node_s_client_accepts_no_answer_hyper_refuses_and_reads_the_same_ones_alike() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = config();
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    let result = runner.run(&case(), |case| runtime.block_on(check(&case)));
    eprintln!(
        "{cases} cases: both accepted {}, only hyper accepted {}, both refused {} (with shrinking)",
        BOTH_ACCEPTED.load(Ordering::Relaxed),
        ONLY_HYPER_ACCEPTED.load(Ordering::Relaxed),
        BOTH_REFUSED.load(Ordering::Relaxed),
    );
    if let Err(error) = result {
        panic!("{error}");
    }
}
