//! The rate-limit fields of a response, pure formatting (no IO).
//!
//! `RateLimit-Policy` and `RateLimit` follow draft-ietf-httpapi-ratelimit-headers-09: each is
//! a structured-field list with one item per policy, the policy's name as an sf-string, and
//! `q` (quota, tokens) and `w` (window, seconds), or `r` (remaining tokens) and `t` (seconds
//! until the quota is whole again). `Retry-After` is in whole seconds, rounded up.

use crate::clock::Nanos;
use crate::rules::{Outcome, PolicyReport};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::http::forms::{FORMATTED_SECONDS, rate_limited_body};

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset` (seconds from now, like `t`).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Round nanoseconds up to whole seconds.
pub(crate) fn ceil_seconds(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000_000)
}

/// Write a list of `sf_name;k1=v1;k2=v2` items (the names already serialized).
fn list<'a>(
    reports: impl Iterator<Item = &'a PolicyReport> + Clone,
    params: impl Fn(&PolicyReport) -> [(&'static str, u64); 2] + Clone,
) -> Option<HeaderValue> {
    crate::http::sf::item_list(reports.map(move |r| (r.sf_name, params(r))))
}

/// `seconds` as a field value; the small values usual in `Retry-After` are formatted once
/// and shared (a clone of a shared value allocates nothing).
fn seconds_value(seconds: u64) -> HeaderValue {
    static SMALL: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    let small = SMALL.get_or_init(|| {
        (0..FORMATTED_SECONDS as u64)
            .map(HeaderValue::from)
            .collect()
    });
    usize::try_from(seconds)
        .ok()
        .and_then(|s| small.get(s))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(seconds))
}

/// The policy that speaks for the response: the one that denied, else the one with the
/// fewest tokens left.
pub(crate) fn deciding_report(outcome: &Outcome) -> Option<&PolicyReport> {
    outcome.denied_by().or_else(|| {
        outcome.enforced.iter().min_by_key(|r| {
            (
                r.decision.remaining,
                std::cmp::Reverse(r.decision.reset_after_ns),
            )
        })
    })
}

/// Add `RateLimit-Policy`, `RateLimit`, `Retry-After` (when denied) and, if `legacy`, the
/// `X-RateLimit-*` fields for `outcome` to `headers`.
pub(crate) fn insert_rate_limit_headers(headers: &mut HeaderMap, outcome: &Outcome, legacy: bool) {
    let reports = || outcome.enforced.iter();
    let policy = match &outcome.enforced[..] {
        // One policy (the usual case): its item, formatted when the policy first decided.
        [report] if report.policy_field.is_some() => report.policy_field.clone(),
        _ => list(reports(), |r| [("q", r.decision.limit), ("w", r.window_s)]),
    };
    if let Some(value) = policy {
        headers.insert(RATELIMIT_POLICY, value);
    }
    let remaining = |r: &PolicyReport| {
        [
            ("r", r.decision.remaining),
            ("t", ceil_seconds(r.decision.reset_after_ns)),
        ]
    };
    let value = match &outcome.enforced[..] {
        // One policy that denied (the answer an attack gets): its item formatted once.
        [report] if report.decision.remaining == 0 => report
            .denial_forms
            .and_then(|forms| forms.ratelimit(ceil_seconds(report.decision.reset_after_ns))),
        _ => None,
    };
    if let Some(value) = value.or_else(|| list(reports(), remaining)) {
        headers.insert(RATELIMIT, value);
    }
    let deciding = deciding_report(outcome);
    if let Some(denial) = outcome.denied_by()
        && denial.decision.verdict == crate::Verdict::Denied
    {
        let seconds = ceil_seconds(denial.decision.retry_after_ns).max(1);
        headers.insert(http::header::RETRY_AFTER, seconds_value(seconds));
    }
    if legacy && let Some(report) = deciding {
        headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(report.decision.limit));
        headers.insert(
            X_RATELIMIT_REMAINING,
            HeaderValue::from(report.decision.remaining),
        );
        headers.insert(
            X_RATELIMIT_RESET,
            HeaderValue::from(ceil_seconds(report.decision.reset_after_ns)),
        );
    }
}

/// The JSON body of a 429: `{"error":"rate_limited","policy":"burst","retry_after_seconds":12}`
/// (`"error":"cost_exceeds_limit"` without a retry time when the request can never fit).
/// The usual ones are formatted once ([`DenialForms`]); the others written straight into
/// one buffer.
pub(crate) fn denial_body(outcome: &Outcome) -> Bytes {
    let Some(denial) = outcome.denied_by() else {
        return Bytes::from_static(br#"{"error":"rate_limited"}"#);
    };
    if denial.decision.verdict == crate::Verdict::CannotFit {
        return serde_json::json!({
            "error": "cost_exceeds_limit",
            "policy": denial.name,
            "cost": outcome.cost,
            "limit": denial.decision.limit,
        })
        .to_string()
        .into();
    }
    let seconds = ceil_seconds(denial.decision.retry_after_ns).max(1);
    if let Some(body) = denial.denial_forms.and_then(|forms| forms.body(seconds)) {
        return body;
    }
    rate_limited_body(denial.name, seconds).into()
}

/// The JSON body of a 503 when a fail-closed backend is down: the limit could not be checked,
/// which is the service's fault, not the client's.
pub(crate) fn unavailable_body(outcome: &Outcome) -> String {
    let policy = outcome.backend_unavailable.unwrap_or("");
    serde_json::json!({
        "error": "temporary-reduced-capacity",
        "detail": format!("the rate-limit backend of policy `{policy}` is unavailable"),
        "policy": policy,
    })
    .to_string()
}
