//! `weft cancel`, `weft approve`, `weft deny`, `weft inject`: reach the process that owns a
//! thread through its control endpoint (cancel then waits until the subtree is finalized).

use super::{failed, find_project, open_error, open_store, usage, Exit};
use crate::core::ids::ThreadId;
use crate::project::Project;
use crate::registry::ThreadRow;
use crate::runtime::Runtime;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;

/// The project, the thread id and its registry row (a usage error if it has none).
fn thread_row(explicit: Option<PathBuf>, id: &str) -> Result<(Project, ThreadId, ThreadRow), Exit> {
    let project = find_project(explicit)?;
    let id = ThreadId::parse(id).map_err(usage)?;
    let row = open_store(&project)?
        .get(id.as_str())
        .map_err(failed)?
        .ok_or_else(|| {
            usage(format!(
                "no thread {id} in this project (see `weft threads`)"
            ))
        })?;
    Ok((project, id, row))
}

/// Sends `POST /v1/threads/<id>/<op>` with `body` to the control endpoint of the process owning
/// `row` (the API's handlers answer it there); its refusal is an error.
async fn ask_owner(
    project: &Project,
    row: &ThreadRow,
    op: &str,
    body: Value,
) -> Result<Value, Exit> {
    #[cfg(unix)]
    {
        let req = json!({ "method": "POST", "path": format!("/v1/threads/{}/{op}", row.id), "body": body });
        let reply = crate::server::peer::request(project, row.owner_pid, &req)
            .await
            .map_err(|m| Exit {
                code: 1,
                message: m,
            })?;
        if reply["status"].as_u64().is_none_or(|s| s >= 300) {
            return Err(Exit {
                code: 1,
                message: reply["body"]["error"]
                    .as_str()
                    .unwrap_or("refused")
                    .to_string(),
            });
        }
        Ok(reply["body"].clone())
    }
    #[cfg(not(unix))]
    {
        let _ = (project, row, op, body);
        Err(Exit {
            code: 1,
            message: "this needs the control socket (Unix only)".into(),
        })
    }
}

pub(super) async fn cancel(
    explicit: Option<PathBuf>,
    id: String,
    as_json: bool,
) -> Result<i32, Exit> {
    let (project, id, row) = thread_row(explicit, &id)?;
    let rt = Runtime::builder(project.clone())
        .without_provider()
        .open()
        .await
        .map_err(open_error)?;
    let store = open_store(&project)?;
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
    if row.status.is_terminal() {
        finish(&row, &format!("already {}; nothing to cancel", row.status));
        rt.close().await;
        return Ok(0);
    }
    ask_owner(&project, &row, "cancel", json!({ "reason": "weft cancel" })).await?;
    // Wait until the owner has finalized the subtree.
    let deadline =
        std::time::Instant::now() + rt.config().cancel_grace + std::time::Duration::from_secs(10);
    loop {
        let row = store.get(id.as_str()).ok().flatten();
        if let Some(r) = row.filter(|r| r.status.is_terminal()) {
            finish(&r, "cancelled with its subtree");
            rt.close().await;
            return Ok(0);
        }
        if std::time::Instant::now() > deadline {
            rt.close().await;
            return Err(Exit {
                code: 1,
                message: format!("{id} did not finish within the cancel grace period"),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `weft approve` / `weft deny`: a person's decision on a call waiting for approval.
pub(super) async fn decide(
    explicit: Option<PathBuf>,
    id: String,
    call: Option<String>,
    approve: bool,
    reason: Option<String>,
    as_json: bool,
) -> Result<i32, Exit> {
    let (project, id, row) = thread_row(explicit, &id)?;
    if row.status.is_terminal() {
        return Err(usage(format!(
            "thread {id} is {}; nothing waits",
            row.status
        )));
    }
    let op = if approve { "approve" } else { "deny" };
    let reply = ask_owner(
        &project,
        &row,
        op,
        json!({ "call": call, "reason": reason }),
    )
    .await?;
    if as_json {
        out!("{reply}");
    } else {
        out!(
            "{id}: call {} {}",
            reply["call"].as_str().unwrap_or("?"),
            if approve { "approved" } else { "denied" }
        );
    }
    Ok(0)
}

/// `weft inject`: a message for a running thread's next turn.
pub(super) async fn inject(
    explicit: Option<PathBuf>,
    id: String,
    text: String,
    as_json: bool,
) -> Result<i32, Exit> {
    let (project, id, row) = thread_row(explicit, &id)?;
    if row.status.is_terminal() {
        return Err(usage(format!(
            "thread {id} is {}; a message can only reach a running thread (`weft resume {id} -m TEXT` continues it)",
            row.status
        )));
    }
    let reply = ask_owner(&project, &row, "inject", json!({ "text": text })).await?;
    if as_json {
        out!("{reply}");
    } else {
        out!("{id}: message queued for its next turn");
    }
    Ok(0)
}
