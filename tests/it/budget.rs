//! Budgets: sharing, guarantees, refusals, and the ledger invariant under random trees.

use crate::support::{directive, expected_spend, Fixture};
use proptest::prelude::*;
use serde_json::json;
use weft::internals::Book;
use weft::Status;
use weft::ThreadId;
use weft::{Nanos, Price};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siblings_share_the_parent_budget_without_starving_each_other() {
    // Each child's cap equals the parent's whole budget: a pre-allocating ledger would admit one.
    let parent = directive(
        "limits: { spend: 0.01, spawns: 5, concurrency: 5 }\npermissions: [\"thread.spawn.kid\"]",
        "Fan.",
    );
    let kid = directive("limits: { spend: 0.01 }", "Kid.");
    let script = r#"
parent:
  - usage: { input_tokens: 100, output_tokens: 10 }
    tool_calls:
      - { name: spawn_thread, input: { directive: kid, wait: false } }
      - { name: spawn_thread, input: { directive: kid, wait: false } }
      - { name: spawn_thread, input: { directive: kid, wait: false } }
  - usage: { input_tokens: 100, output_tokens: 10 }
    tool_calls: [ { name: wait_threads, input: {} } ]
  - text: all three answered
    usage: { input_tokens: 100, output_tokens: 10 }
kid:
  - text: answer
    delay: 20ms
    usage: { input_tokens: 200, output_tokens: 100 }
"#;
    let fx = Fixture::new(
        &[("parent", &parent), ("kid", &kid)],
        script,
        "defaults:\n  max_output_tokens: 200\n",
    );
    let (report, rt) = fx.run("parent", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let kids: Vec<_> = fx
        .rows()
        .into_iter()
        .filter(|r| r.directive == "kid")
        .collect();
    assert_eq!(kids.len(), 3);
    assert!(kids.iter().all(|k| k.status == "completed"));
    assert_eq!(report.spend_nanos.0, expected_spend(&fx));
    let (v, open) = rt.audit().await;
    assert!(v.is_empty() && open == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_the_budget_cannot_cover_is_refused_and_the_parent_goes_on() {
    let parent = directive(
        "limits: { spend: 0.001 }\npermissions: [\"thread.spawn.kid\"]",
        "Fan.",
    );
    let script = r#"
parent:
  - usage: { input_tokens: 100, output_tokens: 10 }
    tool_calls: [ { name: spawn_thread, input: { directive: kid, reserve: 0.5 } } ]
  - usage: { input_tokens: 100, output_tokens: 10 }
    text: carried on without the child
kid:
  - text: never
"#;
    let fx = Fixture::new(
        &[("parent", &parent), ("kid", &directive("", "Kid."))],
        script,
        "defaults:\n  max_output_tokens: 50\n",
    );
    let (report, _rt) = fx.run("parent", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    assert_eq!(
        report.result.as_deref(),
        Some("carried on without the child")
    );
    let refusal = fx
        .events(report.thread_id.as_str())
        .into_iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap();
    let text = refusal["content"].as_str().unwrap();
    assert!(
        text.contains("spawn refused: limit exceeded: spend") && text.contains("remains"),
        "{text}"
    );
    assert_eq!(fx.rows().len(), 1, "no row left for the refused child");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_limit_stops_the_next_call_before_it_happens() {
    // $0.001 = 1,000,000 nanos; the first call costs 200k in + 400k out; the second's prompt alone
    // (350k) leaves room for fewer than the 16 output tokens a call needs: refused before it runs.
    let d = directive("limits: { spend: 0.001 }", "Spend.");
    let script = r#"
spender:
  - usage: { input_tokens: 200, output_tokens: 100 }
    tool_calls: [ { name: nope, input: {} } ]
  - usage: { input_tokens: 350, output_tokens: 100 }
    text: never
"#;
    let fx = Fixture::new(
        &[("spender", &d)],
        script,
        "defaults:\n  max_output_tokens: 100\n",
    );
    let (report, _rt) = fx.run("spender", json!({})).await;
    assert_eq!(report.status, Status::Error);
    assert!(
        report
            .error
            .as_deref()
            .unwrap()
            .starts_with("limit exceeded: spend"),
        "{report:?}"
    );
    assert_eq!(report.turns, 1);
    assert!(report.spend_nanos.0 <= 1_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_guarantee_is_honoured_while_a_sibling_takes_the_rest() {
    // Budget $0.01 = 10,000,000 nanos at 1000 nanos/input token and 4000/output token.
    let parent = directive(
        "limits: { spend: 0.01 }\npermissions: [\"thread.spawn.**\"]",
        "Fan.",
    );
    let script = r#"
parent:
  - usage: { input_tokens: 100, output_tokens: 10 }
    tool_calls: [ { name: spawn_thread, input: { directive: a, reserve: 0.008, wait: false } } ]
  - usage: { input_tokens: 100, output_tokens: 10 }
    tool_calls:
      - { name: spawn_thread, input: { directive: b } }
      - { name: wait_threads, input: {} }
  - usage: { input_tokens: 100, output_tokens: 10 }
    text: both done
a:
  - text: a needed 6M nanos
    delay: 400ms
    usage: { input_tokens: 6000, output_tokens: 10 }
b:
  - text: b wanted far more than was left
    usage: { input_tokens: 1500, output_tokens: 1000 }
"#;
    let fx = Fixture::new(
        &[
            ("parent", &parent),
            ("a", &directive("", "A.")),
            ("b", &directive("", "B.")),
        ],
        script,
        "defaults:\n  max_output_tokens: 100\n",
    );
    let (report, rt) = fx.run("parent", json!({})).await;
    assert_eq!(report.status, Status::Completed, "{report:?}");
    let rows = fx.rows();
    let a = rows.iter().find(|r| r.directive == "a").unwrap();
    let b = rows.iter().find(|r| r.directive == "b").unwrap();
    assert_eq!(
        (a.status.as_str(), a.own_spend_nanos),
        ("completed", 6_040_000),
        "a got its whole call"
    );
    // a's guarantee is set aside before b exists (a is spawned a turn earlier). b could then only
    // use what was neither spent by the parent (2 × 140k) nor guaranteed to a (8M): its output
    // was lowered from 100 to (10M - 280k - 8M - 1.5M prompt) / 4000 = 55 tokens.
    let b_call = fx
        .events(&b.id)
        .into_iter()
        .find(|e| e["type"] == "llm_call")
        .unwrap();
    assert_eq!(b_call["usage"]["output_tokens"], 55, "{b_call}");
    assert_eq!(b.status, "completed");
    assert_eq!(report.spend_nanos.0, expected_spend(&fx));
    assert!(report.spend_nanos.0 <= 10_000_000);
    let (v, open) = rt.audit().await;
    assert!(v.is_empty() && open == 0);
}

const P: Price = Price {
    input: 1_000_000_000,
    output: 3_000_000_000,
    cache_read: 0,
    cache_write: 0,
};

#[derive(Debug, Clone)]
enum Op {
    Spawn {
        parent: usize,
        max: i64,
        guarantee: i64,
    },
    Call {
        who: usize,
        prompt: u64,
        out: u64,
        actual_pct: u8,
    },
    Close {
        who: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0usize..64,
            1i64..2_000_000,
            prop_oneof![Just(0i64), 1i64..400_000]
        )
            .prop_map(|(parent, max, guarantee)| Op::Spawn {
                parent,
                max,
                guarantee
            }),
        (0usize..64, 0u64..500, 1u64..800, 0u8..=100).prop_map(|(who, prompt, out, actual_pct)| {
            Op::Call {
                who,
                prompt,
                out,
                actual_pct,
            }
        }),
        (0usize..64).prop_map(|who| Op::Close { who }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random trees, spends, guarantees and closes: no account ever exceeds its cap, the tree
    /// never spends more than the root's limit, and nothing is left reserved once all close.
    #[test]
    fn ledger_invariant_holds_for_random_trees(root_max in 1i64..3_000_000, ops in prop::collection::vec(op(), 1..120)) {
        let mut b = Book::default();
        let id = |i: usize| ThreadId::parse(&format!("t{i}")).unwrap();
        b.open(&id(0), None, Nanos(root_max), Nanos::ZERO, Nanos::ZERO).unwrap();
        let mut open_ids = vec![0usize];
        let mut next = 1usize;
        let mut grants: Vec<(usize, weft::internals::Grant)> = Vec::new();
        let mut settled_total = 0i64;
        for op in ops {
            match op {
                Op::Spawn { parent, max, guarantee } => {
                    let p = open_ids[parent % open_ids.len()];
                    if b.open(&id(next), Some(&id(p)), Nanos(max), Nanos(guarantee), Nanos(1)).is_ok() {
                        open_ids.push(next);
                    }
                    next += 1;
                }
                Op::Call { who, prompt, out, actual_pct } => {
                    let t = open_ids[who % open_ids.len()];
                    if let Ok(g) = b.reserve(&id(t), &P, prompt, out, 1) {
                        prop_assert!(g.max_output_tokens <= out);
                        // Settle some earlier call with an actual cost up to its reservation.
                        grants.push((t, g));
                        if actual_pct % 2 == 0 {
                            let (_, g) = grants.remove(0);
                            let actual = g.amount.0 * i64::from(actual_pct) / 100;
                            prop_assert!(b.settle(g.reservation, Nanos(actual)));
                            settled_total += actual;
                        }
                    }
                }
                Op::Close { who } => {
                    if open_ids.len() > 1 {
                        let i = 1 + who % (open_ids.len() - 1);
                        let t = open_ids.remove(i);
                        grants.retain(|(w, _)| *w != t);
                        b.close(&id(t)).unwrap();
                    }
                }
            }
            let v = b.violations();
            prop_assert!(v.is_empty(), "invariant broken: {:?}", v);
        }
        for (_, g) in grants.drain(..) {
            let actual = g.amount.0 / 2;
            if b.settle(g.reservation, Nanos(actual)) {
                settled_total += actual;
            }
        }
        for t in open_ids.iter().rev() {
            b.close(&id(*t)).unwrap();
        }
        prop_assert_eq!(b.open_reservations(), 0);
        let root = b.get(&id(0)).unwrap();
        prop_assert!(root.spent.0 <= root_max);
        prop_assert_eq!(root.spent.0, settled_total, "the root's spend is every settled call");
        prop_assert_eq!((root.inflight, root.guaranteed), (Nanos::ZERO, Nanos::ZERO));
        for a in b.accounts() {
            prop_assert!(a.spent <= a.max, "{:?}", a);
            prop_assert_eq!((a.inflight, a.guaranteed, a.pool_left), (Nanos::ZERO, Nanos::ZERO, Nanos::ZERO));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    /// Random scripted trees through the whole runtime: the root's spend equals the sum of all
    /// usage × price, never exceeds its limit, and the ledger is clean at the end.
    #[test]
    fn random_runtime_trees_stay_within_budget(
        width in 1usize..4,
        leaf_in in 50u64..3000,
        leaf_out in 10u64..800,
        spend_milli in 1u64..20,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let spend = format!("0.{spend_milli:03}");
            let root = directive(&format!("limits: {{ spend: {spend}, spawns: 10, concurrency: 10 }}\npermissions: [\"thread.spawn.**\"]"), "Root.");
            let calls: Vec<String> = (0..width).map(|_| "      - { name: spawn_thread, input: { directive: kid, wait: false } }".to_string()).collect();
            let script = format!(
                "root:\n  - usage: {{ input_tokens: 100, output_tokens: 20 }}\n    tool_calls:\n{}\n  - usage: {{ input_tokens: 100, output_tokens: 20 }}\n    tool_calls: [ {{ name: wait_threads, input: {{}} }} ]\n  - text: done\n    usage: {{ input_tokens: 100, output_tokens: 20 }}\nkid:\n  - tool_calls: [ {{ name: spawn_thread, input: {{ directive: leaf }} }} ]\n    usage: {{ input_tokens: {leaf_in}, output_tokens: {leaf_out} }}\n  - text: kid done\n    usage: {{ input_tokens: {leaf_in}, output_tokens: {leaf_out} }}\nleaf:\n  - text: leaf done\n    usage: {{ input_tokens: {leaf_in}, output_tokens: {leaf_out} }}\n",
                calls.join("\n")
            );
            let fx = Fixture::new(&[("root", &root), ("kid", &directive("", "Kid.")), ("leaf", &directive("", "Leaf."))], &script, "defaults:\n  max_output_tokens: 1000\n");
            let (report, rt) = fx.run("root", json!({})).await;
            let limit = (spend_milli as i64) * 1_000_000;
            assert!(report.spend_nanos.0 <= limit, "{} > {}", report.spend_nanos.0, limit);
            assert_eq!(report.spend_nanos.0, expected_spend(&fx));
            let (v, open) = rt.audit().await;
            assert!(v.is_empty() && open == 0, "{v:?} {open}");
            assert!(fx.rows().iter().all(|r| r.status.is_terminal()));
            assert!(fx.verify_all().is_empty());
        });
    }
}

/// `spawn_thread {limits}` only lowers (#22 finding 5): a child declaring `{turns: 1, spend:
/// 0.001, depth: 0}` runs with those even when the caller asks `{turns: 7, spend: 0.2, depth:
/// 3}`; a lower request still lowers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_thread_limits_only_lower_a_childs_own() {
    let script = "boss:\n  - tool_calls:\n      - { name: spawn_thread, input: { directive: kid, limits: { turns: 7, spend: 0.2, depth: 3 } } }\n      - { name: spawn_thread, input: { directive: kid, limits: { tokens: 500 } } }\n    usage: { input_tokens: 10, output_tokens: 5 }\n  - text: done\n    usage: { input_tokens: 10, output_tokens: 5 }\nkid:\n  - text: hi\n    usage: { input_tokens: 10, output_tokens: 5 }\n  - text: hi\n    usage: { input_tokens: 10, output_tokens: 5 }\n";
    let fx = Fixture::new(
        &[
            (
                "boss",
                &directive("permissions: [thread.spawn.kid]", "Boss."),
            ),
            (
                "kid",
                &directive("limits: { turns: 1, spend: 0.001, depth: 0 }", "Kid."),
            ),
        ],
        script,
        "",
    );
    let (report, _rt) = fx.run("boss", json!({})).await;
    assert_eq!(report.status, weft::Status::Completed, "{report:?}");
    let kids: Vec<String> = fx
        .rows()
        .into_iter()
        .filter(|r| r.directive == "kid")
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(kids.len(), 2);
    for kid in kids {
        let l = fx.doc(&kid).limits;
        assert_eq!(
            (l.turns, l.spend, l.depth),
            (1, weft::Nanos(1_000_000), 0),
            "{kid}: the caller raised the child's own limits"
        );
    }
    let lowered = fx
        .rows()
        .into_iter()
        .filter(|r| r.directive == "kid")
        .any(|r| fx.doc(&r.id.to_string()).limits.tokens == 500);
    assert!(lowered, "a lower request did not lower");
}
