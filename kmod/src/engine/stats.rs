//! The engine's statistics as [`super::Engine::stats`] returns them: plain
//! values, summed over the DCIs or the RC pairs.

use super::config::EngineMode;
use super::handshake_ud::HandshakeStats;
use super::meta::MetaStats;
use super::rc::RcStats;
use crate::sharedqp::DciStats;

/// Engine-wide statistics, summed over the DCIs (or the RC pairs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// How the engine reaches other nodes.
    pub mode: EngineMode,
    /// DCIs created so far (0 in RC fallback mode).
    pub dcis: usize,
    /// VQPs created so far.
    pub vqps_created: u64,
    /// Connects answered by the DCCache.
    pub connect_hits: u64,
    /// Connects that looked the meta table up.
    pub connect_misses: u64,
    /// The meta client's statistics.
    pub meta: MetaStats,
    /// The DCIs' statistics, summed: the VQPs' traffic. DC mode: the meta
    /// client's READs share DCI 0 but are left out here (doorbells, WRs and
    /// completions; they are counted in `meta`); a failed one's recovery of
    /// the DCI is counted.
    pub dci: DciStats,
    /// DC mode: DCTs (each with its SRQ and receive CQ) created: 0 until
    /// first need (see [`super::Engine::local_target`]), then 1, however many
    /// threads needed it at once.
    pub dcts_created: u32,
    /// UD handshake endpoints created: 1 in RC fallback mode (at start); 0
    /// in DC mode (the upgrade's handshake travels as messages, see
    /// [`super::handshake_msg`]).
    pub handshake_endpoints_created: u32,
    /// RC fallback mode with `handshake_thread`: whether the thread that
    /// answers peers' handshakes runs. It starts when the node's address
    /// is first handed out ([`super::Engine::local_target`], messaging), so a
    /// node that only initiates runs none.
    pub handshake_thread_running: bool,
    /// RC fallback mode (DC mode: the upgraded VQPs'): the RC pairs
    /// (their queues' statistics in `rc.qp`).
    pub rc: RcStats,
    /// The handshake's both sides: RC fallback mode, the UD endpoint; DC
    /// mode with `upgrade_endpoint`, the handshake over messaging (its
    /// `meta_requests`, `ud_recoveries` stay 0).
    pub handshake: HandshakeStats,
    /// MRs the engine owns right now.
    pub owned_mrs: usize,
    /// DC mode: VQPs moved from their DCI to an RC pair (threshold or hint).
    pub rc_upgrades: u64,
    /// DC mode: VQPs moved back to their DCI (their pair was evicted or
    /// lost, or they connected to another target).
    pub rc_downgrades: u64,
    /// DC mode: upgrade attempts that failed (no handshake entry, refused,
    /// timed out, pairs busy); the VQP stayed on its DCI.
    pub rc_upgrade_failures: u64,
}

impl Default for EngineStats {
    fn default() -> EngineStats {
        EngineStats {
            mode: EngineMode::Dc,
            dcis: 0,
            vqps_created: 0,
            connect_hits: 0,
            connect_misses: 0,
            meta: MetaStats::default(),
            dci: DciStats::default(),
            dcts_created: 0,
            handshake_endpoints_created: 0,
            handshake_thread_running: false,
            rc: RcStats::default(),
            handshake: HandshakeStats::default(),
            owned_mrs: 0,
            rc_upgrades: 0,
            rc_downgrades: 0,
            rc_upgrade_failures: 0,
        }
    }
}
