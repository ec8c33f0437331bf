//! [`EngineConfig`]: how an engine is set up.
//!
//! # As a file
//!
//! [`EngineConfig`] and every type nested in it ([`Policy`],
//! [`HandshakeConfig`], [`MsgConfig`]) are serde types, so that a binary
//! can read them from a configuration file (TOML: `[policy]`,
//! `[handshake]` and `[msg]` tables). Every field may be left out (it keeps
//! its default), and a key that names no field is an error that names it.
//! A duration is an integer with its unit in the key: `meta_timeout_ms =
//! 500`, `meta_backoff_us = 1` (see [`units`]). [`EngineConfig::meta`] is
//! runtime state handed over by the builder: never read from, nor written
//! to, a file. `upgrade_after` is written only when set (TOML has no null).
//!
//! The file gives values, not a valid configuration: the checks run when
//! the engine starts (`EngineError::Config`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::EngineError;
use crate::precheck::{Policy, Ungranted};
use krcore_meta::table::Geometry;
use krcore_meta::wire::BootstrapRepr;
use krcore_nic::{DcTarget, RemoteAddr};

/// DC initiators per CPU in KRCore's pool (the paper's Figure 14(a): more
/// than 2 per CPU removes contention; 8 is its default).
pub const DCIS_PER_CPU: usize = 8;

/// The `dc_key` of the engine's DCT unless configured otherwise.
pub const DEFAULT_DC_KEY: u64 = 0x6b72_636f_7265_6463; // "krcoredc"

/// How an engine is set up. Start from [`EngineConfig::default`].
///
/// (De)serializable, as a TOML table with `[policy]`, `[handshake]` and
/// `[msg]` sub-tables: every field optional, unknown keys refused, a
/// duration an integer with its unit in the key (`meta_timeout_ms`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct EngineConfig {
    /// Most DC initiators in the pool (DC mode). Default: [`DCIS_PER_CPU`]
    /// times the CPUs available to the process.
    pub pool_size: usize,
    /// DCIs created at start (the rest on demand, by `create_vqp` and the
    /// first meta lookup, up to `pool_size`; DC mode). Default 0: the
    /// first VQP creates DCI 0, so an engine start creates no QP (see
    /// [`super::Engine::start`]).
    pub prestart: usize,
    /// Send-queue depth of each DCI, and in RC fallback mode of each RC QP
    /// (its CQ has as many entries). Default 128.
    pub dci_depth: u32,
    /// Per-VQP limit of WRs in flight plus completions not yet polled.
    /// Must exceed `policy.max_unsignaled`. Default 128.
    pub vqp_depth: u32,
    /// Pre-check limits; `max_sge`/`max_inline` are clamped to the device's.
    pub policy: Policy,
    /// Run the pre-check's validity checks (b). Capacity (a) and signaling
    /// (c) always run: they keep the shared queue's account exact. Turn it
    /// off only to show what it protects against. Default true.
    pub precheck: bool,
    /// What the pre-check does with a one-sided WR to a (target, rkey) its
    /// VQP knows no grant for: `refuse` (the default: a VQP reaches only
    /// memory it was granted, [`crate::Reason::NotGranted`]) or `allow`
    /// (left to the NIC, for raw verbs users who pass rkeys by hand). The
    /// default of every new VQP; [`super::Vqp::set_ungranted`] changes one.
    pub ungranted: Ungranted,
    /// DCCache capacity in targets. Default 4096.
    pub cache_capacity: usize,
    /// The meta server's table; `None`: connects can only hit the cache.
    /// Runtime state (the builder's), not a file setting: skipped by serde.
    #[serde(skip)]
    pub meta: Option<MetaLocation>,
    /// READs after the first when the bucket is torn. Default 16.
    pub meta_retries: u32,
    /// First pause between torn READs (doubles up to 1 ms). Default 1 us.
    /// In a file: `meta_backoff_us`.
    #[serde(rename = "meta_backoff_us", with = "units::us")]
    pub meta_backoff: Duration,
    /// Longest wait for a meta READ's completion. Default 1 s. In a file:
    /// `meta_timeout_ms`.
    #[serde(rename = "meta_timeout_ms", with = "units::ms")]
    pub meta_timeout: Duration,
    /// Longest a post polls for send-queue credits. Default 1 s. In a
    /// file: `reclaim_timeout_ms`.
    #[serde(rename = "reclaim_timeout_ms", with = "units::ms")]
    pub reclaim_timeout: Duration,
    /// Depth of the DCT's SRQ and receive CQ (DC mode). Default 256.
    pub recv_depth: u32,
    /// The DCT's `dc_key` (DC mode). Default [`DEFAULT_DC_KEY`]. A TOML
    /// integer is signed: a file holds keys up to `i64::MAX`.
    pub dc_key: u64,
    /// Most RC pairs (one per target) at any time, in RC fallback mode and
    /// for the DC -> RC upgrade; past it the least recently used idle pair
    /// is evicted. Default 256.
    pub rc_cap: usize,
    /// The handshake (timeouts, retries, passive QP cap, `retry_cnt` and
    /// `rnr_retry` of the pairs): RC fallback mode's UD endpoint (also its
    /// qkey and slots), and DC mode's upgrade handshake over messaging.
    pub handshake: HandshakeConfig,
    /// RC fallback mode: answer peers' handshakes from a background thread
    /// of the engine's (named `krcore-handshake`), started when the node's
    /// address is first handed out ([`super::Engine::local_target`], what a
    /// node registers with the meta server; the first messaging port or
    /// endpoint): a node that only initiates (a compute node) runs none.
    /// Off, the host must call [`super::Engine::progress`] for this node
    /// to accept connections (its own connects drive its endpoint while
    /// they wait). Default false: the engine starts no thread unless asked;
    /// the SDK turns it on.
    /// DC mode with `upgrade_endpoint`: the thread serves the reserved
    /// handshake port, started when the node starts serving upgrades
    /// ([`super::Engine::handshake_entry`], or `eager_start`); a node that
    /// only initiates upgrades runs none.
    pub handshake_thread: bool,
    /// Two-sided messaging (DC mode): inline threshold, windows, buffers.
    pub msg: MsgConfig,
    /// DC mode, hybrid DC -> RC upgrade: a VQP that posted this many WRs to
    /// its current target moves to an RC pair with that target (see
    /// [`super::Vqp::path`]). `None`: only on an explicit hint
    /// ([`super::Vqp::upgrade`]). After a failed upgrade the next attempt
    /// waits for `threshold << failures` more WRs (at most 2^10 times).
    /// Needs `upgrade_endpoint` on this node too (the pairs are made
    /// through it); without it every attempt fails, counted in
    /// `EngineStats::rc_upgrade_failures`. Ignored in RC fallback mode.
    /// Default `None` (off: a VQP stays on its DCI unless hinted; in a
    /// file, the key left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_after: Option<u64>,
    /// DC mode: the DC -> RC upgrade. Its handshakes travel as messages
    /// (no UD QP, see [`super::handshake_msg`]): a node that serves upgrades
    /// answers them on its DCT's reserved port
    /// [`super::handshake_msg::HANDSHAKE_PORT`], and says so in the meta table
    /// under [`super::handshake_gid`] of its GID: the host registers
    /// [`super::Engine::handshake_entry`] beside
    /// [`super::Engine::local_target`]. Answered from the thread of
    /// `handshake_thread`, or [`super::Engine::progress`]. Default false.
    pub upgrade_endpoint: bool,
    /// DC mode: create at start what is otherwise created on first need:
    /// the DCT with its SRQ and receive CQ (first need: the node must be
    /// reachable, see [`super::Engine::local_target`]) and, with
    /// `upgrade_endpoint`, the reserved handshake port (first need: see
    /// [`super::Engine::handshake_entry`]). For a node that is reached
    /// anyway (a memory node) and should not pay for it later, or that
    /// forks children before it registers. Default false: a node that only
    /// issues one-sided operations never creates them.
    pub eager_start: bool,
    /// Whether the engine takes its port's lock on the machine at start
    /// ([`krcore_nic::Nic::port_lock_path`]): one engine per port, a second
    /// one refused with [`super::EngineError::PortInUse`]. Default true.
    /// Off only where several engines on one port are meant, knowing that
    /// they share the GID (loopback tests and tools: two engines of one
    /// process, of which at most one is reached by its GID).
    pub port_lock: bool,
}

/// serde helpers writing a [`Duration`] as an integer number of one unit
/// (the unit is in the field's name in the file: `#[serde(rename =
/// "timeout_ms", with = "units::ms")]`).
///
/// Deserializing takes any `u64`. Serializing a duration that is not a
/// whole number of the unit (or whose count exceeds `u64`) is an error
/// rather than a silent rounding: what is written reads back the same.
pub(crate) mod units {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    fn count<S: Serializer>(d: &Duration, nanos_per: u128, unit: &str) -> Result<u64, S::Error> {
        let nanos = d.as_nanos();
        if nanos % nanos_per != 0 {
            return Err(serde::ser::Error::custom(format_args!(
                "duration {d:?} is not a whole number of {unit}"
            )));
        }
        u64::try_from(nanos / nanos_per).map_err(|_| {
            serde::ser::Error::custom(format_args!("duration {d:?} overflows u64 {unit}"))
        })
    }

    /// A [`Duration`] as integer milliseconds.
    pub(crate) mod ms {
        use super::*;

        /// Writes `d` in milliseconds.
        ///
        /// # Errors
        /// If `d` is not a whole number of milliseconds.
        pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
            count::<S>(d, 1_000_000, "milliseconds")?.serialize(s)
        }

        /// Reads milliseconds.
        ///
        /// # Errors
        /// If the value is not a `u64`.
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
            u64::deserialize(d).map(Duration::from_millis)
        }
    }

    /// A [`Duration`] as integer microseconds.
    pub(crate) mod us {
        use super::*;

        /// Writes `d` in microseconds.
        ///
        /// # Errors
        /// If `d` is not a whole number of microseconds.
        pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
            count::<S>(d, 1_000, "microseconds")?.serialize(s)
        }

        /// Reads microseconds.
        ///
        /// # Errors
        /// If the value is not a `u64`.
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
            u64::deserialize(d).map(Duration::from_micros)
        }
    }
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        EngineConfig {
            pool_size: DCIS_PER_CPU * cpus,
            prestart: 0,
            dci_depth: 128,
            vqp_depth: 128,
            policy: Policy::default(),
            precheck: true,
            ungranted: Ungranted::Refuse,
            cache_capacity: 4096,
            meta: None,
            meta_retries: 16,
            meta_backoff: Duration::from_micros(1),
            meta_timeout: Duration::from_secs(1),
            reclaim_timeout: Duration::from_secs(1),
            recv_depth: 256,
            dc_key: DEFAULT_DC_KEY,
            rc_cap: 256,
            handshake: HandshakeConfig::default(),
            handshake_thread: false,
            msg: MsgConfig::default(),
            upgrade_after: None,
            upgrade_endpoint: false,
            eager_start: false,
            port_lock: true,
        }
    }
}

impl EngineConfig {
    /// With the meta server at `meta`.
    pub fn with_meta(mut self, meta: MetaLocation) -> EngineConfig {
        self.meta = Some(meta);
        self
    }

    /// With at most `n` DCIs.
    pub fn with_pool_size(mut self, n: usize) -> EngineConfig {
        self.pool_size = n;
        self
    }

    /// With the pre-check's validity checks on or off.
    pub fn with_precheck(mut self, on: bool) -> EngineConfig {
        self.precheck = on;
        self
    }

    /// With the RC fallback's handshake thread on or off.
    pub fn with_handshake_thread(mut self, on: bool) -> EngineConfig {
        self.handshake_thread = on;
        self
    }

    /// With at most `n` RC pairs (RC fallback mode).
    pub fn with_rc_cap(mut self, n: usize) -> EngineConfig {
        self.rc_cap = n;
        self
    }

    /// With the DC -> RC upgrade after `n` WRs to one target (`None`: on
    /// hints only).
    pub fn with_upgrade_after(mut self, n: Option<u64>) -> EngineConfig {
        self.upgrade_after = n;
        self
    }

    /// With the DC mode handshake endpoint (answering peers' upgrades) on
    /// or off.
    pub fn with_upgrade_endpoint(mut self, on: bool) -> EngineConfig {
        self.upgrade_endpoint = on;
        self
    }

    /// With the port's lock taken at start (`true`, the default) or not
    /// (see [`EngineConfig::port_lock`]).
    pub fn with_port_lock(mut self, on: bool) -> EngineConfig {
        self.port_lock = on;
        self
    }

    /// With the DCT (and the upgrade's handshake endpoint) created at start
    /// (`true`) or on first need (`false`, the default).
    pub fn with_eager_start(mut self, on: bool) -> EngineConfig {
        self.eager_start = on;
        self
    }

    /// With `rule` for one-sided WRs under no known grant (see
    /// [`EngineConfig::ungranted`]).
    pub fn with_ungranted(mut self, rule: Ungranted) -> EngineConfig {
        self.ungranted = rule;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::Config(m));
        if self.pool_size == 0 {
            return bad("pool_size must be at least 1".into());
        }
        if self.prestart > self.pool_size {
            return bad(format!(
                "prestart {} exceeds pool_size {}",
                self.prestart, self.pool_size
            ));
        }
        if self.dci_depth < 2 {
            return bad("dci_depth must be at least 2".into());
        }
        if self.vqp_depth <= self.policy.max_unsignaled {
            return bad(format!(
                "vqp_depth {} must exceed policy.max_unsignaled {}",
                self.vqp_depth, self.policy.max_unsignaled
            ));
        }
        if self.cache_capacity == 0 || self.recv_depth == 0 {
            return bad("cache_capacity and recv_depth must be non-zero".into());
        }
        if self.rc_cap == 0 || self.handshake.passive_cap == 0 {
            return bad("rc_cap and handshake.passive_cap must be non-zero".into());
        }
        if self.upgrade_after == Some(0) {
            return bad("upgrade_after must be at least 1 (None turns it off)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_toml(c: &EngineConfig) -> String {
        toml::to_string_pretty(c).expect("a default config serializes")
    }

    #[test]
    fn default_round_trips_through_toml() {
        let def = EngineConfig::default();
        let text = to_toml(&def);
        let back: EngineConfig = toml::from_str(&text).expect("its own output parses");
        assert_eq!(to_toml(&back), text);
        assert_eq!(back.meta_backoff, def.meta_backoff);
        assert_eq!(back.handshake.idle_sleep, def.handshake.idle_sleep);
        assert_eq!(back.msg.timeout, def.msg.timeout);
        assert_eq!(back.policy, def.policy);
        assert!(back.validate().is_ok());
        // The units are in the keys; runtime state and unset options are not.
        for key in [
            "meta_backoff_us = 1",
            "meta_timeout_ms = 1000",
            "[handshake]",
        ] {
            assert!(text.contains(key), "{key} missing from:\n{text}");
        }
        assert!(!text.contains("meta ="), "{text}");
        assert!(!text.contains("upgrade_after"), "{text}");
    }

    #[test]
    fn empty_file_is_the_default() {
        let c: EngineConfig = toml::from_str("").expect("empty parses");
        assert_eq!(to_toml(&c), to_toml(&EngineConfig::default()));
    }

    #[test]
    fn partial_file_overrides_only_what_it_names() {
        let text =
            "pool_size = 3\nmeta_timeout_ms = 500\nupgrade_after = 64\nungranted = \"allow\"\n\
                    [policy]\nmax_unsignaled = 8\n\
                    [handshake]\nidle_sleep_us = 7\n\
                    [msg]\nwindow = 2\ncontrol_idle_ms = 250\n";
        let c: EngineConfig = toml::from_str(text).expect("partial parses");
        let mut want = EngineConfig::default()
            .with_pool_size(3)
            .with_upgrade_after(Some(64))
            .with_ungranted(Ungranted::Allow);
        want.meta_timeout = Duration::from_millis(500);
        want.policy.max_unsignaled = 8;
        want.handshake.idle_sleep = Duration::from_micros(7);
        want.msg.window = 2;
        want.msg.control_idle = Duration::from_millis(250);
        assert_eq!(to_toml(&c), to_toml(&want));
        // Untouched fields of a touched table keep their defaults.
        assert_eq!(c.policy.max_sge, Policy::default().max_sge);
        assert_eq!(c.handshake.timeout, HandshakeConfig::default().timeout);
        assert!(c.meta.is_none());
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        for (text, key) in [
            ("pool_sise = 3\n", "pool_sise"),
            // The field's own name is not the file's: the unit is required.
            ("meta_timeout = 500\n", "meta_timeout"),
            ("[msg]\nwindwo = 2\n", "windwo"),
            ("[handshake]\ntimeout = 20\n", "timeout"),
            ("[policy]\nmax_unsignalled = 2\n", "max_unsignalled"),
            ("meta = 1\n", "meta"),
        ] {
            let err = toml::from_str::<EngineConfig>(text)
                .expect_err(text)
                .to_string();
            assert!(err.contains(&format!("unknown field `{key}`")), "{err}");
        }
    }

    #[test]
    fn durations_not_whole_in_their_unit_do_not_serialize() {
        let c = EngineConfig {
            meta_timeout: Duration::from_micros(1500),
            ..EngineConfig::default()
        };
        let err = toml::to_string(&c).expect_err("1.5 ms in ms").to_string();
        assert!(err.contains("milliseconds"), "{err}");
    }

    /// Prints the default file (`cargo test -p krcore-kmod --lib
    /// print_default_toml -- --nocapture`).
    #[test]
    fn print_default_toml() {
        println!("{}", to_toml(&EngineConfig::default()));
    }
}

/// The default qkey of a handshake endpoint (ASCII "KRHS").
pub const DEFAULT_HANDSHAKE_QKEY: u32 = u32::from_le_bytes(*b"KRHS");

/// How a handshake endpoint is set up and how handshakes wait.
///
/// (De)serializable, as the `[handshake]` table of an
/// [`super::EngineConfig`] file: any subset of fields, unknown keys
/// refused, durations as `timeout_ms` and `idle_sleep_us`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HandshakeConfig {
    /// qkey of the UD QP. Registered in the meta entry's `dc_key` field in
    /// RC fallback mode. Default [`DEFAULT_HANDSHAKE_QKEY`].
    pub qkey: u32,
    /// UD receive buffers kept posted. Default 64.
    pub recv_slots: u32,
    /// UD send slots. Default 32.
    pub send_slots: u32,
    /// Wait for an answer after the first Request; each retry waits twice
    /// as long as the attempt before, up to 16 times this
    /// ([`HandshakeConfig::attempt_timeout`]): a peer whose serving thread
    /// a loaded host does not run for tens of milliseconds still answers
    /// in time, while a dead one fails after a bounded, typed wait.
    /// Default 20 ms. In a file: `timeout_ms`.
    #[serde(rename = "timeout_ms", with = "units::ms")]
    pub timeout: Duration,
    /// Requests re-sent after a timeout. Default 4 (5 attempts: 20 + 40 +
    /// 80 + 160 + 320 ms, at most 620 ms in all with the default timeout;
    /// see [`HandshakeConfig::total_wait`]).
    pub retries: u32,
    /// Most passive RC QPs (this node's ends of peers' pairs). Default 1024.
    pub passive_cap: usize,
    /// At `passive_cap`, a Request for a new pair is refused (Reject with
    /// [`RejectCode::Full`](crate::handshake::RejectCode::Full); the initiator gets a typed
    /// [`HandshakeFailure::Rejected`](super::HandshakeFailure::Rejected)) instead of evicting the least
    /// recently handshaken passive QP. Retries and re-handshakes of pairs
    /// this responder already holds are still answered. Default false.
    pub refuse_when_full: bool,
    /// `retry_cnt` of both ends at RTS: transport retries before
    /// `RETRY_EXC_ERR`. Default 3.
    pub retry_cnt: u8,
    /// `rnr_retry` of both ends at RTS. Default 3.
    pub rnr_retry: u8,
    /// First sleep of the progress thread after an idle spell, doubled
    /// per idle poll up to 2 ms (or this, if larger): see
    /// `engine::idle`. Default 100 us. In a file: `idle_sleep_us`.
    #[serde(rename = "idle_sleep_us", with = "units::us")]
    pub idle_sleep: Duration,
}

/// Most doublings of the handshake's per-attempt wait (16 times
/// `timeout`).
const MAX_DOUBLINGS: u32 = 4;

impl HandshakeConfig {
    /// How long attempt `attempt` (0: the first Request) waits for its
    /// answer: `timeout` doubled per attempt before it, at most
    /// `16 * timeout`.
    pub fn attempt_timeout(&self, attempt: u32) -> Duration {
        self.timeout.saturating_mul(1 << attempt.min(MAX_DOUBLINGS))
    }

    /// The longest a handshake waits for answers in all (every attempt
    /// timing out): the bound of a dead target's typed
    /// [`HandshakeFailure::Timeout`](super::HandshakeFailure::Timeout).
    pub fn total_wait(&self) -> Duration {
        (0..self.retries.saturating_add(1))
            .map(|a| self.attempt_timeout(a))
            .fold(Duration::ZERO, Duration::saturating_add)
    }
}

impl Default for HandshakeConfig {
    fn default() -> HandshakeConfig {
        HandshakeConfig {
            qkey: DEFAULT_HANDSHAKE_QKEY,
            recv_slots: 64,
            send_slots: 32,
            timeout: Duration::from_millis(20),
            retries: 4,
            passive_cap: 1024,
            refuse_when_full: false,
            retry_cnt: 3,
            rnr_retry: 3,
            idle_sleep: Duration::from_micros(100),
        }
    }
}

/// How messaging is set up (part of [`super::EngineConfig`]).
///
/// (De)serializable, as the `[msg]` table of an [`super::EngineConfig`]
/// file: any subset of fields, unknown keys refused, durations as
/// `control_idle_ms`, `timeout_ms` and `idle_sleep_us`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MsgConfig {
    /// Largest body sent inline through the SRQ; longer ones travel as a
    /// descriptor and are pulled with one READ. Each receive buffer is
    /// `HEADER_LEN + inline_max` bytes. Default 8192.
    pub inline_max: usize,
    /// Largest message. Default 16 MiB.
    pub max_message: usize,
    /// Credits a channel asks for (data messages in flight or unpopped).
    /// Default 8.
    pub window: u32,
    /// Replies a channel can hold at the sender (reserved from the
    /// sender's receive budget at Open). Default 4.
    pub reply_window: u32,
    /// Receive slots a bind reserves for its port (shared by its senders'
    /// windows). Default 64.
    pub port_slots: u32,
    /// Credits the engine's own control endpoints (the upgrade handshake,
    /// meta registration) ask for: they are request/response with one
    /// request outstanding, so one credit suffices, and a reserved port's
    /// `port_slots` admit that many initiators at once. Default 1.
    pub control_window: u32,
    /// How long a channel to one of the engine's reserved ports must have
    /// been idle before the port may reclaim it for another sender, when
    /// its slots are all granted (a sender that crashed, or whose Close
    /// was lost, holds a slot until then). Default 1 s. In a file:
    /// `control_idle_ms`.
    #[serde(rename = "control_idle_ms", with = "units::ms")]
    pub control_idle: Duration,
    /// Receive slots kept for control messages. Default 32.
    pub ctl_slots: u32,
    /// Longest a blocking call waits (push for a credit or the Open's
    /// answer, pop, reply, a descriptor READ). Default 5 s. In a file:
    /// `timeout_ms`.
    #[serde(rename = "timeout_ms", with = "units::ms")]
    pub timeout: Duration,
    /// Drain the receive CQ from a thread of the engine's (named
    /// `krcore-msg`, started by the first bind/endpoint, joined when the
    /// engine is dropped), so that Opens are answered and credits flow
    /// while this node's users do not call in. Off, the host calls
    /// [`Engine::msg_progress`](super::Engine::msg_progress) (every messaging call drains it too).
    /// Default false (the engine starts no thread unless asked); the SDK
    /// turns it on.
    pub progress_thread: bool,
    /// First sleep of the progress thread after an idle spell, doubled
    /// per idle poll up to 2 ms (or this, if larger): see
    /// `engine::idle`. Default 50 us. In a file: `idle_sleep_us`.
    #[serde(rename = "idle_sleep_us", with = "units::us")]
    pub idle_sleep: Duration,
}

impl Default for MsgConfig {
    fn default() -> MsgConfig {
        MsgConfig {
            inline_max: 8192,
            max_message: 16 << 20,
            window: 8,
            reply_window: 4,
            port_slots: 64,
            control_window: 1,
            control_idle: Duration::from_secs(1),
            ctl_slots: 32,
            timeout: Duration::from_secs(5),
            progress_thread: false,
            idle_sleep: Duration::from_micros(50),
        }
    }
}

/// Where the meta server's table is: what a client needs to READ it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaLocation {
    /// The server's DC target (the table is READ through it). In RC
    /// fallback mode: the meta node's handshake endpoint (`dct_num` = its
    /// UD QPN, `dc_key` = its qkey), see the module docs.
    pub server: DcTarget,
    /// Remote address and rkey of the table's first byte.
    pub table: RemoteAddr,
    /// The table's shape.
    pub geometry: Geometry,
}

impl MetaLocation {
    /// The location a bootstrap reply describes.
    ///
    /// # Errors
    /// [`EngineError::Bootstrap`] when the table's layout is not one this
    /// build reads.
    pub fn from_bootstrap(b: &BootstrapRepr) -> Result<MetaLocation, EngineError> {
        Ok(MetaLocation {
            server: b.server,
            table: b.table,
            geometry: b.geometry()?,
        })
    }
}

/// How the engine reaches other nodes, decided at start from the device's
/// capabilities ([`krcore_nic::DeviceCaps::dc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EngineMode {
    /// KRCore proper: a pool of shared DC initiators; connect is a lookup.
    Dc,
    /// The device has no DC (Soft-RoCE, non-ConnectX NICs): each target is
    /// reached through one RC QP shared by the node's VQPs, made by a
    /// handshake over UD and cached (LRU, `EngineConfig::rc_cap`).
    RcFallback,
}

impl std::fmt::Display for EngineMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineMode::Dc => "DC",
            EngineMode::RcFallback => "RC fallback",
        })
    }
}
