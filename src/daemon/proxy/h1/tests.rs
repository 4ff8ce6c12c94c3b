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
    assert_eq!(chunk_size(b"5\t;a=b\r"), Some(5));
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

// Answers the differential test against hyper (`differential.rs`) found the node reading
// where hyper refuses, or reading otherwise: each is refused now.

/// What the node's client makes of `bytes` as the answer to a `GET`, written in one piece.
async fn read(bytes: &[u8]) -> differential::Outcome {
    differential::through_node(bytes.to_vec(), vec![(bytes.len().max(1), false)], false).await
}

const CHUNKED: &str = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";

#[tokio::test]
async fn a_well_formed_chunked_body_with_extensions_and_trailers_is_read_whole() {
    let answer = read(
        format!("{CHUNKED}5 ;a=b\r\nhello\r\nA;x=\"q;r\"\r\n, world!!!\r\n0\r\nx-sum: 1\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(answer.body, "hello, world!!!");
    assert_eq!(answer.trailers.unwrap()["x-sum"], "1");
}

#[tokio::test]
async fn a_bare_cr_in_a_chunk_line_is_refused() {
    // hyper ends the line at the CR and refuses what follows; the node took `a\rb` for an
    // extension.
    for line in ["0;a\rb\r\n", "0\r\r\n", "5;\r\r\nhello\r\n0\r\n"] {
        let answer = read(format!("{CHUNKED}{line}\r\n").as_bytes()).await;
        assert!(answer.is_err(), "{line:?}: {answer:?}");
    }
    // Blanks before the extensions are SP and HTAB only (not a form feed).
    let answer = read(format!("{CHUNKED}5\x0c;a\r\nhello\r\n0\r\n\r\n").as_bytes()).await;
    assert!(answer.is_err(), "{answer:?}");
}

#[test]
fn transfer_encoding_in_an_http_1_0_answer_is_refused() {
    // hyper refuses it; the node decoded the chunks. RFC 9112 §6.1: faulty framing.
    let parsed = head("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        .ok()
        .flatten()
        .unwrap();
    assert!(matches!(
        framing(&Method::GET, &parsed),
        Err(Failure::Malformed)
    ));
    // No body is read after a `HEAD` anyway.
    assert!(matches!(
        framing(&Method::HEAD, &parsed),
        Ok((Framing::Empty, false))
    ));
}

#[test]
fn a_transfer_encoding_with_an_empty_element_is_refused() {
    // hyper takes the last element of `chunked,` (empty) for the coding and reads the chunks
    // as raw bytes to the close; the node decoded them: the bodies differed.
    for value in ["chunked,", "chunked, ", ",chunked", "chunked,,chunked", ""] {
        let parsed = head(&format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: {value}\r\n\r\n"
        ))
        .ok()
        .flatten()
        .unwrap();
        assert!(
            matches!(framing(&Method::GET, &parsed), Err(Failure::Malformed)),
            "{value:?}"
        );
    }
}

#[tokio::test]
async fn a_bare_lf_after_a_chunk_s_data_is_refused() {
    let answer = read(format!("{CHUNKED}5\r\nhello\n0\r\n\r\n").as_bytes()).await;
    assert!(answer.is_err(), "{answer:?}");
    let answer = read(format!("{CHUNKED}5\nhello\r\n0\r\n\r\n").as_bytes()).await;
    assert!(answer.is_err(), "{answer:?}");
}

#[tokio::test]
async fn a_bare_lf_in_the_trailer_section_is_refused() {
    // hyper reads the section's lines to CRLF only; the node took a bare LF for the end.
    for end in [
        "\n",
        "x-a: 1\n\r\n",
        "x-a: 1\r\n\n",
        "x-a: 1\nx-b: 2\r\n\r\n",
        "\rx",
    ] {
        let answer = read(format!("{CHUNKED}0\r\n{end}").as_bytes()).await;
        assert!(answer.is_err(), "{end:?}: {answer:?}");
    }
    assert_eq!(trailer_section(b"x: 1\r\n\r\nrest"), Ok(Some(8)));
    assert_eq!(trailer_section(b"\r\n"), Ok(Some(2)));
    assert_eq!(trailer_section(b"x: 1\r\n\r"), Ok(None));
    assert_eq!(trailer_section(b"x: 1\n\r\n"), Err(()));
}

#[tokio::test]
async fn chunk_extensions_past_their_bound_are_refused() {
    // hyper allows 16 KiB of extensions in one body; the node had no bound over the lines.
    let mut body = String::from(CHUNKED);
    for _ in 0..MAX_CHUNK_EXTENSIONS / 1000 + 1 {
        body.push_str(&format!("1;{}\r\nx\r\n", "e".repeat(999)));
    }
    body.push_str("0\r\n\r\n");
    let answer = read(body.as_bytes()).await;
    assert!(answer.is_err(), "{answer:?}");
    let answer = read(format!("{CHUNKED}1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(999)).as_bytes())
        .await
        .unwrap();
    assert_eq!(answer.body, "x");
}

#[tokio::test]
async fn a_trailer_section_past_its_bound_is_refused() {
    // hyper refuses a section of 16 KiB; the node allowed 64 KiB.
    let long = "v".repeat(MAX_TRAILERS);
    let answer = read(format!("{CHUNKED}0\r\nx-long: {long}\r\n\r\n").as_bytes()).await;
    assert!(answer.is_err(), "{answer:?}");
}
