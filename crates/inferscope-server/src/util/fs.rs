//! Bounded reads of the files the gateway and its tools read at run time.
//!
//! A path an operator gives (a certificate, a key, a CA bundle, a key file, the config, a
//! dataset) can point anywhere after a mistaken symlink during a rotation: `/dev/zero`, a FIFO
//! nobody writes, a multi-gigabyte log. `read` refuses anything that is not a regular file before
//! opening it (opening a FIFO would block until a writer comes), checks the open file again, and
//! never reads more than its cap: a file past it is an error that names the path and the cap, and
//! the caller keeps what it had.

use std::io::{self, Read};
use std::path::Path;

/// Certificates, private keys and CA bundles (the Mozilla bundle is ~220 KiB).
pub const PEM_CAP: u64 = 8 << 20;
/// Config files.
pub const CONFIG_CAP: u64 = 16 << 20;
/// Secret files holding one key or token.
pub const SECRET_CAP: u64 = 64 << 10;
/// Datasets, result files and access logs read by the tools (ShareGPT's released file is ~650 MiB).
pub const DATA_CAP: u64 = 4 << 30;

fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

fn not_regular(meta: &std::fs::Metadata) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("is {}, not a regular file", kind(meta)),
    )
}

fn too_large(cap: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("is larger than {cap} bytes, the most read from such a file"),
    )
}

/// Opens `path` for reading if it is a regular file (symlinks followed) of at most `cap` bytes.
/// The returned reader stops at `cap + 1` bytes, so a file that grows past the cap while it is
/// read is still caught by `read`.
pub fn open(path: &Path, cap: u64) -> io::Result<io::Take<std::fs::File>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    if meta.len() > cap {
        return Err(too_large(cap));
    }
    let file = std::fs::File::open(path)?;
    // The path may have been swapped between the check and the open.
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    Ok(file.take(cap + 1))
}

/// The whole file at `path`, if it is a regular file of at most `cap` bytes. Blocking.
pub fn read(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let mut reader = open(path, cap)?;
    let mut buf = Vec::new();
    reader.read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Err(too_large(cap));
    }
    Ok(buf)
}

/// `read` as UTF-8 text.
pub fn read_to_string(path: &Path, cap: u64) -> io::Result<String> {
    String::from_utf8(read(path, cap)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn regular_files_within_the_cap_are_read_and_others_refused() {
        let dir = std::env::temp_dir().join(format!("inferscope-fs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let small = dir.join("small");
        std::fs::write(&small, b"0123456789").unwrap();
        assert_eq!(read(&small, 10).unwrap(), b"0123456789");
        let e = read(&small, 9).unwrap_err().to_string();
        assert!(e.contains("larger than 9 bytes"), "{e}");
        let e = read(&dir, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        #[cfg(unix)]
        {
            let link = dir.join("zero");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            let e = read(&link, 1 << 20).unwrap_err().to_string();
            assert!(e.contains("character device"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
