//! Resizing: the leased resize lock, the split log, and copy-on-split of a
//! subtable into two new ones, with directory doubling. The protocol and its
//! invariants are in [`super::protocol`].

use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::bucket::{BUCKETS_PER_GROUP, BUCKET_HEADER_SIZE, BUCKET_SIZE, GROUP_SIZE};
use crate::layout::dir_header::{DirHeader, LockDecision};
use crate::layout::directory::entry_offset;
use crate::layout::extendible::{doubled_upper_half, entries_of, needs_doubling, split_rewrites};
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot, SLOT_SIZE};
use crate::layout::subtable::{SplitPlan, Subtable, SubtableGeometry, Suffix};
use crate::layout::table::{SplitLogRepr, DIR_PTR, SPLIT_LOG_SIZE};
use crate::layout::{read_u64, write_array};
use crate::remote::{RemoteOp, Transport, TransportError};

use super::engine::{cas_old, take_read, OpCtx};
use super::Client;

/// What a lock holder's work ended with.
enum Held {
    /// Done.
    Done,
    /// The lease was lost: another client finishes the work.
    Lost,
}

/// One slot of a subtable image.
pub(crate) struct ImageSlot {
    /// Byte offset in the subtable.
    pub(crate) offset: usize,
    /// Bucket group.
    pub(crate) group: u32,
    /// Bucket in the group (0, 1 = overflow, 2).
    pub(crate) bucket: usize,
    /// The slot word.
    pub(crate) word: Slot,
}

/// Every slot of a subtable image, in address order.
pub(crate) fn image_slots(image: &[u8], geometry: SubtableGeometry) -> Vec<ImageSlot> {
    let mut out = Vec::new();
    for group in 0..geometry.groups() {
        for bucket in 0..BUCKETS_PER_GROUP {
            for index in 0..crate::layout::bucket::SLOTS_PER_BUCKET {
                let offset = group as usize * GROUP_SIZE
                    + bucket * BUCKET_SIZE
                    + BUCKET_HEADER_SIZE
                    + index * SLOT_SIZE;
                out.push(ImageSlot {
                    offset,
                    group,
                    bucket,
                    word: Slot::from_raw(read_u64(image, offset)),
                });
            }
        }
    }
    out
}

/// Whether a key with `hash` may sit in bucket `bucket` of group `group`: one
/// of its two main buckets or their overflow bucket.
pub(crate) fn position_fits(
    hash: &KeyHash,
    geometry: SubtableGeometry,
    group: u32,
    bucket: usize,
) -> bool {
    hash.bucket_locs(geometry).iter().any(|loc| {
        loc.group == group
            && (bucket == 1 || bucket == loc.side.main_offset_in_group() / BUCKET_SIZE)
    })
}

impl<T: Transport> Client<T> {
    /// The lease clock: `(now, lease)` in lease units.
    pub(crate) fn lease_clock(&self) -> (u64, u64) {
        let unit = self.config.lease_unit_ticks.max(1);
        (
            self.now() / unit,
            self.config.lease_ticks.div_ceil(unit).max(1),
        )
    }

    fn split_log_ptr(&self) -> Result<RemotePtr, Error> {
        Ok(RemotePtr::new(0, self.table.split_log_offset)?)
    }

    /// Splits the subtable `sub`, which holds `hash` and has no room for it.
    /// Returns when the split is done, or when another client holds the
    /// resize lock (after backing off): the caller retries its operation.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] if no memory node has room for the new
    /// subtables or the directory is at its maximum depth (nothing changed).
    pub(crate) fn split(
        &mut self,
        hash: &KeyHash,
        sub: RemotePtr,
        ctx: &OpCtx,
    ) -> Result<(), Error> {
        let Some(mut held) = self.lock()? else {
            self.backoff(ctx);
            return Ok(());
        };
        let outcome = self.split_locked(&mut held, hash, sub);
        self.release_lock(held, outcome)
    }

    /// Takes the resize lock (free, or with an expired lease) and finishes
    /// the logged split, if any.
    pub(crate) fn take_over(&mut self, ctx: &OpCtx) -> Result<(), Error> {
        let Some(mut held) = self.lock()? else {
            self.backoff(ctx);
            return Ok(());
        };
        let outcome = self.recover(&mut held);
        self.release_lock(held, outcome)
    }

    /// [`Client::recover_resize`]: `false` if the lock is busy.
    pub(crate) fn take_over_now(&mut self) -> Result<bool, Error> {
        let Some(mut held) = self.lock()? else {
            return Ok(false);
        };
        let outcome = self.recover(&mut held);
        self.release_lock(held, outcome)?;
        Ok(true)
    }

    fn release_lock(&mut self, held: DirHeader, outcome: Result<Held, Error>) -> Result<(), Error> {
        match outcome {
            Ok(Held::Done) => {
                self.unlock(held)?;
                Ok(())
            }
            Ok(Held::Lost) => Ok(()),
            Err(e) => {
                let _ = self.unlock(held);
                Err(e)
            }
        }
    }

    /// Tries to take the resize lock (the directory header word): `None` if
    /// another client holds it under a live lease or won the race.
    fn lock(&mut self) -> Result<Option<DirHeader>, Error> {
        let mut res = self.exec(&[RemoteOp::Read {
            ptr: DIR_PTR,
            len: 8,
        }])?;
        let raw = read_u64(&take_read(&mut res, 0)?, 0);
        let (now, lease) = self.lease_clock();
        let decision = DirHeader::from_raw(raw)
            .try_lock(self.id, now, lease)
            .map_err(|e| Error::corrupt("directory header", e))?;
        let (new, steal) = match decision {
            LockDecision::Acquire { new } => (new, false),
            LockDecision::Steal { new, .. } => (new, true),
            LockDecision::Busy { .. } => return Ok(None),
        };
        if !self.cas_header(raw, new)? {
            return Ok(None);
        }
        if steal {
            self.stats.takeovers += 1;
        }
        Ok(Some(new))
    }

    fn cas_header(&mut self, expect: u64, new: DirHeader) -> Result<bool, Error> {
        let res = self.exec(&[RemoteOp::Cas {
            ptr: DIR_PTR,
            expect,
            new: new.raw(),
        }])?;
        Ok(cas_old(&res, 0)? == expect)
    }

    /// Makes sure the lease has at least half its length left, renewing it
    /// with a CAS if not. `false`: the lock was lost.
    fn ensure_lease(&mut self, held: &mut DirHeader) -> Result<bool, Error> {
        let (now, lease) = self.lease_clock();
        if held.lease_expiry() > now.saturating_add(lease / 2) {
            return Ok(true);
        }
        let new = held.renew(self.id, now, lease)?;
        if self.cas_header(held.raw(), new)? {
            *held = new;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn unlock(&mut self, held: DirHeader) -> Result<bool, Error> {
        let new = held.unlock(self.id, held.global_depth())?;
        self.cas_header(held.raw(), new)
    }

    /// Finishes the split in the log, if any (every lock holder starts with
    /// this, so a split whose owner died is finished by the next one).
    fn recover(&mut self, held: &mut DirHeader) -> Result<Held, Error> {
        let log_ptr = self.split_log_ptr()?;
        let mut res = self.exec(&[RemoteOp::Read {
            ptr: log_ptr,
            len: SPLIT_LOG_SIZE as u32,
        }])?;
        match SplitLogRepr::parse(&take_read(&mut res, 0)?) {
            Ok(Some(log)) => self.finish_split(held, &log),
            Ok(None) => Ok(Held::Done),
            Err(_) => {
                // Torn by a crash during its WRITE: nothing had changed yet.
                self.exec(&[RemoteOp::Write {
                    ptr: log_ptr,
                    bytes: &[0u8; SPLIT_LOG_SIZE],
                }])?;
                Ok(Held::Done)
            }
        }
    }

    fn split_locked(
        &mut self,
        held: &mut DirHeader,
        hash: &KeyHash,
        sub: RemotePtr,
    ) -> Result<Held, Error> {
        let Held::Done = self.recover(held)? else {
            return Ok(Held::Lost);
        };
        self.refresh_directory()?;
        let entry = self.dir.lookup(hash).ok_or(Error::BadTable {
            reason: "empty directory",
        })?;
        if entry.ptr() != sub {
            // Split by someone else meanwhile.
            return Ok(Held::Done);
        }
        let depth = entry.local_depth();
        if depth >= self.table.max_global_depth {
            return Err(Error::OutOfMemory {
                what: "directory at its maximum depth",
            });
        }
        let old = Suffix::of_hash(hash.dir_hash(), depth)?;
        let plan = SplitPlan::new(old)?;
        let y0 = self.alloc_subtable(plan.stay())?;
        let y1 = match self.alloc_subtable(plan.moved()) {
            Ok(p) => p,
            Err(e) => {
                self.spare_subtables.push(y0);
                return Err(e);
            }
        };
        if !self.ensure_lease(held)? {
            self.spare_subtables.extend([y0, y1]);
            return Ok(Held::Lost);
        }
        let log = SplitLogRepr {
            old,
            old_ptr: sub,
            new: [y0, y1],
        };
        let mut buf = [0u8; SPLIT_LOG_SIZE];
        log.emit(&mut buf)?;
        self.exec(&[RemoteOp::Write {
            ptr: self.split_log_ptr()?,
            bytes: &buf,
        }])?;
        self.finish_split(held, &log)
    }

    /// A new subtable's memory: a spare one (allocated for a split that did
    /// not happen), else a block on the node the suffix maps to, else on any
    /// node with room.
    fn alloc_subtable(&mut self, suffix: Suffix) -> Result<RemotePtr, Error> {
        if let Some(p) = self.spare_subtables.pop() {
            return Ok(p);
        }
        let nodes = self.transport.nodes().max(1);
        let prefer = (suffix.bits() % u32::from(nodes)) as u8;
        let size = self.table.geometry.bytes();
        for i in 0..nodes {
            let node = ((u16::from(prefer) + u16::from(i)) % u16::from(nodes)) as u8;
            self.stats.transport.block_rpcs += 1;
            match self.transport.alloc_block(node, size) {
                Ok(p) => return Ok(p),
                Err(TransportError::OutOfMemory { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::OutOfMemory {
            what: "new subtable for a split",
        })
    }

    /// Carries out (or completes) the logged split. Idempotent: every step
    /// can be redone by a client that took the lock over.
    fn finish_split(&mut self, held: &mut DirHeader, log: &SplitLogRepr) -> Result<Held, Error> {
        let geometry = self.table.geometry;
        let plan = SplitPlan::new(log.old)?;
        if !self.ensure_lease(held)? {
            return Ok(Held::Lost);
        }
        self.refresh_directory()?;
        let mut g = self.dir.global_depth();
        let published = log.old.depth() < g
            && entries_of(log.old, g)?.any(|i| {
                self.dir
                    .entries()
                    .get(i)
                    .is_some_and(|e| log.new.contains(&e.ptr()))
            });
        if !published {
            // 1. Freeze every slot of the old subtable; 2. build both halves
            // from the frozen image; 3. write them; 4. retire the old one.
            let image = self.freeze(log.old_ptr)?;
            let halves = self.build_halves(&image, log, &plan)?;
            if !self.ensure_lease(held)? {
                return Ok(Held::Lost);
            }
            let [h0, h1] = &halves;
            self.exec(&[
                RemoteOp::Write {
                    ptr: log.new[0],
                    bytes: h0,
                },
                RemoteOp::Write {
                    ptr: log.new[1],
                    bytes: h1,
                },
            ])?;
            let mut retired = image;
            Subtable::new_checked(&mut retired[..], geometry)?.set_retired();
            if !self.ensure_lease(held)? {
                return Ok(Held::Lost);
            }
            self.exec(&[RemoteOp::Write {
                ptr: log.old_ptr,
                bytes: &retired,
            }])?;
        }
        if !self.ensure_lease(held)? {
            return Ok(Held::Lost);
        }
        // 5. Double the directory if the old subtable was as deep as it.
        if needs_doubling(log.old.depth(), g) {
            if g >= self.table.max_global_depth {
                return Err(Error::OutOfMemory {
                    what: "directory at its maximum depth",
                });
            }
            let upper = doubled_upper_half(g, self.dir.entries())?;
            let bytes: Vec<u8> = upper.iter().flat_map(|e| e.raw().to_le_bytes()).collect();
            self.exec(&[RemoteOp::Write {
                ptr: DIR_PTR.add(entry_offset(1 << g)? as u64)?,
                bytes: &bytes,
            }])?;
            let (now, lease) = self.lease_clock();
            let new = DirHeader::locked(g + 1, self.id, now.saturating_add(lease))?;
            if !self.cas_header(held.raw(), new)? {
                return Ok(Held::Lost);
            }
            *held = new;
            g += 1;
            self.stats.doublings += 1;
            self.dir.apply_double(upper, new);
        }
        // 6. Point the old subtable's entries to the halves; 7. clear the log.
        let rewrites = split_rewrites(&plan, g, log.new[0], log.new[1])?;
        let words: Vec<[u8; 8]> = rewrites
            .iter()
            .map(|(_, e)| e.raw().to_le_bytes())
            .collect();
        let ops = rewrites
            .iter()
            .zip(&words)
            .map(|((i, _), bytes)| {
                Ok(RemoteOp::Write {
                    ptr: DIR_PTR.add(entry_offset(*i)? as u64)?,
                    bytes,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        self.exec(&ops)?;
        self.dir.apply_rewrites(&rewrites);
        self.exec(&[RemoteOp::Write {
            ptr: self.split_log_ptr()?,
            bytes: &[0u8; SPLIT_LOG_SIZE],
        }])?;
        self.stats.splits += 1;
        Ok(Held::Done)
    }

    /// CASes every slot of `sub` to its frozen form, re-reading until all
    /// are frozen; returns that final image. From then on no writer's CAS
    /// can change the subtable.
    fn freeze(&mut self, sub: RemotePtr) -> Result<Vec<u8>, Error> {
        let geometry = self.table.geometry;
        let len = u32::try_from(geometry.bytes()).map_err(|_| Error::BadTable {
            reason: "subtable larger than one READ",
        })?;
        for _ in 0..self.config.max_attempts {
            let mut res = self.exec(&[RemoteOp::Read { ptr: sub, len }])?;
            let image = take_read(&mut res, 0)?;
            let ops = image_slots(&image, geometry)
                .into_iter()
                .filter(|s| !s.word.is_frozen())
                .map(|s| {
                    Ok(RemoteOp::Cas {
                        ptr: sub.add(s.offset as u64)?,
                        expect: s.word.raw(),
                        new: s.word.frozen().raw(),
                    })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            if ops.is_empty() {
                return Ok(image);
            }
            self.exec(&ops)?;
        }
        Err(Error::Contention {
            attempts: self.config.max_attempts,
        })
    }

    /// The images of the two halves from the frozen image of the old
    /// subtable: every key goes to the same slot position in the half its
    /// hash bit `d` selects, every slot included, tentative or not: racing
    /// inserters go on settling their copies in the half (see "Insert" in
    /// [`super::protocol`]).
    fn build_halves(
        &mut self,
        image: &[u8],
        log: &SplitLogRepr,
        plan: &SplitPlan,
    ) -> Result<[Vec<u8>; 2], Error> {
        let geometry = self.table.geometry;
        let size = usize::try_from(geometry.bytes()).map_err(|_| Error::BadTable {
            reason: "subtable larger than memory",
        })?;
        let mut halves = [vec![0u8; size], vec![0u8; size]];
        for (half, suffix) in halves.iter_mut().zip([plan.stay(), plan.moved()]) {
            Subtable::new_checked(&mut half[..], geometry)?.init_empty(suffix);
        }
        let occupied: Vec<ImageSlot> = image_slots(image, geometry)
            .into_iter()
            .map(|s| ImageSlot {
                word: s.word.thawed(),
                ..s
            })
            .filter(|s| !s.word.is_empty())
            .collect();
        for chunk in occupied.chunks(SPLIT_READS) {
            let keys = self.read_keys(chunk)?;
            for (s, key) in chunk.iter().zip(keys) {
                let Some(key) = key else {
                    self.stats.bad_blocks += 1;
                    continue;
                };
                self.place(s, key, log, plan, &mut halves);
            }
        }
        Ok(halves)
    }

    /// The keys of the blocks of `slots` (frozen), `None` for a block
    /// whose header is wrong: one doorbell of [`kv::KEY_PEEK`]-byte READs,
    /// and one more for the keys that end past them. Not the values: a
    /// split needs only the keys, and a block cannot change while a frozen
    /// slot points to it (the values are most of the bytes: 1 KiB records
    /// made the first split of a YCSB load READ 60 MB in one doorbell).
    fn read_keys(&mut self, slots: &[ImageSlot]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let ops: Vec<RemoteOp<'_>> = slots
            .iter()
            .map(|s| RemoteOp::Read {
                ptr: s.word.ptr(),
                len: s.word.block_len().min(kv::KEY_PEEK) as u32,
            })
            .collect();
        let mut res = if ops.is_empty() {
            Vec::new()
        } else {
            self.exec(&ops)?
        };
        let mut keys = Vec::with_capacity(slots.len());
        let mut longer = Vec::new();
        for (i, s) in slots.iter().enumerate() {
            let buf = take_read(&mut res, i)?;
            keys.push(match kv::peek_key(&buf, s.word.block_len()) {
                Ok(kv::KeyPeek::Key(key)) => Some(key.to_vec()),
                Ok(kv::KeyPeek::Need(n)) => {
                    longer.push((i, n));
                    None
                }
                Err(_) => None,
            });
        }
        if longer.is_empty() {
            return Ok(keys);
        }
        let ops: Vec<RemoteOp<'_>> = longer
            .iter()
            .filter_map(|&(i, n)| slots.get(i).map(|s| (s, n)))
            .map(|(s, n)| RemoteOp::Read {
                ptr: s.word.ptr(),
                len: n as u32,
            })
            .collect();
        let mut res = self.exec(&ops)?;
        for (j, &(i, _)) in longer.iter().enumerate() {
            let buf = take_read(&mut res, j)?;
            let (Some(s), Some(key)) = (slots.get(i), keys.get_mut(i)) else {
                continue;
            };
            if let Ok(kv::KeyPeek::Key(k)) = kv::peek_key(&buf, s.word.block_len()) {
                *key = Some(k.to_vec());
            }
        }
        Ok(keys)
    }

    /// Puts the frozen slot `s` of `key` into its half at the same
    /// position, unless it does not belong to the old subtable.
    fn place(
        &mut self,
        s: &ImageSlot,
        key: Vec<u8>,
        log: &SplitLogRepr,
        plan: &SplitPlan,
        halves: &mut [Vec<u8>; 2],
    ) {
        let hash = KeyHash::of(&key);
        if hash.fingerprint().get() != s.word.fingerprint()
            || !log.old.contains(hash.dir_hash())
            || !position_fits(&hash, self.table.geometry, s.group, s.bucket)
        {
            self.stats.bad_blocks += 1;
            return;
        }
        let half = usize::from(plan.key_moves(hash.dir_hash()));
        if let Some(h) = halves.get_mut(half) {
            write_array(h, s.offset, s.word.raw().to_le_bytes());
        }
    }
}

/// Frozen slots whose keys one doorbell READs during a split (128 bytes
/// each: 256 KiB of landing room).
const SPLIT_READS: usize = 2048;
