//! # krcore-cli: what every program of a KRCore-rs deployment shares
//!
//! The programs (`krcore-meta`, `race-memnode` here; `krcore-ycsb` and
//! `krcore-elastic` in `krcore-benches`) behave alike:
//!
//! - `--help`; `--fabric F` (one parser: [`krcore_nic::FabricSpec`]),
//!   `--meta HOST:PORT` (the meta server's TCP address), `--config FILE`
//!   (TOML; flags override the file: [`load_toml`]);
//! - a readiness line on stdout, `ready: ...`, and the same line written to
//!   `--ready-file PATH` (atomically: a reader never sees half of it):
//!   [`announce_ready`];
//! - clean exit on SIGINT and SIGTERM ([`Shutdown`]);
//! - one-line errors with their cause chain ([`error_chain`]) and exit code
//!   1 ([`fail`]); usage errors exit 2 (clap's own, and [`usage`]);
//! - logs through `tracing` on stderr, filtered by `RUST_LOG` (default
//!   `info` for the program, `warn` for the libraries): [`init_tracing`].
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The meta server's TCP address unless `--meta` / `--listen` say otherwise.
pub const DEFAULT_META_ADDR: &str = race_store::deploy::DEFAULT_META_ADDR;

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("--config {path}: cannot read it")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this program.
    #[error("--config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (line, column, the key).
        message: String,
    },
}

/// What a client program's `--config` file holds (krcore-ycsb,
/// krcore-elastic): `[engine]` (`krcore::EngineConfig`) and `[client]`
/// (`race_store::ClientConfig`); unknown keys are refused.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientFile {
    /// The compute node's engine.
    pub engine: krcore::EngineConfig,
    /// The store clients' settings.
    pub client: race_store::ClientConfig,
}

/// Reads a TOML configuration (`T::default()` without a file). Unknown keys
/// are errors when `T` denies them (`#[serde(deny_unknown_fields)]`).
///
/// # Errors
/// [`ConfigError`].
pub fn load_toml<T>(path: Option<&Path>) -> Result<T, ConfigError>
where
    T: serde::de::DeserializeOwned + Default,
{
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.message().to_string() + &line_of(&text, e.span()),
    })
}

fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(r) => {
            let line = text[..r.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

/// Installs the `tracing` subscriber: stderr, `RUST_LOG` (default: `info`
/// for `program`'s own crate and the KRCore crates' control-path events at
/// `warn`).
pub fn init_tracing(program: &str) {
    let default = format!("warn,{}=info", program.replace('-', "_"));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(true)
        .try_init();
}

/// Prints a line on stdout as `println!` does, except when stdout cannot
/// be written: a reader that went away (`race-kv check | head -1`) ends
/// the program at once and quietly with status 141, as SIGPIPE ends a C
/// tool (Rust ignores SIGPIPE, and `println!` would panic); any other
/// write error ends it with a one-line error and status 1. The programs
/// print with this instead of `println!`.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out_line(format_args!($($arg)*))
    };
}

/// The line of [`outln!`], written and flushed (stdout is line-buffered).
#[doc(hidden)]
pub fn out_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        stdout_failed(&e);
    }
}

/// Status of a program whose stdout reader went away (128 + SIGPIPE, what
/// a shell reports for a C tool that SIGPIPE ended).
pub const BROKEN_PIPE_STATUS: i32 = 141;

/// Ends the program after a failed write to stdout: quietly with
/// [`BROKEN_PIPE_STATUS`] when the reader went away, else with a one-line
/// error and status 1.
pub fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(BROKEN_PIPE_STATUS);
    }
    let program = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    eprintln!("{program}: writing to stdout: {e}");
    std::process::exit(1);
}

/// An error and its sources on one line: `a: b: c`.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Errors that are `transparent` print their source themselves.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Prints `program: error: <chain>` on stderr and returns exit code 1.
pub fn fail(program: &str, e: &(dyn std::error::Error + 'static)) -> ExitCode {
    eprintln!("{program}: error: {}", error_chain(e));
    ExitCode::from(1)
}

/// Prints `program: <message>` on stderr and returns exit code 2 (a usage
/// error).
pub fn usage(program: &str, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("{program}: {message}");
    ExitCode::from(2)
}

/// Prints `ready: <line>` on stdout (flushed) and, with a path, writes the
/// same line to it atomically (a temporary file renamed into place).
///
/// # Errors
/// The file's I/O error.
pub fn announce_ready(line: &str, ready_file: Option<&Path>) -> std::io::Result<()> {
    let text = format!("ready: {line}\n");
    {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
    }
    if let Some(path) = ready_file {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, &text)?;
        std::fs::rename(&tmp, path)?;
    }
    Ok(())
}

/// SIGINT and SIGTERM, turned into a flag the program polls.
#[derive(Debug, Clone)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
}

impl Shutdown {
    /// Registers the handlers (a second signal while shutting down ends the
    /// process at once, as an impatient operator expects).
    ///
    /// # Errors
    /// When a handler cannot be installed.
    pub fn install() -> std::io::Result<Shutdown> {
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // Second signal: exit with 128 + sig.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, flag.clone())?;
            signal_hook::flag::register(sig, flag.clone())?;
        }
        Ok(Shutdown { flag })
    }

    /// The flag the handlers set (for loops that poll it themselves).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// Whether a signal asked the program to stop.
    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Blocks until a signal asks the program to stop (checked every
    /// `tick`), or `done` returns true; returns whether it was a signal.
    pub fn wait_until(&self, tick: Duration, mut done: impl FnMut() -> bool) -> bool {
        loop {
            if self.requested() {
                return true;
            }
            if done() {
                return false;
            }
            std::thread::sleep(tick);
        }
    }
}

/// A read of [`StoppableStdin`] ended by a signal ([`Shutdown`]).
#[derive(Debug, thiserror::Error)]
#[error("stopped by a signal")]
pub struct Stopped;

/// Whether `e` is a read that a signal stopped ([`StoppableStdin`]).
pub fn stopped_by_signal(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Stopped>())
}

/// How often a [`StoppableStdin`] waiting for input looks at the flag.
const STDIN_TICK: Duration = Duration::from_millis(100);

/// Standard input read on a thread of its own, so that a program blocked
/// on it (a `load -` whose writer is slow or stalled) still stops at a
/// signal: while no input is buffered, a read waits for the thread's next
/// chunk and looks at the shutdown flag every 100 ms; once the flag is set
/// it returns an error that [`stopped_by_signal`] recognizes. Input already
/// buffered is read first. The thread stays blocked in its read until the
/// process exits (nothing else holds standard input).
#[derive(Debug)]
pub struct StoppableStdin {
    rx: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
    ended: bool,
    flag: Arc<AtomicBool>,
}

impl StoppableStdin {
    /// Starts the reading thread; reads stop once `shutdown` is requested.
    ///
    /// # Errors
    /// When the thread cannot be created.
    pub fn new(shutdown: &Shutdown) -> std::io::Result<StoppableStdin> {
        // A few chunks ahead: the reader keeps the pipe drained while the
        // program works on what it read.
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || {
                use std::io::Read;
                let mut input = std::io::stdin().lock();
                loop {
                    let mut buf = vec![0u8; 64 << 10];
                    let r = match input.read(&mut buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Ok(n) => {
                            buf.truncate(n);
                            Ok(buf)
                        }
                        Err(e) => Err(e),
                    };
                    let last = !matches!(&r, Ok(b) if !b.is_empty());
                    if tx.send(r).is_err() || last {
                        return;
                    }
                }
            })?;
        Ok(StoppableStdin {
            rx,
            chunk: Vec::new(),
            at: 0,
            ended: false,
            flag: shutdown.flag(),
        })
    }
}

impl std::io::Read for StoppableStdin {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::sync::mpsc::RecvTimeoutError;
        while self.at >= self.chunk.len() && !self.ended {
            if self.flag.load(Ordering::Relaxed) {
                return Err(std::io::Error::other(Stopped));
            }
            match self.rx.recv_timeout(STDIN_TICK) {
                Ok(Ok(chunk)) => {
                    self.ended = chunk.is_empty();
                    (self.chunk, self.at) = (chunk, 0);
                }
                Ok(Err(e)) => {
                    self.ended = true;
                    return Err(e);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => self.ended = true,
            }
        }
        let rest = self.chunk.get(self.at..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.at += n;
        Ok(n)
    }
}

/// Whether `e` says the meta server could not be reached over TCP (nobody
/// listens at its address yet, or it does not answer): what
/// [`build_waiting_for_meta`] waits out.
pub fn meta_unreachable(e: &krcore::Error) -> bool {
    matches!(
        e,
        krcore::Error::Meta(
            krcore_meta::MetaError::Connect { .. } | krcore_meta::MetaError::Timeout { .. }
        )
    )
}

/// Runs `build` (a node's start, which fetches the meta server's
/// bootstrap) and, while it fails because the meta server is unreachable
/// ([`meta_unreachable`]), runs it again every 200 ms for up to `wait`:
/// a node started before its meta server waits for it (`--meta-wait-s`).
/// Says once on stderr that it waits. A signal ends the wait (the last
/// error is returned).
///
/// # Errors
/// `build`'s last error: at once for any other error, after `wait` for an
/// unreachable meta server.
pub fn build_waiting_for_meta<T>(
    program: &str,
    wait: Duration,
    shutdown: &Shutdown,
    mut build: impl FnMut() -> krcore::Result<T>,
) -> krcore::Result<T> {
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        match build() {
            Err(e) if meta_unreachable(&e) && start.elapsed() < wait && !shutdown.requested() => {
                if !said {
                    // Not an error line (yet): the last error is reported
                    // if the wait runs out.
                    eprintln!(
                        "{program}: the meta server does not answer yet; waiting at most {} s for it",
                        wait.as_secs()
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            r => return r,
        }
    }
}

/// Parses `--fabric` (exit code 2 on a bad string, through [`usage`]).
///
/// # Errors
/// The exit code to return.
pub fn parse_fabric(program: &str, s: &str) -> Result<krcore_nic::FabricSpec, ExitCode> {
    s.parse::<krcore_nic::FabricSpec>()
        .map_err(|e| usage(program, format!("--fabric: {e}")))
}

/// Bytes for a person: KiB below 1 MiB, MiB (one decimal) below 10 GiB,
/// else GiB.
pub fn bytes_text(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes < 1 << 20 {
        format!("{} KiB", bytes >> 10)
    } else if bytes < 10 << 30 {
        format!("{:.1} MiB", b / f64::from(1 << 20))
    } else {
        format!("{:.1} GiB", b / f64::from(1 << 30))
    }
}

/// `part` as a whole percent of `whole`, rounded down (0 of nothing).
pub fn percent(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    u64::try_from(u128::from(part) * 100 / u128::from(whole)).unwrap_or(u64::MAX)
}

/// When a server's next periodic usage line is due (`--report-s`).
#[derive(Debug)]
pub struct Periodic {
    /// `None`: never.
    every: Option<Duration>,
    last: Instant,
}

impl Periodic {
    /// Every `every` from now; never for zero.
    pub fn new(every: Duration) -> Self {
        Periodic {
            every: (!every.is_zero()).then_some(every),
            last: Instant::now(),
        }
    }

    /// At `now`: the time since the last line if a line is due (the next is
    /// then counted from `now`), else `None`.
    pub fn due(&mut self, now: Instant) -> Option<Duration> {
        let since = now.saturating_duration_since(self.last);
        if self.every.is_some_and(|e| since >= e) {
            self.last = now;
            Some(since)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Conf {
        store: Option<String>,
        id: Option<u8>,
    }

    #[test]
    fn toml_files_load_or_fail_with_the_key_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "store = \"s\"\nid = 3\n").unwrap();
        let c: Conf = load_toml(Some(&p)).unwrap();
        assert_eq!(
            c,
            Conf {
                store: Some("s".into()),
                id: Some(3)
            }
        );
        assert_eq!(load_toml::<Conf>(None).unwrap(), Conf::default());
        std::fs::write(&p, "store = \"s\"\nsotre = 1\n").unwrap();
        let e = load_toml::<Conf>(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("sotre") && e.contains("line 2"), "{e}");
        let e = load_toml::<Conf>(Some(&dir.path().join("missing.toml"))).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    }

    #[test]
    fn error_chains_print_every_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer: inner");
    }

    #[test]
    fn the_ready_file_holds_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ready");
        announce_ready("x 1", Some(&p)).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "ready: x 1\n");
    }

    #[test]
    fn periodic_lines_come_when_due_and_never_for_zero() {
        let t0 = Instant::now();
        let mut p = Periodic::new(Duration::from_secs(10));
        assert_eq!(p.due(t0 + Duration::from_secs(5)), None);
        let since = p.due(t0 + Duration::from_secs(11)).unwrap();
        assert!(since > Duration::from_secs(10) && since <= Duration::from_secs(11));
        assert_eq!(p.due(t0 + Duration::from_secs(15)), None, "counted anew");
        assert_eq!(
            p.due(t0 + Duration::from_secs(21)),
            Some(Duration::from_secs(10))
        );
        let mut never = Periodic::new(Duration::ZERO);
        assert_eq!(never.due(t0 + Duration::from_secs(1 << 20)), None);
        assert_eq!(bytes_text(7 << 10), "7 KiB");
        assert_eq!(bytes_text(3 << 19), "1.5 MiB");
        assert_eq!(bytes_text(12 << 30), "12.0 GiB");
    }
}
