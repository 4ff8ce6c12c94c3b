//! The node file of `ratemesh node --config FILE`: who the node is, where it listens, its
//! peers, its certificates, and the policy file it enforces.
//!
//! ```toml
//! id = 1                           # or `id_from_env = "POD_NAME"`: a StatefulSet's pod
//!                                  # `NAME-N` is node N + 1 (`{id}` in `[tls]` paths)
//! listen = "127.0.0.1:7101"        # QUIC (UDP) between nodes
//! http = "127.0.0.1:8101"          # the gateway, /metrics and /health (or `[http] addr`)
//! gossip_interval = "20ms"
//! policy_file = "policies.toml"    # relative to this file; the same file on every node
//! drain_grace = "5s"               # on SIGTERM: /health says 503 while serving, this long
//! drain = "5s"                     # then: finish in-flight requests for at most this
//! mesh_max_keys = 1000000          # mesh keys a node holds; beyond, its share alone decides
//! mesh_first_credit = 1            # tokens a key's first request here may take before the owner answers (0: wait)
//! mesh_max_wait = "100ms"          # the longest a request waits for its key's owner before it is denied
//! gossip_budget_bytes_per_s = 16000000  # key gossip a node sends at most, urgent first
//!
//! # Instead of `http = "…"`, an `[http]` table with its settings (defaults shown):
//! # [http]
//! # addr = "127.0.0.1:8101"
//! # header_read_timeout = "10s"    # a request's head must arrive within this
//! # idle_timeout = "60s"           # a kept-alive connection with no request is closed after
//! # max_connections = 65280        # default: the open-file limit less 256
//! # max_identity_bytes = 4096      # a longer API key or device id is answered 431
//! # max_body_bytes = 65536         # a longer request body is answered 413
//!
//! [tls]                            # from `ratemesh certs --out certs --nodes 3`
//! ca = "certs/ca.pem"
//! cert = "certs/node-1.pem"
//! key = "certs/node-1.key"
//!
//! [[peers]]
//! id = 2
//! addr = "127.0.0.1:7102"
//!
//! # Optional: forward admitted requests under a prefix to an upstream, and answer other
//! # gateways' forward-auth checks (see [`upstreams`]).
//! # [[proxy]]
//! # path_prefix = "/api"
//! # upstream = "http://127.0.0.1:9000"
//! # [forward_auth]
//! # path = "/v1/check"
//! # [envoy_rls]                    # Envoy's rate limit service API over gRPC (see [`envoy_rls`])
//! # listen = "127.0.0.1:8081"
//! # [state]                        # what outlives the process ([`state`])
//! # [traces]                       # OpenTelemetry spans over OTLP (feature `otel`; [`traces`])
//! # otlp_endpoint = "http://127.0.0.1:4317"
//!
//! # Or, besides or instead of peers, where to find the cluster (ids from certificates):
//! # seeds = ["127.0.0.1:7101", "ratemesh-headless.ns.svc:7000"]
//! # seed_refresh = "30s"           # DNS names are resolved again this often
//! # join_timeout = "10s"           # no seed answers: start a cluster (seeds only)
//! # while_joining = "local-share"  # or "deny", "allow": mesh decisions before joining
//! ```
//!
//! Errors name the file, line, field and reason (the policy file's, the policy file).

mod admin;
mod envoy_rls;
mod http;
mod ordinal;
mod state;
mod traces;
mod upstreams;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ordinal::ordinal_id;
use serde::Deserialize;
use toml::Spanned;

use crate::clock::duration_to_nanos;
use crate::config::{ConfigError, GatewayConfig, Source, parse_duration, read_config_file};
use crate::mesh::NodeId;
use crate::mesh::node::{NodeConfig, WhileJoining};
use crate::net::tls::{
    NodeTls, OwnCertError, certificate_names_node, check_own_certificate, node_tls,
};
use crate::net::transport_config;
pub use admin::Admin;
pub use envoy_rls::EnvoyRls;
pub use http::HttpSettings;
pub(crate) use http::RESERVED_FDS;
use http::{RawHttp, http_settings};
pub use state::State;
pub use traces::Traces;
pub use upstreams::{ForwardAuth, Forwarded, ProxyRoute};

/// The shortest gossip interval a node accepts.
pub(crate) const MIN_GOSSIP_INTERVAL: Duration = Duration::from_millis(1);
/// The longest gossip interval a node accepts.
pub(crate) const MAX_GOSSIP_INTERVAL: Duration = Duration::from_secs(10);

/// The most members a cluster has.
pub(crate) const MAX_CLUSTER_SIZE: usize = 1024;
/// Mesh keys a node holds by default.
const DEFAULT_MESH_MAX_KEYS: usize = 1_000_000;
/// The most `mesh_max_keys` a node file may ask for.
const MAX_MESH_MAX_KEYS: i64 = 100_000_000;
/// The most `mesh_first_credit` a node file may ask for.
const MAX_MESH_FIRST_CREDIT: i64 = 1_000_000;
/// The longest `mesh_max_wait` a node file may ask for.
const MAX_MESH_MAX_WAIT: Duration = Duration::from_secs(60);
/// The range of `gossip_budget_bytes_per_s`.
const GOSSIP_BUDGET_RANGE: std::ops::RangeInclusive<i64> = 10_000..=100_000_000_000;

/// The longest `drain` or `drain_grace` a node accepts.
pub(crate) const MAX_DRAIN: Duration = Duration::from_secs(3600);

/// The most seeds a node file lists.
pub(crate) const MAX_SEEDS: usize = 64;
/// How often seed names are resolved again, by default.
pub(crate) const DEFAULT_SEED_REFRESH: Duration = Duration::from_secs(30);
/// How long a node with only seeds waits for one to answer, by default.
pub(crate) const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A validated node file, with its policy file loaded.
#[derive(Debug, Clone)]
pub struct NodeFile {
    /// The node file's path.
    pub path: PathBuf,
    /// This node's id (its certificate names `node-<id>.ratemesh`).
    pub id: NodeId,
    /// The QUIC (UDP) address.
    pub listen: SocketAddr,
    /// The HTTP address (gateway, `/metrics`, `/health`).
    pub http: SocketAddr,
    /// One gossip round.
    pub gossip_interval: Duration,
    /// How long SIGTERM waits for in-flight requests, once the node stops accepting.
    pub drain: Duration,
    /// How long after SIGTERM the node keeps serving with `/health` at 503, so load
    /// balancers see it leave before it stops accepting.
    pub drain_grace: Duration,
    /// The `[http]` settings.
    pub http_settings: HttpSettings,
    /// The other members and where they listen.
    pub peers: Vec<(NodeId, SocketAddr)>,
    /// Members the majority counts at least, until members fill them (default: this node
    /// and its peers).
    pub cluster_size: usize,
    /// Where to find the cluster: socket addresses or DNS names with a port.
    pub seeds: Vec<String>,
    /// How often the seeds are resolved again.
    pub seed_refresh: Duration,
    /// How long a node with only seeds waits for one to answer before it starts a cluster.
    pub join_timeout: Duration,
    /// How the mesh policies decide before the node has joined.
    pub while_joining: WhileJoining,
    /// The most mesh keys the node holds (beyond, a key is decided by its share alone).
    pub mesh_max_keys: usize,
    /// Tokens a key's first request on this node may take before the key's owner answers
    /// ([`NodeConfig::first_credit`]).
    pub mesh_first_credit: u64,
    /// The longest a mesh request waits for its key's owner before it is denied
    /// ([`NodeConfig::max_wait_ns`]).
    pub mesh_max_wait: Duration,
    /// Bytes of key gossip the node sends per second at most (most urgent first; the rest
    /// waits a round).
    pub gossip_budget_bytes_per_s: u64,
    /// The cluster CA, this node's certificate and key (PEM files).
    pub tls: TlsFiles,
    /// The policy file's path.
    pub policy_file: PathBuf,
    /// Where the node keeps what must survive its restarts (`[state]`).
    pub state: State,
    /// The policy file.
    pub gateway: GatewayConfig,
    /// The SHA-256 of the policy file's bytes, in hex.
    pub policy_sha256: String,
    /// The `[[proxy]]` routes: admitted requests under their prefixes go to an upstream.
    pub proxies: Vec<ProxyRoute>,
    /// The `[forward_auth]` endpoint, if any.
    pub forward_auth: Option<ForwardAuth>,
    /// The `[envoy_rls]` gRPC port, if any.
    pub envoy_rls: Option<EnvoyRls>,
    /// The `[admin]` port (the decision API), if any.
    pub admin: Option<Admin>,
    /// Where the node's request spans go (`[traces]`), if anywhere.
    pub traces: Option<Traces>,
}

/// Read and validate a policy file; return it with the SHA-256 of its bytes (hex).
pub(crate) fn read_policy_file(path: &Path) -> Result<(GatewayConfig, String), ConfigError> {
    let text = read_config_file(path)?;
    let gateway = GatewayConfig::from_toml_str(&text, &path.display().to_string())?;
    Ok((gateway, sha256_hex(text.as_bytes())))
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().fold(String::new(), |mut hex, byte| {
        use std::fmt::Write;
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

/// The PEM files of a node's mutual TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The cluster CA certificate.
    pub ca: PathBuf,
    /// This node's certificate.
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
    /// The lines of `ca`, `cert` and `key` in the node file (for errors).
    pub lines: [usize; 3],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNodeFile {
    id: Option<Spanned<u64>>,
    id_from_env: Option<Spanned<String>>,
    listen: Spanned<String>,
    /// `http = "ADDR"` or an `[http]` table.
    http: Spanned<toml::Value>,
    gossip_interval: Option<Spanned<String>>,
    drain: Option<Spanned<String>>,
    drain_grace: Option<Spanned<String>>,
    cluster_size: Option<Spanned<usize>>,
    mesh_max_keys: Option<Spanned<i64>>,
    mesh_first_credit: Option<Spanned<i64>>,
    mesh_max_wait: Option<Spanned<String>>,
    gossip_budget_bytes_per_s: Option<Spanned<i64>>,
    seeds: Option<Spanned<Vec<String>>>,
    seed_refresh: Option<Spanned<String>>,
    join_timeout: Option<Spanned<String>>,
    while_joining: Option<Spanned<String>>,
    policy_file: Spanned<String>,
    state: Option<Spanned<state::RawState>>,
    tls: Spanned<RawTls>,
    #[serde(default)]
    peers: Vec<Spanned<RawPeer>>,
    #[serde(default)]
    proxy: Vec<Spanned<upstreams::RawProxy>>,
    forward_auth: Option<Spanned<upstreams::RawForwardAuth>>,
    envoy_rls: Option<Spanned<envoy_rls::RawEnvoyRls>>,
    admin: Option<Spanned<admin::RawAdmin>>,
    traces: Option<Spanned<traces::RawTraces>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: String,
    cert: String,
    key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    id: u64,
    addr: String,
}

impl NodeFile {
    /// Read and validate a node file and the policy file it names.
    pub fn from_file(path: impl AsRef<Path>) -> Result<NodeFile, ConfigError> {
        let path = path.as_ref();
        Self::from_toml_str(&read_config_file(path)?, path)
    }

    /// Validate a node file's text; `path` names it in errors and anchors relative paths.
    pub fn from_toml_str(text: &str, path: &Path) -> Result<NodeFile, ConfigError> {
        let file = path.display().to_string();
        let source = Source { file: &file, text };
        let raw: RawNodeFile = source.parse()?;
        let at = |span: std::ops::Range<usize>| source.line_of(span.start);
        let base = path.parent().unwrap_or(Path::new("."));
        let relative = |p: &str| base.join(p);

        let id = match (&raw.id, &raw.id_from_env) {
            (Some(id), None) => {
                if *id.get_ref() == 0 || *id.get_ref() > crate::ids::MAX_NODE_ID {
                    return Err(source.error(
                        at(id.span()),
                        "id",
                        "node ids are 1 to 2^63 - 1 (9223372036854775807)",
                    ));
                }
                *id.get_ref()
            }
            (None, Some(var)) => {
                let value = std::env::var(var.get_ref()).ok();
                ordinal_id(var.get_ref(), value.as_deref())
                    .map_err(|reason| source.error(at(var.span()), "id_from_env", reason))?
            }
            (Some(id), Some(_)) => {
                return Err(source.error(
                    at(id.span()),
                    "id",
                    "give `id` or `id_from_env`, not both",
                ));
            }
            (None, None) => {
                return Err(source.error(
                    1,
                    "id",
                    "missing: give `id = N`, or `id_from_env = \"POD_NAME\"` (a StatefulSet's pod)",
                ));
            }
        };
        let address = |spanned: &Spanned<String>, field: &str| {
            spanned.get_ref().parse::<SocketAddr>().map_err(|e| {
                source.error(
                    at(spanned.span()),
                    field,
                    format!(
                        "`{}` is not an address ({e}); write e.g. \"127.0.0.1:7101\"",
                        spanned.get_ref()
                    ),
                )
            })
        };
        let listen = address(&raw.listen, "listen")?;
        let (http, http_settings) = match raw.http.get_ref() {
            toml::Value::String(addr) => (
                address(&Spanned::new(raw.http.span(), addr.clone()), "http")?,
                HttpSettings::default(),
            ),
            toml::Value::Table(table) => {
                let table: RawHttp = table.clone().try_into().map_err(|e: toml::de::Error| {
                    source.error(at(raw.http.span()), "http", e.message().to_string())
                })?;
                let line = source.line_of_key(raw.http.span(), "addr");
                let http = table.addr.parse::<SocketAddr>().map_err(|e| {
                    source.error(
                        line,
                        "http.addr",
                        format!("`{}` is not an address ({e})", table.addr),
                    )
                })?;
                (http, http_settings(&source, raw.http.span(), &table)?)
            }
            _ => {
                return Err(source.error(
                    at(raw.http.span()),
                    "http",
                    "an address (`http = \"127.0.0.1:8101\"`) or an `[http]` table with `addr`",
                ));
            }
        };
        let duration = |spanned: &Option<Spanned<String>>, field: &str, default: Duration| {
            spanned.as_ref().map_or(Ok(default), |s| {
                parse_duration(s.get_ref())
                    .map_err(|reason| source.error(at(s.span()), field, reason))
            })
        };
        let gossip_interval = duration(
            &raw.gossip_interval,
            "gossip_interval",
            Duration::from_millis(20),
        )?;
        if !(MIN_GOSSIP_INTERVAL..=MAX_GOSSIP_INTERVAL).contains(&gossip_interval) {
            let span = raw.gossip_interval.as_ref().map_or(0..0, |s| s.span());
            return Err(source.error(
                at(span),
                "gossip_interval",
                format!(
                    "between {MIN_GOSSIP_INTERVAL:?} and {MAX_GOSSIP_INTERVAL:?}, got {gossip_interval:?}"
                ),
            ));
        }
        let bounded = |spanned: &Option<Spanned<String>>, field: &str| {
            let value = duration(spanned, field, Duration::from_secs(5))?;
            if value > MAX_DRAIN {
                let span = spanned.as_ref().map_or(0..0, |s| s.span());
                return Err(source.error(
                    at(span),
                    field,
                    format!("at most {MAX_DRAIN:?}, got {value:?}"),
                ));
            }
            Ok(value)
        };
        let drain = bounded(&raw.drain, "drain")?;
        let drain_grace = bounded(&raw.drain_grace, "drain_grace")?;

        let mut peers = Vec::new();
        let mut seen = BTreeSet::from([id]);
        for (i, spanned) in raw.peers.iter().enumerate() {
            let peer = spanned.get_ref();
            let line = at(spanned.span());
            let field = |key: &str| format!("peers[{i}].{key}");
            if !seen.insert(peer.id) || peer.id == 0 || peer.id > crate::ids::MAX_NODE_ID {
                return Err(source.error(
                    line,
                    field("id"),
                    format!(
                        "node {} is this node, a second entry, or out of range; every peer has \
                         its own id, 1 to 2^63 - 1",
                        peer.id
                    ),
                ));
            }
            let addr = peer.addr.parse::<SocketAddr>().map_err(|e| {
                source.error(
                    line,
                    field("addr"),
                    format!("`{}` is not an address ({e})", peer.addr),
                )
            })?;
            peers.push((peer.id, addr));
        }
        let members = peers.len() + 1;
        if members > MAX_CLUSTER_SIZE {
            return Err(source.error(
                at(raw.peers[MAX_CLUSTER_SIZE - 1].span()),
                "peers",
                format!("a cluster has at most {MAX_CLUSTER_SIZE} members"),
            ));
        }
        let mesh_max_keys = match &raw.mesh_max_keys {
            None => DEFAULT_MESH_MAX_KEYS,
            Some(n) if (1..=MAX_MESH_MAX_KEYS).contains(n.get_ref()) => *n.get_ref() as usize,
            Some(n) => {
                return Err(source.error(
                    at(n.span()),
                    "mesh_max_keys",
                    format!("between 1 and {MAX_MESH_MAX_KEYS}, got {}", n.get_ref()),
                ));
            }
        };
        let mesh_first_credit = match &raw.mesh_first_credit {
            None => NodeConfig::new(id, Vec::new(), Vec::new()).first_credit,
            Some(n) if (0..=MAX_MESH_FIRST_CREDIT).contains(n.get_ref()) => *n.get_ref() as u64,
            Some(n) => {
                return Err(source.error(
                    at(n.span()),
                    "mesh_first_credit",
                    format!("between 0 and {MAX_MESH_FIRST_CREDIT}, got {}", n.get_ref()),
                ));
            }
        };
        let default_wait =
            Duration::from_nanos(NodeConfig::new(id, Vec::new(), Vec::new()).max_wait_ns);
        let mesh_max_wait = duration(&raw.mesh_max_wait, "mesh_max_wait", default_wait)?;
        if raw.mesh_max_wait.is_some()
            && !(gossip_interval..=MAX_MESH_MAX_WAIT).contains(&mesh_max_wait)
        {
            let span = raw.mesh_max_wait.as_ref().map_or(0..0, |s| s.span());
            return Err(source.error(
                at(span),
                "mesh_max_wait",
                format!(
                    "between the gossip interval ({gossip_interval:?}: a request waits at least \
                     one round for its owner) and {MAX_MESH_MAX_WAIT:?}, got {mesh_max_wait:?}"
                ),
            ));
        }
        let gossip_budget_bytes_per_s = match &raw.gossip_budget_bytes_per_s {
            None => crate::mesh::node::DEFAULT_GOSSIP_BUDGET_BYTES_PER_S,
            Some(n) if GOSSIP_BUDGET_RANGE.contains(n.get_ref()) => *n.get_ref() as u64,
            Some(n) => {
                return Err(source.error(
                    at(n.span()),
                    "gossip_budget_bytes_per_s",
                    format!(
                        "between {} and {} bytes per second, got {}",
                        GOSSIP_BUDGET_RANGE.start(),
                        GOSSIP_BUDGET_RANGE.end(),
                        n.get_ref()
                    ),
                ));
            }
        };
        let cluster_size = match &raw.cluster_size {
            None => members,
            Some(size) if *size.get_ref() > MAX_CLUSTER_SIZE => {
                return Err(source.error(
                    at(size.span()),
                    "cluster_size",
                    format!("at most {MAX_CLUSTER_SIZE}"),
                ));
            }
            Some(size) if *size.get_ref() >= members => *size.get_ref(),
            Some(size) => {
                return Err(source.error(
                    at(size.span()),
                    "cluster_size",
                    format!(
                        "{} is fewer than this node and its {} peers",
                        size.get_ref(),
                        peers.len()
                    ),
                ));
            }
        };

        let seeds = match &raw.seeds {
            None => Vec::new(),
            Some(list) if list.get_ref().len() > MAX_SEEDS => {
                return Err(source.error(
                    at(list.span()),
                    "seeds",
                    format!("at most {MAX_SEEDS} seeds"),
                ));
            }
            Some(list) => {
                for (i, seed) in list.get_ref().iter().enumerate() {
                    check_seed(seed).map_err(|reason| {
                        source.error(at(list.span()), format!("seeds[{i}]"), reason)
                    })?;
                }
                list.get_ref().clone()
            }
        };
        let within = |spanned: &Option<Spanned<String>>,
                      field: &str,
                      default: Duration,
                      range: std::ops::RangeInclusive<Duration>| {
            let value = duration(spanned, field, default)?;
            if !range.contains(&value) {
                let span = spanned.as_ref().map_or(0..0, |s| s.span());
                return Err(source.error(
                    at(span),
                    field,
                    format!(
                        "between {:?} and {:?}, got {value:?}",
                        range.start(),
                        range.end()
                    ),
                ));
            }
            Ok(value)
        };
        let seed_refresh = within(
            &raw.seed_refresh,
            "seed_refresh",
            DEFAULT_SEED_REFRESH,
            Duration::from_secs(1)..=Duration::from_secs(3600),
        )?;
        let join_timeout = within(
            &raw.join_timeout,
            "join_timeout",
            DEFAULT_JOIN_TIMEOUT,
            Duration::from_millis(100)..=Duration::from_secs(24 * 3600),
        )?;
        let while_joining = match &raw.while_joining {
            None => WhileJoining::default(),
            Some(w) => WhileJoining::parse(w.get_ref()).ok_or_else(|| {
                source.error(
                    at(w.span()),
                    "while_joining",
                    format!(
                        "`{}` is not one of \"local-share\", \"deny\", \"allow\"",
                        w.get_ref()
                    ),
                )
            })?,
        };

        let tls_raw = raw.tls.get_ref();
        let tls_span = raw.tls.span();
        // `{id}` in a path is the node's id: one file for every pod of a StatefulSet.
        let own = |p: &str| relative(&p.replace("{id}", &id.to_string()));
        let tls = TlsFiles {
            ca: own(&tls_raw.ca),
            cert: own(&tls_raw.cert),
            key: own(&tls_raw.key),
            lines: ["ca", "cert", "key"].map(|key| source.line_of_key(tls_span.clone(), key)),
        };
        for (key, file) in [("ca", &tls.ca), ("cert", &tls.cert), ("key", &tls.key)] {
            if !file.is_file() {
                return Err(source.error(
                    source.line_of_key(tls_span.clone(), key),
                    format!("tls.{key}"),
                    format!(
                        "no file at {} (make them with `ratemesh certs --out DIR --nodes N`)",
                        file.display()
                    ),
                ));
            }
        }

        let policy_file = relative(raw.policy_file.get_ref());
        if !policy_file.is_file() {
            return Err(source.error(
                at(raw.policy_file.span()),
                "policy_file",
                format!("no file at {}", policy_file.display()),
            ));
        }
        let state = state::state(&source, raw.state.as_ref(), id, base)?;
        let proxies = upstreams::proxy_routes(&source, &raw.proxy)?;
        let forward_auth = raw
            .forward_auth
            .as_ref()
            .map(|table| upstreams::forward_auth(&source, table))
            .transpose()?;
        let envoy_rls = raw
            .envoy_rls
            .as_ref()
            .map(|table| envoy_rls::envoy_rls(&source, table, http))
            .transpose()?;
        let admin = raw
            .admin
            .as_ref()
            .map(|table| admin::admin(&source, table, http, base, [&tls.cert, &tls.key]))
            .transpose()?;
        let traces = raw
            .traces
            .as_ref()
            .map(|table| traces::traces(&source, table))
            .transpose()?;
        let (gateway, policy_sha256) = read_policy_file(&policy_file)?;
        if let Some(rls) = &envoy_rls
            && gateway.envoy.domains.is_empty()
        {
            return Err(source.error(
                rls.line,
                "envoy_rls",
                format!(
                    "the policy file {} has no `[[envoy.domains]]`: every request to this port \
                     would be answered NOT_FOUND",
                    policy_file.display()
                ),
            ));
        }

        Ok(NodeFile {
            path: path.to_path_buf(),
            id,
            listen,
            http,
            gossip_interval,
            drain,
            drain_grace,
            http_settings,
            peers,
            cluster_size,
            seeds,
            seed_refresh,
            join_timeout,
            while_joining,
            mesh_max_keys,
            mesh_first_credit,
            mesh_max_wait,
            gossip_budget_bytes_per_s,
            tls,
            policy_file,
            state,
            gateway,
            policy_sha256,
            proxies,
            forward_auth,
            envoy_rls,
            admin,
            traces,
        })
    }

    /// Return the mesh node's configuration: this node, its peers and the `mesh` policies.
    pub fn node_config(&self) -> NodeConfig {
        let members: Vec<NodeId> = std::iter::once(self.id)
            .chain(self.peers.iter().map(|(id, _)| *id))
            .collect();
        let mesh = self.gateway.mesh_policies();
        let policies = mesh.iter().map(|p| p.policy).collect();
        let mut config = NodeConfig::new(self.id, members, policies);
        config.lockouts = mesh
            .iter()
            .map(|p| p.block_for.map_or(0, duration_to_nanos))
            .collect();
        config.calendars = mesh.iter().map(|p| p.calendar.clone()).collect();
        config.cluster_size = self.cluster_size;
        config.max_keys = self.mesh_max_keys;
        config.first_credit = self.mesh_first_credit;
        config.max_wait_ns = duration_to_nanos(self.mesh_max_wait);
        config.gossip_budget_bytes_per_s = self.gossip_budget_bytes_per_s;
        config.gossip_interval_ns = duration_to_nanos(self.gossip_interval);
        // A node with peers or seeds joins a cluster; one with neither is a cluster of one.
        config.joins = !(self.peers.is_empty() && self.seeds.is_empty());
        config.join_timeout_ns = duration_to_nanos(self.join_timeout);
        config.while_joining = self.while_joining;
        config.digest = self.gateway.mesh_digest();
        config
    }

    /// Read the certificates, check that this node's certificate chains to the cluster CA
    /// for its own name and that the key is the certificate's, and build the node's TLS
    /// configurations; an error names the file and the field.
    pub fn load_tls(&self) -> Result<NodeTls, ConfigError> {
        self.tls.load(&self.path, self.id)
    }
}

impl TlsFiles {
    /// Read the bytes of the `[tls]` files (`ca`, `cert`, `key`), to tell whether they
    /// changed.
    pub(crate) fn contents(&self) -> std::io::Result<[Vec<u8>; 3]> {
        Ok([
            std::fs::read(&self.ca)?,
            std::fs::read(&self.cert)?,
            std::fs::read(&self.key)?,
        ])
    }

    /// Read the certificates, check that node `id`'s certificate chains to the cluster CA
    /// for its own name and that the key is the certificate's, and build the node's TLS
    /// configurations; an error names `node_file`, the line and the field.
    pub(crate) fn load(&self, node_file: &Path, id: NodeId) -> Result<NodeTls, ConfigError> {
        let [ca_line, cert_line, key_line] = self.lines;
        let fail = |line: usize, field: &str, reason: String| ConfigError {
            file: node_file.display().to_string(),
            line,
            field: field.to_string(),
            reason,
        };
        let read = |file: &Path, field: &str, line: usize| {
            std::fs::read(file).map_err(|e| fail(line, field, format!("{}: {e}", file.display())))
        };
        let ca = read(&self.ca, "tls.ca", ca_line)?;
        let cert = read(&self.cert, "tls.cert", cert_line)?;
        let key = read(&self.key, "tls.key", key_line)?;
        if !certificate_names_node(&cert, id) {
            return Err(fail(
                cert_line,
                "tls.cert",
                format!(
                    "{} is not the certificate of node {} (it does not name {})",
                    self.cert.display(),
                    id,
                    crate::net::certs::node_name(id)
                ),
            ));
        }
        check_own_certificate(&ca, &cert, &key, id).map_err(|error| match error {
            OwnCertError::NotFromCa { .. } => fail(
                cert_line,
                "tls.cert",
                format!(
                    "{} is not signed by the cluster CA {} ({error}); the peers would refuse \
                     this node. Use the certificate `ratemesh certs` made with that CA",
                    self.cert.display(),
                    self.ca.display()
                ),
            ),
            OwnCertError::KeyMismatch(_) => fail(
                key_line,
                "tls.key",
                format!(
                    "{} is not the key of the certificate {} ({error})",
                    self.key.display(),
                    self.cert.display()
                ),
            ),
            OwnCertError::Pem(_) => fail(
                cert_line,
                "tls",
                format!(
                    "{error} (files {}, {}, {})",
                    self.ca.display(),
                    self.cert.display(),
                    self.key.display()
                ),
            ),
        })?;
        node_tls(&ca, &cert, &key, transport_config()).map_err(|e| {
            fail(
                cert_line,
                "tls",
                format!("the certificates do not make a TLS configuration: {e}"),
            )
        })
    }
}

/// Check that `seed` is a socket address or a DNS name with a port (`host:port`).
fn check_seed(seed: &str) -> Result<(), String> {
    if seed.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let bad = || {
        format!(
            "`{seed}` is not an address or a DNS name with a port; write e.g. \"10.0.0.7:7000\" \
             or \"ratemesh-headless.default.svc:7000\""
        )
    };
    let (host, port) = seed.rsplit_once(':').ok_or_else(bad)?;
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|label| !label.is_empty() && label.len() <= 63)
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    match port.parse::<u16>() {
        Ok(p) if p > 0 && name_ok => Ok(()),
        _ => Err(bad()),
    }
}
