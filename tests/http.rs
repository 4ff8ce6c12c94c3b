//! The tower layer behind a real axum server on loopback, called by a real HTTP client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use ratemesh::config::GatewayConfig;
use ratemesh::http::{AuthenticatedUser, RateLimitLayer};
use ratemesh::{ManualClock, Nanos};
use sfv::{List, ListEntry, Parser};

const FIXTURE: &str = include_str!("fixtures/policies.toml");
const API_KEY: &str = "sk_live_THIS-IS-A-SECRET-0123456789";

/// A running server; dropping it stops the server task.
struct Server {
    base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An auth layer stand-in: `x-test-user: NAME` becomes an authenticated user.
async fn fake_auth(mut request: Request, next: Next) -> Response {
    if let Some(user) = request
        .headers()
        .get("x-test-user")
        .and_then(|v| v.to_str().ok())
    {
        let user = AuthenticatedUser(user.to_string());
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

async fn serve(layer: RateLimitLayer) -> Server {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/search", get(|| async { "results" }))
        .layer(layer)
        .layer(middleware::from_fn(fake_auth));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    Server {
        base: format!("http://{addr}"),
        task,
    }
}

fn config(extra: &str) -> GatewayConfig {
    GatewayConfig::from_toml_str(&format!("{FIXTURE}\n{extra}"), "fixture").unwrap()
}

fn layer_at(config: GatewayConfig, clock: &ManualClock) -> RateLimitLayer {
    RateLimitLayer::with_clock(config, Arc::new(clock.clone())).unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Parse a structured-field list into `(name, [(param, integer)])`.
fn parse_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: List = Parser::new(value).parse().expect("a valid sf-list");
    list.iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => {
                let name = item
                    .bare_item
                    .as_string()
                    .expect("an sf-string")
                    .as_str()
                    .to_string();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_string(),
                            i64::from(v.as_integer().expect("an integer")),
                        )
                    })
                    .collect();
                (name, params)
            }
            ListEntry::InnerList(_) => panic!("no inner lists expected"),
        })
        .collect()
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

const T0: Nanos = 1_800_000_000 * 1_000_000_000;

#[tokio::test]
async fn a_denied_request_gets_429_retry_after_structured_fields_and_json() {
    let clock = ManualClock::new(T0);
    let server = serve(layer_at(config(""), &clock)).await;
    let http = client();
    // The free tier's burst: 5 tokens, one more per minute.
    for expected_remaining in (0..5).rev() {
        let response = http
            .get(&server.base)
            .header("x-api-key", API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let policy = parse_list(header(&response, "ratelimit-policy"));
        assert_eq!(
            policy[0],
            ("burst".into(), vec![("q".into(), 5), ("w".into(), 300)])
        );
        assert_eq!(
            policy[1],
            (
                "daily".into(),
                vec![("q".into(), 1000), ("w".into(), 86_400)]
            )
        );
        let state = parse_list(header(&response, "ratelimit"));
        assert_eq!(state[0].0, "burst");
        assert_eq!(state[0].1[0], ("r".into(), expected_remaining));
        assert_eq!(state[0].1[1], ("t".into(), 60 * (5 - expected_remaining)));
        assert!(response.headers().get("retry-after").is_none());
        assert!(
            response.headers().get("x-ratelimit-limit").is_none(),
            "legacy is off"
        );
        assert_eq!(response.text().await.unwrap(), "hello");
    }
    let denied = http
        .get(&server.base)
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(header(&denied, "retry-after"), "60");
    assert_eq!(header(&denied, "content-type"), "application/json");
    let state = parse_list(header(&denied, "ratelimit"));
    assert_eq!(state.last().unwrap().0, "burst");
    assert_eq!(state.last().unwrap().1[0], ("r".into(), 0));
    let body: serde_json::Value = denied.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({"error": "rate_limited", "policy": "burst", "retry_after_seconds": 60})
    );
    // A minute later one token is back.
    clock.advance(Duration::from_secs(60));
    let again = http
        .get(&server.base)
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
}

#[tokio::test]
async fn routes_cost_tokens_and_add_their_own_policies() {
    let clock = ManualClock::new(T0);
    let server = serve(layer_at(config(""), &clock)).await;
    let http = client();
    let search = http
        .get(format!("{}/search?q=x", server.base))
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(search.status(), 200);
    let state = parse_list(header(&search, "ratelimit"));
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["burst", "daily", "search_per_minute"]);
    assert_eq!(
        state[0].1[0],
        ("r".into(), 3),
        "a search costs 2 of the burst's 5"
    );
    assert_eq!(state[2].1[0], ("r".into(), 28));
    // `/searchx` is not the search route: it is not found, and costs 1.
    let other = http
        .get(format!("{}/searchx", server.base))
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    assert_eq!(
        parse_list(header(&other, "ratelimit"))[0].1[0],
        ("r".into(), 2)
    );
}

#[tokio::test]
async fn legacy_headers_when_enabled() {
    let clock = ManualClock::new(T0);
    let server = serve(layer_at(config("[headers]\nlegacy = true\n"), &clock)).await;
    let response = client()
        .get(&server.base)
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(header(&response, "x-ratelimit-limit"), "5");
    assert_eq!(header(&response, "x-ratelimit-remaining"), "4");
    assert_eq!(header(&response, "x-ratelimit-reset"), "60");
}

#[tokio::test]
async fn identity_precedence_user_then_api_key_then_device_then_ip() {
    let clock = ManualClock::new(T0);
    let server = serve(layer_at(config(""), &clock)).await;
    let http = client();
    let remaining =
        |response: &reqwest::Response| parse_list(header(response, "ratelimit"))[0].1[0].1;
    // The same user with two different API keys is one client.
    let a = http
        .get(&server.base)
        .header("x-test-user", "dave")
        .header("x-api-key", "k1")
        .send()
        .await
        .unwrap();
    let b = http
        .get(&server.base)
        .header("x-test-user", "dave")
        .header("x-api-key", "k2")
        .send()
        .await
        .unwrap();
    assert_eq!((remaining(&a), remaining(&b)), (4, 3));
    // Without a user, the API key identifies: k1 is fresh.
    let c = http
        .get(&server.base)
        .header("x-api-key", "k1")
        .header("x-device-id", "d1")
        .send()
        .await
        .unwrap();
    assert_eq!(remaining(&c), 4);
    // Without a key, the device: d1 is fresh, and the same device again counts down.
    let d = http
        .get(&server.base)
        .header("x-device-id", "d1")
        .send()
        .await
        .unwrap();
    let e = http
        .get(&server.base)
        .header("x-device-id", "d1")
        .send()
        .await
        .unwrap();
    assert_eq!((remaining(&d), remaining(&e)), (4, 3));
    // Nothing but the IP: every anonymous request from 127.0.0.1 is one client.
    let f = http.get(&server.base).send().await.unwrap();
    let g = http.get(&server.base).send().await.unwrap();
    assert_eq!((remaining(&f), remaining(&g)), (4, 3));
    // A tenant in the pro tier gets the pro policies.
    let pro = http
        .get(&server.base)
        .header("x-test-user", "carol")
        .send()
        .await
        .unwrap();
    assert_eq!(
        parse_list(header(&pro, "ratelimit-policy"))[0].0,
        "pro_burst"
    );
}

#[tokio::test]
async fn a_spoofed_x_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let clock = ManualClock::new(T0);
    let http = client();
    let untrusted = serve(layer_at(config(""), &clock)).await;
    for i in 0..5 {
        let response = http
            .get(&untrusted.base)
            .header("x-forwarded-for", format!("203.0.113.{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    let sixth = http
        .get(&untrusted.base)
        .header("x-forwarded-for", "203.0.113.99")
        .send()
        .await
        .unwrap();
    assert_eq!(
        sixth.status(),
        429,
        "all six came from 127.0.0.1, whatever they claimed"
    );

    // Behind a trusted proxy (127.0.0.1 here), the forwarded address is the client.
    let trusted_config = config("").identity;
    let mut file = FIXTURE.replace(
        "device_header = \"x-device-id\"",
        "device_header = \"x-device-id\"\ntrusted_proxies = [\"127.0.0.1/32\"]",
    );
    file.push('\n');
    let trusted = GatewayConfig::from_toml_str(&file, "trusted").unwrap();
    assert_ne!(trusted.identity, trusted_config);
    let behind_proxy = serve(layer_at(trusted, &clock)).await;
    for i in 0..8 {
        let response = http
            .get(&behind_proxy.base)
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            200,
            "each forwarded client has its own bucket"
        );
    }
}

#[tokio::test]
async fn a_denial_hook_shapes_the_response_and_keeps_the_fields() {
    let clock = ManualClock::new(T0);
    let layer = layer_at(config(""), &clock).on_denied(|outcome| {
        let mut response = Response::new(axum::body::Body::from(format!(
            "slow down ({})",
            outcome.denied_by().map_or("?", |r| r.name)
        )));
        *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
        response
    });
    let server = serve(layer).await;
    let http = client();
    for _ in 0..5 {
        http.get(&server.base)
            .header("x-api-key", "hook")
            .send()
            .await
            .unwrap();
    }
    let denied = http
        .get(&server.base)
        .header("x-api-key", "hook")
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(header(&denied, "retry-after"), "60");
    assert_eq!(denied.text().await.unwrap(), "slow down (burst)");
}

#[tokio::test]
async fn every_clone_of_the_service_shares_the_counters() {
    use tower::{Layer, Service, ServiceExt};
    let clock = ManualClock::new(T0);
    let layer = layer_at(config(""), &clock);
    let inner = tower::service_fn(|_req: http::Request<axum::body::Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
    });
    let mut first = layer.layer(inner);
    let mut second = layer.clone().layer(inner);
    let mut statuses = Vec::new();
    for i in 0..6 {
        let service = if i % 2 == 0 { &mut first } else { &mut second };
        let request = http::Request::builder()
            .uri("/")
            .header("x-api-key", "shared")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, vec![200, 200, 200, 200, 200, 429]);
}

#[tokio::test]
async fn the_layer_serves_plain_hyper_too() {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use ratemesh::http::ClientAddr;
    use tower::ServiceBuilder;

    let clock = ManualClock::new(T0);
    let layer = layer_at(config(""), &clock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            let service = ServiceBuilder::new()
                .map_request(move |mut request: http::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(ClientAddr(peer));
                    request
                })
                .layer(layer.clone())
                .service(tower::service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from(
                        "hyper",
                    )))
                }));
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    let http = client();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let response = http.get(&base).send().await.unwrap();
        statuses.push(response.status().as_u16());
        if response.status() == 200 {
            assert_eq!(
                parse_list(header(&response, "ratelimit-policy"))[0].0,
                "burst"
            );
        }
    }
    assert_eq!(statuses, vec![200, 200, 200, 200, 200, 429]);
    task.abort();
}

#[tokio::test]
async fn the_retry_helper_honours_retry_after_from_a_real_server() {
    use ratemesh::http::client::RetryPolicy;
    let file = FIXTURE
        .replace(
            "rate = 1\nperiod = \"1m\"\nburst = 5",
            "rate = 1\nperiod = \"1s\"\nburst = 1",
        )
        .replace("cost = 2", "cost = 1");
    let config = GatewayConfig::from_toml_str(&file, "retry").unwrap();
    let server = serve(RateLimitLayer::new(config).unwrap()).await;
    let http = client();
    let first = http
        .get(&server.base)
        .header("x-api-key", "retrier")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let policy = RetryPolicy::default();
    let started = std::time::Instant::now();
    let response = policy
        .send(|| async {
            let response = http
                .get(&server.base)
                .header("x-api-key", "retrier")
                .send()
                .await?;
            Ok::<_, reqwest::Error>(http::Response::from(response))
        })
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "retried after the server's Retry-After"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "waited only {waited:?}"
    );
}
