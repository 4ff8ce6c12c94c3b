//! `PUT`, `GET` and `DELETE /v1/overrides`: a limit of its own for one key until a time
//! (`daemon::overrides` keeps the table, replicated and on disk). A key is named as for
//! `/v1/keys` (a policy and attributes, in a JSON body or the query); the table keeps its
//! hash, never the identity.
//!
//! `PUT` takes `{"policy", "attributes", "limit", "for": "24h"}` (or `"until"`, an RFC 3339
//! instant; at most 366 days ahead) and an optional `"reason"`; the answer names the members
//! that took it and those that will pull it (they did not answer).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::keys::{KeyCall, direct_error, error, key_call};
use super::{AdminState, Credentials, authenticate, json as answer};
use crate::daemon::overrides::{
    Limit, MAX_DURATION_MS, MAX_REASON_BYTES, Overrides, Record, TableError,
};
use crate::daemon::questions::send_overrides;
use crate::rules::{Attributes, OverrideError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetCall {
    policy: String,
    #[serde(default)]
    attributes: Attributes,
    limit: u64,
    #[serde(rename = "for")]
    for_: Option<String>,
    until: Option<String>,
    #[serde(default)]
    reason: String,
}

fn shown(record: &Record) -> Value {
    let v = record.value.as_ref();
    json!({
        "policy": record.policy,
        "key": format!("{:016x}", record.key),
        "limit": v.map(|v| v.limit),
        "until_ms": v.map(|v| v.until_ms),
        "reason": v.map(|v| v.reason.as_str()),
        "by": v.map(|v| v.by.as_str()),
        "set_at_ms": record.mark.0,
        "set_on": record.mark.1,
    })
}

fn count(call: &'static str, result: &'static str) {
    metrics::counter!("ratemesh_admin_calls_total", "call" => call, "result" => result)
        .increment(1);
}

/// Until when (UNIX ms) a call's `for` or `until` says, from `now_ms`.
fn until_of(call: &SetCall, now_ms: u64) -> Result<u64, String> {
    let until = match (&call.for_, &call.until) {
        (Some(d), None) => {
            let d = humantime::parse_duration(d).map_err(|e| format!("`for`: {e}"))?;
            now_ms.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
        (None, Some(at)) => {
            let at: jiff::Timestamp = at
                .parse()
                .map_err(|e| format!("`until`: an RFC 3339 instant ({e})"))?;
            u64::try_from(at.as_millisecond()).map_err(|_| "`until`: before 1970".to_string())?
        }
        _ => return Err("give one of `for` (e.g. \"24h\") and `until` (RFC 3339)".into()),
    };
    if until <= now_ms {
        return Err("the override would end before it begins".into());
    }
    if until - now_ms > MAX_DURATION_MS {
        return Err("an override lasts at most 366 days".into());
    }
    Ok(until)
}

/// Apply `record` here and send it to the members; the answer.
async fn spread(state: &AdminState, record: Record) -> Response {
    let rules = state.layer.rules();
    Overrides::apply(&rules, &record, state.layer.now_ns());
    let (took, pending) = send_overrides(&state.mesh, std::slice::from_ref(&record)).await;
    let mut out = shown(&record);
    out["nodes"] = json!(took);
    out["pending"] = json!(pending);
    answer(StatusCode::OK, out)
}

fn table_error(e: &TableError) -> Response {
    match e {
        TableError::Full => error(StatusCode::INSUFFICIENT_STORAGE, "too_many_overrides", e),
        TableError::Disk(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "state_dir", e),
    }
}

/// `PUT /v1/overrides`.
pub(super) async fn set(
    State(state): State<Arc<AdminState>>,
    credentials: Credentials,
    body: Bytes,
) -> Response {
    let who = match authenticate(&state, &credentials, "overrides.set") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let call: SetCall = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(e) => {
            count("overrides.set", "bad_request");
            return error(StatusCode::BAD_REQUEST, "bad_request", e);
        }
    };
    let rules = state.layer.rules();
    let address = match rules.key_address(&call.policy, &call.attributes) {
        Ok(address) => address,
        Err(e) => {
            count("overrides.set", "bad_request");
            return direct_error(&e);
        }
    };
    if let Err(e) = rules.check_override(&call.policy, call.limit) {
        count("overrides.set", "bad_request");
        let kind = match e {
            OverrideError::UnknownPolicy(_) => "unknown_policy",
            OverrideError::Limit(_) => "bad_limit",
        };
        return error(StatusCode::BAD_REQUEST, kind, e);
    }
    let now_ms = state.layer.now_ns() / 1_000_000;
    let until_ms = match until_of(&call, now_ms) {
        Ok(until) => until,
        Err(message) => {
            count("overrides.set", "bad_request");
            return error(StatusCode::BAD_REQUEST, "bad_request", message);
        }
    };
    if call.reason.len() > MAX_REASON_BYTES {
        count("overrides.set", "bad_request");
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "`reason`: at most 200 bytes",
        );
    }
    let limit = Limit {
        limit: call.limit,
        until_ms,
        reason: call.reason,
        by: who.clone(),
    };
    let record = match state
        .overrides
        .set(address.policy, address.key, Some(limit), now_ms)
    {
        Ok(record) => record,
        Err(e) => {
            count("overrides.set", "refused");
            return table_error(&e);
        }
    };
    tracing::info!(
        target: "ratemesh::admin",
        who,
        call = "overrides.set",
        policy = address.policy,
        key = format_args!("{:016x}", address.key),
        limit = call.limit,
        until_ms,
        "override set"
    );
    count("overrides.set", "ok");
    spread(&state, record).await
}

/// `DELETE /v1/overrides`.
pub(super) async fn remove(
    State(state): State<Arc<AdminState>>,
    credentials: Credentials,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let who = match authenticate(&state, &credentials, "overrides.remove") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let call: KeyCall = match key_call(query.as_deref(), &body) {
        Ok(call) => call,
        Err(message) => {
            count("overrides.remove", "bad_request");
            return error(StatusCode::BAD_REQUEST, "bad_request", message);
        }
    };
    let rules = state.layer.rules();
    let address = match rules.key_address(&call.policy, &call.attributes) {
        Ok(address) => address,
        Err(e) => {
            count("overrides.remove", "bad_request");
            return direct_error(&e);
        }
    };
    let now_ms = state.layer.now_ns() / 1_000_000;
    let record = match state
        .overrides
        .set(address.policy, address.key, None, now_ms)
    {
        Ok(record) => record,
        Err(e) => return table_error(&e),
    };
    tracing::info!(
        target: "ratemesh::admin",
        who,
        call = "overrides.remove",
        policy = address.policy,
        key = format_args!("{:016x}", address.key),
        "override removed"
    );
    count("overrides.remove", "ok");
    spread(&state, record).await
}

/// `GET /v1/overrides[?policy=NAME]`: the overrides in force.
pub(super) async fn list(
    State(state): State<Arc<AdminState>>,
    credentials: Credentials,
    RawQuery(query): RawQuery,
) -> Response {
    let who = match authenticate(&state, &credentials, "overrides.list") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let policy = form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes())
        .find(|(name, _)| name == "policy")
        .map(|(_, v)| v.into_owned());
    let now_ms = state.layer.now_ns() / 1_000_000;
    let listed: Vec<Value> = state
        .overrides
        .list(now_ms)
        .iter()
        .filter(|r| policy.as_ref().is_none_or(|p| *p == r.policy))
        .map(shown)
        .collect();
    tracing::info!(target: "ratemesh::admin", who, call = "overrides.list", "answered");
    count("overrides.list", "ok");
    answer(StatusCode::OK, json!({ "overrides": listed }))
}
