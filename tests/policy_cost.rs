//! A route's cost taken from the request (`cost_from`): a query parameter through a linear
//! formula or a table, a header believed only from a trusted proxy, always within
//! `max_cost`; through the tower layer.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use ratemesh::ManualClock;
use ratemesh::config::GatewayConfig;
use ratemesh::http::{ClientAddr, RateLimitLayer};
use tower::{Service, ServiceExt};

const T0: u64 = 1_700_000_000_000_000_000;

/// A search route under a policy of 20 a minute per client, with `route` settings added.
fn layer(route: &str) -> RateLimitLayer {
    let text = format!(
        "env = \"test\"\nkey_secret = \"s\"\ndefault_tier = \"api\"\n\
         [identity]\norder = [\"ip\"]\ntrusted_proxies = [\"10.0.0.0/8\"]\n\
         [policies.per_client]\nalgorithm = \"fixed-window\"\nlimit = 20\nwindow = \"1m\"\n\
         [tiers.api]\npolicies = [\"per_client\"]\n\
         [[routes]]\nname = \"search\"\npath = \"/search\"\n{route}\n"
    );
    let config = GatewayConfig::from_toml_str(&text, "policies.toml").unwrap();
    RateLimitLayer::with_clock(config, Arc::new(ManualClock::new(T0))).unwrap()
}

/// GET `target` from `peer` with `headers`; the status and the policy's remaining count.
async fn get(
    layer: &RateLimitLayer,
    peer: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<u64>) {
    let mut service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(tower::service_fn(|_request: http::Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
        }));
    let mut request = http::Request::get(target);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut request = request.body(Body::empty()).unwrap();
    let peer: SocketAddr = format!("{peer}:4000").parse().unwrap();
    request.extensions_mut().insert(ClientAddr(peer));
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    // `RateLimit: "per_client";r=15;t=60`
    let remaining = response
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(";r=").nth(1))
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.parse().ok());
    (response.status().as_u16(), remaining)
}

#[tokio::test]
async fn a_query_parameter_costs_by_a_linear_formula_within_the_cap() {
    let layer = layer("cost_from = \"query:page_size\"\ncost_per_unit = 0.1\nmax_cost = 8");
    let a = "192.0.2.1";
    assert_eq!(
        get(&layer, a, "/search?page_size=50", &[]).await,
        (200, Some(15))
    );
    assert_eq!(
        get(&layer, a, "/search?page_size=1", &[]).await,
        (200, Some(14))
    );
    // 1000 would cost 100: capped at 8.
    assert_eq!(
        get(&layer, a, "/search?q=x&page_size=1000", &[]).await,
        (200, Some(6))
    );
    // No usable number: the route's constant cost, 1.
    for target in ["/search", "/search?page_size=-5", "/search?page_size=lots"] {
        let (status, _) = get(&layer, a, target, &[]).await;
        assert_eq!(status, 200, "{target}");
    }
    assert_eq!(get(&layer, a, "/search?page_size=70", &[]).await.0, 429);
    assert_eq!(
        get(&layer, a, "/search?page_size=30", &[]).await,
        (200, Some(0))
    );
}

#[tokio::test]
async fn a_table_maps_ranges_of_the_number_to_costs() {
    let layer = layer(
        "cost_from = \"query:limit\"\ncost_table = [[10, 1], [50, 4], [100, 8]]\nmax_cost = 10",
    );
    let a = "192.0.2.2";
    assert_eq!(
        get(&layer, a, "/search?limit=10", &[]).await,
        (200, Some(19))
    );
    assert_eq!(
        get(&layer, a, "/search?limit=11", &[]).await,
        (200, Some(15))
    );
    assert_eq!(
        get(&layer, a, "/search?limit=100", &[]).await,
        (200, Some(7))
    );
    // Above the last row: `max_cost`.
    assert_eq!(get(&layer, a, "/search?limit=101", &[]).await.0, 429);
    assert_eq!(
        get(&layer, a, "/search?limit=50", &[]).await,
        (200, Some(3))
    );
}

#[tokio::test]
async fn a_cost_header_is_believed_only_from_a_trusted_proxy() {
    let layer = layer("cost_from = \"header:x-cost\"\nmax_cost = 12");
    // Through the proxy: the client behind it is charged the header's 7, then 12 (capped).
    let proxied = [("x-forwarded-for", "198.51.100.7"), ("x-cost", "7")];
    assert_eq!(
        get(&layer, "10.1.2.3", "/search", &proxied).await,
        (200, Some(13))
    );
    let big = [("x-forwarded-for", "198.51.100.7"), ("x-cost", "500")];
    assert_eq!(
        get(&layer, "10.1.2.3", "/search", &big).await,
        (200, Some(1))
    );
    // From a client directly, the header is ignored: each request costs 1.
    for left in (0..20).rev() {
        let direct = get(&layer, "192.0.2.3", "/search", &[("x-cost", "19")]).await;
        assert_eq!(direct, (200, Some(left)));
    }
}

#[test]
fn cost_settings_are_checked_with_line_and_field() {
    let refused = |route: &str| {
        let text = format!(
            "env = \"test\"\nkey_secret = \"s\"\ndefault_tier = \"api\"\n\
             [policies.per_client]\nalgorithm = \"fixed-window\"\nlimit = 20\nwindow = \"1m\"\n\
             [tiers.api]\npolicies = [\"per_client\"]\n\
             [[routes]]\nname = \"search\"\npath = \"/search\"\n{route}\n"
        );
        GatewayConfig::from_toml_str(&text, "policies.toml")
            .unwrap_err()
            .to_string()
    };
    for (route, field, says) in [
        ("cost_from = \"query:n\"", "cost_from", "max_cost"),
        ("cost_from = \"ip\"", "cost_from", "header:NAME"),
        (
            "cost_from = \"query:n\"\nmax_cost = 21",
            "max_cost",
            "capacity",
        ),
        (
            "cost_from = \"query:n\"\nmax_cost = 0",
            "max_cost",
            "at least 1",
        ),
        (
            "cost_from = \"query:n\"\nmax_cost = 5\ncost_per_unit = 1.0\ncost_table = [[1, 1]]",
            "cost_table",
            "one of",
        ),
        (
            "cost_from = \"query:n\"\nmax_cost = 5\ncost_per_unit = -1.0",
            "cost_per_unit",
            "from",
        ),
        (
            "cost_from = \"query:n\"\nmax_cost = 5\ncost_table = [[10, 1], [5, 2]]",
            "cost_table",
            "increasing",
        ),
        (
            "cost_from = \"query:n\"\nmax_cost = 5\ncost_table = [[10, 9]]",
            "cost_table",
            "max_cost",
        ),
        ("cost_per_unit = 0.5", "cost_per_unit", "needs `cost_from`"),
    ] {
        let message = refused(route);
        assert!(
            message.contains(&format!("routes.search.{field}")),
            "{route}: {message}"
        );
        assert!(message.contains(says), "{route}: {message}");
        assert!(message.contains("policies.toml:"), "{route}: {message}");
    }
}
