//! Why a transport operation failed ([`TransportError`]), and the error of
//! the layer below it ([`Cause`]).

use crate::layout::slot::RemotePtr;

/// The error below a [`TransportError`] (the SDK's, the provider's, the
/// meta server's), shared so that the error stays `Clone`: its
/// [`std::error::Error::source`] chain is the original's. Two causes are
/// equal when they print the same (errors of the layers below have no
/// equality of their own).
#[derive(Clone)]
pub struct Cause(std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>);

impl Cause {
    /// Wraps `e`.
    pub fn new<E: std::error::Error + Send + Sync + 'static>(e: E) -> Cause {
        Cause(std::sync::Arc::new(e))
    }

    /// A cause that is only a message.
    pub fn msg(message: impl Into<String>) -> Cause {
        #[derive(Debug)]
        struct Msg(String);
        impl std::fmt::Display for Msg {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl std::error::Error for Msg {}
        Cause::new(Msg(message.into()))
    }

    /// The wrapped error (to `downcast_ref` it).
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.to_string() == other.to_string()
    }
}

impl Eq for Cause {}

/// Why a transport call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The memory node does not answer (crashed, or failed by fault injection).
    #[error("memory node {node} is down")]
    NodeDown {
        /// The node.
        node: u8,
    },
    /// The memory node stopped answering and another process serves its id
    /// now: it restarted with an empty region, and the table's data on it
    /// is lost (a deployed store's client learns it from the store's
    /// membership when the node stops answering).
    #[error(
        "memory node {node} restarted (incarnation {was:#x}, now {now:#x}): the data it held \
         is lost; start the store anew (every memory node)"
    )]
    NodeReplaced {
        /// The node.
        node: u8,
        /// The incarnation this client connected to.
        was: u64,
        /// The incarnation serving the id now.
        now: u64,
    },
    /// No memory node has this id.
    #[error("no memory node {node}")]
    NoSuchNode {
        /// The node.
        node: u8,
    },
    /// The range is outside the node's registered region.
    #[error("range {ptr:?}+{len} is outside the node's region")]
    OutOfBounds {
        /// Start of the range.
        ptr: RemotePtr,
        /// Its length.
        len: u64,
    },
    /// An atomic on an address that is not 8-byte aligned.
    #[error("atomic at {ptr:?} is not 8-byte aligned")]
    Misaligned {
        /// The address.
        ptr: RemotePtr,
    },
    /// The memory node has no block of this size left.
    #[error("memory node {node} cannot allocate {size} bytes")]
    OutOfMemory {
        /// The node.
        node: u8,
        /// The requested size.
        size: u64,
    },
    /// This client's connection is gone (fault injection: the client "died").
    #[error("transport disconnected")]
    Disconnected,
    /// The transport could not be set up (a memory node unknown to the
    /// meta server, no memory for buffers, ...).
    #[error("transport setup: {what}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: Cause,
    },
    /// The local side refused the operation before it reached the network
    /// (the KRCore pre-check: out of the node's grant, for example), or a
    /// call of the layer below failed.
    #[error("memory node {node}: refused")]
    Refused {
        /// The memory node.
        node: u8,
        /// Why.
        #[source]
        source: Cause,
    },
    /// An operation completed with an error status the other variants do
    /// not name.
    #[error("memory node {node}: completion status {status:?}")]
    Failed {
        /// The memory node.
        node: u8,
        /// The status.
        status: krcore_nic::WcStatus,
    },
    /// No completion came within the transport's bound.
    #[error("memory node {node}: no completion within {after:?}")]
    Timeout {
        /// The memory node.
        node: u8,
        /// How long the transport waited.
        after: std::time::Duration,
    },
    /// An answer came under a lease the memory node had already ended and
    /// replaced ([`crate::holders`]): what it granted may have been taken
    /// back, so it is not used.
    #[error("memory node {node}: this client's lease on its grants ended (they may have been taken back)")]
    LeaseEnded {
        /// Memory node id.
        node: u8,
    },
    /// The memory node is collecting what dead clients left
    /// ([`crate::client::Client::collect`]): until it is done (a grant
    /// lease at most, then a scan of the table) it grants, renews and
    /// takes back nothing for any client; other nodes serve meanwhile.
    #[error("memory node {node} is collecting the memory dead clients left; try again later")]
    Collecting {
        /// Memory node id.
        node: u8,
    },
    /// The transport returned results that do not match the batch.
    #[error("malformed transport response: {reason}")]
    BadResponse {
        /// What was wrong.
        reason: &'static str,
    },
    /// The transport (or the memory node behind it) cannot do this.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What it cannot do.
        what: &'static str,
    },
}
