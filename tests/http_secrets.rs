//! Shadow policies and secrets, in a test binary of their own: it installs the process-wide
//! tracing subscriber and metrics recorder, so no other test can race their registration.

use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::routing::get;
use ratemesh::ManualClock;
use ratemesh::config::GatewayConfig;
use ratemesh::http::RateLimitLayer;

const FIXTURE: &str = include_str!("fixtures/policies.toml");
const API_KEY: &str = "sk_live_THIS-IS-A-SECRET-0123456789";
const T0: u64 = 1_800_000_000 * 1_000_000_000;

/// One global metrics recorder for this test binary.
fn recorder() -> &'static metrics_util::debugging::Snapshotter {
    static SNAPSHOTTER: OnceLock<metrics_util::debugging::Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test binary");
        snapshotter
    })
}

/// A tracing writer that keeps everything written.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn shadow_policies_admit_but_report_and_secrets_never_reach_logs_or_metrics() {
    let snapshotter = recorder();
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let clock = ManualClock::new(T0);
    let config = GatewayConfig::from_toml_str(FIXTURE, "fixture").unwrap();
    let layer = RateLimitLayer::with_clock(config, Arc::new(clock)).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);
    use tower::ServiceExt;
    for i in 0..6 {
        let request = http::Request::builder()
            .uri("/")
            .header("x-api-key", API_KEY)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        // The shadow "audit" policy allows 2 per hour; requests 3-5 pass anyway.
        let expected = if i < 5 { 200 } else { 429 };
        assert_eq!(response.status(), expected, "request {i}");
    }
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("shadow policy would deny"), "{logs}");
    assert!(
        logs.contains("api_key:"),
        "clients are labelled by a hash: {logs}"
    );
    assert!(
        !logs.contains(API_KEY),
        "the API key leaked into the logs: {logs}"
    );

    let snapshot = snapshotter.snapshot().into_vec();
    let shadow_denied: u64 = snapshot
        .iter()
        .filter(|(key, ..)| {
            key.key().name() == "ratemesh_decisions_total"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "policy" && l.value() == "audit")
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "outcome" && l.value() == "shadow_denied")
        })
        .map(|(_, _, _, value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum();
    assert!(shadow_denied >= 3, "{snapshot:?}");
    for (key, ..) in &snapshot {
        for label in key.key().labels() {
            assert!(
                !label.value().contains(API_KEY),
                "secret in a metric label: {label:?}"
            );
        }
    }
}
