//! An answer's body read from its upstream connection as it arrives: by its length, in
//! chunks (with extensions and a trailer section), or to the close. The connection goes back
//! to the pool once the body has been read to its end.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::body::Bytes;
use bytes::Buf;
use http::{HeaderMap, HeaderName, HeaderValue};
use hyper::body::{Frame, SizeHint};

use super::{Keeper, Link, MAX_CHUNK_EXTENSIONS, MAX_CHUNK_LINE, MAX_TRAILERS};

/// Where a streamed body's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// This many bytes of the body are still to come.
    Length(u64),
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk are still to come.
    Data(u64),
    /// The CRLF after a chunk's data is next.
    DataEnd,
    /// The trailer section (after the last chunk) is next.
    Trailers,
    /// The body runs until the upstream closes.
    Close,
    /// Read to its end, or failed.
    Done,
}

/// What the buffered bytes gave.
enum Step {
    Frame(Frame<Bytes>),
    /// More bytes are needed.
    More,
    /// The body ended.
    End,
    Continue,
}

/// An answer's body still arriving on its connection, which goes back to the pool when the
/// body has been read to its end (and is closed if the body is dropped before).
pub(crate) struct Streamed {
    pub(super) link: Option<Link>,
    pub(super) keeper: Arc<dyn Keeper>,
    pub(super) state: State,
    pub(super) keep: bool,
    /// Bytes of chunk extensions read so far.
    pub(super) extensions: usize,
}

impl Streamed {
    fn end(&mut self) {
        self.state = State::Done;
        if let Some(link) = self.link.take() {
            link.finish(self.keep, &*self.keeper);
        }
    }

    fn fail(&mut self, what: &'static str) -> io::Error {
        self.state = State::Done;
        self.link = None;
        io::Error::new(io::ErrorKind::InvalidData, what)
    }

    /// Decode what the buffer holds.
    fn step(&mut self) -> Result<Step, io::Error> {
        let Some(link) = self.link.as_mut() else {
            return Ok(Step::End);
        };
        let buf = link.buf();
        match self.state {
            State::Done => Ok(Step::End),
            State::Length(0) => Ok(Step::End),
            State::Length(_) | State::Data(_) | State::Close if buf.is_empty() => Ok(Step::More),
            State::Length(left) => {
                let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let left = left - take as u64;
                self.state = State::Length(left);
                Ok(Step::Frame(Frame::data(buf.split_to(take).freeze())))
            }
            State::Close => Ok(Step::Frame(Frame::data(buf.split().freeze()))),
            State::Data(left) => {
                let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let left = left - take as u64;
                self.state = if left == 0 {
                    State::DataEnd
                } else {
                    State::Data(left)
                };
                Ok(Step::Frame(Frame::data(buf.split_to(take).freeze())))
            }
            State::DataEnd => {
                // CRLF, as on a chunk-size line: a bare LF is not taken for a line's end in
                // the chunked framing (other parsers refuse it).
                match buf.first() {
                    None => return Ok(Step::More),
                    Some(b'\r') if buf.len() < 2 => return Ok(Step::More),
                    Some(b'\r') if buf[1] == b'\n' => {}
                    Some(_) => return Err(self.fail("a chunk's data ran past its size")),
                }
                buf.advance(2);
                self.state = State::Size;
                Ok(Step::Continue)
            }
            State::Size => {
                let Some(end) = buf.iter().take(MAX_CHUNK_LINE).position(|&b| b == b'\n') else {
                    if buf.len() >= MAX_CHUNK_LINE {
                        return Err(self.fail("a chunk-size line is too long"));
                    }
                    return Ok(Step::More);
                };
                let Some(size) = chunk_size(&buf[..end]) else {
                    return Err(self.fail("a malformed chunk-size line"));
                };
                // Extensions are skipped, but there is no end of them in one body: the bytes
                // after each `;` (to the CR) count towards a bound.
                if let Some(at) = buf[..end].iter().position(|&b| b == b';') {
                    self.extensions += end - at - 2;
                    if self.extensions > MAX_CHUNK_EXTENSIONS {
                        return Err(self.fail("the chunk extensions are too long"));
                    }
                }
                buf.advance(end + 1);
                self.state = if size == 0 {
                    State::Trailers
                } else {
                    State::Data(size)
                };
                Ok(Step::Continue)
            }
            State::Trailers => {
                // Lines that end in CRLF, up to an empty one: a bare CR or LF is refused, as
                // on a chunk-size line.
                let length = match trailer_section(&buf[..buf.len().min(MAX_TRAILERS)]) {
                    Err(()) => return Err(self.fail("a malformed trailer section")),
                    Ok(None) if buf.len() >= MAX_TRAILERS => {
                        return Err(self.fail("the trailer section is too long"));
                    }
                    Ok(None) => return Ok(Step::More),
                    Ok(Some(2)) => {
                        buf.advance(2);
                        return Ok(Step::End);
                    }
                    Ok(Some(length)) => length,
                };
                let mut fields = [httparse::EMPTY_HEADER; 32];
                match httparse::parse_headers(&buf[..length], &mut fields) {
                    Ok(httparse::Status::Complete((_, fields))) => {
                        let mut trailers = HeaderMap::with_capacity(fields.len());
                        for field in fields {
                            if let (Ok(name), Ok(value)) = (
                                HeaderName::from_bytes(field.name.as_bytes()),
                                HeaderValue::from_bytes(field.value),
                            ) {
                                trailers.append(name, value);
                            }
                        }
                        buf.advance(length);
                        self.state = State::Length(0);
                        Ok(Step::Frame(Frame::trailers(trailers)))
                    }
                    Ok(httparse::Status::Partial) | Err(_) => {
                        Err(self.fail("a malformed trailer section"))
                    }
                }
            }
        }
    }
}

/// The length of the trailer section at the start of `buf` (its field lines and the empty
/// line after them, every line ending in CRLF); `None` while it is incomplete, `Err` at a CR
/// without its LF or an LF without its CR.
pub(super) fn trailer_section(buf: &[u8]) -> Result<Option<usize>, ()> {
    let mut line = 0;
    loop {
        let Some(at) = buf[line..].iter().position(|&b| b == b'\r' || b == b'\n') else {
            return Ok(None);
        };
        let end = line + at;
        match (buf[end], buf.get(end + 1)) {
            (b'\r', None) => return Ok(None),
            (b'\r', Some(b'\n')) => {}
            _ => return Err(()),
        }
        if end == line {
            return Ok(Some(end + 2));
        }
        line = end + 2;
    }
}

/// The size on a chunk-size line (without its LF): hexadecimal digits, perhaps blanks (SP or
/// HTAB), perhaps extensions after `;`, then the CR of its CRLF. A bare LF ending the line, or
/// a CR anywhere else in it, is refused: other parsers end or split the line elsewhere.
pub(super) fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r")?;
    let end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(end);
    // After the digits: nothing, or (after optional blanks) the extensions after `;`.
    let blanks = rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let rest = &rest[blanks..];
    if digits.is_empty()
        || digits.len() > 16
        || !(rest.is_empty() || rest[0] == b';')
        || rest.contains(&b'\r')
    {
        return None;
    }
    digits
        .iter()
        .try_fold(0u64, |n, &b| Some(n << 4 | u64::from(hex(b)?)))
}

/// The value of one hexadecimal digit.
fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

impl hyper::body::Body for Streamed {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            match this.step() {
                Ok(Step::Frame(frame)) => {
                    if this.state == State::Length(0) {
                        this.end();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(Step::Continue) => {}
                Ok(Step::End) => {
                    this.end();
                    return Poll::Ready(None);
                }
                Err(error) => return Poll::Ready(Some(Err(error))),
                Ok(Step::More) => {
                    let Some(link) = this.link.as_mut() else {
                        return Poll::Ready(None);
                    };
                    match ready!(link.poll_fill(cx)) {
                        Ok(0) if this.state == State::Close => {
                            this.keep = false;
                            this.end();
                            return Poll::Ready(None);
                        }
                        Ok(0) => {
                            return Poll::Ready(Some(Err(this.fail("the answer was cut short"))));
                        }
                        Ok(_) => {}
                        Err(error) => {
                            this.state = State::Done;
                            this.link = None;
                            return Poll::Ready(Some(Err(error)));
                        }
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(left) => SizeHint::with_exact(left),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
