//! Bodies and answers that stream through the node: 64 MiB both ways without being buffered,
//! a slow stream that outlives the connection timeouts, a client that stops reading.

use super::*;

/// A request body of `total` bytes made as the client sends it (byte `i` is `i % 251`),
/// noting how much was handed to the connection.
struct Pattern {
    total: u64,
    offset: u64,
    sent: Arc<AtomicU64>,
}

const PIECE: u64 = 64 * 1024;

impl hyper::body::Body for Pattern {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.offset == self.total {
            return Poll::Ready(None);
        }
        let n = PIECE.min(self.total - self.offset);
        let piece: Vec<u8> = (self.offset..self.offset + n)
            .map(|i| (i % 251) as u8)
            .collect();
        self.offset += n;
        self.sent.store(self.offset, Ordering::Relaxed);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(piece)))))
    }
}

/// The node's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib(node: &NodeProcess) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Send `body` to `path` on `node` over one HTTP/1.1 connection; return the response.
pub(crate) async fn send_raw<B>(
    node: &NodeProcess,
    path: &str,
    body: B,
) -> hyper::Response<hyper::body::Incoming>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(node.http).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header("host", node.http.to_string())
        .header("x-api-key", "streamer")
        .body(body)
        .unwrap();
    sender.send_request(request).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_body_streams_both_ways_without_being_buffered() {
    const TOTAL: u64 = 64 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let up = upstream::start(false).await;
    let node = node_with(dir.path(), &proxy("/echo", up.addr, "")).await;
    let before = peak_rss_kib(&node);
    let started = Instant::now();

    let sent = Arc::new(AtomicU64::new(0));
    let body = Pattern {
        total: TOTAL,
        offset: 0,
        sent: Arc::clone(&sent),
    };
    let transfer = async {
        let response = send_raw(&node, "/echo/large", body).await;
        assert_eq!(response.status(), 200);
        assert!(response.headers().contains_key("ratelimit"));
        let mut body = response.into_body();
        let mut received = 0u64;
        let mut sent_at_first_byte = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            let Some(data) = frame.data_ref() else {
                continue;
            };
            if sent_at_first_byte.is_none() && !data.is_empty() {
                sent_at_first_byte = Some(sent.load(Ordering::Relaxed));
            }
            for (i, byte) in data.iter().enumerate() {
                let at = received + i as u64;
                assert_eq!(*byte, (at % 251) as u8, "byte {at} changed on the way");
            }
            received += data.len() as u64;
        }
        (received, sent_at_first_byte.unwrap())
    };
    let (received, sent_at_first_byte) = tokio::time::timeout(Duration::from_secs(120), transfer)
        .await
        .expect("the echo took over 120 s");
    let after = peak_rss_kib(&node);
    eprintln!(
        "64 MiB echoed through the proxy in {:?}; the first bytes came back when the client \
         had handed over {} KiB; node peak RSS {before} KiB before, {after} KiB after",
        started.elapsed(),
        sent_at_first_byte / 1024
    );
    assert_eq!(received, TOTAL);
    // A proxy that buffered the request would answer only once all of it was sent; how much
    // the client had sent when the first echoed bytes reached it depends on scheduling (the
    // socket buffers of both hops hold several MiB), so the margin is an eighth of the body.
    assert!(
        sent_at_first_byte < TOTAL - TOTAL / 8,
        "the answer began only after {sent_at_first_byte} of {TOTAL} bytes were sent"
    );
    assert!(
        after.saturating_sub(before) < 32 * 1024,
        "the node's peak RSS grew by {} KiB for a 64 MiB body",
        after - before
    );
}

/// A request body fed through a channel.
pub(crate) struct Channel(pub(crate) tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|piece| piece.map(|b| Ok(Frame::data(b))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stream_outlives_the_connection_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream::start(false).await;
    let files = write_cluster_with(dir.path(), 1, POLICY);
    edit_file(&files[0], |text| {
        with_http_table(
            text,
            "header_read_timeout = \"1s\"\nidle_timeout = \"1s\"\n",
        ) + "\n"
            + &proxy("/echo", up.addr, "timeout = \"2s\"")
    });
    let node = start(&files[0]);
    wait_healthy(&client(), &node).await;

    // 25 pieces, one every 100 ms: 2.5 s, longer than both connection timeouts.
    let (pieces, receiver) = tokio::sync::mpsc::channel(1);
    let feeder = tokio::spawn(async move {
        for _ in 0..25 {
            pieces.send(Bytes::from(vec![b'x'; 1024])).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let response = send_raw(&node, "/echo/slow", Channel(receiver)).await;
    assert_eq!(response.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .unwrap()
        .expect("the stream was cut")
        .to_bytes();
    assert_eq!(body.len(), 25 * 1024);
    feeder.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answer_is_closed_after_the_idle_timeout() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let up = upstream::start(false).await;
    let files = write_cluster_with(dir.path(), 1, POLICY);
    edit_file(&files[0], |text| {
        with_http_table(
            text,
            "header_read_timeout = \"1s\"\nidle_timeout = \"1s\"\n",
        ) + "\n"
            + &proxy("/big", up.addr, "")
    });
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;

    let addr = node.http;
    let read = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .write_all(b"GET /big/x HTTP/1.1\r\nhost: node\r\nx-api-key: slow\r\n\r\n")
            .unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = stream.read(&mut buf).unwrap();
        // Take nothing more for 4 s, then read what is left until the node closes.
        std::thread::sleep(Duration::from_secs(4));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return total as u64,
                Ok(n) => total += n,
            }
        }
    });
    let total = tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap()
        .unwrap();
    assert!(
        total < upstream::BIG_BYTES,
        "the whole answer ({total} bytes) came: the connection was not closed"
    );
    wait_metric_line(
        &client,
        &node,
        "ratemesh_http_connections_closed_total{reason=\"write_timeout\"} 1",
    )
    .await;
}
