//! Envoy's rate limit service API (`envoy.service.ratelimit.v3.RateLimitService`,
//! `ShouldRateLimit`) on the `[envoy_rls]` gRPC port of a node: a fleet of Envoys that names
//! the nodes as its rate limit cluster shares the policy file's limits, `mesh` ones across
//! the cluster without Redis.
//!
//! Each request is read ([`read`]), decided by the rules in force
//! ([`crate::rules::Rules::decide_descriptors`]: the same counters and reloads as the HTTP
//! gateway) and answered with `overall_code`, one status per descriptor (`current_limit`,
//! `limit_remaining`, `duration_until_reset`) and `response_headers_to_add`: the `RateLimit`
//! and `RateLimit-Policy` fields, `X-RateLimit-Limit`, `-Remaining` and `-Reset` of the
//! descriptor closest to its limit, and `Retry-After` when over the limit.
//!
//! What is not a valid request is refused with a gRPC status and nothing is charged: an
//! empty domain, no descriptors, more than [`MAX_DESCRIPTORS_PER_REQUEST`], a descriptor
//! without entries or with an empty key, negative hits (`INVALID_ARGUMENT`); a domain the
//! file does not have (`NOT_FOUND`); a `redis` policy that fails closed and cannot reach
//! Redis (`UNAVAILABLE`: Envoy's `failure_mode_deny` then decides). A descriptor that
//! matches no configured descriptor is not an error: it is answered `OK` without a limit, as
//! envoyproxy/ratelimit answers it.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue as ProtoHeader;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus as ProtoStatus, RateLimit as ProtoLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::config::RateLimitUnit;
use crate::daemon::DaemonError;
use crate::daemon::node_file::EnvoyRls;
use crate::http::RateLimitLayer;
use crate::http::headers::insert_rate_limit_headers;
use crate::rules::{
    DescriptorMatch, DescriptorQuery, DescriptorStatus, EnvoyError, EnvoyOutcome,
    MAX_DESCRIPTORS_PER_REQUEST, Outcome, Rules,
};

/// The results `ratemesh_envoy_rls_requests_total` counts.
const RESULTS: [&str; 5] = [
    "ok",
    "over_limit",
    "invalid_argument",
    "unknown_domain",
    "unavailable",
];

/// The service: the node's layer decides.
struct Rls {
    layer: RateLimitLayer,
}

/// A running gRPC server.
pub(crate) struct RlsServer {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// Bind the `[envoy_rls]` port.
pub(crate) async fn bind(settings: &EnvoyRls) -> Result<tokio::net::TcpListener, DaemonError> {
    tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| DaemonError::Listen {
            what: "the Envoy rate limit service port",
            addr: settings.listen,
            source,
        })
}

impl RlsServer {
    /// Serve Envoy's API on `listener` with `layer`'s rules and counters.
    pub(crate) fn start(
        listener: tokio::net::TcpListener,
        settings: &EnvoyRls,
        layer: RateLimitLayer,
    ) -> RlsServer {
        for result in RESULTS {
            metrics::counter!("ratemesh_envoy_rls_requests_total", "result" => result).increment(0);
        }
        for matched in ["limited", "shadow", "unlimited", "unknown"] {
            metrics::counter!("ratemesh_envoy_rls_descriptors_total", "match" => matched)
                .increment(0);
        }
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let service = RateLimitServiceServer::new(Rls { layer })
            .max_decoding_message_size(settings.max_message_bytes);
        let incoming = TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(Duration::from_secs(60)));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .http2_keepalive_timeout(Some(Duration::from_secs(10)))
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                tracing::error!(%error, "the Envoy rate limit service stopped");
            }
        });
        tracing::info!(%addr, "Envoy rate limit service (gRPC)");
        RlsServer { stop, task }
    }

    /// Stop accepting and tell the connections to go away (HTTP/2 `GOAWAY`), at once; the
    /// returned future completes when the calls in flight are answered.
    pub(crate) fn stop(self) -> impl std::future::Future<Output = ()> {
        let _ = self.stop.send(());
        async move {
            let _ = self.task.await;
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let queries = read(&request).inspect_err(|_| count("invalid_argument"))?;
        let rules = self.layer.rules();
        let now = self.layer.now_ns();
        let outcome = match rules
            .decide_descriptors(&request.domain, &queries, now)
            .await
        {
            Ok(outcome) => outcome,
            Err(error @ EnvoyError::UnknownDomain) => {
                count("unknown_domain");
                return Err(Status::not_found(format!(
                    "{error}; the file has: {}",
                    domains(&rules)
                )));
            }
            Err(error @ EnvoyError::TooManyDescriptors(_)) => {
                count("invalid_argument");
                return Err(Status::invalid_argument(error.to_string()));
            }
        };
        record(&rules, &request.domain, &outcome);
        if let Some(policy) = &outcome.outcome.backend_unavailable {
            count("unavailable");
            return Err(Status::unavailable(format!(
                "the rate-limit backend of policy `{policy}` is unavailable and the policy \
                 fails closed"
            )));
        }
        count(if outcome.over_limit {
            "over_limit"
        } else {
            "ok"
        });
        Ok(Response::new(answer(&outcome)))
    }
}

/// The domains of the file, for a `NOT_FOUND` message (at most a few).
fn domains(rules: &crate::rules::Rules) -> String {
    let names: Vec<&str> = rules
        .config()
        .envoy
        .domains
        .iter()
        .map(|d| d.domain.as_str())
        .take(8)
        .collect();
    if names.is_empty() {
        "no domain".to_string()
    } else {
        names.join(", ")
    }
}

/// Check a request and take its descriptors: entries and tokens (`hits_addend` of the
/// descriptor if set, where 0 only checks; else the request's, where 0 means 1).
pub(crate) fn read(request: &RateLimitRequest) -> Result<Vec<DescriptorQuery<'_>>, Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("the domain must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "the request has no descriptors; give at least one",
        ));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS_PER_REQUEST {
        return Err(Status::invalid_argument(format!(
            "{} descriptors; at most {MAX_DESCRIPTORS_PER_REQUEST} in one request",
            request.descriptors.len()
        )));
    }
    let hits = u64::from(request.hits_addend.max(1));
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, descriptor)| {
            if descriptor.entries.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i} has no entries"
                )));
            }
            if let Some(j) = descriptor.entries.iter().position(|e| e.key.is_empty()) {
                return Err(Status::invalid_argument(format!(
                    "entry {j} of descriptor {i} has an empty key"
                )));
            }
            if descriptor.is_negative_hits {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i} asks for negative hits (is_negative_hits), which this \
                     service does not give back"
                )));
            }
            Ok(DescriptorQuery {
                entries: descriptor
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect(),
                hits: descriptor.hits_addend.map_or(hits, |h| h.value),
            })
        })
        .collect()
}

/// The response to a decided request.
fn answer(outcome: &EnvoyOutcome) -> RateLimitResponse {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    RateLimitResponse {
        overall_code: code(outcome.over_limit),
        statuses: outcome
            .statuses
            .iter()
            .map(|s| status(s, code(s.over_limit)))
            .collect(),
        response_headers_to_add: headers(&outcome.outcome),
        ..RateLimitResponse::default()
    }
}

fn status(s: &DescriptorStatus, code: i32) -> ProtoStatus {
    ProtoStatus {
        code,
        current_limit: s.limit.as_ref().map(|limit| ProtoLimit {
            name: limit.name.to_string(),
            requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
            unit: limit.unit.map_or(Unit::Unknown, unit) as i32,
        }),
        limit_remaining: u32::try_from(s.remaining).unwrap_or(u32::MAX),
        duration_until_reset: s.reset_after_ns.map(|ns| ProtoDuration {
            seconds: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX),
            nanos: (ns % 1_000_000_000) as i32,
        }),
        quota: None,
    }
}

fn unit(unit: RateLimitUnit) -> Unit {
    match unit {
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Week => Unit::Week,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
    }
}

/// The fields Envoy adds to its response: as the HTTP gateway writes them, with the legacy
/// `X-RateLimit-*` ones.
fn headers(outcome: &Outcome) -> Vec<ProtoHeader> {
    let mut fields = http::HeaderMap::new();
    insert_rate_limit_headers(&mut fields, outcome, true);
    fields
        .iter()
        .filter_map(|(name, value)| {
            Some(ProtoHeader {
                key: name.as_str().to_string(),
                value: value.to_str().ok()?.to_string(),
                raw_value: Vec::new(),
            })
        })
        .collect()
}

fn count(result: &'static str) {
    metrics::counter!("ratemesh_envoy_rls_requests_total", "result" => result).increment(1);
}

/// Count the decisions by policy and outcome, and the descriptors by how they matched
/// (never by value); log a shadow descriptor that would be over.
fn record(rules: &Rules, domain: &str, outcome: &EnvoyOutcome) {
    let Outcome {
        enforced, shadow, ..
    } = &outcome.outcome;
    for report in enforced.iter().chain(shadow) {
        rules.count(report);
    }
    for report in shadow.iter().filter(|r| !r.decision.is_allowed()) {
        tracing::info!(domain, policy = %report.name, "shadow descriptor would be over its limit");
    }
    for status in &outcome.statuses {
        let matched = match status.matched {
            DescriptorMatch::Unknown => "unknown",
            DescriptorMatch::Unlimited => "unlimited",
            DescriptorMatch::Limited => "limited",
            DescriptorMatch::Shadow => "shadow",
        };
        metrics::counter!("ratemesh_envoy_rls_descriptors_total", "match" => matched).increment(1);
    }
    if let Some(denial) = outcome.outcome.denied_by() {
        tracing::debug!(domain, policy = %denial.name, "Envoy descriptor over its limit");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::google::protobuf::UInt64Value;

    fn descriptor(pairs: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: pairs
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            hits_addend: hits.map(|value| UInt64Value { value }),
            ..RateLimitDescriptor::default()
        }
    }

    #[test]
    fn hits_come_from_the_descriptor_else_the_request_where_zero_is_one() {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![
                descriptor(&[("a", "1")], None),
                descriptor(&[("a", "1")], Some(0)),
                descriptor(&[("a", "1")], Some(7)),
            ],
            hits_addend: 0,
        };
        let hits: Vec<u64> = read(&request).unwrap().iter().map(|q| q.hits).collect();
        assert_eq!(hits, [1, 0, 7]);
        let request = RateLimitRequest {
            hits_addend: 3,
            ..request
        };
        assert_eq!(read(&request).unwrap()[0].hits, 3);
    }

    #[test]
    fn malformed_requests_are_invalid_arguments() {
        let good = descriptor(&[("a", "1")], None);
        let cases = [
            ("", vec![good.clone()]),
            ("edge", vec![]),
            ("edge", vec![descriptor(&[], None)]),
            ("edge", vec![descriptor(&[("", "x")], None)]),
            ("edge", vec![good.clone(); MAX_DESCRIPTORS_PER_REQUEST + 1]),
            (
                "edge",
                vec![RateLimitDescriptor {
                    is_negative_hits: true,
                    ..good.clone()
                }],
            ),
        ];
        for (domain, descriptors) in cases {
            let request = RateLimitRequest {
                domain: domain.into(),
                descriptors,
                hits_addend: 0,
            };
            let error = read(&request).unwrap_err();
            assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error:?}");
            assert!(!error.message().is_empty());
        }
    }
}
