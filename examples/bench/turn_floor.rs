//! The floor of one tool turn: what SPEC §5, §6 and §11 make every turn do, in the product's
//! shape (a thread actor, a ledger actor that reserves every call, the call as a task holding a
//! cancellation token), with nothing else. The per-turn goal is read against it, measured in
//! the same run and place. Two ledgers, both allowed by SPEC §5:
//!
//! * **journal** (the cheapest): the ledger keeps its book in memory and appends every change
//!   to a write-ahead journal before answering ("an equally atomic in-memory step with
//!   write-ahead persistence"), folding the journal into SQLite every 64 changes in one
//!   transaction. A reservation is answered after one `write`; a settlement is in the journal
//!   before the next reservation is answered (the ledger handles messages in order).
//! * **commit** (weft's ledger today): a reservation is answered after the SQLite commit
//!   (WAL) that also stores the previous call's settlement.
//!
//! Per turn, either way: the thread reserves (one actor round trip); the call runs as its own
//! task and reports back; the thread appends the call's line (its cost and tool uses) and the
//! tool's result, each hash-chained and handed to the OS (fsynced under `strict`); casts the
//! settlement and the registry's cost snapshot; tells a watcher the turn is done. No JSON
//! values, no limits or capability checks, no hooks, no signatures (a turn signs nothing).

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// How the floor's ledger stores its changes.
#[derive(Clone, Copy, PartialEq)]
pub enum Ledger {
    /// Journal `write` per change, SQLite every 64 changes.
    Journal,
    /// One SQLite commit before each reservation is answered.
    Commit,
}

/// The ledger's messages: a reservation, a settlement cast.
enum Book {
    Reserve(RpcReplyPort<u64>),
    Settle(u64),
}

struct LedgerActor;

struct LedgerState {
    kind: Ledger,
    strict: bool,
    db: rusqlite::Connection,
    journal: std::fs::File,
    next: u64,
    /// Changes not yet in SQLite: (reservation, settled).
    unfolded: Vec<(u64, bool)>,
}

impl LedgerState {
    /// Appends one change to the journal (reaching the OS; the disk under `strict`).
    fn journal(&mut self, id: u64, settled: bool) -> std::io::Result<()> {
        let rec = format!("{{\"r\":{id},\"settled\":{settled},\"account\":1}}\n");
        self.journal.write_all(rec.as_bytes())?;
        if self.strict {
            self.journal.sync_data()?;
        }
        self.unfolded.push((id, settled));
        Ok(())
    }

    /// Stores every change not yet in SQLite in one transaction.
    fn fold(&mut self) -> rusqlite::Result<()> {
        let tx = self
            .db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for (id, settled) in self.unfolded.drain(..) {
            if settled {
                tx.prepare_cached("DELETE FROM reservations WHERE id=?1")?
                    .execute([id as i64])?;
            } else {
                tx.prepare_cached("INSERT INTO reservations(id, body) VALUES(?1, 'r')")?
                    .execute([id as i64])?;
            }
        }
        tx.prepare_cached("UPDATE accounts SET spent=?1, inflight=1 WHERE id=1")?
            .execute([self.next as i64])?;
        tx.commit()
    }
}

impl Actor for LedgerActor {
    type Msg = Book;
    type State = LedgerState;
    type Arguments = LedgerState;

    async fn pre_start(
        &self,
        _me: ActorRef<Book>,
        s: LedgerState,
    ) -> Result<LedgerState, ActorProcessingErr> {
        Ok(s)
    }

    async fn handle(
        &self,
        _me: ActorRef<Book>,
        m: Book,
        s: &mut LedgerState,
    ) -> Result<(), ActorProcessingErr> {
        match (m, s.kind) {
            (Book::Settle(id), Ledger::Journal) => s.journal(id, true)?,
            (Book::Settle(id), Ledger::Commit) => s.unfolded.push((id, true)),
            (Book::Reserve(reply), kind) => {
                s.next += 1;
                let id = s.next;
                match kind {
                    Ledger::Journal => s.journal(id, false)?,
                    Ledger::Commit => s.unfolded.push((id, false)),
                }
                if kind == Ledger::Commit || s.unfolded.len() >= 64 {
                    s.fold()?;
                }
                let _ = reply.send(id);
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
    registry: tokio::sync::mpsc::UnboundedSender<(u64, u64)>,
    file: std::fs::File,
    strict: bool,
    head: [u8; 32],
    seq: u64,
    left: usize,
    cancel: tokio_util::sync::CancellationToken,
    events: tokio::sync::broadcast::Sender<u64>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ThreadState {
    /// One transcript line, chained to the one before, handed to the OS (the disk under
    /// `strict`).
    fn line(&mut self, body: &str) -> std::io::Result<()> {
        use sha2::Digest;
        const HEX: &[u8; 16] = b"0123456789abcdef";
        self.seq += 1;
        let mut line = Vec::with_capacity(body.len() + 120);
        line.extend_from_slice(b"{\"prev\":\"");
        for b in self.head {
            line.extend_from_slice(&[HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        }
        line.extend_from_slice(format!("\",\"seq\":{},{body}}}\n", self.seq).as_bytes());
        self.head = sha2::Sha256::digest(&line).into();
        self.file.write_all(&line)?;
        if self.strict {
            self.file.sync_data()?;
        }
        Ok(())
    }
}

type ThreadArgs = (ThreadState,);

impl Actor for Thread {
    type Msg = Turn;
    type State = ThreadState;
    type Arguments = ThreadArgs;

    async fn pre_start(
        &self,
        me: ActorRef<Turn>,
        (s,): ThreadArgs,
    ) -> Result<ThreadState, ActorProcessingErr> {
        me.cast(Turn::Next)?;
        Ok(s)
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
                let token = s.cancel.child_token();
                tokio::spawn(async move {
                    if !token.is_cancelled() {
                        let _ = me.cast(Turn::CallDone(reservation));
                    }
                });
            }
            Turn::CallDone(reservation) => {
                s.line(&format!("\"type\":\"llm_call\",\"reservation\":{reservation},\"cost_nanos\":42,\"usage\":{{\"input_tokens\":10,\"output_tokens\":2}},\"tool_uses\":[{{\"id\":\"c1\",\"name\":\"wait_threads\",\"input\":{{}}}}]"))?;
                s.ledger.cast(Book::Settle(reservation))?;
                s.line("\"type\":\"tool_result\",\"id\":\"c1\",\"content\":\"[]\"")?;
                s.left -= 1;
                let _ = s.registry.send((s.seq, reservation));
                let _ = s.events.send(s.seq);
                me.cast(Turn::Next)?;
            }
        }
        Ok(())
    }
}

/// µs per turn of `turns` floor turns with `ledger`, in `dir` (its own database, journal and
/// transcript), after a warm-up of 50 turns.
pub async fn turn_floor(turns: usize, dir: &Path, ledger: Ledger, strict: bool) -> f64 {
    let name = if ledger == Ledger::Journal {
        "journal"
    } else {
        "commit"
    };
    let db = rusqlite::Connection::open(dir.join(format!("floor-{name}.db"))).unwrap();
    let sync = if strict { "FULL" } else { "NORMAL" };
    db.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync};
         CREATE TABLE accounts(id INTEGER PRIMARY KEY, spent INTEGER, inflight INTEGER);
         CREATE TABLE reservations(id INTEGER PRIMARY KEY, body TEXT);
         INSERT INTO accounts VALUES(1, 0, 0);"
    ))
    .unwrap();
    let journal = std::fs::File::create(dir.join(format!("floor-{name}.journal"))).unwrap();
    let book = LedgerState {
        kind: ledger,
        strict,
        db,
        journal,
        next: 0,
        unfolded: Vec::new(),
    };
    let (book, _) = Actor::spawn(None, LedgerActor, book).await.unwrap();
    let (registry, mut rows) = tokio::sync::mpsc::unbounded_channel();
    let (events, mut watcher) = tokio::sync::broadcast::channel(1024);
    let watch = tokio::spawn(async move { while watcher.recv().await.is_ok() {} });
    let keep = tokio::spawn(async move { while rows.recv().await.is_some() {} });
    let mut us = 0.0;
    for (i, n) in [50, turns].into_iter().enumerate() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let state = ThreadState {
            ledger: book.clone(),
            registry: registry.clone(),
            file: std::fs::File::create(dir.join(format!("floor-{name}-{i}.jsonl"))).unwrap(),
            strict,
            head: [0; 32],
            seq: 0,
            left: n,
            cancel: Default::default(),
            events: events.clone(),
            done: Some(tx),
        };
        let (thread, _) = Actor::spawn(None, Thread, (state,)).await.unwrap();
        let t = Instant::now();
        rx.await.unwrap();
        us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        thread.stop(None);
    }
    book.stop(None);
    watch.abort();
    keep.abort();
    us
}
