//! `GET /v1/keys` and `POST /v1/keys/reset`: a key named by a policy and the attributes a
//! request would carry (the query's parameters, `policy=…&api_key=…`, or a JSON body
//! `{"policy": …, "attributes": {…}}`), hashed as requests are. Its state across the
//! cluster (a mesh key from its owner; a local one from every live node; a `redis` one from
//! Redis), or a reset of it (the mesh key through its owner; the local one on every live
//! node; in Redis), counted and logged with who asked.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AdminState, Credentials, authenticate, json as answer};
use crate::daemon::questions::{ASK_LOCAL_KEY, ASK_TIMEOUT, LocalKeyAnswer, LocalKeyAsk};
use crate::rules::{Attributes, Backend, DirectError, KeyAddress};

/// A key as a call names it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyCall {
    pub(super) policy: String,
    #[serde(default)]
    pub(super) attributes: Attributes,
}

/// Read the call's key: the JSON body if there is one, else the query.
pub(super) fn key_call(query: Option<&str>, body: &[u8]) -> Result<KeyCall, String> {
    if !body.is_empty() {
        return serde_json::from_slice(body).map_err(|e| e.to_string());
    }
    let mut policy = None;
    let mut attributes = Attributes::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if name == "policy" {
            policy = Some(value.into_owned());
        } else {
            attributes.insert(name.into_owned(), Value::String(value.into_owned()));
        }
    }
    Ok(KeyCall {
        policy: policy.ok_or("name the key's policy: policy=NAME")?,
        attributes,
    })
}

pub(super) fn error(status: StatusCode, kind: &str, message: impl std::fmt::Display) -> Response {
    answer(
        status,
        json!({"error": kind, "message": message.to_string()}),
    )
}

pub(super) fn direct_error(e: &DirectError) -> Response {
    let (status, kind) = match e {
        DirectError::UnknownPolicy(_) => (StatusCode::NOT_FOUND, "unknown_policy"),
        DirectError::UnknownRoute(_) => (StatusCode::NOT_FOUND, "unknown_route"),
        DirectError::BadAttribute(..) => (StatusCode::BAD_REQUEST, "bad_attribute"),
        DirectError::Missing { .. } => (StatusCode::BAD_REQUEST, "missing_part"),
        DirectError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        DirectError::HeldByResponses(_) => (StatusCode::BAD_REQUEST, "held_by_responses"),
    };
    error(status, kind, e)
}

/// `GET /v1/keys`.
pub(super) async fn get(
    State(state): State<Arc<AdminState>>,
    credentials: Credentials,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    call(&state, &credentials, query.as_deref(), &body, false).await
}

/// `POST /v1/keys/reset`.
pub(super) async fn reset(
    State(state): State<Arc<AdminState>>,
    credentials: Credentials,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    call(&state, &credentials, query.as_deref(), &body, true).await
}

async fn call(
    state: &AdminState,
    credentials: &Credentials,
    query: Option<&str>,
    body: &[u8],
    reset: bool,
) -> Response {
    let name = if reset { "keys.reset" } else { "keys.get" };
    let who = match authenticate(state, credentials, name) {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let result = |r: &'static str| {
        metrics::counter!("ratemesh_admin_calls_total", "call" => name, "result" => r).increment(1);
    };
    let call = match key_call(query, body) {
        Ok(call) => call,
        Err(message) => {
            result("bad_request");
            return error(StatusCode::BAD_REQUEST, "bad_request", message);
        }
    };
    let rules = state.layer.rules();
    let address = match rules.key_address(&call.policy, &call.attributes) {
        Ok(address) => address,
        Err(e) => {
            result("bad_request");
            return direct_error(&e);
        }
    };
    let key = format!("{:016x}", address.key);
    let (status, mut out) = match address.backend {
        Backend::Mesh(number) => mesh_key(state, &address, number, reset).await,
        Backend::Local => local_key(state, &address, reset).await,
        Backend::Exact(_) => {
            if reset {
                match rules.exact_reset(&address).await {
                    Ok(_) => {}
                    Err(e) => {
                        result("unavailable");
                        return error(StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable", e);
                    }
                }
            }
            match rules.exact_key(&address).await {
                Ok(d) => (
                    StatusCode::OK,
                    json!({
                        "limit": d.limit,
                        "remaining": d.remaining,
                        "reset_after_ms": d.reset_after_ns.div_ceil(1_000_000),
                        "retry_after_ms": d.retry_after_ns.div_ceil(1_000_000),
                    }),
                ),
                Err(e) => {
                    result("unavailable");
                    return error(StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable", e);
                }
            }
        }
    };
    if status == StatusCode::OK || out.get("error").is_none() {
        out["policy"] = json!(address.policy);
        out["backend"] = json!(address.backend.name());
        out["key"] = json!(key);
        if reset {
            out["reset"] = json!(status == StatusCode::OK);
        }
    }
    if reset && status == StatusCode::OK {
        metrics::counter!("ratemesh_admin_resets_total", "policy" => address.policy, "backend" => address.backend.name())
            .increment(1);
    }
    tracing::info!(
        target: "ratemesh::admin",
        who,
        call = name,
        policy = address.policy,
        backend = address.backend.name(),
        key,
        status = status.as_u16(),
        "answered"
    );
    result(if status == StatusCode::OK {
        "ok"
    } else {
        "partial"
    });
    answer(status, out)
}

/// A mesh key from its owner.
async fn mesh_key(
    state: &AdminState,
    address: &KeyAddress,
    number: u32,
    reset: bool,
) -> (StatusCode, Value) {
    match state
        .mesh
        .key_state(number, address.key, reset, ASK_TIMEOUT)
        .await
    {
        Ok(v) => (
            StatusCode::OK,
            json!({
                "limit": v.limit,
                "remaining": v.available + v.leased,
                "reset_after_ms": v.reset_after_ns.div_ceil(1_000_000),
                "owner": v.owner,
                "known": v.known,
                "available": v.available,
                "leased": v.leased,
                "used": v.used,
                "lockout_ms": v.lockout_ns.div_ceil(1_000_000),
                "holders": v.holders.iter().map(|&(node, leased, used)| json!({"node": node, "leased": leased, "used": used})).collect::<Vec<_>>(),
            }),
        ),
        Err(e) => (
            StatusCode::GATEWAY_TIMEOUT,
            json!({
                "error": "owner_unreachable",
                "message": if reset {
                    format!("{e}; the reset may or may not have happened: ask again (each reset gives one fresh limit)")
                } else {
                    e.to_string()
                },
            }),
        ),
    }
}

/// A local key on every live node (this one included); members declared dead are listed
/// as unreachable (their counts stay as they are).
async fn local_key(state: &AdminState, address: &KeyAddress, reset: bool) -> (StatusCode, Value) {
    let ask = LocalKeyAsk {
        policy: address.policy.to_string(),
        key: address.key,
        reset,
    };
    let body = serde_json::to_vec(&ask).unwrap_or_default();
    let mut asks = tokio::task::JoinSet::new();
    let members = state.mesh.with_node(|n| n.members());
    let mut unreachable = Vec::new();
    for &(node, alive) in &members {
        if !alive {
            unreachable.push(json!({"node": node, "message": "declared dead: not asked"}));
            continue;
        }
        let (mesh, body) = (Arc::clone(&state.mesh), body.clone());
        asks.spawn(async move { (node, mesh.ask(node, ASK_LOCAL_KEY, body, ASK_TIMEOUT).await) });
    }
    let mut answers = Vec::new();
    while let Some(Ok(answered)) = asks.join_next().await {
        answers.push(answered);
    }
    answers.sort_by_key(|(node, _)| *node);
    let mut nodes = Vec::new();
    let mut least: Option<LocalKeyAnswer> = None;
    for (node, answered) in answers {
        match answered.map_err(|e| e.to_string()).and_then(|b| {
            serde_json::from_slice::<LocalKeyAnswer>(&b)
                .map_err(|_| String::from_utf8_lossy(&b).into_owned())
        }) {
            Ok(a) => {
                nodes.push(json!({
                    "node": node,
                    "known": a.known,
                    "remaining": a.remaining,
                    "reset_after_ms": a.reset_after_ms,
                    "lockout_ms": a.lockout_ms,
                }));
                if least.as_ref().is_none_or(|l| a.remaining < l.remaining) {
                    least = Some(a);
                }
            }
            Err(message) => unreachable.push(json!({"node": node, "message": message})),
        }
    }
    let status = if unreachable.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::GATEWAY_TIMEOUT
    };
    let mut out = json!({ "nodes": nodes, "unreachable": unreachable });
    if let Some(l) = least {
        out["limit"] = json!(l.limit);
        out["remaining"] = json!(l.remaining);
        out["reset_after_ms"] = json!(l.reset_after_ms);
        out["lockout_ms"] = json!(l.lockout_ms);
    }
    (status, out)
}
