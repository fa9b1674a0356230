//! The floor of one turn: what SPEC §5, §6 and §11 make every tool turn do, in the product's
//! shape (a thread actor, a ledger actor, the call as its own task), with nothing else. It is
//! what the per-turn goal compares against, measured in the same run and place.
//!
//! Per turn: the thread asks the ledger actor for a reservation and waits for the answer, which
//! comes after one SQLite commit (WAL, `synchronous=NORMAL`) that also stores the previous
//! turn's settlement (durable before the next reservation is acknowledged); the call runs as a
//! task of its own (so a cancel reaches the thread while it runs) and reports back; the thread
//! appends three hash-chained lines (the call, the tool use, its result) to its transcript, each
//! reaching the OS before the next step; it casts the settlement and tells a watcher the turn
//! is done. No JSON values, no registry, no hooks, no signatures (a turn signs nothing).

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// The ledger's messages: a reservation answered after its commit, a settlement cast.
enum Book {
    Reserve(RpcReplyPort<u64>),
    Settle(u64),
}

struct Ledger;

struct LedgerState {
    db: rusqlite::Connection,
    next: u64,
    settled: Vec<u64>,
}

impl Actor for Ledger {
    type Msg = Book;
    type State = LedgerState;
    type Arguments = rusqlite::Connection;

    async fn pre_start(
        &self,
        _me: ActorRef<Book>,
        db: rusqlite::Connection,
    ) -> Result<LedgerState, ActorProcessingErr> {
        Ok(LedgerState {
            db,
            next: 0,
            settled: Vec::new(),
        })
    }

    async fn handle(
        &self,
        _me: ActorRef<Book>,
        m: Book,
        s: &mut LedgerState,
    ) -> Result<(), ActorProcessingErr> {
        match m {
            Book::Settle(id) => s.settled.push(id),
            Book::Reserve(reply) => {
                s.next += 1;
                let tx =
                    s.db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                for id in s.settled.drain(..) {
                    tx.prepare_cached("DELETE FROM reservations WHERE thread=1 AND id=?1")?
                        .execute([id as i64])?;
                    tx.prepare_cached(
                        "UPDATE accounts SET spent=spent+1, inflight=inflight-1 WHERE id=1",
                    )?
                    .execute([])?;
                }
                tx.prepare_cached("INSERT INTO reservations(id, thread, body) VALUES(?1, 1, 'r')")?
                    .execute([s.next as i64])?;
                tx.prepare_cached("UPDATE accounts SET inflight=inflight+1 WHERE id=1")?
                    .execute([])?;
                tx.commit()?;
                let _ = reply.send(s.next);
            }
        }
        Ok(())
    }
}

/// The thread's messages: the next turn, and its call's end.
enum Turn {
    Next,
    CallDone(u64),
}

struct Thread;

struct ThreadState {
    ledger: ActorRef<Book>,
    file: std::fs::File,
    head: [u8; 32],
    seq: u64,
    left: usize,
    events: tokio::sync::broadcast::Sender<u64>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ThreadState {
    /// One transcript line, chained to the one before, handed to the OS.
    fn line(&mut self, kind: &str) -> std::io::Result<()> {
        use sha2::Digest;
        self.seq += 1;
        let prev: String = self.head.iter().map(|b| format!("{b:02x}")).collect();
        let line = format!(
            "{{\"prev\":\"{prev}\",\"seq\":{},\"type\":\"{kind}\",\"usage\":{{\"input_tokens\":10,\"output_tokens\":2}}}}\n",
            self.seq
        );
        self.head = sha2::Sha256::digest(line.as_bytes()).into();
        self.file.write_all(line.as_bytes())
    }
}

type ThreadArgs = (
    ActorRef<Book>,
    std::fs::File,
    usize,
    tokio::sync::broadcast::Sender<u64>,
    tokio::sync::oneshot::Sender<()>,
);

impl Actor for Thread {
    type Msg = Turn;
    type State = ThreadState;
    type Arguments = ThreadArgs;

    async fn pre_start(
        &self,
        me: ActorRef<Turn>,
        (ledger, file, left, events, done): ThreadArgs,
    ) -> Result<ThreadState, ActorProcessingErr> {
        me.cast(Turn::Next)?;
        Ok(ThreadState {
            ledger,
            file,
            head: [0; 32],
            seq: 0,
            left,
            events,
            done: Some(done),
        })
    }

    async fn handle(
        &self,
        me: ActorRef<Turn>,
        m: Turn,
        s: &mut ThreadState,
    ) -> Result<(), ActorProcessingErr> {
        match m {
            Turn::Next if s.left == 0 => {
                if let Some(done) = s.done.take() {
                    let _ = done.send(());
                }
                me.stop(None);
            }
            Turn::Next => {
                let reservation = ractor::call!(s.ledger, Book::Reserve)?;
                let me = me.clone();
                tokio::spawn(async move {
                    let _ = me.cast(Turn::CallDone(reservation));
                });
            }
            Turn::CallDone(reservation) => {
                s.line("llm_call")?;
                s.ledger.cast(Book::Settle(reservation))?;
                s.line("tool_use")?;
                s.line("tool_result")?;
                s.left -= 1;
                let _ = s.events.send(s.seq);
                me.cast(Turn::Next)?;
            }
        }
        Ok(())
    }
}

/// µs per turn of `turns` floor turns in `dir` (a fresh ledger database and transcript).
pub async fn turn_floor(turns: usize, dir: &Path) -> f64 {
    let db = rusqlite::Connection::open(dir.join("floor-ledger.db")).unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE accounts(id INTEGER PRIMARY KEY, spent INTEGER, inflight INTEGER);
         CREATE TABLE reservations(id INTEGER, thread INTEGER, body TEXT, PRIMARY KEY(thread, id));
         INSERT INTO accounts VALUES(1, 0, 0);",
    )
    .unwrap();
    let (ledger, _) = Actor::spawn(None, Ledger, db).await.unwrap();
    let file = std::fs::File::create(dir.join("floor-transcript.jsonl")).unwrap();
    let (events, mut watcher) = tokio::sync::broadcast::channel(1024);
    let watch = tokio::spawn(async move { while watcher.recv().await.is_ok() {} });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let t = Instant::now();
    let (thread, _) = Actor::spawn(None, Thread, (ledger.clone(), file, turns, events, tx))
        .await
        .unwrap();
    rx.await.unwrap();
    let us = t.elapsed().as_secs_f64() * 1e6 / turns as f64;
    thread.stop(None);
    ledger.stop(None);
    watch.abort();
    us
}
