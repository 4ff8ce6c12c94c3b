//! What a request brings to the rules (who asks, for what) and what it takes away (the
//! outcome, with each policy's part for the response headers).

use http::Method;

use crate::clock::Nanos;
use crate::config::IdentitySource;
use crate::decision::Decision;

/// Who is asking: the source that identified the client and its raw value.
///
/// The value may be a secret (an API key): it is only ever hashed, and `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// Which part of the request identified the client.
    pub source: IdentitySource,
    pub(super) value: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Identity({}:<{} bytes>)",
            self.source.name(),
            self.value.len()
        )
    }
}

impl Identity {
    /// Identify a client by `value` taken from `source`.
    pub fn new(source: IdentitySource, value: impl Into<String>) -> Self {
        Identity {
            source,
            value: value.into(),
        }
    }

    /// The name `tenants` uses for this client: `user:alice`, `ip:192.0.2.7`, `device:…`.
    /// API keys are never named in a config file, so they have none.
    pub(super) fn tenant_name(&self) -> Option<String> {
        (self.source != IdentitySource::ApiKey)
            .then(|| format!("{}:{}", self.source.name(), self.value))
    }
}

/// What the rules need to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The client.
    pub identity: &'a Identity,
    /// A tier chosen by an earlier layer (e.g. from the client's plan), else looked up.
    pub tier: Option<&'a str>,
    /// The request method.
    pub method: &'a Method,
    /// The request path (no query).
    pub path: &'a str,
    /// The parts of the request that policies may count by (`by`) and `[access]` reads.
    pub request: RequestParts<'a>,
}

/// The parts of a request beyond its identity: what policies count `by` and what
/// `[access]` reads. A part left out (`None`) is missing to every policy that counts by it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestParts<'a> {
    /// The request's headers.
    pub headers: Option<&'a http::HeaderMap>,
    /// The client's address (the peer, or the forwarded address behind a trusted proxy).
    pub client_ip: Option<std::net::IpAddr>,
    /// The user an earlier authentication layer named.
    pub user: Option<&'a str>,
    /// The query string (after `?`).
    pub query: Option<&'a str>,
    /// The host the request is for.
    pub host: Option<&'a str>,
    /// The claims of the request's verified JWT ([`super::Rules::jwt_claims`]).
    pub claims: Option<&'a super::Claims>,
    /// The request came from one of `[identity] trusted_proxies` (a `tier_from` header is
    /// believed only then).
    pub from_trusted_proxy: bool,
    /// The request's body as read (`json:` and `form:` parts); `None`: not read.
    pub body: Option<&'a [u8]>,
    /// The body parsed as JSON, when it was (else `json:` parts parse `body` themselves);
    /// a body that is not JSON leaves every `json:` part missing.
    pub json: Option<&'a serde_json::Value>,
}

impl<'a> RequestParts<'a> {
    /// A query parameter's value as sent (not decoded; the first of that name); an empty
    /// value is missing.
    pub(crate) fn query_param(&self, name: &str) -> Option<&'a [u8]> {
        self.query?
            .split('&')
            .find_map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                (key == name).then_some(value.as_bytes())
            })
            .filter(|value| !value.is_empty())
    }
}

/// A request lacks a part its policy counts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingPart {
    /// The policy.
    pub policy: &'static str,
    /// The part, as the file spells it (`header:x-account`).
    pub part: &'static str,
}

/// Why a request was refused before any policy counted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It lacks a part that a policy counts by, and the policy says `on_missing =
    /// "refuse"` (answered `400 Bad Request`).
    Missing(MissingPart),
    /// Its address is in `[access] deny` (answered `403 Forbidden`).
    Denied,
    /// A policy counts by a field of its body, which is longer than the route's
    /// `max_body_bytes` (answered `413 Content Too Large`).
    BodyTooLarge {
        /// The route's `max_body_bytes`.
        limit: u64,
    },
    /// A policy counts by a field of its body, which broke off or took longer than 30 s to
    /// arrive (answered `400 Bad Request`).
    BodyIncomplete,
    /// The route prices GraphQL queries (`cost_from = "graphql"`) and refuses this one
    /// (answered `400 Bad Request`, with the computed cost or depth).
    GraphQl(GraphQlRefusal),
}

/// Why a route that prices GraphQL queries refused one, before any counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphQlRefusal {
    /// Its computed cost is above the route's `max_cost`.
    TooCostly {
        /// The computed cost.
        cost: u64,
        /// The route's `max_cost`.
        max_cost: u64,
    },
    /// Its fields nest deeper than the route's `max_depth`.
    TooDeep {
        /// How deep (at least; a document nested past the parser's limit says that limit).
        depth: u32,
        /// The route's `max_depth`.
        max_depth: u32,
    },
    /// It is not a GraphQL request one can price (the reason).
    Invalid(&'static str),
}

/// One policy's part in a decision, for the response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyReport {
    /// The policy's name (kept for the life of the process, so that a report copies it
    /// without writing a count that every thread shares).
    pub name: &'static str,
    /// The name serialized as a structured-field string (with its quotes).
    pub sf_name: &'static str,
    /// Its decision.
    pub decision: Decision,
    /// Its window in whole seconds (a bucket's time to refill from empty), for `w=`.
    pub window_s: u64,
    /// Counted but never denying.
    pub shadow: bool,
    /// The policy's place in the compiled file (`u32::MAX` for none), for its counters.
    pub(crate) index: u32,
    /// The policy's `RateLimit-Policy` item (`"name";q=…;w=…`), formatted once, when it
    /// is this decision's.
    pub(crate) policy_field: Option<http::HeaderValue>,
    /// What a denial by the policy answers, formatted once (on a denial).
    pub(crate) denial_forms: Option<&'static crate::http::forms::DenialForms>,
}

/// The outcome of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Forward the request (shadow denials do not stop it).
    pub allowed: bool,
    /// The request's cost in tokens.
    pub cost: u64,
    /// The matched route, if any.
    pub route: Option<&'static str>,
    /// The enforced policies that were checked, in order; on a denial, the last is the one
    /// that denied.
    pub enforced: Vec<PolicyReport>,
    /// The shadow policies (counted after an admission).
    pub shadow: Vec<PolicyReport>,
    /// When admitted by a shaping policy: nanoseconds to wait before forwarding.
    pub delay_ns: Nanos,
    /// A `redis` policy that fails closed could not reach Redis: the request is refused
    /// because the backend failed, not the client (answer 503, not 429).
    pub backend_unavailable: Option<&'static str>,
    /// Refused before any counting (a missing part, a denied address): not a rate limit.
    pub refused: Option<Refusal>,
    /// Its address is in `[access] exempt`: admitted, no policy counted it.
    pub exempt: bool,
    /// Policies left out because the request lacks a part they count by and they say
    /// `on_missing = "skip"`: (policy, part).
    pub skipped: Vec<MissingPart>,
    /// The charges of `count_when` policies, to settle by the response's status
    /// ([`super::Rules::settle`]).
    pub pending: Vec<Pending>,
}

/// A charge taken before the request ran, kept or given back by its response's status
/// (`count_when`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    pub(super) policy: usize,
    pub(super) key: u64,
    pub(super) charge: crate::local::Charge,
    pub(super) at: Nanos,
    pub(super) cost: u64,
    /// A `redis` policy's: when the call that charged it was sent.
    pub(super) sent: Option<std::time::Instant>,
    /// A `redis` policy's: the route its key carries.
    pub(super) route: Option<&'static str>,
    /// A `mesh` policy's: what its admission took from the node's lease.
    pub(super) mesh: Option<crate::decision::MeshCharge>,
    /// A concurrency policy's slots, held until the response ends.
    pub(super) holds: bool,
}

impl Pending {
    /// Tell whether settling it may give the charge back through IO (a `redis` policy's):
    /// [`Rules::settle`](super::Rules::settle) then returns a future to drive.
    pub fn needs_io(&self) -> bool {
        self.sent.is_some()
    }

    /// Tell whether it holds a concurrency policy's slots, to give back with
    /// [`Rules::release`](super::Rules::release) when the response ends (its body sent, the
    /// client gone, the service failed), not by its status.
    pub fn holds_slots(&self) -> bool {
        self.holds
    }
}

impl Outcome {
    /// Return the enforced policy that denied the request.
    pub fn denied_by(&self) -> Option<&PolicyReport> {
        self.enforced
            .last()
            .filter(|report| !report.decision.is_allowed())
    }

    /// Return the shadow policies that would have denied the request.
    pub fn shadow_denials(&self) -> impl Iterator<Item = &PolicyReport> {
        self.shadow
            .iter()
            .filter(|report| !report.decision.is_allowed())
    }
}
