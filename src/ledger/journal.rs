//! The ledger's write-ahead journal (SPEC §5: "an equally atomic in-memory step with
//! write-ahead persistence"), on SQLite only. A batch of reservations, settlements and the
//! opens and closes of accounts inside a held tree — a turn's ledger work, a child's start and
//! end — is answered once one record of it is handed to the OS (and fsynced under
//! `durability: strict`), instead of after an SQLite transaction. What other processes decide
//! on still commits: a tree's first account (the tree is held), the close that finishes a tree
//! (it is free to take), a budget set aside, adopted or placed. Each commit folds the journal
//! into ledger.db with it; so does every `FOLD_EVERY`th record, a stop, and anything that reads
//! ledger.db for a decision (taking a tree over, reopening a chain).
//!
//! A record holds the rows the batch leaves (accounts as they are now, reservations added and
//! removed), so folding one is idempotent and needs no accounting. `journal_folds` in ledger.db
//! says, per journal, the last record folded, written in the fold's own transaction: a record
//! at or below it is never applied again, so a journal truncated late never rolls a row back.
//!
//! Each runtime has its own file, `state/ledger.journal/<owner>-<nonce>.jsonl` (runtimes in one
//! process share an owner). A journal is dead when its owner is gone — or, named with this
//! process's owner, when no runtime of this process keeps it: it was left by an earlier process
//! that had the same pid (in a container every run may be pid 1), or by a runtime of this one
//! that stopped. The next runtime to open the ledger, or to take a tree over, folds the dead
//! journals under the ledger's write lock, before it reads what they held. A torn last record
//! (no line end: the write was cut) was never answered and is dropped; an unreadable whole
//! record is an error that names the file and line, and the file is kept.

use super::db::{drop_reservations, put_accounts, put_reservations, st};
use super::names::{is_dead, kept, listed};
use super::{Account, LedgerError, Reservation, ReservationId};
use crate::core::ids::ThreadId;
use crate::sql::{params, Db};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Records between two folds (again as many after a fold that failed).
const FOLD_EVERY: u64 = 256;

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
    /// Fold when this many records are unfolded.
    fold_at: u64,
    buf: Vec<u8>,
}

impl Drop for Journal {
    fn drop(&mut self) {
        if let Ok(mut k) = kept().lock() {
            k.remove(&self.name);
        }
    }
}

impl Journal {
    /// A journal in `dir`, named for this process and a fresh nonce (nothing is created yet).
    pub(super) fn new(dir: PathBuf, strict: bool) -> Journal {
        static RUNTIMES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut nonce = [0u8; 6];
        let _ = getrandom::fill(&mut nonce);
        let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        // Unique in the process even if the random bytes were not.
        let nth = RUNTIMES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{}-{nonce}{nth}", crate::core::owner::me());
        if let Ok(mut k) = kept().lock() {
            k.insert(name.clone());
        }
        Journal {
            dir,
            name,
            file: None,
            len: 0,
            seq: 0,
            folded: 0,
            strict,
            broken: false,
            fold_at: FOLD_EVERY,
            buf: Vec::new(),
        }
    }

    /// Whether enough records are unfolded to fold them now.
    pub(super) fn due(&self) -> bool {
        self.unfolded() >= self.fold_at
    }

    /// A fold failed: the next is tried after as many records again (each try may wait out the
    /// database's busy timeout).
    pub(super) fn put_off(&mut self) {
        self.fold_at = self.unfolded() + FOLD_EVERY;
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
        // Taken even if the write fails: a whole record that could not be cut back is then at
        // or below the next fold's mark, never applied over what that fold stored.
        self.seq += 1;
        self.buf.clear();
        let seq = self.seq;
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
        Ok(())
    }

    fn path(&self) -> PathBuf {
        self.dir.join(format!("{}.jsonl", self.name))
    }

    fn write(&mut self) -> std::io::Result<()> {
        if self.file.is_none() {
            self.file = Some(self.create()?);
        }
        let Some(f) = self.file.as_mut() else {
            return Err(std::io::Error::other("no journal file"));
        };
        if crate::core::failpoint::fails("ledger.journal") {
            // A write cut halfway, as a full disk leaves it.
            f.write_all(&self.buf[..self.buf.len() / 2])?;
            return Err(std::io::Error::other("failpoint ledger.journal"));
        }
        f.write_all(&self.buf)?;
        if self.strict {
            f.sync_data()?;
        }
        Ok(())
    }

    fn create(&self) -> std::io::Result<File> {
        let new_dir = !self.dir.exists();
        std::fs::create_dir_all(&self.dir)?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(self.path())?;
        if self.strict {
            // The file's name (and its folder's) must outlive a power cut as surely as its
            // records; if that cannot be made sure, the file goes (the next append tries anew).
            let synced = File::open(&self.dir).and_then(|d| d.sync_all());
            let synced = match (synced, new_dir, self.dir.parent()) {
                (Ok(()), true, Some(up)) => File::open(up).and_then(|d| d.sync_all()),
                (other, ..) => other,
            };
            if let Err(e) = synced {
                let _ = std::fs::remove_file(self.path());
                return Err(e);
            }
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
        self.fold_at = FOLD_EVERY;
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

/// The journals in `dir` that are dead, with their names.
fn dead(dir: &Path, alive: &(dyn Fn(u32) -> bool + Send + Sync)) -> Vec<(PathBuf, String)> {
    let listed = listed(dir).unwrap_or_default().into_iter();
    let gone = listed.filter(|(_, name, owner)| is_dead(*owner, name, alive));
    gone.map(|(path, name, _)| (path, name)).collect()
}

/// Folds into ledger.db, inside the caller's write transaction, the journals in `dir` that are
/// dead: each record past its mark, in order. Returns the files to delete once that
/// transaction has committed.
pub(super) fn fold_dead(
    db: &Db,
    dir: &Path,
    alive: &(dyn Fn(u32) -> bool + Send + Sync),
) -> Result<Vec<PathBuf>, LedgerError> {
    fold_listed(db, dead(dir, alive))
}

/// [`fold_dead`] for the dead journals already listed.
fn fold_listed(db: &Db, dead: Vec<(PathBuf, String)>) -> Result<Vec<PathBuf>, LedgerError> {
    let mut done = Vec::new();
    for (path, name) in dead {
        if fold_file(db, &path, &name)? {
            done.push(path);
        }
    }
    Ok(done)
}

/// Folds the dead journals in `dir` into ledger.db, in a transaction of its own (when a runtime
/// opens the ledger, before it reads it), and forgets the marks of journals that are gone.
pub(super) fn fold_dead_now(
    db: &mut Db,
    dir: &Path,
    alive: &(dyn Fn(u32) -> bool + Send + Sync),
) -> Result<(), LedgerError> {
    let dead = dead(dir, alive);
    if dead.is_empty() {
        return Ok(());
    }
    let files = db.atomic(crate::sql::Lock::Ledger, |db| {
        let files = fold_listed(db, dead)?;
        forget_gone_marks(db, dir)?;
        Ok::<_, LedgerError>(files)
    })?;
    remove_folded(files);
    Ok(())
}

/// Deletes the marks of journals whose file is gone (folded and removed; names are never used
/// twice), under the ledger's write lock.
fn forget_gone_marks(db: &Db, dir: &Path) -> Result<(), LedgerError> {
    let rows = db
        .query("SELECT name FROM journal_folds", &[])
        .map_err(st)?;
    for row in rows {
        let name = row.text(0).map_err(st)?;
        if !dir.join(format!("{name}.jsonl")).exists() {
            db.execute_later(
                "DELETE FROM journal_folds WHERE name=?1",
                params![name.as_str()],
            )
            .map_err(st)?;
        }
    }
    Ok(())
}

/// Applies the records of the dead journal `path` past its mark, and marks them. False when the
/// file is gone (another process folded and removed it meanwhile).
fn fold_file(db: &Db, path: &Path, name: &str) -> Result<bool, LedgerError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            let shown = path.display();
            return Err(LedgerError::Storage(format!("ledger journal {shown}: {e}")));
        }
    };
    let mark_row = db
        .row(
            "SELECT folded FROM journal_folds WHERE name=?1",
            params![name],
        )
        .map_err(st)?;
    let folded = mark_row.map_or(Ok(0), |r| r.int(0)).map_err(st)?;
    let folded = u64::try_from(folded).unwrap_or(0);
    let mut last = folded;
    for (n, line) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
        if line == b"\n" {
            continue;
        }
        let Some(line) = line.strip_suffix(b"\n") else {
            // Cut by the crash before its line end: never answered.
            tracing::warn!(
                "ledger journal {}: a torn last record dropped",
                path.display()
            );
            break;
        };
        let rec: In = serde_json::from_slice(line).map_err(|e| {
            LedgerError::Storage(format!(
                "ledger journal {} line {}: unreadable ({e}); the ledger cannot know what it held: move the file aside to go on without it (a call it reserved is then not charged)",
                path.display(),
                n + 1
            ))
        })?;
        if rec.seq <= last {
            continue;
        }
        apply(db, &rec)?;
        last = rec.seq;
    }
    if last != folded {
        mark(db, name, last)?;
    }
    Ok(true)
}

/// One record's rows, stored.
fn apply(db: &Db, rec: &In) -> Result<(), LedgerError> {
    put_accounts(db, &rec.a.iter().collect::<Vec<_>>())?;
    let add: Vec<&Reservation> = rec
        .add
        .iter()
        .filter(|r| super::db::well_formed(r))
        .collect();
    put_reservations(db, &add)?;
    drop_reservations(db, rec.del.iter().map(|(t, id)| (t, *id)))
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
    use super::super::names::is_kept;
    use super::*;
    use crate::core::money::Nanos;

    use super::super::db::tests::account;

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
        db.atomic(crate::sql::Lock::Ledger, |db| f(db)).unwrap();
    }

    /// A folder for ledger.db and the journals (kept while the first is), the journals' folder,
    /// and ledger.db.
    fn setup() -> (tempfile::TempDir, PathBuf, Db) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ledger.journal");
        let db = super::super::open_db(None, &tmp.path().join("ledger.db")).unwrap();
        (tmp, dir, db)
    }

    fn fold_all_dead(db: &mut Db, dir: &Path) {
        commit(db, |db| fold_dead(db, dir, &|_| false).map(remove_folded));
    }

    /// A dead runtime's journal is folded in order, a torn last record dropped; a journal a
    /// runtime of this process keeps is left alone, whatever `alive` says of its pid.
    #[test]
    fn a_dead_journal_is_folded_in_order_without_its_torn_tail() {
        let (_tmp, dir, mut db) = setup();
        let t = ThreadId::generate("t");
        let mut j = Journal::new(dir.clone(), false);
        let (r1, r2) = (reservation(1, &t), reservation(2, &t));
        j.append(vec![&account(&t, 1)], vec![&r1], &[]).unwrap();
        j.append(vec![&account(&t, 2)], vec![&r2], &[(t.clone(), r1.id)])
            .unwrap();
        fold_all_dead(&mut db, &dir);
        assert!(
            super::super::db::account(&db, &t).unwrap().is_none(),
            "a kept journal is its runtime's own"
        );
        // The runtime is gone (its process had this pid: a container's pid 1 again), its last
        // record torn by the crash: never answered, dropped.
        let path = j.path();
        drop(j);
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
        let (_tmp, dir, mut db) = setup();
        let t = ThreadId::generate("t");
        let mut j = Journal::new(dir.clone(), false);
        j.append(vec![&account(&t, 1)], vec![], &[]).unwrap();
        commit(&mut db, |db| {
            put_accounts(db, &[&account(&t, 1)])?;
            j.mark(db)
        });
        commit(&mut db, |db| put_accounts(db, &[&account(&t, 5)]));
        j.append(vec![&account(&t, 6)], vec![], &[]).unwrap();
        let (name, path) = (j.name.clone(), j.path());
        drop(j);
        fold_all_dead(&mut db, &dir);
        assert_eq!(spent(&db, &t), 6, "the record past the mark is applied");
        commit(&mut db, |db| put_accounts(db, &[&account(&t, 9)]));
        // The same file again (as if its removal were lost): nothing past the mark.
        let mut again = Journal::new(dir.clone(), false);
        again.append(vec![&account(&t, 1)], vec![], &[]).unwrap();
        again.append(vec![&account(&t, 2)], vec![], &[]).unwrap();
        std::fs::rename(again.path(), &path).unwrap();
        drop(again);
        assert!(!is_kept(&name));
        fold_all_dead(&mut db, &dir);
        assert_eq!(
            spent(&db, &t),
            9,
            "records at or below the mark are never applied again"
        );
    }

    /// A record cut halfway by a failed write is cut off: the records after it are read back.
    #[test]
    fn a_failed_write_cut_back_leaves_the_journal_readable() {
        let (_tmp, dir, mut db) = setup();
        let t = ThreadId::generate("t");
        let mut j = Journal::new(dir.clone(), false);
        j.append(vec![&account(&t, 1)], vec![], &[]).unwrap();
        j.file
            .as_mut()
            .unwrap()
            .write_all(br#"{"seq":2,"a":[{"id":"half"#)
            .unwrap();
        j.seq += 1;
        j.cut_back();
        assert!(j.usable());
        j.append(vec![&account(&t, 3)], vec![], &[]).unwrap();
        drop(j);
        fold_all_dead(&mut db, &dir);
        assert_eq!(spent(&db, &t), 3);
    }

    /// A whole record that cannot be read (the disk damaged it) is an error naming the file and
    /// line, and the file is kept: the records after it were answered.
    #[test]
    fn an_unreadable_whole_record_is_an_error_and_the_journal_is_kept() {
        let (_tmp, dir, mut db) = setup();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("1-damaged.jsonl");
        std::fs::write(&path, b"{\"seq\":1}\n\xff\xfe not json\n{\"seq\":3}\n").unwrap();
        db.begin_write(crate::sql::Lock::Ledger).unwrap();
        let err = fold_dead(&db, &dir, &|_| false).unwrap_err().to_string();
        db.rollback();
        assert!(err.contains("1-damaged.jsonl line 2"), "{err}");
        assert!(path.exists());
        let err = fold_dead_now(&mut db, &dir, &|_| false).unwrap_err();
        assert!(err.to_string().contains("move the file aside"), "{err}");
    }

    /// Bad bytes where a journal should be (a reservation without a chain or with edges that
    /// do not fit it, an id that is no thread id, a name of no owner) never panic.
    #[test]
    fn garbage_in_a_journal_never_panics() {
        let (_tmp, dir, mut db) = setup();
        std::fs::create_dir_all(&dir).unwrap();
        let t = ThreadId::generate("t");
        let bad_edges = format!(
            r#"{{"seq":2,"add":[{{"id":2,"chain":["{t}"],"amount":1,"edges":[[1,1],[1,1]]}}]}}"#
        );
        for (name, body) in [
            (
                "2-b",
                format!(
                    r#"{{"seq":1,"add":[{{"id":1,"chain":[],"amount":1,"edges":[]}}]}}{}"#,
                    "\n"
                ),
            ),
            ("3-c", format!("{bad_edges}\n")),
            ("4-d", format!("{}\n", r#"{"seq":1,"a":[{"id":"../etc"}]}"#)),
            ("x-e", "ignored: no owner".to_string()),
        ] {
            std::fs::write(dir.join(format!("{name}.jsonl")), body).unwrap();
        }
        let err = fold_dead_now(&mut db, &dir, &|_| false);
        assert!(err.is_err(), "a whole record of no account is unreadable");
        std::fs::remove_file(dir.join("4-d.jsonl")).unwrap();
        fold_dead_now(&mut db, &dir, &|_| false).unwrap();
        assert_eq!(
            reservations(&db),
            0,
            "neither malformed reservation is stored"
        );
        assert!(
            dir.join("x-e.jsonl").exists(),
            "not a journal's name: left alone"
        );
    }
}
