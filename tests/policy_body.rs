//! Policies that count by a field of the request's body (`json:`, `form:`), through the
//! tower layer: the body is read only for routes whose policies need it, up to the route's
//! `max_body_bytes`, and handed on unchanged.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use ratemesh::ManualClock;
use ratemesh::config::GatewayConfig;
use ratemesh::http::{ClientAddr, RateLimitLayer};
use tower::{Service, ServiceExt};

const T0: u64 = 1_700_000_000_000_000_000;

const HEAD: &str = "env = \"test\"\nkey_secret = \"s\"\ndefault_tier = \"api\"\n\
    [identity]\norder = [\"ip\"]\n\
    [policies.per_address]\nalgorithm = \"fixed-window\"\nlimit = 1000\nwindow = \"1m\"\n\
    [tiers.api]\npolicies = [\"per_address\"]\n";

fn layer(text: &str) -> RateLimitLayer {
    let config = GatewayConfig::from_toml_str(text, "policies.toml").unwrap();
    RateLimitLayer::with_clock(config, Arc::new(ManualClock::new(T0))).unwrap()
}

/// A login route whose account policy counts by `part`, read from bodies of at most 256
/// bytes (`on_missing` as given).
fn login(part: &str, on_missing: &str) -> RateLimitLayer {
    layer(&format!(
        "{HEAD}[policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"15m\"\n\
         by = [\"{part}\"]\non_missing = \"{on_missing}\"\n\
         [[routes]]\nname = \"login\"\nmethod = \"POST\"\npath = \"/login\"\n\
         max_body_bytes = 256\npolicies = [\"per_account\"]\n"
    ))
}

/// POST `body` from `addr` to `path`; return the status, the answer's body, and the body the
/// service behind the layer received (`None` when the request never reached it).
async fn post(
    layer: &RateLimitLayer,
    addr: &str,
    path: &str,
    content_type: &str,
    body: Body,
) -> (u16, String, Option<Bytes>) {
    let seen = Arc::new(std::sync::Mutex::new(None));
    let kept = Arc::clone(&seen);
    let mut service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(tower::service_fn(move |request: http::Request<Body>| {
            let kept = Arc::clone(&kept);
            async move {
                let body = axum::body::to_bytes(request.into_body(), 1 << 20)
                    .await
                    .unwrap();
                *kept.lock().unwrap() = Some(body);
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
            }
        }));
    let mut request = http::Request::post(path)
        .header("content-type", content_type)
        .body(body)
        .unwrap();
    let peer: SocketAddr = format!("{addr}:4000").parse().unwrap();
    request.extensions_mut().insert(ClientAddr(peer));
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    let status = response.status().as_u16();
    let answer = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let received = seen.lock().unwrap().take();
    (
        status,
        String::from_utf8_lossy(&answer).into_owned(),
        received,
    )
}

async fn post_json(layer: &RateLimitLayer, addr: &str, json: &str) -> (u16, String) {
    let (status, answer, received) = post(
        layer,
        addr,
        "/login",
        "application/json",
        Body::from(json.to_owned()),
    )
    .await;
    if status == 200 {
        assert_eq!(
            received.as_deref(),
            Some(json.as_bytes()),
            "the body reaches the service unchanged"
        );
    }
    (status, answer)
}

#[tokio::test]
async fn an_account_named_in_a_json_body_is_counted_from_any_address() {
    let layer = login("json:/user/name", "refuse");
    let alice = r#"{"user":{"name":"alice"},"password":"x"}"#;
    assert_eq!(post_json(&layer, "192.0.2.1", alice).await.0, 200);
    assert_eq!(post_json(&layer, "192.0.2.2", alice).await.0, 200);
    // From a third address, alice's account is spent; bob's is his own.
    assert_eq!(post_json(&layer, "192.0.2.3", alice).await.0, 429);
    let bob = r#"{"password":"y","user":{"name":"bob"}}"#;
    assert_eq!(post_json(&layer, "192.0.2.3", bob).await.0, 200);
    // Numbers and booleans count by their JSON text; the same account spelled with other
    // whitespace is the same account.
    let spaced = "{ \"user\" : { \"name\" : \"alice\" } }";
    assert_eq!(post_json(&layer, "192.0.2.4", spaced).await.0, 429);
    let numbered = r#"{"user":{"name":42}}"#;
    assert_eq!(post_json(&layer, "192.0.2.4", numbered).await.0, 200);
    assert_eq!(post_json(&layer, "192.0.2.4", numbered).await.0, 200);
    assert_eq!(post_json(&layer, "192.0.2.4", numbered).await.0, 429);
}

#[tokio::test]
async fn a_form_field_is_decoded_before_it_is_counted() {
    let layer = login("form:username", "refuse");
    let send = |body: &'static str| {
        let layer = layer.clone();
        async move {
            post(
                &layer,
                "192.0.2.9",
                "/login",
                "application/x-www-form-urlencoded",
                Body::from(body),
            )
            .await
        }
    };
    let (status, _, received) = send("username=carol+smith&password=p").await;
    assert_eq!(status, 200);
    assert_eq!(
        received.as_deref(),
        Some(&b"username=carol+smith&password=p"[..])
    );
    // `%20` and `+` both decode to a space: the same account.
    assert_eq!(send("password=q&username=carol%20smith").await.0, 200);
    assert_eq!(send("username=carol%20smith").await.0, 429);
    assert_eq!(send("username=dave").await.0, 200);
}

#[tokio::test]
async fn a_body_that_lacks_the_field_is_refused_or_skipped_as_the_policy_says() {
    let refuse = login("json:/user/name", "refuse");
    for body in [
        "not json",
        r#"{"user":{}}"#,
        r#"{"user":{"name":""}}"#,
        r#"{"user":{"name":["a"]}}"#,
        "",
    ] {
        let (status, answer) = post_json(&refuse, "192.0.2.1", body).await;
        assert_eq!(status, 400, "{body}");
        assert!(answer.contains("json:/user/name"), "{answer}");
    }
    // Nested past the JSON parser's depth: not JSON, never a panic.
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let layer = layer(&format!(
        "{HEAD}[policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"15m\"\n\
         by = [\"json:/user\"]\n[[routes]]\nname = \"login\"\npath = \"/login\"\n\
         max_body_bytes = 4096\npolicies = [\"per_account\"]\n"
    ));
    assert_eq!(post_json(&layer, "192.0.2.1", &deep).await.0, 400);
    // Skipped: the request passes, uncounted by that policy.
    let skip = login("json:/user/name", "skip");
    for _ in 0..5 {
        assert_eq!(post_json(&skip, "192.0.2.1", "not json").await.0, 200);
    }
}

#[tokio::test]
async fn a_body_longer_than_the_routes_limit_is_413_and_costs_nothing() {
    let layer = login("json:/user/name", "refuse");
    let long = format!(
        r#"{{"user":{{"name":"alice"}},"pad":"{}"}}"#,
        "x".repeat(300)
    );
    let (status, answer, received) = post(
        &layer,
        "192.0.2.1",
        "/login",
        "application/json",
        Body::from(long),
    )
    .await;
    assert_eq!(status, 413);
    assert!(received.is_none());
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["error"], "body_too_large");
    assert_eq!(answer["max_bytes"], 256);
    // Nothing was charged: alice still has her two.
    let alice = r#"{"user":{"name":"alice"}}"#;
    assert_eq!(post_json(&layer, "192.0.2.1", alice).await.0, 200);
    assert_eq!(post_json(&layer, "192.0.2.1", alice).await.0, 200);
    assert_eq!(post_json(&layer, "192.0.2.1", alice).await.0, 429);
}

#[tokio::test(start_paused = true)]
async fn only_requests_whose_policies_read_a_field_have_their_body_read() {
    let layer = login("json:/user/name", "refuse");
    // A body that sends one chunk and then never ends: a layer that read it would wait
    // forever. Outside the login route, the service answers without reading it.
    let endless = || {
        Body::new(OneChunk {
            sent: false,
            fails: false,
        })
    };
    let layer_only = layer.clone();
    let mut service = tower::ServiceBuilder::new()
        .layer(layer_only)
        .service(tower::service_fn(|_request: http::Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
        }));
    let mut request = http::Request::post("/upload").body(endless()).unwrap();
    request
        .extensions_mut()
        .insert(ClientAddr("192.0.2.1:4000".parse().unwrap()));
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        service.ready().await.unwrap().call(request),
    )
    .await
    .expect("a route without body policies never reads the body");
    assert_eq!(answered.unwrap().status(), 200);
    // On the login route the body is read: it waits for the rest, 30 s, then refuses the
    // request uncounted.
    let started = tokio::time::Instant::now();
    let mut request = http::Request::post("/login").body(endless()).unwrap();
    request
        .extensions_mut()
        .insert(ClientAddr("192.0.2.1:4000".parse().unwrap()));
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert_eq!(response.status(), 400);
    let answer = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&answer).contains("body_incomplete"));
}

#[tokio::test]
async fn a_body_that_breaks_off_is_refused_uncounted() {
    let layer = login("json:/user/name", "skip");
    let (status, answer, received) = post(
        &layer,
        "192.0.2.1",
        "/login",
        "application/json",
        Body::new(OneChunk {
            sent: false,
            fails: true,
        }),
    )
    .await;
    assert_eq!(status, 400);
    assert!(answer.contains("body_incomplete"), "{answer}");
    assert!(received.is_none());
}

/// A body that sends one chunk and then never ends (`fails`: then fails instead).
struct OneChunk {
    sent: bool,
    fails: bool,
}

impl axum::body::HttpBody for OneChunk {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        use std::task::Poll;
        match (self.sent, self.fails) {
            (false, _) => {
                self.sent = true;
                Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(b"{")))))
            }
            (true, false) => Poll::Pending,
            (true, true) => Poll::Ready(Some(Err(std::io::Error::other("reset")))),
        }
    }
}

#[test]
fn body_parts_and_limits_are_checked_with_line_and_field() {
    let refused = |text: &str| {
        GatewayConfig::from_toml_str(text, "policies.toml")
            .unwrap_err()
            .to_string()
    };
    let message = refused(&format!(
        "{HEAD}[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1m\"\n\
         by = [\"json:user\"]\n"
    ));
    assert!(message.contains("policies.p.by"), "{message}");
    assert!(message.contains("JSON pointer"), "{message}");
    let message = refused(&format!(
        "{HEAD}[[routes]]\nname = \"login\"\npath = \"/login\"\nmax_body_bytes = 0\n"
    ));
    assert!(message.contains("routes.login.max_body_bytes"), "{message}");
    assert!(message.contains("policies.toml:"), "{message}");
}
