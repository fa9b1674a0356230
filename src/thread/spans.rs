//! `tracing` spans with the OpenTelemetry GenAI semantic-convention names (SPEC §12): a thread
//! is `invoke_agent {directive}`, an LLM call `chat {model}`, a tool call `execute_tool {name}`;
//! weft's own figures as `weft.*`. A child's thread span is a child of its parent's
//! `spawn_thread` tool span. Spans cost nothing when no subscriber wants them (the OTLP
//! exporter is installed only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set).

use crate::core::ids::ThreadId;
use crate::provider::{LlmResponse, ProviderError};
use tracing::field::Empty;
use tracing::Span;

/// The target every span of weft's is under (the exporter's filter selects it).
pub(crate) const TARGET: &str = "weft::otel";

/// A thread's span, under `parent` (the spawning tool call's span) or a root.
pub(crate) fn thread(
    parent: Option<&Span>,
    id: &ThreadId,
    directive: &str,
    parent_id: Option<&ThreadId>,
    provider: &str,
    model: &str,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent.and_then(Span::id),
        "invoke_agent",
        "otel.name" = format!("invoke_agent {directive}"),
        "otel.kind" = "internal",
        "gen_ai.operation.name" = "invoke_agent",
        "gen_ai.agent.name" = directive,
        "gen_ai.agent.id" = id.as_str(),
        "gen_ai.conversation.id" = id.as_str(),
        "gen_ai.provider.name" = provider,
        "gen_ai.request.model" = model,
        "weft.parent_id" = parent_id.map(ThreadId::as_str),
        "weft.status" = Empty,
        "weft.spend_nanos" = Empty,
        "weft.tree_spend_nanos" = Empty,
        "weft.limit" = Empty,
        "gen_ai.usage.input_tokens" = Empty,
        "gen_ai.usage.output_tokens" = Empty,
        "error.type" = Empty,
    )
}

/// An LLM call's span under its thread's.
pub(crate) fn chat(
    thread: &Span,
    provider: &str,
    model: &str,
    max_tokens: u64,
    reserved_nanos: i64,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: thread.id(),
        "chat",
        "otel.name" = format!("chat {model}"),
        "otel.kind" = "client",
        "gen_ai.operation.name" = "chat",
        "gen_ai.provider.name" = provider,
        "gen_ai.request.model" = model,
        "gen_ai.request.max_tokens" = max_tokens as i64,
        "weft.reserved_nanos" = reserved_nanos,
        "gen_ai.response.model" = Empty,
        "gen_ai.response.finish_reasons" = Empty,
        "gen_ai.usage.input_tokens" = Empty,
        "gen_ai.usage.output_tokens" = Empty,
        "gen_ai.usage.cache_read.input_tokens" = Empty,
        "weft.spend_nanos" = Empty,
        "error.type" = Empty,
    )
}

/// Records an LLM call's outcome and cost on its span.
pub(crate) fn chat_done(
    span: &Span,
    model: &str,
    outcome: &Result<LlmResponse, ProviderError>,
    usage: &crate::core::money::Usage,
    cost: i64,
) {
    // i64: the OTLP bridge exports u64 values as strings.
    span.record("gen_ai.usage.input_tokens", usage.input_tokens as i64);
    span.record("gen_ai.usage.output_tokens", usage.output_tokens as i64);
    span.record(
        "gen_ai.usage.cache_read.input_tokens",
        usage.cache_read_tokens as i64,
    );
    span.record("weft.spend_nanos", cost);
    match outcome {
        Ok(r) => {
            span.record("gen_ai.response.model", model);
            // One reason per call; `tracing` records no arrays, so it is the plain string.
            span.record("gen_ai.response.finish_reasons", r.stop_reason.as_str());
        }
        Err(e) => {
            span.record("error.type", format!("{:?}", e.kind));
        }
    }
}

/// A tool call's span under its thread's.
pub(crate) fn tool(thread: &Span, name: &str, call_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: thread.id(),
        "execute_tool",
        "otel.name" = format!("execute_tool {name}"),
        "otel.kind" = "internal",
        "gen_ai.operation.name" = "execute_tool",
        "gen_ai.tool.name" = name,
        "gen_ai.tool.call.id" = call_id,
        "error.type" = Empty,
    )
}
