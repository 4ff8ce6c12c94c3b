//! `GET /v1/top?policy=NAME&by=denied|admitted&n=20`: a policy's heaviest keys over the last
//! 5 to 10 minutes, across the cluster: every live member's summary (`rules::top`, a sketch
//! per thread merged) merged again. A key that carried more than 1/n of the policy's
//! decisions of that outcome is among the first n (n at most 100). Keys are shown as the
//! counter keys' hashes, the `key` that `GET /v1/keys` answers for an identity, and, with
//! `[admin] show_identities`, in clear where this node saw the key on a request
//! (`rules::identities`: never an API key).

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::keys::error;
use super::{AdminState, Credentials, authenticate, json as answer};
use crate::daemon::questions::{ASK_TIMEOUT, ASK_TOP, MAX_TOP, TopAnswer, TopAsk};
use crate::rules::top::CAPACITY;
use crate::top::{Entry, Summary, merge};

/// `GET /v1/top`.
pub(super) async fn top(
    State(state): State<Arc<AdminState>>,
    credentials: Credentials,
    RawQuery(query): RawQuery,
) -> Response {
    let who = match authenticate(&state, &credentials, "top") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let (mut policy, mut denied, mut n) = (None, true, 20usize);
    for (name, value) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match &*name {
            "policy" => policy = Some(value.into_owned()),
            "by" if value == "denied" => denied = true,
            "by" if value == "admitted" => denied = false,
            "n" => match value.parse::<usize>() {
                Ok(v) if (1..=MAX_TOP).contains(&v) => n = v,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "bad_request",
                        format!("`n`: 1 to {MAX_TOP}"),
                    );
                }
            },
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("`{other}`: give policy, by (denied or admitted) and n"),
                );
            }
        }
    }
    let Some(policy) = policy else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "name the policy: policy=NAME",
        );
    };
    let now = state.layer.now_ns();
    if state.layer.rules().top(&policy, denied, 0, now).is_none() {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_policy",
            format!("no policy named `{policy}`"),
        );
    }
    let body = serde_json::to_vec(&TopAsk {
        policy: policy.clone(),
        denied,
        n: MAX_TOP,
    })
    .unwrap_or_default();
    let mut asks = tokio::task::JoinSet::new();
    let mut unreachable = Vec::new();
    for (node, alive) in state.mesh.with_node(|n| n.members()) {
        if !alive {
            unreachable.push(json!({"node": node, "message": "declared dead: not asked"}));
            continue;
        }
        let (mesh, body) = (Arc::clone(&state.mesh), body.clone());
        asks.spawn(async move { (node, mesh.ask(node, ASK_TOP, body, ASK_TIMEOUT).await) });
    }
    let mut parts = Vec::new();
    let mut nodes = Vec::new();
    let mut memory_bytes = 0usize;
    while let Some(Ok((node, answered))) = asks.join_next().await {
        match answered.map_err(|e| e.to_string()).and_then(|b| {
            serde_json::from_slice::<TopAnswer>(&b)
                .map_err(|_| String::from_utf8_lossy(&b).into_owned())
        }) {
            Ok(a) => {
                nodes.push(node);
                memory_bytes += a.memory_bytes;
                parts.push(Summary {
                    total: a.total,
                    floor: a.floor,
                    entries: a
                        .entries
                        .into_iter()
                        .map(|(key, count, error)| Entry { key, count, error })
                        .collect(),
                });
            }
            Err(message) => unreachable.push(json!({"node": node, "message": message})),
        }
    }
    nodes.sort_unstable();
    let mut merged = merge(&parts, CAPACITY);
    merged.truncate(n);
    let rules = state.layer.rules();
    let keys: Vec<serde_json::Value> = merged
        .entries
        .iter()
        .map(|e| {
            let mut entry = json!({"key": format!("{:016x}", e.key), "count": e.count, "at_least": e.count - e.error});
            if let Some(identity) = rules.identity_of(&policy, e.key) {
                entry["identity"] = identity.into();
            }
            entry
        })
        .collect();
    tracing::info!(target: "ratemesh::admin", who, call = "top", policy, "answered");
    metrics::counter!("ratemesh_admin_calls_total", "call" => "top", "result" => "ok").increment(1);
    answer(
        StatusCode::OK,
        json!({
            "policy": policy,
            "by": if denied { "denied" } else { "admitted" },
            "total": merged.total,
            "guaranteed_top": merged.guaranteed_top().min(CAPACITY),
            "memory_bytes": memory_bytes,
            "keys": keys,
            "nodes": nodes,
            "unreachable": unreachable,
        }),
    )
}
