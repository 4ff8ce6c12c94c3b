//! `ratemesh node` answering Envoy's rate limit service API on its `[envoy_rls]` gRPC port,
//! as real processes on loopback.
//!
//! An independent client (Python's grpcio with stubs that grpcio-tools compiles at test time
//! from `tests/fixtures/envoy_rls/rls.proto`, written from Envoy's API by hand) spreads one
//! descriptor over three nodes, which share its `mesh` limit, and sees `OVER_LIMIT` with
//! `limit_remaining` 0 and the time to the window's end; a local descriptor counts down
//! exactly; unknown descriptors are `OK`, an unknown domain `NOT_FOUND`; hits above the limit
//! are over it and charge nothing; a request is charged all or nothing. That test skips with
//! a notice when `python3 -c "import grpc, grpc_tools"` fails, and fails instead when
//! `RATEMESH_REQUIRE_ENVOY_CLIENT=1` is set (as in CI).
//!
//! A tonic client (the `envoy-types` stubs) sends bad input: gRPC statuses with messages,
//! nothing charged, and the node keeps serving; it also reloads the descriptors on SIGHUP
//! and drains on SIGTERM. Node files with a bad `[envoy_rls]` are refused with file, line
//! and field. `cluster/envoy.yaml` and `deploy/envoy/login-outcomes.yaml` are parsed as
//! Envoy's `Bootstrap` message from Envoy's own `.proto` files (those the envoy-types crate
//! ships) by the same Python tools (the second's calls: `tests/node_envoy_outcomes.rs`).

mod support;

#[path = "support/rls.rs"]
mod rls;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ratemesh::node::NodeFile;
use rls::*;
use serde_json::Value;
use support::*;

/// A fleet-wide limit of 30 an hour per address (mesh), 3 a minute per user on each node,
/// and a shadow descriptor.
const POLICIES: &str = r#"
env = "test"
key_secret = "test-secret"

[envoy]
backend = "mesh"

[[envoy.domains]]
domain = "edge"
descriptors = [
  { key = "remote_address", rate_limit = { requests_per_unit = 30, unit = "hour" } },
  { key = "user", backend = "local", rate_limit = { requests_per_unit = 3, unit = "minute" } },
  { key = "watch", backend = "local", shadow_mode = true, rate_limit = { requests_per_unit = 1, unit = "minute" } },
]
"#;

/// The Python client (python3 with grpcio, grpcio-tools and PyYAML), or `None` (after a
/// notice, or a failure when it is required).
fn python_client() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/envoy_rls/client.py");
    let check = Command::new("python3").arg(&script).arg("--check").output();
    match check {
        Ok(output) if output.status.success() => Some(script),
        other => {
            let why = match other {
                Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_string(),
                Err(error) => error.to_string(),
            };
            if std::env::var("RATEMESH_REQUIRE_ENVOY_CLIENT").as_deref() == Ok("1") {
                panic!(
                    "the Envoy RLS client needs python3 with grpcio, grpcio-tools and PyYAML ({why}); \
                     RATEMESH_REQUIRE_ENVOY_CLIENT=1 is set"
                );
            }
            eprintln!(
                "skipping: the Envoy RLS client needs python3 with grpcio, grpcio-tools and \
                 PyYAML (`python3 -m pip install grpcio grpcio-tools pyyaml`): {why}"
            );
            None
        }
    }
}

/// Run the Python client on `calls`; return one answer per call.
fn run_client(script: &Path, calls: &Value) -> Vec<Value> {
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(calls.to_string().as_bytes())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the Python client hangs");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "the Python client failed: {out}");
    let answers: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), calls.as_array().unwrap().len(), "{out}");
    answers
}

fn call(target: SocketAddr, domain: &str, descriptors: Value) -> Value {
    serde_json::json!({"target": target.to_string(), "domain": domain, "descriptors": descriptors})
}

/// Seconds to the end of the window of `unit` seconds, now.
fn to_window_end(unit: f64) -> f64 {
    unit - unix_seconds() % unit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_client_sees_three_nodes_share_one_limit_and_over_limit_answers() {
    let Some(script) = python_client() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (files, rls) = rls_cluster(dir.path(), 3, POLICIES);
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    for node in &nodes {
        wait_healthy(&client(), node).await;
    }
    // The run takes a few seconds: keep it inside one minute (and so one hour).
    away_from_window_ends(20.0);

    let mut calls = Vec::new();
    // 45 requests for one address, round-robin over the three nodes: one limit of 30.
    for i in 0..45 {
        calls.push(call(
            rls[i % 3],
            "edge",
            serde_json::json!([{"entries": [["remote_address", "203.0.113.9"]]}]),
        ));
    }
    // A local descriptor on node 1: 3 a minute, counted down.
    for _ in 0..4 {
        calls.push(call(
            rls[0],
            "edge",
            serde_json::json!([{"entries": [["user", "ann"]]}]),
        ));
    }
    // Unknown descriptor, unknown domain, no domain.
    calls.push(call(
        rls[0],
        "edge",
        serde_json::json!([{"entries": [["country", "fr"]]}]),
    ));
    calls.push(call(
        rls[0],
        "shop",
        serde_json::json!([{"entries": [["user", "ann"]]}]),
    ));
    calls.push(call(
        rls[0],
        "",
        serde_json::json!([{"entries": [["user", "ann"]]}]),
    ));
    // Hits above the limit (request-level 4 > 3): over, nothing charged; then bob has 3.
    let mut over = call(
        rls[0],
        "edge",
        serde_json::json!([{"entries": [["user", "bob"]]}]),
    );
    over["hits_addend"] = 4.into();
    calls.push(over);
    calls.push(call(
        rls[0],
        "edge",
        serde_json::json!([{"entries": [["user", "bob"]]}]),
    ));
    // All or nothing: cat would be admitted, ann is over: cat keeps its 3.
    calls.push(call(
        rls[0],
        "edge",
        serde_json::json!([{"entries": [["user", "cat"]]}, {"entries": [["user", "ann"]]}]),
    ));
    // Shadow: over its limit of 1 on the second call, answered OK.
    for _ in 0..2 {
        calls.push(call(
            rls[0],
            "edge",
            serde_json::json!([{"entries": [["watch", "w"]]}]),
        ));
    }
    let started = Instant::now();
    let answers = run_client(&script, &Value::Array(calls));
    let (minute_end, hour_end) = (to_window_end(60.0), to_window_end(3600.0));
    eprintln!(
        "the Python client: {} calls in {:?}",
        answers.len(),
        started.elapsed()
    );

    // One fleet-wide limit.
    let (shared, rest) = answers.split_at(45);
    let ok = shared.iter().filter(|a| a["overall_code"] == "OK").count();
    eprintln!("{ok} of 45 admitted across three nodes (limit 30)");
    assert!(
        (27..=30).contains(&ok),
        "{ok} of 45 admitted across three nodes (limit 30)"
    );
    let last = &shared[44];
    assert_eq!(last["grpc"], "OK");
    assert_eq!(last["overall_code"], "OVER_LIMIT", "{last}");
    let status = &last["statuses"][0];
    assert_eq!(status["code"], "OVER_LIMIT");
    assert_eq!(status["limit_remaining"], 0);
    assert_eq!(status["current_limit"]["requests_per_unit"], 30);
    assert_eq!(status["current_limit"]["unit"], "HOUR");
    assert_eq!(status["current_limit"]["name"], "edge/remote_address");
    let reset = status["duration_until_reset"].as_f64().unwrap();
    assert!(
        (hour_end - 1.0..=hour_end + 30.0).contains(&reset),
        "duration_until_reset {reset} s, the hour ends in {hour_end} s"
    );
    let headers = &last["headers"];
    assert_eq!(headers["x-ratelimit-limit"], "30");
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert!(headers["retry-after"].as_str().is_some(), "{headers}");
    assert!(
        headers["ratelimit"]
            .as_str()
            .unwrap()
            .starts_with("\"edge/remote_address\";r=0;t="),
        "{headers}"
    );
    assert_eq!(
        headers["ratelimit-policy"],
        "\"edge/remote_address\";q=30;w=3600"
    );

    // Counted down on node 1, then over until the minute's end.
    let remaining: Vec<u64> = rest[..3]
        .iter()
        .map(|a| {
            assert_eq!(a["overall_code"], "OK", "{a}");
            a["statuses"][0]["limit_remaining"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(remaining, [2, 1, 0]);
    let over = &rest[3]["statuses"][0];
    assert_eq!(rest[3]["overall_code"], "OVER_LIMIT");
    assert_eq!(
        (over["code"].as_str(), over["limit_remaining"].as_u64()),
        (Some("OVER_LIMIT"), Some(0))
    );
    assert_eq!(over["current_limit"]["unit"], "MINUTE");
    let reset = over["duration_until_reset"].as_f64().unwrap();
    assert!(
        (minute_end - 1.0..=minute_end + 30.0).contains(&reset),
        "duration_until_reset {reset} s, the minute ends in {minute_end} s"
    );
    assert_eq!(rest[3]["headers"]["x-ratelimit-remaining"], "0");

    // Unknown descriptor: OK without a limit; unknown domain and no domain: gRPC errors.
    assert_eq!(rest[4]["overall_code"], "OK");
    assert!(rest[4]["statuses"][0].get("current_limit").is_none());
    assert_eq!(rest[5]["grpc"], "NOT_FOUND");
    assert!(
        rest[5]["message"].as_str().unwrap().contains("edge"),
        "{}",
        rest[5]
    );
    assert_eq!(rest[6]["grpc"], "INVALID_ARGUMENT");
    assert!(rest[6]["message"].as_str().unwrap().contains("domain"));
    // Hits above the limit: over, and nothing was charged.
    assert_eq!(rest[7]["overall_code"], "OVER_LIMIT");
    assert_eq!(rest[8]["statuses"][0]["limit_remaining"], 2);
    // All or nothing.
    assert_eq!(rest[9]["overall_code"], "OVER_LIMIT");
    assert_eq!(rest[9]["statuses"][0]["code"], "OK");
    assert_eq!(rest[9]["statuses"][0]["limit_remaining"], 3);
    assert_eq!(rest[9]["statuses"][1]["code"], "OVER_LIMIT");
    // Shadow: never over.
    assert_eq!(rest[10]["overall_code"], "OK");
    assert_eq!(rest[11]["overall_code"], "OK");

    let text = metrics_of(&client(), &nodes[0]).await;
    for (result, at_least) in [
        ("ok", 9.0),
        ("over_limit", 3.0),
        ("unknown_domain", 1.0),
        ("invalid_argument", 1.0),
    ] {
        let value = metric(
            &text,
            &format!("ratemesh_envoy_rls_requests_total{{result=\"{result}\"}}"),
        );
        assert!(value >= at_least, "{result}: {value}");
    }
    assert!(
        text.contains(
            "ratemesh_decisions_total{policy=\"edge/watch\",outcome=\"shadow_denied\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("ratemesh_envoy_rls_descriptors_total{match=\"unknown\"} 1"));
}

/// The bytes of a gRPC call as they are, to send what does not decode.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawBytes;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawBytes;
    type Decoder = RawBytes;

    fn encoder(&mut self) -> RawBytes {
        RawBytes
    }

    fn decoder(&mut self) -> RawBytes {
        RawBytes
    }
}

impl tonic::codec::Encoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

/// Send `bytes` as the body of a `ShouldRateLimit` call.
async fn raw_call(addr: SocketAddr, bytes: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(tonic::Request::new(bytes), path, RawCodec)
        .await
        .map(|r| r.into_inner())
}

/// Write `bytes` to `addr` on a fresh connection; tell whether the node closed it within 5 s.
fn closed_after(addr: SocketAddr, bytes: &[u8]) -> bool {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let mut sink = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_grpc_statuses_nothing_is_charged_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let local = POLICIES.replace("[envoy]\nbackend = \"mesh\"\n", "");
    let (files, rls) = rls_cluster(dir.path(), 1, &local);
    let mut node = start(&files[0]);
    wait_healthy(&client(), &node).await;
    let addr = rls[0];
    let mut rls_client = rls_client(addr).await;
    away_from_window_ends(10.0);

    let invalid = [
        request("", vec![descriptor(&[("user", "u")], None)], 0),
        request("edge", vec![], 0),
        request("edge", vec![descriptor(&[], None)], 0),
        request("edge", vec![descriptor(&[("", "u")], None)], 0),
        request("edge", vec![descriptor(&[("user", "u")], None); 65], 0),
        request(
            "edge",
            vec![RateLimitDescriptor {
                is_negative_hits: true,
                ..descriptor(&[("user", "u")], Some(2))
            }],
            0,
        ),
    ];
    for bad in invalid {
        let error = ask(&mut rls_client, bad).await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error:?}");
        assert!(!error.message().is_empty());
    }
    let unknown = ask(
        &mut rls_client,
        request("shop", vec![descriptor(&[("user", "u")], None)], 0),
    )
    .await
    .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert!(unknown.message().contains("edge"), "{unknown:?}");

    // Huge hits: over the limit, not an error, and nothing charged.
    for (hits, request_hits) in [(None, u32::MAX), (Some(u64::MAX), 0), (Some(4), 1)] {
        let answer = ask(
            &mut rls_client,
            request(
                "edge",
                vec![descriptor(&[("user", "u")], hits)],
                request_hits,
            ),
        )
        .await
        .unwrap();
        assert_eq!(answer.overall_code, Code::OverLimit as i32);
        assert_eq!(answer.statuses[0].code, Code::OverLimit as i32);
    }
    // The message is bigger than max_message_bytes, or does not decode, or is garbage.
    let big = "x".repeat(70 * 1024);
    let error = ask(
        &mut rls_client,
        request("edge", vec![descriptor(&[("user", &big)], None)], 0),
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), tonic::Code::OutOfRange, "{error:?}");
    let error = raw_call(addr, vec![0x0a, 0x05, b'e']).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::Internal, "{error:?}");
    assert!(error.message().contains("decode"), "{error:?}");
    assert!(closed_after(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    assert!(closed_after(addr, &[0x17; 512]));

    // Nothing above was charged: u has its 3, counted down.
    for left in [2, 1, 0] {
        let answer = ask(
            &mut rls_client,
            request("edge", vec![descriptor(&[("user", "u")], None)], 0),
        )
        .await
        .unwrap();
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses[0].limit_remaining, left);
    }
    // A check-only descriptor (hits 0) looks without taking: over now.
    let look = ask(
        &mut rls_client,
        request("edge", vec![descriptor(&[("user", "v")], Some(0))], 0),
    )
    .await
    .unwrap();
    assert_eq!(look.overall_code, Code::Ok as i32);
    assert_eq!(look.statuses[0].limit_remaining, 3);
    assert!(node.child.try_wait().unwrap().is_none(), "the node died");
    wait_healthy(&client(), &node).await;
    let text = metrics_of(&client(), &node).await;
    assert_eq!(
        metric(
            &text,
            "ratemesh_envoy_rls_requests_total{result=\"invalid_argument\"}"
        ),
        6.0
    );
    assert_eq!(
        metric(
            &text,
            "ratemesh_envoy_rls_requests_total{result=\"unknown_domain\"}"
        ),
        1.0
    );

    // SIGHUP applies new descriptors: user's limit becomes 5 (fresh counters).
    edit_file(&dir.path().join("policies.toml"), |text| {
        text.replace(
            "requests_per_unit = 3, unit = \"minute\"",
            "requests_per_unit = 5, unit = \"minute\"",
        )
    });
    signal(&node, libc::SIGHUP);
    wait_metric_line(
        &client(),
        &node,
        "ratemesh_config_reloads_total{result=\"applied\"} 1",
    )
    .await;
    let answer = ask(
        &mut rls_client,
        request("edge", vec![descriptor(&[("user", "u")], None)], 0),
    )
    .await
    .unwrap();
    let limit = answer.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, answer.statuses[0].limit_remaining),
        (5, 4)
    );

    // SIGTERM: the node drains and exits 0; the gRPC port closes.
    signal(&node, libc::SIGTERM);
    assert!(exit_of(&mut node, Duration::from_secs(15)).await.success());
    assert!(
        TcpStream::connect(addr).is_err(),
        "the gRPC port is still open"
    );
}

#[test]
fn bad_envoy_rls_tables_are_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = rls_cluster(dir.path(), 1, POLICIES);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let line_of =
        |text: &str, needle: &str| text.lines().position(|l| l.starts_with(needle)).unwrap() + 1;
    let http = text
        .lines()
        .find_map(|l| l.strip_prefix("http = "))
        .unwrap()
        .to_string();
    let base = &text[..text.find("\n[envoy_rls]").unwrap()];
    let table = |body: &str| format!("{base}\n[envoy_rls]\n{body}\n");
    let cases = [
        (
            table("listen = \"nowhere:1\""),
            "envoy_rls.listen",
            "not an address",
        ),
        (
            table(&format!("listen = {http}")),
            "envoy_rls.listen",
            "HTTP address",
        ),
        (
            table("listen = \"127.0.0.1:1\"\nmax_message_bytes = 10"),
            "envoy_rls.max_message_bytes",
            "between 1024",
        ),
        (
            table("listen = \"127.0.0.1:1\"\nport = 1"),
            "envoy_rls.port",
            "unknown field",
        ),
    ];
    for (bad, field, reason) in cases {
        std::fs::write(&files[0], &bad).unwrap();
        let error = NodeFile::from_file(&files[0]).unwrap_err();
        assert_eq!(error.file, files[0].display().to_string());
        assert_eq!(error.field, field, "{error}");
        assert!(error.reason.contains(reason), "{error}");
        assert!(error.line >= line_of(&bad, "[envoy_rls]"), "{error}");
    }
    // A policy file without domains: the port would answer NOT_FOUND to everything.
    std::fs::write(&files[0], &text).unwrap();
    std::fs::write(dir.path().join("policies.toml"), policies("")).unwrap();
    let error = NodeFile::from_file(&files[0]).unwrap_err();
    assert_eq!(
        (error.field.as_str(), error.line),
        ("envoy_rls", line_of(&text, "[envoy_rls]"))
    );
    assert!(error.reason.contains("[[envoy.domains]]"), "{error}");
}

/// The directory of Envoy's API `.proto` files that the envoy-types crate ships, in cargo's
/// registry (the version of Cargo.lock).
fn envoy_proto_root() -> Option<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lock = std::fs::read_to_string(manifest.join("Cargo.lock")).ok()?;
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"envoy-types\""))?
        .lines()
        .find_map(|l| l.strip_prefix("version = "))?
        .trim_matches('"')
        .to_string();
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    std::fs::read_dir(home.join("registry/src"))
        .ok()?
        .filter_map(Result::ok)
        .map(|index| index.path().join(format!("envoy-types-{version}/proto")))
        .find(|root| root.join("data-plane-api").is_dir())
}

#[test]
fn the_example_envoy_configuration_is_envoys_api_and_matches_the_demo_cluster() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("cluster/envoy.yaml")).unwrap();
    // The domain it sends is one the demo cluster's policy file describes, and its rate
    // limit cluster is the nodes' [envoy_rls] ports.
    let policies =
        ratemesh::config::GatewayConfig::from_file(root.join("cluster/policies.toml")).unwrap();
    assert!(yaml.contains("domain: edge"));
    assert!(policies.envoy.domains.iter().any(|d| d.domain == "edge"));
    for id in 1..=3 {
        let node = std::fs::read_to_string(root.join(format!("cluster/node-{id}.toml"))).unwrap();
        let listen = node
            .lines()
            .skip_while(|l| !l.starts_with("[envoy_rls]"))
            .find_map(|l| l.strip_prefix("listen = \"127.0.0.1:"))
            .and_then(|rest| rest.split('"').next())
            .unwrap();
        assert!(
            yaml.contains(&format!("port_value: {listen} }}")),
            "node {id}'s [envoy_rls] port {listen} is not in cluster/envoy.yaml"
        );
    }

    // Parsed as Envoy's own Bootstrap message, from Envoy's .proto files.
    if python_client().is_none() {
        return;
    }
    let Some(protos) = envoy_proto_root() else {
        assert!(
            std::env::var("RATEMESH_REQUIRE_ENVOY_CLIENT").as_deref() != Ok("1"),
            "no envoy-types sources in cargo's registry to read Envoy's .proto files from"
        );
        eprintln!("skipping the Bootstrap check: no envoy-types sources in cargo's registry");
        return;
    };
    let script = root.join("tests/fixtures/envoy_rls/check_bootstrap.py");
    for file in ["cluster/envoy.yaml", "deploy/envoy/login-outcomes.yaml"] {
        let output = Command::new("python3")
            .arg(&script)
            .arg(&protos)
            .arg(root.join(file))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{file} is not an Envoy Bootstrap: {said}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(said.contains("1 listener(s) and 2 cluster(s)"), "{said}");
    }
}
