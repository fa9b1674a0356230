//! The `weft` command line: argument parsing, human and `--json` output, and exit codes
//! (0 completed, 1 thread error, 2 usage or input error, 130 cancelled).
//!
//! Glue only: every action goes through the library ([`crate::runtime::Runtime`], the registry
//! store, [`crate::verify`]). Errors are turned into messages and exit codes here, in one place.

use crate::ids::ThreadId;
use crate::limits::LimitSet;
use crate::money::Nanos;
use crate::registry::{Store, ThreadRow};
use crate::runtime::{Event, Project, Runtime, RuntimeOptions};
use crate::state::Status;
use clap::{Parser, Subcommand};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// weft: run trees of LLM agent threads with budgets, limits and signed state.
#[derive(Parser, Debug)]
#[command(name = "weft", version, about)]
pub struct Cli {
    /// Project folder (default: the nearest folder above holding .weft/).
    #[arg(long, global = true)]
    pub project: Option<PathBuf>,
    /// The command.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Create .weft/ with a commented config in the project folder.
    Init,
    /// Run a directive as a root thread.
    Run {
        /// Directive name (project → user → built-in) or path to a .md file.
        directive: String,
        /// Input, as key=value (repeatable).
        #[arg(short = 'i', long = "input")]
        inputs: Vec<String>,
        /// Scripted provider file.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Provider (a name under `providers:` in config) for every thread.
        #[arg(long)]
        provider: Option<String>,
        /// Model id for every thread.
        #[arg(long)]
        model: Option<String>,
        /// Limit override, as name=value (repeatable).
        #[arg(long = "limit")]
        limits: Vec<String>,
        /// Print one JSON object instead of the live tree.
        #[arg(long)]
        json: bool,
    },
    /// List threads (`threads chain <id>`: a continuation chain).
    Threads {
        /// `chain <id>`.
        #[command(subcommand)]
        sub: Option<ThreadsSub>,
        /// As trees.
        #[arg(long)]
        tree: bool,
        /// Only created/running.
        #[arg(long)]
        active: bool,
        /// JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show one thread.
    Show {
        /// Thread id.
        id: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a running thread and its subtree (from any terminal).
    Cancel {
        /// Thread id.
        id: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Finalize threads left running by a process that is gone.
    Recover {
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Continue an ended thread as a new continuation thread.
    Resume {
        /// Thread id.
        id: String,
        /// The new user message.
        #[arg(
            short = 'm',
            long = "message",
            default_value = "Continue where you left off."
        )]
        message: String,
        /// Scripted provider file.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Limit override (can only lower), as name=value.
        #[arg(long = "limit")]
        limits: Vec<String>,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Verify signatures and transcript chains.
    Verify {
        /// Thread ids (default with --all: every thread).
        ids: Vec<String>,
        /// Every thread of the project.
        #[arg(long)]
        all: bool,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `weft threads` subcommands.
#[derive(Subcommand, Debug)]
pub enum ThreadsSub {
    /// Print the continuation chain a thread belongs to, oldest first.
    Chain {
        /// Any thread of the chain.
        id: String,
        /// JSON array.
        #[arg(long)]
        json: bool,
    },
}

/// A CLI failure with its exit code.
#[derive(Debug)]
pub struct Exit {
    /// Exit code.
    pub code: i32,
    /// Message for stderr (may be empty).
    pub message: String,
}

/// `println!` that ignores a closed stdout (`weft threads | head` must not panic).
macro_rules! out {
    () => {{
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// A failure that is not the user's input (storage, I/O): exit code 1.
fn failed(e: impl std::fmt::Display) -> Exit {
    Exit {
        code: 1,
        message: e.to_string(),
    }
}

fn usage(message: impl Into<String>) -> Exit {
    Exit {
        code: 2,
        message: message.into(),
    }
}

/// Runs the CLI; returns the exit code.
pub async fn main(cli: Cli) -> i32 {
    let res = match cli.cmd {
        Cmd::Init => init(cli.project),
        Cmd::Run {
            directive,
            inputs,
            script,
            provider,
            model,
            limits,
            json,
        } => {
            let choice = crate::provider::Choice {
                script,
                provider,
                model,
            };
            run(cli.project, directive, inputs, choice, limits, json).await
        }
        Cmd::Threads {
            sub: Some(ThreadsSub::Chain { id, json }),
            ..
        } => chain(cli.project, id, json),
        Cmd::Threads {
            sub: None,
            tree,
            active,
            json,
        } => threads(cli.project, tree, active, json),
        Cmd::Cancel { id, json } => cancel(cli.project, id, json).await,
        Cmd::Recover { json } => recover(cli.project, json).await,
        Cmd::Resume {
            id,
            message,
            script,
            limits,
            json,
        } => resume(cli.project, id, message, script, limits, json).await,
        Cmd::Show { id, json } => show(cli.project, id, json),
        Cmd::Verify { ids, all, json } => verify(cli.project, ids, all, json),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("weft: {}", e.message);
            }
            e.code
        }
    }
}

fn find_project(explicit: Option<PathBuf>) -> Result<Project, Exit> {
    if let Some(p) = explicit {
        if !p.join(".weft").is_dir() {
            return Err(usage(format!(
                "{} has no .weft/ folder; run `weft init` there first",
                p.display()
            )));
        }
        return Ok(Project { root: p });
    }
    let cwd = std::env::current_dir().map_err(|e| usage(format!("no working directory: {e}")))?;
    Project::find(&cwd).ok_or_else(|| {
        usage(format!(
            "no .weft/ folder in {} or above; run `weft init` first",
            cwd.display()
        ))
    })
}

fn init(explicit: Option<PathBuf>) -> Result<i32, Exit> {
    let root = match explicit {
        Some(p) => p,
        None => std::env::current_dir().map_err(|e| usage(e.to_string()))?,
    };
    let weft = root.join(".weft");
    for d in ["state", "threads", "trust"] {
        std::fs::create_dir_all(weft.join(d)).map_err(|e| Exit {
            code: 1,
            message: format!("{}: {e}", weft.join(d).display()),
        })?;
    }
    std::fs::create_dir_all(root.join("directives")).map_err(failed)?;
    let cfg = weft.join("config.yaml");
    if cfg.exists() {
        out!("{} already exists; left as it is", cfg.display());
    } else {
        std::fs::write(&cfg, crate::config::DEFAULT_CONFIG_YAML).map_err(|e| Exit {
            code: 1,
            message: format!("{}: {e}", cfg.display()),
        })?;
        out!("wrote {}", cfg.display());
    }
    let signer =
        crate::signing::Signer::load_or_create(&crate::signing::user_dir()).map_err(failed)?;
    signer.trust_in(&weft.join("trust")).map_err(failed)?;
    // Empty databases, so `weft threads` works before the first run.
    crate::registry::Store::open(&weft.join("state").join("registry.db")).map_err(failed)?;
    crate::ledger::open_db(&weft.join("state").join("ledger.db")).map_err(failed)?;
    out!(
        "signing key {} trusted in {}",
        signer.key_id,
        weft.join("trust").display()
    );
    Ok(0)
}

fn parse_pairs(pairs: &[String], what: &str) -> Result<Vec<(String, String)>, Exit> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.to_string()))
                .ok_or_else(|| usage(format!("{what} `{p}` is not key=value")))
        })
        .collect()
}

async fn run(
    explicit: Option<PathBuf>,
    directive: String,
    inputs: Vec<String>,
    choice: crate::provider::Choice,
    limits: Vec<String>,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let d = project
        .library()
        .load(&directive)
        .map_err(|e| usage(e.to_string()))?;
    let mut given = Map::new();
    for (k, v) in parse_pairs(&inputs, "input")? {
        let value = d
            .coerce_cli_input(&k, &v)
            .map_err(|e| usage(e.to_string()))?;
        given.insert(k, value);
    }
    let mut overrides = LimitSet::default();
    for (k, v) in parse_pairs(&limits, "limit")? {
        overrides
            .set(&k, &Value::String(v))
            .map_err(|e| usage(format!("--limit: {e}")))?;
    }
    let opts = RuntimeOptions {
        script: choice.script,
        provider: choice.provider,
        model: choice.model,
        ..Default::default()
    };
    let rt = Runtime::open(project.clone(), opts)
        .await
        .map_err(open_error)?;
    let events = rt.events();
    let (id, _actor, done) = rt
        .start(&directive, given, overrides)
        .await
        .map_err(spawn_exit)?;
    follow(rt, &project, id, done, events, as_json).await
}

fn spawn_exit(e: crate::runtime::SpawnError) -> Exit {
    match e {
        crate::runtime::SpawnError::Storage(m) => Exit {
            code: 1,
            message: m,
        },
        other => usage(other.to_string()),
    }
}

fn open_error(e: crate::runtime::OpenError) -> Exit {
    usage(e.to_string())
}

/// Shows a running root thread until it ends (live tree, lines or nothing with `--json`),
/// handles Ctrl-C, prints the outcome and returns the exit code.
async fn follow(
    rt: Runtime,
    project: &Project,
    id: ThreadId,
    mut done: tokio::sync::oneshot::Receiver<crate::thread::ThreadReport>,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    as_json: bool,
) -> Result<i32, Exit> {
    for r in rt.recovered() {
        eprintln!(
            "weft: recovered {} (owner pid {} is gone): finalized as error/interrupted",
            r.id, r.owner_pid
        );
    }
    let live = !as_json && std::io::stdout().is_terminal();
    let show_lines = !as_json;
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let printer = tokio::spawn(async move {
        let mut tree = LiveTree::default();
        let show = |ev: &Event, tree: &mut LiveTree| {
            if live {
                tree.apply(ev);
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
                _ = &mut stop_rx => {
                    while let Ok(ev) = events.try_recv() {
                        show(&ev, &mut tree);
                    }
                    break;
                }
            }
        }
        // The final tree is printed from the registry: clear the live one.
        tree.erase();
    });
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut interrupted = false;
    let report = loop {
        tokio::select! {
            r = &mut done => break r.map_err(|_| Exit { code: 1, message: format!("thread {id} ended without a report") })?,
            _ = &mut ctrl_c, if !interrupted => {
                interrupted = true;
                eprintln!("weft: cancelling {id} (Ctrl-C again to exit at once)");
                rt.cancel(&id, "Ctrl-C");
                tokio::spawn(async { let _ = tokio::signal::ctrl_c().await; std::process::exit(130); });
            }
        }
    };
    let _ = stop_tx.send(());
    let _ = printer.await;
    let rows = Store::open_read_only(&project.state_dir().join("registry.db"))
        .and_then(|s| s.tree(id.as_str()))
        .unwrap_or_default();
    let code = match report.status {
        Status::Completed => 0,
        Status::Cancelled => 130,
        _ => 1,
    };
    if as_json {
        let out = json!({
            "thread_id": report.thread_id, "status": report.status, "result": report.result,
            "continuation_of": rows.first().and_then(|r| r.continuation_of.clone()),
            "outputs": report.outputs, "error": report.error,
            "cost": { "turns": report.turns, "input_tokens": report.input_tokens, "output_tokens": report.output_tokens,
                      "spend_nanos": report.spend_nanos, "own_spend_nanos": report.own_spend_nanos, "threads": rows.len() },
        });
        out!("{out}");
    } else {
        out!();
        print_tree(&rows);
        out!();
        out!(
            "{} {} — {} turns, {} in / {} out tokens, {} spent by the tree",
            report.thread_id,
            report.status.as_str(),
            report.turns,
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
    rt.shutdown();
    Ok(code)
}

async fn resume(
    explicit: Option<PathBuf>,
    id: String,
    message: String,
    script: Option<PathBuf>,
    limits: Vec<String>,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let mut overrides = LimitSet::default();
    for (k, v) in parse_pairs(&limits, "limit")? {
        overrides
            .set(&k, &Value::String(v))
            .map_err(|e| usage(format!("--limit: {e}")))?;
    }
    let rt = Runtime::open(
        project.clone(),
        RuntimeOptions {
            script,
            ..Default::default()
        },
    )
    .await
    .map_err(open_error)?;
    let events = rt.events();
    let (new_id, _actor, done) = rt
        .resume(&id, &message, overrides)
        .await
        .map_err(spawn_exit)?;
    if !as_json {
        out!("resuming {id} as {new_id}");
    }
    follow(rt, &project, new_id, done, events, as_json).await
}

async fn cancel(explicit: Option<PathBuf>, id: String, as_json: bool) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let opts = RuntimeOptions {
        no_provider: true,
        no_control: true,
        ..Default::default()
    };
    let rt = Runtime::open(project.clone(), opts)
        .await
        .map_err(open_error)?;
    let store = open_store(&project)?;
    let row = store.get(id.as_str()).map_err(failed)?.ok_or_else(|| {
        usage(format!(
            "no thread {id} in this project (see `weft threads`)"
        ))
    })?;
    let finish = |row: &ThreadRow, note: &str| {
        if as_json {
            out!(
                "{}",
                json!({ "thread_id": row.id, "status": row.status, "note": note })
            );
        } else {
            out!("{} {} — {note}", row.id, row.status);
        }
    };
    if crate::registry::is_terminal(&row.status) {
        finish(&row, &format!("already {}; nothing to cancel", row.status));
        rt.shutdown();
        return Ok(0);
    }
    #[cfg(unix)]
    {
        let reply = crate::control::request(
            &project,
            row.owner_pid,
            &json!({ "op": "cancel", "id": id }),
        )
        .await
        .map_err(|m| Exit {
            code: 1,
            message: m,
        })?;
        if reply["ok"] != true {
            return Err(Exit {
                code: 1,
                message: reply["error"]
                    .as_str()
                    .unwrap_or("cancel refused")
                    .to_string(),
            });
        }
    }
    // Wait until the owner has finalized the subtree.
    let deadline = std::time::Instant::now()
        + rt.ctx().config.cancel_grace
        + std::time::Duration::from_secs(10);
    loop {
        let row = store.get(id.as_str()).ok().flatten();
        if let Some(r) = row.filter(|r| crate::registry::is_terminal(&r.status)) {
            finish(&r, "cancelled with its subtree");
            rt.shutdown();
            return Ok(0);
        }
        if std::time::Instant::now() > deadline {
            rt.shutdown();
            return Err(Exit {
                code: 1,
                message: format!("{id} did not finish within the cancel grace period"),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn recover(explicit: Option<PathBuf>, as_json: bool) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let opts = RuntimeOptions {
        no_provider: true,
        no_control: true,
        ..Default::default()
    };
    let rt = Runtime::open(project, opts).await.map_err(open_error)?;
    let rec = rt.recovered().to_vec();
    if as_json {
        out!("{}", serde_json::to_string(&rec).unwrap_or_default());
    } else if rec.is_empty() {
        out!("nothing to recover: no thread was left running by a dead process");
    } else {
        for r in &rec {
            let torn = if r.torn_line_kept {
                " (torn last transcript line kept in transcript.torn)"
            } else {
                ""
            };
            out!(
                "recovered {} (owner pid {} gone): error/interrupted{torn}",
                r.id,
                r.owner_pid
            );
            for p in &r.problems {
                out!("  problem: {p}");
            }
        }
    }
    rt.shutdown();
    Ok(0)
}

fn chain(explicit: Option<PathBuf>, id: String, as_json: bool) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let rows = open_store(&project)?.chain(id.as_str()).map_err(failed)?;
    if rows.is_empty() {
        return Err(usage(format!("no thread {id} in this project")));
    }
    if as_json {
        out!("{}", serde_json::to_string(&rows).unwrap_or_default());
    } else {
        for (i, r) in rows.iter().enumerate() {
            out!(
                "{}{:<9} {} — {} turns, {}",
                if i == 0 { "● " } else { "→ " },
                r.status,
                r.id,
                r.turns,
                Nanos(r.spend_nanos)
            );
        }
    }
    Ok(0)
}

fn print_event(ev: &Event) {
    match ev {
        Event::Started { id, directive, .. } => out!("started  {id} ({directive})"),
        Event::Finished(r) => out!(
            "{:<8} {} — {} turns, {}",
            r.status.as_str(),
            r.thread_id,
            r.turns,
            r.spend_nanos
        ),
        Event::Turn { .. } => {}
    }
    let _ = std::io::stdout().flush();
}

#[derive(Default)]
struct LiveTree {
    rows: BTreeMap<String, (Option<String>, String, String, u64, Nanos)>,
    drawn: usize,
}

impl LiveTree {
    fn apply(&mut self, ev: &Event) {
        match ev {
            Event::Started {
                id,
                parent,
                directive,
            } => {
                self.rows.insert(
                    id.to_string(),
                    (
                        parent.as_ref().map(ToString::to_string),
                        directive.clone(),
                        "running".into(),
                        0,
                        Nanos::ZERO,
                    ),
                );
            }
            Event::Turn { id, turns, spend } => {
                if let Some(r) = self.rows.get_mut(id.as_str()) {
                    r.3 = *turns;
                    r.4 = *spend;
                }
            }
            Event::Finished(rep) => {
                if let Some(r) = self.rows.get_mut(rep.thread_id.as_str()) {
                    r.2 = rep.status.as_str().into();
                    r.3 = rep.turns;
                    r.4 = rep.spend_nanos;
                }
            }
        }
    }

    fn erase(&mut self) {
        if self.drawn > 0 {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\x1b[{}A\x1b[J", self.drawn);
            let _ = out.flush();
            self.drawn = 0;
        }
    }

    fn draw(&mut self) {
        let rows: Vec<ThreadRow> = self
            .rows
            .iter()
            .map(|(id, (p, d, s, t, sp))| ThreadRow {
                id: id.clone(),
                parent_id: p.clone(),
                directive: d.clone(),
                status: s.clone(),
                turns: *t,
                spend_nanos: sp.0,
                ..Default::default()
            })
            .collect();
        let lines = tree_lines(&rows);
        let mut out = std::io::stdout().lock();
        if self.drawn > 0 {
            let _ = write!(out, "\x1b[{}A", self.drawn);
        }
        for l in &lines {
            let _ = writeln!(out, "\x1b[2K{l}");
        }
        let _ = out.flush();
        self.drawn = lines.len();
    }
}

fn tree_lines(rows: &[ThreadRow]) -> Vec<String> {
    let ids: std::collections::HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let mut out = Vec::new();
    fn walk(rows: &[ThreadRow], r: &ThreadRow, depth: usize, out: &mut Vec<String>) {
        out.push(format!(
            "{}{} {:<9} {} — {} turns, {}",
            "  ".repeat(depth),
            if depth == 0 { "●" } else { "└" },
            r.status,
            r.id,
            r.turns,
            Nanos(r.spend_nanos)
        ));
        for c in rows
            .iter()
            .filter(|c| c.parent_id.as_deref() == Some(r.id.as_str()))
        {
            walk(rows, c, depth + 1, out);
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.parent_id.as_deref().is_none_or(|p| !ids.contains(p)))
    {
        walk(rows, r, 0, &mut out);
    }
    out
}

fn print_tree(rows: &[ThreadRow]) {
    for l in tree_lines(rows) {
        out!("{l}");
    }
}

fn open_store(project: &Project) -> Result<Store, Exit> {
    Store::open_read_only(&project.state_dir().join("registry.db")).map_err(failed)
}

fn threads(
    explicit: Option<PathBuf>,
    tree: bool,
    active: bool,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    if !project.state_dir().join("registry.db").exists() {
        if as_json {
            out!("[]");
        } else {
            out!("no threads yet (`weft run <directive>` starts one)");
        }
        return Ok(0);
    }
    let store = open_store(&project)?;
    let rows = store.list(active, 100_000).map_err(failed)?;
    if as_json {
        out!("{}", serde_json::to_string(&rows).unwrap_or_default());
    } else if tree {
        let mut rows = rows;
        rows.reverse();
        print_tree(&rows);
    } else {
        for r in &rows {
            out!(
                "{:<9} {:<50} {:<24} {} turns {}",
                r.status,
                r.id,
                r.directive,
                r.turns,
                Nanos(r.spend_nanos)
            );
        }
    }
    Ok(0)
}

fn show(explicit: Option<PathBuf>, id: String, as_json: bool) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(&id).map_err(usage)?;
    let store = open_store(&project)?;
    let row = store.get(id.as_str()).map_err(failed)?.ok_or_else(|| {
        usage(format!(
            "no thread {id} in this project (see `weft threads`)"
        ))
    })?;
    let (trust, _) = crate::signing::Trust::load(&project.trust_dir());
    let doc = crate::state::ThreadDoc::read_verified(
        &project.thread_dir(&id).join("thread.json"),
        &trust,
    );
    if as_json {
        let out = json!({ "row": row, "thread": doc.as_ref().ok(), "verified": doc.is_ok() });
        out!("{out}");
        return Ok(0);
    }
    out!("{} ({})", row.id, row.directive);
    out!("  status     {}", row.status);
    out!("  parent     {}", row.parent_id.as_deref().unwrap_or("-"));
    out!("  root       {}", row.root_id);
    out!("  model      {}", row.model);
    out!(
        "  turns      {}   tokens {} in / {} out",
        row.turns,
        row.input_tokens,
        row.output_tokens
    );
    out!(
        "  spend      own {}   subtree {}",
        Nanos(row.own_spend_nanos),
        Nanos(row.spend_nanos)
    );
    out!("  children   {}", row.spawn_count);
    match &doc {
        Ok(d) => out!("  limits     turns {} tokens {} spend {} duration {}ms depth {} spawns {} concurrency {}", d.limits.turns, d.limits.tokens, d.limits.spend, d.limits.duration_ms, d.limits.depth, d.limits.spawns, d.limits.concurrency),
        Err(e) => out!("  thread.json NOT VERIFIED: {e}"),
    }
    if let Some(o) = &row.outputs {
        out!("  outputs    {o}");
    }
    if let Some(r) = &row.result {
        out!("  result     {r}");
    }
    if let Some(e) = &row.error {
        out!("  error      {e}");
    }
    Ok(0)
}

fn verify(
    explicit: Option<PathBuf>,
    ids: Vec<String>,
    all: bool,
    as_json: bool,
) -> Result<i32, Exit> {
    let project = find_project(explicit)?;
    let mut targets: Vec<ThreadId> = ids
        .iter()
        .map(|i| ThreadId::parse(i))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    if all || targets.is_empty() {
        if !all {
            return Err(usage("name thread ids or pass --all"));
        }
        let dir = project.weft().join("threads");
        let entries = std::fs::read_dir(&dir).map_err(|e| Exit {
            code: 1,
            message: format!("{}: {e}", dir.display()),
        })?;
        for e in entries.flatten() {
            if let Some(id) = e.file_name().to_str().and_then(|n| ThreadId::parse(n).ok()) {
                targets.push(id);
            }
        }
        targets.sort();
    }
    let (trust, _) = crate::signing::Trust::load(&project.trust_dir());
    let verdicts: Vec<_> = targets
        .iter()
        .map(|id| crate::verify::verify_thread(&project, &trust, id))
        .collect();
    let bad = verdicts.iter().filter(|v| !v.ok).count();
    if as_json {
        out!("{}", serde_json::to_string(&verdicts).unwrap_or_default());
    } else {
        for v in &verdicts {
            if v.ok {
                out!(
                    "ok       {}{}",
                    v.id,
                    if v.torn_last_line {
                        " (torn last transcript line)"
                    } else {
                        ""
                    }
                );
            } else {
                for p in &v.problems {
                    out!("FAILED   {}: {p}", v.id);
                }
            }
        }
        out!("{} verified, {} failed", verdicts.len() - bad, bad);
    }
    Ok(if bad == 0 { 0 } else { 1 })
}
