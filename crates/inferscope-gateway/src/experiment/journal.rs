//! The state directory's JSON-lines files (`quality.jsonl`, `rollbacks.jsonl`,
//! `verdicts.jsonl`) and the feedback log: read back whole lines only, appended and compacted by
//! a thread of their own.
//!
//! What a journal must not do is take the gateway with it. Its file is on a disk the gateway
//! does not control: the disk may be full, read-only, slow or hung (NFS), and the path may have
//! been swapped for a FIFO or `/dev/zero`. So:
//! - **Reading** (at start) is bounded: a regular file of at most `MAX_BYTES`, else an error
//!   that names the path; a line that is not UTF-8 or JSON is skipped and counted; a torn last
//!   line (a crash mid-write) is cut off.
//! - **Writing** happens on the journal's own thread, never on a runtime worker: a hung write
//!   stops that thread only. A caller that must know the line is on disk before it answers
//!   (`append_synced`: a posted result, a reset) waits at most `SYNC_WAIT`, then is told it was
//!   not kept; the rest (`append`: trips, promotions, decisions) is queued and, when the queue
//!   is full, dropped and counted. Each write opens the file without blocking (a FIFO is
//!   refused, not waited on), checks it is a regular file, appends one line and syncs it; a
//!   write that fails midway (ENOSPC) is cut back, so the next line starts a line of its own.
//! - **Compaction** runs on the same thread past `MAX_LINES` lines or `COMPACT_BYTES` bytes:
//!   the file's text is reduced by the journal's own rule, written aside, synced and renamed
//!   over it.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Largest journal read back at start; a bigger one is refused with an error naming it (the
/// gateway never writes one: it compacts at `COMPACT_BYTES`).
pub const MAX_BYTES: u64 = 64 << 20;
/// Bytes past which a journal is compacted.
pub const COMPACT_BYTES: u64 = 16 << 20;
/// Lines past which a journal is compacted.
pub const MAX_LINES: usize = 4096;
/// How long a caller waits for its line to be on disk.
pub const SYNC_WAIT: Duration = Duration::from_secs(5);
/// Lines queued for the writer at most; past it, `append` drops and counts.
const QUEUE: usize = 1024;

/// A journal's rule for compaction: the text it holds now → the lines that keep what is in
/// force.
pub type Compact = fn(&str) -> Vec<String>;

/// What a journal held when it was opened.
#[derive(Debug, Default)]
pub struct ReadBack {
    /// Its whole, valid UTF-8 lines, each ending in `\n`.
    pub text: String,
    /// Lines skipped: not UTF-8 (a torn multi-byte character, a stray byte).
    pub invalid: usize,
    /// A torn last line was cut off.
    pub torn: bool,
}

/// Writes of one journal, by outcome.
#[derive(Debug, Default)]
pub struct Counts {
    /// Lines on disk (synced).
    pub written: AtomicU64,
    /// Writes that failed (the file could not be opened, written or synced).
    pub failed: AtomicU64,
    /// Lines dropped before being tried: the writer's queue was full, or a caller stopped
    /// waiting before the writer reached its line.
    pub dropped: AtomicU64,
}

enum Op {
    Append {
        line: String,
        /// Skip the write when the writer reaches it after this (the caller has stopped
        /// waiting and said it was not kept).
        deadline: Option<Instant>,
        done: Option<tokio::sync::oneshot::Sender<io::Result<()>>>,
    },
    /// Answered once every line queued before it has been tried.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// One JSON-lines file and the thread that writes it.
#[derive(Debug)]
pub struct Journal {
    /// Its name in metrics and messages (`quality.jsonl`…).
    pub name: &'static str,
    path: PathBuf,
    tx: mpsc::SyncSender<Op>,
    /// Its writes by outcome.
    pub counts: Arc<Counts>,
}

impl Journal {
    /// Opens `path` (`name` in metrics and messages): reads back what it holds and starts its
    /// writer. `compact` reduces it past `MAX_LINES` or `COMPACT_BYTES` (`None`: never, for a
    /// log the operator keeps). Blocking; refuses a path that is not a regular file or larger
    /// than `MAX_BYTES`.
    pub fn open(
        path: &Path,
        name: &'static str,
        compact: Option<Compact>,
    ) -> io::Result<(Self, ReadBack)> {
        let back = read(path).map_err(|e| named(path, &e))?;
        let lines = back.text.lines().count();
        let bytes = back.text.len() as u64;
        Ok((Self::start(path, name, lines, bytes, compact)?, back))
    }

    /// Opens `path` as a log the operator keeps (never read back, never compacted), checking
    /// now that it can be appended to.
    pub fn log(path: &Path, name: &'static str) -> io::Result<Self> {
        drop(open_append(path).map_err(|e| named(path, &e))?);
        Self::start(path, name, 0, 0, None)
    }

    fn start(
        path: &Path,
        name: &'static str,
        lines: usize,
        bytes: u64,
        compact: Option<Compact>,
    ) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let counts = Arc::new(Counts::default());
        let mut writer = Writer {
            path: path.to_owned(),
            name,
            lines,
            bytes,
            compact,
            counts: Arc::clone(&counts),
            cut_to: None,
        };
        std::thread::Builder::new()
            .name(format!("journal-{name}"))
            .spawn(move || {
                while let Ok(op) = rx.recv() {
                    writer.run(op);
                }
            })?;
        Ok(Self {
            name,
            path: path.to_owned(),
            tx,
            counts,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `line`; it is written and synced in order with the journal's other lines. Never
    /// waits: with the queue full, the line is dropped and counted.
    pub fn append(&self, line: String) {
        let op = Op::Append {
            line,
            deadline: None,
            done: None,
        };
        if self.tx.try_send(op).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(file = %self.path.display(), "{}: a line was dropped (its writer is behind: is the disk slow or full?)", self.name);
        }
    }

    /// Waits (at most `SYNC_WAIT`) until every line queued so far has been tried: at shutdown,
    /// so what the gateway did last is on disk for the next start. False when it took longer.
    pub async fn flush(&self) -> bool {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.tx.try_send(Op::Flush(done)).is_err() {
            return false;
        }
        matches!(tokio::time::timeout(SYNC_WAIT, wait).await, Ok(Ok(())))
    }

    /// Appends `line` and waits (at most `SYNC_WAIT`) until it is on disk: `Ok` only then.
    pub async fn append_synced(&self, line: String) -> io::Result<()> {
        let (done, wait) = tokio::sync::oneshot::channel();
        let op = Op::Append {
            line,
            deadline: Some(Instant::now() + SYNC_WAIT),
            done: Some(done),
        };
        if self.tx.try_send(op).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "its writer is behind (is the disk slow or hung?)",
            ));
        }
        match tokio::time::timeout(SYNC_WAIT + Duration::from_millis(100), wait).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(io::Error::other("its writer stopped")),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("not on disk within {} s", SYNC_WAIT.as_secs()),
            )),
        }
    }
}

/// The writer thread's side.
struct Writer {
    path: PathBuf,
    name: &'static str,
    lines: usize,
    bytes: u64,
    compact: Option<Compact>,
    counts: Arc<Counts>,
    /// A write failed midway and the file could not be cut back to this length: cut it before
    /// the next line.
    cut_to: Option<u64>,
}

impl Writer {
    fn run(&mut self, op: Op) {
        let (line, deadline, done) = match op {
            Op::Append {
                line,
                deadline,
                done,
            } => (line, deadline, done),
            Op::Flush(done) => {
                let _ = done.send(());
                return;
            }
        };
        if deadline.is_some_and(|d| Instant::now() > d) {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            if let Some(done) = done {
                let _ = done.send(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "not written: the writer reached it too late",
                )));
            }
            return;
        }
        let r = self.append(&line);
        match &r {
            Ok(()) => {
                self.counts.written.fetch_add(1, Ordering::Relaxed);
                self.lines += 1;
                self.bytes += line.len() as u64 + 1;
            }
            Err(e) => {
                self.counts.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(file = %self.path.display(), "{}: a line could not be kept: {e}", self.name);
            }
        }
        if let Some(done) = done {
            let _ = done.send(r);
        }
        if self.lines > MAX_LINES || self.bytes > COMPACT_BYTES {
            self.compact();
        }
    }

    fn append(&mut self, line: &str) -> io::Result<()> {
        let mut f = open_append(&self.path)?;
        if let Some(len) = self.cut_to {
            f.set_len(len)?;
            self.cut_to = None;
        }
        let before = f.metadata()?.len();
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        let written = f.write_all(&buf).and_then(|()| f.sync_data());
        if let Err(e) = written {
            // Cut back what got out, so the next line does not continue this one.
            if f.set_len(before).is_err() {
                self.cut_to = Some(before);
            }
            return Err(e);
        }
        Ok(())
    }

    fn compact(&mut self) {
        let Some(rule) = self.compact else {
            return;
        };
        let back = match read(&self.path) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(file = %self.path.display(), "{} could not be read to compact it: {e}", self.name);
                return;
            }
        };
        let keep = rule(&back.text);
        match rewrite(&self.path, &keep) {
            Ok(()) => {
                self.lines = keep.len();
                self.bytes = keep.iter().map(|l| l.len() as u64 + 1).sum();
            }
            Err(e) => {
                tracing::warn!(file = %self.path.display(), "{} could not be compacted: {e}", self.name);
                // Tried again after as many lines again, not at every line.
                self.lines = 0;
                self.bytes = 0;
            }
        }
    }
}

/// `e`, saying which file.
fn named(path: &Path, e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Opens `path` to append without blocking (a FIFO with no reader is refused at once, one with
/// a reader is refused as not a regular file), creating it if missing.
fn open_append(path: &Path) -> io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    let f = o.open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(f)
}

/// What `path` holds (empty when it does not exist): bounded, whole lines only, lines that are
/// not UTF-8 skipped, a torn tail cut from the file.
fn read(path: &Path) -> io::Result<ReadBack> {
    let bytes = match crate::util::fs::read(path, MAX_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ReadBack::default()),
        Err(e) => return Err(e),
    };
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut back = ReadBack {
        torn: whole < bytes.len(),
        ..ReadBack::default()
    };
    if back.torn {
        // The next append must start a line of its own. A read-only file keeps its tail: the
        // next write would fail anyway, and say so.
        let cut = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.set_len(whole as u64));
        if let Err(e) = cut {
            tracing::warn!(file = %path.display(), "its torn last line could not be cut: {e}");
        }
    }
    for line in bytes[..whole].split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        match std::str::from_utf8(line) {
            Ok(l) => {
                back.text.push_str(l);
                back.text.push('\n');
            }
            Err(_) => back.invalid += 1,
        }
    }
    if back.invalid > 0 {
        tracing::warn!(file = %path.display(), lines = back.invalid, "lines that are not UTF-8 were skipped");
    }
    Ok(back)
}

/// Replaces `path` with `lines`: written to a file beside it, synced, renamed over it.
fn rewrite(path: &Path, lines: &[String]) -> io::Result<()> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    for l in lines {
        f.write_all(l.as_bytes())?;
        f.write_all(b"\n")?;
    }
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn dir() -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "inferscope-journal-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn torn_and_invalid_lines_are_skipped_and_the_next_line_starts_its_own() {
        let d = dir();
        let p = d.join("j.jsonl");
        // A valid line, one with a stray byte, and a tail torn inside a multi-byte character.
        std::fs::write(&p, b"{\"a\":1}\n{\"b\":\xff}\n{\"c\":\"\xe2\x82").unwrap();
        let (j, back) = Journal::open(&p, "j", None).unwrap();
        assert_eq!(
            (back.text.as_str(), back.invalid, back.torn),
            ("{\"a\":1}\n", 1, true)
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(j.append_synced("{\"d\":2}".into())).unwrap();
        assert_eq!(
            std::fs::read(&p).unwrap(),
            b"{\"a\":1}\n{\"b\":\xff}\n{\"d\":2}\n"
        );
    }

    #[test]
    fn compaction_keeps_what_the_rule_keeps() {
        let d = dir();
        let p = d.join("j.jsonl");
        let (j, _) = Journal::open(
            &p,
            "j",
            Some(|t: &str| t.lines().rev().take(2).map(str::to_owned).collect()),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        for i in 0..=MAX_LINES {
            // Every 500th waits for the writer (the queue holds 1024).
            if i == MAX_LINES || i % 500 == 499 {
                rt.block_on(j.append_synced(format!("{i}"))).unwrap();
            } else {
                j.append(format!("{i}"));
            }
        }
        // The writer compacts right after the line that crossed the bound; poll for it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let t = std::fs::read_to_string(&p).unwrap();
            if t.lines().count() == 2 {
                assert_eq!(t, format!("{}\n{}\n", MAX_LINES, MAX_LINES - 1));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not compacted: {} lines",
                t.lines().count()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            j.counts.written.load(Ordering::Relaxed),
            MAX_LINES as u64 + 1
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_or_a_device_is_refused_not_waited_on() {
        let d = dir();
        let fifo = d.join("fifo.jsonl");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mkfifo (coreutils) is needed");
        let e = Journal::open(&fifo, "j", None).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        assert!(open_append(&fifo).is_err());
        let zero = d.join("zero.jsonl");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = Journal::open(&zero, "j", None).unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");
    }
}
