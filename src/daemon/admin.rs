//! The `[admin]` port: calls an operator or an application makes to the node, each with a
//! bearer token of the node file's token file (compared in constant time; a missing or
//! unknown token is `401`), each logged with the caller's name. Today it answers the
//! decision API:
//!
//! - `POST /v1/decide` with `{"requests": [{"policy": "…", "attributes": {…}, "cost": 1}]}`
//!   (at most 1,000 requests, 1 MiB): each decided on the policy file's rules as a request
//!   carrying those attributes would be (the same counters), in order, and answered
//!   `{"responses": [{"allowed": true, "limit": …, "remaining": …, "reset_after_ms": …,
//!   "retry_after_ms": …}, …]}`, or `{"error": …, "message": …}` for a request that cannot be
//!   decided (unknown policy or route, a bad attribute, a part the policy counts by missing,
//!   Redis unavailable under `fail_mode = "closed"`).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use tokio::sync::oneshot;

use crate::daemon::DaemonError;
use crate::daemon::node_file::Admin;
use crate::http::RateLimitLayer;
use crate::rules::{Attributes, DirectError};

/// The most requests one decision call may carry.
const MAX_BATCH: usize = 1000;

/// The largest body of a call.
const MAX_BODY_BYTES: usize = 1 << 20;

/// A running admin port.
pub(crate) struct AdminServer {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// Bind the `[admin]` port.
pub(crate) async fn bind(settings: &Admin) -> Result<tokio::net::TcpListener, DaemonError> {
    tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| DaemonError::Listen {
            what: "the admin port",
            addr: settings.listen,
            source,
        })
}

struct AdminState {
    layer: RateLimitLayer,
    tokens: Vec<(String, String)>,
}

impl AdminServer {
    /// Serve the admin port on `listener` with `layer`'s rules and counters.
    pub(crate) fn start(
        listener: tokio::net::TcpListener,
        settings: &Admin,
        layer: RateLimitLayer,
    ) -> AdminServer {
        let state = Arc::new(AdminState {
            layer,
            tokens: settings.tokens.clone(),
        });
        let router = Router::new()
            .route("/v1/decide", post(decide))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(state);
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                tracing::error!(%error, "the admin port stopped");
            }
        });
        tracing::info!(%addr, "admin port (decision API)");
        AdminServer { stop, task }
    }

    /// Stop accepting; the returned future completes when the calls in flight are answered.
    pub(crate) fn stop(self) -> impl std::future::Future<Output = ()> {
        let _ = self.stop.send(());
        async move {
            let _ = self.task.await;
        }
    }
}

/// The caller a bearer token names, compared in constant time against every token.
fn caller<'s>(state: &'s AdminState, headers: &HeaderMap) -> Option<&'s str> {
    let given = headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?
        .trim()
        .as_bytes();
    let mut found = None;
    for (name, token) in &state.tokens {
        if constant_time_eq(given, token.as_bytes()) {
            found = Some(name.as_str());
        }
    }
    found
}

/// Compare without stopping at the first difference (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideCall {
    requests: Vec<DecideRequest>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideRequest {
    policy: String,
    #[serde(default)]
    attributes: Attributes,
    #[serde(default = "one")]
    cost: u64,
}

fn one() -> u64 {
    1
}

fn json(status: StatusCode, body: serde_json::Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

async fn decide(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(who) = caller(&state, &headers) else {
        tracing::warn!(target: "ratemesh::admin", path = "/v1/decide", "refused: no known bearer token");
        metrics::counter!("ratemesh_admin_calls_total", "call" => "decide", "result" => "unauthorized").increment(1);
        let mut response = json(
            StatusCode::UNAUTHORIZED,
            serde_json::json!({"error": "unauthorized", "message": "give a bearer token of the node's admin token file"}),
        );
        response.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
        return response;
    };
    let call: DecideCall = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(error) => {
            tracing::info!(target: "ratemesh::admin", who, path = "/v1/decide", %error, "bad request");
            metrics::counter!("ratemesh_admin_calls_total", "call" => "decide", "result" => "bad_request").increment(1);
            return json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "bad_request", "message": error.to_string()}),
            );
        }
    };
    if call.requests.len() > MAX_BATCH {
        metrics::counter!("ratemesh_admin_calls_total", "call" => "decide", "result" => "bad_request").increment(1);
        return json(
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": "bad_request", "message": format!("at most {MAX_BATCH} requests in one call")}),
        );
    }
    let rules = state.layer.rules();
    let mut responses = Vec::with_capacity(call.requests.len());
    for request in &call.requests {
        let now = state.layer.now_ns();
        let answer = match rules
            .decide_direct(&request.policy, &request.attributes, request.cost, now)
            .await
        {
            Ok(d) => serde_json::json!({
                "allowed": d.is_allowed(),
                "limit": d.limit,
                "remaining": d.remaining,
                "reset_after_ms": d.reset_after_ns.div_ceil(1_000_000),
                "retry_after_ms": d.retry_after_ns.div_ceil(1_000_000),
            }),
            Err(error) => {
                let kind = match &error {
                    DirectError::UnknownPolicy(_) => "unknown_policy",
                    DirectError::UnknownRoute(_) => "unknown_route",
                    DirectError::BadAttribute(..) => "bad_attribute",
                    DirectError::Missing { .. } => "missing_part",
                    DirectError::Unavailable(_) => "unavailable",
                };
                serde_json::json!({"error": kind, "message": error.to_string()})
            }
        };
        responses.push(answer);
    }
    tracing::info!(target: "ratemesh::admin", who, path = "/v1/decide", requests = call.requests.len(), "answered");
    metrics::counter!("ratemesh_admin_calls_total", "call" => "decide", "result" => "ok")
        .increment(1);
    json(
        StatusCode::OK,
        serde_json::json!({ "responses": responses }),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
