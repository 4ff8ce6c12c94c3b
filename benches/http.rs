//! The tower layer's overhead per request over a bare axum handler, in process (no sockets).
//!
//! `cargo bench --bench http`. The policy admits everything (a 1e9/s bucket and a daily window),
//! so every request goes through the whole path: identity, key hashing, two layered
//! decisions, and the `RateLimit-Policy` / `RateLimit` fields; then again with the Prometheus
//! recorder installed (feature `node`), where each decision is counted. `one_policy` and
//! `four_policies_four_keys` compare one policy with four that each count by other parts of
//! the request (the client, its address, the route, everybody: `by`). `denied` is the path of
//! a request the policy denies (a 429 with its JSON body and `Retry-After`), as under an
//! attack (retried in a day); `denied_retry_1s` the same under a bucket of 100 a second,
//! whose denials say to retry within a second (their fields and body formatted once per
//! policy). `graphql_2kb` prices a GraphQL query of about 2 KB (fields, lists, a fragment,
//! variables) on its way through the layer, a document the route has seen before (compiled
//! once, priced from the request's variables); `graphql_2kb_first_sight` one it has not
//! (parsed and compiled).

use std::hint::black_box;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use ratemesh::config::GatewayConfig;
use ratemesh::http::RateLimitLayer;
use tower::ServiceExt;

const POLICIES: &str = r#"
default_tier = "all"
[policies.per_second]
algorithm = "token-bucket"
rate = 1000000000
period = "1s"
burst = 1000000
[policies.daily]
algorithm = "fixed-window"
limit = 4000000000
window = "1d"
[tiers.all]
policies = ["per_second", "daily"]
"#;

/// One policy, then four with four keys (the request's address comes from its peer).
const ONE: &str = r#"
default_tier = "all"
key_secret = "bench"
[policies.a]
algorithm = "token-bucket"
rate = 1000000000
period = "1s"
burst = 1000000
[tiers.all]
policies = ["a"]
"#;

/// A bucket that one request empties for a day: every later request is denied.
const DENY: &str = r#"
default_tier = "all"
key_secret = "bench"
[policies.a]
algorithm = "token-bucket"
rate = 1
period = "1d"
burst = 1
[tiers.all]
policies = ["a"]
"#;

/// The bucket of an attack's usual denial: 100 a second with a burst of 20, which a bench's
/// requests empty at once (retried within a second).
const DENY_SOON: &str = r#"
default_tier = "all"
key_secret = "bench"
[policies.a]
algorithm = "token-bucket"
rate = 100
period = "1s"
burst = 20
[tiers.all]
policies = ["a"]
"#;

/// A route that prices GraphQL queries.
const GRAPHQL: &str = r#"
default_tier = "all"
key_secret = "bench"
allow_unlimited = true
[policies.points]
algorithm = "fixed-window"
limit = 4294967294
window = "10ms"
[tiers.all]
policies = []
[[routes]]
name = "graphql"
path = "/graphql"
cost_from = "graphql"
max_cost = 1000000000
max_depth = 20
graphql_weights = { search = 10 }
graphql_lists = ["nodes", "edges"]
max_body_bytes = 65536
policies = ["points"]
"#;

/// A query of about 2 KB: aliased searches with lists, a fragment, variables.
fn graphql_body() -> String {
    graphql_body_named("Q", 5)
}

/// [`graphql_body`] with operation name `name` and `$m` = `m`.
fn graphql_body_named(name: &str, m: u64) -> String {
    let mut query = format!("query {name}($n: Int = 10, $m: Int) {{ ");
    for i in 0..24 {
        query.push_str(&format!(
            "s{i}: search(first: $n, query: \"term{i}\") {{ nodes {{ id title ...Parts }} }} "
        ));
    }
    query.push_str("} fragment Parts on Item { author { login name } labels(last: $m) { name } }");
    serde_json::json!({ "query": query, "variables": { "m": m } }).to_string()
}

const FOUR: &str = r#"
default_tier = "all"
key_secret = "bench"
[policies.a]
algorithm = "token-bucket"
rate = 1000000000
period = "1s"
burst = 1000000
[policies.b]
algorithm = "token-bucket"
rate = 1000000000
period = "1s"
burst = 1000000
by = ["ip"]
[policies.c]
algorithm = "token-bucket"
rate = 1000000000
period = "1s"
burst = 1000000
by = ["route", "method"]
[policies.d]
algorithm = "token-bucket"
rate = 1000000000
period = "1s"
burst = 1000000
by = []
[tiers.all]
policies = ["a", "b"]
[[routes]]
name = "orders"
path_prefix = "/"
policies = ["c", "d"]
"#;

fn request_from_peer() -> http::Request<Body> {
    let mut request = request();
    request.extensions_mut().insert(ratemesh::http::ClientAddr(
        "192.0.2.7:4000".parse().unwrap(),
    ));
    request
}

fn request() -> http::Request<Body> {
    http::Request::builder()
        .uri("/")
        .header("x-api-key", "sk_live_0123456789abcdef")
        .body(Body::empty())
        .unwrap()
}

fn layer_overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bare: Router = Router::new().route("/", get(|| async { "ok" }));
    let config = GatewayConfig::from_toml_str(POLICIES, "bench").unwrap();
    let limited: Router = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(config).unwrap());
    let mut group = c.benchmark_group("http");
    group.bench_function("bare_axum", |b| {
        b.to_async(&runtime).iter(|| async {
            let response = bare.clone().oneshot(request()).await.unwrap();
            black_box(response.status())
        })
    });
    group.bench_function("ratemesh_layer", |b| {
        b.to_async(&runtime).iter(|| async {
            let response = limited.clone().oneshot(request()).await.unwrap();
            assert_eq!(response.status(), 200);
            black_box(response.status())
        })
    });
    // Each file with the request it is asked, and the status every answer has (a denial's
    // bucket lets its burst through first).
    type Case = (
        &'static str,
        &'static str,
        fn() -> http::Request<Body>,
        Option<u16>,
    );
    let cases: [Case; 4] = [
        ("one_policy", ONE, request_from_peer, Some(200)),
        (
            "four_policies_four_keys",
            FOUR,
            request_from_peer,
            Some(200),
        ),
        ("denied", DENY, request, None),
        ("denied_retry_1s", DENY_SOON, request, None),
    ];
    for (name, text, make, status) in cases {
        let config = GatewayConfig::from_toml_str(text, "bench").unwrap();
        let app: Router = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(config).unwrap());
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter(|| async {
                let response = app.clone().oneshot(make()).await.unwrap();
                if let Some(status) = status {
                    assert_eq!(response.status(), status);
                }
                black_box(response.status())
            })
        });
    }
    let config = GatewayConfig::from_toml_str(GRAPHQL, "bench").unwrap();
    let priced: Router = Router::new()
        .route("/graphql", axum::routing::post(|| async { "{}" }))
        .layer(RateLimitLayer::new(config).unwrap());
    let body = graphql_body();
    assert!((1800..2600).contains(&body.len()), "{}", body.len());
    group.bench_function("graphql_2kb", |b| {
        b.to_async(&runtime).iter(|| async {
            let request = http::Request::post("/graphql")
                .header("content-type", "application/json")
                .body(Body::from(body.clone()))
                .unwrap();
            let response = priced.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), 200);
            black_box(response.status())
        })
    });
    // A document the route has not seen: parsed and compiled (each iteration names its
    // operation afresh).
    let fresh = std::sync::atomic::AtomicU64::new(0);
    group.bench_function("graphql_2kb_first_sight", |b| {
        b.to_async(&runtime).iter(|| async {
            let n = fresh.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let body = graphql_body_named(&format!("Q{n}"), 5);
            let request = http::Request::post("/graphql")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap();
            let response = priced.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), 200);
            black_box(response.status())
        })
    });
    // Last: with the Prometheus recorder a node installs, every decision is also counted
    // (`ratemesh_decisions_total`), as in `ratemesh node`.
    #[cfg(feature = "node")]
    {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .unwrap();
        group.bench_function("ratemesh_layer_counted", |b| {
            b.to_async(&runtime).iter(|| async {
                let response = limited.clone().oneshot(request()).await.unwrap();
                assert_eq!(response.status(), 200);
                black_box(response.status())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, layer_overhead);
criterion_main!(benches);
