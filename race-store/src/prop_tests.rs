//! Property-style tests across the pure layer, driven by a seeded RNG so that
//! every run is the same: garbage and truncated remote bytes never panic, the
//! KV CRC catches bit flips, and extendible hashing keeps every key reachable
//! through splits and doublings (on real bucket images).

use std::collections::{HashMap, HashSet};

use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::hash::KeyHash;
use crate::layout::bucket::{
    choose_insert_slot, Bucket, BucketLoc, BucketRepr, BucketRole, CombinedBucket, MainSide,
    BUCKETS_PER_GROUP, BUCKET_SIZE, COMBINED_SIZE, SLOTS_PER_BUCKET,
};
use crate::layout::dir_header::DirHeader;
use crate::layout::directory::{DirEntry, Directory, DirectoryRepr, DIR_ENTRIES_OFFSET};
use crate::layout::extendible::{entries_of, needs_doubling, split_rewrites};
use crate::layout::kv::{self, KV_OVERHEAD};
use crate::layout::slot::{RemotePtr, Slot};
use crate::layout::subtable::{SplitPlan, Subtable, SubtableGeometry, Suffix};
use crate::LayoutError;

fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

fn random_bytes(rng: &mut SmallRng, max_len: usize) -> Vec<u8> {
    let mut v = vec![0u8; rng.gen_range(0..=max_len)];
    rng.fill_bytes(&mut v);
    v
}

/// Every accessor of every view over `bytes`; results are discarded, the
/// property is that nothing panics.
fn exercise_all_views(bytes: &[u8]) {
    if let Ok(b) = Bucket::new_checked(bytes) {
        let _ = (
            b.local_depth(),
            b.suffix(),
            b.header(),
            b.load(),
            b.first_free(),
        );
        for i in 0..=SLOTS_PER_BUCKET {
            let _ = b.slot(i).map(Slot::validate);
        }
        let _ = b.matching(core::num::NonZeroU8::MIN).count();
        let _ = BucketRepr::parse(&b);
    }
    for side in [MainSide::Left, MainSide::Right] {
        if let Ok(c) = CombinedBucket::new_checked(bytes, side) {
            let _ = (c.header(), c.load(), c.slot_offset(BucketRole::Overflow, 3));
            let _ = c.matching(core::num::NonZeroU8::MAX).count();
            let _ = BucketRepr::parse(&c.main());
            let _ = BucketRepr::parse(&c.overflow());
            let _ = choose_insert_slot([&c, &c]);
        }
    }
    if let Ok(d) = Directory::new_checked(bytes) {
        let _ = (d.header(), d.len(), d.capacity(), d.lookup(u64::MAX));
        for i in 0..d.len() + 1 {
            let _ = d.entry(i).map(|e| e.validate(d.header().global_depth()));
        }
        if let Ok(repr) = DirectoryRepr::parse(&d) {
            let _ = repr.check_consistency();
        }
    }
    let geometry = SubtableGeometry::new(1).unwrap();
    if let Ok(st) = Subtable::new_checked(bytes, geometry) {
        for index in 0..=BUCKETS_PER_GROUP {
            let _ = st.bucket(0, index).map(|b| b.header());
        }
        for side in [MainSide::Left, MainSide::Right] {
            let _ = st
                .combined(BucketLoc { group: 0, side })
                .map(|c| c.header());
        }
    }
    let _ = kv::decode_checked(bytes);
    let _ = kv::decode_for_key(bytes, b"key");
    for chunk in bytes.chunks_exact(8) {
        let word = u64::from_le_bytes(chunk.try_into().unwrap());
        let _ = Slot::from_raw(word).validate();
        let _ = DirHeader::from_raw(word).validate();
        let _ = DirHeader::from_raw(word).try_lock(1, word >> 30, 1000);
        let _ = DirEntry::from_raw(word).validate(20);
        let _ = Suffix::from_header(word as u32, (word >> 32) as u32);
    }
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = rng(1);
    for _ in 0..3000 {
        let bytes = random_bytes(&mut rng, 400);
        exercise_all_views(&bytes);
    }
}

/// Garbage that passes the first checks: a valid directory header or a valid
/// KV magic with random lengths, so that the deeper paths run too.
#[test]
fn structured_garbage_never_panics() {
    let mut rng = rng(2);
    let (mut dirs, mut crc_checked) = (0, 0);
    for _ in 0..3000 {
        let mut bytes = random_bytes(&mut rng, 600);
        if bytes.len() >= 8 {
            let word = match rng.gen_range(0..3) {
                0 => DirHeader::unlocked(rng.gen_range(0..=5)).unwrap().raw(),
                1 => DirHeader::locked(rng.gen_range(0..=5), rng.gen(), rng.gen_range(0..1 << 39))
                    .unwrap()
                    .raw(),
                _ => {
                    let klen: u16 = rng.gen_range(0..300);
                    let vlen: u32 = if rng.gen() {
                        rng.gen_range(0..600)
                    } else {
                        rng.gen()
                    };
                    u64::from(klen) | u64::from(kv::KV_MAGIC) << 16 | u64::from(vlen) << 32
                }
            };
            bytes[..8].copy_from_slice(&word.to_le_bytes());
        }
        exercise_all_views(&bytes);
        dirs += usize::from(Directory::new_checked(&bytes[..]).is_ok());
        crc_checked += usize::from(matches!(
            kv::decode_checked(&bytes),
            Err(LayoutError::ChecksumMismatch { .. })
        ));
    }
    // The deep paths ran: directories parsed, KV blocks reached the CRC.
    assert!(dirs > 300 && crc_checked > 100, "{dirs} {crc_checked}");
}

/// Valid images of every structure, for the truncation test.
fn valid_images(rng: &mut SmallRng) -> Vec<Vec<u8>> {
    let header = Suffix::new(0b11, 2).unwrap();
    let mut repr = BucketRepr::empty(header);
    for s in repr
        .slots
        .iter_mut()
        .take(rng.gen_range(0..=SLOTS_PER_BUCKET))
    {
        let fp = core::num::NonZeroU8::new(rng.gen_range(1..=255)).unwrap();
        *s = Slot::new(fp, rng.gen_range(1..=255), RemotePtr::new(1, 4096).unwrap()).unwrap();
    }
    let mut bucket = vec![0u8; BUCKET_SIZE];
    repr.emit(&mut Bucket::new_checked(&mut bucket[..]).unwrap());
    let combined = [bucket.clone(), bucket.clone()].concat();

    let mut dir = DirectoryRepr::new(RemotePtr::new(0, 0).unwrap());
    for _ in 0..rng.gen_range(0..4) {
        dir.double().unwrap();
    }
    let mut dir_bytes = vec![0u8; dir.buffer_len()];
    dir.emit(&mut dir_bytes).unwrap();

    let key = random_bytes(rng, 40);
    let key = if key.is_empty() { vec![1] } else { key };
    let value = random_bytes(rng, 300);
    vec![
        bucket,
        combined,
        dir_bytes,
        kv::encode(&key, &value).unwrap(),
    ]
}

#[test]
fn truncations_are_errors_not_panics() {
    let mut rng = rng(3);
    for _ in 0..30 {
        let images = valid_images(&mut rng);
        let [bucket, combined, dir, block] = &images[..] else {
            unreachable!()
        };
        assert!(BucketRepr::parse(&Bucket::new_checked(&bucket[..]).unwrap()).is_ok());
        assert!(CombinedBucket::new_checked(&combined[..], MainSide::Right)
            .unwrap()
            .header()
            .is_ok());
        assert!(DirectoryRepr::parse(&Directory::new_checked(&dir[..]).unwrap()).is_ok());
        assert!(kv::decode_checked(block).is_ok());
        for image in &images {
            for cut in 0..image.len() {
                exercise_all_views(&image[..cut]);
            }
        }
        for cut in 0..BUCKET_SIZE {
            assert!(matches!(
                Bucket::new_checked(&bucket[..cut]),
                Err(LayoutError::Truncated { .. })
            ));
        }
        for cut in 0..COMBINED_SIZE {
            assert!(CombinedBucket::new_checked(&combined[..cut], MainSide::Left).is_err());
        }
        for cut in 0..dir.len() {
            assert!(Directory::new_checked(&dir[..cut]).is_err(), "cut {cut}");
        }
        // A KV block is only whole once its CRC is in the buffer.
        let used = KV_OVERHEAD
            + kv::decode_checked(block).unwrap().key().len()
            + kv::decode_checked(block).unwrap().value().len();
        for cut in 0..used {
            assert!(matches!(
                kv::decode_checked(&block[..cut]),
                Err(LayoutError::Truncated { .. })
            ));
        }
        assert!(kv::decode_checked(&block[..used]).is_ok());
    }
}

#[test]
fn kv_bit_flips_are_detected() {
    let mut rng = rng(4);
    for _ in 0..3000 {
        let key = random_bytes(&mut rng, 64);
        let key = if key.is_empty() { vec![0] } else { key };
        let value = random_bytes(&mut rng, 1000);
        let block = kv::encode(&key, &value).unwrap();
        let covered = KV_OVERHEAD + key.len() + value.len();
        let mut flipped = block.clone();
        let mut bits = HashSet::new();
        for _ in 0..rng.gen_range(1..=3) {
            let bit = rng.gen_range(0..covered * 8);
            if bits.insert(bit) {
                flipped[bit / 8] ^= 1 << (bit % 8);
            }
        }
        assert!(
            kv::decode_checked(&flipped).is_err(),
            "flips at bits {bits:?} of a {covered} B block went unnoticed"
        );
        // The padding is not covered: flipping it leaves the block valid.
        if covered < block.len() {
            let mut padded = block.clone();
            padded[rng.gen_range(covered..block.len())] ^= 0xFF;
            assert_eq!(kv::decode_checked(&padded).unwrap().value(), &value[..]);
        }
    }
}

/// A table in memory: the directory image plus subtable images, driven only
/// through the pure layer, with each key's slot pointing to a fake KV address
/// that maps back to the key (as a splitting client would read the KV block).
struct SimTable {
    geometry: SubtableGeometry,
    dir: DirectoryRepr,
    subtables: Vec<Vec<u8>>,
    kv_owner: HashMap<RemotePtr, (Vec<u8>, KeyHash)>,
    splits: usize,
    doublings: usize,
}

impl SimTable {
    fn new(groups: u32) -> Self {
        let geometry = SubtableGeometry::new(groups).unwrap();
        let mut table = Self {
            geometry,
            dir: DirectoryRepr::new(Self::subtable_ptr(geometry, 0)),
            subtables: Vec::new(),
            kv_owner: HashMap::new(),
            splits: 0,
            doublings: 0,
        };
        table.new_subtable(Suffix::ROOT);
        table
    }

    fn subtable_ptr(geometry: SubtableGeometry, id: usize) -> RemotePtr {
        RemotePtr::new(0, id as u64 * geometry.bytes()).unwrap()
    }

    fn subtable_id(&self, ptr: RemotePtr) -> usize {
        (ptr.offset() / self.geometry.bytes()) as usize
    }

    fn new_subtable(&mut self, suffix: Suffix) -> RemotePtr {
        let mut image = vec![0u8; self.geometry.bytes() as usize];
        Subtable::new_checked(&mut image[..], self.geometry)
            .unwrap()
            .init_empty(suffix);
        self.subtables.push(image);
        Self::subtable_ptr(self.geometry, self.subtables.len() - 1)
    }

    fn insert(&mut self, key: &[u8], kv_ptr: RemotePtr) {
        let hash = KeyHash::of(key);
        self.kv_owner.insert(kv_ptr, (key.to_vec(), hash));
        let slot = Slot::new(hash.fingerprint(), 1, kv_ptr).unwrap();
        loop {
            let entry = self.dir.lookup(hash.dir_hash()).unwrap();
            let id = self.subtable_id(entry.ptr());
            let [l0, l1] = hash.bucket_locs(self.geometry);
            let target = {
                let st = Subtable::new_checked(&self.subtables[id][..], self.geometry).unwrap();
                let (c0, c1) = (st.combined(l0).unwrap(), st.combined(l1).unwrap());
                // The bucket header confirms the directory led to the right subtable.
                assert!(c0.header().unwrap().contains(hash.dir_hash()));
                choose_insert_slot([&c0, &c1])
            };
            if let Some(t) = target {
                let loc = [l0, l1][t.candidate];
                let mut st =
                    Subtable::new_checked(&mut self.subtables[id][..], self.geometry).unwrap();
                let mut c = st.combined_mut(loc).unwrap();
                c.bucket_mut(t.role).set_slot(t.slot, slot).unwrap();
                return;
            }
            self.split(entry);
        }
    }

    fn split(&mut self, entry: DirEntry) {
        let old_id = self.subtable_id(entry.ptr());
        let old_suffix = Bucket::new_checked(&self.subtables[old_id][..BUCKET_SIZE])
            .unwrap()
            .header()
            .unwrap();
        assert_eq!(old_suffix.depth(), entry.local_depth());
        if needs_doubling(old_suffix.depth(), self.dir.global_depth()) {
            self.dir.double().unwrap();
            self.doublings += 1;
        }
        let plan = SplitPlan::new(old_suffix).unwrap();
        let new_ptr = self.new_subtable(plan.moved());
        let new_id = self.subtable_id(new_ptr);
        let (mut stayed, mut moved) = (0, 0);
        // Move every slot whose key has hash bit d set to the same position.
        for offset in (0..self.geometry.bytes() as usize).step_by(BUCKET_SIZE) {
            for i in 0..SLOTS_PER_BUCKET {
                let at = offset + crate::layout::bucket::slot_offset(i).unwrap();
                let word =
                    Slot::from_le_bytes(self.subtables[old_id][at..at + 8].try_into().unwrap());
                if word.is_empty() {
                    continue;
                }
                let (_, hash) = &self.kv_owner[&word.ptr()];
                assert_eq!(word.fingerprint(), hash.fingerprint().get());
                let dest = plan
                    .destination(hash.dir_hash())
                    .expect("key of the old subtable");
                assert_eq!(dest == plan.moved(), plan.key_moves(hash.dir_hash()));
                assert!(dest.contains(hash.dir_hash()));
                assert!(
                    !(plan.stay().contains(hash.dir_hash())
                        && plan.moved().contains(hash.dir_hash()))
                );
                if plan.key_moves(hash.dir_hash()) {
                    self.subtables[new_id][at..at + 8].copy_from_slice(&word.to_le_bytes());
                    self.subtables[old_id][at..at + 8].fill(0);
                    moved += 1;
                } else {
                    stayed += 1;
                }
            }
        }
        assert!(stayed + moved > 0);
        let rewrites =
            split_rewrites(&plan, self.dir.global_depth(), entry.ptr(), new_ptr).unwrap();
        assert_eq!(
            rewrites.len(),
            1 << (self.dir.global_depth() - old_suffix.depth())
        );
        self.dir.apply_split(&plan, entry.ptr(), new_ptr).unwrap();
        Subtable::new_checked(&mut self.subtables[old_id][..], self.geometry)
            .unwrap()
            .set_headers(plan.stay());
        self.dir.check_consistency().unwrap();
        self.splits += 1;
    }

    /// Finds `key` the way a client would: directory, two combined buckets,
    /// fingerprint, then the KV block. Returns the subtable id and the number
    /// of matching slots.
    fn find(&self, key: &[u8]) -> (usize, usize) {
        let hash = KeyHash::of(key);
        let entry = self.dir.lookup(hash.dir_hash()).unwrap();
        let id = self.subtable_id(entry.ptr());
        let st = Subtable::new_checked(&self.subtables[id][..], self.geometry).unwrap();
        let mut found = HashSet::new();
        for loc in hash.bucket_locs(self.geometry) {
            let c = st.combined(loc).unwrap();
            let header = c.header().unwrap();
            assert!(header.contains(hash.dir_hash()), "stale subtable for key");
            assert_eq!(header.depth(), entry.local_depth());
            for (role, i, slot) in c.matching(hash.fingerprint()) {
                if self.kv_owner[&slot.ptr()].0 == key {
                    let off = self.geometry.slot_offset(loc, role, i).unwrap();
                    found.insert(off);
                }
            }
        }
        (id, found.len())
    }
}

#[test]
fn splits_keep_every_key_reachable() {
    let mut rng = rng(5);
    for groups in [1, 2, 3] {
        let mut table = SimTable::new(groups);
        let mut keys = Vec::new();
        for n in 0..1500u64 {
            let key = format!("key-{}-{n}", rng.gen::<u32>()).into_bytes();
            table.insert(&key, RemotePtr::new(1, n * 64).unwrap());
            keys.push(key);
            if n % 100 == 0 {
                for k in &keys {
                    assert_eq!(table.find(k).1, 1);
                }
            }
        }
        assert!(
            table.splits > 10 && table.doublings > 2,
            "{} splits",
            table.splits
        );
        // Every key is in exactly one place, reachable through the directory.
        let mut per_subtable = vec![0usize; table.subtables.len()];
        for k in &keys {
            let (id, n) = table.find(k);
            assert_eq!(n, 1);
            per_subtable[id] += 1;
        }
        let mut occupied = 0;
        for (id, image) in table.subtables.iter().enumerate() {
            let st = Subtable::new_checked(&image[..], table.geometry).unwrap();
            let suffix = st.bucket(0, 0).unwrap().header().unwrap();
            for g in 0..table.geometry.groups() {
                for b in 0..BUCKETS_PER_GROUP {
                    let bucket = st.bucket(g, b).unwrap();
                    let repr = BucketRepr::parse(&bucket).unwrap();
                    assert_eq!(repr.header, suffix);
                    for s in repr.slots.iter().filter(|s| !s.is_empty()) {
                        assert!(suffix.contains(table.kv_owner[&s.ptr()].1.dir_hash()));
                        occupied += 1;
                    }
                }
            }
            // The directory agrees with the subtable's own header.
            let entries: Vec<_> = entries_of(suffix, table.dir.global_depth())
                .unwrap()
                .collect();
            for i in entries {
                assert_eq!(table.subtable_id(table.dir.entries[i].ptr()), id);
            }
        }
        assert_eq!(occupied, keys.len());
        assert_eq!(per_subtable.iter().sum::<usize>(), keys.len());
        // The directory round-trips through its byte image.
        let mut image = vec![0u8; table.dir.buffer_len()];
        table.dir.emit(&mut image).unwrap();
        let view = Directory::new_checked(&image[..]).unwrap();
        assert_eq!(DirectoryRepr::parse(&view).unwrap(), table.dir);
        assert_eq!(
            image.len(),
            DIR_ENTRIES_OFFSET + 8 * table.dir.entries.len()
        );
    }
}
