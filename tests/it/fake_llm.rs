//! A loopback fake LLM server speaking both wire formats (OpenAI chat-completions and Anthropic
//! Messages), replaying scripted replies: streams split into many small chunks, error statuses
//! with `retry-after`, connections dropped mid-stream, and slow streams for cancellation.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scripted reply.
pub enum Reply {
    /// A `text/event-stream` body: each item is one whole SSE event; `gap` between events;
    /// `drop_after`: close the connection after that many events.
    Sse {
        events: Vec<String>,
        gap: Duration,
        drop_after: Option<usize>,
    },
    /// An error status.
    Status {
        code: u16,
        retry_after: Option<&'static str>,
        body: String,
    },
}

/// A recorded request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

#[derive(Default)]
pub struct Fake {
    replies: Mutex<VecDeque<Reply>>,
    pub seen: Mutex<Vec<Seen>>,
    /// Streams whose client went away before the stream ended.
    pub closed_early: AtomicUsize,
}

impl Fake {
    pub fn push(&self, r: Reply) {
        self.replies.lock().unwrap().push_back(r);
    }
    /// A whole stream, sent at once.
    pub fn stream(&self, events: Vec<String>) {
        self.push(Reply::Sse {
            events,
            gap: Duration::ZERO,
            drop_after: None,
        });
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Starts the server on 127.0.0.1:0; returns its base URL (no path) and the state.
pub async fn start() -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), fake)
}

/// Sets the flag unless the stream ran to its end.
struct Guard {
    fake: Arc<Fake>,
    finished: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.finished {
            self.fake.closed_early.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn handle(
    State(fake): State<Arc<Fake>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    fake.seen.lock().unwrap().push(Seen {
        path: uri.path().to_string(),
        headers,
        body,
    });
    let reply = fake.replies.lock().unwrap().pop_front();
    match reply {
        None => Response::builder()
            .status(500)
            .body(Body::from(
                "{\"error\":{\"message\":\"fake: no scripted reply\"}}",
            ))
            .unwrap(),
        Some(Reply::Status {
            code,
            retry_after,
            body,
        }) => {
            let mut b = Response::builder()
                .status(StatusCode::from_u16(code).unwrap())
                .header("content-type", "application/json");
            if let Some(r) = retry_after {
                b = b.header("retry-after", r);
            }
            b.body(Body::from(body)).unwrap()
        }
        Some(Reply::Sse {
            events,
            gap,
            drop_after,
        }) => {
            let limit = drop_after.unwrap_or(usize::MAX);
            let total = events.len();
            let state = (
                events.into_iter().enumerate(),
                Guard {
                    fake: fake.clone(),
                    finished: false,
                },
            );
            let stream =
                futures_util::stream::unfold(state, move |(mut it, mut guard)| async move {
                    let (i, ev) = it.next()?;
                    if i >= limit {
                        // Drop mid-stream: end the body abruptly with an error.
                        guard.finished = true;
                        return Some((
                            Err(std::io::Error::other("fake: connection dropped")),
                            (it, guard),
                        ));
                    }
                    if i > 0 && !gap.is_zero() {
                        tokio::time::sleep(gap).await;
                    }
                    if i + 1 == total {
                        guard.finished = true;
                    }
                    Some((Ok::<Bytes, std::io::Error>(Bytes::from(ev)), (it, guard)))
                });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(stream))
                .unwrap()
        }
    }
}

fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

/// OpenAI: a streamed reply with `text` and/or one tool call, usage in the final chunk.
pub fn openai(
    text: &str,
    tool: Option<(&str, Value)>,
    prompt: u64,
    cached: u64,
    completion: u64,
) -> Vec<String> {
    let tool = tool.map(|(name, args)| (name, args.to_string()));
    openai_raw(text, tool, prompt, cached, completion)
}

/// [`openai`] with the tool call's arguments as the model streamed them (they need not be
/// JSON).
pub fn openai_raw(
    text: &str,
    tool: Option<(&str, String)>,
    prompt: u64,
    cached: u64,
    completion: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    out.push(data(
        json!({"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}),
    ));
    for p in pieces(text, 3) {
        out.push(data(json!({"choices":[{"index":0,"delta":{"content":p}}]})));
    }
    if let Some((name, args)) = &tool {
        out.push(data(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":name,"arguments":""}}]}}]})));
        for p in pieces(args, 4) {
            out.push(data(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":p}}]}}]})));
        }
    }
    let finish = if tool.is_some() { "tool_calls" } else { "stop" };
    out.push(data(
        json!({"choices":[{"index":0,"delta":{},"finish_reason":finish}]}),
    ));
    out.push(data(json!({"choices":[],"usage":{"prompt_tokens":prompt,"completion_tokens":completion,"total_tokens":prompt+completion,"prompt_tokens_details":{"cached_tokens":cached}}})));
    out.push("data: [DONE]\n\n".to_string());
    out
}

fn event(name: &str, v: Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// Anthropic: a streamed reply with `text` and/or one tool_use, usage in message_start and
/// message_delta, with pings between.
pub fn anthropic(
    text: &str,
    tool: Option<(&str, Value)>,
    input: u64,
    cache_read: u64,
    output: u64,
) -> Vec<String> {
    let mut out = vec![event(
        "message_start",
        json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":input,"cache_read_input_tokens":cache_read,"cache_creation_input_tokens":0,"output_tokens":1}}}),
    )];
    out.push(event("ping", json!({"type":"ping"})));
    let mut index = 0;
    if !text.is_empty() {
        out.push(event("content_block_start", json!({"type":"content_block_start","index":index,"content_block":{"type":"text","text":""}})));
        for p in pieces(text, 3) {
            out.push(event("content_block_delta", json!({"type":"content_block_delta","index":index,"delta":{"type":"text_delta","text":p}})));
        }
        out.push(event(
            "content_block_stop",
            json!({"type":"content_block_stop","index":index}),
        ));
        index += 1;
    }
    if let Some((name, args)) = &tool {
        out.push(event("content_block_start", json!({"type":"content_block_start","index":index,"content_block":{"type":"tool_use","id":"toolu_1","name":name,"input":{}}})));
        for p in pieces(&args.to_string(), 4) {
            out.push(event("content_block_delta", json!({"type":"content_block_delta","index":index,"delta":{"type":"input_json_delta","partial_json":p}})));
        }
        out.push(event(
            "content_block_stop",
            json!({"type":"content_block_stop","index":index}),
        ));
    }
    out.push(event("ping", json!({"type":"ping"})));
    let stop = if tool.is_some() {
        "tool_use"
    } else {
        "end_turn"
    };
    out.push(event("message_delta", json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},"usage":{"output_tokens":output}})));
    out.push(event("message_stop", json!({"type":"message_stop"})));
    out
}

/// The same reply in the wire format of provider `kind` (`openai` or `anthropic`).
pub fn reply(kind: &str, text: &str, input: u64, cached: u64, output: u64) -> Vec<String> {
    if kind == "openai" {
        openai(text, None, input + cached, cached, output)
    } else {
        anthropic(text, None, input, cached, output)
    }
}
