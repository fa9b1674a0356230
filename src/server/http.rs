//! `weft serve`'s HTTP transport (axum): the API handlers under `/v1` behind a bearer token,
//! Server-Sent Events (`/v1/events`, `/v1/threads/{id}/events`) and the web page at `/`.
//!
//! Every `/v1` request needs `Authorization: Bearer <token>`, the token kept in
//! `.weft/serve.token` (mode 0600, made on first start). Bodies are limited to 1 MiB; what the
//! handlers answer is in [`super::api`].

use super::api::{self, Reach};
use super::events::{Hub, Scope};
use crate::core::ids::ThreadId;
use crate::project::Project;
use crate::runtime::Runtime;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;

/// The page, HTML, CSS and JavaScript in one file, in the binary.
const PAGE: &str = include_str!("page.html");

/// An idle event stream gets a comment line this often (proxies close silent connections).
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// Request bodies larger than this are refused (413).
const BODY_LIMIT: usize = 1 << 20;

struct App {
    rt: Runtime,
    hub: Arc<Hub>,
    token: String,
    /// `/mcp`'s own token: an MCP client holds only what `mcp_server:` opens, never `/v1`.
    #[cfg(feature = "mcp-server")]
    mcp_token: String,
}

/// The token of `project`'s server, made (random, mode 0600) if there is none yet.
pub(crate) fn token(project: &Project) -> std::io::Result<String> {
    token_in(project, "serve.token")
}

/// The token of `project`'s MCP endpoint (`/mcp`), made like [`token`]'s: it opens `/mcp` only.
#[cfg(feature = "mcp-server")]
pub(crate) fn mcp_token(project: &Project) -> std::io::Result<String> {
    token_in(project, "mcp.token")
}

/// The token kept in `.weft/<file>`, made (random, mode 0600) if there is none yet.
fn token_in(project: &Project, file: &str) -> std::io::Result<String> {
    let path = project.weft().join(file);
    match std::fs::read_to_string(&path) {
        Ok(t) if t.trim().len() >= 32 => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(format!("no randomness: {e}")))?;
    let t: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    use std::io::Write;
    opts.open(&path)?.write_all(t.as_bytes())?;
    Ok(t)
}

/// Serves `rt` on `listener` until `shutdown` resolves.
pub async fn serve(
    rt: Runtime,
    listener: tokio::net::TcpListener,
    token: String,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let hub = Hub::start(&rt);
    // A node hears its own threads; the other nodes' it reads from the shared records.
    let remote = crate::core::owner::node().map(|_| super::remote::follow(&rt, hub.clone()));
    let stop = tokio_util::sync::CancellationToken::new();
    #[cfg(feature = "mcp-server")]
    let public = !listener.local_addr()?.ip().is_loopback();
    #[cfg(feature = "mcp-server")]
    let mcp = super::mcp::http_service(rt.clone(), public, stop.clone());
    #[cfg(feature = "mcp-server")]
    let mcp_token = mcp_token(rt.project())?;
    let app = Arc::new(App {
        rt,
        hub,
        token,
        #[cfg(feature = "mcp-server")]
        mcp_token,
    });
    let router = Router::new()
        .route("/", axum::routing::get(page))
        .route("/v1", axum::routing::any(v1))
        .route("/v1/{*rest}", axum::routing::any(v1))
        .fallback(|| async { reply(404, json!({ "error": "not found (the API is under /v1)" })) })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app.clone());
    // `/mcp`: weft as an MCP server over streamable HTTP, behind the same token.
    #[cfg(feature = "mcp-server")]
    let router = router.merge(
        Router::new()
            .route_service("/mcp", mcp)
            .route_layer(axum::middleware::from_fn_with_state(app, bearer)),
    );
    let ended = stop.clone();
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            ended.cancel();
        })
        .await;
    if let Some(r) = remote {
        r.abort();
    }
    served
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
        .into_response()
}

fn reply(status: u16, body: serde_json::Value) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// 401, naming the file that holds the token. No `WWW-Authenticate`: MCP clients read one as
/// the start of an OAuth flow (the MCP Inspector then stops asking for a person's login).
fn unauthorized(file: &str) -> Response {
    reply(
        401,
        json!({ "error": format!("missing or wrong bearer token (send `Authorization: Bearer <{file}>`)") }),
    )
}

/// Whether `headers` carry the bearer token (compared in constant time).
fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .trim();
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Lets a request through to `/mcp` only with the bearer token.
#[cfg(feature = "mcp-server")]
async fn bearer(
    State(app): State<Arc<App>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match authorized(req.headers(), &app.mcp_token) {
        true => next.run(req).await,
        false => unauthorized(".weft/mcp.token"),
    }
}

async fn v1(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorized(&headers, &app.token) {
        return unauthorized(".weft/serve.token");
    }
    let path = uri.path();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let last_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match (&method, segs.as_slice()) {
        (&Method::GET, ["v1", "events"]) => events(app, last_id, Scope::all()),
        (&Method::GET, ["v1", "threads", id, "events"]) => match ThreadId::parse(id) {
            Ok(id) => match app.rt.get(&id) {
                Ok(Some(_)) => {
                    let scope = Scope::subtree(&app.rt, &id);
                    events(app, last_id, scope)
                }
                Ok(None) => reply(
                    404,
                    json!({ "error": format!("no thread {id} in this project") }),
                ),
                Err(e) => {
                    let r = api::query_failed(e);
                    reply(r.status, r.body)
                }
            },
            Err(e) => reply(400, json!({ "error": e.to_string() })),
        },
        _ => {
            let r = api::call(
                &app.rt,
                method.as_str(),
                path,
                uri.query().unwrap_or_default(),
                &body,
                Reach::Anywhere,
            )
            .await;
            reply(r.status, r.body)
        }
    }
}

/// An SSE stream of `scope`, after what `last_id` saw. Frames are made once per event by the
/// hub and written as they are; a comment line keeps an idle connection open.
fn events(app: Arc<App>, last_id: Option<String>, mut scope: Scope) -> Response {
    let (missed, mut feed) = app.hub.subscribe(&app.rt, last_id.as_deref(), &mut scope);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        for i in &missed {
            if tx.send(i.frame.clone()).await.is_err() {
                return;
            }
        }
        loop {
            let next = tokio::time::timeout(KEEP_ALIVE, feed.next(&app.hub)).await;
            let batch = match next {
                Ok(Some(batch)) => batch,
                Ok(None) => return,
                Err(_) => {
                    if tx.send(Bytes::from_static(b":\n\n")).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            for i in batch.iter().filter(|i| scope.admits(i)) {
                if tx.send(i.frame.clone()).await.is_err() {
                    return;
                }
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}
