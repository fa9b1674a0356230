//! The web page steers, in Debian's headless Chromium: a waiting call shows its tool, input and
//! a reason field; a click on approve runs the tool, a click on deny gives the model the reason;
//! a message typed in the inject box reaches the thread's next turn; the timeline draws every
//! thread of a finished tree with its duration and spend against its cap. A screenshot is saved
//! (`target/page-steering.png`) for a person to look at.

use super::serve::{browse, chromium, Server};
use crate::support::{directive, tool_results, wait_until, Fixture};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_approves_denies_and_injects_and_draws_the_timeline() {
    let Some(chrome) = chromium() else {
        crate::support::skip("SKIPPED the_page_approves_denies_and_injects_and_draws_the_timeline: no chromium (CI installs Debian's; set WEFT_CHROMIUM to a browser)");
        return;
    };
    let root = directive(
        "permissions: [\"tool.*\", \"thread.spawn.*\"]\napproval: [tool.say]\nlimits: { spend: 0.25 }",
        "Use tools.",
    );
    let script = r#"
root:
  - tool_calls: [ { name: spawn_thread, input: { directive: leaf } } ]
  - tool_calls:
      - { name: upper, input: { text: "approved" } }
      - { name: say, input: { word: "denied" } }
  - text: done
leaf:
  - text: leaf done
"#;
    let fx = Fixture::new(
        &[("root", &root), ("leaf", &directive("", "Answer."))],
        script,
        "",
    );
    crate::support::approval_tools(&fx);
    let path = fx.root().join("script.yaml");
    let srv = Server::start(&fx, &["--script", path.to_str().unwrap()]);
    let (_, b) = srv
        .call("POST", "/v1/threads", Some(json!({ "directive": "root" })))
        .await;
    let id = b["thread_id"].as_str().unwrap().to_string();
    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/page-steering.png");
    let _ = std::fs::remove_file(&shot);
    let row = format!(".row[data-thread-id=\"{id}\"]");
    let panel = |tool: &str| {
        format!("[...document.querySelectorAll('.approval')].find(a => a.querySelector('.tool').textContent === '{tool}')")
    };
    let steps = json!([
        { "wait": format!("!!document.querySelector('{row}')") },
        { "eval": format!("document.querySelector('{row}').click(); true") },
        { "wait": "document.querySelectorAll('.approval').length === 2" },
        { "eval": format!("const u = {}; [u.querySelector('pre').textContent, !!u.querySelector('button.approve'), !!u.querySelector('input.reason')]", panel("upper")) },
        { "eval": "const t = document.querySelector('#inject textarea'); t.value = 'a note from the page'; document.querySelector('#inject-send').click(); true" },
        { "wait": "document.querySelector('#inject textarea').placeholder.startsWith('queued')" },
        { "screenshot": shot.to_str().unwrap() },
        { "eval": format!("const s = {}; s.querySelector('input.reason').value = 'not from the page'; s.querySelector('button.deny').click(); true", panel("say")) },
        { "eval": format!("{}.querySelector('button.approve').click(); true", panel("upper")) },
        { "wait": format!("document.querySelector('{row}').dataset.status === 'completed'") },
        { "wait": "document.querySelectorAll('#timeline .bar').length === 2" },
        { "eval": "[...document.querySelectorAll('#timeline .bar')].map(b => [b.className, b.title, parseFloat(b.style.width)])" },
        { "eval": "document.querySelector('#info').textContent" },
    ]);
    let url = format!("{}/#token={}", srv.base, srv.token);
    let out = browse(&chrome, &url, steps);
    let shown = &out[3]["eval"];
    assert!(
        shown[0].as_str().unwrap().contains("\"approved\""),
        "the input is shown: {shown}"
    );
    assert_eq!((&shown[1], &shown[2]), (&json!(true), &json!(true)));
    wait_until("the tree to end", || {
        fx.rows().iter().all(|r| r.status == "completed")
    })
    .await;
    // Approve ran the tool; deny gave the model the reason typed on the page.
    let r = tool_results(&fx, &id);
    let upper = r
        .iter()
        .find(|(c, _)| c.contains("APPROVED"))
        .expect("upper ran");
    assert!(!upper.1);
    assert!(
        r.iter()
            .any(|(c, e)| *e && c.contains("denied by a person: not from the page")),
        "{r:?}"
    );
    // The injected message reached the conversation.
    let events = fx.events(&id);
    assert!(
        events
            .iter()
            .any(|e| e.to_string().contains("a note from the page")),
        "{events:?}"
    );
    // The timeline: both threads, completed, with durations and spend against the cap.
    let bars = out[11]["eval"].as_array().unwrap();
    assert_eq!(bars.len(), 2, "{bars:?}");
    for b in bars {
        assert!(b[0].as_str().unwrap().contains("completed"), "{b}");
        assert!(b[2].as_f64().unwrap() > 0.0, "{b}");
    }
    assert!(
        bars.iter()
            .any(|b| b[1].as_str().unwrap().contains(" of $0.25000")),
        "{bars:?}"
    );
    let info = out[12]["eval"].as_str().unwrap();
    assert!(
        info.contains("ran ") && info.contains(" of $0.25000"),
        "{info}"
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
}
