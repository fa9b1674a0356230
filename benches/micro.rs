//! Micro benchmarks of the per-turn building blocks (criterion): `cargo bench --bench micro`.
//! The macro suite is `cargo run --release --example bench -- all` (see BENCHMARKS.md).

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use std::hint::black_box;
use weft::internals::Book;
use weft::ThreadId;
use weft::{Nanos, Price, Usage};

fn ledger(c: &mut Criterion) {
    let price = Price {
        input: 1_000_000_000,
        output: 4_000_000_000,
        cache_read: 0,
        cache_write: 0,
    };
    let mut book = Book::default();
    let mut up: Option<ThreadId> = None;
    for level in 0..5 {
        let id = ThreadId::parse(&format!("l{level}")).unwrap();
        book.open(
            &id,
            up.as_ref(),
            Nanos(i64::MAX / 4),
            Nanos::ZERO,
            Nanos::ZERO,
        )
        .unwrap();
        up = Some(id);
    }
    let tip = up.unwrap();
    c.bench_function("ledger reserve+settle, depth 5 (in memory)", |b| {
        b.iter(|| {
            let g = book
                .reserve(black_box(&tip), &price, 1000, 4096, 16)
                .unwrap();
            book.settle(g.reservation, Nanos(1234));
        })
    });
    c.bench_function("price cost", |b| {
        b.iter(|| {
            price.cost(black_box(&Usage {
                input_tokens: 1234,
                output_tokens: 567,
                cache_read_tokens: 89,
                cache_write_tokens: 0,
            }))
        })
    });
}

fn capabilities(c: &mut Criterion) {
    let caps: Vec<String> = ["tool.fs.*", "thread.spawn.research.**", "tool.web_fetch"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    c.bench_function("capability check", |b| {
        b.iter(|| {
            weft::internals::capability::allowed(black_box(&caps), "thread.spawn.research.answer")
        })
    });
    let child: Vec<String> = vec!["thread.spawn.**".into(), "tool.*".into()];
    c.bench_function("capability attenuation", |b| {
        b.iter(|| weft::internals::capability::attenuate(black_box(&child), &caps))
    });
}

fn signing(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let signer = weft::internals::Signer::load_or_create(dir.path()).unwrap();
    let doc = json!({"id": "research.fanout-1-0", "status": "running", "limits": {"turns": 8, "spend": 250000000},
                     "history": [{"status": "created", "at": "2026-11-22T00:00:00.000Z"}], "capabilities": ["thread.spawn.research.*"]});
    c.bench_function("thread.json sign (JCS + ed25519)", |b| {
        b.iter(|| signer.sign(weft::internals::THREAD_DOMAIN, black_box(&doc)))
    });
    let project = weft::Project {
        root: dir.path().to_path_buf(),
    };
    let mut w = weft::internals::TranscriptWriter::create(
        &weft::internals::Records::files(&project),
        &weft::ThreadId::parse("t-1-0").unwrap(),
        std::sync::Arc::new(signer),
        weft::Durability::Normal,
        1_000_000,
    )
    .unwrap();
    c.bench_function("transcript append (chained line, to the OS)", |b| {
        b.iter(|| {
            w.append(
                "tool_result",
                json!({"id": "call_1", "content": "{\"threads\":[]}", "is_error": false}),
            )
            .unwrap()
        })
    });
}

fn directives(c: &mut Criterion) {
    let text = "---\ndescription: d\nmodel: { tier: fast }\nlimits: { turns: 8, spend: 0.25, duration: 2m }\npermissions: [\"thread.spawn.x.*\"]\ninputs:\n  topic: { type: string, required: true }\noutputs:\n  summary: { type: string, required: true }\n---\nResearch {input:topic}.\n";
    c.bench_function("directive parse", |b| {
        b.iter(|| weft::internals::parse_directive("d.md", black_box(text), "d").unwrap())
    });
}

criterion_group!(benches, ledger, capabilities, signing, directives);
criterion_main!(benches);
