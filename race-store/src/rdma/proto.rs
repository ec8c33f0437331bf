//! Byte formats of the RDMA binding: the record a memory node publishes so
//! clients can reach it ([`NodeInfo`]), and the two-sided block allocation
//! messages ([`AllocRequest`], [`AllocReply`]) sent to its [`ALLOC_PORT`].
//! All little-endian, parsed with length and magic checks: bytes from the
//! fabric are untrusted.
//!
//! ```text
//! NodeInfo (64 B):  magic "RSN4" u32 | id u8 | nodes u8 | alloc_port u16 |
//!                   gid 16 | base u64 | len u64 | rkey u32 | features u32 |
//!                   incarnation u64 | geometry_groups u32 |
//!                   initial_depth u8 | max_depth u8 | reserved u16 (0)
//!           (older nodes' records: 56-byte "RSN3", no table; 48-byte
//!           "RSN2", no incarnation either)
//! AllocRequest (24 B): magic "RSAQ" u32 | pad u32 | req_id u64 | size u64
//! AllocReply (28 B):   magic "RSAP" u32 | status u32 | req_id u64 | offset u64 |
//!                      reserved u32 (0) (status 0: ok, 1: out of memory,
//!                      2: bad request)
//! ```
//!
//! Nodes with [`FEATURE_RUNS`] in their record's features also take
//! [`RunsRequest`]s and answer them with a [`RunsReply`]:
//!
//! ```text
//! RunsRequest (40 B + 16 B per run): magic "RSRQ" u32 | kind u32
//!               (1: grant, 2: give back, 3: renew, 4: end) | req_id u64 |
//!               block_bytes u64 | size u64 (grant: bytes wanted; give
//!               back: microseconds before the blocks may be handed out;
//!               renew and end: 0) | count u32 | flags u32 | [holder u64
//!               if flags bit 0] | count x (offset u64 | len u64) (grant,
//!               renew and end: count 0)
//! RunsReply (24 B + 16 B per run): magic "RSRP" u32 | status u32 (0: ok,
//!               1: out of memory, 2: refused) | req_id u64 | count u32 |
//!               flags u32 | [lease_ms u32 | generation u32 if flags bit 0]
//!               | count x (offset u64 | len u64) (the runs granted)
//! ```
//!
//! Nodes with [`FEATURE_LEASES`] also take a *holder* id (flags bit 0) in
//! runs requests, renew that holder's lease on its grants, and answer with
//! the lease's terms ([`GrantLease`], flags bit 0 of the reply); renew
//! (kind 3) needs a holder. Nodes with [`FEATURE_LEASE_END`] also take
//! *end* (kind 4, with a holder): a client that closed ends its lease at
//! once instead of letting it run out. See [`crate::holders`]. Older nodes refuse
//! flags they do not know, so a client sends a holder only to nodes that
//! announce the feature.
//!
//! Older nodes (features 0) know only the coarse exchange; a client then
//! allocates with it and gives nothing back.

use crate::holders::GrantLease;
use crate::layout::subtable::SubtableGeometry;
use crate::layout::MAX_GLOBAL_DEPTH;
use crate::memory::TableConfig;
use crate::remote::TransportError;
use krcore_nic::Gid;

/// The messaging port a memory node serves block allocation on.
pub const ALLOC_PORT: u16 = 0x5ace;

const NODE_MAGIC: u32 = u32::from_le_bytes(*b"RSN4");
/// The record of nodes built before the table was in it (56 bytes).
const NODE_MAGIC_V3: u32 = u32::from_le_bytes(*b"RSN3");
/// The record of nodes built before incarnations (48 bytes).
const NODE_MAGIC_V2: u32 = u32::from_le_bytes(*b"RSN2");
const REQ_MAGIC: u32 = u32::from_le_bytes(*b"RSAQ");
const REPLY_MAGIC: u32 = u32::from_le_bytes(*b"RSAP");
const RUNS_REQ_MAGIC: u32 = u32::from_le_bytes(*b"RSRQ");
const RUNS_REPLY_MAGIC: u32 = u32::from_le_bytes(*b"RSRP");

/// Bytes of an encoded [`NodeInfo`].
pub const NODE_INFO_LEN: usize = 64;
/// Bytes of a record of an older node (no table).
const NODE_INFO_V3_LEN: usize = 56;
/// Bytes of a record of an older node (no incarnation).
const NODE_INFO_V2_LEN: usize = 48;
/// Bytes of an encoded [`AllocRequest`].
pub const ALLOC_REQUEST_LEN: usize = 24;
/// Bytes of an encoded [`AllocReply`].
pub const ALLOC_REPLY_LEN: usize = 28;
/// Bytes of a [`RunsRequest`] before its runs.
pub const RUNS_REQUEST_HEADER: usize = 40;
/// Bytes of a [`RunsReply`] before its runs.
pub const RUNS_REPLY_HEADER: usize = 24;
/// Most runs one [`RunsRequest`] or [`RunsReply`] carries (1 MiB of runs).
pub const MAX_RUNS: usize = 1 << 16;
/// [`NodeInfo::features`]: the node takes [`RunsRequest`]s (grants of
/// blocks given back, and giving blocks back).
pub const FEATURE_RUNS: u32 = 1;
/// [`NodeInfo::features`]: the node keeps leases on its grants for holders
/// named in runs requests and takes back what dead holders never wrote
/// ([`crate::holders`]).
pub const FEATURE_LEASES: u32 = 2;
/// [`NodeInfo::features`]: the node takes [`RunsKind::End`]: a closing
/// client ends its lease on the node's grants.
pub const FEATURE_LEASE_END: u32 = 4;
/// [`NodeInfo::features`]: the node collects what dead clients left
/// ([`RunsKind::CollectBegin`]) and says its collection count to
/// [`RunsRequest::aware`] requests.
pub const FEATURE_COLLECT: u32 = 8;
/// Runs request and reply flags: the optional 8-byte field is present.
const FLAG_EXTRA: u32 = 1;
/// Runs request flag: the client is [`RunsRequest::aware`]; reply flag: the
/// node's collection count follows (8 bytes, after the lease).
const FLAG_AWARE: u32 = 2;

// Callers check the length first; out of range reads 0 (the workspace's
// one little-endian helper).
use krcore_nic::le::{read_u32 as u32_at, read_u64 as u64_at};

fn bad(reason: &'static str) -> TransportError {
    TransportError::BadResponse { reason }
}

/// What a client needs to reach one memory node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Memory node id (the node field of every `RemotePtr` into it).
    pub id: u8,
    /// Memory nodes of the store (ids `0..nodes`), as node 0 formatted it.
    pub nodes: u8,
    /// The node's GID (its VQP target).
    pub gid: Gid,
    /// Address of the region's first byte in the node's address space.
    pub base: u64,
    /// Region length in bytes.
    pub len: u64,
    /// Remote key of the region.
    pub rkey: u32,
    /// The messaging port of its block allocator ([`ALLOC_PORT`] for nodes
    /// built by this crate).
    pub alloc_port: u16,
    /// What the allocator takes besides the coarse exchange
    /// ([`FEATURE_RUNS`]); unknown bits are kept and ignored.
    pub features: u32,
    /// The serving process's random id (never 0; 0: a node built before
    /// incarnations). A region lives as long as its process: a node of
    /// another incarnation at the same id has none of its predecessor's
    /// data (see `crate::deploy`).
    pub incarnation: u64,
    /// The table the store's node 0 formatted, whose initial subtables
    /// this node laid out its share of ([`TableConfig::initial_subtable`]):
    /// nodes `1..nodes` take it from node 0's record. `None` in an older
    /// node's record (its node 0 kept every initial subtable), and encoded
    /// as geometry groups 0.
    pub table: Option<TableConfig>,
}

impl NodeInfo {
    /// The 64-byte record.
    pub fn encode(&self) -> [u8; NODE_INFO_LEN] {
        let mut b = [0u8; NODE_INFO_LEN];
        b[0..4].copy_from_slice(&NODE_MAGIC.to_le_bytes());
        b[4] = self.id;
        b[5] = self.nodes;
        b[6..8].copy_from_slice(&self.alloc_port.to_le_bytes());
        b[8..24].copy_from_slice(self.gid.as_bytes());
        b[24..32].copy_from_slice(&self.base.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        b[44..48].copy_from_slice(&self.features.to_le_bytes());
        b[48..56].copy_from_slice(&self.incarnation.to_le_bytes());
        if let Some(t) = self.table {
            b[56..60].copy_from_slice(&t.geometry.groups().to_le_bytes());
            b[60] = t.initial_global_depth;
            b[61] = t.max_global_depth;
        }
        b
    }

    /// Parses a record.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length or magic, an
    /// empty or wrapping region, a node id not below the node count, or a
    /// table that is no table (no groups, more than
    /// [`SubtableGeometry::MAX_GROUPS`], an initial depth above the
    /// largest, a largest above [`MAX_GLOBAL_DEPTH`]).
    pub fn decode(b: &[u8]) -> Result<NodeInfo, TransportError> {
        let incarnation = match (b.len(), u32_at(b, 0)) {
            (NODE_INFO_LEN, NODE_MAGIC) | (NODE_INFO_V3_LEN, NODE_MAGIC_V3) => u64_at(b, 48),
            (NODE_INFO_V2_LEN, NODE_MAGIC_V2) => 0,
            _ if b.starts_with(b"RSN")
                && ![NODE_MAGIC, NODE_MAGIC_V3, NODE_MAGIC_V2].contains(&u32_at(b, 0)) =>
            {
                return Err(bad(
                    "memory node record of a race-store version this build does not know \
                     (run one version on every node)",
                ))
            }
            _ => return Err(bad("memory node record: wrong length or magic")),
        };
        // Groups 0: a record that names no table.
        let table = if b.len() == NODE_INFO_LEN && u32_at(b, 56) != 0 {
            let initial = b.get(60).copied().unwrap_or(0);
            let max = b.get(61).copied().unwrap_or(0);
            let geometry = SubtableGeometry::new(u32_at(b, 56))
                .map_err(|_| bad("memory node record: table geometry out of range"))?;
            if max > MAX_GLOBAL_DEPTH || initial > max {
                return Err(bad("memory node record: table depths out of range"));
            }
            Some(TableConfig {
                geometry,
                initial_global_depth: initial,
                max_global_depth: max,
            })
        } else {
            None
        };
        let g: [u8; 16] = b
            .get(8..24)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("memory node record: wrong length or magic"))?;
        let info = NodeInfo {
            id: b.get(4).copied().unwrap_or(0),
            nodes: b.get(5).copied().unwrap_or(0),
            alloc_port: u16::from_le_bytes([
                b.get(6).copied().unwrap_or(0),
                b.get(7).copied().unwrap_or(0),
            ]),
            gid: Gid(g),
            base: u64_at(b, 24),
            len: u64_at(b, 32),
            rkey: u32_at(b, 40),
            features: u32_at(b, 44),
            incarnation,
            table,
        };
        if info.len == 0 || info.base.checked_add(info.len).is_none() {
            return Err(bad("memory node record: empty or wrapping region"));
        }
        if info.id >= info.nodes {
            return Err(bad("memory node record: id not below the node count"));
        }
        Ok(info)
    }
}

/// A request for a coarse block of `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// Echoed in the reply.
    pub req_id: u64,
    /// Bytes wanted (64-byte multiple).
    pub size: u64,
}

impl AllocRequest {
    /// The 24-byte message.
    pub fn encode(&self) -> [u8; ALLOC_REQUEST_LEN] {
        let mut b = [0u8; ALLOC_REQUEST_LEN];
        b[0..4].copy_from_slice(&REQ_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    /// Parses a message.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length or magic.
    pub fn decode(b: &[u8]) -> Result<AllocRequest, TransportError> {
        if b.len() < ALLOC_REQUEST_LEN || u32_at(b, 0) != REQ_MAGIC {
            return Err(bad("allocation request: wrong length or magic"));
        }
        Ok(AllocRequest {
            req_id: u64_at(b, 8),
            size: u64_at(b, 16),
        })
    }
}

/// The reply: the block's offset in the node's region, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocReply {
    /// The request's id.
    pub req_id: u64,
    /// Offset of the block (`None`: out of memory or bad request).
    pub offset: Option<u64>,
}

impl AllocReply {
    /// The 28-byte message.
    pub fn encode(&self) -> [u8; ALLOC_REPLY_LEN] {
        let mut b = [0u8; ALLOC_REPLY_LEN];
        b[0..4].copy_from_slice(&REPLY_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&u32::from(self.offset.is_none()).to_le_bytes());
        b[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.unwrap_or(0).to_le_bytes());
        b
    }

    /// Parses a message.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length, magic or status.
    pub fn decode(b: &[u8]) -> Result<AllocReply, TransportError> {
        if b.len() < ALLOC_REPLY_LEN || u32_at(b, 0) != REPLY_MAGIC {
            return Err(bad("allocation reply: wrong length or magic"));
        }
        let offset = match u32_at(b, 4) {
            0 => Some(u64_at(b, 16)),
            1 | 2 => None,
            _ => return Err(bad("allocation reply: unknown status")),
        };
        Ok(AllocReply {
            req_id: u64_at(b, 8),
            offset,
        })
    }
}

/// What a [`RunsRequest`] asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunsKind {
    /// Memory for blocks: blocks given back first, else a coarse block of
    /// `size` bytes.
    Grant {
        /// Bytes wanted (a multiple of the block size).
        size: u64,
    },
    /// Blocks the client gives back, as runs `(offset, len)`.
    GiveBack {
        /// The runs.
        runs: Vec<(u64, u64)>,
        /// Microseconds before they may be handed out (what is left of
        /// their grace period).
        delay_us: u64,
    },
    /// Renews the holder's lease (the request names a holder).
    Renew,
    /// Ends the holder's lease ([`FEATURE_LEASE_END`]; the request names
    /// a holder): it closed, gave back what it did not write, and will use
    /// nothing of the node's grants again. The node takes back at once
    /// what is left of its grants unwritten, as for a holder that died.
    End,
    /// Starts (or looks again at) collection `token` ([`FEATURE_COLLECT`];
    /// no holder): the node renews and grants nothing from now on; the
    /// answer is ok once no holder's lease is live, else
    /// [`RUNS_DRAINING`] with one run `(microseconds until the last lease
    /// ends, live leases)`. See [`crate::memory::MemoryNode::collect_begin`].
    CollectBegin {
        /// The collection's token (never 0).
        token: u64,
    },
    /// Runs `(offset, len)` of the node that the table links (KV blocks),
    /// for collection `token`.
    CollectLive {
        /// The collection's token.
        token: u64,
        /// The runs.
        runs: Vec<(u64, u64)>,
    },
    /// Ends collection `token`: with `apply`, takes back every byte of
    /// the heap in use that no live run, subtable or pooled run covers;
    /// without, only counts it. The answer's one run is `(bytes, runs)`.
    CollectFinish {
        /// The collection's token.
        token: u64,
        /// Whether to take the bytes back.
        apply: bool,
    },
}

/// A request about blocks of one size (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunsRequest {
    /// Echoed in the reply.
    pub req_id: u64,
    /// Bytes of one block (a multiple of 64).
    pub block_bytes: u64,
    /// What is asked.
    pub kind: RunsKind,
    /// The client's holder id ([`FEATURE_LEASES`]; never 0), whose lease
    /// the request renews.
    pub holder: Option<u64>,
    /// The client drops what it holds of the node when the node's
    /// collection count changes ([`FEATURE_COLLECT`]; flags bit 1): the
    /// answer's lease says the count. A node that has collected refuses
    /// requests of holders that do not say so.
    pub aware: bool,
}

/// The answer to a [`RunsRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunsReply {
    /// The request's id.
    pub req_id: u64,
    /// 0: ok, [`RUNS_OUT_OF_MEMORY`] or [`RUNS_REFUSED`].
    pub status: u32,
    /// The runs granted `(offset, len)` (empty for a give back).
    pub runs: Vec<(u64, u64)>,
    /// The holder's lease, in answers to requests that named one; its
    /// `collections` is sent only with `aware` (0 otherwise).
    pub lease: Option<GrantLease>,
    /// Whether the lease carries the node's collection count (flags bit
    /// 1): in answers to [`RunsRequest::aware`] requests.
    pub aware: bool,
}

/// [`RunsReply::status`]: no memory for the grant.
pub const RUNS_OUT_OF_MEMORY: u32 = 1;
/// [`RunsReply::status`]: the request was malformed, or the blocks given
/// back were refused (outside the heap, overlapping blocks held).
pub const RUNS_REFUSED: u32 = 2;
/// [`RunsReply::status`] of a [`RunsKind::CollectBegin`]: holders' leases
/// are still live.
pub const RUNS_DRAINING: u32 = 3;
/// [`RunsReply::status`]: the node is collecting and serves no holder
/// ([`TransportError::Collecting`]).
pub const RUNS_COLLECTING: u32 = 4;

fn put_runs(b: &mut Vec<u8>, runs: &[(u64, u64)]) {
    for &(offset, len) in runs {
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
    }
}

/// The fields after a header of `header` bytes that ends with `count u32
/// | flags u32`: the flags ([`FLAG_EXTRA`] and [`FLAG_AWARE`], others
/// refused), the 8-byte words they announce (bit 0's, then bit 1's where
/// `aware_word`), and the runs, checked against the message length.
#[allow(clippy::type_complexity)]
fn get_runs(
    b: &[u8],
    header: usize,
    aware_word: bool,
    what: &'static str,
) -> Result<(u32, [Option<u64>; 2], Vec<(u64, u64)>), TransportError> {
    let count = u32_at(b, header - 8) as usize;
    let flags = u32_at(b, header - 4);
    if flags & !(FLAG_EXTRA | FLAG_AWARE) != 0 {
        return Err(bad(what));
    }
    let mut words = [None; 2];
    let mut at = header;
    for (i, (bit, carries)) in [(FLAG_EXTRA, true), (FLAG_AWARE, aware_word)]
        .into_iter()
        .enumerate()
    {
        if flags & bit != 0 && carries {
            if let Some(w) = words.get_mut(i) {
                *w = Some(u64_at(b, at));
            }
            at += 8;
        }
    }
    if count > MAX_RUNS || b.len() != at + 16 * count {
        return Err(bad(what));
    }
    let runs = (0..count)
        .map(|i| {
            let r = at + 16 * i;
            (u64_at(b, r), u64_at(b, r + 8))
        })
        .collect();
    Ok((flags, words, runs))
}

/// Writes `count u32 | flags u32 | [field u64] | [aware word u64]`: bit 0
/// with `field`, bit 1 with `aware` (its word only if given).
fn put_count_and_fields(
    b: &mut Vec<u8>,
    count: usize,
    field: Option<u64>,
    aware: Option<Option<u64>>,
) {
    let flags = u32::from(field.is_some()) * FLAG_EXTRA + u32::from(aware.is_some()) * FLAG_AWARE;
    b.extend_from_slice(&(count as u32).to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    for w in [field, aware.flatten()].into_iter().flatten() {
        b.extend_from_slice(&w.to_le_bytes());
    }
}

impl RunsRequest {
    /// The message ([`RUNS_REQUEST_HEADER`] + 16 bytes per run; a caller
    /// keeps to [`MAX_RUNS`] runs).
    pub fn encode(&self) -> Vec<u8> {
        let (kind, size, runs): (u32, u64, &[(u64, u64)]) = match &self.kind {
            RunsKind::Grant { size } => (1, *size, &[]),
            RunsKind::GiveBack { runs, delay_us } => (2, *delay_us, runs),
            RunsKind::Renew => (3, 0, &[]),
            RunsKind::End => (4, 0, &[]),
            RunsKind::CollectBegin { token } => (5, *token, &[]),
            RunsKind::CollectLive { token, runs } => (6, *token, runs),
            RunsKind::CollectFinish { token, apply } => (7 + u32::from(*apply), *token, &[]),
        };
        let mut b = Vec::with_capacity(RUNS_REQUEST_HEADER + 8 + 16 * runs.len());
        b.extend_from_slice(&RUNS_REQ_MAGIC.to_le_bytes());
        b.extend_from_slice(&kind.to_le_bytes());
        b.extend_from_slice(&self.req_id.to_le_bytes());
        b.extend_from_slice(&self.block_bytes.to_le_bytes());
        b.extend_from_slice(&size.to_le_bytes());
        put_count_and_fields(&mut b, runs.len(), self.holder, self.aware.then_some(None));
        put_runs(&mut b, runs);
        b
    }

    /// Whether `b` is a runs request (by its magic).
    pub fn is_one(b: &[u8]) -> bool {
        b.len() >= 4 && u32_at(b, 0) == RUNS_REQ_MAGIC
    }

    /// Parses a message.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length, magic or kind, or
    /// a grant with runs.
    pub fn decode(b: &[u8]) -> Result<RunsRequest, TransportError> {
        const WHAT: &str = "runs request: wrong length, magic or kind";
        if b.len() < RUNS_REQUEST_HEADER || u32_at(b, 0) != RUNS_REQ_MAGIC {
            return Err(bad(WHAT));
        }
        let (flags, [holder, _], runs) = get_runs(b, RUNS_REQUEST_HEADER, false, WHAT)?;
        if holder == Some(0) {
            return Err(bad(WHAT));
        }
        let size = u64_at(b, 24);
        // Collection requests name no holder and a token.
        let collect = holder.is_none() && size != 0;
        let kind = match u32_at(b, 4) {
            1 if runs.is_empty() => RunsKind::Grant { size },
            2 => RunsKind::GiveBack {
                runs,
                delay_us: size,
            },
            3 if runs.is_empty() && size == 0 && holder.is_some() => RunsKind::Renew,
            4 if runs.is_empty() && size == 0 && holder.is_some() => RunsKind::End,
            5 if runs.is_empty() && collect => RunsKind::CollectBegin { token: size },
            6 if collect => RunsKind::CollectLive { token: size, runs },
            k @ (7 | 8) if runs.is_empty() && collect => RunsKind::CollectFinish {
                token: size,
                apply: k == 8,
            },
            _ => return Err(bad(WHAT)),
        };
        Ok(RunsRequest {
            req_id: u64_at(b, 8),
            block_bytes: u64_at(b, 16),
            kind,
            holder,
            aware: flags & FLAG_AWARE != 0,
        })
    }
}

impl RunsReply {
    /// The message ([`RUNS_REPLY_HEADER`] + 16 bytes per run).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(RUNS_REPLY_HEADER + 8 + 16 * self.runs.len());
        b.extend_from_slice(&RUNS_REPLY_MAGIC.to_le_bytes());
        b.extend_from_slice(&self.status.to_le_bytes());
        b.extend_from_slice(&self.req_id.to_le_bytes());
        let lease = self
            .lease
            .map(|l| u64::from(l.lease_ms) | u64::from(l.generation) << 32);
        let collections = self
            .lease
            .filter(|_| self.aware)
            .map(|l| u64::from(l.collections));
        put_count_and_fields(&mut b, self.runs.len(), lease, collections.map(Some));
        put_runs(&mut b, &self.runs);
        b
    }

    /// Whether `b` is a runs reply (by its magic).
    pub fn is_one(b: &[u8]) -> bool {
        b.len() >= 4 && u32_at(b, 0) == RUNS_REPLY_MAGIC
    }

    /// Parses a message.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length, magic or status.
    pub fn decode(b: &[u8]) -> Result<RunsReply, TransportError> {
        const WHAT: &str = "runs reply: wrong length, magic or status";
        if b.len() < RUNS_REPLY_HEADER || u32_at(b, 0) != RUNS_REPLY_MAGIC {
            return Err(bad(WHAT));
        }
        let status = u32_at(b, 4);
        if status > RUNS_COLLECTING {
            return Err(bad(WHAT));
        }
        let (flags, [lease, collections], runs) = get_runs(b, RUNS_REPLY_HEADER, true, WHAT)?;
        let lease = match (lease, collections) {
            (None, None) => None,
            (Some(f), c) => {
                let (lease_ms, generation) = (f as u32, (f >> 32) as u32);
                let collections = u32::try_from(c.unwrap_or(0)).map_err(|_| bad(WHAT))?;
                if lease_ms == 0 || generation == 0 {
                    return Err(bad(WHAT));
                }
                Some(GrantLease {
                    lease_ms,
                    generation,
                    collections,
                })
            }
            (None, Some(_)) => return Err(bad(WHAT)),
        };
        Ok(RunsReply {
            req_id: u64_at(b, 8),
            status,
            runs,
            lease,
            aware: flags & FLAG_AWARE != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_garbage() {
        let info = NodeInfo {
            id: 3,
            nodes: 4,
            gid: Gid([7; 16]),
            base: 0x7f00_0000_1000,
            len: 1 << 30,
            rkey: 0x1234,
            alloc_port: ALLOC_PORT,
            features: FEATURE_RUNS,
            incarnation: 0x0123_4567_89ab_cdef,
            table: Some(TableConfig::default().presized_for(1 << 20, 2)),
        };
        assert_eq!(NodeInfo::decode(&info.encode()).unwrap(), info);
        let untabled = NodeInfo {
            table: None,
            ..info
        };
        assert_eq!(NodeInfo::decode(&untabled.encode()).unwrap(), untabled);
        // A table that is no table: refused, not guessed.
        for (at, byte) in [(59, 0xff), (60, 17), (61, 21)] {
            let mut b = info.encode();
            b[at] = byte;
            assert!(NodeInfo::decode(&b).is_err(), "byte {at} = {byte}");
        }
        // A newer node's record: named as such, not as garbage.
        let mut newer = info.encode().to_vec();
        newer[..4].copy_from_slice(b"RSN9");
        let e = NodeInfo::decode(&newer).unwrap_err().to_string();
        assert!(e.contains("version this build does not know"), "{e}");
        // An older node's record: 56 bytes, "RSN3", no table.
        let mut v3 = info.encode()[..56].to_vec();
        v3[..4].copy_from_slice(b"RSN3");
        assert_eq!(NodeInfo::decode(&v3).unwrap(), untabled);
        // An older node's record: 48 bytes, "RSN2", no incarnation.
        let mut v2 = info.encode()[..48].to_vec();
        v2[..4].copy_from_slice(b"RSN2");
        let old = NodeInfo::decode(&v2).unwrap();
        assert_eq!((old.incarnation, old.rkey), (0, info.rkey));
        let mut mixed = info.encode();
        mixed[..4].copy_from_slice(b"RSN2");
        assert!(NodeInfo::decode(&mixed).is_err(), "RSN2 is 48 bytes");
        assert!(
            NodeInfo::decode(&info.encode()[..56]).is_err(),
            "RSN4 is 64"
        );
        let grant = RunsRequest {
            req_id: 5,
            block_bytes: 128,
            kind: RunsKind::Grant { size: 4096 },
            holder: None,
            aware: false,
        };
        assert_eq!(RunsRequest::decode(&grant.encode()).unwrap(), grant);
        let owned = RunsRequest {
            holder: Some(0xfeed),
            ..grant.clone()
        };
        assert_eq!(owned.encode().len(), RUNS_REQUEST_HEADER + 8);
        assert_eq!(RunsRequest::decode(&owned.encode()).unwrap(), owned);
        let renew = RunsRequest {
            req_id: 8,
            block_bytes: 0,
            kind: RunsKind::Renew,
            holder: Some(3),
            aware: false,
        };
        assert_eq!(RunsRequest::decode(&renew.encode()).unwrap(), renew);
        let end = RunsRequest {
            kind: RunsKind::End,
            ..renew.clone()
        };
        assert_eq!(RunsRequest::decode(&end.encode()).unwrap(), end);
        let mut e = end.encode();
        e[24] = 1; // an end with a size
        assert!(RunsRequest::decode(&e).is_err());
        let e = RunsRequest {
            holder: None,
            ..end.clone()
        }
        .encode();
        assert!(RunsRequest::decode(&e).is_err(), "an end names its holder");
        // A renew without a holder, a holder 0, an unknown flag: refused.
        let mut e = RunsRequest {
            holder: None,
            ..renew.clone()
        }
        .encode();
        assert!(RunsRequest::decode(&e).is_err());
        e = RunsRequest {
            holder: Some(0),
            ..renew.clone()
        }
        .encode();
        assert!(RunsRequest::decode(&e).is_err());
        e = owned.encode();
        e[36] = 4;
        assert!(RunsRequest::decode(&e).is_err());
        // Aware: a flag, no word.
        let aware = RunsRequest {
            aware: true,
            ..owned.clone()
        };
        assert_eq!(aware.encode().len(), RUNS_REQUEST_HEADER + 8);
        assert_eq!(RunsRequest::decode(&aware.encode()).unwrap(), aware);
        // Collection steps: a token, no holder.
        for kind in [
            RunsKind::CollectBegin { token: 77 },
            RunsKind::CollectLive {
                token: 77,
                runs: vec![(4096, 64), (8192, 128)],
            },
            RunsKind::CollectFinish {
                token: 77,
                apply: false,
            },
            RunsKind::CollectFinish {
                token: 77,
                apply: true,
            },
        ] {
            let step = RunsRequest {
                req_id: 1,
                block_bytes: 0,
                kind,
                holder: None,
                aware: false,
            };
            assert_eq!(RunsRequest::decode(&step.encode()).unwrap(), step);
            let named = RunsRequest {
                holder: Some(5),
                ..step.clone()
            };
            assert!(RunsRequest::decode(&named.encode()).is_err(), "{step:?}");
            let mut e = step.encode();
            e[24..32].copy_from_slice(&0u64.to_le_bytes());
            assert!(RunsRequest::decode(&e).is_err(), "token 0: {step:?}");
        }
        let give = RunsRequest {
            req_id: 6,
            block_bytes: 192,
            kind: RunsKind::GiveBack {
                runs: vec![(4096, 192), (8192, 1920)],
                delay_us: 250_000,
            },
            holder: Some(u64::MAX),
            aware: false,
        };
        assert_eq!(RunsRequest::decode(&give.encode()).unwrap(), give);
        let reply = RunsReply {
            req_id: 6,
            status: 0,
            runs: vec![(4096, 128)],
            lease: None,
            aware: false,
        };
        assert_eq!(RunsReply::decode(&reply.encode()).unwrap(), reply);
        let leased = RunsReply {
            lease: Some(GrantLease {
                lease_ms: 10_000,
                generation: u32::MAX,
                collections: 0,
            }),
            ..reply.clone()
        };
        assert_eq!(RunsReply::decode(&leased.encode()).unwrap(), leased);
        // The collection count goes only to aware requests.
        let counted = RunsReply {
            lease: Some(GrantLease {
                collections: 3,
                ..leased.lease.unwrap()
            }),
            aware: true,
            ..reply.clone()
        };
        assert_eq!(counted.encode().len(), leased.encode().len() + 8);
        assert_eq!(RunsReply::decode(&counted.encode()).unwrap(), counted);
        let unaware = RunsReply {
            aware: false,
            ..counted.clone()
        };
        assert_eq!(
            RunsReply::decode(&unaware.encode()).unwrap().lease,
            leased.lease,
            "not sent: read as 0"
        );
        let mut e = leased.encode();
        e[24..28].copy_from_slice(&0u32.to_le_bytes());
        assert!(RunsReply::decode(&e).is_err(), "a lease of 0 ms");
        // A grant with runs, a count past the bytes, a bad status: refused.
        let mut e = grant.encode();
        e[32] = 1;
        assert!(RunsRequest::decode(&e).is_err());
        let e = give.encode();
        assert!(RunsRequest::decode(&e[..e.len() - 1]).is_err());
        let mut e = reply.encode();
        e[4] = 5;
        assert!(RunsReply::decode(&e).is_err());
        let req = AllocRequest {
            req_id: 9,
            size: 1 << 20,
        };
        assert_eq!(AllocRequest::decode(&req.encode()).unwrap(), req);
        for offset in [Some(4096), None] {
            let r = AllocReply { req_id: 9, offset };
            assert_eq!(AllocReply::decode(&r.encode()).unwrap(), r);
        }
        let mut x = 0x1234_5678u64;
        for len in 0..80 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = NodeInfo::decode(&bytes);
            let _ = AllocRequest::decode(&bytes);
            let _ = AllocReply::decode(&bytes);
            let _ = RunsRequest::decode(&bytes);
            let _ = RunsReply::decode(&bytes);
        }
        assert!(NodeInfo::decode(&[0u8; NODE_INFO_LEN]).is_err());
        let mut past = info;
        past.id = 4;
        assert!(NodeInfo::decode(&past.encode()).is_err(), "id >= nodes");
    }
}
