//! A connection's activity, as its timeouts read it: requests in flight and answered, when
//! it went idle, when a request's head began, since when a write waits for the client; the
//! stream and bodies that note it; the coarse clock it is timed on; and the gate that spares
//! the connection's watch a poll of its stop signal and timer on every wake.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The monotonic clock in nanoseconds, read as cheaply as the system allows: on Linux
/// `CLOCK_MONOTONIC_COARSE` (the kernel tick's resolution, a few milliseconds, and about a
/// quarter of a precise read's cost), which is plenty for timeouts of seconds and is read
/// twice a request.
fn coarse_now_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid timespec for the call to write.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) } == 0 {
            let secs = u64::try_from(now.tv_sec).unwrap_or(0);
            let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
            return secs.saturating_mul(1_000_000_000).saturating_add(nanos);
        }
    }
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// What the watchdog of one connection reads: times in nanoseconds since `epoch`, on the
/// coarse clock ([`coarse_now_ns`]).
pub(super) struct Activity {
    epoch: u64,
    /// Requests dispatched and not yet answered.
    in_flight: AtomicUsize,
    /// Requests answered on this connection.
    served: AtomicU64,
    /// When the connection last became idle (opened, or its last response was ready).
    idle_since: AtomicU64,
    /// The first byte read since then (0: none yet).
    first_byte: AtomicU64,
    /// Since when a write has waited for the client to take bytes (0: none waits).
    write_blocked: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            epoch: coarse_now_ns(),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            first_byte: AtomicU64::new(0),
            write_blocked: AtomicU64::new(0),
        }
    }

    pub(super) fn now(&self) -> u64 {
        coarse_now_ns().saturating_sub(self.epoch).max(1)
    }

    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.first_byte.store(0, Ordering::Release);
    }

    fn end(&self) {
        self.served.fetch_add(1, Ordering::AcqRel);
        self.idle_since.store(self.now(), Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Note a write's result: a client that takes no bytes blocks the writes.
    fn note_write<T>(&self, result: &Poll<T>) {
        let blocked = self.write_blocked.load(Ordering::Relaxed);
        match result {
            Poll::Pending if blocked == 0 => {
                self.write_blocked.store(self.now(), Ordering::Release)
            }
            Poll::Ready(_) if blocked != 0 => self.write_blocked.store(0, Ordering::Release),
            _ => {}
        }
    }

    /// When the connection is due to close, and why. While a request is in flight, only a
    /// client that has taken none of its answer for `idle_timeout`.
    pub(super) fn deadline(
        &self,
        header_read_timeout: Duration,
        idle_timeout: Duration,
    ) -> Option<(u64, &'static str)> {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if self.in_flight.load(Ordering::Acquire) > 0 {
            let blocked = self.write_blocked.load(Ordering::Acquire);
            return (blocked > 0)
                .then(|| (blocked.saturating_add(nanos(idle_timeout)), "write_timeout"));
        }
        let header = nanos(header_read_timeout);
        if self.served.load(Ordering::Acquire) == 0 {
            // A new connection has to send its first request's head in the header time.
            return Some((header, "header_timeout"));
        }
        let first_byte = self.first_byte.load(Ordering::Acquire);
        if first_byte > 0 {
            return Some((first_byte.saturating_add(header), "header_timeout"));
        }
        let idle_since = self.idle_since.load(Ordering::Acquire);
        Some((
            idle_since.saturating_add(nanos(idle_timeout)),
            "idle_timeout",
        ))
    }
}

/// A request, or its streamed body, in flight on a connection: the connection's timeouts
/// wait while one is alive.
pub(super) struct InFlight(Arc<Activity>);

impl InFlight {
    pub(super) fn begin(activity: &Arc<Activity>) -> InFlight {
        activity.begin();
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A body that keeps its request in flight until it is dropped (sent, or abandoned).
pub(super) struct Tracked<B> {
    pub(super) body: B,
    pub(super) _in_flight: InFlight,
}

impl<B> hyper::body::Body for Tracked<B>
where
    B: hyper::body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The TCP stream, noting the first byte of each request's head.
pub(super) struct Watched {
    pub(super) stream: TcpStream,
    pub(super) activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before
            && self.activity.in_flight.load(Ordering::Acquire) == 0
            && self.activity.first_byte.load(Ordering::Acquire) == 0
        {
            let now = self.activity.now();
            self.activity.first_byte.store(now, Ordering::Release);
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.activity.note_write(&result);
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.activity.note_write(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A future that, once polled, is polled again only when `may_be_ready` says it may be
/// ready. For a future that keeps the waker of its first poll (a task's waker stays the
/// same): a connection woken for its socket then skips polling its stop signal (whose poll
/// takes a lock that every connection shares) and its timer, request after request.
pub(super) struct Gated<F, G> {
    future: F,
    may_be_ready: G,
    polled: bool,
}

impl<F, G: FnMut(&F) -> bool> Gated<F, G> {
    pub(super) fn new(future: F, may_be_ready: G) -> Self {
        Gated {
            future,
            may_be_ready,
            polled: false,
        }
    }
}

impl<F, G> std::future::Future for Gated<F, G>
where
    F: std::future::Future + Unpin,
    G: FnMut(&F) -> bool + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        if this.polled && !(this.may_be_ready)(&this.future) {
            return Poll::Pending;
        }
        this.polled = true;
        Pin::new(&mut this.future).poll(cx)
    }
}
