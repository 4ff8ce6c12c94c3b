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

use super::{Keeper, Link, MAX_CHUNK_LINE, MAX_HEAD};

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
                // CRLF, or a bare LF (RFC 9112 §2.2), as on a chunk-size line.
                let ending = match buf.first() {
                    None => return Ok(Step::More),
                    Some(b'\n') => 1,
                    Some(b'\r') if buf.len() < 2 => return Ok(Step::More),
                    Some(b'\r') if buf[1] == b'\n' => 2,
                    Some(_) => return Err(self.fail("a chunk's data ran past its size")),
                };
                buf.advance(ending);
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
                buf.advance(end + 1);
                self.state = if size == 0 {
                    State::Trailers
                } else {
                    State::Data(size)
                };
                Ok(Step::Continue)
            }
            State::Trailers => {
                // The empty line that ends the body: CRLF, or a bare LF.
                match buf.first() {
                    None => return Ok(Step::More),
                    Some(b'\n') => {
                        buf.advance(1);
                        return Ok(Step::End);
                    }
                    Some(b'\r') if buf.len() < 2 => return Ok(Step::More),
                    Some(b'\r') if buf[1] == b'\n' => {
                        buf.advance(2);
                        return Ok(Step::End);
                    }
                    Some(_) => {}
                }
                let mut fields = [httparse::EMPTY_HEADER; 32];
                match httparse::parse_headers(buf, &mut fields) {
                    Ok(httparse::Status::Complete((length, fields))) => {
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
                    Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                        Err(self.fail("the trailer section is too long"))
                    }
                    Ok(httparse::Status::Partial) => Ok(Step::More),
                    Err(_) => Err(self.fail("a malformed trailer section")),
                }
            }
        }
    }
}

/// The size on a chunk-size line (without its LF): hexadecimal digits, then perhaps
/// extensions after `;`.
pub(super) fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(end);
    // After the digits: nothing, or (after optional blanks) the extensions after `;`.
    let rest = rest.trim_ascii_start();
    if digits.is_empty() || digits.len() > 16 || !(rest.is_empty() || rest[0] == b';') {
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
