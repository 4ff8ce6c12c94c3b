//! GraphQL queries priced by their route (`cost_from = "graphql"`), through the tower layer:
//! each field its weight, list fields times their page size (arguments, variables, defaults,
//! `graphql_lists`), fragments resolved; a query above `max_cost` or `max_depth`, or one that
//! is not a GraphQL request, is refused with 400 and a JSON body before anything is counted.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use ratemesh::ManualClock;
use ratemesh::config::GatewayConfig;
use ratemesh::http::{ClientAddr, RateLimitLayer};
use tower::ServiceExt;

const T0: u64 = 1_700_000_000_000_000_000;

const FILE: &str = r#"
env = "test"
key_secret = "s"
default_tier = "api"
allow_unlimited = true

[identity]
order = ["ip"]

[policies.points]
algorithm = "fixed-window"
limit = 5000
window = "1h"

[tiers.api]
policies = []

[[routes]]
name = "graphql"
path = "/graphql"
cost_from = "graphql"
max_cost = 1000
max_depth = 6
graphql_weights = { search = 10, "repository.issues" = 2 }
graphql_lists = ["nodes"]
graphql_list_size = 20
max_body_bytes = 4096
policies = ["points"]
"#;

fn layer(text: &str) -> RateLimitLayer {
    let config = GatewayConfig::from_toml_str(text, "policies.toml").unwrap();
    RateLimitLayer::with_clock(config, Arc::new(ManualClock::new(T0))).unwrap()
}

/// Send `request` from one address; return the status, the points left (the `RateLimit`
/// field's `r`, when the route counted) and the answer's JSON body (when it has one).
async fn send(
    layer: &RateLimitLayer,
    mut request: http::Request<Body>,
) -> (u16, Option<u64>, serde_json::Value) {
    let app = axum::Router::new()
        .route("/graphql", axum::routing::any(|| async { "{\"data\":{}}" }))
        .layer(layer.clone());
    let peer: SocketAddr = "192.0.2.7:4000".parse().unwrap();
    request.extensions_mut().insert(ClientAddr(peer));
    let response = app.oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let left = response
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(";r=").nth(1))
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.parse().ok());
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (status, left, json)
}

fn post_json(body: serde_json::Value) -> http::Request<Body> {
    http::Request::post("/graphql")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn query(text: &str) -> http::Request<Body> {
    post_json(serde_json::json!({ "query": text }))
}

#[tokio::test]
async fn fields_lists_variables_and_fragments_are_priced_as_the_route_says() {
    let layer = layer(FILE);
    let mut left = 5000;
    for (request, cost) in [
        // Three fields of weight 1.
        (query("{ viewer { login name } }"), 3),
        // search (10) + 20 × (nodes (1) + 20 × (id + title)): 10 + 20 × 41.
        (
            query("query { search(first: 20) { nodes { id title } } }"),
            10 + 20 * 41,
        ),
        // A variable gives the page size; without it, its default.
        (
            post_json(serde_json::json!({
                "query": "query Q($n: Int = 5) { repository { issues(last: $n) { title } } }",
                "variables": { "n": 7 },
            })),
            1 + (2 + 7),
        ),
        (
            query("query Q($n: Int = 5) { repository { issues(last: $n) { title } } }"),
            1 + (2 + 5),
        ),
        // A fragment spread twice costs twice; an inline fragment adds what it selects.
        (
            query(
                "{ a: viewer { ...F } b: viewer { ...F ... on User { bio } } } \
                 fragment F on User { login name }",
            ),
            (1 + 2) + (1 + 2 + 1),
        ),
        // The operation named by `operationName`.
        (
            post_json(serde_json::json!({
                "query": "query A { viewer { login } } query B { search(limit: 2) { x } }",
                "operationName": "B",
            })),
            10 + 2,
        ),
    ] {
        let (status, now, body) = send(&layer, request).await;
        assert_eq!(status, 200, "{body}");
        left -= cost;
        assert_eq!(now, Some(left), "a cost of {cost}");
    }
    // From the URL, and as an application/graphql body.
    let url = "/graphql?query=%7B%20viewer%20%7B%20login%20%7D%20%7D";
    let (status, now, _) = send(&layer, http::Request::get(url).body(Body::empty()).unwrap()).await;
    left -= 2;
    assert_eq!((status, now), (200, Some(left)));
    let raw = http::Request::post("/graphql")
        .header("content-type", "application/graphql")
        .body(Body::from("{ viewer { login } }"))
        .unwrap();
    let (status, now, _) = send(&layer, raw).await;
    left -= 2;
    assert_eq!((status, now), (200, Some(left)));
}

#[tokio::test]
async fn costly_deep_and_invalid_queries_are_refused_before_any_counting() {
    let layer = layer(FILE);
    // 10 + 20 × 41 + 1 = 831: admitted; 10 + 100 × 41 = 4110 > 1000: refused.
    let (status, _, body) = send(
        &layer,
        query("{ search(first: 20) { nodes { id title } } x }"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, left, body) = send(
        &layer,
        query("{ search(first: 100) { nodes { id title } } }"),
    )
    .await;
    assert_eq!((status, left), (400, None));
    assert_eq!(body["error"], "query_too_costly");
    assert_eq!(body["cost"], 10 + 100 * 41);
    assert_eq!(body["max_cost"], 1000);
    // Seven fields deep, past 6.
    let (status, _, body) = send(&layer, query("{ a { b { c { d { e { f { g } } } } } } }")).await;
    assert_eq!(status, 400);
    assert_eq!(
        (body["error"].as_str(), body["depth"].as_u64()),
        (Some("query_too_deep"), Some(7))
    );
    // Nested past the parser's limit: refused, no stack overflow.
    let deep = format!("{}{}", "{ a ".repeat(600), "}".repeat(600));
    let (status, _, body) = send(&layer, query(&deep)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("query_too_deep"))
    );
    for (request, why) in [
        (query("{ viewer { login }"), "not valid GraphQL"),
        (
            query("{ ...F } fragment F on Q { ...G } fragment G on Q { ...F }"),
            "spread each other",
        ),
        (query("{ ...Nope }"), "not defined"),
        (query("query A { a } query B { b }"), "no `operationName`"),
        (query("type Query { a: Int }"), "defines no types"),
        (
            post_json(serde_json::json!({ "q": "{ a }" })),
            "no `query` string",
        ),
        (
            http::Request::post("/graphql")
                .header("content-type", "text/plain")
                .body(Body::from("{ a }"))
                .unwrap(),
            "neither JSON",
        ),
        (
            http::Request::get("/graphql").body(Body::empty()).unwrap(),
            "no GraphQL query",
        ),
        (
            http::Request::get("/graphql?query=%7Ba%7D&variables=nope")
                .body(Body::empty())
                .unwrap(),
            "not JSON",
        ),
    ] {
        let (status, left, body) = send(&layer, request).await;
        assert_eq!((status, left), (400, None), "{why}: {body}");
        assert_eq!(body["error"], "graphql_invalid", "{why}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(why), "{why}: {message}");
    }
    // A body over the route's 4 KiB; with room for it, too many tokens.
    let many = format!("{{ {} }}", "a ".repeat(30_000));
    let (status, _, _) = send(&layer, query(&many)).await;
    assert_eq!(status, 413, "a body over max_body_bytes");
    let roomy = self::layer(&FILE.replace("max_body_bytes = 4096", "max_body_bytes = 131072"));
    let (status, _, body) = send(&roomy, query(&many)).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (400, Some("the query has too many tokens"))
    );
    // Nothing above was counted: the one admitted query cost 831.
    let (_, left, _) = send(&layer, query("{ x }")).await;
    assert_eq!(left, Some(5000 - 831 - 1));
}

#[test]
fn graphql_settings_are_checked_where_they_are_written() {
    for (from, to, field) in [
        ("max_depth = 6\n", "max_depth = 0\n", "max_depth"),
        (
            "graphql_list_size = 20\n",
            "graphql_list_size = 20\ncost_per_unit = 0.5\n",
            "cost_per_unit",
        ),
        ("search = 10", "\"a.b.c\" = 10", "graphql_weights"),
        ("[\"nodes\"]", "[\"no-des\"]", "graphql_lists"),
        ("cost_from = \"graphql\"\n", "", "max_depth"),
        ("max_cost = 1000\n", "max_cost = 6000\n", "max_cost"),
    ] {
        let bad = FILE.replace(from, to);
        assert_ne!(bad, FILE);
        let error = GatewayConfig::from_toml_str(&bad, "policies.toml").unwrap_err();
        assert_eq!(error.field, format!("routes.graphql.{field}"), "{error}");
    }
}
