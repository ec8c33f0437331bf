//! The optional latency model: modeled hardware time for `sim`.
//!
//! Off by default. With a model, a completion becomes visible to `poll` only
//! once its modeled time has come (`visible_at = max(post + latency,
//! previous completion on the QP + issue gap)`), and control-path calls
//! (creating a QP, connecting an RC pair, registering memory) add their
//! modeled cost to [`crate::Counters::modeled_control_ns`] instead of
//! sleeping, so drivers can report *measured software time* and *modeled
//! hardware time* side by side. Every figure produced under a model must be
//! labelled "modeled" where it is printed.

use std::time::Duration;

/// Modeled costs, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyModel {
    /// Name printed beside modeled figures (e.g. "cx4").
    pub name: &'static str,
    /// One-sided READ round trip (small payload).
    pub read_ns: u64,
    /// One-sided WRITE round trip.
    pub write_ns: u64,
    /// CAS/FAA round trip.
    pub atomic_ns: u64,
    /// SEND round trip (until the sender's completion).
    pub send_ns: u64,
    /// Link bandwidth in bytes per nanosecond (added per payload byte).
    pub bytes_per_ns: f64,
    /// Minimum gap between completions of one RC QP (its peak rate).
    pub rc_gap_ns: u64,
    /// Minimum gap between completions of one DC initiator (DC peaks lower).
    pub dc_gap_ns: u64,
    /// Extra latency when a DC initiator switches target (hardware reconnect).
    pub dc_reconnect_ns: u64,
    /// Creating a QP (NIC resource setup).
    pub qp_create_ns: u64,
    /// Bringing an RC QP to RTS with a peer (the connect part).
    pub rc_connect_ns: u64,
    /// Registering a memory region.
    pub mr_reg_ns: u64,
}

impl LatencyModel {
    /// ConnectX-4 figures from the KRCore paper (USENIX ATC'22): RC create +
    /// connect 15.7 ms (87% of it NIC resource setup), DC reconnect < 1 us,
    /// one-sided READ ~2.15 us, DC peak ~14% below RC.
    pub const fn cx4() -> LatencyModel {
        LatencyModel {
            name: "cx4",
            read_ns: 2_150,
            write_ns: 1_900,
            atomic_ns: 2_300,
            send_ns: 2_400,
            bytes_per_ns: 12.5,
            rc_gap_ns: 100,
            dc_gap_ns: 116,
            dc_reconnect_ns: 800,
            qp_create_ns: 13_660_000,
            rc_connect_ns: 2_040_000,
            mr_reg_ns: 50_000,
        }
    }

    /// Parses `none` (returns `None`) or `cx4`.
    pub fn from_name(name: &str) -> Result<Option<LatencyModel>, String> {
        match name {
            "none" => Ok(None),
            "cx4" => Ok(Some(LatencyModel::cx4())),
            other => Err(format!(
                "unknown latency model {other:?} (expected none or cx4)"
            )),
        }
    }

    /// The modeled create + connect cost of one RC connection.
    pub fn rc_setup(&self) -> Duration {
        Duration::from_nanos(self.qp_create_ns + self.rc_connect_ns)
    }
}
