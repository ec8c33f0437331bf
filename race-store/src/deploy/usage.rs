//! Every memory node's usage, read from the records the nodes keep in
//! their reserved prefixes ([`crate::layout::usage`]).

use super::Store;
use crate::layout::slot::RemotePtr;
use crate::layout::usage::{UsageRepr, USAGE_OFFSET, USAGE_SIZE};
use crate::rdma::VqpTransport;

/// READs of a usage record that may meet the node's write and fail their
/// CRC before [`Store::usage`] gives up on it.
const USAGE_READS: usize = 4;

impl Store {
    /// Every memory node's usage, as its usage record says
    /// ([`crate::layout::usage`]: one one-sided READ per node, nothing
    /// asked of the nodes' CPUs), in id order: `None` for a node with no
    /// record (an older build, or one that has not written it yet).
    ///
    /// # Errors
    /// Transport errors ([`crate::Error`]).
    pub fn usage(&self) -> Result<Vec<(u8, Option<UsageRepr>)>, crate::Error> {
        use crate::remote::{OpResult, RemoteOp, Transport};
        let mut t = VqpTransport::connect(self.node(), self.infos())?;
        let mut out = Vec::with_capacity(self.infos().len());
        for info in self.infos() {
            let ptr = RemotePtr::new(info.id, USAGE_OFFSET)?;
            let mut usage = None;
            for _ in 0..USAGE_READS {
                let r = t.execute(&[RemoteOp::Read {
                    ptr,
                    len: USAGE_SIZE as u32,
                }])?;
                let bytes = r.first().and_then(OpResult::read_bytes).unwrap_or(&[]);
                match UsageRepr::parse(bytes) {
                    Ok(u) => {
                        usage = Some(u);
                        break;
                    }
                    // Torn by the node's write: read it again.
                    Err(crate::LayoutError::ChecksumMismatch { .. }) => continue,
                    Err(_) => break,
                }
            }
            out.push((info.id, usage));
        }
        Ok(out)
    }
}
