//! The ledger's write-ahead journal (SPEC §5: "an equally atomic in-memory step with
//! write-ahead persistence"), on SQLite only. A batch of reservations and settlements — a
//! turn's ledger work — is answered once one record of it is handed to the OS (and fsynced
//! under `durability: strict`), instead of after an SQLite transaction. Every other change
//! (an account opened, set aside, adopted, placed, closed) still commits, and each commit folds
//! the journal into ledger.db with it; so does every `FOLD_EVERY`th record, a stop, and
//! anything that reads ledger.db for a decision (taking a tree over, reopening a chain).
//!
//! A record holds the rows the batch leaves (accounts as they are now, reservations added and
//! removed), so folding one is idempotent and needs no accounting. `journal_folds` in ledger.db
//! says, per journal, the last record folded, written in the fold's own transaction: a record
//! at or below it is never applied again, so a journal truncated late never rolls a row back.
//!
//! Each runtime has its own file, `state/ledger.journal/<owner>-<nonce>.jsonl` (runtimes in one
//! process share an owner). A process that dies leaves its journal; the next runtime to open
//! the ledger, or to take a tree over, folds the journals of owners that are gone, under the
//! ledger's write lock and before it reads what they held. A torn last record was never
//! answered and is dropped.

use super::db::{drop_reservation, put_account, put_reservation, st};
use super::{Account, LedgerError, Reservation, ReservationId};
use crate::core::ids::ThreadId;
use crate::sql::{params, Db};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Records between two folds, at most.
pub(super) const FOLD_EVERY: u64 = 256;

/// A record as written: borrowed rows.
#[derive(serde::Serialize)]
struct Out<'a> {
    seq: u64,
    a: Vec<&'a Account>,
    add: Vec<&'a Reservation>,
    del: &'a [(ThreadId, ReservationId)],
}

/// A record as read back.
#[derive(serde::Deserialize)]
struct In {
    seq: u64,
    #[serde(default)]
    a: Vec<Account>,
    #[serde(default)]
    add: Vec<Reservation>,
    #[serde(default)]
    del: Vec<(ThreadId, ReservationId)>,
}

/// This runtime's journal.
pub(super) struct Journal {
    dir: PathBuf,
    name: String,
    /// Opened (created) at the first record.
    file: Option<File>,
    /// Bytes in the file: a failed append is cut back to it.
    len: u64,
    /// The last record written.
    seq: u64,
    /// The last record folded into ledger.db.
    folded: u64,
    /// Each record is fsynced (`durability: strict`).
    strict: bool,
    /// A failed append could not be cut back: nothing more is journaled until a fold empties
    /// the file (replay stops at a torn record, so nothing may follow one).
    broken: bool,
    buf: Vec<u8>,
}

impl Journal {
    /// A journal in `dir`, named for this process and a fresh nonce (nothing is created yet).
    pub(super) fn new(dir: PathBuf, strict: bool) -> Journal {
        let mut nonce = [0u8; 6];
        let _ = getrandom::fill(&mut nonce);
        let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        Journal {
            dir,
            name: format!("{}-{nonce}", crate::core::owner::me()),
            file: None,
            len: 0,
            seq: 0,
            folded: 0,
            strict,
            broken: false,
            buf: Vec::new(),
        }
    }

    /// The folder of the runtimes' journals.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a batch may be journaled now.
    pub(super) fn usable(&self) -> bool {
        !self.broken
    }

    /// Records written and not yet folded.
    pub(super) fn unfolded(&self) -> u64 {
        self.seq - self.folded
    }

    /// Writes one record of a batch: the rows it leaves. On an error nothing of it stays.
    pub(super) fn append(
        &mut self,
        a: Vec<&Account>,
        add: Vec<&Reservation>,
        del: &[(ThreadId, ReservationId)],
    ) -> Result<(), LedgerError> {
        let seq = self.seq + 1;
        self.buf.clear();
        serde_json::to_writer(&mut self.buf, &Out { seq, a, add, del })
            .map_err(|e| LedgerError::Storage(format!("ledger journal: {e}")))?;
        self.buf.push(b'\n');
        let written = self.write();
        if let Err(e) = written {
            self.cut_back();
            return Err(LedgerError::Storage(format!(
                "ledger journal {}: {e}",
                self.path().display()
            )));
        }
        self.len += self.buf.len() as u64;
        self.seq = seq;
        Ok(())
    }

    fn path(&self) -> PathBuf {
        self.dir.join(format!("{}.jsonl", self.name))
    }

    fn write(&mut self) -> std::io::Result<()> {
        if crate::core::failpoint::fails("ledger.journal") {
            return Err(std::io::Error::other("failpoint ledger.journal"));
        }
        if self.file.is_none() {
            self.file = Some(self.create()?);
        }
        let Some(f) = self.file.as_mut() else {
            return Err(std::io::Error::other("no journal file"));
        };
        f.write_all(&self.buf)?;
        if self.strict {
            f.sync_data()?;
        }
        Ok(())
    }

    fn create(&self) -> std::io::Result<File> {
        std::fs::create_dir_all(&self.dir)?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(self.path())?;
        if self.strict {
            // The file's name must outlive a power cut as surely as its records.
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(f)
    }

    /// After a failed append: the file back to its last whole record.
    fn cut_back(&mut self) {
        let cut = self.file.as_ref().map(|f| f.set_len(self.len));
        if let Some(Err(e)) = cut {
            tracing::error!("ledger journal: a failed record could not be cut off ({e}); batches commit to ledger.db until the next fold");
            self.broken = true;
        }
    }

    /// Inside a fold's transaction: every record written so far is folded.
    pub(super) fn mark(&self, db: &Db) -> Result<(), LedgerError> {
        if self.unfolded() == 0 {
            return Ok(());
        }
        mark(db, &self.name, self.seq)
    }

    /// After a fold's commit: the file is emptied (its records are at or below the mark).
    pub(super) fn folded(&mut self) {
        self.folded = self.seq;
        let Some(f) = &self.file else {
            return;
        };
        match f.set_len(0) {
            Ok(()) => {
                self.len = 0;
                self.broken = false;
            }
            Err(e) => tracing::warn!("ledger journal: not emptied after its fold: {e}"),
        }
    }

    /// At a stop, everything folded: the file and its mark go.
    pub(super) fn remove(&mut self, db: &Db) {
        if self.unfolded() != 0 || self.file.take().is_none() {
            return;
        }
        if std::fs::remove_file(self.path()).is_ok() {
            let _ = db.execute(
                "DELETE FROM journal_folds WHERE name=?1",
                params![self.name.as_str()],
            );
        }
    }
}

fn mark(db: &Db, name: &str, seq: u64) -> Result<(), LedgerError> {
    db.execute_later(
        "INSERT INTO journal_folds(name, folded) VALUES(?1, ?2)
         ON CONFLICT(name) DO UPDATE SET folded=excluded.folded",
        params![name, i64::try_from(seq).unwrap_or(i64::MAX)],
    )
    .map_err(st)
}

/// Folds into ledger.db, inside the caller's write transaction, the journals in `dir` whose
/// owner is gone: each record past its mark, in order. Returns the files to delete once that
/// transaction has committed.
pub(super) fn fold_dead(
    db: &Db,
    dir: &Path,
    alive: &(dyn Fn(u32) -> bool + Send + Sync),
) -> Result<Vec<PathBuf>, LedgerError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut done = Vec::new();
    for path in entries.flatten().map(|e| e.path()) {
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jsonl"))
        else {
            continue;
        };
        let owner = name.split('-').next().and_then(|o| o.parse::<u32>().ok());
        if owner.is_none_or(alive) {
            continue;
        }
        fold_file(db, &path, name)?;
        done.push(path);
    }
    Ok(done)
}

/// Folds the journals in `dir` whose owner is gone into ledger.db, in a transaction of its own
/// (when a runtime opens the ledger, before it reads it).
pub(super) fn fold_dead_now(
    db: &mut Db,
    dir: &Path,
    alive: &(dyn Fn(u32) -> bool + Send + Sync),
) -> Result<(), LedgerError> {
    if std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none()) {
        return Ok(());
    }
    db.begin_write(crate::sql::Lock::Ledger).map_err(st)?;
    let folded = fold_dead(db, dir, alive);
    match folded {
        Ok(files) => {
            db.commit().map_err(st)?;
            remove_folded(files);
            Ok(())
        }
        Err(e) => {
            db.rollback();
            Err(e)
        }
    }
}

/// Applies the records of the dead journal `path` past its mark, and marks them.
fn fold_file(db: &Db, path: &Path, name: &str) -> Result<(), LedgerError> {
    let mark_row = db
        .row(
            "SELECT folded FROM journal_folds WHERE name=?1",
            params![name],
        )
        .map_err(st)?;
    let folded = mark_row.map_or(Ok(0), |r| r.int(0)).map_err(st)?;
    let folded = u64::try_from(folded).unwrap_or(0);
    let bytes = std::fs::read(path)
        .map_err(|e| LedgerError::Storage(format!("ledger journal {}: {e}", path.display())))?;
    let mut last = folded;
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let rec: In = match serde_json::from_slice(line) {
            Ok(r) => r,
            Err(e) => {
                // Never answered (torn by the crash): nothing after it was written either.
                tracing::warn!(
                    "ledger journal {}: a torn record dropped: {e}",
                    path.display()
                );
                break;
            }
        };
        if rec.seq <= last {
            continue;
        }
        apply(db, &rec)?;
        last = rec.seq;
    }
    if last != folded {
        mark(db, name, last)?;
    }
    Ok(())
}

/// One record's rows, stored.
fn apply(db: &Db, rec: &In) -> Result<(), LedgerError> {
    for a in &rec.a {
        put_account(db, a)?;
    }
    for r in &rec.add {
        put_reservation(db, r)?;
    }
    for (t, id) in &rec.del {
        drop_reservation(db, t, *id)?;
    }
    Ok(())
}

/// After the transaction that folded them committed: the dead journals go.
pub(super) fn remove_folded(files: Vec<PathBuf>) {
    for f in files {
        if let Err(e) = std::fs::remove_file(&f) {
            tracing::warn!(
                "ledger journal {}: folded but not removed: {e}",
                f.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::money::Nanos;

    fn account(id: &ThreadId, spent: i64) -> Account {
        Account {
            id: id.clone(),
            parent: None,
            max: Nanos(1_000),
            spent: Nanos(spent),
            own_spent: Nanos(spent),
            inflight: Nanos::ZERO,
            guaranteed: Nanos::ZERO,
            pool_left: Nanos::ZERO,
            closed: false,
            owner: 7,
            placed: false,
        }
    }

    fn reservation(id: u64, on: &ThreadId) -> Reservation {
        Reservation {
            id: ReservationId(id),
            chain: vec![on.clone()],
            amount: Nanos(10),
            edges: vec![],
        }
    }

    fn spent(db: &Db, id: &ThreadId) -> i64 {
        let a = super::super::db::account(db, id).unwrap().unwrap();
        a.spent.0
    }

    fn reservations(db: &Db) -> i64 {
        let row = db.row("SELECT COUNT(*) FROM reservations", &[]);
        row.unwrap().unwrap().int(0).unwrap()
    }

    fn commit(db: &mut Db, f: impl FnOnce(&Db) -> Result<(), LedgerError>) {
        db.begin_write(crate::sql::Lock::Ledger).unwrap();
        f(db).unwrap();
        db.commit().unwrap();
    }

    fn fold_all_dead(db: &mut Db, dir: &Path) {
        commit(db, |db| fold_dead(db, dir, &|_| false).map(remove_folded));
    }

    /// A dead runtime's journal is folded in order, a torn last record dropped; a live one's
    /// is left alone.
    #[test]
    fn a_dead_journal_is_folded_in_order_without_its_torn_tail() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ledger.journal");
        let mut db = super::super::open_db(None, &tmp.path().join("ledger.db")).unwrap();
        let t = ThreadId::generate("t");
        let mut j = Journal::new(dir.clone(), false);
        let (r1, r2) = (reservation(1, &t), reservation(2, &t));
        j.append(vec![&account(&t, 1)], vec![&r1], &[]).unwrap();
        j.append(vec![&account(&t, 2)], vec![&r2], &[(t.clone(), r1.id)])
            .unwrap();
        commit(&mut db, |db| {
            fold_dead(db, &dir, &|_| true).map(|f| assert!(f.is_empty()))
        });
        assert!(
            super::super::db::account(&db, &t).unwrap().is_none(),
            "a live owner's journal is its own"
        );
        // A record torn by the crash: never answered, dropped.
        let path = j.path();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(br#"{"seq":3,"a":[{"id":"#).unwrap();
        fold_all_dead(&mut db, &dir);
        assert_eq!(spent(&db, &t), 2);
        assert_eq!(reservations(&db), 1, "r1 added then settled, r2 open");
        assert!(!path.exists(), "a folded dead journal is removed");
    }

    /// A journal folded by its own runtime, then left whole (the process died before emptying
    /// it): its records are at or below the mark and never applied again — a row written after
    /// the fold (a tree taken over) is not rolled back.
    #[test]
    fn a_record_at_or_below_the_mark_is_never_applied_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ledger.journal");
        let mut db = super::super::open_db(None, &tmp.path().join("ledger.db")).unwrap();
        let t = ThreadId::generate("t");
        let mut j = Journal::new(dir.clone(), false);
        j.append(vec![&account(&t, 1)], vec![], &[]).unwrap();
        commit(&mut db, |db| {
            put_account(db, &account(&t, 1))?;
            j.mark(db)
        });
        commit(&mut db, |db| put_account(db, &account(&t, 5)));
        j.append(vec![&account(&t, 6)], vec![], &[]).unwrap();
        fold_all_dead(&mut db, &dir);
        assert_eq!(spent(&db, &t), 6, "the record past the mark is applied");
        commit(&mut db, |db| put_account(db, &account(&t, 9)));
        // The same file again (as if its removal were lost): nothing past the mark.
        let mut again = Journal::new(dir.clone(), false);
        again.name = j.name.clone();
        again.append(vec![&account(&t, 1)], vec![], &[]).unwrap();
        again.append(vec![&account(&t, 2)], vec![], &[]).unwrap();
        fold_all_dead(&mut db, &dir);
        assert_eq!(
            spent(&db, &t),
            9,
            "records at or below the mark are never applied again"
        );
    }

    /// Bad bytes where a journal should be (a record of no JSON, of a reservation without a
    /// chain, of an id that is no thread id) are dropped with a warning, never a panic.
    #[test]
    fn garbage_in_a_journal_never_panics_and_stops_the_fold_there() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ledger.journal");
        std::fs::create_dir_all(&dir).unwrap();
        let mut db = super::super::open_db(None, &tmp.path().join("ledger.db")).unwrap();
        for (name, body) in [
            ("1-a", &b"\xff\xfe not json\n"[..]),
            (
                "2-b",
                br#"{"seq":1,"add":[{"id":1,"chain":[],"amount":1,"edges":[]}]}"#,
            ),
            ("3-c", br#"{"seq":1,"a":[{"id":"../etc"}]}"#),
            ("x-d", b"ignored: no owner"),
        ] {
            std::fs::write(dir.join(format!("{name}.jsonl")), body).unwrap();
        }
        fold_all_dead(&mut db, &dir);
        assert_eq!(reservations(&db), 0);
        assert!(
            dir.join("x-d.jsonl").exists(),
            "not a journal's name: left alone"
        );
    }
}
