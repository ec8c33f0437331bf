//! The table memory in a registered MR holds exactly the image the pure
//! engine writes into a vector, and refuses out-of-range words without
//! panicking.

use super::gid;
use crate::mr_table::MrTable;
use crate::registry::MetaTable;
use crate::table::{Geometry, TableMemory};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Access, DcTarget, MemoryRegion, Nic};

fn mr_table(len: usize) -> MrTable<krcore_nic::sim::SimMr> {
    let nic = SimNic::open(&SimFabric::in_memory(), SimConfig::default()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    MrTable::new(nic.alloc_mr(&pd, len, Access::LOCAL_WRITE).unwrap())
}

#[test]
fn mr_image_equals_the_vector_image() {
    let g = Geometry::new(8, 2).unwrap();
    let mut in_mr = MetaTable::new(g, mr_table(g.table_len() as usize)).unwrap();
    let mut in_vec = MetaTable::with_vec(g);
    for (i, now) in (0..20u64).zip((0..).step_by(7)) {
        let t = DcTarget {
            gid: gid(i % 5),
            dct_num: i as u32,
            dc_key: i * 3,
        };
        assert_eq!(
            in_mr.register(t, 1, 50, now),
            in_vec.register(t, 1, 50, now)
        );
        if i % 4 == 3 {
            assert_eq!(
                in_mr.deregister(&gid(i % 5), i as u32),
                in_vec.deregister(&gid(i % 5), i as u32)
            );
        }
        assert_eq!(in_mr.sweep(now), in_vec.sweep(now));
    }
    let mut bytes = vec![0u8; g.table_len() as usize];
    in_mr.memory().mr().read(0, &mut bytes).unwrap();
    assert_eq!(&bytes, in_vec.memory());
    let mut words = vec![0u8; 64];
    in_mr.memory().read_words(64, &mut words);
    assert_eq!(&words[..], &in_vec.memory()[64..128]);
    assert_eq!(in_mr.memory().load_u64(8), in_vec.memory().load_u64(8));
    assert_eq!(in_mr.memory().faults(), 0);
}

#[test]
fn out_of_range_words_are_counted_not_panics() {
    let mut m = mr_table(64);
    m.store_u64(64, 1);
    assert_eq!(m.load_u64(64), 0);
    let mut buf = [0xffu8; 16];
    m.read_words(56, &mut buf);
    assert_eq!(buf, [0u8; 16]);
    assert_eq!(m.faults(), 3);
    m.store_u64(56, 0x0102_0304_0506_0708);
    let mut b = [0u8; 8];
    m.mr().read(56, &mut b).unwrap();
    assert_eq!(
        b,
        0x0102_0304_0506_0708u64.to_le_bytes(),
        "little-endian image"
    );
}
