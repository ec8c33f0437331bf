//! The server's request handling as a pure function of (table, store
//! registry, request bytes, sender, `now_ms`): the host receives a message,
//! calls [`MetaTable::handle`] (or [`MetaTable::handle_with_stores`]), and
//! sends back the reply it returns. No I/O, no clock.

use crate::registry::{Lease, MetaTable, TableError};
use crate::stores::{StoreError, StoreRegistry};
use crate::table::TableMemory;
use crate::wire::{BootstrapRepr, ErrorCode, Message, Packet, Repr, WireError, MAGIC};
use krcore_nic::Gid;

impl From<&StoreError> for ErrorCode {
    fn from(e: &StoreError) -> ErrorCode {
        match e {
            StoreError::BadStoreName { .. } => ErrorCode::BadStoreName,
            StoreError::RecordTooLong { .. } => ErrorCode::RecordTooLong,
            StoreError::InvalidLease => ErrorCode::InvalidLease,
            StoreError::MemberExists { .. } => ErrorCode::MemberExists,
            StoreError::NoSuchStore { .. } => ErrorCode::NoSuchStore,
            StoreError::NoSuchMember { .. } => ErrorCode::NoSuchMember,
            StoreError::NotHolder { .. } => ErrorCode::NotHolder,
            StoreError::StoreFull { .. } => ErrorCode::StoreFull,
            StoreError::EpochExhausted => ErrorCode::EpochExhausted,
        }
    }
}

impl StoreRegistry {
    /// Applies a store request sent by `sender` at server time `now_ms`,
    /// returning the reply's body, or `None` when `message` is not a store
    /// request.
    ///
    /// - StoreJoin: joins (or renews) with `sender` as the member's GID:
    ///   `Ok(lease)` or `Err(code)` mapped from [`StoreError`].
    /// - StoreLeave: `Ok` with epoch 1 and the removed member's expiry, or
    ///   `Err(code)`.
    /// - StoreList: `StoreMembers` or `Err(NoSuchStore)`.
    pub fn handle(&mut self, message: &Message, sender: Gid, now_ms: u64) -> Option<Message> {
        let result = match message {
            Message::StoreJoin(j) => self
                .join_name(j.store, j.id, sender, &j.record, j.lease_ms, now_ms)
                .map(Message::Ok),
            Message::StoreLeave { store, id } => self.leave_name(*store, *id, sender).map(|m| {
                Message::Ok(Lease {
                    epoch: 1,
                    lease_expiry_ms: m.lease_expiry_ms,
                    replaced_dct: 0,
                })
            }),
            Message::StoreList { store } => {
                self.list_name(store, now_ms).map(Message::StoreMembers)
            }
            _ => return None,
        };
        Some(result.unwrap_or_else(|e| Message::Err(ErrorCode::from(&e))))
    }
}

/// The error code of a request that does not parse.
pub(crate) fn parse_error_code(e: &WireError) -> ErrorCode {
    match e {
        WireError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
        WireError::BadStoreName(_) => ErrorCode::BadStoreName,
        WireError::RecordTooLong(_) => ErrorCode::RecordTooLong,
        _ => ErrorCode::Malformed,
    }
}

impl From<&TableError> for ErrorCode {
    fn from(e: &TableError) -> ErrorCode {
        match e {
            TableError::BucketFull { .. } => ErrorCode::BucketFull,
            TableError::NotRegistered { .. } => ErrorCode::NotRegistered,
            TableError::LeaseExpired { .. } => ErrorCode::LeaseExpired,
            TableError::InvalidLease => ErrorCode::InvalidLease,
            TableError::EpochExhausted => ErrorCode::EpochExhausted,
            TableError::Replaced { .. } => ErrorCode::Replaced,
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
    /// - Store requests get `Err(UnexpectedMessage)`: this table keeps no
    ///   stores (see [`MetaTable::handle_with_stores`]).
    pub fn handle(
        &mut self,
        request: &[u8],
        now_ms: u64,
        bootstrap: &BootstrapRepr,
    ) -> Option<Repr> {
        self.handle_request(None, request, now_ms, bootstrap)
    }

    /// As [`MetaTable::handle`], for a server that also keeps `stores`:
    /// StoreJoin and StoreLeave sent by `sender` (the GID messaging
    /// received the request from, never a field of the request) apply to
    /// `stores` (see [`StoreRegistry::handle`]). A StoreList gets
    /// `Err(UnexpectedMessage)`: lists travel over TCP, whose replies are
    /// not bounded by [`crate::wire::MAX_MESSAGE_LEN`].
    pub fn handle_with_stores(
        &mut self,
        stores: &mut StoreRegistry,
        sender: Gid,
        request: &[u8],
        now_ms: u64,
        bootstrap: &BootstrapRepr,
    ) -> Option<Repr> {
        self.handle_request(Some((stores, sender)), request, now_ms, bootstrap)
    }

    fn handle_request(
        &mut self,
        stores: Option<(&mut StoreRegistry, Gid)>,
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
            Err(e) => return reply(request_id, Message::Err(parse_error_code(&e))),
        };
        let result: Result<Message, TableError> = match req.message {
            Message::Register(r) => self
                .register(r.target, r.lid, r.lease_ms, now_ms)
                .map(Message::Ok),
            Message::Renew { gid, dct_num } => self.renew(&gid, dct_num, now_ms).map(Message::Ok),
            Message::Deregister { gid, dct_num } => self.deregister(&gid, dct_num).map(|e| {
                Message::Ok(Lease {
                    epoch: e.epoch,
                    lease_expiry_ms: e.lease_expiry_ms,
                    replaced_dct: 0,
                })
            }),
            Message::BootstrapRequest => Ok(Message::Bootstrap(*bootstrap)),
            Message::StoreJoin(_) | Message::StoreLeave { .. } => match stores {
                Some((stores, sender)) => Ok(stores
                    .handle(&req.message, sender, now_ms)
                    .unwrap_or(Message::Err(ErrorCode::Internal))),
                None => Ok(Message::Err(ErrorCode::UnexpectedMessage)),
            },
            Message::StoreList { .. }
            | Message::Ok(_)
            | Message::Err(_)
            | Message::Bootstrap(_)
            | Message::StoreMembers(_) => Ok(Message::Err(ErrorCode::UnexpectedMessage)),
        };
        let message = result.unwrap_or_else(|e| Message::Err(ErrorCode::from(&e)));
        reply(request_id, message)
    }
}
