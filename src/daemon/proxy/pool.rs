//! The kept-alive connections to one route's upstream. Each HTTP thread keeps its own: a
//! request is sent on a connection of the thread that serves it, and that connection's task
//! runs on the same thread's runtime, so a proxied request is served by one thread from the
//! client's bytes to the upstream's answer, with no hand-off to another.
//!
//! HTTP/1.1: a connection carries one request at a time; it goes back to its thread's pool
//! when the upstream's answer has been read to its end (and it is ready for the next), most
//! recently used first out. HTTP/2 (prior knowledge): one connection per thread carries all
//! of that thread's requests to the upstream at once.
//!
//! A connection that no request used for [`IDLE_TIMEOUT`] is closed (checked that often, so
//! it lives between one and two of them); at most [`MAX_IDLE`] wait in each thread's pool.

use std::cell::RefCell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use http::{HeaderValue, Request, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use thread_local::ThreadLocal;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::body::Relay;
use super::{Failure, classify};
use crate::daemon::config::ProxyRoute;

/// How long a pooled connection may go unused before it is closed.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The most idle HTTP/1.1 connections each HTTP thread keeps per upstream.
pub(crate) const MAX_IDLE: usize = 1024;
/// TCP keep-alive probes start after this long without traffic.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

type H1 = http1::SendRequest<Relay<Body>>;
type H2 = http2::SendRequest<Relay<Body>>;

/// A route's connections, one pool per HTTP thread.
pub(crate) struct Pool {
    /// `host:port`, what a connection is opened to.
    address: Box<str>,
    /// The `Host` field of an HTTP/1.1 request that came without one.
    host: Option<HeaderValue>,
    http2: bool,
    connect_timeout: Duration,
    local: ThreadLocal<RefCell<Local>>,
}

/// One thread's connections.
#[derive(Default)]
struct Local {
    /// Idle HTTP/1.1 connections, the most recently used last.
    idle: Vec<(H1, Arc<Watch>)>,
    /// The HTTP/2 connection.
    shared: Option<(H2, Arc<Watch>)>,
}

/// What a connection's task reads to tell whether it is idle.
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

impl Pool {
    /// The pool of `route`'s upstream (no connection is opened yet).
    pub(crate) fn new(route: &ProxyRoute) -> Pool {
        let host = route.upstream.host().unwrap_or("");
        let port = route.upstream.port_u16().unwrap_or(80);
        let host_field = if port == 80 {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        Pool {
            address: format!("{host}:{port}").into_boxed_str(),
            host: HeaderValue::from_str(&host_field).ok(),
            http2: route.http2,
            connect_timeout: route.connect_timeout,
            local: ThreadLocal::new(),
        }
    }

    /// Send `request` (its URI absolute) on a pooled connection, or on a new one, and wait
    /// for the answer's head. The [`Lease`] goes with the answer's body: the connection
    /// serves another request once the body has been read to its end.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut request: Request<Relay<Body>>,
    ) -> Result<(Response<Incoming>, Lease), Failure> {
        if self.http2 {
            return self.send_h2(request).await;
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
        while let Some((mut sender, watch)) = self.idle() {
            let lease = Lease::new(self, watch);
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, lease.with(sender))),
                // Closed before it took the request: the request is whole, try another.
                Err(mut error) => match error.take_message() {
                    Some(back) => request = back,
                    None => return Err(classify(error.into_error())),
                },
            }
        }
        let (mut sender, watch) = self.connect_h1().await?;
        let lease = Lease::new(self, watch);
        match sender.try_send_request(request).await {
            Ok(response) => Ok((response, lease.with(sender))),
            Err(error) => Err(classify(error.into_error())),
        }
    }

    async fn send_h2(
        self: &Arc<Self>,
        mut request: Request<Relay<Body>>,
    ) -> Result<(Response<Incoming>, Lease), Failure> {
        if let Some((mut sender, watch)) = self.shared() {
            let lease = Lease::new(self, watch);
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, lease)),
                Err(mut error) => match error.take_message() {
                    Some(back) => request = back,
                    None => return Err(classify(error.into_error())),
                },
            }
        }
        let (mut sender, watch) = self.connect_h2().await?;
        let lease = Lease::new(self, watch);
        match sender.try_send_request(request).await {
            Ok(response) => Ok((response, lease)),
            Err(error) => Err(classify(error.into_error())),
        }
    }

    /// This thread's most recently used idle connection that is still open.
    fn idle(&self) -> Option<(H1, Arc<Watch>)> {
        let mut local = self.local.get_or_default().borrow_mut();
        while let Some((sender, watch)) = local.idle.pop() {
            if sender.is_ready() {
                return Some((sender, watch));
            }
        }
        None
    }

    /// This thread's HTTP/2 connection, if it is open.
    fn shared(&self) -> Option<(H2, Arc<Watch>)> {
        let mut local = self.local.get_or_default().borrow_mut();
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

    /// Put a connection whose answer was read to its end back in this thread's pool; one
    /// still finishing its request is put back when it is ready.
    fn put(self: &Arc<Self>, sender: H1, watch: Arc<Watch>) {
        if sender.is_ready() {
            let mut local = self.local.get_or_default().borrow_mut();
            if local.idle.len() < MAX_IDLE {
                local.idle.push((sender, watch));
            }
        } else if !sender.is_closed()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let pool = Arc::clone(self);
            let mut sender = sender;
            runtime.spawn(async move {
                if let Ok(Ok(())) = tokio::time::timeout(IDLE_TIMEOUT, sender.ready()).await {
                    pool.put(sender, watch);
                }
            });
        }
    }

    async fn connect(&self) -> Result<TokioIo<TcpStream>, Failure> {
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
        Ok(TokioIo::new(stream))
    }

    async fn connect_h1(&self) -> Result<(H1, Arc<Watch>), Failure> {
        let io = self.connect().await?;
        let (sender, connection) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|_| Failure::Unreachable)?;
        let watch = Arc::new(Watch::default());
        tokio::spawn(drive(connection, Arc::clone(&watch)));
        Ok((sender, watch))
    }

    async fn connect_h2(&self) -> Result<(H2, Arc<Watch>), Failure> {
        let io = self.connect().await?;
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .adaptive_window(true)
            .handshake(io)
            .await
            .map_err(|_| Failure::Unreachable)?;
        let watch = Arc::new(Watch::default());
        tokio::spawn(drive(connection, Arc::clone(&watch)));
        self.local.get_or_default().borrow_mut().shared =
            Some((sender.clone(), Arc::clone(&watch)));
        Ok((sender, watch))
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

/// A request's hold on its connection, kept with the answer's body: when the body has been
/// read to its end, an HTTP/1.1 connection goes back to the pool; dropped earlier, the
/// connection is closed (the rest of the answer is unread).
pub(crate) struct Lease {
    pool: Arc<Pool>,
    watch: Option<Arc<Watch>>,
    sender: Option<H1>,
}

impl Lease {
    fn new(pool: &Arc<Pool>, watch: Arc<Watch>) -> Lease {
        watch.begin();
        Lease {
            pool: Arc::clone(pool),
            watch: Some(watch),
            sender: None,
        }
    }

    fn with(mut self, sender: H1) -> Lease {
        self.sender = Some(sender);
        self
    }

    /// The answer has been read to its end (`complete`) or is given up.
    fn release(&mut self, complete: bool) {
        let Some(watch) = self.watch.take() else {
            return;
        };
        watch.end();
        match self.sender.take() {
            Some(sender) if complete => self.pool.put(sender, watch),
            _ => {}
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release(false);
    }
}

/// An upstream's answer body, holding the connection's [`Lease`] until its end.
pub(crate) struct Leased {
    body: Incoming,
    lease: Lease,
}

impl Leased {
    /// `body`, read on the connection `lease` holds.
    pub(crate) fn new(body: Incoming, lease: Lease) -> Leased {
        Leased { body, lease }
    }

    /// The whole body has already arrived (or there is none): let the connection go.
    pub(crate) fn is_done(&mut self) -> bool {
        let done = hyper::body::Body::is_end_stream(&self.body);
        if done {
            self.lease.release(true);
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
        match &polled {
            Poll::Ready(None) => self.lease.release(true),
            Poll::Ready(Some(Err(_))) => self.lease.release(false),
            _ => {}
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

impl Drop for Leased {
    fn drop(&mut self) {
        let complete = hyper::body::Body::is_end_stream(&self.body);
        self.lease.release(complete);
    }
}
