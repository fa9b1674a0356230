//! The file tools, run on a blocking thread one at a time per thread (see `tools/files.rs`).

use crate::provider::ToolCall;
use crate::thread::state::Thread;
use crate::tools::{FileTool, ToolOutcome};

impl Thread {
    /// A file tool, on a task.
    pub(crate) fn file_tool(&mut self, tool: FileTool, call: ToolCall) -> Option<ToolOutcome> {
        let area = self.ctx.store.files_dir(self.id());
        let limits = self.ctx.config.files;
        let input = call.input;
        let lock = self.work.files_lock.clone();
        self.run_as_task(call.id, async move {
            let res = tokio::task::spawn_blocking(move || {
                let _one_at_a_time = lock.lock().unwrap_or_else(|p| p.into_inner());
                crate::tools::run_file_tool(tool, &input, &area, limits)
            })
            .await;
            match res {
                Ok(Ok(v)) => ToolOutcome::ok(v),
                Ok(Err(m)) => ToolOutcome::err(m),
                Err(e) => ToolOutcome::err(format!("file tool failed: {e}")),
            }
        });
        None
    }
}
