//! The reverse proxy: a request the policies admitted, under a `[[proxy]]` route's prefix, is
//! sent on to the route's upstream (HTTP/1.1, or HTTP/2 with prior knowledge) through a pool
//! of kept-alive connections, and the upstream's answer comes back with the `RateLimit`
//! fields added by the step that admitted it (`http::gate`). Where a request goes was found
//! when the node routed it ([`Hop`]): nothing here matches it again. Bodies stream both
//! ways, piece by piece ([`body::Relay`]); hop-by-hop fields are dropped and the forwarding
//! fields appended ([`headers`]).
//!
//! When the upstream fails the client gets a JSON answer: 502 when the connection is refused
//! or reset, 504 when the upstream does not answer within the route's `timeout` (or does not
//! accept the connection within `connect_timeout`). The request was counted once, when it was
//! admitted; nothing is retried and nothing counted again. Requests under no route are
//! answered `200 ok` by the node itself.

pub(crate) mod body;
mod h1;
pub(crate) mod headers;
mod pool;

#[cfg(feature = "fuzzing")]
pub(crate) use h1::fuzz_head;

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Request, Response, StatusCode, Version};
use tokio::time::Instant;

use crate::daemon::node_file::ProxyRoute;
use body::{BodyError, Progress, Relay};
use pool::{Answer, Pool};

/// How long after a client's pause is due the wait for the upstream still waits for the
/// request body's own timer to report it (then the upstream is blamed).
const CLIENT_PAUSE_GRACE: Duration = Duration::from_secs(1);
/// At most one warning per upstream this often; the others go to the debug log.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The labels of `ratemesh_proxy_errors_total`.
const ERROR_REASONS: [&str; 11] = [
    "upstream_refused",
    "upstream_unreachable",
    "upstream_connect_timeout",
    "upstream_timeout",
    "upstream_reset",
    "upstream_malformed",
    "request_body_too_large",
    "request_body_stalled",
    "request_body_aborted",
    "response_stalled",
    "response_aborted",
];

/// One route and its connection pool.
struct Upstream {
    route: ProxyRoute,
    pool: Arc<Pool>,
    /// When a failure was last logged as a warning (nanoseconds from the proxy's start).
    warned: AtomicU64,
}

/// The node's proxy routes, longest prefix first.
pub(crate) struct Proxy {
    upstreams: Vec<Upstream>,
    start: Instant,
}

impl Proxy {
    /// Build the routes' connection pools (no connection is opened yet).
    pub(crate) fn new(routes: &[ProxyRoute]) -> Proxy {
        let mut upstreams: Vec<Upstream> = routes
            .iter()
            .map(|route| Upstream {
                pool: Pool::new(route),
                route: route.clone(),
                warned: AtomicU64::new(0),
            })
            .collect();
        upstreams.sort_by_key(|u| std::cmp::Reverse(u.route.path_prefix.len()));
        if !upstreams.is_empty() {
            for reason in ERROR_REASONS {
                metrics::counter!("ratemesh_proxy_errors_total", "reason" => reason).increment(0);
            }
        }
        for upstream in &upstreams {
            tracing::info!(
                path_prefix = %display_prefix(&upstream.route.path_prefix),
                upstream = %upstream.route.upstream.authority().map_or("", |a| a.as_str()),
                http2 = upstream.route.http2,
                "proxy route"
            );
        }
        Proxy {
            upstreams,
            start: Instant::now(),
        }
    }

    /// The route whose prefix is the longest one `path` is under: its place among the
    /// routes (as [`Hop::upstream`] names it).
    pub(crate) fn upstream_of(&self, path: &str) -> Option<usize> {
        self.upstreams.iter().position(|u| u.route.matches(path))
    }

    /// The body limit of the route at `upstream` (`None`: no limit).
    pub(crate) fn max_body_bytes(&self, upstream: usize) -> Option<u64> {
        self.upstreams[upstream].route.max_body_bytes
    }

    /// `request` (admitted) as it goes to `upstream`, with the progress of its body if it
    /// has one, or the failure to answer. `peer` is the client connection's address;
    /// `trusted`: it is a trusted proxy, whose forwarding fields are kept.
    ///
    /// Not `async`: what the future that sends it holds is only the request made here.
    fn prepare(
        upstream: &Upstream,
        request: Request<Body>,
        peer: Option<IpAddr>,
        trusted: bool,
    ) -> Result<Prepared, Failure> {
        let route = &upstream.route;
        let (mut parts, body) = request.into_parts();
        let mut uri = http::uri::Parts::default();
        uri.scheme = route.upstream.scheme().cloned();
        uri.authority = route.upstream.authority().cloned();
        uri.path_and_query = parts
            .uri
            .path_and_query()
            .cloned()
            .or_else(|| Some(http::uri::PathAndQuery::from_static("/")));
        parts.uri = http::Uri::from_parts(uri).map_err(|_| Failure::Reset)?;
        parts.version = if route.http2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let trailers = headers::strip_hop_by_hop(&mut parts.headers);
        if trailers && route.http2 {
            parts
                .headers
                .insert(http::header::TE, HeaderValue::from_static("trailers"));
        }
        headers::add_forwarded(&mut parts.headers, peer, trusted, route.forwarded);
        parts.extensions = http::Extensions::new();

        let progress = (!hyper::body::Body::is_end_stream(&body)).then(Progress::new);
        let body = Relay::request(body, route.max_body_bytes, route.timeout, progress.clone());
        Ok(Prepared {
            request: Request::from_parts(parts, body),
            progress,
        })
    }

    /// Send the prepared request to `upstream` and return its answer, or the JSON answer to
    /// its failure.
    async fn forward(&self, upstream: &Upstream, prepared: Prepared) -> Response<Body> {
        let Prepared { request, progress } = prepared;
        let sent = self.send(upstream, request, progress.as_deref()).await;
        self.answer(upstream, sent)
    }

    /// The client's answer: the upstream's (its body relayed), or the JSON one to `failed`.
    fn answer(
        &self,
        upstream: &Upstream,
        sent: Result<Response<Answer>, Failure>,
    ) -> Response<Body> {
        let route = &upstream.route;
        match sent {
            Ok(response) => {
                let (mut parts, answer) = response.into_parts();
                // An HTTP/1.1 answer's head comes without its hop-by-hop fields (`h1`).
                if matches!(answer, Answer::H2(_)) {
                    headers::strip_hop_by_hop(&mut parts.headers);
                }
                parts.version = Version::HTTP_11;
                let body = match answer {
                    Answer::Whole(body) if body.is_empty() => Body::empty(),
                    Answer::Whole(body) => Body::from(body),
                    Answer::H1(body) => Body::new(Relay::response(body, route.timeout)),
                    Answer::H2(mut body) => {
                        if body.is_done() {
                            Body::empty()
                        } else {
                            Body::new(Relay::response(body, route.timeout))
                        }
                    }
                };
                Response::from_parts(parts, body)
            }
            Err(failed) => self.failed(upstream, failed),
        }
    }

    /// The JSON answer to `failed`, counted and logged.
    fn failed(&self, upstream: &Upstream, failed: Failure) -> Response<Body> {
        metrics::counter!("ratemesh_proxy_errors_total", "reason" => failed.reason()).increment(1);
        self.log(upstream, &failed);
        failure(failed, &upstream.route)
    }

    /// Send and wait for the response head: at most `timeout` after the last piece of the
    /// request body went by (or after the start, without a body).
    async fn send(
        &self,
        upstream: &Upstream,
        request: Request<Relay<Body>>,
        progress: Option<&Progress>,
    ) -> Result<Response<Answer>, Failure> {
        let timeout = upstream.route.timeout;
        let start = Instant::now();
        let due = || match progress {
            None => start + timeout,
            Some(p) if p.waiting_on_client() => p.last() + timeout + CLIENT_PAUSE_GRACE,
            Some(p) => p.last() + timeout,
        };
        let mut call = pin!(upstream.pool.send(request));
        let mut sleep = pin!(tokio::time::sleep_until(due()));
        // The timer is polled (which registers it) once, then only when it has fired.
        let mut armed = false;
        std::future::poll_fn(|cx| {
            loop {
                if let Poll::Ready(result) = call.as_mut().poll(cx) {
                    return Poll::Ready(result);
                }
                if armed && !sleep.is_elapsed() {
                    return Poll::Pending;
                }
                if sleep.as_mut().poll(cx).is_pending() {
                    armed = true;
                    return Poll::Pending;
                }
                if Instant::now() >= due() {
                    return Poll::Ready(Err(Failure::Timeout(timeout)));
                }
                sleep.as_mut().reset(due());
                armed = false;
            }
        })
        .await
    }

    fn log(&self, upstream: &Upstream, failed: &Failure) {
        let now = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let last = upstream.warned.load(Ordering::Relaxed);
        let every = u64::try_from(WARN_EVERY.as_nanos()).unwrap_or(u64::MAX);
        let route = display_prefix(&upstream.route.path_prefix);
        let addr = upstream
            .route
            .upstream
            .authority()
            .map_or("", |a| a.as_str());
        if (last == 0 || now.saturating_sub(last) >= every)
            && upstream
                .warned
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(path_prefix = %route, upstream = %addr, reason = failed.reason(), "proxy: {failed} (further failures of this route within 10 s are logged at debug level)");
        } else {
            tracing::debug!(path_prefix = %route, upstream = %addr, reason = failed.reason(), "proxy: {failed}");
        }
    }
}

fn display_prefix(prefix: &str) -> &str {
    if prefix.is_empty() { "/" } else { prefix }
}

/// Why a request got no answer from its upstream.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("the upstream refused the connection")]
    Refused,
    #[error("the upstream could not be reached")]
    Unreachable,
    #[error("the upstream did not accept the connection in time")]
    ConnectTimeout,
    #[error("the upstream did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the upstream closed or reset the connection before answering")]
    Reset,
    #[error("the upstream's answer is not valid HTTP")]
    Malformed,
    #[error("the request body is longer than {0} bytes")]
    TooLarge(u64),
    #[error("the request body paused for longer than the route's timeout")]
    ClientStalled,
    #[error("the request body could not be read from the client")]
    ClientAborted,
}

impl Failure {
    fn reason(&self) -> &'static str {
        match self {
            Failure::Refused => "upstream_refused",
            Failure::Unreachable => "upstream_unreachable",
            Failure::ConnectTimeout => "upstream_connect_timeout",
            Failure::Timeout(_) => "upstream_timeout",
            Failure::Reset => "upstream_reset",
            Failure::Malformed => "upstream_malformed",
            Failure::TooLarge(_) => "request_body_too_large",
            Failure::ClientStalled => "request_body_stalled",
            Failure::ClientAborted => "request_body_aborted",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Failure::Refused | Failure::Unreachable | Failure::Reset | Failure::Malformed => {
                StatusCode::BAD_GATEWAY
            }
            Failure::ConnectTimeout | Failure::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Failure::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Failure::ClientStalled => StatusCode::REQUEST_TIMEOUT,
            Failure::ClientAborted => StatusCode::BAD_REQUEST,
        }
    }

    /// The client's request body was not read to its end: close the connection after.
    fn closes(&self) -> bool {
        matches!(
            self,
            Failure::TooLarge(_) | Failure::ClientStalled | Failure::ClientAborted
        )
    }
}

/// What a failed exchange with the upstream was, from the error's chain.
fn classify(error: hyper::Error) -> Failure {
    if error.is_parse() || error.is_parse_too_large() || error.is_parse_status() {
        return Failure::Malformed;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(cause) = source {
        if let Some(body) = cause.downcast_ref::<BodyError>() {
            return match body {
                BodyError::TooLarge { max } => Failure::TooLarge(*max),
                BodyError::Stalled { .. } => Failure::ClientStalled,
                BodyError::Read(_) => Failure::ClientAborted,
            };
        }
        source = cause.source();
    }
    Failure::Reset
}

/// The JSON answer to a failure: `{"error":"upstream_timeout","message":"…"}`.
fn failure(failed: Failure, route: &ProxyRoute) -> Response<Body> {
    let body = serde_json::json!({
        "error": failed.reason(),
        "message": failed.to_string(),
        "route": display_prefix(&route.path_prefix),
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = failed.status();
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if failed.closes() {
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Where an admitted request goes, as the node routed it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hop {
    /// The `[[proxy]]` route its path is under ([`Proxy::upstream_of`]); none: the node
    /// answers `200 ok` itself.
    pub(crate) upstream: Option<usize>,
    /// The client connection's address.
    pub(crate) peer: IpAddr,
    /// That address is one of the trusted proxies, whose forwarding fields are kept.
    pub(crate) trusted: bool,
}

/// What serves a request the policies admitted: its route's upstream, or `200 ok` when no
/// route takes its path.
///
/// Cloned for every request, and so one handle per HTTP thread ([`Gateway::for_thread`]):
/// the count a clone writes is then that thread's alone, not a cache line every thread
/// takes in turn.
#[derive(Clone)]
pub(crate) struct Gateway(Arc<GatewayParts>);

struct GatewayParts {
    proxy: Arc<Proxy>,
}

impl Gateway {
    /// Serve admitted requests with `proxy`.
    pub(crate) fn new(proxy: Arc<Proxy>) -> Gateway {
        Gateway(Arc::new(GatewayParts { proxy }))
    }

    /// The same gateway, through a handle of one thread's own.
    pub(crate) fn for_thread(&self) -> Gateway {
        Gateway::new(Arc::clone(&self.0.proxy))
    }

    /// The proxy routes, to route a request by.
    pub(crate) fn proxy(&self) -> &Proxy {
        &self.0.proxy
    }

    /// Send an admitted `request` on as `hop` says: to its upstream, or answered `200 ok`.
    pub(crate) fn forward(self, request: Request<Body>, hop: Hop) -> GatewayFuture {
        let Some(index) = hop.upstream else {
            return GatewayFuture::Answered(std::future::ready(Ok(admitted())));
        };
        let upstream = &self.proxy().upstreams[index];
        let prepared = match Proxy::prepare(upstream, request, Some(hop.peer), hop.trusted) {
            Ok(prepared) => prepared,
            Err(failed) => {
                let answer = self.proxy().failed(upstream, failed);
                return GatewayFuture::Answered(std::future::ready(Ok(answer)));
            }
        };
        GatewayFuture::Forwarded(Box::pin(async move {
            let proxy = self.proxy();
            Ok(proxy.forward(&proxy.upstreams[index], prepared).await)
        }))
    }
}

/// A request made ready for its upstream, and the progress of its body (when it has one).
struct Prepared {
    request: Request<Relay<Body>>,
    progress: Option<Arc<Progress>>,
}

/// The answer of [`Gateway::forward`]: ready at once (no proxy route), or the upstream's.
pub(crate) enum GatewayFuture {
    /// Answered by the node itself.
    Answered(std::future::Ready<Result<Response<Body>, Infallible>>),
    /// Forwarded to an upstream.
    Forwarded(Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>),
}

impl Future for GatewayFuture {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            GatewayFuture::Answered(ready) => Pin::new(ready).poll(cx),
            GatewayFuture::Forwarded(forwarded) => forwarded.as_mut().poll(cx),
        }
    }
}

/// The answer to an admitted request under no proxy route.
fn admitted() -> Response<Body> {
    let mut response = Response::new(Body::from("ok\n"));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
