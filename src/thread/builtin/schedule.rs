//! The scheduling tools (capability `schedule`): `schedule {directive | tool, inputs, delay}`
//! keeps an effect in store.db and returns its id; `scheduled_list` and `scheduled_cancel {id}`
//! see and cancel this thread's own. What an effect may do is checked now, against this
//! thread's capabilities: a directive needs `thread.spawn.<name>`, a tool what calling it
//! needs. A directive effect is a deferred child of this thread: its budget is set aside from
//! this tree when it is scheduled (refused if it does not fit, given back if it is cancelled or
//! cannot start), and it runs under this thread's capabilities and approval list, depth − 1.

use super::tool::Builtin;
use crate::core::ids::ThreadId;
use crate::provider::{ToolCall, ToolSpec};
use crate::store::EffectKind;
use crate::thread::spawn::{defer, give_back, Deferred, Origin, SpawnRequest};
use crate::thread::state::Thread;
use crate::tools::ToolOutcome;
use serde_json::{json, Value};
use std::time::Duration;

/// Longest delay an effect may have.
const MAX_DELAY: Duration = Duration::from_secs(30 * 86_400);

/// Store work of one scheduling call, run on a blocking thread: its answer, and the deferred
/// child whose budget goes back to the tree (a cancelled directive effect).
type StoreWork = Box<dyn FnOnce() -> Result<(Value, Option<ThreadId>), String> + Send>;

/// The spec of a scheduling tool.
pub(super) fn spec(b: Builtin) -> ToolSpec {
    let (description, input_schema) = match b {
        Builtin::Schedule => (
            "Run a directive (as a new thread of this tree) or a tool later, even after this thread has ended. Give `directive` or `tool`, its `inputs`, and `delay` (e.g. \"90s\", \"2h\", or seconds); a directive's budget (its spend limit, lowered by `limits`) is set aside from this tree now. Returns the effect id.",
            json!({"type":"object","properties":{"directive":{"type":"string"},"tool":{"type":"string"},"inputs":{"type":"object"},"limits":{"type":"object"},"delay":{"type":["string","number"]}},"required":["delay"]}),
        ),
        Builtin::ScheduledList => (
            "This thread's scheduled effects and their status.",
            json!({"type":"object","properties":{}}),
        ),
        _ => (
            "Cancel one of this thread's pending effects.",
            json!({"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}),
        ),
    };
    ToolSpec {
        name: b.name().into(),
        description: description.into(),
        input_schema,
    }
}

fn delay_of(v: &Value) -> Result<Duration, String> {
    let d = match v {
        // Checked, never `from_secs_f64`: a model's 1e20 is an error, not a panic.
        Value::Number(n) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX))
            .ok_or("`delay` in seconds must be a number ≥ 0")?,
        Value::String(s) => humantime::parse_duration(s)
            .map_err(|e| format!("`delay` {s:?}: {e} (e.g. \"90s\", \"2h\")"))?,
        _ => return Err("`delay` is a duration (\"90s\") or a number of seconds".into()),
    };
    if d > MAX_DELAY {
        return Err("`delay` is at most 30 days: give a shorter one".into());
    }
    Ok(d)
}

impl Thread {
    /// The three tools, their store calls on a task.
    pub(crate) fn schedule_tools(&mut self, b: Builtin, call: ToolCall) -> Option<ToolOutcome> {
        let work = match b {
            Builtin::Schedule => {
                return self
                    .schedule(call.id, &call.input)
                    .err()
                    .map(ToolOutcome::err)
            }
            Builtin::ScheduledList => Ok(self.scheduled_list()),
            _ => self.scheduled_cancel(&call.input),
        };
        let work = match work {
            Ok(w) => w,
            Err(e) => return Some(ToolOutcome::err(e)),
        };
        let ctx = self.ctx.clone();
        self.run_as_task(call.id, async move {
            match tokio::task::spawn_blocking(work).await {
                Ok(Ok((v, freed))) => {
                    if let Some(child) = freed {
                        give_back(&ctx, child).await;
                    }
                    ToolOutcome::ok(v)
                }
                Ok(Err(e)) => ToolOutcome::err(e),
                Err(e) => ToolOutcome::err(format!("the effect store failed: {e}")),
            }
        });
        None
    }

    /// What the effect would do, and the capability that allows it.
    fn target(&self, input: &Value) -> Result<(EffectKind, String, String), String> {
        match (input["directive"].as_str(), input["tool"].as_str()) {
            (Some(d), None) => {
                let directive = self.ctx.library.load_name(d).map_err(|e| e.to_string())?;
                let cap = crate::tools::spawn_capability(&directive.name);
                Ok((EffectKind::Directive, directive.name, cap))
            }
            (None, Some(t)) => {
                if self.ctx.commands.get(t).is_none() {
                    return Err(format!("`{t}` is not a command tool of this project (only command tools can be scheduled)"));
                }
                let cap = format!("tool.{t}");
                if self.approval_needed(t, Some(&cap)) {
                    return Err(format!("`{t}` needs a person's approval for each call, and a scheduled effect has no one to ask: it cannot be scheduled (call it now; the call waits for `weft approve`)"));
                }
                Ok((EffectKind::Tool, t.to_string(), cap))
            }
            _ => Err("give exactly one of `directive` and `tool`".into()),
        }
    }

    /// Schedules an effect: a tool's is kept at once; a directive's first sets aside its budget
    /// from this tree (`spawn::defer`: it is a deferred child of this thread, checked now as a
    /// child is), and gives it back if the store refuses the effect.
    fn schedule(&mut self, call_id: String, input: &Value) -> Result<(), String> {
        let delay = delay_of(&input["delay"])?;
        let (kind, name, cap) = self.target(input)?;
        let id = self.id().clone();
        crate::tools::check(&self.doc.capabilities, &cap, id.as_str())?;
        let due =
            humantime::format_rfc3339_millis(std::time::SystemTime::now() + delay).to_string();
        let inputs = match input.get("inputs") {
            None | Some(Value::Null) => json!({}),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(other) => return Err(format!("`inputs` must be an object, got {other}")),
        };
        let ctx = self.ctx.clone();
        let mut req = None;
        if kind == EffectKind::Directive {
            let obj = inputs.as_object().cloned().unwrap_or_default();
            let origin = Origin::Deferred(Deferred {
                parent: id.clone(),
                id: None,
            });
            let mut r = SpawnRequest::new(name.clone(), obj, origin);
            r.route = self.route.clone();
            r.overrides = match input.get("limits") {
                None | Some(Value::Null) => Default::default(),
                Some(Value::Object(m)) => {
                    crate::core::limits::LimitSet::from_map(m).map_err(|e| e.to_string())?
                }
                Some(other) => return Err(format!("`limits` must be an object, got {other}")),
            };
            req = Some(r);
        }
        self.run_as_task(call_id, async move {
            let child = match &req {
                Some(r) => match defer(&ctx, r).await {
                    Ok((child, amount)) => Some((child, amount)),
                    Err(e) => return ToolOutcome::err(format!("cannot schedule `{name}`: {e} (a scheduled directive's budget, its spend limit, is set aside whole from this tree now: give `limits: {{spend: …}}` to set aside less)")),
                },
                None => None,
            };
            let store = ctx.store.clone();
            let (c, n) = (child.as_ref().map(|c| c.0.clone()), name.clone());
            let kept = tokio::task::spawn_blocking(move || {
                store.schedule(&id, kind, &n, &inputs, &due, c.as_ref())
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
            match kept {
                Ok(e) => {
                    ctx.effects_wake.notify_one();
                    let set_aside = child.map(|(_, a)| a.0);
                    ToolOutcome::ok(json!({ "id": e.id, "due_at": e.due_at, "kind": e.kind, "target": e.target, "budget_set_aside_nanos": set_aside }))
                }
                Err(err) => {
                    if let Some((c, _)) = child {
                        give_back(&ctx, c).await;
                    }
                    ToolOutcome::err(err)
                }
            }
        });
        Ok(())
    }

    fn scheduled_list(&self) -> StoreWork {
        let (store, id) = (self.ctx.store.clone(), self.id().clone());
        Box::new(move || {
            let all = store.scheduled(Some(&id)).map_err(|e| e.to_string())?;
            let list = json!(all.iter().map(|e| json!({ "id": e.id, "kind": e.kind, "target": e.target, "due_at": e.due_at, "status": e.status, "result": e.result })).collect::<Vec<_>>());
            Ok((list, None))
        })
    }

    fn scheduled_cancel(&self, input: &Value) -> Result<StoreWork, String> {
        let Some(fx) = input["id"].as_str().map(str::to_string) else {
            return Err("scheduled_cancel needs the effect `id`".into());
        };
        let (store, id) = (self.ctx.store.clone(), self.id().clone());
        Ok(Box::new(move || {
            let e = store
                .cancel_effect(&fx, Some(&id))
                .map_err(|e| e.to_string())?;
            let child = e.child.as_deref().and_then(|c| ThreadId::parse(c).ok());
            Ok((json!({ "id": e.id, "status": e.status }), child))
        }))
    }
}
