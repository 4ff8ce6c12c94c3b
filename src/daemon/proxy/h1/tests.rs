//! The HTTP/1.1 client's parsing and framing, on heads and chunk lines as an upstream may
//! send them.

use super::*;

#[test]
fn chunk_sizes() {
    assert_eq!(chunk_size(b"1a\r"), Some(26));
    assert_eq!(chunk_size(b"0\r"), Some(0));
    assert_eq!(chunk_size(b"FF;name=value\r"), Some(255));
    assert_eq!(chunk_size(b"\r"), None);
    assert_eq!(chunk_size(b"xyz\r"), None);
    assert_eq!(chunk_size(b"11111111111111111\r"), None);
    assert_eq!(chunk_size(b"ffffffffffffffff\r"), Some(u64::MAX));
    assert_eq!(chunk_size(b"5 ;ext\r"), Some(5));
    assert_eq!(chunk_size(b"5\t;a=b"), Some(5));
    assert_eq!(chunk_size(b"+5\r"), None);
    assert_eq!(chunk_size(b"5 junk\r"), None);
    assert_eq!(chunk_size(b"-1\r"), None);
}

#[test]
fn an_upstream_s_idle_timeout_shortens_the_connection_s_stay_in_the_pool() {
    let facts = |text: &str| head(text).ok().flatten().unwrap().facts.keep_for();
    assert_eq!(
        facts("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
        IDLE_TIMEOUT
    );
    assert_eq!(
        facts("HTTP/1.1 200 OK\r\nkeep-alive: timeout=5, max=100\r\n\r\n"),
        Duration::from_secs(4)
    );
    assert_eq!(
        facts("HTTP/1.1 200 OK\r\nKeep-Alive: max=3,Timeout = 1\r\n\r\n"),
        Duration::ZERO
    );
    assert_eq!(
        facts("HTTP/1.1 200 OK\r\nkeep-alive: timeout=99999\r\n\r\n"),
        IDLE_TIMEOUT - Duration::from_secs(1)
    );
    assert_eq!(
        facts("HTTP/1.1 200 OK\r\nkeep-alive: timeout=soon\r\n\r\n"),
        IDLE_TIMEOUT
    );
}

#[test]
fn other_transfer_codings_are_refused_and_a_tunnel_is_never_kept() {
    let parsed = head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n")
        .ok()
        .flatten()
        .unwrap();
    assert!(matches!(
        framing(&Method::GET, &parsed),
        Err(Failure::Malformed)
    ));
    let parsed = head("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        .ok()
        .flatten()
        .unwrap();
    assert!(matches!(
        framing(&Method::CONNECT, &parsed),
        Ok((Framing::Close, false))
    ));
}

#[test]
fn hex() {
    for n in [0usize, 1, 15, 16, 255, 4096, 65535, 1 << 40] {
        let mut out = Vec::new();
        push_hex(&mut out, n);
        assert_eq!(String::from_utf8(out).unwrap(), format!("{n:X}"));
    }
}

fn head(text: &str) -> Result<Option<Head>, Failure> {
    parse_head(&mut BytesMut::from(text))
}

#[test]
fn hop_by_hop_fields_stay_out_of_the_head() {
    let parsed = head(
        "HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\n\
         transfer-encoding: chunked\r\ncontent-length: 5\r\nx-kind: a\r\n\r\n",
    )
    .ok()
    .flatten()
    .unwrap();
    let names: Vec<_> = parsed.headers.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["x-kind"]);
    assert_eq!(parsed.facts.chunked, Some(true));

    let parsed = head(
        "HTTP/1.1 200 OK\r\nconnection: close, x-secret\r\nx-secret: 1\r\n\
         proxy-authenticate: Basic\r\ncontent-length: 0\r\nx-kind: b\r\n\r\n",
    )
    .ok()
    .flatten()
    .unwrap();
    let names: Vec<_> = parsed.headers.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["content-length", "x-kind"]);
    assert!(parsed.facts.close);
}

#[test]
fn heads_and_their_framing() {
    let get = Method::GET;
    let parsed = head("HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-a: b\r\n\r\nok\n")
        .ok()
        .flatten()
        .unwrap();
    assert_eq!(parsed.status, StatusCode::OK);
    assert_eq!(parsed.headers["x-a"], "b");
    assert!(matches!(
        framing(&get, &parsed),
        Ok((Framing::Length(3), true))
    ));

    // Interim answers are skipped; an incomplete head waits for more.
    let parsed = head("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
        .ok()
        .flatten()
        .unwrap();
    assert_eq!(parsed.status, StatusCode::NO_CONTENT);
    assert!(matches!(head("HTTP/1.1 200 OK\r\ncontent-le"), Ok(None)));

    let chunked_and_length =
        head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n")
            .ok()
            .flatten()
            .unwrap();
    assert!(matches!(
        framing(&get, &chunked_and_length),
        Ok((Framing::Chunked, false))
    ));
    let differing = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n")
        .ok()
        .flatten()
        .unwrap();
    assert!(matches!(framing(&get, &differing), Err(Failure::Malformed)));
    let close = head("HTTP/1.0 200 OK\r\n\r\n").ok().flatten().unwrap();
    assert!(matches!(framing(&get, &close), Ok((Framing::Close, false))));
    let closing = head("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        .ok()
        .flatten()
        .unwrap();
    assert!(matches!(
        framing(&get, &closing),
        Ok((Framing::Length(0), false))
    ));
    assert!(matches!(
        head("HTTP/1.1 999x\r\n\r\n"),
        Err(Failure::Malformed)
    ));
    assert!(matches!(
        head("HTTP/1.1 101 Switching Protocols\r\n\r\n"),
        Err(Failure::Malformed)
    ));
}
