//! The node's HTTP/1.1 server: the accept loop with a cap on open connections, and per
//! connection a watchdog that closes it when a request's head is slow to arrive
//! (`header_read_timeout`) or a kept-alive connection waits too long for its next request
//! (`idle_timeout`). Requests in flight are never cut by these timeouts, except when the
//! client takes none of its answer for `idle_timeout` (`write_timeout`). A request body is
//! read only up to `max_body_bytes` (within the header time): a longer one is answered 413,
//! a slower one 408, and the connection is closed without reading the rest.
//!
//! A request under a `[[proxy]]` route is not read first: its body streams to the upstream
//! (bounded by the route's `max_body_bytes`, a longer declared `Content-Length` answered 413
//! at once). A request counts as in flight until its response body has been sent and its
//! own body dropped, so streams are never cut by the connection's timeouts.
//!
//! The accept loop hands the connections in turn to the HTTP threads, one per core (or
//! `TOKIO_WORKER_THREADS`), each with a single-threaded runtime of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::daemon::activity::{Activity, Gated, InFlight, Tracked, Watched};
use crate::daemon::app::{App, AppFuture, Route};
use crate::daemon::node_file::{HttpSettings, RESERVED_FDS};

/// The server's limits, resolved.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) max_body_bytes: u64,
}

impl ConnLimits {
    /// The limits of `settings`, with the connection cap derived from the open-file limit
    /// when the file does not set it.
    pub(crate) fn new(settings: &HttpSettings, open_files: Option<u64>) -> ConnLimits {
        let derived = open_files
            .map_or(16_384, |n| usize::try_from(n).unwrap_or(usize::MAX))
            .saturating_sub(RESERVED_FDS)
            .clamp(16, 1 << 24);
        ConnLimits {
            header_read_timeout: settings.header_read_timeout,
            idle_timeout: settings.idle_timeout,
            max_connections: settings.max_connections.unwrap_or(derived),
            max_body_bytes: settings.max_body_bytes,
        }
    }
}

/// Raise the soft open-file limit to the hard limit; return the soft limit in force.
#[allow(
    clippy::unnecessary_cast,
    reason = "rlim_t is u64 on Linux, not on every Unix"
)]
pub(crate) fn raise_open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "reading the open-file limit");
            return None;
        }
        let before = limit.rlim_cur;
        // An unlimited hard limit is not a value the kernel takes for the soft one.
        let target = if limit.rlim_max == libc::RLIM_INFINITY {
            before.max(1 << 20)
        } else {
            limit.rlim_max
        };
        if target > before {
            let raised = libc::rlimit {
                rlim_cur: target,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: setrlimit reads the struct we own.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                tracing::info!(
                    from = before,
                    to = target,
                    "raised the open-file limit (RLIMIT_NOFILE) to the hard limit"
                );
                return Some(target as u64);
            }
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                soft = before,
                hard = limit.rlim_max,
                "could not raise the open-file limit"
            );
        } else {
            tracing::info!(limit = before, "open-file limit (RLIMIT_NOFILE)");
        }
        Some(before as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// A running accept loop; [`Server::stop`] ends it and lets the connections finish.
pub(crate) struct Server {
    stop: watch::Sender<bool>,
    permits: Arc<Semaphore>,
    max_connections: usize,
    accept: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Accept connections on `listener` and serve `app` on each; the bodies of requests
    /// under its proxy routes are streamed, not read first.
    pub(crate) fn start(listener: TcpListener, app: App, limits: ConnLimits) -> Server {
        let (stop, stopped) = watch::channel(false);
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        tracing::info!(
            max_connections = limits.max_connections,
            header_read_timeout = ?limits.header_read_timeout,
            idle_timeout = ?limits.idle_timeout,
            "HTTP server"
        );
        let accept = tokio::spawn(accept_loop(
            listener,
            Arc::new(app),
            limits,
            Arc::clone(&permits),
            stopped,
        ));
        Server {
            stop,
            permits,
            max_connections: limits.max_connections,
            accept,
        }
    }

    /// Stop accepting (the port closes) and ask every connection to close once its request
    /// in flight is answered, at once; the returned future completes when they all have.
    pub(crate) fn stop(self) -> impl std::future::Future<Output = ()> {
        let _ = self.stop.send(true);
        async move {
            let _ = self.accept.await;
            let all = u32::try_from(self.max_connections).unwrap_or(u32::MAX);
            let _ = self.permits.acquire_many(all).await;
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    app: Arc<App>,
    limits: ConnLimits,
    permits: Arc<Semaphore>,
    mut stopped: watch::Receiver<bool>,
) {
    let threads = start_http_threads(&app, limits, &stopped);
    let mut next = 0usize;
    let mut at_cap = false;
    loop {
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                at_cap = false;
                permit
            }
            Err(_) => {
                metrics::counter!("ratemesh_http_connection_cap_reached_total").increment(1);
                if !at_cap {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "connection cap reached: new connections wait until one closes \
                         (set [http] max_connections, or raise the open-file limit)"
                    );
                    at_cap = true;
                }
                tokio::select! {
                    permit = Arc::clone(&permits).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                    _ = stopped.changed() => return,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept error");
                    // Out of descriptors or memory: give the connections a moment to close.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        // In turn to the HTTP threads; here if there are none (or one is gone).
        let accepted = match stream.into_std() {
            Ok(stream) => Accepted {
                stream,
                peer,
                permit,
            },
            Err(error) => {
                tracing::warn!(%error, "taking a connection off the accept loop");
                continue;
            }
        };
        let unsent = match threads.get(next % threads.len().max(1)) {
            Some(thread) => thread.send(accepted).err().map(|returned| returned.0),
            None => Some(accepted),
        };
        next = next.wrapping_add(1);
        if let Some(accepted) = unsent {
            tokio::spawn(serve_accepted(
                accepted,
                Arc::clone(&app),
                limits,
                stopped.clone(),
            ));
        }
    }
}

/// A connection accepted, on its way to an HTTP thread.
struct Accepted {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    permit: tokio::sync::OwnedSemaphorePermit,
}

/// How many HTTP threads: `TOKIO_WORKER_THREADS`, else one per core.
fn http_thread_count() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|n| n.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .min(1024)
}

/// Start the HTTP threads: each runs a single-threaded runtime of its own (its own `epoll`,
/// timers and tasks) and serves the connections sent to it to their end, like one worker
/// process of nginx, so that no thread waits for another to be scheduled to learn that its
/// sockets are ready. Return where to send each its connections.
fn start_http_threads(
    app: &Arc<App>,
    limits: ConnLimits,
    stopped: &watch::Receiver<bool>,
) -> Vec<tokio::sync::mpsc::UnboundedSender<Accepted>> {
    let mut threads = Vec::new();
    for i in 0..http_thread_count() {
        let (send, mut received) = tokio::sync::mpsc::unbounded_channel::<Accepted>();
        // The thread's own app, whose counts only this thread writes.
        let (app, stopped) = (Arc::new(app.for_thread()), stopped.clone());
        let serve = async move {
            while let Some(accepted) = received.recv().await {
                tokio::spawn(serve_accepted(
                    accepted,
                    Arc::clone(&app),
                    limits,
                    stopped.clone(),
                ));
            }
            // The accept loop has stopped: serve the open connections until the process ends
            // (the node's drain waits for them).
            std::future::pending::<()>().await;
        };
        let started = std::thread::Builder::new()
            .name(format!("ratemesh-http-{i}"))
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(serve),
                    Err(error) => tracing::error!(%error, "starting an HTTP thread's runtime"),
                }
            });
        match started {
            Ok(_) => threads.push(send),
            Err(error) => tracing::error!(%error, "starting an HTTP thread"),
        }
    }
    threads
}

/// Serve one accepted connection on the current runtime.
async fn serve_accepted(
    accepted: Accepted,
    app: Arc<App>,
    limits: ConnLimits,
    stopped: watch::Receiver<bool>,
) {
    let Accepted {
        stream,
        peer,
        permit,
    } = accepted;
    let stream = match TcpStream::from_std(stream) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%error, %peer, "registering a connection");
            return;
        }
    };
    metrics::gauge!("ratemesh_http_connections").increment(1.0);
    serve_connection(stream, peer, app, limits, stopped).await;
    metrics::gauge!("ratemesh_http_connections").decrement(1.0);
    drop(permit);
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Arc<App>,
    limits: ConnLimits,
    mut stopped: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        stream,
        activity: Arc::clone(&activity),
    });
    let service_activity = Arc::clone(&activity);
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let in_flight = InFlight::begin(&service_activity);
        // Routed once, here: who answers, the proxy route, the policies.
        let route = app.route(&mut request, peer);
        // Under a proxy route the body streams (the route's limit); else it is read first.
        // A request whose body streams or that has none is answered now, whose policies may
        // decide it (and drop it) before the connection reads on; one with a body to read
        // first waits for it.
        let next = match app.streamed(&route) {
            Some(max) => {
                let body_in_flight = InFlight::begin(&service_activity);
                match streamed_body(request, max, body_in_flight) {
                    Ok(request) => Next::Answer(app.answer(route, request)),
                    Err(refusal) => Next::Refused(refusal),
                }
            }
            // No body: an empty one in its place (which allocates nothing).
            None if request.body().is_end_stream() => {
                Next::Answer(app.answer(route, request.map(|_| Body::empty())))
            }
            None => Next::Read(Box::new((request, route.kept())), Arc::clone(&app)),
        };
        async move {
            let response = match next {
                Next::Answer(answer) => answer.await,
                Next::Refused(refusal) => Ok(*refusal),
                Next::Read(read, app) => {
                    let (request, route) = *read;
                    match bounded_body(request, &limits).await {
                        Ok(request) => app.answer(route, request).await,
                        Err(refusal) => Ok(refusal),
                    }
                }
            };
            response.map(|response| {
                response.map(|body| Tracked {
                    body,
                    _in_flight: in_flight,
                })
            })
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .writev(false)
        .serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let mut draining = *stopped.borrow();
    if draining {
        connection.as_mut().graceful_shutdown();
    }
    // A second handle on the stop signal, to tell whether it changed without polling it.
    let probe = stopped.clone();
    loop {
        let wait = match activity.deadline(limits.header_read_timeout, limits.idle_timeout) {
            None => limits.header_read_timeout,
            Some((at, _)) => Duration::from_nanos(at.saturating_sub(activity.now())),
        };
        let event = {
            let changed = stopped.changed();
            let timer = tokio::time::sleep(wait);
            tokio::pin!(changed, timer);
            tokio::select! {
                biased;
                result = connection.as_mut() => ConnEvent::Ended(result),
                changed = Gated::new(changed.as_mut(), |_| probe.has_changed().unwrap_or(true)),
                    if !draining => ConnEvent::Stop(changed.is_err()),
                () = Gated::new(timer.as_mut(), |timer| timer.is_elapsed()) => ConnEvent::Timer,
            }
        };
        match event {
            ConnEvent::Ended(result) => {
                if let Err(error) = result {
                    tracing::debug!(%error, %peer, "connection ended");
                }
                return;
            }
            ConnEvent::Stop(closed) => {
                if closed || *stopped.borrow() {
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
            ConnEvent::Timer => {
                if let Some((at, reason)) =
                    activity.deadline(limits.header_read_timeout, limits.idle_timeout)
                    && activity.now() >= at
                {
                    metrics::counter!("ratemesh_http_connections_closed_total", "reason" => reason)
                        .increment(1);
                    tracing::debug!(%peer, reason, "closing the connection");
                    return;
                }
            }
        }
    }
}

/// What woke a connection's watch: its end, the node's stop signal (or the signal's sender
/// gone), or its timer.
enum ConnEvent<E> {
    Ended(Result<(), E>),
    Stop(bool),
    Timer,
}

/// What a request's service does next: await the app's answer, answer a refusal, or read
/// the body first.
enum Next {
    Answer(AppFuture),
    Refused(Box<Response<Body>>),
    /// The request and its route (boxed: they are large, the answer's future small), with
    /// the app that answers it then
    Read(Box<(Request<Incoming>, Route)>, Arc<App>),
}

/// Read the request's body, at most `max_body_bytes` of it and within the header time;
/// otherwise the answer (413, 408 or 400, JSON, `Connection: close`) that refuses it.
async fn bounded_body(
    request: Request<Incoming>,
    limits: &ConnLimits,
) -> Result<Request<Body>, Response<Body>> {
    let max = limits.max_body_bytes;
    if declared_length(&request).is_some_and(|length| length > max) {
        return Err(refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            max,
        ));
    }
    if request.body().is_end_stream() {
        return Ok(request.map(Body::new));
    }
    let (parts, body) = request.into_parts();
    let limited = Limited::new(body, usize::try_from(max).unwrap_or(usize::MAX));
    match tokio::time::timeout(limits.header_read_timeout, limited.collect()).await {
        Err(_) => Err(refusal(StatusCode::REQUEST_TIMEOUT, "body_timeout", max)),
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => Err(refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            max,
        )),
        Ok(Err(_)) => Err(refusal(StatusCode::BAD_REQUEST, "body_invalid", max)),
        Ok(Ok(collected)) => Ok(Request::from_parts(parts, Body::from(collected.to_bytes()))),
    }
}

/// A request under a proxy route, its body left to stream (at most `max` bytes, checked by
/// the proxy as it goes); a longer declared `Content-Length` is refused at once (413).
fn streamed_body(
    request: Request<Incoming>,
    max: Option<u64>,
    in_flight: InFlight,
) -> Result<Request<Body>, Box<Response<Body>>> {
    if let Some(max) = max
        && declared_length(&request).is_some_and(|length| length > max)
    {
        return Err(Box::new(refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            max,
        )));
    }
    Ok(request.map(|body| {
        Body::new(Tracked {
            body,
            _in_flight: in_flight,
        })
    }))
}

/// The request's `Content-Length`, when it has a valid one.
fn declared_length<B>(request: &Request<B>) -> Option<u64> {
    request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// A JSON refusal of a request's body; the connection closes after it.
fn refusal(status: StatusCode, reason: &'static str, max: u64) -> Response<Body> {
    metrics::counter!("ratemesh_requests_refused_total", "reason" => reason).increment(1);
    let message = match reason {
        "body_too_large" => format!("the request body is longer than {max} bytes"),
        "body_timeout" => "the request body did not arrive in time".to_string(),
        _ => "the request body could not be read".to_string(),
    };
    let body = serde_json::json!({
        "error": reason,
        "message": message,
        "max_bytes": max,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}
