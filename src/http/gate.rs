//! One request through the layer, in two steps: matched once against the rules in force
//! ([`Gate::plan`] → [`Matched`]: who asks, and the policies to charge), then charged and
//! answered ([`Gate::pass`], which consumes the match). The tower service takes both steps
//! at once; a node takes the first where it routes a request and the second where it
//! answers it, so that a request is matched once on its way through.
//!
//! A request whose policies are all local is charged in `pass` itself, from the request as
//! it stands, and handed on at once; only one that passes a `mesh` or `redis` policy is
//! decided in the future that `pass` returns, which then holds the match (numbers and keys)
//! and no part of the request.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use axum::body::{Body, Bytes, HttpBody};
use http::{Request, Response, StatusCode};

use crate::clock::Clock;
use crate::http::answer::{DenialHook, denial, identity_too_long, with_fields};
use crate::http::identity::{AuthenticatedUser, ClientTier, IdentityTooLong, client_ip, identify};
use crate::http::slots::{Held, HoldingBody};
use crate::rules::{
    Claims, GraphQlRefusal, Identity, Outcome, Planned, Refusal, RequestFacts, RequestParts, Rules,
};

/// What the layer's clones and services share: the rules in force, the clock, and how the
/// layer answers.
pub(crate) struct Gate {
    pub(super) rules: ArcSwap<Rules>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) on_denied: Option<DenialHook>,
    pub(super) max_identity_bytes: usize,
    /// What requests' keys in clear are remembered for `/v1/top`, if any.
    #[cfg(feature = "node")]
    pub(super) show_identities: Option<Arc<crate::rules::identities::ShowIdentities>>,
}

impl Gate {
    /// A gate of `rules` on `clock`, with the defaults.
    pub(super) fn new(rules: Rules, clock: Arc<dyn Clock>) -> Gate {
        Gate {
            rules: ArcSwap::from_pointee(rules),
            clock,
            on_denied: None,
            max_identity_bytes: crate::http::identity::DEFAULT_MAX_IDENTITY_BYTES,
            #[cfg(feature = "node")]
            show_identities: None,
        }
    }
}

/// One request matched against the rules in force, once: who asks and what the rules make
/// of it, with the rules that matched it (which charge it). Spent by [`Gate::pass`].
pub(crate) struct Matched {
    rules: Guard<Arc<Rules>>,
    /// The client and the policies to charge, or the identity that is too long to use.
    matched: Result<(Identity, Planned), IdentityTooLong>,
    /// The answer is the protected service's: `count_when` charges are settled by its
    /// status (not for a forward-auth check, whose answer goes to another gateway).
    settle: bool,
    /// The connection's address, to match the request again once its body is read.
    peer: Option<IpAddr>,
}

impl Matched {
    /// Tell whether deciding this request may wait for IO (a `mesh` or `redis` policy of
    /// its own).
    #[cfg(all(test, feature = "node"))]
    pub(crate) fn needs_io(&self) -> bool {
        self.matched
            .as_ref()
            .is_ok_and(|(_, planned)| planned.needs_io())
    }

    /// Say what this request is charged, by name (for a trace).
    #[cfg(feature = "otel")]
    pub(crate) fn summary(&self) -> crate::rules::PlanSummary {
        self.matched
            .as_ref()
            .map(|(_, planned)| self.rules.summary(planned))
            .unwrap_or_default()
    }

    /// The same match for a request whose answer the protected service never gives (a
    /// forward-auth check): its `count_when` charges are kept.
    #[cfg(feature = "node")]
    pub(crate) fn outcome_unseen(self) -> Matched {
        Matched {
            settle: false,
            ..self
        }
    }

    /// The same match, holding its rules for a wait before the charge (a request body
    /// read first) without keeping one of this thread's few quick loans of them.
    #[cfg(feature = "node")]
    pub(crate) fn kept(self) -> Matched {
        Matched {
            rules: Guard::from_inner(Guard::into_inner(self.rules)),
            ..self
        }
    }
}

/// A boxed response future of the layer.
pub(crate) type Responding<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl Gate {
    /// The rules in force, borrowed for a moment: unlike [`ArcSwap::load_full`], no count
    /// shared by every thread is written (a thread of its own holds the loan), so threads
    /// deciding at once do not take turns over one cache line.
    pub(crate) fn rules_now(&self) -> Guard<Arc<Rules>> {
        self.rules.load()
    }

    /// Match `request` from `peer` (the connection's address, when known) against `rules`
    /// (the rules in force, as [`Gate::rules_now`] lent them): identify the client, read
    /// what the rules read of the request, and plan its policies.
    pub(crate) fn plan<B>(
        &self,
        rules: Guard<Arc<Rules>>,
        request: &Request<B>,
        peer: Option<IpAddr>,
    ) -> Matched {
        self.plan_with(rules, request, peer, None)
    }

    /// [`Gate::plan`], with the request's body as read (`None`: not read yet).
    fn plan_with<B>(
        &self,
        rules: Guard<Arc<Rules>>,
        request: &Request<B>,
        peer: Option<IpAddr>,
        body: Option<(&[u8], Option<&serde_json::Value>)>,
    ) -> Matched {
        let identified = identify(
            request.headers(),
            request.extensions(),
            peer,
            rules.identity_config(),
            self.max_identity_bytes,
        );
        let matched = identified.map(|identity| {
            let claims = rules.jwt_claims(request.headers());
            let mut facts = RequestFacts {
                identity: &identity,
                tier: request
                    .extensions()
                    .get::<ClientTier>()
                    .map(|t| t.0.as_str()),
                method: request.method(),
                path: request.uri().path(),
                request: request_parts(request, &rules, claims.as_ref(), peer),
            };
            if let Some((body, json)) = body {
                facts.request.body = Some(body);
                facts.request.json = json;
            }
            let planned = rules.plan(&facts);
            #[cfg(feature = "node")]
            if let (Some(show), Planned::Charge(plan)) = (&self.show_identities, &planned) {
                rules.remember_identities(&facts, plan, show);
            }
            (identity, planned)
        });
        Matched {
            rules,
            matched,
            settle: true,
            peer,
        }
    }

    /// Charge the request `matched` describes and answer it: a denial, or `inner`'s answer
    /// to `request` with the `RateLimit` fields (after a shaping policy's delay).
    pub(crate) fn pass<B, F, Fut, ResBody, E>(
        self: &Arc<Self>,
        matched: Matched,
        request: Request<B>,
        inner: F,
    ) -> Responding<E>
    where
        F: FnOnce(Request<B>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Response<ResBody>, E>> + Send + 'static,
        B: Send + 'static,
        E: Send + 'static,
        ResBody: HttpBody<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<axum::BoxError>,
    {
        let Matched {
            rules,
            matched,
            settle,
            peer,
        } = matched;
        // Whether the answer is the protected service's (not a forward-auth check's).
        let seen = settle;
        let (identity, planned) = match matched {
            Ok(matched) => matched,
            Err(too_long) => return Box::pin(std::future::ready(Ok(identity_too_long(&too_long)))),
        };
        if let Planned::ReadBody(limit) = planned {
            // A policy counts by a field of the body: read it (up to the route's limit), match
            // the request again with it, and pass it on with the same bytes.
            let gate = Arc::clone(self);
            let rules = Guard::into_inner(rules);
            return Box::pin(async move {
                let (request, body) = match read_body(request, limit).await {
                    Ok(read) => read,
                    Err(refusal) => {
                        let outcome =
                            rules.charge(Planned::Before(Some(refusal)), gate.clock.now_ns());
                        record(&outcome, &rules, &identity);
                        let legacy = rules.config().legacy_headers;
                        return Ok(denial(&outcome, gate.on_denied.as_ref(), legacy));
                    }
                };
                let json = if rules.reads_json() {
                    serde_json::from_slice::<serde_json::Value>(&body).ok()
                } else {
                    None
                };
                let again = gate.plan_with(
                    Guard::from_inner(rules),
                    &request,
                    peer,
                    Some((&body, json.as_ref())),
                );
                let again = Matched { settle, ..again };
                gate.pass(again, request, inner).await
            });
        }
        let now = self.clock.now_ns();
        if !planned.needs_io() {
            // Decided now, and handed on at once unless a shaping policy delays it: the
            // future holds no part of the request, so the connection's read buffer is free
            // for the next one.
            let outcome = rules.charge(planned, now);
            record(&outcome, &rules, &identity);
            let legacy = rules.config().legacy_headers;
            if !outcome.allowed {
                let answer = denial(&outcome, self.on_denied.as_ref(), legacy);
                return Box::pin(std::future::ready(Ok(answer)));
            }
            // Kept across the call only to settle `count_when` charges by the response and
            // give concurrency slots back at its end.
            let settle = (!outcome.pending.is_empty()).then(|| Guard::into_inner(rules));
            if outcome.delay_ns == 0 && settle.is_none() {
                let forwarded = inner(request);
                return Box::pin(async move {
                    let response = forwarded.await?;
                    Ok(with_fields(response, &outcome, legacy))
                });
            }
            let after = After::new(settle, seen, &self.clock, &outcome);
            return Box::pin(answered(outcome, after, legacy, inner, request));
        }
        let gate = Arc::clone(self);
        let rules = Guard::into_inner(rules);
        Box::pin(async move {
            let outcome = rules.charge_io(planned, now).await;
            record(&outcome, &rules, &identity);
            let legacy = rules.config().legacy_headers;
            if !outcome.allowed {
                return Ok(denial(&outcome, gate.on_denied.as_ref(), legacy));
            }
            let settle = (!outcome.pending.is_empty()).then_some(rules);
            let after = After::new(settle, seen, &gate.clock, &outcome);
            answered(outcome, after, legacy, inner, request).await
        })
    }
}

/// What happens to an admitted request's pending charges once it is answered: the rules
/// that charged them, whether the answer is the protected service's, and the concurrency
/// slots it holds (taken as soon as it is admitted: dropped with the answer's future, even
/// one never polled or still in a shaping delay, they go back).
struct After {
    rules: Option<Arc<Rules>>,
    seen: bool,
    held: Option<Held>,
}

impl After {
    fn new(
        rules: Option<Arc<Rules>>,
        seen: bool,
        clock: &Arc<dyn Clock>,
        outcome: &Outcome,
    ) -> After {
        let held = rules
            .as_ref()
            .and_then(|rules| Held::of(outcome, rules, clock));
        After { rules, seen, held }
    }
}

/// `inner`'s answer to an admitted `request`: after the shaping delay, with the `RateLimit`
/// fields; its `count_when` charges settled by its status, and its concurrency slots held
/// until its body ends, when the answer is the protected service's. A forward-auth check's
/// answer goes to another gateway: its `count_when` charges are kept, and its slots are
/// held only while it is made.
async fn answered<B, F, Fut, ResBody, E>(
    outcome: Outcome,
    after: After,
    legacy: bool,
    inner: F,
    request: Request<B>,
) -> Result<Response<Body>, E>
where
    F: FnOnce(Request<B>) -> Fut,
    Fut: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    if outcome.delay_ns > 0 {
        tokio::time::sleep(Duration::from_nanos(outcome.delay_ns)).await;
    }
    let response = inner(request).await?;
    if let Some(rules) = after.rules.filter(|_| after.seen) {
        settle_by(rules, &outcome, response.status());
    }
    let response = with_fields(response, &outcome, legacy);
    Ok(match after.held.filter(|_| after.seen) {
        Some(held) => response.map(|body| HoldingBody::wrap(body, held)),
        None => response,
    })
}

/// How long a body read for its fields may take to arrive.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Read `request`'s body, up to `limit` bytes, and put the same bytes back in its place: the
/// request and the bytes, or why not (longer than `limit`; broken off, or slower than
/// [`BODY_READ_TIMEOUT`]). A body of a kind the layer cannot put back (not
/// [`axum::body::Body`]) is left unread and reads as empty (its fields are missing).
async fn read_body<B: Send + 'static>(
    request: Request<B>,
    limit: u64,
) -> Result<(Request<B>, Bytes), Refusal> {
    use std::any::Any;
    let (parts, body) = request.into_parts();
    let mut slot = Some(body);
    let Some(taken) = (&mut slot as &mut dyn Any)
        .downcast_mut::<Option<Body>>()
        .and_then(Option::take)
    else {
        let body = match slot {
            Some(body) => body,
            None => return Err(Refusal::BodyIncomplete),
        };
        return Ok((Request::from_parts(parts, body), Bytes::new()));
    };
    let limited = http_body_util::Limited::new(taken, usize::try_from(limit).unwrap_or(usize::MAX));
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, http_body_util::BodyExt::collect(limited));
    let bytes = match read.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
            return Err(Refusal::BodyTooLarge { limit });
        }
        Ok(Err(_)) | Err(_) => return Err(Refusal::BodyIncomplete),
    };
    let mut slot: Option<B> = None;
    if let Some(put) = (&mut slot as &mut dyn Any).downcast_mut::<Option<Body>>() {
        *put = Some(Body::from(bytes.clone()));
    }
    match slot {
        Some(body) => Ok((Request::from_parts(parts, body), bytes)),
        None => Err(Refusal::BodyIncomplete),
    }
}

/// The parts of `request` that `rules` read beyond its identity (none, for rules that count
/// only by the identity chain and list no addresses), with the claims of its verified JWT.
fn request_parts<'a, B>(
    request: &'a Request<B>,
    rules: &Rules,
    claims: Option<&'a Claims>,
    peer: Option<IpAddr>,
) -> RequestParts<'a> {
    let mut parts = RequestParts {
        claims,
        ..RequestParts::default()
    };
    let config = rules.identity_config();
    if rules.reads_address() {
        parts.client_ip = client_ip(request.headers(), peer, &config.trusted_proxies);
    }
    if rules.reads_request() {
        parts.from_trusted_proxy =
            peer.is_some_and(|peer| config.trusted_proxies.iter().any(|net| net.contains(&peer)));
        parts.headers = Some(request.headers());
        parts.user = request
            .extensions()
            .get::<AuthenticatedUser>()
            .map(|user| user.0.as_str());
        parts.query = request.uri().query();
        parts.host = request.uri().host().or_else(|| {
            request
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| {
                    h.rsplit_once(':')
                        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
                        .map_or(h, |(host, _)| host)
                })
        });
    }
    parts
}

/// Keep or give back each `count_when` charge of `outcome` by the response's status: a local
/// policy's at once, a `redis` policy's in a task of its own (the response does not wait).
fn settle_by(rules: Arc<Rules>, outcome: &Outcome, status: StatusCode) {
    let status = status.as_u16();
    for pending in outcome.pending.iter().filter(|p| !p.holds_slots()) {
        if !pending.needs_io() {
            let _ = rules.settle(pending, status);
            continue;
        }
        let (rules, pending) = (Arc::clone(&rules), *pending);
        tokio::spawn(async move {
            if let Some(refund) = rules.settle(&pending, status) {
                // A failure is counted and logged where it happened.
                let _ = refund.await;
            }
        });
    }
}

/// Count decisions by policy and outcome (never by client), and log shadow denials with a
/// secret-free label of the client.
fn record(outcome: &Outcome, rules: &Rules, identity: &Identity) {
    for report in outcome.enforced.iter().chain(&outcome.shadow) {
        rules.count(report);
    }
    match outcome.refused {
        Some(Refusal::Missing(_)) => {
            metrics::counter!("ratemesh_requests_refused_total", "reason" => "missing_part")
                .increment(1);
        }
        Some(Refusal::Denied) => {
            metrics::counter!("ratemesh_requests_refused_total", "reason" => "access_denied")
                .increment(1);
        }
        Some(Refusal::BodyTooLarge { .. }) => {
            metrics::counter!("ratemesh_requests_refused_total", "reason" => "body_too_large")
                .increment(1);
        }
        Some(Refusal::BodyIncomplete) => {
            metrics::counter!("ratemesh_requests_refused_total", "reason" => "body_incomplete")
                .increment(1);
        }
        Some(Refusal::GraphQl(refusal)) => {
            let reason = match refusal {
                GraphQlRefusal::TooCostly { .. } => "graphql_too_costly",
                GraphQlRefusal::TooDeep { .. } => "graphql_too_deep",
                GraphQlRefusal::Invalid(_) => "graphql_invalid",
            };
            metrics::counter!("ratemesh_requests_refused_total", "reason" => reason).increment(1);
        }
        None => {}
    }
    if outcome.exempt {
        metrics::counter!("ratemesh_requests_exempt_total").increment(1);
    }
    for skipped in &outcome.skipped {
        metrics::counter!("ratemesh_policy_skipped_total", "policy" => skipped.policy, "part" => skipped.part)
            .increment(1);
    }
    if let Some(denial) = outcome.denied_by() {
        tracing::debug!(client = %rules.client_label(identity), policy = %denial.name, "rate limited");
    }
    for report in outcome.shadow_denials() {
        tracing::info!(client = %rules.client_label(identity), policy = %report.name, "shadow policy would deny");
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use tower::{Layer, Service};

    use super::*;
    use crate::backend::mesh::{GlobalLimits, MeshDecision};
    use crate::config::GatewayConfig;
    use crate::decision::Decision;
    use crate::http::RateLimitLayer;

    /// A mesh whose lease always has room.
    struct Roomy;

    impl GlobalLimits for Roomy {
        fn decide(&self, _: u32, _: u64, _: u64) -> MeshDecision {
            MeshDecision::Ready(Some(Decision::allowed(100, 99, 0).into()))
        }
    }

    /// An inner service that counts the requests handed to it, as they are handed.
    #[derive(Clone)]
    struct Counting(Arc<AtomicUsize>);

    impl Service<Request<Body>> for Counting {
        type Response = Response<Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Body>) -> Self::Future {
            self.0.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Ok(Response::new(Body::empty())))
        }
    }

    fn get(path: &str) -> Request<Body> {
        Request::builder()
            .uri(path)
            .header("x-api-key", "k")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn a_request_whose_policies_are_local_is_handed_on_at_once_beside_a_mesh_route() {
        let file = "key_secret = \"s\"\ndefault_tier = \"api\"\n\
            [policies.local]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1h\"\nburst = 5\n\
            [policies.global]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1s\"\nbackend = \"mesh\"\n\
            [tiers.api]\npolicies = [\"local\"]\n\
            [[routes]]\nname = \"global\"\npath_prefix = \"/global\"\npolicies = [\"global\"]\n";
        let config = GatewayConfig::from_toml_str(file, "test.toml").unwrap();
        let layer = RateLimitLayer::with_mesh(config, Arc::new(Roomy)).unwrap();
        let handed = Arc::new(AtomicUsize::new(0));
        let mut service = layer.layer(Counting(Arc::clone(&handed)));

        // Decided in `call` itself, and handed on before its future is polled.
        let local = service.call(get("/orders"));
        assert_eq!(handed.load(Ordering::Relaxed), 1);
        // A request with a mesh policy is decided when its future runs.
        let global = service.call(get("/global"));
        assert_eq!(handed.load(Ordering::Relaxed), 1);

        let (local, global) = (local.await.unwrap(), global.await.unwrap());
        assert_eq!(handed.load(Ordering::Relaxed), 2);
        assert_eq!(
            (local.status().as_u16(), global.status().as_u16()),
            (200, 200)
        );
        let field = |response: &Response<Body>| response.headers()["ratelimit-policy"].clone();
        assert!(field(&local).to_str().unwrap().contains("\"local\""));
        assert!(field(&global).to_str().unwrap().contains("\"local\""));
    }
}
