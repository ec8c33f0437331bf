//! Client processes of the drivers: the driver re-executes its own binary
//! with a hidden child flag, and talks to the child over a line protocol on
//! its stdin/stdout (the child's stderr goes to the driver's stderr).
//!
//! Lines the driver reads are tagged (`READY`, `RESULT {json}`, ...); any
//! other line a child prints is passed through to the driver's stderr. Every
//! wait has a timeout: a child that hangs is a typed error, never a hang of
//! the driver.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Why talking to a child failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcError {
    /// The child could not be started.
    #[error("spawn a client process: {0}")]
    Spawn(std::io::Error),
    /// The child's stdin is closed (it exited).
    #[error("client process {pid}: write to it: {source}")]
    Write {
        /// The child's pid.
        pid: u32,
        /// The I/O error.
        source: std::io::Error,
    },
    /// No line with the tag came in time.
    #[error("client process {pid}: no {tag} line within {timeout:?}")]
    Timeout {
        /// The child's pid.
        pid: u32,
        /// The tag waited for.
        tag: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// The child closed its stdout (exited) before sending the line.
    #[error("client process {pid} exited before its {tag} line ({status})")]
    Exited {
        /// The child's pid.
        pid: u32,
        /// The tag waited for.
        tag: String,
        /// Its exit status, as far as known.
        status: String,
    },
}

/// A running child process with its line channel.
#[derive(Debug)]
pub struct ChildProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl ChildProc {
    /// Starts `cmd` with piped stdin and stdout (stderr inherited).
    ///
    /// # Errors
    /// [`ProcError::Spawn`].
    pub fn spawn(mut cmd: Command) -> Result<ChildProc, ProcError> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(ProcError::Spawn)?;
        let stdout = child.stdout.take().ok_or_else(|| {
            ProcError::Spawn(std::io::Error::other("the child has no stdout pipe"))
        })?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("child-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(ProcError::Spawn)?;
        let stdin = child.stdin.take();
        Ok(ChildProc {
            child,
            stdin,
            lines: rx,
        })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a line `TAG` or `TAG rest` and returns `rest` (empty for a
    /// bare tag); other lines go to stderr.
    ///
    /// # Errors
    /// [`ProcError::Timeout`] or [`ProcError::Exited`].
    pub fn expect(&mut self, tag: &str, timeout: Duration) -> Result<String, ProcError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if line == tag {
                        return Ok(String::new());
                    }
                    if let Some(rest) = line.strip_prefix(tag).and_then(|r| r.strip_prefix(' ')) {
                        return Ok(rest.to_string());
                    }
                    eprintln!("[client {}] {line}", self.pid());
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(ProcError::Timeout {
                        pid: self.pid(),
                        tag: tag.into(),
                        timeout,
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = match self.child.wait() {
                        Ok(s) => s.to_string(),
                        Err(e) => e.to_string(),
                    };
                    return Err(ProcError::Exited {
                        pid: self.pid(),
                        tag: tag.into(),
                        status,
                    });
                }
            }
        }
    }

    /// Sends one line.
    ///
    /// # Errors
    /// [`ProcError::Write`].
    pub fn send(&mut self, line: &str) -> Result<(), ProcError> {
        let pid = self.pid();
        let stdin = self.stdin.as_mut().ok_or_else(|| ProcError::Write {
            pid,
            source: std::io::Error::other("stdin already closed"),
        })?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|source| ProcError::Write { pid, source })
    }

    /// Whether the child has exited (by itself or killed).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGKILLs the child and reaps it; returns the time (microseconds since
    /// the epoch) by which it was certainly dead.
    pub fn kill(&mut self) -> u64 {
        let _ = self.child.kill();
        let _ = self.child.wait();
        epoch_us()
    }

    /// Waits for the child to exit (after its last line), at most `timeout`;
    /// kills it past that. Returns whether it exited successfully by itself.
    pub fn finish(&mut self, timeout: Duration) -> bool {
        self.stdin.take();
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return s.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    self.kill();
                    return false;
                }
            }
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// Microseconds since the Unix epoch (the time base shared by the driver
/// and its client processes).
pub fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// What the scheduler says about the calling thread so far (Linux
/// `/proc/thread-self/schedstat`): time it ran and time it waited on a
/// run queue, runnable but not running. A stage that took long with most
/// of it waiting was starved of CPU (the machine oversubscribed), not slow
/// in its own code; one that took long with neither was blocked, and its
/// major page faults (`/proc/thread-self/stat`: pages read from disk, the
/// binary's own code among them) tell a wait for the disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchedSample {
    /// Microseconds on a CPU.
    pub cpu_us: u64,
    /// Microseconds runnable, waiting for a CPU.
    pub wait_us: u64,
    /// Major page faults so far (`None` where the kernel does not say).
    #[serde(default)]
    pub major_faults: Option<u64>,
}

impl SchedSample {
    /// The calling thread's figures; `None` where the kernel does not
    /// report them (no schedstat, another OS).
    pub fn now() -> Option<SchedSample> {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
        SchedSample::parse(&text).map(|s| SchedSample {
            major_faults: major_faults(&stat),
            ..s
        })
    }

    /// Parses a schedstat line: `cpu_ns wait_ns timeslices`.
    pub fn parse(text: &str) -> Option<SchedSample> {
        let mut f = text.split_ascii_whitespace().map(str::parse::<u64>);
        let cpu = f.next()?.ok()?;
        let wait = f.next()?.ok()?;
        Some(SchedSample {
            cpu_us: cpu / 1000,
            wait_us: wait / 1000,
            major_faults: None,
        })
    }
}

/// The major page faults of a `/proc/.../stat` line (field 12).
fn major_faults(stat: &str) -> Option<u64> {
    stat_field(stat, 12)
}

/// Field `n` (1-based, as `proc(5)` numbers them, `n` > 2) of a
/// `/proc/.../stat` line: the command name (field 2) may hold spaces and
/// parentheses, so fields resume after the last ')'.
fn stat_field(stat: &str, n: usize) -> Option<u64> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_ascii_whitespace()
        .nth(n.checked_sub(3)?)?
        .parse()
        .ok()
}

/// How long ago the calling process was created (fork or clone), from
/// `/proc/self/stat` and `/proc/uptime` (10 ms resolution); `None` where
/// the kernel does not say. Beside a stamp taken by the parent just before
/// it spawned the process, it tells a slow spawn (the parent, before the
/// process existed) from a slow start (the process, after).
pub fn process_age_us() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    // starttime is field 22, in clock ticks since boot.
    let start_ticks = stat_field(&stat, 22)?;
    let up_s: f64 = uptime.split_ascii_whitespace().next()?.parse().ok()?;
    // USER_HZ is 100 on every Linux ABI Rust targets.
    let up_us = (up_s * 1e6) as u64;
    Some(up_us.saturating_sub(start_ticks * 10_000))
}

/// Child side: prints one protocol line and flushes.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Child side: waits for the line `tag` on stdin; `Err` when stdin closes
/// first (the driver is gone) or another line comes.
///
/// # Errors
/// A message for the operator.
pub fn wait_for(tag: &str) -> Result<(), String> {
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) => Err(format!("the driver closed stdin before {tag}")),
        Ok(_) if line.trim_end() == tag => Ok(()),
        Ok(_) => Err(format!("expected {tag}, got {:?}", line.trim_end())),
        Err(e) => Err(format!("reading {tag}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines_parse_and_bad_ones_do_not() {
        assert_eq!(
            SchedSample::parse("2150000 7260000 12\n"),
            Some(SchedSample {
                cpu_us: 2150,
                wait_us: 7260,
                major_faults: None,
            })
        );
        assert_eq!(SchedSample::parse(""), None);
        assert_eq!(SchedSample::parse("12 x 3"), None);
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 1200 0 37 0 5 2 0 0 20 0";
        assert_eq!(major_faults(stat), Some(37));
        assert_eq!(major_faults("4242 (x) S 1"), None);
    }

    #[test]
    fn this_process_is_younger_than_the_machine() {
        // Linux reports both; the test process started within the last
        // hour of a run (10 ms resolution).
        if std::path::Path::new("/proc/self/stat").exists() {
            let age = process_age_us().expect("Linux reports the process start");
            assert!(age < 3_600_000_000, "{age}");
            let s = SchedSample::now().expect("Linux reports schedstat");
            assert!(s.cpu_us > 0, "{s:?}");
        }
    }
}
