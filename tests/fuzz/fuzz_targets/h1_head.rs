//! The reverse proxy's HTTP/1.1 client on an upstream's answer: its head (interim 1xx heads
//! skipped), the framing it gives, a chunk-size line and a trailer section. A panic is a
//! broken check (a hop-by-hop field handed on, a framing that contradicts the fields, ...).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ratemesh::fuzzing::h1_head(data);
});
