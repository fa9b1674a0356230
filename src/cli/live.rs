//! What `weft run` shows while a tree runs: event lines, or a live tree redrawn in place on a TTY.

use super::threads::tree_lines;
use crate::core::money::Nanos;
use crate::registry::ThreadRow;
use crate::thread::Event;
use std::collections::BTreeMap;
use std::io::Write;

pub(super) fn print_event(ev: &Event) {
    match ev {
        Event::Started { id, directive, .. } => out!("started  {id} ({directive})"),
        Event::Finished(r) => out!(
            "{:<8} {} — {} turns, {}",
            r.status.as_str(),
            r.thread_id,
            r.turns,
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

#[derive(Default)]
pub(super) struct LiveTree {
    rows: BTreeMap<String, (Option<String>, String, String, u64, Nanos)>,
    drawn: usize,
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
            Event::Status { .. } | Event::Line { .. } | Event::Token { .. } => {}
            Event::Waiting { id, waiting } => {
                if let Some(r) = self.rows.get_mut(id.as_str()) {
                    r.2 = match waiting {
                        Some(_) => "waiting".into(),
                        None => "running".into(),
                    };
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

    pub(super) fn erase(&mut self) {
        if self.drawn > 0 {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\x1b[{}A\x1b[J", self.drawn);
            let _ = out.flush();
            self.drawn = 0;
        }
    }

    pub(super) fn draw(&mut self) {
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
