//! `ratemesh node`: one gateway node as a process — the mesh node with its QUIC transport,
//! and an HTTP server that rate-limits every request with the same layer library users embed
//! ([`crate::http::RateLimitLayer`]), plus `/metrics` and `/health`. Each request is matched
//! once, where the node routes it, and charged where it answers it (`daemon::app`).
//!
//! Every path other than `/metrics` and `/health` is the gateway: a request the policies
//! deny is answered 429 (with `Retry-After` and the `RateLimit` fields); an admitted one is
//! sent on to its `[[proxy]]` route's upstream (`daemon::proxy`), or answered `200 ok` under
//! no route. With `[forward_auth]`, checks at its path are decided for another gateway
//! (`daemon::forward_auth`). With `[envoy_rls]`, a gRPC port answers Envoy's rate limit
//! service API with the policy file's `[envoy]` descriptors (`daemon::envoy_rls`).
//!
//! SIGHUP re-reads the policy file (`daemon::reload`): a valid file applies, an invalid one is
//! refused and logged, and the node keeps serving either way.
//!
//! On SIGTERM the node drains the way load balancers expect: `/health` answers 503 while
//! the node still serves requests for `drain_grace`; then it stops accepting connections,
//! finishes the requests in flight for at most `drain`, hands its mesh keys over to their
//! next owners, closes its QUIC endpoint so its peers notice at once, and exits. A second
//! SIGTERM, or a SIGINT (Ctrl-C) at any time, skips what is left of the grace and the drain
//! (the keys are still handed over).

mod activity;
mod admin;
mod app;
mod certificates;
mod envoy_rls;
mod forward_auth;
pub(crate) mod node_file;
mod overrides;
mod proxy;
mod questions;
mod reload;
mod server;
mod signals;
mod snapshots;
mod telemetry;

#[cfg(feature = "fuzzing")]
pub(crate) use proxy::fuzz_head;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::config::ConfigError;
use crate::daemon::admin::AdminServer;
use crate::daemon::app::App;
use crate::daemon::certificates::Certificates;
use crate::daemon::envoy_rls::RlsServer;
use crate::daemon::forward_auth::Checks;
use crate::daemon::node_file::{Admin, EnvoyRls, NodeFile};
use crate::daemon::proxy::Proxy;
use crate::daemon::reload::PolicyReloader;
use crate::daemon::server::{ConnLimits, Server};
use crate::daemon::signals::{Signal, Signals};
use crate::http::RateLimitLayer;
use crate::net::{MeshNet, NetConfig, NetError};
use crate::rules::{Rules, RulesError};

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
    /// Another port could not be opened.
    #[error("opening {what} {addr}: {source}")]
    Listen {
        /// Which port.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The Prometheus recorder could not be installed (another one is).
    #[error("installing the metrics recorder: {0}")]
    Metrics(String),
    /// The signal handlers could not be installed.
    #[error("installing the signal handlers: {0}")]
    Signals(std::io::Error),
    /// The state directory (`state_dir`) could not be opened.
    #[error("the node's state_dir: {0}")]
    State(String),
    /// The admin ports' TLS (`[admin] client_ca` and the node's `[tls]` files) could not be
    /// built.
    #[error("the admin ports' TLS: {0}")]
    AdminTls(String),
}

/// What the HTTP handlers share.
struct NodeState {
    id: u64,
    mesh: Arc<MeshNet>,
    /// Long-window counts on disk.
    snapshots: Arc<snapshots::Snapshots>,
    snapshot_interval: Duration,
    /// The admin API's overrides (replicated, on disk).
    overrides: Arc<overrides::Overrides>,
    draining: AtomicBool,
    metrics: telemetry::Exporter,
    policies: PolicyReloader,
}

/// A started node: its mesh transport and its HTTP listener, not yet serving.
pub struct RunningNode {
    state: Arc<NodeState>,
    listener: tokio::net::TcpListener,
    app: App,
    drain: Duration,
    drain_grace: Duration,
    limits: ConnLimits,
    signals: Signals,
    layer: RateLimitLayer,
    /// The `[envoy_rls]` port, bound, and its settings.
    envoy_rls: Option<(tokio::net::TcpListener, EnvoyRls)>,
    /// The `[admin]` ports, bound, and their settings.
    admin: Option<(admin::AdminListeners, Admin)>,
    certificates: Certificates,
    /// Where request spans go, flushed when the node stops.
    #[cfg(feature = "otel")]
    traces: Option<Arc<app::traces::Traces>>,
}

/// Check what a node would start with, without starting it: the node file and the policy
/// file (read by [`NodeFile::from_file`]), its certificates (each readable, naming the node,
/// signed by the CA, the key matching), and the policies compiled as the start compiles
/// them (JWT keys read). Nothing is bound or contacted. Needs a Tokio runtime when the policy
/// file has a `[redis]` section.
pub fn check(file: &NodeFile) -> Result<(), DaemonError> {
    file.load_tls()?;
    Rules::check(file.gateway.clone()).map_err(|source| DaemonError::Rules {
        file: file.policy_file.display().to_string(),
        source,
    })
}

/// Start a node from its file: open the QUIC endpoint, dial the peers, install the
/// Prometheus recorder and bind the HTTP port. Serve with [`RunningNode::serve`].
pub async fn start(file: &NodeFile) -> Result<RunningNode, DaemonError> {
    // First: from here on SIGHUP, SIGTERM and SIGINT are the node's, never fatal.
    let signals = Signals::install().map_err(DaemonError::Signals)?;
    let limits = ConnLimits::new(&file.http_settings, server::raise_open_file_limit());
    let tls = file.load_tls()?;
    let metrics = telemetry::Exporter::install()?;
    let certificates = Certificates::new(file, tls.expiry);
    let mesh = Arc::new(
        MeshNet::start_on_thread(NetConfig {
            node: file.node_config(),
            listen: file.listen,
            peers: file.peers.clone(),
            tls,
        })
        .await?,
    );
    // Read back what was saved before a restart, before the node recovers its keys.
    let snapshots = snapshots::Snapshots::open(&file.state.dir).map_err(DaemonError::State)?;
    let saved = snapshots
        .read()
        .map_err(|e| DaemonError::State(e.to_string()))?;
    let restored = mesh.restore_saved(saved);
    if restored > 0 {
        tracing::info!(
            keys = restored,
            "long-window counts read back from the state directory"
        );
    }
    mesh.add_seeds(file.seeds.clone(), file.seed_refresh);
    let layer = RateLimitLayer::with_mesh(file.gateway.clone(), Arc::clone(&mesh) as _).map_err(
        |source| DaemonError::Rules {
            file: file.policy_file.display().to_string(),
            source,
        },
    )?;
    let layer = layer
        .max_identity_bytes(file.http_settings.max_identity_bytes)
        .show_identities(file.admin.as_ref().and_then(|a| a.show.clone()));
    let listener = tokio::net::TcpListener::bind(file.http)
        .await
        .map_err(|source| DaemonError::Http {
            addr: file.http,
            source,
        })?;
    let admin = match &file.admin {
        Some(settings) => Some((admin::bind(settings).await?, settings.clone())),
        None => None,
    };
    let envoy_rls = match &file.envoy_rls {
        Some(settings) => Some((envoy_rls::bind(settings).await?, settings.clone())),
        None => None,
    };
    let overrides = overrides::Overrides::open(file.id, Some(&file.state.dir))
        .map_err(|e| DaemonError::State(e.to_string()))?;
    overrides.apply_all(&layer.rules(), layer.now_ns());
    let state = Arc::new(NodeState {
        id: file.id,
        mesh,
        snapshots: Arc::new(snapshots),
        snapshot_interval: file.state.snapshot_interval,
        overrides: Arc::new(overrides),
        draining: AtomicBool::new(false),
        metrics,
        policies: PolicyReloader::new(
            layer.clone(),
            file.policy_file.clone(),
            file.policy_sha256.clone(),
        ),
    });
    let own = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .with_state(Arc::clone(&state));
    let app = App::new(
        own,
        &layer,
        file.forward_auth.clone().map(Checks::new),
        Arc::new(Proxy::new(&file.proxies)),
    );
    #[cfg(feature = "otel")]
    let (app, traces) = match &file.traces {
        Some(settings) => {
            let traces = Arc::new(app::traces::Traces::start(settings).map_err(|reason| {
                DaemonError::Config(ConfigError {
                    file: file.path.display().to_string(),
                    line: settings.line,
                    field: "traces".into(),
                    reason: format!("cannot export traces: {reason}"),
                })
            })?);
            (app.with_traces(Arc::clone(&traces)), Some(traces))
        }
        None => (app, None),
    };
    Ok(RunningNode {
        state,
        listener,
        app,
        drain: file.drain,
        drain_grace: file.drain_grace,
        limits,
        signals,
        layer,
        envoy_rls,
        admin,
        certificates,
        #[cfg(feature = "otel")]
        traces,
    })
}

/// How often a node looks whether `[jwt]`'s key file or its `[tls]` files changed.
const KEY_FILE_CHECK: Duration = Duration::from_secs(2);

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

    /// Return the `[envoy_rls]` gRPC address, if the node has one.
    pub fn envoy_rls_addr(&self) -> Option<SocketAddr> {
        self.envoy_rls.as_ref().map(|(listener, _)| {
            listener
                .local_addr()
                .expect("a bound listener has an address")
        })
    }

    /// Return the `[admin]` port's address, if the node has one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|(listeners, _)| {
            listeners
                .http
                .local_addr()
                .expect("a bound listener has an address")
        })
    }

    /// Serve until SIGTERM or SIGINT, reloading the policy file on SIGHUP; then drain (see
    /// the module's documentation) and return.
    pub async fn serve(self) {
        let RunningNode {
            state,
            listener,
            app,
            drain,
            drain_grace,
            limits,
            mut signals,
            layer,
            envoy_rls,
            admin,
            mut certificates,
            #[cfg(feature = "otel")]
            traces,
        } = self;
        let server = Server::start(listener, app, limits);
        let snapshotting =
            Arc::clone(&state.snapshots).spawn(Arc::clone(&state.mesh), state.snapshot_interval);
        let questions = questions::serve(
            Arc::clone(&state.mesh),
            layer.clone(),
            Arc::clone(&state.overrides),
        );
        let mut admin = admin.map(|(listeners, settings)| {
            AdminServer::start(
                listeners,
                &settings,
                layer.clone(),
                Arc::clone(&state.mesh),
                Arc::clone(&state.overrides),
                state.id,
            )
        });
        let reloaded = layer.clone();
        let rls =
            envoy_rls.map(|(listener, settings)| RlsServer::start(listener, &settings, layer));

        // Serving: reload on SIGHUP until told to stop; `[jwt]`'s key file is read again when
        // it changes (an identity provider's rotated JWKS), and so are the `[tls]` files (a
        // renewed certificate, a rotated CA).
        let mut keys = tokio::time::interval(KEY_FILE_CHECK);
        keys.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let first = loop {
            tokio::select! {
                signal = signals.next() => match signal {
                    Signal::Hangup => {
                        state.policies.reload();
                        // A policy changed by the reload counts afresh: its overrides again.
                        state.overrides.apply_all(&reloaded.rules(), reloaded.now_ns());
                        certificates.refresh(&state.mesh, true);
                    }
                    stop => break stop,
                },
                _ = keys.tick() => {
                    state.policies.refresh_keys();
                    certificates.refresh(&state.mesh, false);
                    if let Some(admin) = admin.as_mut() {
                        admin.refresh();
                    }
                }
            }
        };
        state.draining.store(true, Ordering::Release);
        let mut now = first == Signal::Interrupt;

        // The grace: /health says 503, requests are still served.
        if !now {
            tracing::info!(
                ?drain_grace,
                ?drain,
                "draining: /health answers 503; serving for the grace period"
            );
            now = wait_or_stop(&mut signals, &state, drain_grace).await;
        }

        // Stop accepting (HTTP and gRPC); let the requests in flight finish for at most `drain`.
        let http_stopping = server.stop();
        let rls_stopping = rls.map(RlsServer::stop);
        let admin_stopping = admin.map(AdminServer::stop);
        let stopping = async move {
            http_stopping.await;
            if let Some(rls) = rls_stopping {
                rls.await;
            }
            if let Some(admin) = admin_stopping {
                admin.await;
            }
        };
        if !now {
            tracing::info!("draining: no new connections; finishing the requests in flight");
            tokio::select! {
                () = stopping => {}
                stopped = wait_or_stop(&mut signals, &state, drain) => {
                    if stopped {
                        tracing::warn!("drain ended at once by a second signal");
                    } else {
                        tracing::warn!(?drain, "requests still in flight after the drain time; closing");
                    }
                }
            }
        }
        // Give the leases back and hand this node's keys to their next owners, so the
        // others carry on at once instead of waiting to declare this node dead.
        // The last snapshot, with the counts of the drain, before the keys are handed on.
        snapshotting.abort();
        state.snapshots.write_changes(&state.mesh).await;
        state.mesh.leave().await;
        for task in questions {
            task.abort();
        }
        #[cfg(feature = "otel")]
        if let Some(traces) = traces {
            // The exporter's last batch blocks while it is sent.
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        }
        tracing::info!("stopped");
    }
}

/// Wait `time`, reloading on SIGHUP; return `true` if a SIGTERM or SIGINT came first.
async fn wait_or_stop(signals: &mut Signals, state: &NodeState, time: Duration) -> bool {
    let deadline = tokio::time::sleep(time);
    let mut deadline = std::pin::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return false,
            signal = signals.next() => match signal {
                Signal::Hangup => {
                    state.policies.reload();
                }
                _ => return true,
            },
        }
    }
}

/// `/health`: 200 while the node serves as a member (it joined its cluster and every
/// member it knew answered it); 503 while it joins or syncs (a readiness probe keeps it out
/// of rotation; a node that starts its cluster is ready at once) and while it drains.
async fn health(State(state): State<Arc<NodeState>>) -> impl IntoResponse {
    let draining = state.draining.load(Ordering::Acquire);
    let (joined, running, members, while_joining) = state.mesh.with_node(|n| {
        (
            n.is_joined(),
            n.is_running(),
            n.membership().alive_count(),
            n.while_joining().name(),
        )
    });
    let peers_up = state
        .mesh
        .peers_up()
        .iter()
        .filter(|&&peer| peer != state.id)
        .count();
    let status = if running && !draining {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let phase = if draining {
        "draining"
    } else if !joined {
        "joining"
    } else if !running {
        "syncing"
    } else {
        "running"
    };
    let body = serde_json::json!({
        "node": state.id,
        "state": phase,
        "joining": !joined,
        "running": running,
        "draining": draining,
        "peers_up": peers_up,
        "members": members,
        "while_joining": while_joining,
    });
    (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn metrics_text(State(state): State<Arc<NodeState>>) -> impl IntoResponse {
    let text = state
        .metrics
        .render(state.id, &state.mesh, || state.policies.sha256());
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}
