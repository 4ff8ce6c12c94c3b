//! The tower layer's overhead per request over a bare axum handler, in process (no sockets).
//!
//! `cargo bench --bench http`. The policy admits everything (a 1e9/s bucket and a daily window),
//! so every request goes through the whole path: identity, key hashing, two layered
//! decisions, and the `RateLimit-Policy` / `RateLimit` fields; then again with the Prometheus
//! recorder installed (feature `node`), where each decision is counted.

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
