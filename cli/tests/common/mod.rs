//! What the deployment tests share: the programs, a child process killed
//! when dropped, readiness lines, bounded runs.
#![allow(dead_code)] // each test file uses some of it

use std::io::{BufRead, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const MEMNODE: &str = env!("CARGO_BIN_EXE_race-memnode");
pub const META: &str = env!("CARGO_BIN_EXE_krcore-meta");
/// Every process of these tests ends (or is killed) within this bound.
pub const BOUND: Duration = Duration::from_secs(60);

/// A child killed (and reaped) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// [`Proc::terminate`], and what the process wrote on stderr.
    pub fn terminate_with_stderr(mut self) -> (Option<i32>, String) {
        let mut stderr = self.0.stderr.take().unwrap();
        let code = self.terminate();
        let mut err = String::new();
        stderr.read_to_string(&mut err).unwrap();
        (code, err)
    }

    /// Sends SIGTERM and waits (bounded) for the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let start = Instant::now();
        loop {
            if let Ok(Some(s)) = self.0.try_wait() {
                return s.code();
            }
            assert!(start.elapsed() < BOUND, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn fabric_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("krcore-deploy-test-")
        .tempdir_in("/dev/shm")
        .unwrap()
}

/// Starts a server and waits (bounded) for its `ready:` line; returns it.
pub fn start(bin: &str, args: &[&str]) -> (Proc, String) {
    let mut child = Proc(
        Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    loop {
        match rx.recv_timeout(BOUND.saturating_sub(start.elapsed())) {
            Ok(l) if l.starts_with("ready: ") => return (child, l),
            Ok(_) => {}
            Err(_) => {
                let mut err = String::new();
                if let Some(mut e) = child.0.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("{bin} {args:?} never became ready: {err}");
            }
        }
    }
}

/// A meta server on `fabric`; its TCP address.
pub fn meta(fabric: &str) -> (Proc, String) {
    let (p, line) = start(META, &["--fabric", fabric, "--listen", "127.0.0.1:0"]);
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "listen")
        .nth(1)
        .unwrap()
        .to_string();
    (p, addr)
}

pub fn memnode(fabric: &str, meta: &str, store: &str, id: u8, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--fabric", fabric, "--meta", meta, "--store", store, "--nodes", "2", "--mb", "16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(["--id".to_string(), id.to_string()]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Runs a command to its end, as `Command::output`, but bounded: one still
/// running after [`BOUND`] is killed and the test fails (a memory node that
/// should have been refused and serves instead never ends by itself).
pub fn bounded_output(bin: &str, args: &[String]) -> Output {
    let child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(BOUND) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{bin} {args:?} still running after {BOUND:?}: it should have been refused");
        }
    }
}

/// Runs a command that must fail: bounded, exit code 1, one line on stderr
/// containing `needle`.
pub fn fails_with(bin: &str, args: &[String], needle: &str) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            panic!("{bin} {args:?} did not exit within {BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let out = Output {
        status,
        stdout: vec![],
        stderr: err.clone().into_bytes(),
    };
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "one error line: {err}");
    assert!(errors[0].contains(needle), "{needle:?} not in: {err}");
}

pub fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
