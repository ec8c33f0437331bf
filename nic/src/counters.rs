//! Device counters: what the NIC did, readable by tests and benchmarks
//! ("connect created 0 QPs").

use std::ops::Sub;

/// A snapshot of a device's counters. All values are totals since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// QPs created.
    pub qps_created: u64,
    /// QPs destroyed.
    pub qps_destroyed: u64,
    /// QP state transitions (explicit, and into ERR after a fault).
    pub state_changes: u64,
    /// DC initiator target switches (a WR naming another target than the last).
    pub dc_target_switches: u64,
    /// `post_send` calls that posted at least one WR.
    pub doorbells: u64,
    /// Send work requests posted.
    pub send_wrs: u64,
    /// Receive work requests posted.
    pub recv_wrs: u64,
    /// One-sided READs executed.
    pub reads: u64,
    /// One-sided WRITEs executed (with or without immediate).
    pub writes: u64,
    /// SENDs executed (with or without immediate).
    pub sends: u64,
    /// Atomics executed.
    pub atomics: u64,
    /// Bytes read by READs.
    pub bytes_read: u64,
    /// Bytes written by WRITEs and SENDs.
    pub bytes_written: u64,
    /// Completions with an error status (including flushes).
    pub error_completions: u64,
    /// Memory regions registered.
    pub mrs_registered: u64,
    /// Nanoseconds of modeled hardware time charged to control-path calls
    /// (0 without a latency model). Modeled, never measured.
    pub modeled_control_ns: u64,
}

impl Counters {
    /// Adds the per-QP data-path counters of `c` (state changes, DC target
    /// switches, doorbells, WRs, operations and bytes) to `self`: how a
    /// device folds a QP's counters into its totals.
    pub fn add_data_path(&mut self, c: &Counters) {
        self.state_changes += c.state_changes;
        self.dc_target_switches += c.dc_target_switches;
        self.doorbells += c.doorbells;
        self.send_wrs += c.send_wrs;
        self.reads += c.reads;
        self.writes += c.writes;
        self.sends += c.sends;
        self.atomics += c.atomics;
        self.bytes_read += c.bytes_read;
        self.bytes_written += c.bytes_written;
    }

    /// Network operations executed (READ, WRITE, SEND, atomics).
    pub fn network_ops(&self) -> u64 {
        self.reads + self.writes + self.sends + self.atomics
    }
}

impl Sub for Counters {
    type Output = Counters;
    fn sub(self, o: Counters) -> Counters {
        Counters {
            qps_created: self.qps_created - o.qps_created,
            qps_destroyed: self.qps_destroyed - o.qps_destroyed,
            state_changes: self.state_changes - o.state_changes,
            dc_target_switches: self.dc_target_switches - o.dc_target_switches,
            doorbells: self.doorbells - o.doorbells,
            send_wrs: self.send_wrs - o.send_wrs,
            recv_wrs: self.recv_wrs - o.recv_wrs,
            reads: self.reads - o.reads,
            writes: self.writes - o.writes,
            sends: self.sends - o.sends,
            atomics: self.atomics - o.atomics,
            bytes_read: self.bytes_read - o.bytes_read,
            bytes_written: self.bytes_written - o.bytes_written,
            error_completions: self.error_completions - o.error_completions,
            mrs_registered: self.mrs_registered - o.mrs_registered,
            modeled_control_ns: self.modeled_control_ns - o.modeled_control_ns,
        }
    }
}
