//! The RACE client: one-sided reads and CASes on memory nodes, no I/O of its
//! own (everything goes through a [`Transport`]) and no clock of its own
//! (time comes from the caller's [`Clock`]).
//!
//! The protocol is documented in [`protocol`]; this module holds the public
//! API. A [`Client`] is one user of the table (one thread; `Send`, not
//! `Sync`); any number of clients, in any threads or processes, share a table
//! through the memory nodes only.
//!
//! ```
//! use std::sync::Arc;
//! use race_store::client::{Client, ClientConfig};
//! use race_store::clock::SystemClock;
//! use race_store::memory::{ClusterConfig, LocalCluster};
//!
//! # fn main() -> Result<(), race_store::Error> {
//! let cluster = LocalCluster::new(ClusterConfig::default())?;
//! let clock = Arc::new(SystemClock::new());
//! let mut client = Client::open(cluster.transport(), clock, ClientConfig::default())?;
//! client.insert(b"user:42", b"alice")?;
//! assert_eq!(client.get(b"user:42")?.as_deref(), Some(&b"alice"[..]));
//! client.rmw(b"visits", |v| {
//!     let n = v.map_or(0, |b| b.len()) + 1;
//!     Some(vec![b'x'; n])
//! })?;
//! client.delete(b"user:42")?;
//! assert_eq!(client.get(b"user:42")?, None);
//! let report = client.close(); // its memory goes back to the nodes
//! assert!(report.error.is_none());
//! # Ok(()) }
//! ```
//!
//! # Closing
//! A client takes memory from the memory nodes in coarse blocks and keeps
//! the blocks it frees for itself ([`crate::client::protocol`],
//! "Reclamation"). [`Client::close`] gives all of it back to the nodes,
//! which hand it to the next clients before new memory
//! ([`crate::pool`]): its free blocks and uncarved runs, usable at once,
//! and the blocks it retired, which the nodes hold for what is left of
//! their grace period. That needs a clock that follows real time
//! ([`Clock::tick`]: [`crate::clock::SystemClock`],
//! [`crate::clock::WallClock`]); with a clock of its own, `close` waits
//! the grace period out first (at most `grace_ticks`). Dropping a client
//! gives back the same, and ends its grant leases, without waiting for
//! the nodes' answers (and, with a clock of its own, keeps its retired
//! blocks). Everything of a client
//! that crashed stays allocated for good.

mod alloc;
mod batch;
mod collect;
mod engine;
pub mod protocol;
mod scan;
mod split;
mod sweep;
mod verify;
mod view;
mod write;

use std::sync::Arc;

pub use alloc::{KvMemoryStats, ReturnReport, CLASS_UNITS, FREE_HIGH, FREE_KEEP, MAX_REFILL};
pub use batch::{Op, Reply};
pub use collect::{CollectOptions, NodeCollect};
pub use scan::{ScanReport, RESCAN_PASSES, RESCAN_TRIES};
pub use sweep::SweepReport;
pub use verify::{NodeAccount, TableCheck};

use crate::clock::Clock;
use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::kv;
use crate::layout::slot::RemotePtr;
use crate::layout::table::{SuperblockRepr, CLIENT_COUNTER_OFFSET, SUPERBLOCK_SIZE};
use crate::remote::{Completions, RemoteOp, Transport, TransportStats};

use alloc::KvAllocator;
use engine::{CachedBlock, DirCache, OpCtx, ViewState};
use write::{Decision, InsertMode};

/// Tunables of a client; every duration is in [`Clock`] ticks.
///
/// (De)serializable for configuration files, the keys being the field
/// names (the unit, ticks or bytes, is in each): any subset of fields (the
/// rest keep their defaults), unknown keys refused. Values are checked when
/// a client is made, not on reading. A TOML integer is signed: a file holds
/// values up to `i64::MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// Lease of the resize lock: a client that holds it longer without
    /// renewing may be overtaken by another one.
    pub lease_ticks: u64,
    /// Unit of the lease expiry stored in the directory header (39 bits of
    /// it): 1000 microsecond ticks = milliseconds, 17 years of range.
    pub lease_unit_ticks: u64,
    /// Longest an attempt of an operation may use what it read: past this,
    /// the attempt restarts from the bucket READ (see [`protocol`],
    /// reclamation).
    pub max_op_ticks: u64,
    /// How long a retired KV block waits before reuse. Must exceed
    /// `2 * max_op_ticks`, plus the clock skew and stall margin you assume.
    pub grace_ticks: u64,
    /// Retries of one operation before [`Error::Contention`].
    pub max_attempts: u32,
    /// Smallest coarse block asked from a memory node for KV blocks (later
    /// refills grow with the footprint, see [`MAX_REFILL`]).
    pub coarse_block_bytes: u64,
    /// What a writer does after it lost a CAS to another writer (write
    /// conflict avoidance under skew; `conflict = "retry"` in a file).
    pub conflict: ConflictPolicy,
    /// Bytes of retired KV blocks (a grace period of this client's writes)
    /// past which it hands the oldest to their memory nodes with what is
    /// left of their grace period, while it runs (with a clock that follows
    /// real time): then what a killed client leaks is bounded by about
    /// this (and [`FREE_HIGH`] per node and size class), where it is
    /// otherwise a grace period of its writes (0.3 s at 300 MB/s of
    /// updates: 90 MB). Off by default (`i64::MAX`, TOML's largest
    /// integer, [`RETIRED_HIGH_OFF`]): once a client writes
    /// faster than this mark per grace period, every block it retires goes
    /// through its node's pool instead of its own free list, and that
    /// costs. Measured in process (YCSB-A, 100,000 records, 600,000
    /// operations, `--batch 16`, 2 memory nodes, about 100 MiB retired at
    /// a time), against off: 64 MiB, 429-485 k ops/s against 510-533 k,
    /// update p99.9 160-820 us against 86-105 us (3 rounds each, taken in
    /// turn); 8 MiB, 451-457 k against 509-523 k. Once the memory nodes'
    /// pool stopped walking short runs (`crate::pool`), 64 MiB against off
    /// was within the machine's swing (6 rounds in turn: 367-491 k, median
    /// 443 k, against 376-439 k, median 417 k); off by default until it is
    /// measured on hardware.
    pub retired_high_bytes: u64,
}

/// [`ClientConfig::retired_high_bytes`] that never hands retired blocks
/// over: `i64::MAX` bytes, which a TOML file can hold.
pub const RETIRED_HIGH_OFF: u64 = i64::MAX as u64;

/// What a writer does after it lost a CAS on a slot to another writer,
/// before it searches again ([`ClientConfig::conflict`]). Either way the
/// loss is counted ([`ClientStats::cas_failures`]) and the attempt
/// restarts ([`ClientStats::retries`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConflictPolicy {
    /// Search again at once (RACE's behaviour): under skew the loser meets
    /// the next writer of the hot key mid-update, and loses again.
    Retry,
    /// Back off first: a random pause ([`Clock::pause`]) below the lost
    /// attempt's own duration (the time the winner needs for the same
    /// round trips), doubled per loss of the same operation up to 16 of
    /// them and at most `max_op_ticks / 4`: randomized exponential
    /// backoff in units of the conflict window, so that the hot key's
    /// writers spread out in time instead of meeting again.
    #[default]
    Backoff,
}

impl Default for ClientConfig {
    /// For a [`crate::clock::SystemClock`] (microsecond ticks): 1 s lease,
    /// 100 ms attempts, 300 ms grace, coarse blocks from 4 KiB.
    fn default() -> Self {
        Self {
            lease_ticks: 1_000_000,
            lease_unit_ticks: 1_000,
            max_op_ticks: 100_000,
            grace_ticks: 300_000,
            max_attempts: 100_000,
            coarse_block_bytes: 4 << 10,
            conflict: ConflictPolicy::Backoff,
            retired_high_bytes: RETIRED_HIGH_OFF,
        }
    }
}

impl ClientConfig {
    fn validate(&self) -> Result<(), Error> {
        if self.max_op_ticks == 0 || self.grace_ticks <= 2 * self.max_op_ticks {
            return Err(Error::BadTable {
                reason: "grace_ticks must exceed 2 * max_op_ticks > 0",
            });
        }
        if self.lease_ticks == 0 || self.lease_unit_ticks == 0 || self.max_attempts == 0 {
            return Err(Error::BadTable {
                reason: "lease_ticks, lease_unit_ticks and max_attempts must be positive",
            });
        }
        Ok(())
    }
}

/// What a client did (cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Round trips, operations and bytes on the transport.
    pub transport: TransportStats,
    /// Attempts restarted (failed CAS, stale cache, expired attempt, ...).
    pub retries: u64,
    /// CASes on a slot lost to another writer (each restarts an attempt).
    pub cas_failures: u64,
    /// Directory re-reads.
    pub dir_refreshes: u64,
    /// Waits for a split in progress (frozen or retired subtable).
    pub split_waits: u64,
    /// Splits this client completed (its own or taken over).
    pub splits: u64,
    /// Directory doublings this client did.
    pub doublings: u64,
    /// Expired resize leases this client broke.
    pub takeovers: u64,
    /// KV blocks that failed their checks when read (torn or reused).
    pub bad_blocks: u64,
    /// Copies of a key this client removed: its own tentative copy,
    /// withdrawn (another insert of the key won, or its commit deadline
    /// passed), or extra committed copies a delete took away.
    pub dups_removed: u64,
    /// Other inserters' tentative copies this client removed: in the way
    /// of its own (at a higher address), or left by a dead inserter.
    pub rivals_removed: u64,
    /// Waves of batched operations that ran as two groups with their
    /// doorbells overlapped (see [`Client::batch`]).
    pub overlapped_waves: u64,
    /// KV block memory.
    pub kv_memory: KvMemoryStats,
}

/// A client of one RACE table (see the module docs).
///
/// Aligned to 128 bytes (two cache lines, the unit the adjacent-line
/// prefetcher moves): a client is one thread's and updates its own fields
/// on every operation, so clients kept side by side (a vector of
/// per-thread clients) must not share a cache line.
#[repr(align(128))]
pub struct Client<T: Transport> {
    transport: T,
    clock: Arc<dyn Clock>,
    config: ClientConfig,
    id: u16,
    table: SuperblockRepr,
    dir: DirCache,
    alloc: KvAllocator,
    spare_subtables: Vec<RemotePtr>,
    stats: ClientStats,
    /// Reused storage: doorbell results of the hot paths, and the block
    /// cache of an operation ([`OpCtx`]).
    results: Completions,
    blocks: Vec<(u64, CachedBlock)>,
    /// Whether the current write operation has sent an atomic (the step
    /// that makes a write visible): a transport failure after it leaves
    /// the outcome unknown ([`Error::OutcomeUnknown`]).
    pub(crate) atomic_sent: bool,
    /// State of the backoff's random pauses (never 0).
    jitter: u64,
    /// Reused storage of [`Client::batch_into`].
    batch: batch::Scratch,
    /// Empty slots chosen by the CAS rounds of the current batch wave, of
    /// both its groups (see `batch::rounds`).
    wave_claims: Vec<RemotePtr>,
    /// [`Client::close`] ran: the drop gives nothing back.
    closed: bool,
}

impl<T: Transport> Drop for Client<T> {
    /// Gives the client's memory back without waiting for answers (see
    /// "Closing" in the module docs); [`Client::close`] waits for them and
    /// reports.
    fn drop(&mut self) {
        if !self.closed {
            let now = self.now();
            let tick = self.clock.tick();
            let _ = self.alloc.give_back(&mut self.transport, now, tick, false);
        }
    }
}

impl<T: Transport> core::fmt::Debug for Client<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id)
            .field("global_depth", &self.dir.global_depth())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<T: Transport> Client<T> {
    /// Opens the table on the memory nodes behind `transport`: reads the
    /// superblock and takes a client id (one round trip), then reads the
    /// directory (one or two).
    ///
    /// # Errors
    /// [`Error::BadTable`] for an invalid configuration or a node count that
    /// differs from the table's, [`Error::Corrupt`] for a bad superblock,
    /// transport errors.
    pub fn open(transport: T, clock: Arc<dyn Clock>, config: ClientConfig) -> Result<Self, Error> {
        config.validate()?;
        let mut client = Self {
            alloc: KvAllocator::new(
                transport.nodes(),
                config.grace_ticks,
                config.coarse_block_bytes,
            )
            .with_backoff(config.lease_ticks)
            .with_tick(clock.tick(), config.retired_high_bytes),
            transport,
            clock,
            config,
            id: 0,
            table: SuperblockRepr {
                geometry: crate::layout::subtable::SubtableGeometry::DEFAULT,
                max_global_depth: 0,
                nodes: 0,
                dir_offset: 0,
                split_log_offset: 0,
            },
            dir: DirCache::default(),
            spare_subtables: Vec::new(),
            stats: ClientStats::default(),
            results: Completions::new(),
            blocks: Vec::new(),
            atomic_sent: false,
            jitter: 1,
            batch: batch::Scratch::default(),
            wave_claims: Vec::new(),
            closed: false,
        };
        let sb_ptr = RemotePtr::new(0, 0)?;
        let mut res = client.exec(&[
            RemoteOp::Read {
                ptr: sb_ptr,
                len: SUPERBLOCK_SIZE as u32,
            },
            RemoteOp::Faa {
                ptr: sb_ptr.add(CLIENT_COUNTER_OFFSET)?,
                add: 1,
            },
        ])?;
        let id = engine::take_faa(&mut res, 1)?;
        let sb = engine::take_read(&mut res, 0)?;
        client.table = SuperblockRepr::parse(&sb).map_err(|e| Error::corrupt("superblock", e))?;
        if client.table.nodes != client.transport.nodes() {
            return Err(Error::BadTable {
                reason:
                    "the transport reaches a different number of memory nodes than the table has",
            });
        }
        if client.table.dir_offset != crate::layout::table::DIR_OFFSET {
            return Err(Error::BadTable {
                reason: "directory is not at DIR_PTR",
            });
        }
        client.id = id as u16;
        // Distinct per client (id) and per run (the clock).
        client.jitter = (id.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ client.now().rotate_left(32))
        .max(1);
        client.refresh_directory()?;
        Ok(client)
    }

    /// This client's id (its owner id in the resize lock).
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The table's superblock, as read at open.
    pub fn table(&self) -> &SuperblockRepr {
        &self.table
    }

    /// Global depth of the cached directory.
    pub fn cached_global_depth(&self) -> u8 {
        self.dir.global_depth()
    }

    /// Cumulative statistics.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            kv_memory: self.alloc.stats(),
            ..self.stats
        }
    }

    /// Attempts restarted so far ([`ClientStats::retries`], without the
    /// cost of gathering the other statistics).
    pub fn retries(&self) -> u64 {
        self.stats.retries
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport, mutably (e.g. to change a fault plan).
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// Closes the client and gives its memory back to the memory nodes
    /// (see "Closing" in the module docs): its free blocks, its uncarved
    /// runs, the blocks it asked for ahead, and the blocks it retired (held
    /// by the nodes for the rest of their grace period; with a clock that
    /// does not follow real time, `close` first waits until they are past
    /// it, at most `grace_ticks` on its clock). The report says how much
    /// went back, how much stayed (a node that failed, or one of an older
    /// version that takes nothing back:
    /// [`crate::remote::TransportError::Unsupported`]), and the first
    /// failure.
    pub fn close(mut self) -> ReturnReport {
        let tick = self.clock.tick();
        if let (None, Some(end)) = (tick, self.alloc.quarantine_ends()) {
            let now = self.now();
            if end > now {
                self.clock.pause(end - now);
            }
        }
        let now = self.now();
        self.closed = true;
        self.alloc.give_back(&mut self.transport, now, tick, true)
    }

    /// The value of `key`: 2 round trips on a hit (both combined buckets in
    /// one doorbell, then the matching KV blocks in one), 1 on a miss
    /// without fingerprint matches. Never waits, except on a key whose
    /// subtable is between the two last steps of a split.
    ///
    /// # Errors
    /// [`Error::EmptyKey`], [`Error::KeyTooLarge`], transport errors,
    /// [`Error::Contention`].
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        check_key(key)?;
        let hash = KeyHash::of(key);
        let mut ctx = OpCtx::reusing(std::mem::take(&mut self.blocks));
        let r = self.get_in(key, &hash, &mut ctx);
        self.blocks = ctx.into_storage();
        r
    }

    fn get_in(
        &mut self,
        key: &[u8],
        hash: &KeyHash,
        ctx: &mut OpCtx,
    ) -> Result<Option<Vec<u8>>, Error> {
        loop {
            self.begin_attempt(ctx)?;
            let view = self.read_buckets(hash, &[])?;
            let (state, candidates) = view.search(hash);
            match state {
                ViewState::Ok | ViewState::Frozen => {}
                ViewState::Stale => {
                    self.refresh_directory()?;
                    continue;
                }
                ViewState::Retired => {
                    self.await_split(hash, view.sub(), ctx)?;
                    continue;
                }
            }
            let Some(value) = self.lowest_value(&candidates, key, ctx)? else {
                continue;
            };
            if !self.fresh(ctx) {
                continue;
            }
            return Ok(value);
        }
    }

    /// Inserts `key` if it is absent: 3 round trips without contention and
    /// fingerprint matches (WRITE block + READ buckets; CAS of a tentative
    /// copy + re-READ; commit CAS), one more to read blocks with a matching
    /// fingerprint. The insert takes effect at the commit: until then no
    /// reader sees the value (see "Insert" in [`protocol`]).
    ///
    /// # Errors
    /// [`Error::KeyExists`], the input errors, [`Error::OutOfMemory`],
    /// transport errors, [`Error::Contention`].
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        check_kv(key, value)?;
        let inserted = self.write_op("insert", |c| {
            c.insert_or_put(key, value, &KeyHash::of(key), InsertMode::Insert)
        })?;
        match inserted {
            true => Ok(()),
            false => Err(Error::KeyExists),
        }
    }

    /// Sets `key` to `value`, inserting it if absent (upsert).
    ///
    /// # Errors
    /// As [`Client::insert`], except [`Error::KeyExists`].
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        check_kv(key, value)?;
        self.write_op("put", |c| {
            c.insert_or_put(key, value, &KeyHash::of(key), InsertMode::Put)
        })
        .map(|_| ())
    }

    /// Replaces the value of an existing key: 3 round trips (buckets, blocks,
    /// WRITE new block + CAS old slot to new).
    ///
    /// # Errors
    /// [`Error::NotFound`], the input errors, [`Error::OutOfMemory`],
    /// transport errors, [`Error::Contention`].
    pub fn update(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        check_kv(key, value)?;
        self.write_op("update", |c| {
            c.modify(key, &mut |cur| match cur {
                Some(_) => Ok(Decision::Write(value.to_vec())),
                None => Err(Error::NotFound),
            })
        })
        .map(|_| ())
    }

    /// Removes a key (CAS its slot to empty).
    ///
    /// # Errors
    /// [`Error::NotFound`], the key errors, transport errors,
    /// [`Error::Contention`].
    pub fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        check_key(key)?;
        self.write_op("delete", |c| {
            c.modify(key, &mut |cur| match cur {
                Some(_) => Ok(Decision::Remove),
                None => Err(Error::NotFound),
            })
        })
        .map(|_| ())
    }

    /// Read-modify-write: `f` gets the current value (`None` if absent) and
    /// returns the new one (`None` deletes). Retried, with `f` called again,
    /// until the write applies to the value `f` saw. Returns the value now
    /// stored.
    ///
    /// # Errors
    /// [`Error::ValueTooLarge`] if `f` returns a value too large (nothing is
    /// written), the key errors, [`Error::OutOfMemory`], transport errors,
    /// [`Error::Contention`].
    pub fn rmw<F>(&mut self, key: &[u8], mut f: F) -> Result<Option<Vec<u8>>, Error>
    where
        F: FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    {
        check_key(key)?;
        self.write_op("rmw", |c| {
            c.modify(key, &mut |cur| {
                Ok(match (cur.is_some(), f(cur)) {
                    (_, Some(v)) => {
                        check_kv(key, &v)?;
                        Decision::Write(v)
                    }
                    (true, None) => Decision::Remove,
                    (false, None) => Decision::Keep,
                })
            })
        })
    }

    /// Runs the write operation `op`: a transport failure after it sent an
    /// atomic is [`Error::OutcomeUnknown`] (the write may have applied);
    /// one before is [`Error::Transport`] (it did not).
    fn write_op<R>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&mut Self) -> Result<R, Error>,
    ) -> Result<R, Error> {
        self.atomic_sent = false;
        let r = f(self);
        if r.as_ref().is_err_and(Error::may_leave_work) {
            self.hold_early_ends();
        }
        self.trim();
        match r {
            Err(Error::Transport(source)) if self.atomic_sent => {
                Err(Error::OutcomeUnknown { op, source })
            }
            r => r,
        }
    }

    /// Finishes a resize abandoned by a dead client, if any: takes the resize
    /// lock when it is free or its lease has expired, completes the logged
    /// split, releases the lock. Clients do this on their own when they meet
    /// the abandoned subtable; a tool or a test can force it. `Ok(false)` if
    /// another client holds the lock under a live lease.
    ///
    /// # Errors
    /// Transport errors, [`Error::Corrupt`] for a garbage directory header.
    pub fn recover_resize(&mut self) -> Result<bool, Error> {
        self.take_over_now()
    }

    /// Reads the whole table and checks its invariants (directory, headers,
    /// slots, KV blocks, duplicates); returns every key-value pair. For tests
    /// and tools: it reads everything, with many round trips.
    ///
    /// # Errors
    /// Transport errors; problems found are reported in the result.
    pub fn check_table(&mut self) -> Result<TableCheck, Error> {
        verify::check_table(self, true)
    }

    /// [`Client::check_table`] without the pairs: the same reads and
    /// checks, but keys are counted (`keys`) and duplicates found one
    /// subtable at a time, so the checker holds one subtable's keys, not
    /// the store's keys and values (`race-kv check`). A committed copy in
    /// a subtable its key does not belong to is reported as a problem, not
    /// as a duplicate.
    ///
    /// # Errors
    /// Transport errors; problems found are reported in the result.
    pub fn check_table_counts(&mut self) -> Result<TableCheck, Error> {
        verify::check_table(self, false)
    }

    /// [`Client::check_table`] without the KV blocks: reads the directory,
    /// the split log and every subtable (one READ each), checks their
    /// structure (directory, bucket headers, slot words) and counts the
    /// bytes slots link on each node, so that [`TableCheck::accounts`]
    /// says what each node's memory holds, at the cost of the subtables
    /// alone and 16 bytes of memory per slot in use (the full check keeps
    /// every pair). `pairs` is empty, `duplicates` 0, and keys are not
    /// checked against their slots.
    ///
    /// # Errors
    /// Transport errors; problems found are reported in the result.
    pub fn account_table(&mut self) -> Result<TableCheck, Error> {
        verify::account_table(self)
    }
}

fn check_key(key: &[u8]) -> Result<(), Error> {
    kv::max_value_len(key.len())
        .map(|_| ())
        .map_err(Error::from_kv)
}

fn check_kv(key: &[u8], value: &[u8]) -> Result<(), Error> {
    kv::block_len(key.len(), value.len())
        .map(|_| ())
        .map_err(Error::from_kv)
}

/// [`ClientConfig`] as a configuration file's type.
#[cfg(test)]
mod config_tests {
    use super::ClientConfig;

    #[test]
    fn default_round_trips_through_toml() {
        let text = toml::to_string_pretty(&ClientConfig::default()).expect("serializes");
        println!("{text}");
        let back: ClientConfig = toml::from_str(&text).expect("its own output parses");
        assert_eq!(back, ClientConfig::default());
        assert_eq!(
            toml::from_str::<ClientConfig>("").ok(),
            Some(ClientConfig::default())
        );
    }

    #[test]
    fn partial_file_overrides_only_what_it_names() {
        let c: ClientConfig =
            toml::from_str("grace_ticks = 500000\nmax_attempts = 7\n").expect("parses");
        let want = ClientConfig {
            grace_ticks: 500_000,
            max_attempts: 7,
            ..ClientConfig::default()
        };
        assert_eq!(c, want);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let err = toml::from_str::<ClientConfig>("lease_tick = 5\n")
            .expect_err("misspelt")
            .to_string();
        assert!(err.contains("unknown field `lease_tick`"), "{err}");
    }
}
