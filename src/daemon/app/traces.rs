//! OpenTelemetry spans of the node's requests (`[traces]`, feature `otel`), exported over
//! OTLP/gRPC in batches. Per traced request: a server span (`HTTP {method} {route}`),
//! continued from the request's W3C `traceparent` when it has one; under it `ratemesh.decide`
//! for the decision (its policies, the backends it asked, the verdict; its length includes
//! any wait for a key's owner or for Redis) and, for an admitted request sent on,
//! `ratemesh.proxy` (a client span) whose context goes to the upstream in `traceparent`.
//! Sampling follows the parent's flag, else `sample_ratio`. Nothing here runs for a node
//! without `[traces]`.

use std::time::Duration;

use axum::body::Body;
use http::Request;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};

use super::{App, AppFuture, Route, Target};
use crate::daemon::forward_auth::{self, Checks};
use crate::daemon::node_file::Traces as TracesSettings;

/// How long spans wait to be sent together.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the node's spans are made and sent.
pub(crate) struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces").finish_non_exhaustive()
    }
}

impl Traces {
    /// Start exporting to `settings.otlp_endpoint` (inside the node's tokio runtime; the
    /// collector is reached when the first batch goes).
    pub(crate) fn start(settings: &TracesSettings) -> Result<Traces, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&settings.otlp_endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        let batches = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(BATCH_DELAY)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batches)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("ratemesh");
        Ok(Traces {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
        })
    }

    /// Send the spans still held, and stop.
    pub(crate) fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "traces: the last spans were not all sent");
        }
    }
}

/// A request's headers, read for a `traceparent`.
struct Read<'a>(&'a HeaderMap);

impl Extractor for Read<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// An upstream request's headers, given the proxy span's `traceparent`.
struct Write<'a>(&'a mut HeaderMap);

impl Injector for Write<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

impl App {
    /// Answer `request` as [`App::answer`] does, with its spans.
    pub(super) fn answer_traced(
        &self,
        traces: &std::sync::Arc<Traces>,
        route: Route,
        request: Request<Body>,
    ) -> AppFuture {
        let matched = match &route.to {
            Target::Check(matched) | Target::Gateway(matched) => matched,
            Target::Own | Target::BadCheck(_) => return self.answer_plain(route, request),
        };
        let tracer = &traces.tracer;
        let parent = traces.propagator.extract(&Read(request.headers()));
        let method = request.method().as_str().to_string();
        let server = tracer
            .span_builder(format!("HTTP {method}"))
            .with_kind(SpanKind::Server)
            .start_with_context(tracer, &parent);
        let cx = parent.with_span(server);
        if !cx.span().is_recording() {
            // Not sampled: the request goes as it would untraced, and its upstream learns
            // that the trace is not sampled.
            return self.answer_plain(route, request);
        }
        let summary = matched.summary();
        describe(&cx, summary.route, &method, &request);
        let decide = tracer
            .span_builder("ratemesh.decide")
            .with_kind(SpanKind::Internal)
            .start_with_context(tracer, &cx);
        let decide = cx.with_span(decide);
        decide.span().set_attributes([
            KeyValue::new("ratemesh.policies", summary.policies.join(",")),
            KeyValue::new("ratemesh.mesh", summary.mesh),
            KeyValue::new("ratemesh.redis", summary.redis),
        ]);
        let admitted = {
            let decide = decide.clone();
            move || {
                decide
                    .span()
                    .set_attribute(KeyValue::new("ratemesh.verdict", "admitted"));
                decide.span().end();
            }
        };
        let answering = match route.to {
            Target::Check(matched) => Checks::answer(self.gate.pass(matched, request, move |_| {
                admitted();
                forward_auth::admitted()
            })),
            Target::Gateway(matched) => {
                let (gateway, hop) = (self.gateway.clone(), route.hop);
                let (tracer, cx) = (tracer.clone(), cx.clone());
                let propagator = traces.propagator.clone();
                self.gate.pass(matched, request, move |mut request| {
                    admitted();
                    let sent = hop.upstream.is_some().then(|| {
                        let proxy = tracer
                            .span_builder("ratemesh.proxy")
                            .with_kind(SpanKind::Client)
                            .start_with_context(&tracer, &cx);
                        let proxy = cx.with_span(proxy);
                        propagator.inject_context(&proxy, &mut Write(request.headers_mut()));
                        proxy
                    });
                    let forwarded = gateway.forward(request, hop);
                    async move {
                        let response = forwarded.await;
                        if let Some(proxy) = sent {
                            if let Ok(response) = &response {
                                proxy.span().set_attribute(KeyValue::new(
                                    "http.response.status_code",
                                    i64::from(response.status().as_u16()),
                                ));
                            }
                            proxy.span().end();
                        }
                        response
                    }
                })
            }
            Target::Own | Target::BadCheck(_) => unreachable!("answered above"),
        };
        Box::pin(async move {
            let response = answering.await;
            // Not admitted: the decision (or the request's refusal) answered.
            decide
                .span()
                .set_attribute(KeyValue::new("ratemesh.verdict", "denied"));
            decide.span().end();
            if let Ok(response) = &response {
                let status = response.status();
                cx.span().set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status.as_u16()),
                ));
                if status.is_server_error() {
                    cx.span().set_status(Status::error(status.to_string()));
                }
            }
            cx.span().end();
            response
        })
    }
}

/// Name the server span by its route and give it the request's attributes.
fn describe(cx: &Context, route: Option<&'static str>, method: &str, request: &Request<Body>) {
    let span = cx.span();
    if let Some(route) = route {
        span.update_name(format!("HTTP {method} {route}"));
        span.set_attribute(KeyValue::new("http.route", route));
    }
    span.set_attributes([
        KeyValue::new("http.request.method", method.to_string()),
        KeyValue::new("url.path", request.uri().path().to_string()),
    ]);
}
