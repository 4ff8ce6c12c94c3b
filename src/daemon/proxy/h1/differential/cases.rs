//! The upstream answers of the differential test: every framing, well formed or not.

use proptest::prelude::*;

/// The bytes of an upstream's answer, as the parts they are written from.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    /// The request is a `HEAD` (else a `GET`).
    pub(crate) head_request: bool,
    interim: Vec<Head1>,
    head: Head1,
    payload: Payload,
    /// Bytes after the body.
    extra: Vec<u8>,
    /// Garbage sent instead of all the above.
    garbage: Option<Vec<u8>>,
    /// The sizes of the pieces written (used in turn), each with whether the server yields
    /// after it.
    pub(crate) pieces: Vec<(usize, bool)>,
}

/// A head as written.
#[derive(Debug, Clone)]
pub(crate) struct Head1 {
    version: &'static str,
    code: &'static str,
    reason: Option<Vec<u8>>,
    eol: &'static str,
    fields: Vec<Field>,
    /// The empty line that ends the head.
    end: &'static str,
}

/// A header (or trailer) field as written.
#[derive(Debug, Clone)]
struct Field {
    name: &'static str,
    sep: &'static str,
    value: Value,
    /// An obs-fold continuation line after it.
    fold: Option<&'static str>,
    eol: &'static str,
}

#[derive(Debug, Clone)]
enum Value {
    Bytes(Vec<u8>),
    /// The length of the body as sent, plus this.
    Length(i64),
    /// `n, m`: the body's length plus each.
    Lengths(i64, i64),
}

/// The body as written.
#[derive(Debug, Clone)]
enum Payload {
    Raw(Vec<u8>),
    Chunked(Chunked),
}

#[derive(Debug, Clone)]
struct Chunked {
    chunks: Vec<Chunk>,
    /// The same 1000-byte extension on every chunk.
    padded: bool,
    last: Option<(&'static str, &'static str, &'static str)>,
    trailers: Vec<Field>,
    /// The empty line after the trailers (`""`: none).
    end: &'static str,
}

#[derive(Debug, Clone)]
struct Chunk {
    data: Vec<u8>,
    size: Size,
    /// Between the size and the extensions or the line's end.
    blank: &'static str,
    ext: &'static str,
    eol: &'static str,
    /// After the data.
    data_end: &'static str,
}

#[derive(Debug, Clone)]
enum Size {
    Lower,
    Upper,
    Zeros(usize),
    Off(i64),
    Junk(&'static str),
}

impl Case {
    /// The bytes the upstream sends.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        if let Some(garbage) = &self.garbage {
            return garbage.clone();
        }
        let body = self.payload.bytes();
        let mut out = Vec::new();
        for head in &self.interim {
            head.write(&mut out, body.len());
        }
        self.head.write(&mut out, body.len());
        out.extend_from_slice(&body);
        out.extend_from_slice(&self.extra);
        out
    }
}

impl Head1 {
    fn write(&self, out: &mut Vec<u8>, body: usize) {
        out.extend_from_slice(self.version.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.code.as_bytes());
        if let Some(reason) = &self.reason {
            out.push(b' ');
            out.extend_from_slice(reason);
        }
        out.extend_from_slice(self.eol.as_bytes());
        for field in &self.fields {
            field.write(out, body);
        }
        out.extend_from_slice(self.end.as_bytes());
    }
}

impl Field {
    fn write(&self, out: &mut Vec<u8>, body: usize) {
        let length = |offset: i64| (body as i64 + offset).to_string().into_bytes();
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(self.sep.as_bytes());
        match &self.value {
            Value::Bytes(bytes) => out.extend_from_slice(bytes),
            Value::Length(offset) => out.extend_from_slice(&length(*offset)),
            Value::Lengths(a, b) => {
                out.extend_from_slice(&length(*a));
                out.extend_from_slice(b", ");
                out.extend_from_slice(&length(*b));
            }
        }
        out.extend_from_slice(self.eol.as_bytes());
        if let Some(fold) = self.fold {
            out.extend_from_slice(fold.as_bytes());
            out.extend_from_slice(self.eol.as_bytes());
        }
    }
}

impl Payload {
    fn bytes(&self) -> Vec<u8> {
        let chunked = match self {
            Payload::Raw(bytes) => return bytes.clone(),
            Payload::Chunked(chunked) => chunked,
        };
        let mut out = Vec::new();
        for chunk in &chunked.chunks {
            let n = chunk.data.len();
            let size = match chunk.size {
                Size::Lower => format!("{n:x}"),
                Size::Upper => format!("{n:X}"),
                Size::Zeros(zeros) => format!("{}{n:x}", "0".repeat(zeros)),
                Size::Off(offset) => format!("{:x}", (n as i64 + offset).max(0)),
                Size::Junk(junk) => junk.to_owned(),
            };
            out.extend_from_slice(size.as_bytes());
            out.extend_from_slice(chunk.blank.as_bytes());
            out.extend_from_slice(chunk.ext.as_bytes());
            if chunked.padded {
                out.push(b';');
                out.extend_from_slice(&[b'p'; 1000]);
            }
            out.extend_from_slice(chunk.eol.as_bytes());
            out.extend_from_slice(&chunk.data);
            out.extend_from_slice(chunk.data_end.as_bytes());
        }
        if let Some((size, ext, eol)) = chunked.last {
            for part in [size, ext, eol] {
                out.extend_from_slice(part.as_bytes());
            }
            for field in &chunked.trailers {
                field.write(&mut out, 0);
            }
            out.extend_from_slice(chunked.end.as_bytes());
        }
        out
    }
}

fn eol() -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![24 => Just("\r\n"), 3 => Just("\n"), 1 => Just("\r")]
}

/// A byte of a field's value: mostly visible ASCII, some tabs, obs-text and controls.
fn value_byte() -> impl Strategy<Value = u8> {
    prop_oneof![24 => 0x20..0x7fu8, 1 => Just(b'\t'), 1 => 0x80..=0xffu8, 1 => 0..0x20u8]
}

fn field(
    name: impl Strategy<Value = &'static str>,
    value: impl Strategy<Value = Value>,
) -> impl Strategy<Value = Field> {
    let sep = prop_oneof![
        12 => Just(": "),
        3 => Just(":"),
        1 => Just(":\t"),
        1 => Just(" : "),
    ];
    let fold = prop_oneof![30 => Just(None), 1 => Just(Some(" folded")), 1 => Just(Some("\tx"))];
    (name, sep, value, fold, eol()).prop_map(|(name, sep, value, fold, eol)| Field {
        name,
        sep,
        value,
        fold,
        eol,
    })
}

fn text(values: &'static [&'static str]) -> impl Strategy<Value = Value> + Clone {
    proptest::sample::select(values).prop_map(|v| Value::Bytes(v.as_bytes().to_vec()))
}

fn content_length() -> impl Strategy<Value = Field> {
    let value = prop_oneof![
        8 => Just(Value::Length(0)),
        1 => Just(Value::Length(1)),
        1 => Just(Value::Length(-1)),
        1 => Just(Value::Lengths(0, 0)),
        1 => Just(Value::Lengths(0, 1)),
        2 => text(&[
            "", " ", "+5", "-1", "0x10", "5 5", "1e3", "00000000000000000007",
            "99999999999999999999", "18446744073709551615", "18446744073709551616", "abc",
            "5,", ",5", "\t3\t", "3,,3", "0",
        ]),
    ];
    let name = proptest::sample::select(&["Content-Length", "content-length", "CONTENT-LENGTH"]);
    field(name, value)
}

fn transfer_encoding() -> impl Strategy<Value = Field> {
    let value = prop_oneof![
        8 => text(&["chunked"]),
        3 => text(&[
            "Chunked", "CHUNKED", " chunked", "chunked ", "gzip, chunked", "chunked, gzip",
            "chunked,", ",chunked", "chunked, ", "chunked, chunked", "identity", "",
            "chunked\u{80}", "x-custom",
        ]),
    ];
    let name = proptest::sample::select(&["Transfer-Encoding", "transfer-encoding"]);
    field(name, value)
}

/// Any other field: a hop-by-hop one, `Connection` naming fields, or an ordinary one.
fn other_field() -> impl Strategy<Value = Field> {
    let bytes = proptest::collection::vec(value_byte(), 0..16).prop_map(Value::Bytes);
    prop_oneof![
        6 => field(
            proptest::sample::select(&[
                "X-Kind", "x-kind", "Set-Cookie", "Date", "Content-Type", "Keep-Alive", "Trailer",
                "Upgrade", "TE", "Proxy-Authenticate", "Proxy-Connection", "Server",
            ]),
            bytes
        ),
        2 => field(
            Just("Connection"),
            text(&[
                "close", "keep-alive", "x-kind", "close, x-kind", "content-length", "Upgrade",
                "Keep-Alive, Date",
            ]),
        ),
        1 => field(Just("Keep-Alive"), text(&["timeout=5", "timeout=0", "max=3"])),
        1 => field(
            proptest::sample::select(&["Bad Name", "", "X\u{1}y", "x-ok"]),
            text(&["v"]),
        ),
    ]
}

fn ext() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        12 => Just(""),
        3 => Just(";a=b"),
        1 => Just(";name=\"quoted;value\""),
        1 => Just(";x"),
        1 => Just(";a\nb"),
        1 => Just(";a\rb"),
        1 => Just(";\r"),
        1 => Just(";ext\0nul"),
    ]
}

fn chunk() -> impl Strategy<Value = Chunk> {
    let size = prop_oneof![
        12 => Just(Size::Lower),
        3 => Just(Size::Upper),
        1 => (1..20usize).prop_map(Size::Zeros),
        1 => (-2..3i64).prop_map(Size::Off),
        1 => proptest::sample::select(&["", "x", "-1", "+5", "0x5", " 5", "5 5", "g"])
            .prop_map(Size::Junk),
    ];
    let blank = prop_oneof![20 => Just(""), 1 => Just(" "), 1 => Just("\t"), 1 => Just("\x0c")];
    let data_end = prop_oneof![
        20 => Just("\r\n"),
        2 => Just("\n"),
        1 => Just("\r"),
        1 => Just(""),
        1 => Just("xx"),
    ];
    (
        proptest::collection::vec(any::<u8>(), 1..40),
        size,
        blank,
        ext(),
        eol(),
        data_end,
    )
        .prop_map(|(data, size, blank, ext, eol, data_end)| Chunk {
            data,
            size,
            blank,
            ext,
            eol,
            data_end,
        })
}

/// A well-formed chunk.
fn plain_chunk() -> impl Strategy<Value = Chunk> {
    proptest::collection::vec(any::<u8>(), 1..40).prop_map(|data| Chunk {
        data,
        size: Size::Lower,
        blank: "",
        ext: "",
        eol: "\r\n",
        data_end: "\r\n",
    })
}

fn chunked() -> impl Strategy<Value = Chunked> {
    let chunks = prop_oneof![
        12 => proptest::collection::vec(chunk(), 0..4).prop_map(|c| (c, false)),
        1 => (proptest::collection::vec(plain_chunk(), 14..20), any::<bool>()),
    ];
    let last = prop_oneof![
        12 => (
            prop_oneof![8 => Just("0"), 1 => Just("000"), 1 => Just("0 ")],
            ext(),
            eol()
        )
            .prop_map(Some),
        1 => Just(None),
    ];
    let trailer_value = prop_oneof![
        12 => proptest::collection::vec(value_byte(), 0..12).prop_map(Value::Bytes),
        1 => Just(Value::Bytes(vec![b'v'; 17_000])),
    ];
    let trailer = field(
        proptest::sample::select(&["X-Checksum", "Expires", "Content-Length", "bad name"]),
        trailer_value,
    );
    let trailers = prop_oneof![
        6 => Just(Vec::new()),
        2 => proptest::collection::vec(trailer, 1..4),
    ];
    let end = prop_oneof![12 => Just("\r\n"), 1 => Just("\n"), 1 => Just("")];
    (chunks, last, trailers, end).prop_map(|((chunks, padded), last, trailers, end)| Chunked {
        chunks,
        padded,
        last,
        trailers,
        end,
    })
}

fn head(
    codes: &'static [&'static str],
    fields: impl Strategy<Value = Vec<Field>>,
) -> impl Strategy<Value = Head1> {
    let version = prop_oneof![
        20 => Just("HTTP/1.1"),
        4 => Just("HTTP/1.0"),
        1 => proptest::sample::select(&["HTTP/1.2", "HTTP/2.0", "http/1.1", "HTTP/1.1 ", "ICY"]),
    ];
    let reason = prop_oneof![
        8 => Just(Some(b"OK".to_vec())),
        2 => Just(None),
        1 => Just(Some(Vec::new())),
        1 => proptest::collection::vec(value_byte(), 0..10).prop_map(Some),
    ];
    let end = prop_oneof![24 => Just("\r\n"), 3 => Just("\n"), 1 => Just("\r")];
    (
        version,
        proptest::sample::select(codes),
        reason,
        eol(),
        fields,
        end,
    )
        .prop_map(|(version, code, reason, eol, fields, end)| Head1 {
            version,
            code,
            reason,
            eol,
            fields,
            end,
        })
}

/// The final head's fields for `payload`: usually framing that fits it, sometimes more
/// framing fields, and other fields, in any order.
fn fields_for(chunked: bool) -> impl Strategy<Value = Vec<Field>> {
    let fitting = if chunked {
        prop_oneof![
            8 => transfer_encoding().prop_map(|f| vec![f]),
            1 => content_length().prop_map(|f| vec![f]),
            1 => Just(Vec::new()),
        ]
        .boxed()
    } else {
        prop_oneof![
            6 => content_length().prop_map(|f| vec![f]),
            3 => Just(Vec::new()),
            1 => transfer_encoding().prop_map(|f| vec![f]),
        ]
        .boxed()
    };
    let framing = prop_oneof![content_length(), transfer_encoding()];
    let more = prop_oneof![6 => Just(Vec::new()), 3 => proptest::collection::vec(framing, 1..3)];
    (
        fitting,
        more,
        proptest::collection::vec(other_field(), 0..4),
    )
        .prop_flat_map(|(mut fields, more, others)| {
            fields.extend(more);
            fields.extend(others);
            Just(fields).prop_shuffle()
        })
}

/// An upstream's answer to one request.
pub(crate) fn case() -> impl Strategy<Value = Case> {
    let payload = prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..100).prop_map(Payload::Raw),
        2 => chunked().prop_map(Payload::Chunked),
    ];
    let interim = prop_oneof![
        6 => Just(Vec::new()),
        1 => proptest::collection::vec(
            head(
                &["100", "102", "103", "199"],
                proptest::collection::vec(prop_oneof![other_field(), content_length()], 0..2),
            ),
            1..3,
        ),
    ]
    .boxed();
    let extra = prop_oneof![
        12 => Just(Vec::new()),
        1 => proptest::collection::vec(any::<u8>(), 1..20),
        1 => Just(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec()),
    ]
    .boxed();
    let garbage = prop_oneof![
        30 => Just(None),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Some),
    ]
    .boxed();
    let pieces = proptest::collection::vec((1..48usize, any::<bool>()), 1..8).boxed();
    payload
        .prop_flat_map(move |payload| {
            let chunked = matches!(payload, Payload::Chunked(_));
            let final_head = head(
                &[
                    "200", "200", "200", "200", "201", "204", "206", "301", "304", "404", "500",
                    "101", "099", "999", "2000", "20", "abc",
                ],
                fields_for(chunked),
            );
            (
                prop_oneof![4 => Just(false), 1 => Just(true)],
                interim.clone(),
                final_head,
                Just(payload),
                extra.clone(),
                garbage.clone(),
                pieces.clone(),
            )
        })
        .prop_map(
            |(head_request, interim, head, payload, extra, garbage, pieces)| Case {
                head_request,
                interim,
                head,
                payload,
                extra,
                garbage,
                pieces,
            },
        )
}
