//! The node's HTTP service. Each request is routed once, as its head arrives
//! ([`App::route`]): `/health` and `/metrics`, a `[forward_auth]` check (rewritten to the
//! request it asks about) or the gateway; the `[[proxy]]` route its path is under; whether
//! its connection comes from a trusted proxy; and, under the rules in force, the policies it
//! passes and whether deciding it needs IO ([`crate::http::Matched`]). The [`Route`] is then
//! handed down: the server streams or reads the body by it, and [`App::answer`] charges the
//! policies and gives the admitted request to the check's `200` or to the gateway, with its
//! upstream. No service below matches the request again, or holds the rate-limit layer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use http::Request;

use crate::daemon::forward_auth::{self, CheckError, Checks};
use crate::daemon::proxy::{Gateway, Hop, Proxy};
use crate::http::{Gate, Matched, RateLimitLayer, Responding};

#[cfg(feature = "otel")]
pub(crate) mod traces;

/// What [`App::answer`] returns.
pub(crate) type AppFuture = Responding<Infallible>;

/// The node's HTTP service: `/health` and `/metrics` through their axum router, every other
/// path through the policies to a check's answer or the gateway.
#[derive(Clone)]
pub(crate) struct App {
    own: Router,
    /// The policies in force and how the layer answers.
    gate: Arc<Gate>,
    checks: Option<Checks>,
    gateway: Gateway,
    /// Where request spans go (`[traces]`).
    #[cfg(feature = "otel")]
    traces: Option<Arc<traces::Traces>>,
}

/// One request as [`App::route`] routed it: who answers it, and where it goes.
pub(crate) struct Route {
    to: Target,
    /// The `[[proxy]]` route its path is under (its body streams, whoever answers it), its
    /// peer, and whether that is a trusted proxy (not looked up for the node's own paths).
    hop: Hop,
}

/// Who answers a request.
enum Target {
    /// `/health` or `/metrics`: the node itself, uncounted.
    Own,
    /// A `[forward_auth]` check, matched as the request it asks about: `200` or the denial.
    Check(Matched),
    /// A check whose forwarding fields cannot be read (400 or 431).
    BadCheck(CheckError),
    /// The gateway: matched, then sent on as the route's hop says.
    Gateway(Matched),
}

impl Route {
    /// Tell whether deciding the request may wait for IO (a `mesh` or `redis` policy of its
    /// own); an answer that counts nothing never does.
    #[cfg(test)]
    fn needs_io(&self) -> bool {
        match &self.to {
            Target::Check(matched) | Target::Gateway(matched) => matched.needs_io(),
            Target::Own | Target::BadCheck(_) => false,
        }
    }

    /// The same route, holding its rules for a wait before the answer (a request body read
    /// first).
    pub(crate) fn kept(self) -> Route {
        let to = match self.to {
            Target::Check(matched) => Target::Check(matched.kept()),
            Target::Gateway(matched) => Target::Gateway(matched.kept()),
            other => other,
        };
        Route { to, ..self }
    }
}

impl App {
    /// Serve `own` (`/health`, `/metrics`), forward-auth checks by `checks`, and the
    /// gateway to `proxy`'s routes, all under `layer`'s policies.
    pub(crate) fn new(
        own: Router,
        layer: &RateLimitLayer,
        checks: Option<Checks>,
        proxy: Arc<Proxy>,
    ) -> App {
        App {
            own,
            gate: Arc::clone(layer.gate()),
            checks,
            gateway: Gateway::new(proxy),
            #[cfg(feature = "otel")]
            traces: None,
        }
    }

    /// The same app, tracing its requests into `traces`.
    #[cfg(feature = "otel")]
    pub(crate) fn with_traces(self, traces: Arc<traces::Traces>) -> App {
        App {
            traces: Some(traces),
            ..self
        }
    }

    /// The same app for one HTTP thread: what a request clones (the gateway) is that
    /// thread's own, so that threads do not take turns over the cache lines of shared
    /// counts, request after request.
    pub(crate) fn for_thread(&self) -> App {
        App {
            gateway: self.gateway.for_thread(),
            ..self.clone()
        }
    }

    /// Route `request` from `peer`, once (a check is rewritten, in place, to the request it
    /// asks about).
    pub(crate) fn route<B>(&self, request: &mut Request<B>, peer: SocketAddr) -> Route {
        let path = request.uri().path();
        let mut hop = Hop {
            upstream: self.gateway.proxy().upstream_of(path),
            peer: peer.ip(),
            trusted: false,
        };
        if matches!(path, "/health" | "/metrics") {
            return Route {
                to: Target::Own,
                hop,
            };
        }
        let rules = self.gate.rules_now();
        hop.trusted = rules
            .identity_config()
            .trusted_proxies
            .iter()
            .any(|net| net.contains(&hop.peer));
        let to = match &self.checks {
            Some(checks) if checks.takes(path) => match checks.target(request, peer, hop.trusted) {
                Ok(()) => Target::Check(
                    self.gate
                        .plan(rules, request, Some(hop.peer))
                        .outcome_unseen(),
                ),
                Err(error) => Target::BadCheck(error),
            },
            _ => Target::Gateway(self.gate.plan(rules, request, Some(hop.peer))),
        };
        Route { to, hop }
    }

    /// When `route`'s body streams to its upstream: the route's limit on it (`None`: no
    /// limit); `None` when the body is read first.
    pub(crate) fn streamed(&self, route: &Route) -> Option<Option<u64>> {
        route
            .hop
            .upstream
            .map(|upstream| self.gateway.proxy().max_body_bytes(upstream))
    }

    /// Answer `request` as `route` says.
    pub(crate) fn answer(&self, route: Route, request: Request<Body>) -> AppFuture {
        #[cfg(feature = "otel")]
        if let Some(traces) = &self.traces {
            return self.answer_traced(traces, route, request);
        }
        self.answer_plain(route, request)
    }

    /// [`App::answer`] without spans.
    fn answer_plain(&self, route: Route, request: Request<Body>) -> AppFuture {
        match route.to {
            Target::Own => {
                let mut own = self.own.clone();
                Box::pin(async move { tower::Service::call(&mut own, request).await })
            }
            Target::BadCheck(error) => Box::pin(std::future::ready(Ok(Checks::refuse(&error)))),
            Target::Check(matched) => Checks::answer(
                self.gate
                    .pass(matched, request, |_| forward_auth::admitted()),
            ),
            Target::Gateway(matched) => {
                let (gateway, hop) = (self.gateway.clone(), route.hop);
                self.gate.pass(matched, request, move |request| {
                    gateway.forward(request, hop)
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use super::*;
    use crate::backend::mesh::{GlobalLimits, MeshDecision};
    use crate::config::GatewayConfig;
    use crate::daemon::node_file::{ForwardAuth, Forwarded, ProxyRoute};
    use crate::decision::Decision;
    use crate::rules::plans_made;

    /// A mesh whose owners never answer: every request with a mesh policy waits.
    #[derive(Default)]
    struct Silent(Mutex<Vec<tokio::sync::oneshot::Sender<crate::backend::mesh::MeshAnswer>>>);

    impl GlobalLimits for Silent {
        fn decide(&self, _: u32, _: u64, _: u64) -> MeshDecision {
            let (answer, waiting) = tokio::sync::oneshot::channel();
            self.0.lock().unwrap().push(answer);
            MeshDecision::Waiting {
                answer: waiting,
                fallback: Decision::cannot_fit(0),
            }
        }
    }

    /// A local policy for every client, a mesh policy on `/global`; checks trusted from
    /// 127.0.0.2.
    const FILE: &str = "key_secret = \"s\"\ndefault_tier = \"api\"\n\
        [identity]\norder = [\"api_key\", \"ip\"]\ntrusted_proxies = [\"127.0.0.2\"]\n\
        [policies.local]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1h\"\nburst = 100\n\
        [policies.global]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1s\"\nbackend = \"mesh\"\n\
        [tiers.api]\npolicies = [\"local\"]\n\
        [[routes]]\nname = \"global\"\npath_prefix = \"/global\"\npolicies = [\"global\"]\n";

    /// A node's app: `[forward_auth]` at `/v1/check`, a proxy route `/api` (to a port that
    /// nothing here calls).
    fn app() -> App {
        let config = GatewayConfig::from_toml_str(FILE, "test.toml").unwrap();
        let layer = RateLimitLayer::with_mesh(config, Arc::new(Silent::default())).unwrap();
        let route = ProxyRoute {
            path_prefix: "/api".to_string(),
            upstream: "http://127.0.0.1:9".parse().unwrap(),
            http2: false,
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            max_body_bytes: Some(1000),
            forwarded: Forwarded::ALL,
            line: 1,
        };
        let checks = Checks::new(ForwardAuth {
            path: "/v1/check".to_string(),
        });
        App::new(
            Router::new(),
            &layer,
            Some(checks),
            Arc::new(Proxy::new(&[route])),
        )
    }

    fn get(path: &str) -> Request<Body> {
        Request::builder()
            .uri(path)
            .header("x-api-key", "k")
            .body(Body::empty())
            .unwrap()
    }

    fn peer(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 5000))
    }

    /// Poll `answer` once.
    fn poll_once(answer: &mut AppFuture) -> Poll<Result<http::Response<Body>, Infallible>> {
        answer
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test]
    async fn each_request_is_matched_once_on_its_way_through_the_node() {
        let app = app().for_thread();
        let check = |uri: &str| {
            let mut request = get("/v1/check");
            request
                .headers_mut()
                .insert("x-forwarded-uri", uri.parse().unwrap());
            request
        };
        for (request, from, status, matches) in [
            (get("/orders"), peer(1), 200, 1),
            (check("/orders"), peer(2), 200, 1),
            (check("/orders"), peer(1), 200, 1),
            (get("/health"), peer(1), 404, 0),
        ] {
            let mut request = request;
            let before = plans_made();
            let route = app.route(&mut request, from);
            assert_eq!(app.streamed(&route), None);
            let answer = app.answer(route, request).await.unwrap();
            assert_eq!(answer.status(), status);
            assert_eq!(plans_made() - before, matches);
        }
        // Under a proxy route: matched once, its body streamed under the route's limit.
        let mut request = get("/api/orders");
        let before = plans_made();
        let route = app.route(&mut request, peer(1));
        assert_eq!(app.streamed(&route), Some(Some(1000)));
        assert_eq!(plans_made() - before, 1);
    }

    #[tokio::test]
    async fn a_request_whose_policies_are_local_is_answered_at_once_while_a_mesh_route_waits() {
        let app = app();
        let mut local = get("/orders");
        let route = app.route(&mut local, peer(1));
        assert!(!route.needs_io());
        let mut answer = app.answer(route, local);
        assert!(matches!(poll_once(&mut answer), Poll::Ready(Ok(r)) if r.status() == 200));

        // A check asking about `/global` waits for the mesh like a request to it.
        for (path, mut request) in [("/global", get("/global")), ("/v1/check", get("/v1/check"))] {
            request
                .headers_mut()
                .insert("x-forwarded-uri", "/global".parse().unwrap());
            let route = app.route(&mut request, peer(2));
            assert!(route.needs_io(), "{path}");
            let mut answer = app.answer(route, request);
            assert!(poll_once(&mut answer).is_pending(), "{path}");
        }
    }
}
