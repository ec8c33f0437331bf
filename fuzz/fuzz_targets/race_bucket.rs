//! RACE buckets and combined buckets read from a memory node: every view and
//! accessor is total over arbitrary bytes.
#![no_main]
use race_store::layout::bucket::{Bucket, BucketRepr, CombinedBucket, MainSide};
use libfuzzer_sys::fuzz_target;
use std::num::NonZeroU8;

fuzz_target!(|data: &[u8]| {
    let fp = NonZeroU8::new(data.first().copied().unwrap_or(1).max(1)).unwrap();
    if let Ok(b) = Bucket::new_checked(data) {
        let _ = (b.local_depth(), b.suffix(), b.header(), b.load(), b.first_free());
        let _ = b.matching(fp).count();
        for i in 0..8 {
            let _ = b.slot(i);
        }
        let _ = BucketRepr::parse(&b);
    }
    for side in [MainSide::Left, MainSide::Right] {
        if let Ok(c) = CombinedBucket::new_checked(data, side) {
            let _ = (c.header(), c.load(), c.matching(fp).count());
        }
    }
});
