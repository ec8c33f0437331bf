//! [`LayoutError`], the error of the pure layout layer (and of hashing):
//! every check on bytes that came from remote memory, and every
//! constructor with an out-of-range argument, fails with one instead of
//! panicking. A leaf of the crate: re-exported as
//! [`crate::error::LayoutError`], the table operations' [`crate::Error`]
//! wraps it.

/// Result of a layout operation (or, as `Result<T, Error>`, of a table
/// operation).
pub type Result<T, E = LayoutError> = core::result::Result<T, E>;

/// Why a layout, hashing or geometry operation failed.
///
/// Remote bytes are untrusted: a torn, reused or garbage structure is reported
/// as one of these variants, never as a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// A buffer to be parsed is shorter than the structure it should hold.
    #[error("{what}: buffer of {got} bytes, need at least {need}")]
    Truncated {
        /// The structure being parsed.
        what: &'static str,
        /// Bytes required.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// An output buffer is too small for the structure to be emitted.
    #[error("{what}: output buffer of {got} bytes, need {need}")]
    BufferTooSmall {
        /// The structure being emitted.
        what: &'static str,
        /// Bytes required.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// A byte offset does not fit in the 40-bit offset field of a pointer.
    #[error("offset {offset:#x} does not fit in the 40-bit offset field")]
    OffsetOutOfRange {
        /// The rejected offset.
        offset: u64,
    },
    /// A KV block length is zero, not a multiple of 64 B, or above 255 x 64 B.
    #[error("KV block length {bytes} B is not a multiple of 64 B in 64..=16320")]
    BlockLenOutOfRange {
        /// The rejected length in bytes.
        bytes: usize,
    },
    /// A KV block's header implies another length than the slot pointing
    /// to it records.
    #[error("KV block header implies {header} B, its slot says {slot} B")]
    BlockLenMismatch {
        /// The length the header implies.
        header: usize,
        /// The slot's length.
        slot: usize,
    },
    /// A slot word read from remote memory is neither empty nor well formed.
    #[error("malformed slot {raw:#018x}: {reason}")]
    MalformedSlot {
        /// The raw slot word.
        raw: u64,
        /// Which invariant it breaks.
        reason: &'static str,
    },
    /// A slot index is not below [`crate::layout::bucket::SLOTS_PER_BUCKET`].
    #[error("slot index {index} out of range 0..7")]
    SlotIndexOutOfRange {
        /// The rejected index.
        index: usize,
    },
    /// A local or global depth exceeds [`crate::layout::MAX_GLOBAL_DEPTH`].
    #[error("depth {depth} exceeds the maximum {max}")]
    DepthOutOfRange {
        /// The rejected depth.
        depth: u32,
        /// The maximum allowed depth.
        max: u8,
    },
    /// A suffix has bits set at or above its depth.
    #[error("suffix {suffix:#x} has bits at or above depth {depth}")]
    SuffixOutOfRange {
        /// The rejected suffix.
        suffix: u32,
        /// The depth it was paired with.
        depth: u8,
    },
    /// The two bucket headers of a combined bucket disagree (torn read or garbage).
    #[error("combined bucket headers disagree: main {main:?}, overflow {overflow:?}")]
    HeaderMismatch {
        /// `(local_depth, suffix)` of the main bucket.
        main: (u32, u32),
        /// `(local_depth, suffix)` of the overflow bucket.
        overflow: (u32, u32),
    },
    /// A local depth is larger than the global depth of the directory.
    #[error("local depth {local} exceeds global depth {global}")]
    LocalDepthExceedsGlobal {
        /// The local depth.
        local: u8,
        /// The global depth.
        global: u8,
    },
    /// A directory header or entry word has reserved bits set or is inconsistent.
    #[error("malformed directory word {raw:#018x}: {reason}")]
    MalformedDirWord {
        /// The raw word.
        raw: u64,
        /// Which invariant it breaks.
        reason: &'static str,
    },
    /// A directory index is not below `2^global_depth`.
    #[error("directory index {index} out of range for global depth {global_depth}")]
    DirIndexOutOfRange {
        /// The rejected index.
        index: usize,
        /// The global depth.
        global_depth: u8,
    },
    /// The directory entries do not describe a valid extendible-hashing directory.
    #[error("inconsistent directory at entry {index}: {reason}")]
    InconsistentDirectory {
        /// The first offending entry.
        index: usize,
        /// Which invariant it breaks.
        reason: &'static str,
    },
    /// A lease expiry does not fit in the 39-bit lease field of the header.
    #[error("lease expiry {ticks} does not fit in the 39-bit lease field")]
    LeaseOutOfRange {
        /// The rejected expiry, in ticks.
        ticks: u64,
    },
    /// A lock operation by `owner` on a header that it does not hold.
    #[error("directory lock is not held by owner {owner}")]
    NotLockOwner {
        /// The caller's owner id.
        owner: u16,
    },
    /// A subtable geometry with a group count out of range.
    #[error("subtable of {groups} bucket groups is out of range 1..={max}")]
    GeometryOutOfRange {
        /// The rejected group count (or bucket count / 3).
        groups: u64,
        /// The largest allowed group count.
        max: u32,
    },
    /// A bucket count that is not a multiple of three (one group is three buckets).
    #[error("{buckets} buckets is not a whole number of 3-bucket groups")]
    BucketsNotGroups {
        /// The rejected bucket count.
        buckets: u64,
    },
    /// A bucket group index outside the subtable.
    #[error("bucket group {group} out of range for a subtable of {groups} groups")]
    GroupOutOfRange {
        /// The rejected group index.
        group: u32,
        /// Groups in the subtable.
        groups: u32,
    },
    /// A KV block with an empty key (encoding, or a block read from memory).
    #[error("empty key")]
    EmptyKey,
    /// A key too long to fit in a KV block even with an empty value.
    #[error("key of {len} bytes exceeds the maximum {max}")]
    KeyTooLarge {
        /// The key length.
        len: usize,
        /// The largest key length.
        max: usize,
    },
    /// A value too long to fit in one KV block with its key.
    #[error("value of {len} bytes exceeds the maximum {max} for this key")]
    ValueTooLarge {
        /// The value length.
        len: usize,
        /// The largest value length for this key.
        max: usize,
    },
    /// A table superblock of another format version: the table was made by
    /// a memory node of another release, whose clients follow another
    /// protocol (version 2: inserts place tentative copies, see
    /// `client::protocol`).
    #[error("table format version {found}; this release reads version {supported}")]
    UnsupportedFormat {
        /// The version the superblock says.
        found: u32,
        /// The version this release reads and writes.
        supported: u32,
    },
    /// A KV block whose magic field is wrong (not a KV block, or garbage).
    #[error("KV block magic {found:#06x}, expected {expected:#06x}")]
    BadMagic {
        /// The magic read.
        found: u16,
        /// The magic every KV block carries.
        expected: u16,
    },
    /// A KV block whose CRC does not match its contents (torn or garbage).
    #[error("KV block checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// The CRC stored in the block.
        stored: u32,
        /// The CRC computed over the block.
        computed: u32,
    },
    /// A valid KV block that holds another key (the block was reused).
    #[error("KV block holds a different key")]
    KeyMismatch,
}
