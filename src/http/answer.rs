//! What the layer answers of its own: a denial (429 with `Retry-After`, the `RateLimit`
//! fields and a JSON body, or the caller's [`DenialHook`]), 503 when a `redis` policy that
//! fails closed could not be decided, 400, 403 and 431 for requests refused before any
//! counting; and the `RateLimit` fields added to the inner service's answer.

use std::sync::Arc;

use axum::body::{Body, Bytes, HttpBody};
use http::{HeaderValue, Response, StatusCode};

use crate::http::headers::{denial_body, insert_rate_limit_headers, unavailable_body};
use crate::http::identity::IdentityTooLong;
use crate::rules::{GraphQlRefusal, Outcome, Refusal};

/// Shape the response to a denied request (the default is 429 with a JSON body).
pub type DenialHook = Arc<dyn Fn(&Outcome) -> Response<Body> + Send + Sync>;

/// The answer to a request `outcome` does not admit: refused before counting, the backend
/// unavailable, or denied (by `hook` when given); `legacy`: add the `X-RateLimit-*` fields.
pub(super) fn denial(outcome: &Outcome, hook: Option<&DenialHook>, legacy: bool) -> Response<Body> {
    if let Some(refusal) = outcome.refused {
        return refused(refusal);
    }
    let mut response = match hook {
        _ if outcome.backend_unavailable.is_some() => {
            let mut response = Response::new(Body::from(unavailable_body(outcome)));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
        Some(hook) => hook(outcome),
        None => {
            let mut response = Response::new(Body::from(denial_body(outcome)));
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            // Its type, `RateLimit-Policy`, `RateLimit` and `Retry-After`: one allocation.
            response.headers_mut().reserve(4);
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
    };
    if hook.is_none() {
        // The default answer has none of these fields yet.
        insert_rate_limit_headers(response.headers_mut(), outcome, legacy);
        return response;
    }
    // A hook's own fields win.
    let mut fields = http::HeaderMap::new();
    insert_rate_limit_headers(&mut fields, outcome, legacy);
    for (name, value) in fields {
        if let Some(name) = name
            && !response.headers().contains_key(&name)
        {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// The answer to a request refused before any counting: 400 for a missing part of a
/// policy's key, a body that did not arrive whole or a GraphQL query the route refuses, 403 for an address in `[access] deny`,
/// 413 for a body too long to read a field of; a JSON body that says which.
fn refused(refusal: Refusal) -> Response<Body> {
    let (status, body) = match refusal {
        Refusal::Missing(missing) => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({
                "error": "missing_part",
                "message": format!(
                    "the request has no `{}`, which policy `{}` counts by",
                    missing.part, missing.policy
                ),
                "policy": missing.policy,
                "part": missing.part,
            }),
        ),
        Refusal::Denied => (
            StatusCode::FORBIDDEN,
            serde_json::json!({
                "error": "forbidden",
                "message": "requests from this address are refused",
            }),
        ),
        Refusal::BodyIncomplete => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({
                "error": "body_incomplete",
                "message": "a policy counts by a field of the body, which did not arrive whole",
            }),
        ),
        Refusal::GraphQl(GraphQlRefusal::TooCostly { cost, max_cost }) => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({
                "error": "query_too_costly",
                "message": format!("the query costs {cost}, more than this route's {max_cost}"),
                "cost": cost,
                "max_cost": max_cost,
            }),
        ),
        Refusal::GraphQl(GraphQlRefusal::TooDeep { depth, max_depth }) => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({
                "error": "query_too_deep",
                "message": format!("the query nests {depth} fields deep, more than this route's {max_depth}"),
                "depth": depth,
                "max_depth": max_depth,
            }),
        ),
        Refusal::GraphQl(GraphQlRefusal::Invalid(reason)) => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({
                "error": "graphql_invalid",
                "message": reason,
            }),
        ),
        Refusal::BodyTooLarge { limit } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            serde_json::json!({
                "error": "body_too_large",
                "message": format!(
                    "a policy counts by a field of the body, which is read up to {limit} bytes"
                ),
                "max_bytes": limit,
            }),
        ),
    };
    json(status, &body)
}

/// 431 with a JSON body: the identity header is longer than the cap.
pub(super) fn identity_too_long(error: &IdentityTooLong) -> Response<Body> {
    metrics::counter!("ratemesh_requests_refused_total", "reason" => "identity_too_long")
        .increment(1);
    let body = serde_json::json!({
        "error": "identity_too_long",
        "message": error.to_string(),
        "source": error.origin.name(),
        "bytes": error.len,
        "max_bytes": error.max,
    });
    json(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, &body)
}

/// `body` as a JSON answer with `status`.
fn json(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `response` with the `RateLimit` fields of `outcome`.
pub(super) fn with_fields<B>(
    response: Response<B>,
    outcome: &Outcome,
    legacy: bool,
) -> Response<Body>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let mut response = response.map(Body::new);
    insert_rate_limit_headers(response.headers_mut(), outcome, legacy);
    response
}
