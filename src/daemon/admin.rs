//! The `[admin]` port: calls an operator or an application makes to the node, each with a
//! bearer token of the node file's token file (compared in constant time; a missing or
//! unknown token is `401`), each logged with the caller's name:
//!
//! - `GET /v1/config`: this node (id, version, wire version), the policy file's policies
//!   (algorithm, backend, limit, window, what they count by) and its mesh digest, and the
//!   members (alive, and whether their configuration agrees with this node's);
//! - `POST /v1/decide` with `{"requests": [{"policy": "…", "attributes": {…}, "cost": 1}]}`
//!   (at most 1,000 requests, 1 MiB): each decided on the policy file's rules as a request
//!   carrying those attributes would be (the same counters), in order, and answered
//!   `{"responses": [{"allowed": true, "limit": …, "remaining": …, "reset_after_ms": …,
//!   "retry_after_ms": …}, …]}`, or `{"error": …, "message": …}` for a request that cannot be
//!   decided (unknown policy or route, a bad attribute, a part the policy counts by missing,
//!   Redis unavailable under `fail_mode = "closed"`).
//!
//! With `grpc_listen`, a gRPC port of its own answers the same decisions
//! (`ratemesh.decide.v1.Decide/Decide` of `docs/decide.proto`, [`grpc`]) with the same
//! tokens, started and stopped with the admin port; both forms decide a call's checks in one
//! loop ([`batch`]).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;
use tokio::sync::oneshot;

use crate::daemon::DaemonError;
use crate::daemon::node_file::Admin;
use crate::http::RateLimitLayer;
use crate::net::MeshNet;

mod batch;
mod grpc;
mod keys;
mod overrides;
mod tls;
mod top;

/// The largest body of a call.
const MAX_BODY_BYTES: usize = 1 << 20;

/// A running admin port.
pub(crate) struct AdminServer {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    /// The decision API's gRPC port, if `grpc_listen` is set.
    grpc: Option<grpc::GrpcServer>,
    state: Arc<AdminState>,
    settings: Admin,
    /// The token file's modification time when last read.
    read_at: Option<std::time::SystemTime>,
    /// The ports' TLS, read again when its files change.
    tls: Arc<tls::Acceptor>,
}

/// The `[admin]` ports, bound.
pub(crate) struct AdminListeners {
    /// The admin port (HTTP).
    pub(crate) http: tokio::net::TcpListener,
    /// The decision API's gRPC port (`grpc_listen`).
    grpc: Option<tokio::net::TcpListener>,
    /// Both ports' TLS (`client_ca`), if any.
    tls: Arc<tls::Acceptor>,
}

/// Bind the `[admin]` port and, with `grpc_listen`, the decision API's gRPC port.
pub(crate) async fn bind(settings: &Admin) -> Result<AdminListeners, DaemonError> {
    let listen = |what: &'static str, addr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| DaemonError::Listen { what, addr, source })
    };
    let http = listen("the admin port", settings.listen).await?;
    let grpc = match settings.grpc_listen {
        Some(addr) => Some(listen("the decision API's gRPC port", addr).await?),
        None => None,
    };
    let tls = tls::Acceptor::new(settings).map_err(DaemonError::AdminTls)?;
    Ok(AdminListeners {
        http,
        grpc,
        tls: Arc::new(tls),
    })
}

struct AdminState {
    layer: RateLimitLayer,
    mesh: Arc<MeshNet>,
    overrides: Arc<crate::daemon::overrides::Overrides>,
    id: u64,
    /// Callers by name with their tokens, swapped whole when the token file changes.
    tokens: arc_swap::ArcSwap<Vec<(String, String)>>,
}

impl AdminServer {
    /// Serve the admin port (and its gRPC port) on `listeners` with `layer`'s rules and
    /// counters.
    pub(crate) fn start(
        listeners: AdminListeners,
        settings: &Admin,
        layer: RateLimitLayer,
        mesh: Arc<MeshNet>,
        overrides: Arc<crate::daemon::overrides::Overrides>,
        id: u64,
    ) -> AdminServer {
        let state = Arc::new(AdminState {
            layer,
            mesh,
            overrides,
            id,
            tokens: arc_swap::ArcSwap::from_pointee(settings.tokens.clone()),
        });
        let router = Router::new()
            .route("/v1/decide", post(decide))
            .route("/v1/config", get(config))
            .route("/v1/keys", get(keys::get))
            .route("/v1/keys/reset", post(keys::reset))
            .route("/v1/top", get(top::top))
            .route(
                "/v1/overrides",
                get(overrides::list)
                    .put(overrides::set)
                    .delete(overrides::remove),
            )
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(Arc::clone(&state));
        let AdminListeners {
            http: listener,
            grpc,
            tls,
        } = listeners;
        let grpc = grpc.map(|listener| {
            let incoming = tls::Incoming::start(listener, Arc::clone(&tls));
            grpc::GrpcServer::start(incoming, Arc::clone(&state))
        });
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let incoming = tls::Incoming::start(listener, Arc::clone(&tls));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(
                incoming,
                router.into_make_service_with_connect_info::<tls::Peer>(),
            )
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
            if let Err(error) = served {
                tracing::error!(%error, "the admin port stopped");
            }
        });
        tracing::info!(%addr, tls = settings.client_ca.is_some(), "admin port (decision API, configuration)");
        let read_at = settings.token_file.as_deref().and_then(modified);
        AdminServer {
            stop,
            task,
            grpc,
            state,
            settings: settings.clone(),
            read_at,
            tls,
        }
    }

    /// Read the token file and the TLS files again if they changed on disk: a file that no
    /// longer loads keeps what is in force (logged once, counted in
    /// `ratemesh_admin_token_reloads_total{result}` and
    /// `ratemesh_admin_tls_reloads_total{result}`).
    pub(crate) fn refresh(&mut self) {
        self.tls.refresh();
        let now = self.settings.token_file.as_deref().and_then(modified);
        if now.is_none() || now == self.read_at {
            return;
        }
        self.read_at = now;
        match self.settings.read_token_file() {
            Ok(tokens) => {
                tracing::info!(callers = tokens.len(), "admin token file read again");
                self.state.tokens.store(Arc::new(tokens));
                metrics::counter!("ratemesh_admin_token_reloads_total", "result" => "applied")
                    .increment(1);
            }
            Err(reason) => {
                tracing::warn!(%reason, "admin token file not read again; the tokens in force stay");
                metrics::counter!("ratemesh_admin_token_reloads_total", "result" => "refused")
                    .increment(1);
            }
        }
    }

    /// Stop accepting; the returned future completes when the calls in flight are answered.
    pub(crate) fn stop(self) -> impl std::future::Future<Output = ()> {
        let _ = self.stop.send(());
        let grpc = self.grpc.map(grpc::GrpcServer::stop);
        async move {
            let _ = self.task.await;
            if let Some(grpc) = grpc {
                grpc.await;
            }
        }
    }
}

/// When `path` was last modified, if it can be read.
fn modified(path: &std::path::Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// What a call gives to name its caller: the connection's verified certificate, if any, and
/// its `authorization` header.
pub(super) struct Credentials {
    certificate: Option<String>,
    authorization: Option<http::HeaderValue>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Credentials {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Credentials, Self::Rejection> {
        let certificate = parts
            .extensions
            .get::<axum::extract::ConnectInfo<tls::Peer>>()
            .and_then(|info| info.0.certificate.clone());
        Ok(Credentials {
            certificate,
            authorization: parts.headers.get(http::header::AUTHORIZATION).cloned(),
        })
    }
}

/// The caller a verified client certificate names, else a bearer token (compared in
/// constant time against every token).
fn caller(state: &AdminState, credentials: &Credentials) -> Option<String> {
    if let Some(name) = &credentials.certificate {
        return Some(format!("{name} (certificate)"));
    }
    bearer(state, credentials.authorization.as_ref()?)
}

/// The caller a bearer token names.
fn bearer(state: &AdminState, header: &http::HeaderValue) -> Option<String> {
    let given = header
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?
        .trim()
        .as_bytes();
    let mut found = None;
    for (name, token) in state.tokens.load().iter() {
        if constant_time_eq(given, token.as_bytes()) {
            found = Some(name.clone());
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

/// The body of `POST /v1/decide`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideCall {
    requests: Vec<batch::Check>,
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

/// Log and count a call refused for want of a known bearer token.
fn refused(call: &'static str) {
    tracing::warn!(target: "ratemesh::admin", call, "refused: no known bearer token");
    metrics::counter!("ratemesh_admin_calls_total", "call" => call, "result" => "unauthorized")
        .increment(1);
}

/// The caller's name, or the `401` that refuses the call (logged and counted).
fn authenticate(
    state: &AdminState,
    credentials: &Credentials,
    call: &'static str,
) -> Result<String, Box<Response>> {
    if let Some(who) = caller(state, credentials) {
        return Ok(who);
    }
    refused(call);
    let mut response = json(
        StatusCode::UNAUTHORIZED,
        serde_json::json!({"error": "unauthorized", "message": "give a bearer token of the node's admin token file, or a client certificate of its client_ca"}),
    );
    response.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer"),
    );
    Err(Box::new(response))
}

async fn config(State(state): State<Arc<AdminState>>, credentials: Credentials) -> Response {
    let who = match authenticate(&state, &credentials, "config") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let rules = state.layer.rules();
    let file = rules.config();
    let policies: Vec<serde_json::Value> = file
        .policies
        .iter()
        .map(|named| {
            let policy = named.policy;
            serde_json::json!({
                "name": named.name,
                "algorithm": policy.algorithm().name(),
                "backend": match named.backend {
                    crate::config::Backend::Local => "local",
                    crate::config::Backend::Mesh => "mesh",
                    crate::config::Backend::Redis => "redis",
                },
                "limit": policy.capacity(),
                "window_ms": policy.window_ns() / 1_000_000,
                "by": named.by.as_ref().map(|by| by.parts.iter().map(|p| p.name()).collect::<Vec<_>>()),
                "shadow": named.shadow,
                "count_when": named.count_when.is_some(),
                "block_for_s": named.block_for.map(|b| b.as_secs()),
            })
        })
        .collect();
    let disagree = state.mesh.config_mismatch();
    let members: Vec<serde_json::Value> = state
        .mesh
        .with_node(|n| n.members())
        .into_iter()
        .map(|(id, alive)| {
            serde_json::json!({
                "id": id,
                "alive": alive,
                "config_agrees": !disagree.contains(&id),
            })
        })
        .collect();
    tracing::info!(target: "ratemesh::admin", who, call = "config", "answered");
    metrics::counter!("ratemesh_admin_calls_total", "call" => "config", "result" => "ok")
        .increment(1);
    json(
        StatusCode::OK,
        serde_json::json!({
            "node": {
                "id": state.id,
                "version": env!("CARGO_PKG_VERSION"),
                "wire": crate::mesh::wire::WIRE_VERSION,
            },
            "mesh_digest": format!("{:016x}", file.mesh_digest()),
            "policies": policies,
            "members": members,
        }),
    )
}

async fn decide(
    State(state): State<Arc<AdminState>>,
    credentials: Credentials,
    body: axum::body::Bytes,
) -> Response {
    let who = match authenticate(&state, &credentials, "decide") {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let call: DecideCall = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(error) => {
            let message = error.to_string();
            batch::malformed(&who, "decide", &message);
            return json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "bad_request", "message": message}),
            );
        }
    };
    let requests = call.requests.len();
    match batch::decide(&state.layer, call.requests.into_iter().map(Ok)).await {
        Ok(answers) => {
            batch::answered(&who, "decide", requests);
            let responses: Vec<serde_json::Value> =
                answers.iter().map(batch::Answer::to_json).collect();
            json(
                StatusCode::OK,
                serde_json::json!({ "responses": responses }),
            )
        }
        Err(too_many) => {
            let message = too_many.message("requests");
            batch::malformed(&who, "decide", &message);
            json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "bad_request", "message": message}),
            )
        }
    }
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
