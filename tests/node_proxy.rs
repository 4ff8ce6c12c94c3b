//! `ratemesh node` as a reverse proxy, as a real process in front of test upstreams on
//! loopback: admitted requests reach the upstream with the `RateLimit` fields on the answer
//! and denied ones never do; hop-by-hop fields are dropped and forwarding fields appended
//! (a forged chain from an untrusted client is dropped); a 64 MiB body streams both ways
//! without being buffered; HTTP/2 to the upstream; an upstream that hangs, resets or refuses
//! is answered 504/502 in JSON, each request counted once, and the node keeps serving; a
//! kept-alive connection the upstream closes while it is idle costs no request; answers in
//! every HTTP/1.1 framing pass whole, and malformed ones are refused; bad
//! `[[proxy]]` entries are refused with the file, the line and the field.

mod support;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use ratemesh::node::NodeFile;
use support::upstream;
use support::*;

const POLICY: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [identity]\norder = [\"api_key\", \"ip\"]\ntrusted_proxies = [\"127.0.0.2\"]\n\n\
    [policies.per_key]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1h\"\nburst = 100\n\n\
    [policies.tight]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1h\"\nburst = 3\n\n\
    [tiers.api]\npolicies = [\"per_key\"]\n\n\
    [[routes]]\nname = \"tight\"\npath_prefix = \"/tight\"\npolicies = [\"tight\"]\n";

/// Start one node whose node file ends with `extra` (its `[[proxy]]` entries).
async fn node_with(dir: &std::path::Path, extra: &str) -> NodeProcess {
    let files = write_cluster_with(dir, 1, POLICY);
    edit_file(&files[0], |text| format!("{text}\n{extra}"));
    let node = start(&files[0]);
    wait_healthy(&client(), &node).await;
    node
}

fn proxy(prefix: &str, upstream: std::net::SocketAddr, settings: &str) -> String {
    format!("[[proxy]]\npath_prefix = \"{prefix}\"\nupstream = \"http://{upstream}\"\n{settings}\n")
}

/// The `r` (remaining) of `policy` in a response's `RateLimit` field.
fn remaining(headers: &reqwest::header::HeaderMap, policy: &str) -> u64 {
    let field = headers
        .get("ratelimit")
        .unwrap_or_else(|| panic!("no RateLimit field in {headers:?}"))
        .to_str()
        .unwrap();
    field
        .split(',')
        .map(str::trim)
        .find(|item| item.starts_with(&format!("\"{policy}\"")))
        .and_then(|item| item.split(';').find_map(|p| p.strip_prefix("r=")))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no r for {policy} in {field}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_requests_reach_the_upstream_and_denied_ones_never_do() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream::start(false).await;
    let extra = proxy("/tight", up.addr, "")
        + &proxy("/api", up.addr, "")
        + &proxy("/lean", up.addr, "forwarded = [\"X-Forwarded-For\"]");
    let node = node_with(dir.path(), &extra).await;
    let client = client();
    let base = format!("http://{}", node.http);

    for left in (0..3).rev() {
        let response = client
            .get(format!("{base}/tight/x"))
            .header("x-api-key", "k1")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-upstream"], "1");
        assert_eq!(remaining(response.headers(), "tight"), left);
        assert!(response.headers().contains_key("ratelimit-policy"));
        assert_eq!(response.text().await.unwrap(), "upstream ok\n");
    }
    for _ in 0..2 {
        let response = client
            .get(format!("{base}/tight/x"))
            .header("x-api-key", "k1")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 429);
        assert!(response.headers().contains_key("retry-after"));
        assert!(!response.headers().contains_key("x-upstream"));
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"], "rate_limited");
    }
    assert_eq!(up.count(), 3, "the upstream saw a denied request");

    // No route: the node answers itself, as without a proxy.
    let response = client
        .get(format!("{base}/elsewhere"))
        .header("x-api-key", "k1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("ratelimit"));
    assert_eq!(response.text().await.unwrap(), "ok\n");
    assert_eq!(up.count(), 3);

    // Hop-by-hop fields are dropped both ways; a forged forwarding chain from an untrusted
    // client is replaced by its address.
    let response = client
        .get(format!("{base}/api/orders?id=7"))
        .header("x-api-key", "k2")
        .header("connection", "x-custom-hop")
        .header("x-custom-hop", "1")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("te", "gzip")
        .header("x-forwarded-for", "203.0.113.9")
        .header("forwarded", "for=203.0.113.9")
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    for hop in ["x-up-hop", "keep-alive", "proxy-authenticate"] {
        assert!(!response.headers().contains_key(hop), "{hop} passed back");
    }
    assert!(response.headers().contains_key("ratelimit"));
    let seen = up.seen().pop().unwrap();
    assert_eq!(seen.path, "/api/orders?id=7");
    assert_eq!(seen.headers["x-api-key"], "k2");
    for hop in ["x-custom-hop", "proxy-authorization", "te", "connection"] {
        assert!(!seen.headers.contains_key(hop), "{hop} passed on");
    }
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(
        seen.headers["forwarded"],
        format!("for=127.0.0.1;proto=http;host=\"{}\"", node.http).as_str()
    );

    // From a trusted proxy the chain is kept and this hop appended.
    let trusted = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let response = trusted
        .get(format!("{base}/api/orders"))
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = up.seen().pop().unwrap();
    assert_eq!(seen.headers["x-forwarded-for"], "203.0.113.9, 127.0.0.2");

    // A route that writes only `X-Forwarded-For` still drops an untrusted client's others.
    let response = client
        .get(format!("{base}/lean/x"))
        .header("x-api-key", "k3")
        .header("forwarded", "for=203.0.113.9")
        .header("x-forwarded-host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = up.seen().pop().unwrap();
    assert_eq!(seen.path, "/lean/x");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    for name in ["forwarded", "x-forwarded-proto", "x-forwarded-host"] {
        assert!(
            !seen.headers.contains_key(name),
            "{name} reached the upstream"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_upstream_is_answered_in_json_counted_once_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream::start(false).await;
    let (hang, hang_accepted, _hang_task) = upstream::hanging().await;
    let (reset, _reset_task) = upstream::resetting().await;
    let refused = upstream::refusing();
    // A listener whose accept queue is full: connections to it are never accepted.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = socket.listen(0).unwrap();
    let full_addr = full.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        let connect = tokio::net::TcpStream::connect(full_addr);
        if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(200), connect).await {
            fillers.push(stream);
        }
    }
    let extra = proxy("/hang", hang, "timeout = \"500ms\"")
        + &proxy("/reset", reset, "")
        + &proxy("/refused", refused, "")
        + &proxy("/full", full_addr, "connect_timeout = \"300ms\"")
        + &proxy("/ok", up.addr, "");
    let node = node_with(dir.path(), &extra).await;
    let client = client();
    let base = format!("http://{}", node.http);

    let mut left = 100;
    let cases = [
        ("/hang/x", 504, "upstream_timeout"),
        ("/reset/x", 502, "upstream_reset"),
        ("/refused/x", 502, "upstream_refused"),
        ("/full/x", 504, "upstream_connect_timeout"),
    ];
    for (path, status, error) in cases {
        let started = Instant::now();
        let response = client
            .post(format!("{base}{path}"))
            .header("x-api-key", "k")
            .body("some body")
            .send()
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!(response.status(), status, "{path}");
        assert_eq!(response.headers()["content-type"], "application/json");
        left -= 1;
        assert_eq!(
            remaining(response.headers(), "per_key"),
            left,
            "{path} was counted more than once"
        );
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"], error, "{path}: {body}");
        assert!(body["message"].is_string());
        if path == "/hang/x" {
            assert!(
                took >= Duration::from_millis(450) && took < Duration::from_secs(3),
                "504 after {took:?}, the route's timeout is 500 ms"
            );
        }
    }
    assert_eq!(
        *hang_accepted.lock().unwrap(),
        1,
        "the hanging request was retried"
    );

    // A client that pauses its body for longer than the route's timeout, to an upstream
    // that waits for all of it: 408, the client's fault, not the upstream's.
    let (pieces, receiver) = tokio::sync::mpsc::channel(1);
    pieces.send(Bytes::from_static(b"a start")).await.unwrap();
    let started = Instant::now();
    let response = send_raw(&node, "/hang/upload", Channel(receiver)).await;
    assert_eq!(response.status(), 408);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "request_body_stalled");
    drop(pieces);

    // The node keeps serving, proxied and not.
    let response = client
        .get(format!("{base}/ok/x"))
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(remaining(response.headers(), "per_key"), left - 1);
    wait_health(&client, &node, 200).await;
    let metrics = metrics_of(&client, &node).await;
    let reasons = cases.iter().map(|c| c.2).chain(["request_body_stalled"]);
    for reason in reasons {
        let line = format!("ratemesh_proxy_errors_total{{reason=\"{reason}\"}} 1");
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in:\n{metrics}"
        );
    }
    drop(fillers);
}

/// A kept-alive connection the upstream closes while it waits in the node's pool is not
/// used for the next request: that request goes on a new connection, reaches the upstream
/// once, and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_closes_its_idle_connections_costs_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, answered, _task) = upstream::closing_when_idle(Duration::from_millis(20)).await;
    let node = node_with(dir.path(), &proxy("/idle", addr, "")).await;
    let client = client();
    for i in 0..6 {
        let response = client
            .get(format!("http://{}/idle/{i}", node.http))
            .header("x-api-key", "idle")
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert_eq!(
            (status.as_u16(), body.as_str()),
            (200, "ok\n"),
            "request {i}"
        );
        // The upstream closes the connection the node keeps for the next request.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(
        *answered.lock().unwrap(),
        6,
        "each request reached the upstream once"
    );
}

/// Answers framed every way HTTP/1.1 allows, each written in pieces, reach the client whole:
/// a `Content-Length` body larger than a read, chunks with extensions and a trailer, 1xx
/// answers before the final one, a 204, a `HEAD`, a body that runs to the close; those that
/// leave the connection fit for another request reuse connections. An answer that is not
/// HTTP, or gives two lengths, is a 502 `upstream_malformed`; one cut mid-body ends the
/// client's body early. The node keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_in_every_framing_pass_whole_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, accepted, _task) = upstream::scripted().await;
    let node = node_with(dir.path(), &proxy("/s", addr, "")).await;
    let client = client();
    let url = |path: &str| format!("http://{}/s/{path}", node.http);
    let get = |path: &str| client.get(url(path)).header("x-api-key", "framing").send();

    for round in 0..3 {
        let response = get("length").await.unwrap();
        assert_eq!(response.status(), 200, "round {round}");
        assert_eq!(response.headers()["x-kind"], "length");
        assert!(response.headers().contains_key("ratelimit"));
        let body = response.bytes().await.unwrap();
        assert!(
            body[..] == upstream::scripted_length_body()[..],
            "round {round}"
        );

        let response = get("chunked").await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.text().await.unwrap(), "hello world");

        let response = get("interim").await.unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.text().await.unwrap(), "ok");

        let response = get("nocontent").await.unwrap();
        assert_eq!(response.status(), 204);
        assert_eq!(response.headers()["x-kind"], "none");

        let response = client
            .head(url("length"))
            .header("x-api-key", "framing")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-length"], "200000");
    }
    let kept = *accepted.lock().unwrap();
    assert!(
        kept < 15,
        "15 exchanges that keep their connection took {kept} connections: none was reused"
    );

    // The chunks give the length; the `Content-Length` beside them is not passed on.
    let response = get("chunked-and-length").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "hello world");

    let response = get("close").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "until the close");

    for path in ["garbage", "two-lengths"] {
        let response = get(path).await.unwrap();
        assert_eq!(response.status(), 502, "{path}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"], "upstream_malformed", "{path}");
    }

    let response = get("cut").await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.bytes().await.is_err(),
        "a body cut short must not look complete"
    );

    let response = get("length").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap().len(), 200_000);
    let metrics = metrics_of(&client, &node).await;
    for line in [
        "ratemesh_proxy_errors_total{reason=\"upstream_malformed\"} 2",
        "ratemesh_proxy_errors_total{reason=\"response_aborted\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in:\n{metrics}"
        );
    }
}

/// An upstream that closes the connection on a request without answering gets that request
/// at most twice (once more on a new connection, and only for a safe method), however many
/// kept-alive connections the node holds; a `POST` once. The node keeps serving. (And chunks
/// whose lines end in a bare LF are refused: the client's body breaks off.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_upstream_drops_is_sent_at_most_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _accepted, _task) = upstream::scripted().await;
    let node = node_with(dir.path(), &proxy("/s", addr, "")).await;
    let client = client();
    let url = |path: &str| format!("http://{}/s/{path}", node.http);
    // Kept-alive connections on both of the node's HTTP threads.
    for _ in 0..3 {
        let mut answers = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let request = client.get(url("nocontent")).header("x-api-key", "drops");
            answers.spawn(async move { request.send().await.unwrap().status() });
        }
        while let Some(status) = answers.join_next().await {
            assert_eq!(status.unwrap(), 204);
        }
    }
    // Chunks whose lines end in a bare LF are refused, as other HTTP/1.1 parsers refuse
    // them (two readers of one body must not disagree on where it ends): the head went on,
    // the body breaks off.
    let response = client
        .get(url("bare-lf"))
        .header("x-api-key", "drops")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.bytes().await.is_err(),
        "a body in bare-LF chunks must not look complete"
    );

    let before = upstream::scripted_drops();
    let response = client
        .get(url("drop"))
        .header("x-api-key", "drops")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"], "upstream_reset");
    let sent = upstream::scripted_drops() - before;
    assert!(
        (1..=2).contains(&sent),
        "a dropped GET was sent {sent} times"
    );

    let before = upstream::scripted_drops();
    let response = client
        .post(url("drop"))
        .header("x-api-key", "drops")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(
        upstream::scripted_drops() - before,
        1,
        "a POST was sent again"
    );

    let response = client
        .get(url("nocontent"))
        .header("x-api-key", "drops")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
}

/// A connection whose upstream says it closes idle connections within a second
/// (`Keep-Alive: timeout=1`) is not kept for another request; others are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_s_keep_alive_timeout_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, accepted, _task) = upstream::scripted().await;
    let node = node_with(dir.path(), &proxy("/s", addr, "")).await;
    // One client connection, request after request: it is served by one HTTP thread, whose
    // pool alone the upstream connections go back to (a client's second connection could
    // land on another thread and open one of its own).
    let stream = tokio::net::TcpStream::connect(node.http).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut get = async |path: &str| {
        let request = hyper::Request::get(format!("/s/{path}"))
            .header("host", node.http.to_string())
            .header("x-api-key", "brief")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    };
    let opened = || *accepted.lock().unwrap();
    let before = opened();
    for _ in 0..3 {
        assert_eq!(get("nocontent").await.0, 204);
    }
    let kept = opened() - before;
    assert!(kept <= 1, "3 requests in a row took {kept} connections");
    let before = opened();
    for _ in 0..3 {
        let (status, body) = get("brief").await;
        assert_eq!(status, 200);
        assert_eq!(&body[..], b"ok");
    }
    let brief = opened() - before;
    assert!(
        brief >= 2,
        "answers with keep-alive: timeout=1 left their connection in the pool ({brief} opened)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_past_the_route_limit_are_answered_413() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream::start(false).await;
    let (hang, _, _hang_task) = upstream::hanging().await;
    let limited = "max_body_bytes = 1000";
    let extra = proxy("/echo", up.addr, limited) + &proxy("/sink", hang, limited);
    let node = node_with(dir.path(), &extra).await;
    let client = client();
    let url = format!("http://{}/echo/small", node.http);

    // A declared length past the limit: refused before any decision.
    let response = client
        .post(&url)
        .header("x-api-key", "k")
        .body(vec![b'x'; 2000])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"], "body_too_large");
    assert_eq!(up.count(), 0);

    // Within the limit: echoed, and the first request counted.
    let response = client
        .post(&url)
        .header("x-api-key", "k")
        .body(vec![b'y'; 1000])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(remaining(response.headers(), "per_key"), 99);
    assert_eq!(response.bytes().await.unwrap().len(), 1000);

    // A body without a length that runs past the limit, to an upstream that reads it all
    // before answering: cut, and 413 (the node closes the connection after it, so the
    // client may see its upload broken off instead).
    let (pieces, receiver) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        for _ in 0..4 {
            let _ = pieces.send(Bytes::from(vec![b'z'; 600])).await;
        }
    });
    let stream = tokio::net::TcpStream::connect(node.http).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post("/sink/upload")
        .header("host", node.http.to_string())
        .header("x-api-key", "k")
        .body(Channel(receiver))
        .unwrap();
    if let Ok(response) = sender.send_request(request).await {
        assert_eq!(response.status(), 413);
    }
    wait_metric_line(
        &client,
        &node,
        "ratemesh_proxy_errors_total{reason=\"request_body_too_large\"} 1",
    )
    .await;
    wait_health(&client, &node, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_to_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream::start(true).await;
    let node = node_with(dir.path(), &proxy("/h2", up.addr, "http2 = true")).await;
    let client = client();
    let response = client
        .get(format!("http://{}/h2/x", node.http))
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-upstream-version"], "HTTP/2.0");
    assert!(response.headers().contains_key("ratelimit"));
    assert_eq!(up.seen()[0].version, http::Version::HTTP_2);
    let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let response = client
        .post(format!("http://{}/h2/echo", node.http))
        .header("x-api-key", "k")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.bytes().await.unwrap() == body, "the echo differs");
}

#[test]
fn bad_proxy_entries_are_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, POLICY);
    let good = std::fs::read_to_string(&files[0]).unwrap();
    let check = |extra: &str, field: &str, reason: &str| {
        let path = dir.path().join("bad.toml");
        let text = format!("{good}\n{extra}");
        std::fs::write(&path, &text).unwrap();
        let error = NodeFile::from_file(&path).unwrap_err();
        assert_eq!(error.field, field, "{error}");
        assert!(error.reason.contains(reason), "{error}");
        let key = field.rsplit('.').next().unwrap();
        let line = text
            .lines()
            .collect::<Vec<_>>()
            .iter()
            .rposition(|l| l.starts_with(&format!("{key} =")))
            .map(|i| i + 1);
        if let Some(line) = line {
            assert_eq!(error.line, line, "{error}");
        }
        error
    };
    let ok = "[[proxy]]\npath_prefix = \"/a\"\nupstream = \"http://127.0.0.1:9\"\n";
    check(
        "[[proxy]]\npath_prefix = \"/api\"\nupstream = \"https://127.0.0.1:9000\"\n",
        "proxy[0].upstream",
        "TLS",
    );
    check(
        "[[proxy]]\npath_prefix = \"api\"\nupstream = \"http://127.0.0.1:9000\"\n",
        "proxy[0].path_prefix",
        "start with",
    );
    check(
        &format!("{ok}\n[[proxy]]\npath_prefix = \"/a/\"\nupstream = \"http://127.0.0.1:8\"\n"),
        "proxy[1].path_prefix",
        "also the prefix of proxy[0]",
    );
    check(
        &format!("{ok}timeout = \"0s\"\n"),
        "proxy[0].timeout",
        "between",
    );
    check(
        &format!("{ok}connect_timeout = \"soon\"\n"),
        "proxy[0].connect_timeout",
        "",
    );
    check(
        "[[proxy]]\npath_prefix = \"/health\"\nupstream = \"http://127.0.0.1:9\"\n",
        "proxy[0].path_prefix",
        "own endpoint",
    );
    check(
        "[[proxy]]\npath_prefix = \"/a\"\nupstream = \"http://127.0.0.1:9/base\"\n",
        "proxy[0].upstream",
        "path",
    );
    check(
        &format!("{ok}forwarded = [\"x-real-ip\"]\n"),
        "proxy[0].forwarded",
        "not a forwarding field",
    );
    check(
        &format!("{ok}max_body_bytes = -1\n"),
        "proxy[0].max_body_bytes",
        "≥ 0",
    );
    let error = NodeFile::from_file({
        let path = dir.path().join("unknown.toml");
        std::fs::write(&path, format!("{good}\n{ok}retries = 3\n")).unwrap();
        path
    })
    .unwrap_err();
    assert!(error.reason.contains("unknown field"), "{error}");

    let path = dir.path().join("fine.toml");
    std::fs::write(
        &path,
        format!("{good}\n{ok}http2 = true\ntimeout = \"2s\"\n"),
    )
    .unwrap();
    let file = NodeFile::from_file(&path).unwrap();
    assert_eq!(file.proxies.len(), 1);
    assert_eq!(file.proxies[0].timeout, Duration::from_secs(2));
    assert!(file.proxies[0].http2);
}

#[path = "node_proxy/streams.rs"]
mod streams;
use streams::{Channel, send_raw};
