//! Decisions asked for directly (the node's decision API): one policy, its key made from the
//! attributes the caller names as a request would carry them, so that a direct decision and
//! an HTTP request with the same attributes share one counter.
//!
//! Attributes: `user`, `api_key`, `device`, `ip` (the identity chain's sources, in the
//! file's `[identity] order`; `ip` is also the address `by = ["ip"]` counts), `route` (a
//! route's name: its policies count per route as for a request that matched it), `method`,
//! `path`, `host`, `header:NAME`, `cookie:NAME`, `query:NAME` (strings), `jwt` (the claims,
//! an object: the caller vouches for them), `json` (the body as JSON) and `body` (the body as
//! text, for `form:` parts).

use std::net::IpAddr;

use super::Rules;
use super::compile::Remote;
use super::request::{Identity, RequestFacts, RequestParts};
use crate::backend::exact::{ExactDecision, fail_over};
use crate::clock::Nanos;
use crate::config::IdentitySource;
use crate::decision::Decision;
use crate::local::Charge;

/// The most attributes one direct decision may name.
pub const MAX_ATTRIBUTES: usize = 64;

/// The longest attribute value (a string, or a JSON value's text), in bytes.
pub const MAX_ATTRIBUTE_BYTES: usize = 16 * 1024;

/// Why a direct decision could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectError {
    /// The file has no policy of that name.
    #[error("no policy named `{0}`")]
    UnknownPolicy(String),
    /// The file has no route of that name.
    #[error("no route named `{0}`")]
    UnknownRoute(String),
    /// An attribute that is not one of those listed, or of the wrong kind.
    #[error("attribute `{0}`: {1}")]
    BadAttribute(String, &'static str),
    /// The policy counts by a part the attributes do not give.
    #[error("policy `{policy}` counts by `{part}`, which the attributes do not give")]
    Missing {
        /// The policy.
        policy: String,
        /// The part it counts by.
        part: &'static str,
    },
    /// The policy's `redis` backend could not be reached and the policy fails closed.
    #[error("the Redis backend of policy `{0}` is unavailable")]
    Unavailable(String),
    /// A concurrency policy: its slots are held by a response, which a decision has not.
    #[error(
        "policy `{0}` limits requests in flight: its slots are held until a response ends, which a decision has not"
    )]
    HeldByResponses(String),
}

/// The attributes of a request, as the decision API names them.
pub type Attributes = serde_json::Map<String, serde_json::Value>;

/// A request rebuilt from attributes, owning what [`RequestParts`] borrows.
struct Rebuilt {
    identity: Identity,
    method: http::Method,
    path: String,
    headers: http::HeaderMap,
    query: String,
    host: Option<String>,
    client_ip: Option<IpAddr>,
    claims: Option<super::Claims>,
    json: Option<serde_json::Value>,
    body: Option<Vec<u8>>,
    route: Option<String>,
}

impl Rules {
    /// Decide `cost` tokens of policy `policy` for the key `attributes` name, at `now` (the
    /// rules' clock): a local policy on this node's counters (its lockout too), a `mesh`
    /// policy through the node's lease of the key (waiting for its owner when short), a
    /// `redis` policy in Redis (through its fail mode).
    pub async fn decide_direct(
        &self,
        policy: &str,
        attributes: &Attributes,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, DirectError> {
        if (self.policies.iter()).any(|c| c.name == policy && c.named.max_hold.is_some()) {
            return Err(DirectError::HeldByResponses(policy.to_string()));
        }
        let (p, route, key) = self.direct_address(policy, attributes)?;
        let compiled = &self.policies[p];
        let capacity = compiled.named.policy.capacity();
        if cost > capacity {
            return Ok(Decision::cannot_fit(capacity));
        }
        let decision = match compiled.remote {
            None => {
                if let Some(left) = compiled.lockouts.as_ref().and_then(|l| l.left(key, now)) {
                    Decision::denied(capacity, 0, left, left)
                } else {
                    let mut charge = Charge::Key;
                    let mut decision = compiled.decide_local(key, now, cost, true, &mut charge);
                    if !decision.is_allowed()
                        && let Some(left) =
                            compiled.lockouts.as_ref().and_then(|l| l.lock(key, now))
                    {
                        decision.retry_after_ns = decision.retry_after_ns.max(left);
                        decision.reset_after_ns = decision.reset_after_ns.max(left);
                    }
                    decision
                }
            }
            Some(Remote::Mesh(number)) => match self.mesh.as_ref() {
                Some(mesh) => mesh.decide(number, key, cost).await,
                None => return Err(DirectError::Unavailable(policy.to_string())),
            },
            Some(Remote::Exact(number)) => {
                let Some(exact) = self.exact.as_ref() else {
                    return Err(DirectError::Unavailable(policy.to_string()));
                };
                let route_name = self.exact_route(route, p);
                let answer = exact.decide(number, key, route_name, cost).await;
                let at = compiled.local_now(now);
                let fallback = || compiled.store.decide(&key, at, cost);
                match fail_over(
                    compiled.name,
                    compiled.named.fail_mode,
                    answer.map(|a| a.decision),
                    fallback,
                ) {
                    ExactDecision::Exact(d) | ExactDecision::Fallback(d) => d,
                    ExactDecision::Unavailable => {
                        return Err(DirectError::Unavailable(policy.to_string()));
                    }
                }
            }
        };
        compiled.top.note(key, decision.is_allowed(), now);
        self.count(&compiled.report(decision));
        Ok(decision)
    }

    /// Policy `policy`'s index, the route the attributes name, and the key a request with
    /// them gets.
    pub(super) fn direct_address(
        &self,
        policy: &str,
        attributes: &Attributes,
    ) -> Result<(usize, Option<usize>, u64), DirectError> {
        let p = self
            .policies
            .iter()
            .position(|c| c.name == policy)
            .ok_or_else(|| DirectError::UnknownPolicy(policy.to_string()))?;
        let rebuilt = self.rebuild(attributes)?;
        let route = match &rebuilt.route {
            None => None,
            Some(name) => Some(
                self.routes
                    .iter()
                    .position(|r| r.name == name)
                    .ok_or_else(|| DirectError::UnknownRoute(name.clone()))?,
            ),
        };
        let key = self.direct_key(p, route, &rebuilt)?;
        Ok((p, route, key))
    }

    /// The key of policy `p` for `rebuilt` (under `route`, when given), as a request with
    /// the same parts gets it.
    fn direct_key(
        &self,
        p: usize,
        route: Option<usize>,
        rebuilt: &Rebuilt,
    ) -> Result<u64, DirectError> {
        let route = route.map(|r| &self.routes[r]);
        let facts = RequestFacts {
            identity: &rebuilt.identity,
            tier: None,
            method: &rebuilt.method,
            path: &rebuilt.path,
            request: RequestParts {
                headers: Some(&rebuilt.headers),
                client_ip: rebuilt.client_ip,
                user: None,
                query: Some(&rebuilt.query),
                host: rebuilt.host.as_deref(),
                claims: rebuilt.claims.as_ref(),
                from_trusted_proxy: false,
                body: rebuilt.body.as_deref(),
                json: rebuilt.json.as_ref(),
            },
        };
        if let Some(model) = &self.models[p] {
            return model
                .key(&facts, route.map(|r| r.name), &self.config.identity)
                .map_err(|part| DirectError::Missing {
                    policy: self.policies[p].name.to_string(),
                    part,
                });
        }
        // The identity chain's key, per route for the route's own policies.
        if rebuilt.identity.value.is_empty() {
            return Err(DirectError::Missing {
                policy: self.policies[p].name.to_string(),
                part: "client",
            });
        }
        let prefix = &self.client_keys[super::client_keys_slot(rebuilt.identity.source)];
        let value = rebuilt.identity.value.as_bytes();
        let via_route = route.filter(|r| {
            [
                &r.layers.enforced,
                &r.layers.shadow,
                &r.layers.global,
                &r.layers.exact,
            ]
            .into_iter()
            .any(|layer| layer.contains(&p))
        });
        Ok(match via_route {
            Some(r) => prefix.key(&[value, r.name.as_bytes()]),
            None => prefix.key(&[value]),
        })
    }

    /// Read `attributes` into a request's parts.
    fn rebuild(&self, attributes: &Attributes) -> Result<Rebuilt, DirectError> {
        if attributes.len() > MAX_ATTRIBUTES {
            return Err(DirectError::BadAttribute(
                format!("({} of them)", attributes.len()),
                "at most 64 attributes",
            ));
        }
        let mut rebuilt = Rebuilt {
            identity: Identity::new(IdentitySource::Ip, ""),
            method: http::Method::GET,
            path: "/".to_string(),
            headers: http::HeaderMap::new(),
            query: String::new(),
            host: None,
            client_ip: None,
            claims: None,
            json: None,
            body: None,
            route: None,
        };
        let mut query = form_urlencoded::Serializer::new(String::new());
        let mut cookies = Vec::new();
        let mut sources: Vec<(IdentitySource, String)> = Vec::new();
        for (name, value) in attributes {
            let bad = |why: &'static str| DirectError::BadAttribute(name.clone(), why);
            let text = || -> Result<&str, DirectError> {
                let text = value.as_str().ok_or_else(|| bad("a string"))?;
                if text.len() > MAX_ATTRIBUTE_BYTES {
                    return Err(bad("at most 16 KiB"));
                }
                Ok(text)
            };
            match name.as_str() {
                "user" | "api_key" | "device" => {
                    let source = match name.as_str() {
                        "user" => IdentitySource::User,
                        "api_key" => IdentitySource::ApiKey,
                        _ => IdentitySource::Device,
                    };
                    sources.push((source, text()?.to_string()));
                }
                "ip" => {
                    let ip: IpAddr = text()?.parse().map_err(|_| bad("an IP address"))?;
                    rebuilt.client_ip = Some(ip);
                    let grouped = super::address_text(ip, self.config.identity.prefixes);
                    sources.push((IdentitySource::Ip, grouped));
                }
                "route" => rebuilt.route = Some(text()?.to_string()),
                "method" => {
                    rebuilt.method = text()?.parse().map_err(|_| bad("an HTTP method"))?;
                }
                "path" => rebuilt.path = text()?.to_string(),
                "host" => rebuilt.host = Some(text()?.to_ascii_lowercase()),
                "jwt" => {
                    let claims = value
                        .as_object()
                        .ok_or_else(|| bad("an object of claims"))?;
                    if value.to_string().len() > MAX_ATTRIBUTE_BYTES {
                        return Err(bad("at most 16 KiB"));
                    }
                    rebuilt.claims = Some(claims.clone());
                }
                "json" => {
                    let text = value.to_string();
                    if text.len() > MAX_ATTRIBUTE_BYTES {
                        return Err(bad("at most 16 KiB"));
                    }
                    rebuilt.body = Some(text.into_bytes());
                    rebuilt.json = Some(value.clone());
                }
                "body" => rebuilt.body = Some(text()?.as_bytes().to_vec()),
                other => {
                    let (kind, part) = other
                        .split_once(':')
                        .ok_or_else(|| bad("not an attribute"))?;
                    let value = text()?;
                    match kind {
                        "header" => {
                            let header = http::HeaderName::from_bytes(part.as_bytes())
                                .map_err(|_| bad("not a header name"))?;
                            let value = http::HeaderValue::from_str(value)
                                .map_err(|_| bad("not a header value"))?;
                            rebuilt.headers.append(header, value);
                        }
                        "cookie" => cookies.push(format!("{part}={value}")),
                        "query" => {
                            query.append_pair(part, value);
                        }
                        _ => return Err(bad("not an attribute")),
                    }
                }
            }
        }
        if !cookies.is_empty() {
            let value = http::HeaderValue::from_str(&cookies.join("; "))
                .map_err(|_| DirectError::BadAttribute("cookie".into(), "not a cookie value"))?;
            rebuilt.headers.append(http::header::COOKIE, value);
        }
        rebuilt.query = query.finish();
        // The client is the first source of the file's order the attributes give.
        if let Some((source, value)) = self
            .config
            .identity
            .order
            .iter()
            .find_map(|wanted| sources.iter().find(|(s, _)| s == wanted))
        {
            rebuilt.identity = Identity::new(*source, value.as_str());
        }
        Ok(rebuilt)
    }
}
