//! `weft run` and `weft resume`: start a root thread, follow it live (Ctrl-C cancels), print the
//! outcome. The control endpoint listens while the thread runs, so `weft cancel` reaches it.

use super::live::{print_event, LiveTree};
use super::threads::print_tree;
use super::{find_project, open_error, parse_pairs, spawn_exit, usage, Exit};
use crate::core::ids::ThreadId;
use crate::core::limits::LimitSet;
use crate::core::status::Status;
use crate::directive::Library;
use crate::project::Project;
use crate::provider::Choice;
use crate::registry::{Store, ThreadRow};
use crate::runtime::{Runtime, RuntimeBuilder, ThreadHandle};
use crate::server::control::ControlEndpoint;
use crate::thread::{Event, ThreadReport};
use serde_json::{json, Map, Value};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

pub(super) async fn run(
    explicit: Option<PathBuf>,
    directive: String,
    inputs: Vec<String>,
    choice: Choice,
    limits: Vec<String>,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let d = Library::for_project(&project)
        .load(&directive)
        .map_err(|e| usage(e.to_string()))?;
    let mut given = Map::new();
    for (k, v) in parse_pairs(&inputs, "input")? {
        let value = d
            .coerce_cli_input(&k, &v)
            .map_err(|e| usage(e.to_string()))?;
        given.insert(k, value);
    }
    let overrides = parse_limits(&limits)?;
    let (rt, control) = open_serving(chosen(&project, choice)).await?;
    let events = watch(&rt, as_json);
    let started = start_or_withdraw(&rt, |rt| async move {
        rt.start(&directive, given, overrides).await
    })
    .await?;
    follow(rt, control, &project, started, events, as_json).await
}

/// A root's start, and the stop signals heard since before it began.
struct Started {
    handle: ThreadHandle,
    stops: super::common::Stops,
    /// A Ctrl-C (or SIGTERM) came while it started.
    interrupted: bool,
}

/// Starts a root with `start` on a runtime whose start a Ctrl-C (or SIGTERM) withdraws while
/// it may wait (on an MCP server the directive may use, up to its start timeout): the thread
/// is then undone, `cancelled`, and the process exits 130. A start that no longer waits
/// runs, and `follow` cancels it at once.
async fn start_or_withdraw<F, Fut>(rt: &Runtime, start: F) -> Result<Started, Exit>
where
    F: FnOnce(Runtime) -> Fut,
    Fut: std::future::Future<Output = Result<ThreadHandle, crate::thread::SpawnError>>,
{
    let mut stops = super::common::Stops::listen();
    let token = tokio_util::sync::CancellationToken::new();
    let starting = start(rt.withdrawn_by(token.clone()));
    tokio::pin!(starting);
    let mut interrupted = false;
    let started = tokio::select! {
        r = &mut starting => r,
        () = stops.next() => {
            interrupted = true;
            eprintln!("weft: cancelling the thread as it starts (Ctrl-C again to exit at once)");
            token.cancel();
            super::common::exit_on_second_signal();
            starting.await
        }
    };
    let e = match started {
        Ok(handle) => {
            return Ok(Started {
                handle,
                stops,
                interrupted,
            })
        }
        Err(e) => e,
    };
    // Nothing runs: the runtime is closed as at the end of a run (its MCP servers, the ledger's
    // journal); a Ctrl-C meanwhile exits at once.
    if !interrupted {
        super::common::exit_on_second_signal();
    }
    rt.clone().close().await;
    Err(match e {
        crate::thread::SpawnError::Withdrawn(_) => Exit {
            code: 130,
            message: e.to_string(),
        },
        e => spawn_exit(e),
    })
}

/// A runtime builder for `project` on the command line's provider choice.
pub(super) fn chosen(project: &Project, choice: Choice) -> RuntimeBuilder {
    let mut builder = Runtime::builder(project.clone());
    if let Some(s) = choice.script {
        builder = builder.script(s);
    }
    if let Some(p) = choice.provider {
        builder = builder.provider(p);
    }
    if let Some(m) = choice.model {
        builder = builder.model(m);
    }
    builder
}

/// Opens the runtime and its control endpoint (so `weft cancel` from another terminal reaches
/// this process). Without the endpoint the run still works; a warning says what is lost.
pub(super) async fn open_serving(
    builder: RuntimeBuilder,
) -> Result<(Runtime, Option<ControlEndpoint>), Exit> {
    let rt = builder.open().await.map_err(open_error)?;
    #[cfg(unix)]
    let control = match crate::server::control::listen(&rt) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(
                "control socket unavailable ({e}); `weft cancel` cannot reach this process"
            );
            None
        }
    };
    #[cfg(not(unix))]
    let control = None;
    Ok((rt, control))
}

/// Shows a running root thread until it ends (live tree, lines or nothing with `--json`),
/// handles Ctrl-C, prints the outcome and returns the exit code.
async fn follow(
    rt: Runtime,
    control: Option<ControlEndpoint>,
    project: &Project,
    started: Started,
    events: tokio::sync::broadcast::Receiver<Event>,
    as_json: bool,
) -> Result<i32, Exit> {
    let Started {
        handle,
        mut stops,
        interrupted,
    } = started;
    for r in rt.recovered() {
        eprintln!(
            "weft: recovered {} (owner pid {} is gone): finalized as error/interrupted",
            r.id, r.owner_pid
        );
    }
    // One listener for the whole run (from before its start): a Ctrl-C while the outcome is
    // printed is not lost.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let printer = tokio::spawn(show_events(
        rt.clone(),
        handle.id().clone(),
        events,
        as_json,
        stop_rx,
    ));
    let id = handle.id().clone();
    let report = wait_or_cancel(&rt, handle, &mut stops, interrupted).await?;
    let _ = stop_tx.send(());
    let _ = printer.await;
    let rows = Store::read_project(project)
        .and_then(|s| s.tree(id.as_str()))
        .unwrap_or_default();
    let code = match report.status {
        Status::Completed => 0,
        Status::Cancelled => 130,
        _ => 1,
    };
    print_outcome(&report, &rows, as_json);
    // What the tree caused (an after_complete hook's command or spawn, a scheduled thread due
    // now) finishes before the process exits; Ctrl-C (or `weft cancel` through the control
    // socket, kept open until then) cancels it with the tree.
    drain_or_cancel(&rt, &id, &mut stops).await;
    drop(control);
    rt.close().await;
    Ok(code)
}

/// Whether `follow` draws the live tree (a terminal, not `--json`).
fn live_tree(as_json: bool) -> bool {
    !as_json && std::io::stdout().is_terminal()
}

/// What `follow` shows needs: the live tree, what the model is saying too (streamed text);
/// otherwise progress only. Never every transcript line.
fn watch(rt: &Runtime, as_json: bool) -> tokio::sync::broadcast::Receiver<Event> {
    match live_tree(as_json) {
        true => rt.progress_and_text_events(),
        false => rt.progress_events(),
    }
}

/// Shows the tree's events as they come — the live tree on a terminal, one line each
/// otherwise, nothing with `--json` — until `stop` fires (then the events already sent).
async fn show_events(
    reader: Runtime,
    focus: ThreadId,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    as_json: bool,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let live = live_tree(as_json);
    let show_lines = !as_json;
    let mut tree = LiveTree::default();
    tree.focus = Some(focus.to_string());
    let show = |ev: &Event, tree: &mut LiveTree| {
        if live {
            tree.apply(ev);
            // The root's cap, from its signed thread.json (there once it has started).
            if tree.cap.is_none() && matches!(ev, Event::Turn { id, .. } if *id == focus) {
                tree.cap = reader
                    .get(&focus)
                    .ok()
                    .flatten()
                    .and_then(|v| v.thread?["limits"]["spend"].as_i64())
                    .map(crate::core::money::Nanos);
            }
            tree.draw();
        } else if show_lines {
            print_event(ev);
        }
    };
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Ok(ev) => show(&ev, &mut tree),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => break,
            },
            _ = &mut stop => {
                while let Ok(ev) = events.try_recv() {
                    show(&ev, &mut tree);
                }
                break;
            }
        }
    }
    // The final tree is printed from the registry: clear the live one.
    tree.erase();
}

/// Waits for the thread's report; the first Ctrl-C (or SIGTERM) cancels the thread, a second
/// one exits at once (130), killing the tool processes still running.
async fn wait_or_cancel(
    rt: &Runtime,
    handle: ThreadHandle,
    stops: &mut super::common::Stops,
    interrupted: bool,
) -> Result<ThreadReport, Exit> {
    let id = handle.id().clone();
    if interrupted {
        // Stopped while it started, too late to withdraw the start.
        rt.cancel(&id, "Ctrl-C");
    }
    let done = handle.wait();
    tokio::pin!(done);
    let mut interrupted = interrupted;
    loop {
        tokio::select! {
            r = &mut done => return r.map_err(|e| Exit { code: 1, message: e.to_string() }),
            _ = stops.next(), if !interrupted => {
                interrupted = true;
                eprintln!("weft: cancelling {id} (Ctrl-C again to exit at once)");
                rt.cancel(&id, "Ctrl-C");
                super::common::exit_on_second_signal();
            }
        }
    }
}

/// Waits for the work the tree caused; a Ctrl-C cancels it (a second exits at once).
async fn drain_or_cancel(rt: &Runtime, root: &ThreadId, stops: &mut super::common::Stops) {
    rt.scope_effects(root).await;
    let drain = async {
        rt.drain_hooks().await;
        rt.close_effects().await;
        rt.drain_hooks().await;
    };
    tokio::pin!(drain);
    tokio::select! {
        () = &mut drain => return,
        () = stops.next() => {}
    }
    eprintln!("weft: cancelling what {root} caused (Ctrl-C again to exit at once)");
    super::common::exit_on_second_signal();
    rt.cancel_caused(root, "Ctrl-C").await;
    // And whatever else this process still runs (another tree's effect it started).
    let live = crate::registry::ThreadFilter {
        status: vec!["created".into(), "running".into()],
        ..Default::default()
    };
    for r in rt.list(&live).unwrap_or_default() {
        if r.owner_pid == std::process::id() {
            rt.cancel(&r.id, "Ctrl-C");
        }
    }
    drain.await;
}

/// Prints how the run ended: the report as JSON, or the final tree and a summary.
fn print_outcome(report: &ThreadReport, rows: &[ThreadRow], as_json: bool) {
    if as_json {
        let out = json!({
            "thread_id": report.thread_id, "status": report.status, "result": report.result,
            "continuation_of": rows.first().and_then(|r| r.continuation_of.clone()),
            "outputs": report.outputs, "error": report.error,
            "cost": { "turns": report.turns, "input_tokens": report.input_tokens, "output_tokens": report.output_tokens,
                      "cache_read_tokens": report.cache_read_tokens,
                      "spend_nanos": report.spend_nanos, "own_spend_nanos": report.own_spend_nanos, "overrun_nanos": report.overrun_nanos, "threads": rows.len() },
        });
        out!("{out}");
        return;
    }
    out!();
    print_tree(rows);
    out!();
    out!(
        "{} {} — {}, {} in / {} out tokens, {} spent by the tree",
        report.thread_id,
        report.status.as_str(),
        crate::record::render::plural(report.turns, "turn"),
        report.input_tokens,
        report.output_tokens,
        report.spend_nanos
    );
    if let Some(o) = &report.outputs {
        out!(
            "outputs: {}",
            serde_json::to_string_pretty(o).unwrap_or_default()
        );
    }
    if let Some(r) = &report.result {
        out!("result: {r}");
    }
    if let Some(e) = &report.error {
        out!("error: {e}");
    }
}

pub(super) async fn resume(
    explicit: Option<PathBuf>,
    id: String,
    message: String,
    script: Option<PathBuf>,
    limits: Vec<String>,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let overrides = parse_limits(&limits)?;
    let mut builder = Runtime::builder(project.clone());
    if let Some(s) = script {
        builder = builder.script(s);
    }
    let (rt, control) = open_serving(builder).await?;
    let events = watch(&rt, as_json);
    let from = id.clone();
    let started = start_or_withdraw(&rt, |rt| async move {
        rt.resume(&from, &message, overrides).await
    })
    .await?;
    if !as_json {
        out!("resuming {id} as {}", started.handle.id());
    }
    follow(rt, control, &project, started, events, as_json).await
}

pub(super) async fn fork(explicit: Option<PathBuf>, args: super::ForkArgs) -> Result<i32, Exit> {
    let as_json = args.json;
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&args.id).map_err(usage)?;
    let fork = crate::runtime::Fork {
        at: args.at,
        message: args.message,
        directive: args.directive,
        overrides: parse_limits(&args.limits)?,
    };
    let mut builder = Runtime::builder(project.clone());
    if let Some(s) = args.script {
        builder = builder.script(s);
    }
    let (rt, control) = open_serving(builder).await?;
    let events = watch(&rt, as_json);
    let from = id.clone();
    let started = start_or_withdraw(&rt, |rt| async move { rt.fork(&from, fork).await }).await?;
    if !as_json {
        out!("forked {id} as {}", started.handle.id());
    }
    follow(rt, control, &project, started, events, as_json).await
}

/// `--limit k=v` pairs as a limit set.
fn parse_limits(limits: &[String]) -> Result<LimitSet, Exit> {
    let mut overrides = LimitSet::default();
    for (k, v) in parse_pairs(limits, "limit")? {
        overrides
            .set(&k, &Value::String(v))
            .map_err(|e| usage(format!("--limit: {e}")))?;
    }
    Ok(overrides)
}
