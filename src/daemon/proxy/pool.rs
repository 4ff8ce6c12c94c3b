//! The kept-alive connections to one route's upstream. Each HTTP thread keeps its own: a
//! request is sent on a connection of the thread that serves it, so a proxied request is
//! served by one thread from the client's bytes to the upstream's answer, with no hand-off to
//! another.
//!
//! HTTP/1.1 ([`h1`](super::h1)): a connection carries one request at a time, spoken on the
//! request's own task; it goes back to its thread's pool when the upstream's answer has been
//! read to its end, most recently used first out, and is looked at before it is used again
//! (an upstream may have closed it meanwhile). HTTP/2 (prior knowledge): one connection per
//! thread, driven by a task of its own, carries all of that thread's requests to the upstream
//! at once.
//!
//! A connection that no request used for [`IDLE_TIMEOUT`] is closed (checked that often, so
//! it lives between one and two of them); at most [`MAX_IDLE`] wait in each thread's pool.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use http::{HeaderValue, Request, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use thread_local::ThreadLocal;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::body::Relay;
use super::h1::{self, Conn, Failed, IDLE_TIMEOUT, Keeper};
use super::{Failure, classify};
use crate::daemon::node_file::ProxyRoute;

/// The most idle HTTP/1.1 connections each HTTP thread keeps per upstream.
pub(crate) const MAX_IDLE: usize = 1024;
/// TCP keep-alive probes start after this long without traffic.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

type H2 = http2::SendRequest<Relay<Body>>;

/// A route's connections, one pool per HTTP thread.
pub(crate) struct Pool {
    /// `host:port`, what a connection is opened to.
    address: Box<str>,
    /// The `Host` field of an HTTP/1.1 request that came without one.
    host: Option<HeaderValue>,
    http2: bool,
    connect_timeout: Duration,
    /// Locked by its own thread on each request, and by the sweep of idle connections.
    local: ThreadLocal<Mutex<Local>>,
    /// A task closes the HTTP/1.1 connections left idle too long.
    sweeping: AtomicBool,
    /// The pool itself, for that task.
    this: Weak<Pool>,
}

/// One thread's connections.
#[derive(Default)]
struct Local {
    /// Idle HTTP/1.1 connections, the most recently used last.
    idle: Vec<Conn>,
    /// The HTTP/2 connection.
    shared: Option<(H2, Arc<Watch>)>,
}

/// What an HTTP/2 connection's task reads to tell whether it is idle.
#[derive(Default)]
struct Watch {
    /// Requests in flight on it (their answers not yet read to their end).
    busy: AtomicUsize,
    /// A request used it since the task last looked.
    used: AtomicBool,
}

impl Watch {
    fn begin(&self) {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.used.store(true, Ordering::Relaxed);
    }

    fn end(&self) {
        self.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An upstream's answer body.
pub(crate) enum Answer {
    /// Arrived whole with the head (possibly empty).
    Whole(Bytes),
    /// Still arriving on an HTTP/1.1 connection.
    H1(h1::Streamed),
    /// Arriving on the HTTP/2 connection.
    H2(Leased),
}

impl Pool {
    /// The pool of `route`'s upstream (no connection is opened yet).
    pub(crate) fn new(route: &ProxyRoute) -> Arc<Pool> {
        let host = route.upstream.host().unwrap_or("");
        let port = route.upstream.port_u16().unwrap_or(80);
        let host_field = if port == 80 {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        Arc::new_cyclic(|this| Pool {
            address: format!("{host}:{port}").into_boxed_str(),
            host: HeaderValue::from_str(&host_field).ok(),
            http2: route.http2,
            connect_timeout: route.connect_timeout,
            local: ThreadLocal::new(),
            sweeping: AtomicBool::new(false),
            this: this.clone(),
        })
    }

    /// This thread's connections.
    fn local(&self) -> MutexGuard<'_, Local> {
        self.local
            .get_or_default()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Send `request` (its URI absolute) on a pooled connection, or on a new one, and wait
    /// for the answer's head. An HTTP/1.1 connection serves another request once the
    /// answer's body has been read to its end.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut request: Request<Relay<Body>>,
    ) -> Result<Response<Answer>, Failure> {
        if self.http2 {
            // Boxed: HTTP/2's future is the largest, and an HTTP/1.1 request would carry
            // (and copy) its room.
            return Box::pin(self.send_h2(request)).await;
        }
        let origin = request
            .uri()
            .path_and_query()
            .cloned()
            .map(http::Uri::from)
            .unwrap_or_else(|| http::Uri::from_static("/"));
        *request.uri_mut() = origin;
        if let Some(host) = &self.host {
            request
                .headers_mut()
                .entry(http::header::HOST)
                .or_insert_with(|| host.clone());
        }
        // Only a kept-alive connection answers `Retry`: the one retry goes on a new
        // connection, so a request is sent at most twice.
        let mut retried = false;
        loop {
            let idle = if retried { None } else { self.idle() };
            let conn = match idle {
                Some(conn) => conn,
                None => Conn::new(self.connect().await?),
            };
            match h1::exchange(conn, request, self).await {
                Ok(response) => {
                    return Ok(response.map(|body| match body {
                        h1::Answer::Whole(body) => Answer::Whole(body),
                        h1::Answer::Streamed(body) => Answer::H1(body),
                    }));
                }
                Err(Failed::Retry(_)) if retried => return Err(Failure::Reset),
                Err(Failed::Retry(back)) => {
                    retried = true;
                    request = *back;
                }
                Err(Failed::Failure(failure)) => return Err(failure),
            }
        }
    }

    async fn send_h2(
        self: &Arc<Self>,
        mut request: Request<Relay<Body>>,
    ) -> Result<Response<Answer>, Failure> {
        let leased = |response: Response<Incoming>, lease: Lease| {
            response.map(|body| Answer::H2(Leased::new(body, lease)))
        };
        if let Some((mut sender, watch)) = self.shared() {
            let lease = Lease::new(watch);
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(leased(response, lease)),
                Err(mut error) => match error.take_message() {
                    Some(back) => request = back,
                    None => return Err(classify(error.into_error())),
                },
            }
        }
        let (mut sender, watch) = self.connect_h2().await?;
        let lease = Lease::new(watch);
        match sender.try_send_request(request).await {
            Ok(response) => Ok(leased(response, lease)),
            Err(error) => Err(classify(error.into_error())),
        }
    }

    /// This thread's most recently used idle connection that is still open.
    fn idle(&self) -> Option<Conn> {
        let mut local = self.local();
        while let Some(mut conn) = local.idle.pop() {
            if conn.idle_since.elapsed() < conn.keep_for && conn.is_open() {
                return Some(conn);
            }
        }
        None
    }

    /// This thread's HTTP/2 connection, if it is open.
    fn shared(&self) -> Option<(H2, Arc<Watch>)> {
        let mut local = self.local();
        match &local.shared {
            Some((sender, watch)) if !sender.is_closed() => {
                Some((sender.clone(), Arc::clone(watch)))
            }
            Some(_) => {
                local.shared = None;
                None
            }
            None => None,
        }
    }

    /// Put an HTTP/1.1 connection whose answer was read to its end back in this thread's
    /// pool.
    fn put_h1(&self, mut conn: Conn) {
        conn.idle_since = Instant::now();
        {
            let mut local = self.local();
            if local.idle.len() >= MAX_IDLE {
                return;
            }
            local.idle.push(conn);
        }
        if !self.sweeping.load(Ordering::Relaxed) {
            self.sweep_later();
        }
    }

    /// Start the task that closes connections idle for [`IDLE_TIMEOUT`], unless it runs.
    fn sweep_later(&self) {
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::Relaxed);
            return;
        };
        let pool: Weak<Pool> = self.this.clone();
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(IDLE_TIMEOUT).await;
                // The pool went with its routes (a reload): its connections closed with it.
                let Some(pool) = pool.upgrade() else { return };
                if pool.sweep() {
                    continue;
                }
                pool.sweeping.store(false, Ordering::Relaxed);
                // A connection put back since the sweep saw the flag still set.
                if !pool.sweep() || pool.sweeping.swap(true, Ordering::Relaxed) {
                    return;
                }
            }
        });
    }

    /// Close every thread's connections idle for [`IDLE_TIMEOUT`] or closed by the
    /// upstream; tell whether any are left.
    fn sweep(&self) -> bool {
        let mut left = false;
        for local in self.local.iter() {
            let mut local = local
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            local
                .idle
                .retain_mut(|conn| conn.idle_since.elapsed() < conn.keep_for && conn.is_open());
            left |= !local.idle.is_empty();
        }
        left
    }

    async fn connect(&self) -> Result<TcpStream, Failure> {
        let stream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&*self.address))
                .await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    return Err(match error.kind() {
                        std::io::ErrorKind::ConnectionRefused => Failure::Refused,
                        std::io::ErrorKind::TimedOut => Failure::ConnectTimeout,
                        _ => Failure::Unreachable,
                    });
                }
                Err(_) => return Err(Failure::ConnectTimeout),
            };
        let _ = stream.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        Ok(stream)
    }

    async fn connect_h2(&self) -> Result<(H2, Arc<Watch>), Failure> {
        let io = TokioIo::new(self.connect().await?);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .adaptive_window(true)
            .handshake(io)
            .await
            .map_err(|_| Failure::Unreachable)?;
        let watch = Arc::new(Watch::default());
        tokio::spawn(drive(connection, Arc::clone(&watch)));
        self.local().shared = Some((sender.clone(), Arc::clone(&watch)));
        Ok((sender, watch))
    }
}

impl Keeper for Pool {
    fn keep(&self, conn: Conn) {
        self.put_h1(conn);
    }
}

/// Drive a connection until it ends, or until no request used it for a whole
/// [`IDLE_TIMEOUT`] (then it is dropped, which closes it).
async fn drive<C>(connection: C, watch: Arc<Watch>)
where
    C: Future<Output = hyper::Result<()>>,
{
    let mut connection = pin!(connection);
    let mut idle = pin!(tokio::time::sleep(IDLE_TIMEOUT));
    // The timer is polled (which registers it) once, then only when it has fired: not on
    // every request's wake-up.
    let mut armed = false;
    std::future::poll_fn(|cx| {
        loop {
            if let Poll::Ready(result) = connection.as_mut().poll(cx) {
                if let Err(error) = result {
                    tracing::debug!(%error, "upstream connection ended");
                }
                return Poll::Ready(());
            }
            if armed && !idle.is_elapsed() {
                return Poll::Pending;
            }
            if idle.as_mut().poll(cx).is_pending() {
                armed = true;
                return Poll::Pending;
            }
            if watch.busy.load(Ordering::Relaxed) == 0 && !watch.used.swap(false, Ordering::Relaxed)
            {
                tracing::debug!("closing an idle upstream connection");
                return Poll::Ready(());
            }
            idle.as_mut().reset(Instant::now() + IDLE_TIMEOUT);
            armed = false;
        }
    })
    .await;
}

/// A request's hold on the HTTP/2 connection, kept with the answer's body until its end (the
/// connection's task counts the requests in flight to tell when it is idle).
pub(crate) struct Lease {
    watch: Option<Arc<Watch>>,
}

impl Lease {
    fn new(watch: Arc<Watch>) -> Lease {
        watch.begin();
        Lease { watch: Some(watch) }
    }

    /// The answer has been read to its end or is given up.
    fn release(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.end();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release();
    }
}

/// An answer body from the HTTP/2 connection, holding its [`Lease`] until its end.
pub(crate) struct Leased {
    body: Incoming,
    lease: Lease,
}

impl Leased {
    fn new(body: Incoming, lease: Lease) -> Leased {
        Leased { body, lease }
    }

    /// The whole body has already arrived (or there is none): let the lease go.
    pub(crate) fn is_done(&mut self) -> bool {
        let done = hyper::body::Body::is_end_stream(&self.body);
        if done {
            self.lease.release();
        }
        done
    }
}

impl hyper::body::Body for Leased {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.lease.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
