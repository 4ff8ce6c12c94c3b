//! Forward-auth decisions: a gateway that asks an auth service about every request (Caddy
//! `forward_auth`, Traefik `forwardAuth`, Envoy `ext_authz` in HTTP mode) asks the node at
//! its `[forward_auth] path`. The node rewrites the check into the original request as it
//! routes it (`daemon::app`) and decides that once, with the same policies and counters as
//! its own gateway, and answers `200` with the `RateLimit` fields to admit it, or `429` with
//! `Retry-After`, the fields and the JSON body to deny it (the gateway passes that answer on
//! to its client).
//!
//! What is decided is read from the check:
//!
//! - the method from `X-Forwarded-Method`, else the check's own method;
//! - the path from `X-Forwarded-Uri` (origin or absolute form), else
//!   the rest of the check's own path after the endpoint (`/v1/check/api/x` → `/api/x`, as
//!   Envoy sends it), else the endpoint's path;
//! - the client as the policy file's `[identity]` says: API key and device headers as the
//!   gateway passed them on, the address from `X-Forwarded-For` (a `Forwarded` field is used
//!   only without one: Caddy and Traefik set the former and pass the latter on from the
//!   client untouched).
//!
//! All of this is believed only when the check's connection comes from one of the policy
//! file's `identity.trusted_proxies`. From any other peer the forwarding fields are ignored:
//! the check is decided as the peer's own request (its address, the check's method and
//! path), counted in `ratemesh_forward_auth_untrusted_total`, and logged at most once a
//! minute.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};

use crate::daemon::node_file::ForwardAuth;
use crate::daemon::proxy::headers::X_FORWARDED_FOR;
use crate::http::Responding;

/// `X-Forwarded-Method`.
pub(crate) const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
/// `X-Forwarded-Uri`.
pub(crate) const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

/// The longest `X-Forwarded-Uri` a check may carry.
pub(crate) const MAX_FORWARDED_URI_BYTES: usize = 8192;

/// At most one warning about untrusted peers this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Why a check from a trusted proxy could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CheckError {
    /// `X-Forwarded-Method` is not a method.
    #[error("X-Forwarded-Method is not an HTTP method")]
    Method,
    /// `X-Forwarded-Uri` is not a path (or URL).
    #[error("X-Forwarded-Uri is not a path starting with `/` or an absolute URL")]
    Uri,
    /// `X-Forwarded-Uri` is longer than [`MAX_FORWARDED_URI_BYTES`].
    #[error("X-Forwarded-Uri is {0} bytes; at most {MAX_FORWARDED_URI_BYTES}")]
    UriTooLong(usize),
}

impl CheckError {
    fn reason(&self) -> &'static str {
        match self {
            CheckError::Method => "invalid_forwarded_method",
            CheckError::Uri => "invalid_forwarded_uri",
            CheckError::UriTooLong(_) => "forwarded_uri_too_long",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            CheckError::UriTooLong(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// The method and path a check from a trusted proxy asks about; `None` for a part the
/// check does not carry (the check's own is kept).
pub(crate) fn forwarded_target(
    settings: &ForwardAuth,
    uri: &http::Uri,
    headers: &http::HeaderMap,
) -> Result<(Option<Method>, Option<PathAndQuery>), CheckError> {
    let forwarded_method = match headers.get(X_FORWARDED_METHOD) {
        None => None,
        Some(value) => {
            let text = value.as_bytes().trim_ascii();
            Some(Method::from_bytes(text).map_err(|_| CheckError::Method)?)
        }
    };
    let path = match headers.get(X_FORWARDED_URI) {
        Some(value) => {
            let bytes = value.as_bytes().trim_ascii();
            if bytes.len() > MAX_FORWARDED_URI_BYTES {
                return Err(CheckError::UriTooLong(bytes.len()));
            }
            let parsed = http::Uri::try_from(bytes).map_err(|_| CheckError::Uri)?;
            let path = parsed.path_and_query().ok_or(CheckError::Uri)?;
            if !path.path().starts_with('/') {
                return Err(CheckError::Uri);
            }
            Some(path.clone())
        }
        None => match settings.carried_path(uri.path_and_query().map_or("", |pq| pq.as_str())) {
            Some(rest) => Some(PathAndQuery::try_from(rest).map_err(|_| CheckError::Uri)?),
            None => None,
        },
    };
    Ok((forwarded_method, path))
}

/// The `[forward_auth]` endpoint: which paths are checks, what a check asks about, and how
/// its answers are counted.
#[derive(Clone)]
pub(crate) struct Checks(Arc<CheckShared>);

struct CheckShared {
    settings: ForwardAuth,
    start: Instant,
    /// When the last warning about an untrusted peer was logged (ns from `start`, 0: never).
    warned: AtomicU64,
}

impl Checks {
    /// Take checks at `settings.path`.
    pub(crate) fn new(settings: ForwardAuth) -> Self {
        for result in ["admitted", "denied", "refused"] {
            metrics::counter!("ratemesh_forward_auth_checks_total", "result" => result)
                .increment(0);
        }
        metrics::counter!("ratemesh_forward_auth_untrusted_total").increment(0);
        tracing::info!(path = %settings.path, "forward-auth endpoint");
        Checks(Arc::new(CheckShared {
            settings,
            start: Instant::now(),
            warned: AtomicU64::new(0),
        }))
    }

    /// Tell whether `path` is a check.
    pub(crate) fn takes(&self, path: &str) -> bool {
        self.0.settings.matches(path)
    }

    /// Rewrite a check from `peer` into the request it asks about, when `trusted` (the peer
    /// is a trusted proxy); or say why its forwarding fields cannot be read.
    pub(crate) fn target<B>(
        &self,
        request: &mut Request<B>,
        peer: SocketAddr,
        trusted: bool,
    ) -> Result<(), CheckError> {
        if !trusted {
            self.untrusted(peer, request.headers());
            return Ok(());
        }
        let (method, path) = forwarded_target(&self.0.settings, request.uri(), request.headers())?;
        if let Some(method) = method {
            *request.method_mut() = method;
        }
        if let Some(path) = path {
            *request.uri_mut() = http::Uri::from(path);
        }
        // The gateways set X-Forwarded-For from what they saw and pass on whatever
        // `Forwarded` the client wrote: with the former, the latter names no one.
        let headers = request.headers_mut();
        if headers.contains_key(X_FORWARDED_FOR) {
            headers.remove(http::header::FORWARDED);
        }
        Ok(())
    }

    fn untrusted(&self, peer: SocketAddr, headers: &http::HeaderMap) {
        metrics::counter!("ratemesh_forward_auth_untrusted_total").increment(1);
        let forwarded = headers.contains_key(X_FORWARDED_URI)
            || headers.contains_key(X_FORWARDED_METHOD)
            || headers.contains_key(X_FORWARDED_FOR)
            || headers.contains_key(http::header::FORWARDED);
        let shared = &self.0;
        let now = u64::try_from(shared.start.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        let last = shared.warned.load(Ordering::Relaxed);
        let every = u64::try_from(WARN_EVERY.as_nanos()).unwrap_or(u64::MAX);
        if (last == 0 || now.saturating_sub(last) >= every)
            && shared
                .warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                peer = ?peer,
                forwarded,
                "forward-auth check from a peer not in identity.trusted_proxies: its \
                 X-Forwarded-* fields are ignored and the check is decided as the peer's own \
                 request (add the gateway's address to trusted_proxies; logged once a minute)"
            );
        }
    }

    /// The answer to a check whose forwarding fields cannot be read, counted.
    pub(crate) fn refuse(error: &CheckError) -> Response<Body> {
        let refused = refusal(error);
        count(refused.status());
        refused
    }

    /// The answer to a check the policies decided (`decided`), counted when it comes.
    pub(crate) fn answer(decided: Responding<Infallible>) -> Responding<Infallible> {
        Box::pin(async move {
            let response = decided.await?;
            count(response.status());
            Ok(response)
        })
    }
}

/// What a check the policies admitted is answered: `200` with no body (the `RateLimit`
/// fields are added as for any admitted request).
pub(crate) fn admitted() -> std::future::Ready<Result<Response<Body>, Infallible>> {
    std::future::ready(Ok(Response::new(Body::empty())))
}

/// 400 (or 431) with a JSON body: a trusted proxy sent forwarding fields that do not parse.
fn refusal(error: &CheckError) -> Response<Body> {
    let body = serde_json::json!({
        "error": error.reason(),
        "message": error.to_string(),
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = error.status();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn count(status: StatusCode) {
    let result = match status.as_u16() {
        200..=299 => "admitted",
        429 => "denied",
        _ => "refused",
    };
    metrics::counter!("ratemesh_forward_auth_checks_total", "result" => result).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        pairs: &[(&str, &str)],
        path: &str,
    ) -> Result<(Option<Method>, Option<String>), CheckError> {
        let settings = ForwardAuth {
            path: "/v1/check".to_string(),
        };
        let mut headers = http::HeaderMap::new();
        for (k, v) in pairs {
            headers.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v.as_bytes()).unwrap(),
            );
        }
        let uri: http::Uri = path.parse().unwrap();
        forwarded_target(&settings, &uri, &headers)
            .map(|(m, p)| (m, p.map(|p| p.as_str().to_string())))
    }

    #[test]
    fn the_original_method_and_path_come_from_the_forwarded_fields() {
        let (method, path) = check(
            &[
                ("x-forwarded-method", "POST"),
                ("x-forwarded-uri", "/api/orders?id=7"),
            ],
            "/v1/check",
        )
        .unwrap();
        assert_eq!(method, Some(Method::POST));
        assert_eq!(path.as_deref(), Some("/api/orders?id=7"));
        let (_, path) = check(
            &[("x-forwarded-uri", "https://shop.example/api/x")],
            "/v1/check",
        )
        .unwrap();
        assert_eq!(path.as_deref(), Some("/api/x"));
        // Envoy: the original path after the endpoint's, the method the check's own.
        let (method, path) = check(&[], "/v1/check/api/orders?x=1").unwrap();
        assert_eq!((method, path.as_deref()), (None, Some("/api/orders?x=1")));
        assert_eq!(check(&[], "/v1/check").unwrap(), (None, None));
    }

    #[test]
    fn garbage_in_the_forwarded_fields_is_a_typed_error() {
        assert_eq!(
            check(&[("x-forwarded-method", "GE T")], "/v1/check"),
            Err(CheckError::Method)
        );
        for bad in ["*", "api/x", "http://", "/a b"] {
            assert!(
                check(&[("x-forwarded-uri", bad)], "/v1/check").is_err(),
                "{bad}"
            );
        }
        let long = format!("/{}", "a".repeat(MAX_FORWARDED_URI_BYTES));
        assert_eq!(
            check(&[("x-forwarded-uri", &long)], "/v1/check"),
            Err(CheckError::UriTooLong(MAX_FORWARDED_URI_BYTES + 1))
        );
    }
}
