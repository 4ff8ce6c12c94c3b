//! HTTP/1.1 to an upstream, spoken on the request's own task: the request's head is written
//! in one piece and its body (if any) streamed after it as it comes (`Content-Length`, or
//! chunked when the client gave no length), while the answer's head is read and parsed from
//! the connection's buffer. An answer whose body has already arrived whole (the usual short
//! one) is handed on at once and its connection goes straight back to the pool; a longer one
//! streams ([`Streamed`]) and gives its connection back when read to its end. No task per
//! connection and no channel between tasks: one write and one read on the upstream's socket
//! for a short exchange.
//!
//! The answer's framing follows RFC 9112 §6.3: no body after `HEAD` or with a 1xx, 204 or
//! 304 status; a `Transfer-Encoding` ending in `chunked` is decoded; otherwise
//! `Content-Length` (every value the same), otherwise the body runs to the close. Interim
//! 1xx answers are skipped. A connection is kept only after a complete HTTP/1.1 answer that
//! did not ask to close, whose framing was unambiguous, with nothing unread after it.
//!
//! Where parsers may read one answer two ways, it is refused instead (the node reads no answer
//! that hyper's client refuses: `h1/differential.rs`): a `Transfer-Encoding` in an HTTP/1.0
//! answer, with a coding other than `chunked` or an empty element; in chunked framing, a line
//! not ended by CRLF (a bare LF, or a CR elsewhere), blanks other than SP and HTAB before
//! extensions, more than 8 KiB of extensions in one body or of trailer section.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use bytes::{Buf, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Body as _;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

use super::body::{BodyError, Relay};
use super::{Failure, headers};

mod streamed;

use streamed::State;
pub(crate) use streamed::Streamed;
#[cfg(test)]
use streamed::{chunk_size, trailer_section};

/// How long a pooled connection may go unused before it is closed (the upstream's own
/// `Keep-Alive: timeout` may make it shorter).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// `Keep-Alive` (an HTTP/1.0-era field some upstreams still send with their idle timeout).
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
/// The most bytes an answer's head may take.
const MAX_HEAD: usize = u16::MAX as usize;
/// The most bytes a chunked body's trailer section may take.
const MAX_TRAILERS: usize = 8 * 1024;
/// The most header fields in an answer's head.
const MAX_FIELDS: usize = 100;
/// Room made in the read buffer before each read.
const READ_ROOM: usize = 8 * 1024;
/// The longest chunk-size line (with extensions) accepted.
const MAX_CHUNK_LINE: usize = 1024;
/// The most bytes of chunk extensions accepted in one body.
const MAX_CHUNK_EXTENSIONS: usize = 8 * 1024;

/// One kept-alive connection to an upstream.
pub(crate) struct Conn {
    stream: TcpStream,
    /// Bytes read and not yet consumed.
    buf: BytesMut,
    /// The request head being written (kept for its capacity).
    out: Vec<u8>,
    /// When it last went back to the pool.
    pub(crate) idle_since: Instant,
    /// It carried a request before this one.
    reused: bool,
    /// How long it may wait in the pool: [`IDLE_TIMEOUT`], or less when the upstream said
    /// it closes idle connections sooner (`Keep-Alive: timeout=…`).
    pub(crate) keep_for: Duration,
}

impl Conn {
    /// A new connection.
    pub(crate) fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: BytesMut::new(),
            out: Vec::new(),
            idle_since: Instant::now(),
            reused: false,
            keep_for: IDLE_TIMEOUT,
        }
    }

    /// Whether a pooled connection is still open with nothing unread. A look at the socket's
    /// last known readiness: a system call only when it was signalled readable since (a
    /// close, or bytes nobody asked for; either way the connection is done).
    pub(crate) fn is_open(&mut self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Read more of the answer into the buffer; `Ok(0)` at the close.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.buf.reserve(READ_ROOM);
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
    }
}

/// Where a connection goes once an answer on it has been read to its end: the pool.
pub(crate) trait Keeper: Send + Sync + 'static {
    /// Take `conn` back for another request.
    fn keep(&self, conn: Conn);
}

/// An answer's body.
pub(crate) enum Answer {
    /// Arrived whole with the head (possibly empty); the connection is already back.
    Whole(Bytes),
    /// Still arriving.
    Streamed(Streamed),
}

/// An exchange that gave no answer.
pub(crate) enum Failed {
    /// A kept-alive connection turned out closed before any answer: the request is whole
    /// and may be sent on another connection (it has no body, and either its head could
    /// not be written or its method is safe to repeat).
    Retry(Box<Request<Relay<Body>>>),
    /// Anything else.
    Failure(Failure),
}

impl From<Failure> for Failed {
    fn from(failure: Failure) -> Failed {
        Failed::Failure(failure)
    }
}

/// How the request's body goes: its length as the client gave it, or chunked.
#[derive(Clone, Copy)]
enum Sending {
    None,
    Length(u64),
    Chunked,
}

/// Send `request` (its URI in origin form, `Host` set) on `conn` and read the answer's head.
pub(crate) async fn exchange<K: Keeper>(
    mut conn: Conn,
    mut request: Request<Relay<Body>>,
    keeper: &Arc<K>,
) -> Result<Response<Answer>, Failed> {
    let empty = request.body().is_end_stream();
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let sending = match (empty, declared) {
        (true, _) => Sending::None,
        (false, Some(length)) => Sending::Length(length),
        (false, None) => Sending::Chunked,
    };
    encode_head(&mut conn.out, &request, sending);
    let reused = conn.reused;
    // Safe methods only (RFC 9110 §9.2.1): the upstream may have acted on the request
    // before it closed, and a `PUT` or `DELETE` sent twice may not be the same as once.
    let repeatable = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );

    let (head, link) = if empty {
        if conn.stream.write_all(&conn.out).await.is_err() {
            return Err(if reused {
                Failed::Retry(Box::new(request))
            } else {
                Failed::Failure(Failure::Reset)
            });
        }
        match read_head(&mut conn).await {
            Ok(head) => (head, Link::Whole(conn)),
            Err(HeadError::Closed) if reused && repeatable => {
                return Err(Failed::Retry(Box::new(request)));
            }
            Err(HeadError::Closed) => return Err(Failure::Reset.into()),
            Err(HeadError::Failure(failure)) => return Err(failure.into()),
        }
    } else {
        // The body goes up while the answer's head is awaited, and after it, if the upstream
        // answers early (an echo, or a refusal): the connection is split in two halves.
        let Conn {
            stream,
            mut buf,
            out,
            ..
        } = conn;
        let (mut reader, writer) = stream.into_split();
        let body = std::mem::replace(
            request.body_mut(),
            Relay::request(Body::empty(), None, Duration::ZERO, None),
        );
        let mut upload: Pin<Box<Upload>> = Box::pin(send_request(writer, out, body, sending));
        let mut uploaded = None;
        let mut upload_failed = false;
        let outcome = {
            let mut reading = pin!(read_head_from(&mut reader, &mut buf));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(head) = reading.as_mut().poll(cx) {
                    return Poll::Ready(head);
                }
                if uploaded.is_none()
                    && !upload_failed
                    && let Poll::Ready(result) = upload.as_mut().poll(cx)
                {
                    match result {
                        Ok(halves) => uploaded = Some(halves),
                        Err(SendError::Body(failure)) => {
                            return Poll::Ready(Err(HeadError::Failure(failure)));
                        }
                        // The upstream stopped reading: it may still answer.
                        Err(SendError::Io) => upload_failed = true,
                    }
                }
                Poll::Pending
            })
            .await
        };
        let head = match outcome {
            Ok(head) => head,
            Err(HeadError::Closed) => return Err(Failure::Reset.into()),
            Err(HeadError::Failure(failure)) => return Err(failure.into()),
        };
        let link = match uploaded {
            Some((writer, out)) => {
                let stream = reader.reunite(writer).map_err(|_| Failure::Reset)?;
                Link::Whole(Conn {
                    stream,
                    buf,
                    out,
                    idle_since: Instant::now(),
                    reused,
                    keep_for: IDLE_TIMEOUT,
                })
            }
            None => Link::Split(Box::new(Split {
                reader,
                buf,
                upload: (!upload_failed).then_some(upload),
                writer: None,
            })),
        };
        (head, link)
    };

    let (framing, keep) = framing(request.method(), &head)?;
    let keep_for = head.facts.keep_for();
    let keep = keep && !keep_for.is_zero();
    let mut response = Response::new(());
    *response.status_mut() = head.status;
    *response.version_mut() = head.version;
    *response.headers_mut() = head.headers;
    let mut link = link;
    if let Link::Whole(conn) = &mut link {
        conn.keep_for = keep_for;
    }
    let answer = match framing {
        Framing::Empty => {
            link.finish(keep, &**keeper);
            Answer::Whole(Bytes::new())
        }
        Framing::Length(length) if link.buf().len() as u64 >= length => {
            // `length` fits in the buffer, hence in a usize.
            let body = link.buf().split_to(length as usize).freeze();
            link.finish(keep, &**keeper);
            Answer::Whole(body)
        }
        _ => Answer::Streamed(Streamed {
            link: Some(link),
            keeper: Arc::clone(keeper) as Arc<dyn Keeper>,
            state: match framing {
                Framing::Length(length) => State::Length(length),
                Framing::Chunked => State::Size,
                _ => State::Close,
            },
            keep,
            extensions: 0,
        }),
    };
    let (parts, ()) = response.into_parts();
    Ok(Response::from_parts(parts, answer))
}

/// The request's body going up, ending with the connection's writing half and head buffer.
type Upload = dyn Future<Output = Result<(OwnedWriteHalf, Vec<u8>), SendError>> + Send;

/// Write the request's head, then stream its body.
async fn send_request(
    mut writer: OwnedWriteHalf,
    head: Vec<u8>,
    mut body: Relay<Body>,
    sending: Sending,
) -> Result<(OwnedWriteHalf, Vec<u8>), SendError> {
    writer.write_all(&head).await.map_err(|_| SendError::Io)?;
    send_body(&mut writer, &mut body, sending).await?;
    Ok((writer, head))
}

/// The connection an answer is read from.
enum Link {
    /// The whole connection: back to the pool when the answer has been read to its end.
    Whole(Conn),
    /// Split while the request's body still goes up: closed after the answer.
    Split(Box<Split>),
}

/// A connection whose request body went on after its answer began.
struct Split {
    reader: OwnedReadHalf,
    buf: BytesMut,
    /// The rest of the request's body.
    upload: Option<Pin<Box<Upload>>>,
    /// Kept open until the answer ends, once the body has all gone up.
    writer: Option<OwnedWriteHalf>,
}

impl Link {
    fn buf(&mut self) -> &mut BytesMut {
        match self {
            Link::Whole(conn) => &mut conn.buf,
            Link::Split(split) => &mut split.buf,
        }
    }

    /// The answer is over: a whole connection that may carry another request goes back to
    /// the pool, anything else is closed.
    fn finish(self, keep: bool, keeper: &dyn Keeper) {
        if let Link::Whole(mut conn) = self
            && keep
            && conn.buf.is_empty()
        {
            conn.reused = true;
            keeper.keep(conn);
        }
    }

    /// Read more of the answer (and send more of the request's body, if it still goes).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        match self {
            Link::Whole(conn) => conn.poll_fill(cx),
            Link::Split(split) => {
                if let Some(upload) = split.upload.as_mut()
                    && let Poll::Ready(result) = upload.as_mut().poll(cx)
                {
                    split.upload = None;
                    match result {
                        Ok((writer, _)) => split.writer = Some(writer),
                        Err(SendError::Body(_)) => {
                            return Poll::Ready(Err(io::Error::other(
                                "the request's body broke off",
                            )));
                        }
                        Err(SendError::Io) => {}
                    }
                }
                split.buf.reserve(READ_ROOM);
                tokio_util::io::poll_read_buf(Pin::new(&mut split.reader), cx, &mut split.buf)
            }
        }
    }
}

/// The request line and header fields, with the body's framing.
fn encode_head(out: &mut Vec<u8>, request: &Request<Relay<Body>>, sending: Sending) {
    out.clear();
    out.extend_from_slice(request.method().as_str().as_bytes());
    out.push(b' ');
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(if target.is_empty() {
        b"/"
    } else {
        target.as_bytes()
    });
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in request.headers() {
        if matches!(sending, Sending::Chunked) && name == CONTENT_LENGTH {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match sending {
        Sending::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Sending::None
            if !request.headers().contains_key(CONTENT_LENGTH)
                && matches!(
                    *request.method(),
                    Method::POST | Method::PUT | Method::PATCH
                ) =>
        {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        _ => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// Why the request's body did not all go out.
enum SendError {
    /// The client's body failed: the exchange ends with this.
    Body(Failure),
    /// The upstream's side of the connection failed.
    Io,
}

/// Stream the request's body (its head already written).
async fn send_body<W>(
    writer: &mut W,
    body: &mut Relay<Body>,
    sending: Sending,
) -> Result<(), SendError>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut sent = 0u64;
    let mut line = Vec::with_capacity(24);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| SendError::Body(body_failure(error)))?;
        let frame = match frame.into_data() {
            Ok(data) => {
                if data.is_empty() {
                    continue;
                }
                sent += data.len() as u64;
                match sending {
                    Sending::Length(length) if sent > length => {
                        return Err(SendError::Body(Failure::ClientAborted));
                    }
                    Sending::Chunked => {
                        line.clear();
                        push_hex(&mut line, data.len());
                        line.extend_from_slice(b"\r\n");
                        writer.write_all(&line).await.map_err(|_| SendError::Io)?;
                        writer.write_all(&data).await.map_err(|_| SendError::Io)?;
                        writer.write_all(b"\r\n").await.map_err(|_| SendError::Io)?;
                    }
                    _ => writer.write_all(&data).await.map_err(|_| SendError::Io)?,
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let (Ok(trailers), Sending::Chunked) = (frame.into_trailers(), sending) {
            line.clear();
            line.extend_from_slice(b"0\r\n");
            for (name, value) in &trailers {
                line.extend_from_slice(name.as_str().as_bytes());
                line.extend_from_slice(b": ");
                line.extend_from_slice(value.as_bytes());
                line.extend_from_slice(b"\r\n");
            }
            line.extend_from_slice(b"\r\n");
            writer.write_all(&line).await.map_err(|_| SendError::Io)?;
            return writer.flush().await.map_err(|_| SendError::Io);
        }
    }
    match sending {
        Sending::Chunked => writer
            .write_all(b"0\r\n\r\n")
            .await
            .map_err(|_| SendError::Io)?,
        Sending::Length(length) if sent != length => {
            return Err(SendError::Body(Failure::ClientAborted));
        }
        _ => {}
    }
    writer.flush().await.map_err(|_| SendError::Io)
}

/// `n` in hexadecimal.
fn push_hex(out: &mut Vec<u8>, n: usize) {
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1);
    for shift in (0..digits).rev() {
        out.push(b"0123456789ABCDEF"[(n >> (shift * 4)) & 0xf]);
    }
}

/// The failure a broken request body ends the exchange with.
fn body_failure(error: BodyError) -> Failure {
    match error {
        BodyError::TooLarge { max } => Failure::TooLarge(max),
        BodyError::Stalled { .. } => Failure::ClientStalled,
        BodyError::Read(_) => Failure::ClientAborted,
    }
}

/// An answer's head.
struct Head {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    /// What the framing depends on, noted while the fields were read.
    facts: Facts,
}

/// The fields an answer's framing and its connection's fate depend on.
#[derive(Default)]
struct Facts {
    /// `Transfer-Encoding` is present; `Some(true)` when its last coding is `chunked`.
    chunked: Option<bool>,
    /// A transfer coding other than `chunked` (which the node does not decode), or an empty
    /// element of the list.
    other_coding: bool,
    /// The `Content-Length` (every value the same); `Err` when they differ or one is invalid.
    length: Option<Result<u64, ()>>,
    /// `Connection: close`.
    close: bool,
    /// The `timeout` of a `Keep-Alive` field: the upstream closes idle connections after it.
    idle_close: Option<Duration>,
}

impl Facts {
    /// How long the connection may wait in the pool after this answer: a second less than
    /// the upstream's own idle timeout (so that it is not reused just as the upstream closes
    /// it), at most [`IDLE_TIMEOUT`]; zero means it is not kept.
    fn keep_for(&self) -> Duration {
        match self.idle_close {
            None => IDLE_TIMEOUT,
            Some(timeout) => timeout.saturating_sub(Duration::from_secs(1)),
        }
    }

    fn note(&mut self, name: &HeaderName, value: &[u8]) {
        if name == CONTENT_LENGTH {
            for token in value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                let parsed = (!token.is_empty() && token.len() <= 19)
                    .then(|| {
                        token.iter().try_fold(0u64, |n, &b| {
                            b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
                        })
                    })
                    .flatten()
                    .ok_or(());
                self.length = match (self.length, parsed) {
                    (None, parsed) => Some(parsed),
                    (Some(Ok(seen)), Ok(n)) if seen == n => Some(Ok(n)),
                    _ => Some(Err(())),
                };
            }
        } else if name == TRANSFER_ENCODING {
            let last = value
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .rfind(|token| !token.is_empty());
            self.chunked = Some(last.is_some_and(|last| last.eq_ignore_ascii_case(b"chunked")));
            // An empty element too: some parsers skip it, others take it for the last coding
            // (`chunked,` is then not chunked), so the body's end would be in doubt.
            self.other_coding |= value
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .any(|token| !token.eq_ignore_ascii_case(b"chunked"));
        } else if name == KEEP_ALIVE {
            for parameter in value.split(|&b| b == b',') {
                let Some((key, seconds)) = std::str::from_utf8(parameter)
                    .ok()
                    .and_then(|p| p.split_once('='))
                else {
                    continue;
                };
                if key.trim().eq_ignore_ascii_case("timeout")
                    && let Ok(seconds) = seconds.trim().parse::<u64>()
                {
                    let seconds = Duration::from_secs(seconds.min(IDLE_TIMEOUT.as_secs()));
                    self.idle_close = Some(self.idle_close.map_or(seconds, |s| s.min(seconds)));
                }
            }
        } else if name == CONNECTION {
            self.close |= value
                .split(|&b| b == b',')
                .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
}

/// Why no head was read.
enum HeadError {
    /// The connection closed before any of the answer.
    Closed,
    Failure(Failure),
}

async fn read_head(conn: &mut Conn) -> Result<Head, HeadError> {
    let Conn { stream, buf, .. } = conn;
    read_head_from(stream, buf).await
}

/// Read until `buf` holds a whole final head, and take it out of `buf`.
async fn read_head_from<R>(reader: &mut R, buf: &mut BytesMut) -> Result<Head, HeadError>
where
    R: AsyncRead + Unpin,
{
    // Whether any of an answer arrived (an interim 1xx head leaves `buf` empty again).
    let mut answered = !buf.is_empty();
    loop {
        if !buf.is_empty()
            && let Some(head) = parse_head(buf).map_err(HeadError::Failure)?
        {
            return Ok(head);
        }
        buf.reserve(READ_ROOM);
        let read = std::future::poll_fn(|cx| {
            tokio_util::io::poll_read_buf(Pin::new(&mut *reader), cx, &mut *buf)
        })
        .await;
        match read {
            Ok(0) | Err(_) if !answered => return Err(HeadError::Closed),
            Ok(0) | Err(_) => return Err(HeadError::Failure(Failure::Reset)),
            Ok(_) => answered = true,
        }
    }
}

/// Parse a final head at the start of `buf` (skipping interim 1xx heads); `None` while it is
/// incomplete.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, Failure> {
    loop {
        // Parsed in place; each field's place is noted so that, once the head is taken out
        // of `buf` as shared bytes, its values are slices of those bytes, not copies.
        let mut spans = [(0u16, 0u16, 0u16, 0u16); MAX_FIELDS];
        let (length, code, minor, count) = {
            let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
            let mut response = httparse::Response::new(&mut []);
            let head = &buf[..buf.len().min(MAX_HEAD)];
            match httparse::ParserConfig::default().parse_response_with_uninit_headers(
                &mut response,
                head,
                &mut fields,
            ) {
                Ok(httparse::Status::Complete(length)) => {
                    let base = head.as_ptr() as usize;
                    // Within `MAX_HEAD`, so every offset and length fits in a u16.
                    let at = |p: *const u8| (p as usize - base) as u16;
                    for (span, field) in spans.iter_mut().zip(response.headers.iter()) {
                        *span = (
                            at(field.name.as_ptr()),
                            field.name.len() as u16,
                            at(field.value.as_ptr()),
                            field.value.len() as u16,
                        );
                    }
                    let code = response.code.ok_or(Failure::Malformed)?;
                    (length, code, response.version, response.headers.len())
                }
                Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
                    return Err(Failure::Malformed);
                }
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(_) => return Err(Failure::Malformed),
            }
        };
        if (100..200).contains(&code) && code != 101 {
            buf.advance(length);
            if buf.is_empty() {
                return Ok(None);
            }
            continue;
        }
        let status = StatusCode::from_u16(code).map_err(|_| Failure::Malformed)?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            // Nothing was asked to upgrade (`Upgrade` is dropped on the way).
            return Err(Failure::Malformed);
        }
        let head = buf.split_to(length).freeze();
        let mut headers = HeaderMap::with_capacity(count);
        let mut facts = Facts::default();
        // The hop-by-hop fields are left out of the map as it is built, `Connection` too
        // unless it names other fields (then the map is stripped after, as a request's is).
        let mut names_fields = false;
        for &(name_at, name_len, value_at, value_len) in &spans[..count] {
            let (name_at, value_at) = (usize::from(name_at), usize::from(value_at));
            let name = HeaderName::from_bytes(&head[name_at..name_at + usize::from(name_len)])
                .map_err(|_| Failure::Malformed)?;
            let value = head.slice(value_at..value_at + usize::from(value_len));
            facts.note(&name, &value);
            let value = HeaderValue::from_maybe_shared(value).map_err(|_| Failure::Malformed)?;
            if headers::hop_by_hop(&name) {
                if name != CONNECTION || headers::names_no_field(value.as_bytes()) {
                    continue;
                }
                names_fields = true;
            }
            headers.append(name, value);
        }
        if names_fields {
            headers::strip_hop_by_hop(&mut headers);
        }
        // The body's length comes from its chunks: a `Content-Length` sent with them is not
        // passed on (RFC 9112 §6.3), or the client would read it as the length.
        if facts.chunked.is_some() {
            headers.remove(CONTENT_LENGTH);
        }
        let version = match minor {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        return Ok(Some(Head {
            status,
            version,
            headers,
            facts,
        }));
    }
}

/// How an answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    Close,
}

/// The answer's framing, and whether its connection may carry another request after it.
fn framing(method: &Method, head: &Head) -> Result<(Framing, bool), Failure> {
    let facts = &head.facts;
    let keep = head.version == Version::HTTP_11 && !facts.close;
    let status = head.status;
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Empty, keep));
    }
    // A tunnel, were the upstream to open one: its bytes run to the close, and the
    // connection never serves another request.
    if *method == Method::CONNECT {
        return Ok((Framing::Close, false));
    }
    // `Transfer-Encoding` in an HTTP/1.0 answer is faulty framing (RFC 9112 §6.1), which
    // other parsers refuse: so does the node.
    if facts.chunked.is_some() && head.version == Version::HTTP_10 {
        return Err(Failure::Malformed);
    }
    // A body in another transfer coding (`gzip, chunked`) could not be passed on as it is:
    // the coding is hop-by-hop, and the client would get the coded bytes unannounced.
    if facts.other_coding {
        return Err(Failure::Malformed);
    }
    match (facts.chunked, facts.length) {
        // With both, the length is ignored and the connection not trusted after (§6.1).
        (Some(true), length) => Ok((Framing::Chunked, keep && length.is_none())),
        (Some(false), _) => Ok((Framing::Close, false)),
        (None, Some(Ok(length))) => Ok((Framing::Length(length), keep)),
        (None, Some(Err(()))) => Err(Failure::Malformed),
        (None, None) => Ok((Framing::Close, false)),
    }
}

#[cfg(test)]
mod differential;
#[cfg(any(test, feature = "fuzzing"))]
mod fuzz;
#[cfg(feature = "fuzzing")]
pub(crate) use fuzz::fuzz_head;
#[cfg(test)]
mod tests;
