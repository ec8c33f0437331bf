//! What an attached process's calls into the daemon fail with.

use super::ring::EncodeError;
use super::ring::PostCode;
use super::wire::{RefuseCode, WireError};
use std::path::PathBuf;
use std::time::Duration;

/// Why a call through the node daemon failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// No daemon listens at the socket (missing file, refused connection).
    #[error("cannot reach the node daemon at {path}")]
    NoDaemon {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The daemon speaks another protocol version.
    #[error("the node daemon speaks another protocol: {message}")]
    Version {
        /// The daemon's words.
        message: String,
    },
    /// The daemon refused a control request (nothing changed).
    #[error("the node daemon refused ({code}): {message}")]
    Refused {
        /// Why, in a word.
        code: RefuseCode,
        /// Its one-line reason.
        message: String,
    },
    /// The meta server refused a store call the daemon made for the
    /// process ([`super::Attached::store_join`]): its code.
    #[error("the meta server refused the store call: {code:?}")]
    MetaRefused {
        /// The meta server's code (`MemberExists`, `BadStoreName`, ...).
        code: krcore_meta::wire::ErrorCode,
    },
    /// The daemon closed the connection (it stopped, restarted or died):
    /// attach again.
    #[error("the node daemon went away ({what})")]
    Gone {
        /// What noticed.
        what: &'static str,
    },
    /// The daemon did not take a doorbell (or, from `AttachedVqp::wait`,
    /// deliver the completions waited for) in time: alive but stuck. For a
    /// doorbell the outcome is unknown: its entries stay published and the
    /// daemon may still post them when it resumes (their completions then
    /// come as usual); the process's next doorbell starts past them.
    #[error("the node daemon did not take a doorbell within {0:?}")]
    Timeout(Duration),
    /// The daemon did not answer a control call in time (alive but
    /// stuck, or stopped): the connection is given up (a late answer would
    /// be taken for the next call's), so attach again.
    #[error("the node daemon did not answer {what} within {after:?}")]
    Unanswered {
        /// The call.
        what: &'static str,
        /// The bound waited.
        after: Duration,
    },
    /// A reply did not decode.
    #[error("malformed reply from the node daemon")]
    Wire(#[from] WireError),
    /// A reply came without the shared memory it hands over.
    #[error("the node daemon's reply lacks {what}")]
    MissingFd {
        /// Which file.
        what: &'static str,
    },
    /// Shared memory from the daemon could not be mapped.
    #[error("map the node daemon's shared memory")]
    Map(#[source] krcore_nic::NicError),
    /// A WR cannot go through the ring (nothing was posted).
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The daemon refused the doorbell (nothing was posted).
    #[error("doorbell refused ({code}) at WR {index}: {message}")]
    Post {
        /// Why, in a word.
        code: PostCode,
        /// The WR.
        index: usize,
        /// The daemon's words.
        message: String,
    },
    /// More WRs than a doorbell carries (or none).
    #[error(
        "batch of {len} WRs: the node daemon takes 1..={max} ring slots per doorbell \
         (one per WR, two for a WR with several SGEs or inline data)"
    )]
    BatchSize {
        /// WRs given.
        len: usize,
        /// The ring's capacity.
        max: usize,
    },
    /// A range outside a region.
    #[error("{len} bytes at offset {offset} are outside the region of {size} bytes")]
    OutOfRange {
        /// Offset asked.
        offset: usize,
        /// Bytes asked.
        len: usize,
        /// The region's length.
        size: usize,
    },
    /// The completion ring's indices are impossible (this process's memory
    /// was overwritten).
    #[error("the VQP's completion ring is corrupt (tail {tail}, head {head})")]
    RingCorrupt {
        /// The daemon's tail.
        tail: u64,
        /// Our head.
        head: u64,
    },
}
