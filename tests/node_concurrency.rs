//! Concurrency policies on `ratemesh node` processes proxying (`[[proxy]]`) to an upstream
//! whose answers stream for a random time and which counts what it has in flight: one node
//! with a `local` policy of 4 per key, and three nodes sharing a `redis` policy of 4 per key
//! (with a redis-server of the test's own), each under 10,000 requests from 16 clients: the
//! upstream never has more than 4 of the key's requests in flight; a node killed while it
//! holds every slot has them come back after `max_hold`.

mod support;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use support::*;

#[path = "support/redis_server.rs"]
mod redis_server;

const LIMIT: usize = 4;
const REQUESTS: usize = 10_000;
const CLIENTS: usize = 16;

/// What the upstream has in flight: now, and the most at once.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
    served: AtomicUsize,
}

/// A body that waits `ms`, then sends its one frame; the request stops counting as in
/// flight before that frame goes out (so before the node can see the answer end).
struct Slow {
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    flight: Arc<InFlight>,
}

impl hyper::body::Body for Slow {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let Some(sleep) = self.sleep.as_mut() else {
            return Poll::Ready(None);
        };
        match sleep.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.sleep = None;
                self.flight.now.fetch_sub(1, Ordering::SeqCst);
                self.flight.served.fetch_add(1, Ordering::SeqCst);
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"done")))))
            }
        }
    }
}

use std::future::Future;

/// An upstream on an ephemeral loopback port answering `/?ms=N` after N ms (`/hold`: after
/// a minute), counting what it has in flight.
async fn upstream() -> (
    std::net::SocketAddr,
    Arc<InFlight>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let flight = Arc::new(InFlight::default());
    let counts = Arc::clone(&flight);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let flight = Arc::clone(&counts);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: http::Request<_>| {
                    let now = flight.now.fetch_add(1, Ordering::SeqCst) + 1;
                    flight.most.fetch_max(now, Ordering::SeqCst);
                    let ms = match request.uri().path() {
                        "/hold" => 60_000,
                        _ => request
                            .uri()
                            .query()
                            .and_then(|q| q.strip_prefix("ms="))
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(1),
                    };
                    let body = Slow {
                        sleep: Some(Box::pin(tokio::time::sleep(Duration::from_millis(ms)))),
                        flight: Arc::clone(&flight),
                    };
                    async move { Ok::<_, hyper::Error>(http::Response::new(body)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, flight, task)
}

fn policies(backend: &str) -> String {
    format!(
        "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n{backend}\n\n\
         [policies.in_flight]\nalgorithm = \"concurrency\"\nlimit = {LIMIT}\nmax_hold = \"3s\"\n\
         by = [\"header:x-account\"]\nBACKEND\n\n\
         [tiers.api]\npolicies = [\"in_flight\"]\n"
    )
}

/// Send `REQUESTS` requests of one account from `CLIENTS` clients over `nodes`, each asking
/// the upstream to take 0–9 ms; return how many were admitted.
async fn load(nodes: &[NodeProcess]) -> usize {
    let client = client();
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = client.clone();
        let admitted = Arc::clone(&admitted);
        let bases: Vec<String> = nodes.iter().map(|n| format!("http://{}", n.http)).collect();
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(c as u64);
            for i in 0..REQUESTS / CLIENTS {
                let base = &bases[(c + i) % bases.len()];
                let response = client
                    .get(format!("{base}/api/work?ms={}", rng.u64(0..10)))
                    .header("x-account", "alice")
                    .send()
                    .await
                    .unwrap();
                match response.status().as_u16() {
                    200 => {
                        let body = response.bytes().await.unwrap();
                        assert_eq!(&body[..], b"done");
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    429 => {}
                    other => panic!("status {other}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    admitted.load(Ordering::SeqCst)
}

fn proxy_to(files: &[std::path::PathBuf], upstream: std::net::SocketAddr) {
    for f in files {
        edit_file(f, |text| {
            format!("{text}\n[[proxy]]\npath_prefix = \"/\"\nupstream = \"http://{upstream}\"\n")
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_policy_never_lets_more_than_its_limit_reach_the_upstream() {
    let (addr, flight, _task) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, &policies("").replace("BACKEND", ""));
    proxy_to(&files, addr);
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let admitted = load(std::slice::from_ref(&node)).await;
    let most = flight.most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} in flight at the upstream");
    assert_eq!(flight.served.load(Ordering::SeqCst), admitted);
    assert!(admitted >= 200, "only {admitted} of {REQUESTS} admitted");
    let text = metrics_of(&client, &node).await;
    assert_eq!(
        metric(
            &text,
            "ratemesh_concurrency_reclaimed_total{policy=\"in_flight\"}"
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_policy_holds_its_limit_across_nodes_and_a_killed_nodes_slots_come_back() {
    let Some(redis) = redis_server::RedisServer::start("concurrency") else {
        eprintln!("no redis-server: skipped");
        return;
    };
    let (addr, flight, _task) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let text = policies(&format!("\n[redis]\nurl = \"{}\"", redis.url()))
        .replace("BACKEND", "backend = \"redis\"\nfail_mode = \"closed\"");
    let files = write_cluster_with(dir.path(), 3, &text);
    proxy_to(&files, addr);
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let admitted = load(&nodes).await;
    let most = flight.most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} in flight at the upstream");
    assert!(admitted >= 200, "only {admitted} of {REQUESTS} admitted");
    // Every slot went back when its answer ended: none was left to `max_hold`.
    for node in &nodes {
        let text = metrics_of(&client, node).await;
        let reclaimed = "ratemesh_concurrency_reclaimed_total{policy=\"in_flight\"}";
        assert_eq!(metric(&text, reclaimed), 0.0);
    }

    // Node 1 takes every slot with answers that hang, and is killed.
    let base = format!("http://{}", nodes[0].http);
    let mut hanging = Vec::new();
    for _ in 0..LIMIT {
        let request = client
            .get(format!("{base}/hold"))
            .header("x-account", "alice");
        hanging.push(tokio::spawn(request.send()));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while flight.now.load(Ordering::SeqCst) < LIMIT {
        let arrived = flight.now.load(Ordering::SeqCst);
        assert!(Instant::now() < deadline, "{arrived} held requests arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let other = format!("http://{}/api/work?ms=1", nodes[1].http);
    let status = |url: String| {
        let client = client.clone();
        async move {
            let response = client.get(url).header("x-account", "alice").send().await;
            response.unwrap().status().as_u16()
        }
    };
    assert_eq!(status(other.clone()).await, 429, "every slot is held");
    let killed = Instant::now();
    signal(&nodes[0], libc::SIGKILL);
    let _ = nodes.remove(0);
    // The killed node never gives them back: they are reclaimed at `max_hold` (3 s).
    assert_eq!(
        status(other.clone()).await,
        429,
        "reclaimed only at max_hold"
    );
    while status(other.clone()).await != 200 {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the slots never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Back at `max_hold` (3 s after they were taken), not later.
    assert!(killed.elapsed() < Duration::from_secs(5));
    for h in hanging {
        h.abort();
    }
    drop(redis);
}
