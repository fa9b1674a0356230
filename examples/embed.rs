//! Embedding weft as a library with your own LLM backend.
//!
//! ```sh
//! cargo run --example embed
//! ```
//!
//! It makes a throw-away project (a directive and a price for the model), opens a runtime whose
//! every thread calls `Shouter` — a provider written here that answers by shouting the last user
//! message back, billing one token per four bytes — starts a thread, follows its events through
//! its handle and prints the report. Only weft's public API is used.

use std::sync::Arc;
use weft::{
    Block, BoxFuture, CancellationToken, LimitSet, LlmRequest, LlmResponse, Message, Project,
    Provider, ProviderError, Role, Runtime, Status, Usage,
};

/// A provider that shouts the last user message back.
struct Shouter;

impl Provider for Shouter {
    fn name(&self) -> &str {
        "shouter"
    }

    fn complete(
        &self,
        req: LlmRequest,
        _cancel: CancellationToken,
    ) -> BoxFuture<Result<LlmResponse, ProviderError>> {
        Box::pin(async move {
            let last = req
                .messages
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .map(text_of)
                .unwrap_or_default();
            let text = last.to_uppercase();
            let prompt_bytes: usize = req.messages.iter().map(|m| text_of(m).len()).sum();
            Ok(LlmResponse {
                text: text.clone(),
                tool_calls: vec![],
                usage: Usage {
                    input_tokens: (prompt_bytes as u64).div_ceil(4),
                    output_tokens: (text.len() as u64).div_ceil(4).min(req.max_tokens),
                    cache_read_tokens: 0,
                    cache_write_tokens: 0,
                },
                stop_reason: "end_turn".into(),
                ..Default::default()
            })
        })
    }
}

fn text_of(m: &Message) -> String {
    m.content
        .iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("weft-embed-{}", std::process::id()));
    std::fs::create_dir_all(dir.join(".weft"))?;
    std::fs::create_dir_all(dir.join("directives"))?;
    std::fs::write(
        dir.join(".weft/config.yaml"),
        "pricing:\n  shout-1: { input: 1.00, output: 2.00 }\n",
    )?;
    std::fs::write(
        dir.join("directives/greet.md"),
        "---\ndescription: Greets someone loudly\ninputs:\n  who: { type: string, required: true }\nlimits: { turns: 2, spend: 0.01 }\n---\nSay hello to {input:who}.\n",
    )?;

    let rt = Runtime::builder(Project { root: dir.clone() })
        .custom_provider(Arc::new(Shouter))
        .model("shout-1")
        .open()
        .await?;
    let mut inputs = serde_json::Map::new();
    inputs.insert("who".into(), "the weaver".into());
    let mut handle = rt.start("greet", inputs, LimitSet::default()).await?;
    let mut events = handle.events();
    println!("started {}", handle.id());
    let printer = tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            let done = matches!(ev, weft::Event::Finished(_));
            println!("event: {ev:?}");
            if done {
                break;
            }
        }
    });
    let report = handle.wait().await?;
    printer.await?;
    println!(
        "{} {} — result {:?}, {} spent",
        report.thread_id,
        report.status.as_str(),
        report.result.as_deref().unwrap_or(""),
        report.spend_nanos
    );
    // What the CLI and the HTTP API read: the project's threads, one thread, its subtree, and
    // its transcript, paged and rendered as `weft log` shows it.
    let rows = rt.list(&weft::ThreadFilter::default())?;
    println!("{} thread(s) in the project", rows.len());
    let view = rt.get(&report.thread_id)?.ok_or("the thread has no row")?;
    println!("verified thread.json: {}", view.verified);
    println!("subtree: {} thread(s)", rt.tree(&report.thread_id)?.len());
    let mut after = None;
    loop {
        let page = rt.transcript(&report.thread_id, after, 50)?;
        for line in &page.lines {
            if let Some((label, text)) = weft::describe_line(line) {
                println!("  {label:<12} {text}");
            }
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    if !view.verified || rows.is_empty() {
        return Err("the thread's records do not read back".into());
    }
    rt.shutdown();
    std::fs::remove_dir_all(&dir)?;
    if report.status != Status::Completed
        || report.result.as_deref() != Some("SAY HELLO TO THE WEAVER.")
    {
        return Err(format!("unexpected report: {report:?}").into());
    }
    Ok(())
}
