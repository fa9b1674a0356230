//! What the HTTP providers share: the client (reqwest + rustls, read timeouts rather than total
//! timeouts so long streams live), SSE reading that stops the moment a thread is cancelled, and
//! the classification of HTTP failures (SPEC §6).
//!
//! Never puts an API key in an error, a log line or a transcript: keys only travel in headers.

use super::{BoxFuture, ErrorKind, LlmResponse, ProviderError};
use crate::core::money::Usage;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Settings of one HTTP provider.
#[derive(Debug, Clone)]
pub(crate) struct HttpSettings {
    /// Base URL as the official SDKs use it (OpenAI's includes `/v1`, Anthropic's does not).
    pub base_url: String,
    /// The API key, if the provider needs one.
    pub api_key: Option<String>,
    /// Extra headers from config.
    pub headers: Vec<(String, String)>,
    /// Longest silence while reading a response.
    pub read_timeout: Duration,
}

/// Installs rustls's AWS-LC provider for every HTTP client of the process (no OpenSSL; the
/// library that also signs, `record/signing.rs`). Installing twice is harmless: the first
/// provider wins.
pub(crate) fn ensure_tls_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Builds the HTTP client (rustls with the AWS-LC provider; no OpenSSL).
pub(crate) fn client(settings: &HttpSettings) -> Result<reqwest::Client, String> {
    ensure_tls_provider();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(settings.read_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// A failure with no usage.
pub(crate) fn fail(kind: ErrorKind, message: impl Into<String>) -> ProviderError {
    ProviderError {
        kind,
        message: message.into(),
        retry_after: None,
        usage: Usage::default(),
        usage_incomplete: false,
    }
}

/// A failure after the request may have reached the model: it may have been billed for more
/// than `usage` says (see [`ProviderError::usage_incomplete`]).
pub(crate) fn cut_short(
    kind: ErrorKind,
    message: impl Into<String>,
    usage: Usage,
) -> ProviderError {
    ProviderError {
        usage,
        usage_incomplete: true,
        ..fail(kind, message)
    }
}

/// The `Cancelled` error, once the request was sent: the server may bill it.
pub(crate) fn cancelled() -> ProviderError {
    cut_short(ErrorKind::Cancelled, "cancelled", Usage::default())
}

/// Classifies a transport error. A refused connection bills nothing; any other failure may come
/// after the server took the request.
pub(crate) fn transport(e: &reqwest::Error) -> ProviderError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Connection
    };
    // reqwest's Display names the URL, never headers: no key can leak here.
    if e.is_connect() {
        fail(kind, format!("{e}"))
    } else {
        cut_short(kind, format!("{e}"), Usage::default())
    }
}

/// Classifies a non-2xx response from its status, `retry-after` header and body.
pub(crate) async fn status_error(resp: reqwest::Response) -> ProviderError {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(3600.0)));
    let body = resp.text().await.unwrap_or_default();
    let detail = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.chars().take(300).collect());
    let lower = format!("{detail} {body}").to_lowercase();
    let kind = match status {
        429 => ErrorKind::RateLimited,
        529 => ErrorKind::Overloaded,
        401 | 403 => ErrorKind::Auth,
        _ if lower.contains("overloaded") => ErrorKind::Overloaded,
        400 | 413 | 422
            if lower.contains("context length")
                || lower.contains("context_length")
                || lower.contains("prompt is too long")
                || lower.contains("maximum context")
                || lower.contains("exceeds the context") =>
        {
            ErrorKind::ContextOverflow
        }
        400..=499 => ErrorKind::InvalidRequest,
        _ => ErrorKind::Server,
    };
    let hint = match kind {
        ErrorKind::Auth => " — check the API key named by the provider's `api_key_env`",
        ErrorKind::InvalidRequest => " — check the model id and the provider's base_url",
        ErrorKind::ContextOverflow => {
            " — the conversation is larger than the model's context window"
        }
        _ => "",
    };
    ProviderError {
        kind,
        message: format!("HTTP {status}: {detail}{hint}"),
        retry_after,
        usage: Usage::default(),
        usage_incomplete: false,
    }
}

/// One server-sent event.
pub(crate) struct SseEvent {
    /// `event:` field (empty when absent).
    pub event: String,
    /// `data:` field.
    pub data: String,
}

/// Reads a streaming response event by event, handing each to `on_event`, until it returns
/// `Ok(true)` (done), the stream ends, fails, or `cancel` fires (the connection is then dropped
/// at once). `on_event` errors stop the stream with that error.
pub(crate) async fn read_sse(
    resp: reqwest::Response,
    cancel: &CancellationToken,
    mut on_event: impl FnMut(SseEvent) -> Result<bool, ProviderError>,
) -> Result<(), ProviderError> {
    let mut events = resp.bytes_stream().eventsource();
    loop {
        let next = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(cancelled()),
            n = events.next() => n,
        };
        match next {
            None => return Ok(()),
            Some(Err(e)) => {
                return Err(cut_short(
                    ErrorKind::Connection,
                    format!("stream interrupted: {e}"),
                    Usage::default(),
                ))
            }
            Some(Ok(ev)) => {
                if on_event(SseEvent {
                    event: ev.event,
                    data: ev.data,
                })? {
                    return Ok(());
                }
            }
        }
    }
}

/// Sends a request, racing it against `cancel`.
pub(crate) async fn send(
    req: reqwest::RequestBuilder,
    cancel: &CancellationToken,
) -> Result<reqwest::Response, ProviderError> {
    let resp = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Err(cancelled()),
        r = req.send() => r.map_err(|e| transport(&e))?,
    };
    if resp.status().is_success() {
        Ok(resp)
    } else {
        Err(status_error(resp).await)
    }
}

/// Assembles one streamed response from its SSE events (one per wire format).
pub(crate) trait StreamAssembler: Default + Send + 'static {
    /// Feeds one event; true when the stream is complete.
    fn feed(&mut self, ev: &SseEvent) -> Result<bool, ProviderError>;
    /// Usage already billed, reported with a failure mid-stream.
    fn partial_usage(&self) -> Usage;
    /// Whether the stream already reported the call's whole usage (then a failure after it
    /// bills nothing more).
    fn usage_final(&self) -> bool;
    /// The finished response.
    fn finish(self) -> Result<LlmResponse, ProviderError>;
    /// Text received since the last call (for live clients).
    fn take_text(&mut self) -> String;
}

/// How a provider presents its key.
pub(crate) enum Auth {
    /// `authorization: Bearer <key>` (OpenAI-compatible).
    Bearer,
    /// The key as this header's value (Anthropic's `x-api-key`).
    Header(&'static str),
}

/// POSTs `body` to `base_url + path` with the provider's key and headers, streams the response
/// through assembler `A`, and stops at once when `cancel` fires. A failure mid-stream carries the
/// usage billed so far. Streamed text goes to `on_text` as it arrives.
#[allow(clippy::too_many_arguments)] // two callers, one per wire format; each argument differs
pub(crate) fn post_stream<A: StreamAssembler>(
    client: &reqwest::Client,
    settings: &HttpSettings,
    path: &str,
    auth: Auth,
    extra_headers: &[(&str, &str)],
    body: &serde_json::Value,
    on_text: Option<super::TextSink>,
    cancel: CancellationToken,
) -> BoxFuture<Result<LlmResponse, ProviderError>> {
    let url = format!("{}{path}", settings.base_url.trim_end_matches('/'));
    let mut builder = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in extra_headers {
        builder = builder.header(*k, *v);
    }
    if let Some(key) = &settings.api_key {
        builder = match auth {
            Auth::Bearer => builder.bearer_auth(key),
            Auth::Header(name) => builder.header(name, key),
        };
    }
    for (k, v) in &settings.headers {
        builder = builder.header(k, v);
    }
    Box::pin(async move {
        let resp = send(builder, &cancel).await?;
        let mut asm = A::default();
        let fed = read_sse(resp, &cancel, |ev| {
            let done = asm.feed(&ev);
            if let Some(sink) = &on_text {
                sink.send(&asm.take_text());
            }
            done
        });
        match fed.await {
            Ok(()) => asm.finish(),
            Err(mut e) => {
                e.usage = asm.partial_usage();
                // Once the response is streaming, the server has taken the call: whatever
                // failed, it may bill more than it reported, unless its final usage is in.
                e.usage_incomplete = !asm.usage_final();
                Err(e)
            }
        }
    })
}
