//! The node file's `[traces]` table: OpenTelemetry spans of the node's requests, exported
//! over OTLP/gRPC (needs a build with the `otel` feature).
//!
//! ```toml
//! [traces]
//! otlp_endpoint = "http://127.0.0.1:4317"   # an OpenTelemetry Collector's OTLP/gRPC port
//! sample_ratio = 0.01                       # of the requests that come without a trace
//! service_name = "ratemesh"                 # `service.name` of the spans
//! ```

use serde::Deserialize;
use toml::Spanned;

use crate::config::{ConfigError, Source};

/// The `[traces]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct Traces {
    /// Where spans go: an OTLP/gRPC endpoint (`http://host:4317`).
    pub otlp_endpoint: String,
    /// The share of requests without a sampled parent that are traced (0 to 1); a request
    /// whose `traceparent` says sampled is traced, one that says not sampled is not.
    pub sample_ratio: f64,
    /// The spans' `service.name`.
    pub service_name: String,
    /// The table's line in the node file (for errors found later).
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTraces {
    otlp_endpoint: String,
    sample_ratio: Option<f64>,
    service_name: Option<String>,
}

/// Validate `[traces]`.
pub(super) fn traces(
    source: &Source<'_>,
    spanned: &Spanned<RawTraces>,
) -> Result<Traces, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let at = |key: &str| source.line_of_key(span.clone(), key);
    let line = source.line_of(span.start);
    if !cfg!(feature = "otel") {
        return Err(source.error(
            line,
            "traces",
            "this build exports no traces; build ratemesh with `--features otel`",
        ));
    }
    let endpoint = raw.otlp_endpoint.trim();
    // Plain gRPC: a collector beside the node, or a local agent that forwards over TLS.
    let scheme_ok = endpoint.starts_with("http://");
    if !scheme_ok || endpoint.parse::<::http::Uri>().is_err() {
        return Err(source.error(
            at("otlp_endpoint"),
            "traces.otlp_endpoint",
            format!(
                "`{endpoint}` is not a plain OTLP/gRPC address; write e.g. \"http://127.0.0.1:4317\" \
                 (TLS to a collector goes through a local agent)"
            ),
        ));
    }
    let sample_ratio = raw.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err(source.error(
            at("sample_ratio"),
            "traces.sample_ratio",
            format!("between 0 and 1, got {sample_ratio}"),
        ));
    }
    let service_name = raw
        .service_name
        .clone()
        .unwrap_or_else(|| "ratemesh".into());
    if service_name.is_empty() || service_name.len() > 256 {
        return Err(source.error(
            at("service_name"),
            "traces.service_name",
            "1 to 256 characters",
        ));
    }
    Ok(Traces {
        otlp_endpoint: endpoint.to_string(),
        sample_ratio,
        service_name,
        line,
    })
}
