//! What `weft run` shows while a tree runs: event lines, or a live tree redrawn in place on a TTY.

use super::threads::tree_lines;
use crate::core::ids::ThreadId;
use crate::core::money::Nanos;
use crate::core::status::Status;
use crate::registry::ThreadRow;
use crate::thread::Event;
use std::collections::BTreeMap;
use std::io::Write;

pub(super) fn print_event(ev: &Event) {
    match ev {
        Event::Started { id, directive, .. } => out!("started  {id} ({directive})"),
        Event::Finished(r) => out!(
            "{:<8} {} — {}, {}",
            r.status.as_str(),
            r.thread_id,
            crate::record::render::plural(r.turns, "turn"),
            r.spend_nanos
        ),
        Event::Turn { .. } | Event::Line { .. } | Event::Token { .. } => {}
        Event::Status { id, text } => out!("status   {id} — {text}"),
        Event::Waiting { id, waiting } => match waiting {
            Some(w) => {
                out!("waiting  {id} — {w}; answer with `weft approve {id}` or `weft deny {id}`")
            }
            None => out!("resumed  {id}"),
        },
    }
    let _ = std::io::stdout().flush();
}

/// The live tree on a terminal, redrawn in place, with the streamed text of the thread in focus
/// (the root) and a spend meter against the root's cap.
#[derive(Default)]
pub(super) struct LiveTree {
    rows: BTreeMap<ThreadId, Live>,
    drawn: usize,
    /// The thread whose streamed text is shown.
    pub(super) focus: Option<String>,
    /// The root's spend cap, once known.
    pub(super) cap: Option<Nanos>,
    /// The focus's latest text.
    text: String,
}

struct Live {
    parent: Option<ThreadId>,
    directive: String,
    status: Status,
    /// Waits on a person (drawn as `waiting`, without what for).
    waiting: bool,
    turns: u64,
    own: Nanos,
    tree_spend: Option<Nanos>,
    started: String,
    ended: Option<String>,
}

impl LiveTree {
    pub(super) fn apply(&mut self, ev: &Event) {
        match ev {
            Event::Started {
                id,
                parent,
                directive,
            } => {
                self.rows.insert(
                    id.clone(),
                    Live {
                        parent: parent.clone(),
                        directive: directive.clone(),
                        status: Status::Running,
                        waiting: false,
                        turns: 0,
                        own: Nanos::ZERO,
                        tree_spend: None,
                        started: crate::core::ids::now_ts(),
                        ended: None,
                    },
                );
            }
            Event::Turn { id, turns, spend } => {
                // One call's text per line.
                if self.focus.as_deref() == Some(id.as_str()) && !self.text.ends_with('\n') {
                    self.text.push('\n');
                }
                if let Some(r) = self.rows.get_mut(id.as_str()) {
                    r.turns = *turns;
                    r.own = *spend;
                }
            }
            Event::Token { id, text } if self.focus.as_deref() == Some(id.as_str()) => {
                self.text.push_str(text);
                if self.text.len() > 4096 {
                    let cut = self.text.len() - 2048;
                    let cut = (cut..self.text.len())
                        .find(|i| self.text.is_char_boundary(*i))
                        .unwrap_or(0);
                    self.text.drain(..cut);
                }
            }
            Event::Status { .. } | Event::Line { .. } | Event::Token { .. } => {}
            Event::Waiting { id, waiting } => {
                if let Some(r) = self.rows.get_mut(id.as_str()) {
                    r.status = Status::Running;
                    r.waiting = waiting.is_some();
                }
            }
            Event::Finished(rep) => {
                if let Some(r) = self.rows.get_mut(rep.thread_id.as_str()) {
                    r.status = rep.status;
                    r.waiting = false;
                    r.turns = rep.turns;
                    r.own = rep.own_spend_nanos;
                    r.tree_spend = Some(rep.spend_nanos);
                    r.ended = Some(crate::core::ids::now_ts());
                }
            }
        }
    }

    pub(super) fn erase(&mut self) {
        if self.drawn > 0 {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\x1b[{}A\x1b[J", self.drawn);
            let _ = out.flush();
            self.drawn = 0;
        }
    }

    /// The tree's spend so far: every thread's own spend.
    fn spent(&self) -> Nanos {
        Nanos(self.rows.values().map(|r| r.own.0).sum())
    }

    pub(super) fn draw(&mut self) {
        let rows: Vec<ThreadRow> = self
            .rows
            .iter()
            .map(|(id, r)| ThreadRow {
                parent_id: r.parent.clone(),
                directive: r.directive.clone(),
                // An empty marker: drawn as `waiting`, with no "waiting for" note.
                waiting: r.waiting.then(String::new),
                turns: r.turns,
                spend_nanos: r.tree_spend.unwrap_or(r.own).0,
                created_at: r.started.clone(),
                updated_at: r.ended.clone().unwrap_or_else(crate::core::ids::now_ts),
                ..ThreadRow::new(id.clone(), id.clone(), r.status)
            })
            .collect();
        let mut lines = tree_lines(&rows);
        if let Some(last) = self.text.lines().rev().find(|l| !l.trim().is_empty()) {
            let shown: String = last.chars().take(110).collect();
            lines.push(format!("  » {shown}"));
        }
        lines.push(meter(self.spent(), self.cap));
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

/// `spend $0.0123 of $0.25 [███░░░░░░░░░░░░░░░░░] 5%`, or the spend alone without a cap.
pub(super) fn meter(spent: Nanos, cap: Option<Nanos>) -> String {
    match cap.filter(|c| c.0 > 0) {
        Some(c) => {
            let pct = (spent.0 as f64 / c.0 as f64 * 100.0).clamp(0.0, 100.0);
            let full = (pct / 5.0).round() as usize;
            format!(
                "  spend {spent} of {c} [{}{}] {pct:.0}%",
                "█".repeat(full),
                "░".repeat(20 - full)
            )
        }
        None => format!("  spend {spent}"),
    }
}
