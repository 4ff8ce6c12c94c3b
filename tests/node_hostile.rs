//! `ratemesh node` as real processes under hostile and clumsy input: request bodies over
//! the limit, policy files that would limit nothing, certificates that do not belong to the
//! cluster, a peer that cannot be reached, and noise on the peer (QUIC) port.

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ratemesh::node::NodeFile;
use support::*;

/// Read one HTTP response (head and a `content-length` body) from `stream`.
fn read_response(stream: &mut std::net::TcpStream) -> (u16, String, String) {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_string)
        })
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    let status = head[9..12].parse().unwrap();
    (status, head, String::from_utf8(body).unwrap())
}

/// Tell whether the node closed `stream` within `limit` (EOF or reset on read).
fn closed_within(stream: &mut std::net::TcpStream, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_over_the_limit_are_answered_413_and_never_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 1);
    edit_file(&files[0], |text| {
        with_http_table(
            text,
            "max_body_bytes = 1024\nheader_read_timeout = \"1s\"\n",
        )
    });
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let addr = node.http;

    // A body within the limit is served.
    let url = format!("http://{addr}/api/orders");
    let response = client
        .post(&url)
        .header("x-api-key", "k")
        .body(vec![b'x'; 512])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let written = tokio::task::spawn_blocking(move || {
        // A 10 GB body announced: answered at once, without reading it.
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .write_all(
                b"POST /api/orders HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\n\
                  Content-Length: 10000000000\r\n\r\n",
            )
            .unwrap();
        let (status, head, body) = read_response(&mut stream);
        assert_eq!(status, 413, "{head}{body}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json")
        );
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"], "body_too_large");
        assert_eq!(json["max_bytes"], 1024);
        // The client keeps sending: the node does not read on; its socket closes.
        stream
            .set_write_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        let mut written = 0usize;
        while written < 256 * 1024 * 1024 {
            match stream.write(&chunk) {
                Ok(n) => written += n,
                Err(_) => break,
            }
        }
        assert!(
            written < 64 * 1024 * 1024,
            "the node went on taking the body: {written} bytes"
        );
        assert!(closed_within(&mut stream, Duration::from_secs(10)));

        // A chunked body with no length: read up to the limit, then refused.
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .write_all(
                b"POST /api/orders HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\n\
                  Transfer-Encoding: chunked\r\n\r\n",
            )
            .unwrap();
        for _ in 0..8 {
            let _ = stream.write_all(b"200\r\n");
            let _ = stream.write_all(&[b'y'; 512]);
            let _ = stream.write_all(b"\r\n");
        }
        let _ = stream.write_all(b"0\r\n\r\n");
        let (status, _, body) = read_response(&mut stream);
        assert_eq!(status, 413, "{body}");
        assert!(closed_within(&mut stream, Duration::from_secs(10)));

        // A body that trickles: answered 408 after the header time, and closed.
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .write_all(
                b"POST /api/orders HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\n\
                  Content-Length: 100\r\n\r\n0123456789",
            )
            .unwrap();
        let (status, _, body) = read_response(&mut stream);
        assert_eq!(status, 408, "{body}");
        assert!(body.contains("body_timeout"), "{body}");
        assert!(closed_within(&mut stream, Duration::from_secs(10)));
        written
    })
    .await
    .unwrap();
    eprintln!("bytes the client could write after its 413: {written}");

    let text = metrics_of(&client, &node).await;
    assert_eq!(
        metric(
            &text,
            "ratemesh_requests_refused_total{reason=\"body_too_large\"}"
        ),
        2.0
    );
    assert_eq!(
        metric(
            &text,
            "ratemesh_requests_refused_total{reason=\"body_timeout\"}"
        ),
        1.0
    );

    // The setting is checked with file, line and field.
    let bad = std::fs::read_to_string(&files[0])
        .unwrap()
        .replace("max_body_bytes = 1024", "max_body_bytes = -1");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, &bad).unwrap();
    let error = NodeFile::from_file(&path).unwrap_err();
    let line = bad
        .lines()
        .position(|l| l.starts_with("max_body_bytes"))
        .unwrap()
        + 1;
    assert_eq!(
        (error.line, error.field.as_str()),
        (line, "http.max_body_bytes"),
        "{error}"
    );
}

/// Run `ratemesh node --config file`, expecting it to refuse to start; return its stderr.
fn refused_start(file: &Path) -> String {
    let mut child = node_command(file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node started from {}", file.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success(), "{stderr}");
    stderr
}

const TIERLESS: &str = "env = \"test\"\nkey_secret = \"test-secret\"\n\n\
    [policies.per_key]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1m\"\nburst = 2\n\n\
    [[routes]]\nname = \"open\"\npath_prefix = \"/\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_that_limits_nothing_is_refused_at_start_and_at_reload() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, TIERLESS);
    let stderr = refused_start(&files[0]);
    assert!(
        stderr.contains("policies.toml:1: `allow_unlimited`: no request can ever be limited"),
        "{stderr}"
    );

    // Saying so explicitly starts the node, which then admits everything.
    let policy_path = dir.path().join("policies.toml");
    std::fs::write(
        &policy_path,
        TIERLESS.replace("env = \"test\"", "env = \"test\"\nallow_unlimited = true"),
    )
    .unwrap();
    let log_path = dir.path().join("node.log");
    let node = spawn_node(
        &files[0],
        Stdio::from(std::fs::File::create(&log_path).unwrap()),
    );
    let client = client();
    wait_healthy(&client, &node).await;
    for _ in 0..5 {
        assert_eq!(status_of(&client, &node, "a").await, 200);
    }

    // A limiting file with `no_tier = "refuse"`: listed clients get their tier, others are
    // refused; a reload back to a file that limits nothing is refused.
    let limiting = "env = \"test\"\nkey_secret = \"test-secret\"\nno_tier = \"refuse\"\n\n\
        [identity]\norder = [\"device\", \"api_key\", \"ip\"]\n\n\
        [policies.per_key]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1m\"\nburst = 2\n\n\
        [tiers.partners]\npolicies = [\"per_key\"]\n\n\
        [tenants]\n\"device:listed\" = \"partners\"\n";
    std::fs::write(&policy_path, limiting).unwrap();
    signal(&node, libc::SIGHUP);
    wait_metric_line(
        &client,
        &node,
        "ratemesh_config_reloads_total{result=\"applied\"} 1",
    )
    .await;
    let url = format!("http://{}/api/orders", node.http);
    let with_device = |device: &'static str| client.get(&url).header("x-device-id", device);
    for expected in [200, 200, 429] {
        let response = with_device("listed").send().await.unwrap();
        assert_eq!(response.status(), expected);
    }
    let refused = with_device("stranger").send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["policy"], "no_tier", "{body}");
    assert_eq!(body["limit"], 0, "{body}");

    std::fs::write(&policy_path, TIERLESS).unwrap();
    signal(&node, libc::SIGHUP);
    wait_metric_line(
        &client,
        &node,
        "ratemesh_config_reloads_total{result=\"refused\"} 1",
    )
    .await;
    let refused = with_device("stranger").send().await.unwrap();
    assert_eq!(refused.status(), 429, "the old rules stay");
    drop(node);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("`allow_unlimited`: no request can ever be limited"),
        "{log}"
    );

    // Tiers without a default tier, on a path no route covers: refused too, until the file
    // names a default tier.
    let no_default = limiting.replace("no_tier = \"refuse\"\n", "");
    std::fs::write(&policy_path, &no_default).unwrap();
    let stderr = refused_start(&files[0]);
    assert!(
        stderr.contains("`default_tier`: clients that match no tier"),
        "{stderr}"
    );
    let with_default = no_default.replace(
        "key_secret = \"test-secret\"\n",
        "key_secret = \"test-secret\"\ndefault_tier = \"partners\"\n",
    );
    std::fs::write(&policy_path, with_default).unwrap();
    let node = start(&files[0]);
    wait_healthy(&client, &node).await;
    assert_eq!(status_of(&client, &node, "anyone").await, 200);
}

#[test]
fn a_certificate_the_cluster_ca_did_not_sign_or_a_wrong_key_stops_the_node_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 2);
    let other = dir.path().join("other");
    let certs = ratemesh::net::certs::generate("other", 2).unwrap();
    ratemesh::net::certs::write(&other, &certs).unwrap();
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let line_of = |key: &str| text.lines().position(|l| l.starts_with(key)).unwrap() + 1;

    // Node 1's certificate from another CA (with its own key).
    let file = dir.path().join("foreign-cert.toml");
    std::fs::write(
        &file,
        text.replace("certs/node-1.pem", "other/node-1.pem")
            .replace("certs/node-1.key", "other/node-1.key"),
    )
    .unwrap();
    let stderr = refused_start(&file);
    let expected = format!("foreign-cert.toml:{}: `tls.cert`:", line_of("cert ="));
    assert!(stderr.contains(&expected), "no `{expected}` in {stderr}");
    assert!(stderr.contains("other/node-1.pem"), "{stderr}");
    assert!(stderr.contains("certs/ca.pem"), "{stderr}");

    // The right certificate with another key.
    let file = dir.path().join("foreign-key.toml");
    std::fs::write(&file, text.replace("certs/node-1.key", "other/node-1.key")).unwrap();
    let stderr = refused_start(&file);
    let expected = format!("foreign-key.toml:{}: `tls.key`:", line_of("key ="));
    assert!(stderr.contains(&expected), "no `{expected}` in {stderr}");
    assert!(stderr.contains("other/node-1.key"), "{stderr}");

    // A policy file that is not UTF-8: its line and field, not line 0.
    std::fs::write(
        dir.path().join("policies.toml"),
        b"env = \"test\"\nkey_secret = \"\xff\xfe\"\n",
    )
    .unwrap();
    let stderr = refused_start(&files[0]);
    assert!(
        stderr.contains("policies.toml:2: `key_secret`: the file is not UTF-8"),
        "{stderr}"
    );
}

/// Count the lines of `log` that contain `needle`.
fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_is_logged_per_backoff_step_and_is_not_counted_up() {
    // Two nodes whose certificates come from two different CAs: each starts (its own files
    // agree), neither can join the other.
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 2);
    let certs = ratemesh::net::certs::generate("elsewhere", 2).unwrap();
    ratemesh::net::certs::write(&dir.path().join("elsewhere"), &certs).unwrap();
    edit_file(&files[1], |text| text.replace("certs/", "elsewhere/"));
    let log_path = dir.path().join("node-1.log");
    let one = spawn_node(
        &files[0],
        Stdio::from(std::fs::File::create(&log_path).unwrap()),
    );
    let _two = spawn_node(&files[1], Stdio::null());
    let client = client();

    // Until the retries reached their ceiling (about 3 s of failures) and went on: six
    // failed attempts at least.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = metrics_of(&client, &one).await;
        if metric(&text, "ratemesh_peer_dial_failures_total") >= 6.0 {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than 6 failed attempts in 30 s: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(metric(&text, "ratemesh_peers_up"), 0.0, "{text}");
    let failures = metric(&text, "ratemesh_peer_dial_failures_total");
    assert!(
        metric(
            &text,
            "ratemesh_quic_refused_handshakes_total{reason=\"tls\"}"
        ) >= 1.0,
        "node 2's own attempts are refused as TLS: {text}"
    );
    let health: serde_json::Value = client
        .get(format!("http://{}/health", one.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["peers_up"], 0, "{health}");

    let log = std::fs::read_to_string(&log_path).unwrap();
    let lines = lines_with(&log, "cannot reach peer 2");
    eprintln!("{failures} failed attempts, {lines} log lines");
    assert!(lines >= 1, "no reason logged:\n{log}");
    assert!(log.contains("TLS refused"), "{log}");
    assert!(
        failures >= 6.0 && (lines as f64) <= 3.0,
        "{failures} attempts gave {lines} lines:\n{log}"
    );
}

/// A datagram shaped like a QUIC v1 Initial (long header, 8-byte connection ids, no token,
/// 1200 bytes of payload) whose payload is random.
fn initial_shaped(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut packet = vec![0xc0 | rng.u8(0..4)];
    packet.extend_from_slice(&1u32.to_be_bytes());
    for _ in 0..2 {
        packet.push(8);
        packet.extend((0..8).map(|_| rng.u8(..)));
    }
    packet.push(0);
    let payload = 1200u16;
    packet.extend_from_slice(&(0x4000 | payload).to_be_bytes());
    packet.extend((0..payload).map(|_| rng.u8(..)));
    packet
}

/// Attempts refused as not QUIC or with too many in progress: each attempt is one of them.
fn refused_attempts(text: &str) -> f64 {
    ["not_quic", "busy"]
        .iter()
        .map(|reason| {
            metric(
                text,
                &format!("ratemesh_quic_refused_handshakes_total{{reason=\"{reason}\"}}"),
            )
        })
        .sum()
}

/// quinn's sans-IO endpoint, as a node's peer port runs it: which datagrams it takes as
/// connection attempts (to accept or refuse); it refuses nothing itself here.
struct AttemptCounter {
    endpoint: quinn_proto::Endpoint,
    now: Instant,
    buf: Vec<u8>,
}

impl AttemptCounter {
    fn new() -> Self {
        let cert = rcgen::generate_simple_self_signed(vec!["node-1.ratemesh".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
        let server = quinn_proto::ServerConfig::with_crypto(std::sync::Arc::new(crypto));
        AttemptCounter {
            endpoint: quinn_proto::Endpoint::new(
                std::sync::Arc::new(quinn_proto::EndpointConfig::default()),
                Some(std::sync::Arc::new(server)),
                true,
                None,
            ),
            now: Instant::now(),
            buf: Vec::new(),
        }
    }

    /// 1 if the endpoint takes `datagram` as a connection attempt, else 0.
    fn takes(&mut self, datagram: &[u8]) -> u64 {
        let remote = "127.0.0.1:9".parse().unwrap();
        let event =
            self.endpoint
                .handle(self.now, remote, None, None, datagram.into(), &mut self.buf);
        match event {
            Some(quinn_proto::DatagramEvent::NewConnection(incoming)) => {
                self.endpoint.ignore(incoming);
                1
            }
            _ => 0,
        }
    }
}

/// The resident set of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noise_on_the_peer_port_is_dropped_quietly_counted_apart_and_the_cluster_holds() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 3);
    let quic = NodeFile::from_file(&files[0]).unwrap().listen;
    let log_path = dir.path().join("node-1.log");
    let mut nodes = vec![spawn_node(
        &files[0],
        Stdio::from(std::fs::File::create(&log_path).unwrap()),
    )];
    nodes.extend(files[1..].iter().map(|f| start(f)));
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let rss_before = rss_kib(nodes[0].child.id());

    // 20,000 datagrams: half random bytes of random length, half shaped like Initials. Sent
    // 200 at a time; quinn's own endpoint, fed the same datagrams, says which of them it takes
    // as connection attempts (an Initial whose reserved bits read 0 once its header
    // protection is off: about one in four). Each must be refused once, as `not_quic` (or
    // `busy`): after each batch, wait until the node counted them all (so the attempts never
    // pile up past what quinn keeps waiting, however slow the machine).
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut quinn = AttemptCounter::new();
    let mut rng = fastrand::Rng::with_seed(15);
    let (mut sent, mut attempts) = (0u32, 0u64);
    for i in 0..20_000u32 {
        let packet: Vec<u8> = if i % 2 == 0 {
            initial_shaped(&mut rng)
        } else {
            let len = rng.usize(1..1500);
            (0..len).map(|_| rng.u8(..)).collect()
        };
        attempts += quinn.takes(&packet);
        if socket.send_to(&packet, quic).is_ok() {
            sent += 1;
        }
        if i % 200 == 199 {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let text = metrics_of(&client, &nodes[0]).await;
                let counted = refused_attempts(&text) as u64;
                if counted >= attempts {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the node counted {counted} of {attempts} attempts: {text}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    // Meanwhile and after, the cluster still holds one limit of 300 across the nodes.
    let mut admitted = 0;
    for round in 0..40 {
        let node = &nodes[round % 3];
        for _ in 0..15 {
            if status_of(&client, node, "tenant-after-noise").await == 200 {
                admitted += 1;
            }
        }
    }
    assert!(
        (270..=300).contains(&admitted),
        "admitted {admitted} of 600 against a global 300"
    );
    for node in &nodes {
        let text = metrics_of(&client, node).await;
        assert_eq!(metric(&text, "ratemesh_peers_up"), 2.0, "{text}");
    }
    let text = metrics_of(&client, &nodes[0]).await;
    let not_quic = metric(
        &text,
        "ratemesh_quic_refused_handshakes_total{reason=\"not_quic\"}",
    );
    let rss_after = rss_kib(nodes[0].child.id());
    eprintln!(
        "sent {sent} datagrams, {attempts} connection attempts by quinn's endpoint: \
         not_quic {not_quic}, RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert_eq!(sent, 20_000);
    assert_eq!(
        refused_attempts(&text) as u64,
        attempts,
        "every attempt refused once: {text}"
    );
    assert_eq!(
        metric(&text, "ratemesh_peer_connections_refused_total"),
        0.0,
        "noise counted as refused peers"
    );
    assert!(
        rss_after < rss_before + 32 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );

    drop(nodes);
    let log = std::fs::read_to_string(&log_path).unwrap();
    let about_noise = lines_with(&log, "peer port: refused");
    assert!(
        (1..=3).contains(&about_noise),
        "{about_noise} lines:\n{log}"
    );
    // The cluster held: no live peer declared dead while the noise came (a check of speed:
    // a machine busy with other work may not answer its peers in time).
    if timed_checks() {
        assert_eq!(lines_with(&log, "peer declared dead"), 0, "{log}");
        assert!(log.lines().count() <= 10, "a noisy log:\n{log}");
    }
}
