//! OTLP export of weft's spans (the `otel` feature): a batch processor on its own thread,
//! posting HTTP/protobuf through weft's reqwest on the process's tokio runtime (no second HTTP
//! stack). Only spans of target `weft::otel` are exported.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use std::future::Future;
use std::pin::Pin;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// The OTLP exporter's HTTP client: weft's reqwest, its requests run on `rt` (the exporter's
/// thread has no runtime of its own).
#[derive(Debug)]
struct Http {
    client: reqwest::Client,
    rt: tokio::runtime::Handle,
}

type Sent = Result<Response<Bytes>, HttpError>;

impl HttpClient for Http {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Sent> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        let client = self.client.clone();
        let task = self.rt.spawn(async move {
            let (parts, body) = request.into_parts();
            let mut rb = client
                .request(parts.method, parts.uri.to_string())
                .body(body);
            for (k, v) in &parts.headers {
                rb = rb.header(k, v);
            }
            let resp = rb.send().await?;
            let (status, headers) = (resp.status(), resp.headers().clone());
            let bytes = resp.bytes().await?;
            let mut out = Response::builder().status(status).body(bytes)?;
            *out.headers_mut() = headers;
            Ok::<_, HttpError>(out)
        });
        Box::pin(async move { task.await.map_err(|e| Box::new(e) as HttpError)? })
    }
}

/// Installs the log subscriber `fmt` with the OTLP span exporter (the endpoint is configured)
/// and returns the exporter to flush at exit; if the exporter cannot be made, logs only, with a
/// warning saying why.
pub(super) fn export(
    fmt: impl Layer<Registry> + Send + Sync + 'static,
    rt: tokio::runtime::Handle,
) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    crate::provider::http::ensure_tls_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .build();
    let exporter = client.map_err(|e| e.to_string()).and_then(|client| {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_http_client(Http { client, rt })
            .build()
            .map_err(|e| e.to_string())
    });
    let exporter = match exporter {
        Ok(e) => e,
        Err(e) => {
            tracing_subscriber::registry().with(fmt).init();
            tracing::warn!("OTLP export is off: {e}");
            return None;
        }
    };
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("weft")
                .build(),
        )
        .build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("weft"))
        .with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.target() == crate::thread::SPAN_TARGET
        }));
    tracing_subscriber::registry().with(fmt).with(otel).init();
    Some(provider)
}
