//! Concurrency policies (`algorithm = "concurrency"`) in the tower layer, on a manual clock:
//! a slot is held until the response's body ends, is given back when the body is dropped
//! unread, the service fails or the call is dropped, and is reclaimed after `max_hold`;
//! random interleavings never hold more than the limit and never deny below it; the file's
//! checks; the decision API refuses such a policy.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use http_body::Frame;
use http_body_util::BodyExt;
use proptest::prelude::*;
use ratemesh::config::GatewayConfig;
use ratemesh::http::RateLimitLayer;
use ratemesh::{ManualClock, Nanos};
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};

const S: Nanos = 1_000_000_000;
const T0: Nanos = 1_000 * S;

fn file(limit: u64, extra: &str) -> String {
    format!(
        "env = \"test\"\ndefault_tier = \"api\"\n\n\
         [policies.in_flight]\nalgorithm = \"concurrency\"\nlimit = {limit}\n{extra}\n\n\
         [tiers.api]\npolicies = [\"in_flight\"]\n"
    )
}

/// A body that ends when its sender fires (or is dropped).
struct Gated(Option<oneshot::Receiver<()>>);

impl http_body::Body for Gated {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(rx) = self.0.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => {
                self.0 = None;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"done")))))
            }
        }
    }
}

/// The protected service: `/fail` fails, `/hang` never answers, anything else answers at
/// once with a body that ends when the test says (its senders, in order).
#[derive(Clone, Default)]
struct Upstream {
    ends: Arc<Mutex<Vec<oneshot::Sender<()>>>>,
}

impl Service<http::Request<Body>> for Upstream {
    type Response = http::Response<Body>;
    type Error = &'static str;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let path = request.uri().path().to_owned();
        let ends = Arc::clone(&self.ends);
        Box::pin(async move {
            match path.as_str() {
                "/fail" => Err("upstream failed"),
                "/hang" => std::future::pending().await,
                _ => {
                    let (tx, rx) = oneshot::channel();
                    ends.lock().unwrap().push(tx);
                    Ok(http::Response::new(Body::new(Gated(Some(rx)))))
                }
            }
        })
    }
}

struct Gateway<S> {
    service: S,
    upstream: Upstream,
    clock: ManualClock,
}

fn gateway(
    limit: u64,
    extra: &str,
) -> Gateway<impl Service<http::Request<Body>, Response = http::Response<Body>, Error = &'static str>>
{
    let clock = ManualClock::new(T0);
    let config = GatewayConfig::from_toml_str(&file(limit, extra), "concurrency.toml").unwrap();
    let layer = RateLimitLayer::with_clock(config, Arc::new(clock.clone())).unwrap();
    let upstream = Upstream::default();
    Gateway {
        service: layer.layer(upstream.clone()),
        upstream,
        clock,
    }
}

fn request(path: &str) -> http::Request<Body> {
    http::Request::builder()
        .uri(path)
        .header("x-api-key", "one-client")
        .body(Body::empty())
        .unwrap()
}

async fn call<S>(g: &mut Gateway<S>, path: &str) -> Result<http::Response<Body>, &'static str>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = &'static str>,
{
    g.service.ready().await?.call(request(path)).await
}

/// End the `i`-th body the upstream started, and read the response to its end.
async fn finish(g: &Gateway<impl Sized>, response: http::Response<Body>, i: usize) {
    let tx = std::mem::replace(
        &mut g.upstream.ends.lock().unwrap()[i],
        oneshot::channel().0,
    );
    tx.send(()).unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"done");
}

#[tokio::test]
async fn a_slot_is_held_until_the_body_ends_and_a_denial_says_to_retry_soon() {
    let mut g = gateway(2, "");
    let first = call(&mut g, "/").await.unwrap();
    let second = call(&mut g, "/").await.unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let denied = call(&mut g, "/").await.unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["retry-after"], "1");
    // The first body ends: its slot is free.
    finish(&g, first, 0).await;
    let third = call(&mut g, "/").await.unwrap();
    assert_eq!(third.status(), 200);
    assert_eq!(call(&mut g, "/").await.unwrap().status(), 429);
    // A body dropped unread (the client went away) gives its slot back too.
    drop(second);
    let fourth = call(&mut g, "/").await.unwrap();
    assert_eq!(fourth.status(), 200);
    assert_eq!(call(&mut g, "/").await.unwrap().status(), 429);
    drop((third, fourth));
}

#[tokio::test]
async fn a_failed_service_or_a_dropped_call_gives_its_slot_back() {
    let mut g = gateway(1, "");
    assert_eq!(call(&mut g, "/fail").await.unwrap_err(), "upstream failed");
    let held = call(&mut g, "/").await.unwrap();
    assert_eq!(held.status(), 200);
    drop(held);
    // A call whose service never answers, dropped (the client went away).
    let hanging = g.service.ready().await.unwrap().call(request("/hang"));
    let hanging = tokio::time::timeout(std::time::Duration::from_millis(20), hanging).await;
    assert!(hanging.is_err(), "the service never answers");
    let response = call(&mut g, "/").await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_slot_held_past_max_hold_is_reclaimed() {
    let mut g = gateway(1, "max_hold = \"10s\"");
    let old = call(&mut g, "/").await.unwrap();
    assert_eq!(call(&mut g, "/").await.unwrap().status(), 429);
    g.clock.advance_ns(10 * S);
    // Reclaimed: the only way past the limit (two bodies now stream).
    let new = call(&mut g, "/").await.unwrap();
    assert_eq!(new.status(), 200);
    // The old body's end gives back nothing: the new request keeps its slot.
    finish(&g, old, 0).await;
    assert_eq!(call(&mut g, "/").await.unwrap().status(), 429);
    finish(&g, new, 1).await;
    assert_eq!(call(&mut g, "/").await.unwrap().status(), 200);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Requests start and end in any order, with time passing (below `max_hold`): in
    /// flight never above the limit, and a request is denied only when the limit is held.
    #[test]
    fn never_above_the_limit_never_denied_below_it(
        limit in 1u64..5,
        steps in proptest::collection::vec((0u8..3, 0usize..8, 0u64..3), 1..60),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async move {
            let mut g = gateway(limit, "max_hold = \"1h\"");
            let mut open: Vec<(usize, http::Response<Body>)> = Vec::new();
            let mut started = 0;
            for (op, pick, seconds) in steps {
                g.clock.advance_ns(seconds * S);
                if op < 2 || open.is_empty() {
                    let response = call(&mut g, "/").await.unwrap();
                    if response.status() == 200 {
                        open.push((started, response));
                        started += 1;
                    } else {
                        assert_eq!(response.status(), 429);
                        assert_eq!(open.len() as u64, limit, "denied below the limit");
                    }
                    assert!(open.len() as u64 <= limit, "above the limit");
                } else {
                    let (i, response) = open.remove(pick % open.len());
                    if op == 2 && pick % 2 == 0 {
                        finish(&g, response, i).await;
                    } else {
                        drop(response);
                    }
                }
            }
        });
    }
}

#[test]
fn the_file_says_what_a_concurrency_policy_cannot_take() {
    let error = |extra: &str| {
        GatewayConfig::from_toml_str(&file(3, extra), "c.toml")
            .expect_err(extra)
            .to_string()
    };
    assert!(error("window = \"1m\"").contains("not used by algorithm `concurrency`"));
    assert!(error("max_hold = \"0s\"").contains("max_hold"));
    assert!(error("max_hold = \"2d\"").contains("max_hold"));
    assert!(error("count_when = { status = [500] }").contains("whatever its status"));
    assert!(error("block_for = \"1m\"").contains("locks no key out"));
    let cached = file(
        3,
        "backend = \"redis\"\ntoken_cache = { batch = 1, ttl = \"1s\" }",
    ) + "\n[redis]\nurl = \"redis://127.0.0.1:1\"\n";
    let cached = GatewayConfig::from_toml_str(&cached, "c.toml").expect_err("token_cache");
    assert!(cached.to_string().contains("token_cache"), "{cached}");
    let mesh = format!("key_secret = \"s\"\n{}", file(3, "backend = \"mesh\""));
    let mesh = GatewayConfig::from_toml_str(&mesh, "c.toml").expect_err("mesh");
    assert!(
        mesh.to_string().contains("does not share concurrency"),
        "{mesh}"
    );
    // A window policy takes no `max_hold`.
    let other = "env = \"t\"\ndefault_tier = \"api\"\n[policies.p]\nalgorithm = \"fixed-window\"\n\
                 limit = 3\nwindow = \"1m\"\nmax_hold = \"1m\"\n[tiers.api]\npolicies = [\"p\"]\n";
    let other = GatewayConfig::from_toml_str(other, "c.toml").expect_err("max_hold");
    assert!(other.to_string().contains("max_hold"));
}

#[tokio::test]
async fn the_decision_api_refuses_a_concurrency_policy() {
    let config = GatewayConfig::from_toml_str(&file(3, ""), "c.toml").unwrap();
    let layer = RateLimitLayer::with_clock(config, Arc::new(ManualClock::new(T0))).unwrap();
    let error = layer
        .rules()
        .decide_direct("in_flight", &serde_json::Map::new(), 1, T0)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("held until a response ends"),
        "{error}"
    );
}

#[tokio::test]
async fn a_call_dropped_in_a_shaping_delay_gives_its_slot_back() {
    let text = "env = \"test\"\ndefault_tier = \"api\"\n\n\
                [policies.in_flight]\nalgorithm = \"concurrency\"\nlimit = 1\n\n\
                [policies.shaper]\nalgorithm = \"leaky-bucket-shape\"\nrate = 1\nperiod = \"10s\"\n\
                max_wait = \"60s\"\nby = [\"header:x-shape\"]\n\n\
                [tiers.api]\npolicies = [\"in_flight\", \"shaper\"]\n";
    let config = GatewayConfig::from_toml_str(text, "shaped.toml").unwrap();
    let layer = RateLimitLayer::with_clock(config, Arc::new(ManualClock::new(T0))).unwrap();
    let upstream = Upstream::default();
    let mut g = Gateway {
        service: layer.layer(upstream.clone()),
        upstream,
        clock: ManualClock::new(T0),
    };
    let shaped = |shape: &str| {
        http::Request::builder()
            .uri("/")
            .header("x-api-key", "one-client")
            .header("x-shape", shape)
            .body(Body::empty())
            .unwrap()
    };
    // The shaper's first request passes at once; its answer ends.
    let first = g
        .service
        .ready()
        .await
        .unwrap()
        .call(shaped("a"))
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    finish(&g, first, 0).await;
    // The second waits 10 s to be shaped, holding the slot, and is dropped while it waits.
    let waiting = g.service.ready().await.unwrap().call(shaped("a"));
    let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), waiting).await;
    assert!(waiting.is_err(), "shaped, so still waiting");
    // Its slot went back with it.
    let other = g
        .service
        .ready()
        .await
        .unwrap()
        .call(shaped("b"))
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
}
