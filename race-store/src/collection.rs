//! Collections: taking back the memory that dead clients left on a memory
//! node, which no slot links and no live client holds. The node's side is
//! in [`crate::memory::MemoryNode::collect_begin`] and the two calls after
//! it; the collector's, the scan of the table and why it is safe, in
//! [`crate::client::Client::collect`]. These are the types both share.

use std::time::Duration;

/// How long a collection waits for its collector's next request before it
/// is abandoned.
pub const COLLECT_IDLE: Duration = Duration::from_secs(60);

/// The answer to [`crate::memory::MemoryNode::collect_begin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectStart {
    /// No holder's lease is live: the collector scans the table now.
    Ready,
    /// Holders' leases are still live (the node renews none): the last
    /// ends within `wait`.
    Draining {
        /// Until the last live lease ends.
        wait: Duration,
        /// Live leases.
        leases: u64,
    },
}

/// What [`crate::memory::MemoryNode::collect_finish`] took back (or would have).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Bytes.
    pub bytes: u64,
    /// Runs they make.
    pub runs: u64,
}
