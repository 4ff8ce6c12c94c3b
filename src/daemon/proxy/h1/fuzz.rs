//! The answer's head parser as a fuzzer drives it (`tests/fuzz/fuzz_targets/h1_head.rs`, through
//! `ratemesh::fuzzing::h1_head` with the `fuzzing` feature), and a short run of it on stable
//! Rust: seeded random and mutated inputs, from the differential test's answers.

use super::*;

/// Parse `data` as an upstream's answer: its final head (interim 1xx heads skipped), the
/// framing it gives a `GET`, a `HEAD` and a `CONNECT`, and the chunk-size line and trailer
/// section that could follow. Panics if a result breaks what the node relies on; returns
/// whether a final head was parsed.
pub(crate) fn fuzz_head(data: &[u8]) -> bool {
    let mut buf = BytesMut::from(data);
    let parsed = parse_head(&mut buf);
    // Only whole heads are taken out of the buffer, from its start.
    assert!(data.ends_with(&buf));
    let _ = streamed::chunk_size(&data[..data.len().min(MAX_CHUNK_LINE)]);
    let window = &data[..data.len().min(MAX_TRAILERS)];
    if let Ok(Some(length)) = streamed::trailer_section(window) {
        assert!((2..=window.len()).contains(&length));
        assert!(window[..length].ends_with(b"\r\n"));
    }
    let Ok(Some(head)) = parsed else {
        // Refused or incomplete.
        return false;
    };
    assert!(buf.len() < data.len());
    assert!(head.headers.len() <= MAX_FIELDS);
    assert!(!head.status.is_informational());
    assert!(head.version == Version::HTTP_10 || head.version == Version::HTTP_11);
    // What is handed on holds no hop-by-hop field, and no length beside a transfer coding.
    for name in head.headers.keys() {
        assert!(!headers::hop_by_hop(name), "{name} handed on");
    }
    if head.facts.chunked.is_some() {
        assert!(!head.headers.contains_key(CONTENT_LENGTH));
    }
    assert!(head.facts.keep_for() <= IDLE_TIMEOUT);
    for method in [Method::GET, Method::HEAD, Method::CONNECT] {
        let Ok((framing, keep)) = framing(&method, &head) else {
            assert!(method == Method::GET);
            continue;
        };
        if keep {
            assert!(head.version == Version::HTTP_11 && !head.facts.close);
        }
        match framing {
            Framing::Empty => {}
            Framing::Length(length) => assert_eq!(head.facts.length, Some(Ok(length))),
            Framing::Chunked => {
                assert_eq!(head.facts.chunked, Some(true));
                assert!(!head.facts.other_coding && head.version == Version::HTTP_11);
                assert!(!keep || head.facts.length.is_none());
            }
            Framing::Close => assert!(!keep),
        }
    }
    true
}

#[cfg(test)]
mod smoke {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    use super::*;

    /// Pieces a mutation inserts.
    const TOKENS: &[&[u8]] = &[
        b"\r\n",
        b"\n",
        b"\r",
        b"\r\n\r\n",
        b": ",
        b",",
        b" ",
        b"\t",
        b";",
        b"0",
        b"chunked",
        b"content-length: ",
        b"transfer-encoding: ",
        b"connection: close, x-a\r\n",
        b"keep-alive: timeout=3\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n",
        b"HTTP/1.1 204 No Content\r\n",
        b"18446744073709551616",
        b"\x80",
        b"\0",
    ];

    fn mutate(rng: &mut fastrand::Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        for _ in 0..rng.usize(1..=3) {
            let at = rng.usize(..=input.len());
            match rng.u8(..7) {
                0 if !input.is_empty() => {
                    let i = rng.usize(..input.len());
                    input[i] ^= 1 << rng.u8(..8);
                }
                1 => input.insert(at, rng.u8(..)),
                2 => {
                    let end = (at + rng.usize(..16)).min(input.len());
                    input.drain(at..end);
                }
                3 => {
                    let end = (at + rng.usize(..32)).min(input.len());
                    let copy = input[at..end].to_vec();
                    input.splice(at..at, copy);
                }
                4 => {
                    let other = &corpus[rng.usize(..corpus.len())];
                    let from = rng.usize(..=other.len());
                    let end = (from + rng.usize(..64)).min(other.len());
                    input.splice(at..at, other[from..end].iter().copied());
                }
                5 => input.truncate(at),
                _ => {
                    let token = TOKENS[rng.usize(..TOKENS.len())];
                    input.splice(at..at, token.iter().copied());
                }
            }
        }
    }

    /// `RATEMESH_FUZZ_SMOKE` inputs (20,000 by default): the differential test's answers,
    /// then random mutations of them, from a fixed seed (`RATEMESH_FUZZ_SEED` for another).
    #[test]
    fn the_head_parser_holds_on_random_and_mutated_answers() {
        let count: usize = std::env::var("RATEMESH_FUZZ_SMOKE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let seed = std::env::var("RATEMESH_FUZZ_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0x6831_6865_6164);
        let mut runner = TestRunner::deterministic();
        let strategy = super::super::differential::case();
        let mut corpus: Vec<Vec<u8>> = (0..500)
            .map(|_| strategy.new_tree(&mut runner).unwrap().current().bytes())
            .collect();
        corpus.extend([
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec(),
            [&b"HTTP/1.1 200 OK\r\n"[..], &[b'x'; 70_000][..]].concat(),
            b"HTTP/1.1 100 Continue\r\n\r\n".repeat(5_000),
            Vec::new(),
        ]);
        let parsed = corpus.iter().filter(|input| fuzz_head(input)).count();
        assert!(
            parsed * 4 > corpus.len(),
            "{parsed} of {} parsed",
            corpus.len()
        );
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut input = Vec::new();
        let mut parsed = 0;
        for _ in 0..count {
            input.clear();
            if rng.u8(..8) == 0 {
                input.extend((0..rng.usize(..256)).map(|_| rng.u8(..)));
            } else {
                input.extend_from_slice(&corpus[rng.usize(..corpus.len())]);
            }
            mutate(&mut rng, &mut input, &corpus);
            parsed += usize::from(fuzz_head(&input));
        }
        // Mutations keep many heads whole: the checks after parsing ran.
        eprintln!("{parsed} of {count} mutated answers parsed");
        assert!(parsed * 20 > count, "{parsed} of {count} parsed");
    }
}
