//! The decision API over gRPC (`[admin] grpc_listen`): the service
//! `ratemesh.decide.v1.Decide`, method `Decide`, of `docs/decide.proto`, with its messages
//! and its server written here by hand, as tonic's generator would write them (no `protoc`
//! at build).
//!
//! A call is authenticated before its message is read, as on the admin port: a client
//! certificate of `client_ca` (the port then speaks TLS), or the metadata `authorization:
//! Bearer TOKEN` with a token of the admin token file, else `UNAUTHENTICATED`. Its checks are
//! decided by the same loop as `POST /v1/decide` ([`super::batch`]); more than
//! [`super::batch::MAX_BATCH`] is `INVALID_ARGUMENT`, a message over 1 MiB `OUT_OF_RANGE`,
//! and nothing is charged. Every call is logged with its caller's name and counted in
//! `ratemesh_admin_calls_total{call="decide_grpc", result}`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tonic::codegen::{Body, BoxFuture, Context, Poll, StdError};
use tonic::{Request, Response, Status};

use super::batch::{self, Answer};
use super::{AdminState, MAX_BODY_BYTES};
use crate::rules::{DirectError, MAX_ATTRIBUTE_BYTES};

/// The service's full name, as `docs/decide.proto` declares it.
pub(crate) const SERVICE: &str = "ratemesh.decide.v1.Decide";

/// The method's path.
const PATH: &str = "/ratemesh.decide.v1.Decide/Decide";

/// The name calls are counted and logged under.
const CALL: &str = "decide_grpc";

/// `ratemesh.decide.v1.DecideRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DecideRequest {
    /// The checks, decided in order.
    #[prost(message, repeated, tag = "1")]
    pub(crate) checks: Vec<Check>,
}

/// `ratemesh.decide.v1.Check`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Check {
    /// The policy's name.
    #[prost(string, tag = "1")]
    pub(crate) policy: String,
    /// The attributes a request would carry (`json`: the body as JSON text).
    #[prost(btree_map = "string, string", tag = "2")]
    pub(crate) attributes: BTreeMap<String, String>,
    /// The tokens to take; not set: 1.
    #[prost(uint64, optional, tag = "3")]
    pub(crate) cost: Option<u64>,
    /// The `jwt` attribute as a JSON object; empty: none.
    #[prost(string, tag = "4")]
    pub(crate) jwt_claims_json: String,
}

/// `ratemesh.decide.v1.DecideResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DecideResponse {
    /// One per check, in order.
    #[prost(message, repeated, tag = "1")]
    pub(crate) results: Vec<CheckResult>,
}

/// `ratemesh.decide.v1.Result`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CheckResult {
    /// Decided and allowed.
    #[prost(bool, tag = "1")]
    pub(crate) allowed: bool,
    /// The policy's limit.
    #[prost(uint64, tag = "2")]
    pub(crate) limit: u64,
    /// The tokens left.
    #[prost(uint64, tag = "3")]
    pub(crate) remaining: u64,
    /// When the key is whole again, in milliseconds.
    #[prost(uint64, tag = "4")]
    pub(crate) reset_after_ms: u64,
    /// When to retry, in milliseconds (0 when allowed).
    #[prost(uint64, tag = "5")]
    pub(crate) retry_after_ms: u64,
    /// The kind of error of a check not decided; empty when decided.
    #[prost(string, tag = "6")]
    pub(crate) error: String,
    /// Why it was not decided.
    #[prost(string, tag = "7")]
    pub(crate) message: String,
}

/// Read a check into the form [`batch::decide`] takes: the attributes as strings, `json` as
/// the JSON value its text is, `jwt_claims_json` as the `jwt` attribute.
fn read(check: Check) -> Result<batch::Check, DirectError> {
    let bad = |name: &str, why: &'static str| DirectError::BadAttribute(name.to_string(), why);
    let mut attributes = crate::rules::Attributes::new();
    for (name, value) in check.attributes {
        let value = if name == "json" {
            if value.len() > MAX_ATTRIBUTE_BYTES {
                return Err(bad("json", "at most 16 KiB"));
            }
            serde_json::from_str(&value).map_err(|_| bad("json", "JSON text"))?
        } else if name == "jwt" {
            return Err(bad("jwt", "given as jwt_claims_json"));
        } else {
            serde_json::Value::String(value)
        };
        attributes.insert(name, value);
    }
    if !check.jwt_claims_json.is_empty() {
        if check.jwt_claims_json.len() > MAX_ATTRIBUTE_BYTES {
            return Err(bad("jwt", "at most 16 KiB"));
        }
        let claims: serde_json::Value = serde_json::from_str(&check.jwt_claims_json)
            .map_err(|_| bad("jwt", "a JSON object of claims"))?;
        attributes.insert("jwt".to_string(), claims);
    }
    Ok(batch::Check {
        policy: check.policy,
        attributes,
        cost: check.cost.unwrap_or(1),
    })
}

fn result(answer: Answer) -> CheckResult {
    match answer {
        Answer::Decided {
            allowed,
            limit,
            remaining,
            reset_after_ms,
            retry_after_ms,
        } => CheckResult {
            allowed,
            limit,
            remaining,
            reset_after_ms,
            retry_after_ms,
            ..CheckResult::default()
        },
        Answer::Failed { error, message } => CheckResult {
            error: error.to_string(),
            message,
            ..CheckResult::default()
        },
    }
}

/// Decide a call of caller `who`.
async fn decide(
    state: &AdminState,
    who: &str,
    request: DecideRequest,
) -> Result<DecideResponse, Status> {
    let checks = request.checks.len();
    match batch::decide(&state.layer, request.checks.into_iter().map(read)).await {
        Ok(answers) => {
            batch::answered(who, CALL, checks);
            Ok(DecideResponse {
                results: answers.into_iter().map(result).collect(),
            })
        }
        Err(too_many) => {
            let message = too_many.message("checks");
            batch::malformed(who, CALL, &message);
            Err(Status::invalid_argument(message))
        }
    }
}

/// The service, as a tower service of HTTP/2 requests (what tonic's generated
/// `…Server<T>` is).
#[derive(Clone)]
pub(crate) struct DecideServer {
    state: Arc<AdminState>,
}

impl tonic::server::NamedService for DecideServer {
    const NAME: &'static str = SERVICE;
}

/// The method, called once the message is read.
struct DecideMethod {
    state: Arc<AdminState>,
    who: String,
    /// Set when the message was read (a call that ends without it was malformed).
    read: Arc<AtomicBool>,
}

impl tonic::server::UnaryService<DecideRequest> for DecideMethod {
    type Response = DecideResponse;
    type Future = BoxFuture<Response<DecideResponse>, Status>;

    fn call(&mut self, request: Request<DecideRequest>) -> Self::Future {
        self.read.store(true, Ordering::Relaxed);
        let state = Arc::clone(&self.state);
        let who = std::mem::take(&mut self.who);
        Box::pin(async move {
            decide(&state, &who, request.into_inner())
                .await
                .map(Response::new)
        })
    }
}

impl<B> tower::Service<http::Request<B>> for DecideServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != PATH {
            let status = Status::unimplemented(format!(
                "{SERVICE} has one method, Decide; not {}",
                request.uri().path()
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let credentials = super::Credentials {
            certificate: request
                .extensions()
                .get::<super::tls::Peer>()
                .and_then(|peer| peer.certificate.clone()),
            authorization: request.headers().get(http::header::AUTHORIZATION).cloned(),
        };
        let Some(who) = super::caller(&self.state, &credentials) else {
            super::refused(CALL);
            let status = Status::unauthenticated(
                "give a bearer token of the node's admin token file (authorization: Bearer …), \
                 or a client certificate of its client_ca",
            );
            return Box::pin(async move { Ok(status.into_http()) });
        };
        let read = Arc::new(AtomicBool::new(false));
        let method = DecideMethod {
            state: Arc::clone(&self.state),
            who: who.clone(),
            read: Arc::clone(&read),
        };
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_BODY_BYTES), None);
            let response = grpc.unary(method, request).await;
            if !read.load(Ordering::Relaxed) {
                // The message could not be read (too large, not the message, compressed
                // in a way not accepted): tonic answered with the status.
                let why = response
                    .extensions()
                    .get::<Status>()
                    .map_or_else(|| "unreadable message".to_string(), ToString::to_string);
                batch::malformed(&who, CALL, &why);
            }
            Ok(response)
        })
    }
}

/// A running gRPC port of the decision API.
pub(crate) struct GrpcServer {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcServer {
    /// Serve the decision API on `listener`, with the admin port's rules and tokens.
    pub(super) fn start(incoming: super::tls::Incoming, state: Arc<AdminState>) -> GrpcServer {
        let addr = axum::serve::Listener::local_addr(&incoming)
            .expect("a bound listener has an address")
            .addr;
        let incoming = incoming.into_stream();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .http2_keepalive_timeout(Some(Duration::from_secs(10)))
                .add_service(DecideServer { state })
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                tracing::error!(%error, "the decision API's gRPC port stopped");
            }
        });
        tracing::info!(%addr, "decision API (gRPC, {SERVICE})");
        GrpcServer { stop, task }
    }

    /// Stop accepting and tell the connections to go away; the returned future completes
    /// when the calls in flight are answered.
    pub(super) fn stop(self) -> impl std::future::Future<Output = ()> {
        let _ = self.stop.send(());
        async move {
            let _ = self.task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn checks_read_their_attributes_cost_and_claims() {
        let check = Check {
            policy: "p".into(),
            attributes: [
                ("header:x-account".to_string(), "alice".to_string()),
                ("json".to_string(), r#"{"org": 7}"#.to_string()),
            ]
            .into(),
            cost: None,
            jwt_claims_json: r#"{"sub": "bob"}"#.into(),
        };
        let read = read(check.clone()).unwrap();
        assert_eq!(read.cost, 1);
        assert_eq!(read.attributes["header:x-account"], "alice");
        assert_eq!(read.attributes["json"]["org"], 7);
        assert_eq!(read.attributes["jwt"]["sub"], "bob");
        let peek = Check {
            cost: Some(0),
            ..check.clone()
        };
        assert_eq!(super::read(peek).unwrap().cost, 0);
        for bad in [
            Check {
                jwt_claims_json: "{not json".into(),
                ..check.clone()
            },
            Check {
                attributes: [("json".to_string(), "{".to_string())].into(),
                ..check.clone()
            },
            Check {
                attributes: [("jwt".to_string(), "{}".to_string())].into(),
                ..check.clone()
            },
            Check {
                jwt_claims_json: format!("\"{}\"", "x".repeat(MAX_ATTRIBUTE_BYTES)),
                ..check.clone()
            },
        ] {
            assert!(
                matches!(super::read(bad), Err(DirectError::BadAttribute(..))),
                "refused as a bad attribute"
            );
        }
    }

    #[test]
    fn answers_become_results() {
        let decided = result(Answer::Decided {
            allowed: true,
            limit: 3,
            remaining: 2,
            reset_after_ms: 10,
            retry_after_ms: 0,
        });
        assert!(decided.allowed && decided.error.is_empty());
        assert_eq!((decided.limit, decided.remaining), (3, 2));
        let failed = result(Answer::Failed {
            error: "unknown_policy",
            message: "no policy named `x`".into(),
        });
        assert!(!failed.allowed && failed.limit == 0);
        assert_eq!(failed.error, "unknown_policy");
    }

    /// The wire form the `.proto` file gives: field numbers and types (a client generated
    /// from `docs/decide.proto` reads and writes these bytes).
    #[test]
    fn messages_have_the_proto_files_field_numbers() {
        let request = DecideRequest {
            checks: vec![Check {
                policy: "p".into(),
                attributes: [("a".to_string(), "b".to_string())].into(),
                cost: Some(0),
                jwt_claims_json: "{}".into(),
            }],
        };
        // checks (1, bytes) { policy (1) "p", attributes (2) {key (1) "a", value (2) "b"},
        // cost (3, varint) 0, jwt_claims_json (4) "{}" }
        let expected = [
            0x0a, 17, 0x0a, 1, b'p', 0x12, 6, 0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 0, 0x22, 2, b'{',
            b'}',
        ];
        assert_eq!(request.encode_to_vec(), expected);
        assert_eq!(DecideRequest::decode(&expected[..]).unwrap(), request);
        let response = DecideResponse {
            results: vec![CheckResult {
                allowed: true,
                limit: 1,
                remaining: 2,
                reset_after_ms: 3,
                retry_after_ms: 4,
                error: "e".into(),
                message: "m".into(),
            }],
        };
        let expected = [
            0x0a, 16, 0x08, 1, 0x10, 1, 0x18, 2, 0x20, 3, 0x28, 4, 0x32, 1, b'e', 0x3a, 1, b'm',
        ];
        assert_eq!(response.encode_to_vec(), expected);
        let proto = include_str!("../../../docs/decide.proto");
        for line in [
            "repeated Check checks = 1;",
            "string policy = 1;",
            "map<string, string> attributes = 2;",
            "optional uint64 cost = 3;",
            "string jwt_claims_json = 4;",
            "repeated Result results = 1;",
            "bool allowed = 1;",
            "uint64 limit = 2;",
            "uint64 remaining = 3;",
            "uint64 reset_after_ms = 4;",
            "uint64 retry_after_ms = 5;",
            "string error = 6;",
            "string message = 7;",
            "package ratemesh.decide.v1;",
            "rpc Decide(DecideRequest) returns (DecideResponse);",
        ] {
            assert!(proto.contains(line), "docs/decide.proto lacks `{line}`");
        }
    }
}
