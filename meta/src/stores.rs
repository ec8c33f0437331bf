//! The membership of named stores, kept by the meta server beside the DC
//! entries: store name -> member id -> (member GID, opaque record, lease).
//!
//! Memory nodes of a deployed store join it with two-sided messages (as any
//! registration: the member's GID is the sender's, taken from messaging, not
//! from the request), renew by joining again, and leave; clients list a
//! store's live members over the meta server's TCP address (see
//! [`crate::bootstrap::fetch_store_tcp`]). [`StoreRegistry`] is the pure
//! state machine: no I/O, no clock (every call that depends on time takes
//! `now_ms`, the server's clock in milliseconds).
//!
//! # Rules
//! - A store name is 1..=[`STORE_NAME_MAX`] bytes of `[A-Za-z0-9._-]`
//!   ([`StoreName`]); a record at most [`RECORD_MAX`] bytes.
//! - A member is live while `now_ms < lease_expiry_ms`. A join of a live
//!   `(store, id)` by the same GID is a renewal: it refreshes the record
//!   and the lease (which never moves backwards); by another GID it is
//!   refused [`StoreError::MemberExists`]. An expired member may be
//!   replaced by anyone.
//! - Only the holder's GID may make a member leave.
//! - A store exists while it has a live member: listing one that has none
//!   is [`StoreError::NoSuchStore`].
//! - Bounded: at most `max_stores` stores, [`MAX_MEMBERS`] members each;
//!   a lease of 0 ms is refused.
//! - Epochs (in the [`Lease`] a join returns) come from one registry-wide
//!   counter: a fresh member gets a new one, a renewal keeps its own.

use crate::registry::Lease;
use krcore_nic::Gid;
use std::collections::BTreeMap;

/// Longest store name, in bytes (the wire field's size).
pub const STORE_NAME_MAX: usize = 32;
/// Longest member record, in bytes (the wire field's size).
pub const RECORD_MAX: usize = 64;
/// Most members of one store.
pub const MAX_MEMBERS: usize = 255;
/// Most stores of a [`StoreRegistry::default`].
pub const DEFAULT_MAX_STORES: usize = 1024;

/// Why a store operation was refused. The registry's live members are
/// unchanged when one is returned (a refused join may have dropped expired
/// ones, as a sweep would).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The name is empty, longer than [`STORE_NAME_MAX`], or has a byte
    /// outside `[A-Za-z0-9._-]`.
    #[error("bad store name {name:?}: 1..=32 bytes of [A-Za-z0-9._-]")]
    BadStoreName {
        /// The name (lossily decoded).
        name: String,
    },
    /// The record is longer than [`RECORD_MAX`].
    #[error("a member record of {len} bytes is longer than {RECORD_MAX}")]
    RecordTooLong {
        /// Its length.
        len: usize,
    },
    /// A lease of 0 ms was asked for.
    #[error("a lease must last at least 1 ms")]
    InvalidLease,
    /// The id is held, live, by another GID.
    #[error("member {id} of store {store} is held by {holder}")]
    MemberExists {
        /// The store.
        store: StoreName,
        /// The member id.
        id: u16,
        /// The GID holding it.
        holder: Gid,
    },
    /// The store has no live member.
    #[error("no store {store}")]
    NoSuchStore {
        /// The store.
        store: StoreName,
    },
    /// The store has no member with this id.
    #[error("store {store} has no member {id}")]
    NoSuchMember {
        /// The store.
        store: StoreName,
        /// The member id.
        id: u16,
    },
    /// The member is held by another GID than the one asking it to leave.
    #[error("member {id} of store {store} is held by {holder}, not by the sender")]
    NotHolder {
        /// The store.
        store: StoreName,
        /// The member id.
        id: u16,
        /// The GID holding it.
        holder: Gid,
    },
    /// The store has [`MAX_MEMBERS`] live members, or the registry its
    /// maximum of stores.
    #[error("store {store} cannot be joined: the registry or the store is full")]
    StoreFull {
        /// The store.
        store: StoreName,
    },
    /// The epoch counter reached `u32::MAX`.
    #[error("epoch counter exhausted")]
    EpochExhausted,
}

/// A checked store name: 1..=[`STORE_NAME_MAX`] bytes of `[A-Za-z0-9._-]`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreName {
    bytes: [u8; STORE_NAME_MAX],
    len: u8,
}

impl StoreName {
    /// Checks `name`.
    ///
    /// # Errors
    /// [`StoreError::BadStoreName`].
    pub fn new(name: &str) -> Result<StoreName, StoreError> {
        StoreName::from_bytes(name.as_bytes())
    }

    /// Checks `name` given as bytes (exactly the name: no padding).
    ///
    /// # Errors
    /// [`StoreError::BadStoreName`].
    pub fn from_bytes(name: &[u8]) -> Result<StoreName, StoreError> {
        let ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
        if name.is_empty() || name.len() > STORE_NAME_MAX || !name.iter().all(ok) {
            return Err(StoreError::BadStoreName {
                name: String::from_utf8_lossy(name).into_owned(),
            });
        }
        let mut bytes = [0u8; STORE_NAME_MAX];
        bytes[..name.len()].copy_from_slice(name);
        Ok(StoreName {
            bytes,
            len: name.len() as u8,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Checked ASCII at construction: never the fallback.
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    /// The name's bytes (no padding).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The name NUL-padded to [`STORE_NAME_MAX`] bytes (its wire form).
    pub fn padded(&self) -> &[u8; STORE_NAME_MAX] {
        &self.bytes
    }
}

impl std::fmt::Debug for StoreName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreName({:?})", self.as_str())
    }
}

impl std::fmt::Display for StoreName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One live member of a store, as [`StoreRegistry::list`] returns it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreMember {
    /// The member id, unique within the store.
    pub id: u16,
    /// The GID that joined (the sender of the join).
    pub gid: Gid,
    /// The member's opaque record (at most [`RECORD_MAX`] bytes).
    pub record: Vec<u8>,
    /// When the membership ends unless renewed (server clock, ms).
    pub lease_expiry_ms: u64,
}

#[derive(Debug, Clone)]
struct Member {
    gid: Gid,
    record: Vec<u8>,
    epoch: u32,
    lease_expiry_ms: u64,
}

impl Member {
    fn live(&self, now_ms: u64) -> bool {
        now_ms < self.lease_expiry_ms
    }
}

/// The membership of every store (see the module docs). A single-writer
/// state machine: the host serialises calls.
#[derive(Debug, Clone)]
pub struct StoreRegistry {
    stores: BTreeMap<StoreName, BTreeMap<u16, Member>>,
    max_stores: usize,
    last_epoch: u32,
}

impl Default for StoreRegistry {
    fn default() -> StoreRegistry {
        StoreRegistry::new(DEFAULT_MAX_STORES)
    }
}

fn name_of(store: &str) -> Result<StoreName, StoreError> {
    StoreName::new(store)
}

impl StoreRegistry {
    /// An empty registry holding at most `max_stores` stores (at least 1).
    pub fn new(max_stores: usize) -> StoreRegistry {
        StoreRegistry {
            stores: BTreeMap::new(),
            max_stores: max_stores.max(1),
            last_epoch: 0,
        }
    }

    /// Stores held (with a member, live or not yet swept).
    pub fn n_stores(&self) -> usize {
        self.stores.len()
    }

    /// Members held, over every store (live or not yet swept).
    pub fn n_members(&self) -> usize {
        self.stores.values().map(BTreeMap::len).sum()
    }

    /// Joins `store` as member `id` for the sender `gid`, with `record`,
    /// for `lease_ms` from `now_ms`; or renews the membership when `gid`
    /// holds `id` already (see the module docs).
    ///
    /// # Errors
    /// [`StoreError::BadStoreName`], [`StoreError::RecordTooLong`],
    /// [`StoreError::InvalidLease`], [`StoreError::MemberExists`],
    /// [`StoreError::StoreFull`], [`StoreError::EpochExhausted`].
    pub fn join(
        &mut self,
        store: &str,
        id: u16,
        gid: Gid,
        record: &[u8],
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Lease, StoreError> {
        self.join_name(name_of(store)?, id, gid, record, lease_ms, now_ms)
    }

    /// [`StoreRegistry::join`] with a checked name.
    ///
    /// # Errors
    /// As [`StoreRegistry::join`], but for the name.
    pub fn join_name(
        &mut self,
        store: StoreName,
        id: u16,
        gid: Gid,
        record: &[u8],
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Lease, StoreError> {
        if record.len() > RECORD_MAX {
            return Err(StoreError::RecordTooLong { len: record.len() });
        }
        if lease_ms == 0 {
            return Err(StoreError::InvalidLease);
        }
        let expiry = now_ms.saturating_add(lease_ms);
        if let Some(members) = self.stores.get_mut(&store) {
            if let Some(m) = members.get_mut(&id) {
                if m.live(now_ms) {
                    if m.gid != gid {
                        return Err(StoreError::MemberExists {
                            store,
                            id,
                            holder: m.gid,
                        });
                    }
                    // A renewal: same epoch, lease never backwards.
                    m.record = record.to_vec();
                    m.lease_expiry_ms = m.lease_expiry_ms.max(expiry);
                    return Ok(Lease {
                        epoch: m.epoch,
                        lease_expiry_ms: m.lease_expiry_ms,
                        replaced_dct: 0,
                    });
                }
            }
        } else if self.stores.len() >= self.max_stores {
            // Make room from stores whose members all expired.
            self.sweep(now_ms);
            if self.stores.len() >= self.max_stores {
                return Err(StoreError::StoreFull { store });
            }
        }
        let epoch = self
            .last_epoch
            .checked_add(1)
            .ok_or(StoreError::EpochExhausted)?;
        let members = self.stores.entry(store).or_default();
        if !members.contains_key(&id) && members.len() >= MAX_MEMBERS {
            members.retain(|_, m| m.live(now_ms));
            if members.len() >= MAX_MEMBERS {
                return Err(StoreError::StoreFull { store });
            }
        }
        self.last_epoch = epoch;
        members.insert(
            id,
            Member {
                gid,
                record: record.to_vec(),
                epoch,
                lease_expiry_ms: expiry,
            },
        );
        Ok(Lease {
            epoch,
            lease_expiry_ms: expiry,
            replaced_dct: 0,
        })
    }

    /// Removes member `id` of `store`, if `gid` holds it (live or
    /// expired), returning it.
    ///
    /// # Errors
    /// [`StoreError::BadStoreName`], [`StoreError::NoSuchStore`],
    /// [`StoreError::NoSuchMember`], [`StoreError::NotHolder`].
    pub fn leave(&mut self, store: &str, id: u16, gid: Gid) -> Result<StoreMember, StoreError> {
        self.leave_name(name_of(store)?, id, gid)
    }

    /// [`StoreRegistry::leave`] with a checked name.
    ///
    /// # Errors
    /// As [`StoreRegistry::leave`], but for the name.
    pub fn leave_name(
        &mut self,
        store: StoreName,
        id: u16,
        gid: Gid,
    ) -> Result<StoreMember, StoreError> {
        let members = self
            .stores
            .get_mut(&store)
            .ok_or(StoreError::NoSuchStore { store })?;
        let m = members
            .get(&id)
            .ok_or(StoreError::NoSuchMember { store, id })?;
        if m.gid != gid {
            return Err(StoreError::NotHolder {
                store,
                id,
                holder: m.gid,
            });
        }
        let m = members.remove(&id);
        if members.is_empty() {
            self.stores.remove(&store);
        }
        match m {
            Some(m) => Ok(StoreMember {
                id,
                gid: m.gid,
                record: m.record,
                lease_expiry_ms: m.lease_expiry_ms,
            }),
            None => Err(StoreError::NoSuchMember { store, id }),
        }
    }

    /// The live members of `store` at `now_ms`, by id.
    ///
    /// # Errors
    /// [`StoreError::BadStoreName`]; [`StoreError::NoSuchStore`] when it
    /// has no live member.
    pub fn list(&self, store: &str, now_ms: u64) -> Result<Vec<StoreMember>, StoreError> {
        self.list_name(&name_of(store)?, now_ms)
    }

    /// [`StoreRegistry::list`] with a checked name.
    ///
    /// # Errors
    /// [`StoreError::NoSuchStore`].
    pub fn list_name(
        &self,
        store: &StoreName,
        now_ms: u64,
    ) -> Result<Vec<StoreMember>, StoreError> {
        let live: Vec<StoreMember> = self
            .stores
            .get(store)
            .into_iter()
            .flat_map(|ms| ms.iter())
            .filter(|(_, m)| m.live(now_ms))
            .map(|(&id, m)| StoreMember {
                id,
                gid: m.gid,
                record: m.record.clone(),
                lease_expiry_ms: m.lease_expiry_ms,
            })
            .collect();
        if live.is_empty() {
            return Err(StoreError::NoSuchStore { store: *store });
        }
        Ok(live)
    }

    /// Removes every member whose lease ended at or before `now_ms` (and
    /// stores left without members), returning `(store, id, gid)` of each.
    pub fn sweep(&mut self, now_ms: u64) -> Vec<(StoreName, u16, Gid)> {
        let mut gone = Vec::new();
        self.stores.retain(|name, members| {
            members.retain(|&id, m| {
                let keep = m.live(now_ms);
                if !keep {
                    gone.push((*name, id, m.gid));
                }
                keep
            });
            !members.is_empty()
        });
        gone
    }
}
