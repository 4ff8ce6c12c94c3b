//! What the tower layer allocates per request, counted with a global allocator: the 429 that
//! an attack gets (a bucket retried within a second) shares its `RateLimit` field and JSON
//! body, formatted once per policy, where a denial retried in a day formats both.

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use ratemesh::config::GatewayConfig;
use ratemesh::http::RateLimitLayer;
use tower::ServiceExt;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::allocations;

/// A bucket of `rate` per `period` with a burst of `burst`, for every client.
fn file(rate: u64, period: &str, burst: u64) -> String {
    format!(
        "default_tier = \"all\"\nkey_secret = \"k\"\n[policies.per_client]\n\
         algorithm = \"token-bucket\"\nrate = {rate}\nperiod = \"{period}\"\nburst = {burst}\n\
         [tiers.all]\npolicies = [\"per_client\"]\n"
    )
}

fn request() -> http::Request<Body> {
    http::Request::builder()
        .uri("/")
        .header("x-api-key", "sk_live_0123456789abcdef")
        .body(Body::empty())
        .unwrap()
}

/// Allocations per request through the layer under `text`, after a warm-up, with the
/// status every request got.
fn per_request(text: &str) -> (f64, http::StatusCode) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let config = GatewayConfig::from_toml_str(text, "test.toml").unwrap();
    let app: Router = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(config).unwrap());
    runtime.block_on(async {
        let mut statuses = Vec::with_capacity(300);
        for _ in 0..100 {
            statuses.push(app.clone().oneshot(request()).await.unwrap().status());
        }
        let requests: Vec<_> = (0..200).map(|_| request()).collect();
        let before = allocations();
        for request in requests {
            statuses.push(app.clone().oneshot(request).await.unwrap().status());
        }
        let count = allocations() - before;
        let last = statuses[150];
        assert!(statuses[100..].iter().all(|s| *s == last), "{statuses:?}");
        (count as f64 / 200.0, last)
    })
}

#[test]
fn a_denial_retried_soon_shares_its_field_and_body() {
    let (admitted, status) = per_request(&file(1_000_000_000, "1s", 1_000_000));
    assert_eq!(status, 200);
    let (soon, status) = per_request(&file(1, "1s", 1));
    assert_eq!(status, 429);
    let (in_a_day, status) = per_request(&file(1, "1d", 1));
    assert_eq!(status, 429);
    // The day's denial formats its `Retry-After` (beyond the values kept formatted), its
    // `RateLimit` field and its body, where the soon one shares them: four allocations
    // more (two when the soon one formats its field and body too).
    assert!(
        soon + 4.0 <= in_a_day,
        "a denial retried soon allocates {soon} times, one retried in a day {in_a_day}"
    );
    assert!(
        soon < admitted,
        "{soon} for a denial, {admitted} for an admission"
    );
}
