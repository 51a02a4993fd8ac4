//! The state directory's JSON-lines files (`quality.jsonl`, `rollbacks.jsonl`): appended one
//! synced line at a time, read back whole lines only — a torn last line, as a crash mid-write
//! leaves, is cut off so the next append starts a line of its own — and rewritten aside and
//! renamed over when compacted.

use std::io::Write as _;
use std::path::Path;

/// The whole lines of `path` (empty when it does not exist), its torn tail cut from the file.
pub(crate) fn read(path: &Path) -> std::io::Result<String> {
    let mut text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e),
    };
    let whole = text.rfind('\n').map_or(0, |i| i + 1);
    if whole < text.len() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .set_len(whole as u64)?;
        text.truncate(whole);
    }
    Ok(text)
}

/// Appends `line` to `path` and syncs it before returning.
pub(crate) fn append(path: &Path, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(format!("{line}\n").as_bytes())?;
    f.sync_data()
}

/// Replaces `path` with `lines`: written to a file beside it, synced, renamed over it.
pub(crate) fn rewrite(path: &Path, lines: &[String]) -> std::io::Result<()> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    for l in lines {
        f.write_all(l.as_bytes())?;
        f.write_all(b"\n")?;
    }
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
