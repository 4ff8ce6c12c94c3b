//! `ratemesh node`: one gateway node as a process — the mesh node with its QUIC transport,
//! and an HTTP server that rate-limits every request through the same tower layer library
//! users embed ([`crate::http::RateLimitLayer`]), plus `/metrics` and `/health`.
//!
//! Every path other than `/metrics` and `/health` is the gateway: it answers 200 when the
//! policies admit the request and 429 (with `Retry-After` and the `RateLimit` fields) when
//! they do not. On SIGTERM (or Ctrl-C) the node reports itself draining on `/health`, stops
//! accepting connections, finishes the requests in flight for at most `drain`, hands its mesh
//! keys over to their next owners, and closes
//! its QUIC endpoint so its peers notice at once.

pub mod config;
mod telemetry;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::config::ConfigError;
use crate::daemon::config::NodeFile;
use crate::http::RateLimitLayer;
use crate::net::{MeshNet, NetConfig, NetError};
use crate::rules::RulesError;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The node file, the policy file or a certificate is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The policies could not be compiled.
    #[error("{file}: {source}")]
    Rules {
        /// The policy file.
        file: String,
        /// Why.
        source: RulesError,
    },
    /// The QUIC endpoint could not start.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The HTTP port could not be opened.
    #[error("opening the HTTP port {addr}: {source}")]
    Http {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The Prometheus recorder could not be installed (another one is).
    #[error("installing the metrics recorder: {0}")]
    Metrics(String),
}

/// What the HTTP handlers share.
struct NodeState {
    id: u64,
    mesh: Arc<MeshNet>,
    draining: AtomicBool,
    metrics: telemetry::Exporter,
}

/// A started node: its mesh transport and its HTTP listener, not yet serving.
pub struct RunningNode {
    state: Arc<NodeState>,
    listener: tokio::net::TcpListener,
    app: Router,
    drain: std::time::Duration,
}

/// Start a node from its file: open the QUIC endpoint, dial the peers, install the
/// Prometheus recorder and bind the HTTP port. Serve with [`RunningNode::serve_until`].
pub async fn start(file: &NodeFile) -> Result<RunningNode, DaemonError> {
    let tls = file.load_tls()?;
    let metrics = telemetry::Exporter::install()?;
    let mesh = Arc::new(
        MeshNet::start(NetConfig {
            node: file.node_config(),
            listen: file.listen,
            peers: file.peers.clone(),
            tls,
        })
        .await?,
    );
    let layer = RateLimitLayer::with_mesh(file.gateway.clone(), Arc::clone(&mesh) as _).map_err(
        |source| DaemonError::Rules {
            file: file.policy_file.display().to_string(),
            source,
        },
    )?;
    let listener = tokio::net::TcpListener::bind(file.http)
        .await
        .map_err(|source| DaemonError::Http {
            addr: file.http,
            source,
        })?;
    let state = Arc::new(NodeState {
        id: file.id,
        mesh,
        draining: AtomicBool::new(false),
        metrics,
    });
    let gateway = Router::new().fallback(admitted).layer(layer);
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .with_state(Arc::clone(&state))
        .fallback_service(gateway);
    Ok(RunningNode {
        state,
        listener,
        app,
        drain: file.drain,
    })
}

impl RunningNode {
    /// Return the HTTP address (gateway, `/metrics`, `/health`).
    pub fn http_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Return the QUIC address the mesh listens on.
    pub fn quic_addr(&self) -> SocketAddr {
        self.state.mesh.local_addr()
    }

    /// Serve until `shutdown` completes, then drain: `/health` says draining, no new
    /// connections, in-flight requests get at most the node's `drain` time, and the QUIC
    /// endpoint closes.
    pub async fn serve_until(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let state = Arc::clone(&self.state);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let drain_state = Arc::clone(&state);
        let signal = async move {
            shutdown.await;
            drain_state.draining.store(true, Ordering::Release);
            tracing::info!("draining");
            let _ = stop_tx.send(());
        };
        let app = self.app.into_make_service_with_connect_info::<SocketAddr>();
        let server = axum::serve(self.listener, app).with_graceful_shutdown(signal);
        let mut server = std::pin::pin!(server.into_future());
        tokio::select! {
            result = &mut server => {
                if let Err(error) = result {
                    tracing::error!(%error, "HTTP server stopped");
                }
            }
            _ = async {
                let _ = stop_rx.await;
                tokio::time::sleep(self.drain).await;
            } => {
                tracing::warn!(drain = ?self.drain, "requests still in flight after the drain time; closing");
            }
        }
        // Give the leases back and hand this node's keys to their next owners, so the
        // others carry on at once instead of waiting to declare this node dead.
        state.mesh.leave().await;
        tracing::info!("stopped");
    }
}

/// Complete on SIGTERM or Ctrl-C (SIGINT).
pub async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The gateway's upstream: a request the policies admitted.
async fn admitted() -> &'static str {
    "ok\n"
}

async fn health(State(state): State<Arc<NodeState>>) -> impl IntoResponse {
    let running = state.mesh.is_running();
    let draining = state.draining.load(Ordering::Acquire);
    let members = state.mesh.with_node(|n| n.members());
    let peers_up = members
        .iter()
        .filter(|(id, alive)| *alive && *id != state.id)
        .count();
    let status = if running && !draining {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({
        "node": state.id,
        "running": running,
        "draining": draining,
        "peers_up": peers_up,
        "members": members.len(),
    });
    (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn metrics_text(State(state): State<Arc<NodeState>>) -> impl IntoResponse {
    let text = state.metrics.render(state.id, &state.mesh);
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}
