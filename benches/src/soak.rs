//! The soak test's bookkeeping: self-checking values, the per-writer log of
//! acknowledged writes, and the final verification of a table against the
//! logs (used by `krcore-soak`).
//!
//! # Values
//! A value names its key, its writer and the writer's sequence number, with
//! a check word and a filler derived from them ([`encode_value`]): a value
//! that is torn, misplaced (another key's) or invented fails [`decode_value`].
//!
//! # Logs
//! Each writer (one client thread of one process incarnation, id `wid`)
//! appends lines to its own file, one `write(2)` per line, so a SIGKILL
//! loses nothing already written (the page cache outlives the process).
//! The kill can cut the line being written short (between two pages): a
//! last line without its newline is ignored, so a write whose `A` line was
//! cut is unacknowledged, and one whose `I` line was cut was never issued.
//!
//! ```text
//! I <seq> <keynum> <invoke_us>   before a write is issued
//! A <seq> <ack_us>               after it returned Ok (acknowledged)
//! E <seq>                        it returned an error (outcome unknown)
//! R <reads_ok> <reads_bad>       cumulative read counters
//! X <keynum> <reason>            a read returned a value that fails decode
//! ```
//!
//! # Verification ([`verify`])
//! For one key, the writes are the logged ones (plus the load's). A write
//! `W` ended at its ack, or, unacknowledged, at the death of its process
//! (the driver knows when it SIGKILLed it): it may have taken effect at any
//! time between its invoke and that end. The final value is correct iff it
//! is a write `W` of that key such that no *acknowledged* write `W'` of the
//! key was invoked after `W` ended (then `W'` would have to come after
//! `W`). A key with an acknowledged write that reads as absent, or whose
//! value is an older write superseded that way, is a **lost acknowledged
//! write**; a value that does not decode, names another key, or names a
//! write nobody logged is a **wrong value**. Unacknowledged writes may or
//! may not be present. Times are microseconds since the epoch, the clock
//! every process of the machine shares.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Smallest value: four words.
pub const MIN_VALUE: usize = 32;

fn mix(mut x: u64) -> u64 {
    // splitmix64 finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn check_word(keynum: u64, wid: u64, seq: u64) -> u64 {
    mix(keynum ^ mix(wid ^ mix(seq ^ 0x50a4)))
}

fn filler(check: u64, len: usize, out: &mut Vec<u8>) {
    let mut x = check | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
}

/// The value write `(wid, seq)` stores under key `keynum`: `len` bytes
/// (at least [`MIN_VALUE`]).
pub fn encode_value(keynum: u64, wid: u64, seq: u64, len: usize) -> Vec<u8> {
    let len = len.max(MIN_VALUE);
    let check = check_word(keynum, wid, seq);
    let mut v = Vec::with_capacity(len);
    for w in [keynum, wid, seq, check] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    filler(check, len, &mut v);
    v
}

/// Why a value failed [`decode_value`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadValue {
    /// Shorter than [`MIN_VALUE`].
    #[error("short value ({0} bytes)")]
    Short(usize),
    /// The check word or the filler does not match.
    #[error("corrupt value")]
    Corrupt,
    /// A valid value of another key.
    #[error("value of key {0}")]
    OtherKey(u64),
}

/// The `(wid, seq)` of a value read under `keynum`.
///
/// # Errors
/// [`BadValue`].
pub fn decode_value(keynum: u64, v: &[u8]) -> Result<(u64, u64), BadValue> {
    if v.len() < MIN_VALUE {
        return Err(BadValue::Short(v.len()));
    }
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&v[8 * i..8 * i + 8]);
        u64::from_le_bytes(b)
    };
    let (k, wid, seq, check) = (word(0), word(1), word(2), word(3));
    if check != check_word(k, wid, seq) {
        return Err(BadValue::Corrupt);
    }
    let mut expect = v[..MIN_VALUE].to_vec();
    filler(check, v.len(), &mut expect);
    if expect != v {
        return Err(BadValue::Corrupt);
    }
    if k != keynum {
        return Err(BadValue::OtherKey(k));
    }
    Ok((wid, seq))
}

/// The key string of key number `keynum`.
pub fn key_name(keynum: u64) -> String {
    format!("soak{keynum:016x}")
}

/// A writer's append-only log (see the module docs).
#[derive(Debug)]
pub struct WriterLog {
    file: std::fs::File,
    line: String,
}

/// The log file of writer `wid` in `dir`.
pub fn log_path(dir: &Path, wid: u64) -> PathBuf {
    dir.join(format!("w-{wid}.log"))
}

impl WriterLog {
    /// Creates (appends to) the log of `wid` in `dir`.
    ///
    /// # Errors
    /// The OS error.
    pub fn open(dir: &Path, wid: u64) -> std::io::Result<WriterLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path(dir, wid))?;
        Ok(WriterLog {
            file,
            line: String::with_capacity(64),
        })
    }

    fn put(&mut self, args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
        use std::fmt::Write as _;
        self.line.clear();
        let _ = self.line.write_fmt(args);
        self.line.push('\n');
        // One write(2) for a short line on an O_APPEND file.
        self.file.write_all(self.line.as_bytes())
    }

    /// Logs a write about to be issued.
    ///
    /// # Errors
    /// The OS error.
    pub fn intent(&mut self, seq: u64, keynum: u64, invoke_us: u64) -> std::io::Result<()> {
        self.put(format_args!("I {seq} {keynum} {invoke_us}"))
    }

    /// Logs a write acknowledged.
    ///
    /// # Errors
    /// The OS error.
    pub fn ack(&mut self, seq: u64, ack_us: u64) -> std::io::Result<()> {
        self.put(format_args!("A {seq} {ack_us}"))
    }

    /// Logs a write that returned an error.
    ///
    /// # Errors
    /// The OS error.
    pub fn error(&mut self, seq: u64) -> std::io::Result<()> {
        self.put(format_args!("E {seq}"))
    }

    /// Logs the cumulative read counters.
    ///
    /// # Errors
    /// The OS error.
    pub fn reads(&mut self, ok: u64, bad: u64) -> std::io::Result<()> {
        self.put(format_args!("R {ok} {bad}"))
    }

    /// Logs a read that returned a bad value.
    ///
    /// # Errors
    /// The OS error.
    pub fn bad_read(&mut self, keynum: u64, reason: &str) -> std::io::Result<()> {
        self.put(format_args!("X {keynum} {}", reason.replace('\n', " ")))
    }
}

/// One logged write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRec {
    /// Writer.
    pub wid: u64,
    /// Its sequence number.
    pub seq: u64,
    /// Key number.
    pub keynum: u64,
    /// When it was issued.
    pub invoke_us: u64,
    /// When it was acknowledged, if it was.
    pub ack_us: Option<u64>,
    /// Whether it returned an error.
    pub failed: bool,
}

/// What one writer's log says.
#[derive(Debug, Clone, Default)]
pub struct ParsedLog {
    /// Its writes, in order.
    pub writes: Vec<WriteRec>,
    /// Reads that returned a valid value (the last `R` line).
    pub reads_ok: u64,
    /// Reads that returned a bad value (the last `R` line).
    pub reads_bad: u64,
    /// The `X` lines.
    pub bad_reads: Vec<String>,
    /// Lines that did not parse, and a last line without its newline (a
    /// kill can cut a line short, mid-number: see [`parse_log`]).
    pub torn_lines: u64,
}

/// Parses a writer's log (`wid` is the file's writer).
pub fn parse_log(wid: u64, text: &str) -> ParsedLog {
    let mut out = ParsedLog::default();
    let mut by_seq: HashMap<u64, usize> = HashMap::new();
    for line in text.split_inclusive('\n') {
        // A line is whole only with its newline: SIGKILL can end a write(2)
        // between two pages, leaving `A 7 17966` of `A 7 1796668841047288`,
        // which parses as an acknowledgement 30 years early. Without it, an
        // intent was never followed by its write, and an acknowledgement
        // never reached the driver: the write is unacknowledged, ended by the
        // process's death.
        let Some(line) = line.strip_suffix('\n') else {
            out.torn_lines += 1;
            continue;
        };
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
        let ok = match f.first().copied() {
            Some("I") => match (num(1), num(2), num(3)) {
                (Some(seq), Some(keynum), Some(t)) => {
                    by_seq.insert(seq, out.writes.len());
                    out.writes.push(WriteRec {
                        wid,
                        seq,
                        keynum,
                        invoke_us: t,
                        ack_us: None,
                        failed: false,
                    });
                    true
                }
                _ => false,
            },
            Some("A") => match (num(1), num(2)) {
                (Some(seq), Some(t)) => match by_seq.get(&seq) {
                    Some(&i) => {
                        out.writes[i].ack_us = Some(t);
                        true
                    }
                    None => false,
                },
                _ => false,
            },
            Some("E") => match num(1).and_then(|s| by_seq.get(&s)) {
                Some(&i) => {
                    out.writes[i].failed = true;
                    true
                }
                None => false,
            },
            Some("R") => match (num(1), num(2)) {
                (Some(a), Some(b)) => {
                    out.reads_ok = a;
                    out.reads_bad = b;
                    true
                }
                _ => false,
            },
            Some("X") => {
                out.bad_reads.push(line.to_string());
                true
            }
            _ => false,
        };
        if !ok {
            out.torn_lines += 1;
        }
    }
    out
}

/// The outcome of [`verify`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Verification {
    /// Keys checked (every key any write named).
    pub keys: u64,
    /// Writes logged (including the load's).
    pub writes: u64,
    /// Acknowledged writes.
    pub acked: u64,
    /// Writes that returned an error.
    pub failed: u64,
    /// Unacknowledged writes (in flight at a kill, or failed).
    pub unacked: u64,
    /// Keys whose final value is an unacknowledged write (allowed).
    pub final_unacked: u64,
    /// Keys with an acknowledged write whose final value is absent or
    /// superseded (must be 0).
    pub lost: u64,
    /// Keys whose final value does not decode, is another key's, or names
    /// no logged write (must be 0).
    pub wrong: u64,
    /// Up to 20 examples of problems.
    pub examples: Vec<String>,
}

impl Verification {
    /// Whether nothing was lost or wrong.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.wrong == 0
    }

    fn example(&mut self, s: String) {
        if self.examples.len() < 20 {
            self.examples.push(s);
        }
    }
}

/// Checks final values against writes. `end_of(w)` is the time by which an
/// unacknowledged write of writer `w` had certainly ended (its process's
/// death); `final_value(keynum)` is what the table holds now.
pub fn verify(
    writes: &[WriteRec],
    end_of: impl Fn(u64) -> u64,
    mut final_value: impl FnMut(u64) -> Result<Option<Vec<u8>>, String>,
) -> Verification {
    let mut v = Verification::default();
    let mut by_key: HashMap<u64, Vec<&WriteRec>> = HashMap::new();
    for w in writes {
        by_key.entry(w.keynum).or_default().push(w);
        v.writes += 1;
        if w.ack_us.is_some() {
            v.acked += 1;
        } else {
            v.unacked += 1;
        }
        if w.failed {
            v.failed += 1;
        }
    }
    let mut keys: Vec<_> = by_key.keys().copied().collect();
    keys.sort_unstable();
    for k in keys {
        v.keys += 1;
        let ws = &by_key[&k];
        let end = |w: &WriteRec| w.ack_us.unwrap_or_else(|| end_of(w.wid));
        let last_acked_invoke = ws
            .iter()
            .filter(|w| w.ack_us.is_some())
            .map(|w| w.invoke_us)
            .max();
        let got = match final_value(k) {
            Ok(g) => g,
            Err(e) => {
                v.wrong += 1;
                v.example(format!("key {k}: read failed: {e}"));
                continue;
            }
        };
        let Some(bytes) = got else {
            if last_acked_invoke.is_some() {
                v.lost += 1;
                v.example(format!("key {k}: absent, but an acknowledged write exists"));
            }
            continue;
        };
        let (wid, seq) = match decode_value(k, &bytes) {
            Ok(x) => x,
            Err(e) => {
                v.wrong += 1;
                v.example(format!("key {k}: {e}"));
                continue;
            }
        };
        let Some(w) = ws.iter().find(|w| w.wid == wid && w.seq == seq) else {
            v.wrong += 1;
            v.example(format!(
                "key {k}: holds write ({wid}, {seq}), which nobody logged"
            ));
            continue;
        };
        if w.ack_us.is_none() {
            v.final_unacked += 1;
        }
        if let Some(t) = last_acked_invoke {
            if t > end(w) {
                v.lost += 1;
                v.example(format!(
                    "key {k}: holds ({wid}, {seq}) ended at {}, but an acknowledged write was invoked at {t}",
                    end(w)
                ));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_catch_damage() {
        let v = encode_value(7, 3, 9, 100);
        assert_eq!(v.len(), 100);
        assert_eq!(decode_value(7, &v), Ok((3, 9)));
        assert_eq!(decode_value(8, &v), Err(BadValue::OtherKey(7)));
        let mut torn = v.clone();
        torn[60] ^= 1;
        assert_eq!(decode_value(7, &torn), Err(BadValue::Corrupt));
        let mut forged = v.clone();
        forged[16] ^= 1; // another seq, same check word
        assert_eq!(decode_value(7, &forged), Err(BadValue::Corrupt));
        assert_eq!(decode_value(7, &v[..10]), Err(BadValue::Short(10)));
        assert_eq!(encode_value(1, 1, 1, 4).len(), MIN_VALUE);
    }

    #[test]
    fn logs_parse_with_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = WriterLog::open(dir.path(), 5).unwrap();
        log.intent(1, 42, 100).unwrap();
        log.ack(1, 150).unwrap();
        log.intent(2, 43, 200).unwrap();
        log.error(2).unwrap();
        log.intent(3, 42, 300).unwrap();
        log.reads(10, 1).unwrap();
        log.bad_read(42, "corrupt\nvalue").unwrap();
        drop(log);
        let text = std::fs::read_to_string(log_path(dir.path(), 5)).unwrap();
        let whole = parse_log(5, &text);
        assert_eq!(whole.writes.len(), 3);
        assert_eq!(whole.writes[0].ack_us, Some(150));
        assert!(whole.writes[1].failed && whole.writes[1].ack_us.is_none());
        assert_eq!(whole.writes[2].ack_us, None);
        assert_eq!((whole.reads_ok, whole.reads_bad), (10, 1));
        assert_eq!(whole.bad_reads, vec!["X 42 corrupt value".to_string()]);
        assert_eq!(whole.torn_lines, 0);

        // Killed while writing seq 3's acknowledgement: its time was cut
        // short. It parses as a number, but the write stays unacknowledged.
        let p = parse_log(5, &format!("{text}A 3 3"));
        assert_eq!(p.writes[2].ack_us, None);
        assert_eq!(p.torn_lines, 1);
        // Killed while writing an intent (whose write was never issued),
        // after a line that does not parse.
        let p = parse_log(5, &format!("{text}Z 1\nI 4 44 1000"));
        assert_eq!(p.writes.len(), 3);
        assert_eq!(p.torn_lines, 2);
    }

    fn w(wid: u64, seq: u64, keynum: u64, invoke: u64, ack: Option<u64>) -> WriteRec {
        WriteRec {
            wid,
            seq,
            keynum,
            invoke_us: invoke,
            ack_us: ack,
            failed: false,
        }
    }

    #[test]
    fn verification_accepts_linearizable_finals_and_flags_the_rest() {
        // Key 1: load (0,0) acked at 10; writer 1 acked at 30; writer 2's
        // write invoked at 20, unacked, its process dead at 100.
        let writes = vec![
            w(0, 0, 1, 0, Some(10)),
            w(1, 1, 1, 25, Some(30)),
            w(2, 1, 1, 20, None),
            // Key 2: only an unacked write.
            w(2, 2, 2, 50, None),
        ];
        let end_of = |wid: u64| if wid == 2 { 100 } else { 0 };
        let run = |k1: Option<Vec<u8>>, k2: Option<Vec<u8>>| {
            verify(&writes, end_of, |k| {
                Ok(if k == 1 { k1.clone() } else { k2.clone() })
            })
        };
        // The acked write last: fine. The unacked concurrent one: fine too.
        let a = run(Some(encode_value(1, 1, 1, 40)), None);
        assert!(a.ok(), "{a:?}");
        assert_eq!((a.keys, a.writes, a.acked, a.unacked), (2, 4, 2, 2));
        let b = run(
            Some(encode_value(1, 2, 1, 40)),
            Some(encode_value(2, 2, 2, 40)),
        );
        assert!(b.ok(), "{b:?}");
        assert_eq!(b.final_unacked, 2);
        // The load value: superseded by writer 1's ack (invoked at 25 > 10).
        let c = run(Some(encode_value(1, 0, 0, 40)), None);
        assert_eq!((c.lost, c.wrong), (1, 0));
        // Absent although acknowledged.
        assert_eq!(run(None, None).lost, 1);
        // A write nobody logged, another key's value, garbage.
        assert_eq!(run(Some(encode_value(1, 9, 9, 40)), None).wrong, 1);
        assert_eq!(run(Some(encode_value(2, 2, 2, 40)), None).wrong, 1);
        assert_eq!(run(Some(vec![1; 40]), None).wrong, 1);
        let d = verify(&writes, end_of, |_| Err("node down".into()));
        assert_eq!(d.wrong, 2);
        assert!(!d.ok());
    }
}
