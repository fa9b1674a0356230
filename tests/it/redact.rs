//! Redaction of a secret's encoded forms (#23): a secret that a tool prints JSON-escaped, in
//! base64 (standard, URL-safe, inside an HTTP Basic header) or percent-encoded (either hex
//! case) is hidden as the clear one is — in the tool result the model is sent, in every file
//! under `.weft/` (transcripts, thread.json, the search index), in `weft search` and in the
//! export; so is a secret given as an input (the `thread_started` line, the prompt).

use crate::fake_llm;
use crate::support::{directive, tool_results, weft_cmd, Fixture};
use serde_json::{json, Map, Value};
use std::io::Write;

/// A secret with the characters JSON escapes, a non-ASCII one, and bytes whose base64 holds `+`.
const SECRET: &str = "pa\"ss\\word9é?>~";

/// The secret as `tools/enc.sh` prints it; for base64, the characters that depend on the
/// secret alone.
const FORMS: &[&str] = &[
    SECRET,
    r#"pa\"ss\\word9é?>~"#,
    "cGEic3Ncd29yZDnDqT8+fg",
    "cGEic3Ncd29yZDnDqT8-fg",
    "wYSJzc1x3b3JkOcOpPz5+",
    "pa%22ss%5cword9%c3%a9%3f%3e%7e",
    "pa%22ss%5Cword9%C3%A9%3F%3E%7E",
];

/// Prints `$ENC_TOKEN` in clear, JSON-escaped (as sed would), base64, URL-safe base64, in a
/// Basic header, and percent-encoded in lower and upper hex.
const ENC_SH: &str = r#"S="$ENC_TOKEN"
pct() {
  for h in $(printf %s "$1" | od -An -tx1 -v); do
    case $h in
      3[0-9]|4[1-9a-f]|5[0-9a]|6[1-9a-f]|7[0-9a]) printf "\\$(printf %o "0x$h")" ;;
      *) printf '%%%s' "$(printf %s "$h" | tr a-f "$2")" ;;
    esac
  done
}
printf 'clear=%s\n' "$S"
printf '{"json":"%s"}\n' "$(printf %s "$S" | sed 's/\\/\\\\/g; s/"/\\"/g')"
printf 'b64=%s\n' "$(printf %s "$S" | base64 | tr -d '\n')"
printf 'b64url=%s\n' "$(printf %s "$S" | base64 | tr -d '\n=' | tr '+/' '-_')"
printf 'Authorization: Basic %s\n' "$(printf 'user:%s' "$S" | base64 | tr -d '\n')"
printf 'url=https://x.example/?t=%s\n' "$(pct "$S" a-f)"
printf 'URL=https://x.example/?t=%s\n' "$(pct "$S" A-F)"
"#;

/// Panics naming the form if `text` (from `what`) holds any form of the secret.
fn clean(what: &str, text: &str) {
    for f in FORMS {
        assert!(!text.contains(f), "{what} holds {f:?}: {text}");
    }
}

fn weft_out(fx: &Fixture, args: &[&str]) -> String {
    let out = weft_cmd(fx.root()).args(args).output().unwrap();
    assert!(out.status.success(), "weft {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A project on a fake OpenAI server: `leaky` runs `enc`, then answers.
fn project(base: &str) -> Fixture {
    std::env::set_var("WEFT_TEST_REDACT_KEY", "sk-redact-test-key");
    let config = format!(
        "defaults:\n  provider: fake\n  max_output_tokens: 500\nproviders:\n  fake: {{ kind: openai, base_url: \"{base}/v1\", api_key_env: WEFT_TEST_REDACT_KEY, tiers: {{ fast: m1 }} }}\npricing:\n  m1: {{ input: 2.00, output: 8.00, cache_read: 0.50 }}\n"
    );
    let leaky = directive(
        "model: { tier: fast }\npermissions: [ tool.enc ]\ninputs:\n  note: { type: string }",
        "Use the API. Note: {input:note}",
    );
    let fx = Fixture::raw(&[("leaky", &leaky)], "", &config);
    let tools = fx.root().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::write(tools.join("enc.sh"), ENC_SH).unwrap();
    let yaml = format!(
        "name: enc\nargv: [sh, \"{}\"]\nenv: [ENC_TOKEN, PATH]\n",
        tools.join("enc.sh").display()
    );
    std::fs::write(tools.join("enc.yaml"), yaml).unwrap();
    let mut set = weft_cmd(fx.root())
        .args(["env", "set", "ENC_TOKEN", "-", "--secret"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(set.stdin.take().unwrap(), "{SECRET}").unwrap();
    assert!(set.wait().unwrap().success());
    fx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_is_hidden_in_every_form_a_tool_prints_it_in() {
    let (base, fake) = fake_llm::start().await;
    fake.stream(fake_llm::openai("", Some(("enc", json!({}))), 100, 0, 10));
    fake.stream(fake_llm::openai("Done.", None, 200, 0, 5));
    let fx = project(&base);
    let rt = fx.runtime_configured().await;
    let note = format!("{SECRET} or {}", FORMS[2]);
    let inputs: Map<String, Value> = [("note".to_string(), json!(note))].into_iter().collect();
    let report = rt
        .run("leaky", inputs, weft::LimitSet::default())
        .await
        .unwrap();
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    rt.drain_hooks().await;
    rt.shutdown();
    let id = report.thread_id.to_string();

    // The tool result: every line still there, every form replaced by the marker.
    let out = &tool_results(&fx, &id)[0].0;
    assert!(out.contains("Authorization: Basic dXNlcjp"), "{out}");
    assert_eq!(out.matches("[secret:ENC_TOKEN]").count(), 7, "{out}");
    clean("the tool result", out);
    // The thread_started line's inputs and the prompt.
    let started = &fx.events(&id)[0];
    assert_eq!(started["type"], "thread_started");
    assert!(started["inputs"]["note"]
        .as_str()
        .unwrap()
        .contains("[secret:ENC_TOKEN]"));
    // What the model was sent: the prompt, then the tool result.
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        clean("a request to the model", &s.body.to_string());
    }
    assert!(seen[1].body.to_string().contains("[secret:ENC_TOKEN]"));
    // Every file under .weft/, the search index and the export.
    for (f, bytes) in crate::env::all_file_bytes(&fx.root().join(".weft")) {
        clean(&f.display().to_string(), &String::from_utf8_lossy(&bytes));
    }
    let found = weft_out(&fx, &["search", "Note", "--json"]);
    assert!(found.contains("[secret:ENC_TOKEN]"), "{found}");
    clean("weft search", &found);
    for format in ["markdown", "nova"] {
        clean(
            "the export",
            &weft_out(&fx, &["export", &id, "--format", format]),
        );
    }
}
