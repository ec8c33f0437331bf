//! An attached process's store membership calls (see `host_store` for
//! what the daemon checks): a memory node attached to the daemon joins its
//! store through the daemon's engine.

use krcore_meta::stores::{StoreName, RECORD_MAX};
use krcore_meta::wire::ErrorCode;

use super::client::{unexpected, Attached};
use super::error::DaemonError;
use super::wire::{Reply, Request};

impl Attached {
    /// Joins `store` as member `id` with `record` for `lease_ms`, or
    /// renews the membership (and replaces its record): a StoreJoin of the
    /// daemon's engine, so the member's GID is the node's. Renew it by
    /// joining again before the lease ends. The daemon leaves it when this
    /// process goes.
    ///
    /// # Errors
    /// [`DaemonError::MetaRefused`] with the meta server's code
    /// (`BadStoreName`, `RecordTooLong`, `InvalidLease`, `MemberExists`,
    /// `StoreFull`); [`DaemonError::Refused`] when another process of the
    /// node holds the member, or this process holds 16 memberships
    /// already; the engine's errors as `Refused` with its words (the meta
    /// server did not answer, ...).
    pub fn store_join(
        &self,
        store: &str,
        id: u16,
        record: &[u8],
        lease_ms: u64,
    ) -> Result<(), DaemonError> {
        check_name(store)?;
        if record.len() > RECORD_MAX {
            return Err(DaemonError::MetaRefused {
                code: ErrorCode::RecordTooLong,
            });
        }
        let req = Request::StoreJoin {
            store: store.to_string(),
            id,
            record: record.to_vec(),
            lease_ms,
        };
        done(self.conn.call(&req)?.0, "a StoreJoin")
    }

    /// Leaves `store` (member `id`, joined by this process).
    ///
    /// # Errors
    /// [`DaemonError::Refused`] when this process did not join it;
    /// [`DaemonError::MetaRefused`] with the meta server's code.
    pub fn store_leave(&self, store: &str, id: u16) -> Result<(), DaemonError> {
        check_name(store)?;
        let req = Request::StoreLeave {
            store: store.to_string(),
            id,
        };
        done(self.conn.call(&req)?.0, "a StoreLeave")
    }
}

/// A name the meta server would refuse is refused here, with its code,
/// before anything is sent (as the engine checks in-process).
fn check_name(store: &str) -> Result<(), DaemonError> {
    StoreName::new(store)
        .map(|_| ())
        .map_err(|e| DaemonError::MetaRefused {
            code: ErrorCode::from(&e),
        })
}

fn done(reply: Reply, what: &str) -> Result<(), DaemonError> {
    match reply {
        Reply::Done => Ok(()),
        Reply::MetaRefused { code } => Err(DaemonError::MetaRefused {
            code: ErrorCode::from_u16(code).unwrap_or(ErrorCode::Unknown(code)),
        }),
        _ => Err(unexpected(what)),
    }
}
