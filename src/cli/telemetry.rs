//! Logs and traces for the `weft` binary: log lines on stderr (`WEFT_LOG`, default `warn`), and
//! — only when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set —
//! weft's spans (see `thread/spans.rs`) exported over OTLP, HTTP/protobuf, in batches from a
//! background thread (`telemetry/otlp.rs`, the `otel` feature). [`Telemetry::shutdown`] flushes
//! what is left. A weft built without `otel` logs as usual and warns that a configured endpoint
//! gets no spans.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

#[cfg(feature = "otel")]
mod otlp;
#[cfg(feature = "otel")]
use otlp::export;

/// What [`init`] set up; shut it down before the process exits.
#[derive(Default)]
pub struct Telemetry {
    /// The span exporter, when spans are exported.
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered (bounded by the exporter's timeout).
    pub fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider {
            if let Err(e) = p.shutdown() {
                eprintln!("weft: exporting the last spans failed: {e}");
            }
        }
    }
}

/// Installs the log subscriber and, if an OTLP endpoint is configured, the span exporter.
pub fn init(rt: tokio::runtime::Handle) -> Telemetry {
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG")
                .unwrap_or_else(|_| "warn".into()),
        );
    let configured = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()));
    if !configured {
        tracing_subscriber::registry().with(fmt).init();
        return Telemetry::default();
    }
    #[cfg(feature = "otel")]
    return Telemetry {
        provider: export(fmt, rt),
    };
    #[cfg(not(feature = "otel"))]
    {
        no_export(fmt, rt);
        Telemetry::default()
    }
}

/// Without the `otel` feature there is no exporter: logs only, and a warning saying why.
#[cfg(not(feature = "otel"))]
fn no_export(
    fmt: impl Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
    _rt: tokio::runtime::Handle,
) {
    tracing_subscriber::registry().with(fmt).init();
    tracing::warn!("OTLP export is off: this weft was built without the `otel` feature");
}
