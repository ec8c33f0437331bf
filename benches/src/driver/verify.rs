//! The verification pass after a YCSB run: every key holds the value of a
//! write that may have been the last one, and the table is consistent.
//!
//! Every write of a run writes different bytes (`fill_value(keynum,
//! version)` with a version unique to its writer thread and operation,
//! [`version_tag`]; loads and inserts write version 0), and the run phase
//! logs each write with its start and end time on a clock every process of
//! the machine shares ([`WriteRecord`]). After the run, a key's value is
//! correct iff it is the value of a write `w` that no other acknowledged
//! write to the key started after `w` ended (a linearizable store ordered
//! such a write after `w`): with `last_start` the latest start of the
//! key's acknowledged writes, the acceptable values are those of the
//! acknowledged writes ending at or after `last_start`, and of the writes
//! that failed (an error may have applied). A key with no acknowledged
//! write keeps its loaded value (or any failed write's). Sound for any
//! interleaving: a correct store never fails it; a lost, stale or torn
//! write does.

use crate::ycsb::{Status, Workload};
use race_store::remote::Transport;
use race_store::Client;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

/// The version of the `i`-th operation of writer `writer` (never 0, the
/// version of loaded values).
pub fn version_tag(writer: u64, i: u64) -> u64 {
    ((writer + 1) << 32) | ((i + 1) & 0xffff_ffff)
}

/// One logged write of the run phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    /// The key number.
    pub keynum: u64,
    /// The value's version (see [`version_tag`]).
    pub version: u64,
    /// Started at or after (us since the Unix epoch).
    pub start_us: u64,
    /// Ended at or before.
    pub end_us: u64,
    /// How it returned.
    pub status: Status,
}

impl WriteRecord {
    /// A write of `version` to `keynum` that started at `t0` and has just
    /// returned `status` (times widened by a microsecond each way).
    pub fn new(keynum: u64, version: u64, t0: Instant, status: Status) -> WriteRecord {
        let end_us = crate::proc::epoch_us() + 1;
        let took = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        WriteRecord {
            keynum,
            version,
            start_us: end_us.saturating_sub(took + 2),
            end_us,
            status,
        }
    }
}

/// What the verification found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Keys read.
    pub keys: u64,
    /// Keys whose value was not an acceptable one.
    pub wrong: u64,
    /// The first few of them, described.
    pub examples: Vec<String>,
    /// Problems the table check found.
    pub table_problems: Vec<String>,
    /// Keys stored twice.
    pub duplicates: u64,
    /// Whether the resize lock was left held or a split logged.
    pub locked: bool,
}

impl VerifyReport {
    /// Whether everything checked out.
    pub fn is_clean(&self) -> bool {
        self.wrong == 0 && self.table_problems.is_empty() && self.duplicates == 0 && !self.locked
    }

    /// One line for the operator.
    pub fn summary(&self) -> String {
        format!(
            "[VERIFY], Keys, {}\n[VERIFY], Wrong, {}\n[VERIFY], Duplicates, {}\n[VERIFY], TableProblems, {}",
            self.keys,
            self.wrong,
            self.duplicates,
            self.table_problems.len()
        )
    }
}

/// Checks every key of `loaded` and every key the run inserted against
/// `writes` (the merged logs of every writer of the run), then the table.
///
/// # Errors
/// A read or the table check failing on the transport.
pub fn verify<T: Transport>(
    client: &mut Client<T>,
    workload: &Workload,
    loaded: Range<u64>,
    writes: &[WriteRecord],
) -> Result<VerifyReport, race_store::Error> {
    let mut by_key: HashMap<u64, Vec<&WriteRecord>> = HashMap::new();
    for w in writes.iter().filter(|w| w.status != Status::NotFound) {
        by_key.entry(w.keynum).or_default().push(w);
    }
    let mut keys: Vec<u64> = loaded.clone().collect();
    keys.extend(by_key.keys().filter(|k| !loaded.contains(k)));
    let value_len = workload.value_size() as usize;
    let mut report = VerifyReport::default();
    let mut want = Vec::new();
    for k in keys {
        let got = client.get(workload.key_name(k).as_bytes())?;
        report.keys += 1;
        let ws = by_key.get(&k).map(Vec::as_slice).unwrap_or_default();
        let acked = || ws.iter().filter(|w| w.status == Status::Ok);
        let last_start = acked().map(|w| w.start_us).max();
        let mut ok_versions: Vec<u64> = ws
            .iter()
            .filter(|w| w.status == Status::Error)
            .map(|w| w.version)
            .collect();
        match last_start {
            Some(t) => ok_versions.extend(acked().filter(|w| w.end_us >= t).map(|w| w.version)),
            None if loaded.contains(&k) => ok_versions.push(0),
            None => {}
        }
        let absent_ok = last_start.is_none() && !loaded.contains(&k);
        let fine = match &got {
            None => absent_ok,
            Some(v) => ok_versions.iter().any(|&ver| {
                fill_value(&mut want, value_len, k, ver);
                *v == want
            }),
        };
        if !fine {
            report.wrong += 1;
            if report.examples.len() < 5 {
                report.examples.push(format!(
                    "key {}: {} ({} logged writes, acceptable versions {:x?})",
                    workload.key_name(k),
                    if got.is_some() {
                        "a value no acceptable write wrote"
                    } else {
                        "absent"
                    },
                    ws.len(),
                    ok_versions
                ));
            }
        }
    }
    let check = client.check_table()?;
    report.table_problems = check.problems.iter().map(|p| format!("{p:?}")).collect();
    report.duplicates = check.duplicates as u64;
    report.locked = check.locked || check.split_logged;
    Ok(report)
}

/// Fills `buf` with `len` bytes derived from `(keynum, version)`: cheap,
/// deterministic, and different for every write of a key.
pub(crate) fn fill_value(buf: &mut Vec<u8>, len: usize, keynum: u64, version: u64) {
    buf.clear();
    let mut x = keynum.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version;
    while buf.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.extend_from_slice(&x.to_le_bytes());
    }
    buf.truncate(len);
}

#[cfg(test)]
mod tests {
    use super::*;

    use race_store::clock::SystemClock;
    use race_store::memory::{ClusterConfig, LocalCluster};
    use race_store::ClientConfig;
    use std::sync::Arc;

    fn rec(keynum: u64, version: u64, start_us: u64, end_us: u64, status: Status) -> WriteRecord {
        WriteRecord {
            keynum,
            version,
            start_us,
            end_us,
            status,
        }
    }

    #[test]
    fn the_check_accepts_what_may_be_last_and_catches_lost_or_stale_writes() {
        let cluster = LocalCluster::new(ClusterConfig {
            nodes: 1,
            node_bytes: 8 << 20,
            ..ClusterConfig::default()
        })
        .unwrap();
        let mut c = Client::open(
            cluster.transport(),
            Arc::new(SystemClock::new()),
            ClientConfig::default(),
        )
        .unwrap();
        let w = Workload::preset('a').unwrap();
        let len = w.value_size() as usize;
        let mut v = Vec::new();
        let put = |c: &mut Client<_>, k: u64, ver: u64, v: &mut Vec<u8>| {
            fill_value(v, len, k, ver);
            c.put(w.key_name(k).as_bytes(), v).unwrap();
        };
        for k in 0..4 {
            put(&mut c, k, 0, &mut v);
        }
        // Key 1: two overlapping writes, the store kept the first: fine.
        put(&mut c, 1, 11, &mut v);
        // Key 2: a write that ended before another began, but the store
        // holds the earlier one: a lost write.
        put(&mut c, 2, 21, &mut v);
        // Key 3: written, but the store still has the loaded value.
        let log = [
            rec(1, 11, 100, 200, Status::Ok),
            rec(1, 12, 150, 250, Status::Ok),
            rec(2, 21, 100, 200, Status::Ok),
            rec(2, 22, 300, 400, Status::Ok),
            rec(3, 31, 100, 200, Status::Ok),
        ];
        let r = verify(&mut c, &w, 0..4, &log).unwrap();
        assert_eq!((r.keys, r.wrong), (4, 2), "{r:?}");
        assert!(
            r.examples.iter().any(|e| e.contains(&w.key_name(2))),
            "{r:?}"
        );
        assert!(
            r.examples.iter().any(|e| e.contains(&w.key_name(3))),
            "{r:?}"
        );
        // A failed write may have applied: accepted.
        let log = [rec(3, 31, 100, 200, Status::Error)];
        let r = verify(&mut c, &w, 0..4, &log).unwrap();
        // Keys 1 and 2 now hold values no logged write wrote.
        assert_eq!(r.wrong, 2, "{r:?}");
        assert!(
            !r.examples.iter().any(|e| e.contains(&w.key_name(3))),
            "{r:?}"
        );
        assert!(!r.is_clean());
    }

    #[test]
    fn versions_are_unique_and_never_zero() {
        assert_ne!(version_tag(0, 0), 0);
        assert_ne!(version_tag(0, 1), version_tag(1, 1));
        assert_ne!(version_tag(0, 1), version_tag(0, 2));
    }
}
