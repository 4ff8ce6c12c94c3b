//! A call's checks decided, the one loop both forms of the decision API share (`POST
//! /v1/decide` in JSON, `ratemesh.decide.v1.Decide/Decide` over gRPC): each check decided in
//! order by the rules in force ([`crate::rules::Rules::decide_direct`], the counters of the
//! HTTP gateway), one that cannot be decided answered with the kind of error and why.

use serde::Deserialize;

use crate::http::RateLimitLayer;
use crate::rules::{Attributes, DirectError};

/// The most checks one call may carry.
pub(crate) const MAX_BATCH: usize = 1000;

/// One check: a policy, the attributes a request would carry, the tokens to take (0: a look
/// that takes nothing).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Check {
    pub(crate) policy: String,
    #[serde(default)]
    pub(crate) attributes: Attributes,
    #[serde(default = "one")]
    pub(crate) cost: u64,
}

fn one() -> u64 {
    1
}

/// What a check is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Decided (times in milliseconds, rounded up).
    Decided {
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after_ms: u64,
        retry_after_ms: u64,
    },
    /// Not decided: the kind of error (`unknown_policy`, `unknown_route`, `bad_attribute`,
    /// `missing_part`, `unavailable`) and why.
    Failed {
        error: &'static str,
        message: String,
    },
}

impl Answer {
    /// The answer as the JSON API writes it.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        match self {
            Answer::Decided {
                allowed,
                limit,
                remaining,
                reset_after_ms,
                retry_after_ms,
            } => serde_json::json!({
                "allowed": allowed,
                "limit": limit,
                "remaining": remaining,
                "reset_after_ms": reset_after_ms,
                "retry_after_ms": retry_after_ms,
            }),
            Answer::Failed { error, message } => {
                serde_json::json!({"error": error, "message": message})
            }
        }
    }

    fn failed(error: &DirectError) -> Answer {
        Answer::Failed {
            error: kind(error),
            message: error.to_string(),
        }
    }
}

/// The kind of error a check that cannot be decided is answered.
fn kind(error: &DirectError) -> &'static str {
    match error {
        DirectError::UnknownPolicy(_) => "unknown_policy",
        DirectError::UnknownRoute(_) => "unknown_route",
        DirectError::BadAttribute(..) => "bad_attribute",
        DirectError::Missing { .. } => "missing_part",
        DirectError::Unavailable(_) => "unavailable",
        DirectError::HeldByResponses(_) => "held_by_responses",
    }
}

/// A call with more than [`MAX_BATCH`] checks (how many): none is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooMany(pub(crate) usize);

impl TooMany {
    /// Why the call is refused; `what` names its checks ("requests", "checks").
    pub(crate) fn message(self, what: &str) -> String {
        format!("{} {what}; at most {MAX_BATCH} {what} in one call", self.0)
    }
}

/// Decide `checks` in order with `layer`'s rules and clock; a check read as an error (by the
/// form of the API that read it) is answered with that error.
pub(crate) async fn decide<I>(layer: &RateLimitLayer, checks: I) -> Result<Vec<Answer>, TooMany>
where
    I: IntoIterator<Item = Result<Check, DirectError>>,
    I::IntoIter: ExactSizeIterator,
{
    let checks = checks.into_iter();
    if checks.len() > MAX_BATCH {
        return Err(TooMany(checks.len()));
    }
    let rules = layer.rules();
    let mut answers = Vec::with_capacity(checks.len());
    for check in checks {
        let check = match check {
            Ok(check) => check,
            Err(error) => {
                answers.push(Answer::failed(&error));
                continue;
            }
        };
        let now = layer.now_ns();
        let answer = match rules
            .decide_direct(&check.policy, &check.attributes, check.cost, now)
            .await
        {
            Ok(d) => Answer::Decided {
                allowed: d.is_allowed(),
                limit: d.limit,
                remaining: d.remaining,
                reset_after_ms: d.reset_after_ns.div_ceil(1_000_000),
                retry_after_ms: d.retry_after_ns.div_ceil(1_000_000),
            },
            Err(error) => Answer::failed(&error),
        };
        answers.push(answer);
    }
    Ok(answers)
}

/// Log an answered call with its caller's name (target `ratemesh::admin`) and count it in
/// `ratemesh_admin_calls_total{call, result="ok"}`.
pub(crate) fn answered(who: &str, call: &'static str, checks: usize) {
    tracing::info!(target: "ratemesh::admin", who, call, requests = checks, "answered");
    metrics::counter!("ratemesh_admin_calls_total", "call" => call, "result" => "ok").increment(1);
}

/// Log a call refused as malformed with its caller's name and why, and count it in
/// `ratemesh_admin_calls_total{call, result="bad_request"}`.
pub(crate) fn malformed(who: &str, call: &'static str, why: &str) {
    tracing::info!(target: "ratemesh::admin", who, call, why, "bad request");
    metrics::counter!("ratemesh_admin_calls_total", "call" => call, "result" => "bad_request")
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_direct_error_has_the_kind_the_api_documents() {
        let cases = [
            (DirectError::UnknownPolicy("p".into()), "unknown_policy"),
            (DirectError::UnknownRoute("r".into()), "unknown_route"),
            (
                DirectError::BadAttribute("a".into(), "why"),
                "bad_attribute",
            ),
            (
                DirectError::Missing {
                    policy: "p".into(),
                    part: "ip",
                },
                "missing_part",
            ),
            (DirectError::Unavailable("p".into()), "unavailable"),
            (
                DirectError::HeldByResponses("p".into()),
                "held_by_responses",
            ),
        ];
        for (error, expected) in cases {
            let json = Answer::failed(&error).to_json();
            assert_eq!(json["error"], expected);
            assert_eq!(json["message"], error.to_string());
        }
    }

    #[test]
    fn a_json_check_costs_one_unless_it_says() {
        let check: Check = serde_json::from_str(r#"{"policy": "p"}"#).unwrap();
        assert_eq!((check.cost, check.attributes.len()), (1, 0));
        let check: Check = serde_json::from_str(r#"{"policy": "p", "cost": 0}"#).unwrap();
        assert_eq!(check.cost, 0);
        assert!(serde_json::from_str::<Check>(r#"{"policy": "p", "costs": 2}"#).is_err());
    }
}
