//! The server's request handling as a pure function of (table, request bytes,
//! `now_ms`): the host receives a message, calls [`MetaTable::handle`], and
//! sends back the reply it returns. No I/O, no clock.

use crate::engine::{Lease, MetaTable, TableError};
use crate::table::TableMemory;
use crate::wire::{BootstrapRepr, ErrorCode, Message, Packet, Repr, WireError, MAGIC};

impl From<&TableError> for ErrorCode {
    fn from(e: &TableError) -> ErrorCode {
        match e {
            TableError::BucketFull { .. } => ErrorCode::BucketFull,
            TableError::NotRegistered { .. } => ErrorCode::NotRegistered,
            TableError::LeaseExpired { .. } => ErrorCode::LeaseExpired,
            TableError::InvalidLease => ErrorCode::InvalidLease,
            TableError::EpochExhausted => ErrorCode::EpochExhausted,
            TableError::MemoryTooSmall { .. } => ErrorCode::Internal,
        }
    }
}

impl<M: TableMemory> MetaTable<M> {
    /// Handles one request received as `request` at server time `now_ms`,
    /// returning the reply to send (with the request's id), or `None` when the
    /// bytes are not a meta message at all (too short for a header, or a bad
    /// magic): there is no request id to answer.
    ///
    /// - A message this server cannot parse gets `Err(UnsupportedVersion)` or
    ///   `Err(Malformed)`; a reply type sent as a request gets
    ///   `Err(UnexpectedMessage)`.
    /// - Register, Renew, Deregister apply to the table and answer `Ok(lease)`
    ///   (Deregister: the removed registration's epoch and expiry) or
    ///   `Err(code)` mapped from [`TableError`].
    /// - BootstrapRequest answers `Bootstrap(bootstrap)`.
    pub fn handle(
        &mut self,
        request: &[u8],
        now_ms: u64,
        bootstrap: &BootstrapRepr,
    ) -> Option<Repr> {
        let reply = |request_id, message| {
            Some(Repr {
                request_id,
                message,
            })
        };
        let header = Packet::new_unchecked(request);
        let request_id = match header.check_len() {
            // Not even a header: nothing to answer.
            Err(WireError::Truncated { len, .. }) if len < crate::wire::HEADER_LEN => return None,
            _ if header.magic() != MAGIC => return None,
            _ => header.request_id(),
        };
        let req = match Repr::parse(&header) {
            Ok(r) => r,
            Err(WireError::UnsupportedVersion(_)) => {
                return reply(request_id, Message::Err(ErrorCode::UnsupportedVersion))
            }
            Err(_) => return reply(request_id, Message::Err(ErrorCode::Malformed)),
        };
        let result: Result<Message, TableError> = match req.message {
            Message::Register(r) => self
                .register(r.target, r.lid, r.lease_ms, now_ms)
                .map(Message::Ok),
            Message::Renew { gid } => self.renew(&gid, now_ms).map(Message::Ok),
            Message::Deregister { gid } => self.deregister(&gid).map(|e| {
                Message::Ok(Lease {
                    epoch: e.epoch,
                    lease_expiry_ms: e.lease_expiry_ms,
                })
            }),
            Message::BootstrapRequest => Ok(Message::Bootstrap(*bootstrap)),
            Message::Ok(_) | Message::Err(_) | Message::Bootstrap(_) => {
                Ok(Message::Err(ErrorCode::UnexpectedMessage))
            }
        };
        let message = result.unwrap_or_else(|e| Message::Err(ErrorCode::from(&e)));
        reply(request_id, message)
    }
}
