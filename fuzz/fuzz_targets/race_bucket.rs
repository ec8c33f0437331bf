//! RACE buckets and combined buckets read from a memory node: every view and
//! accessor is total over arbitrary bytes. Inputs are also zero-padded to the
//! layout sizes (64 B bucket, 192 B group) so every input reaches the parsers.
#![no_main]
use libfuzzer_sys::fuzz_target;
use race_store::layout::bucket::{Bucket, BucketRepr, CombinedBucket, MainSide};
use std::num::NonZeroU8;

fn padded(data: &[u8], len: usize) -> Vec<u8> {
    let mut v = data[..data.len().min(len)].to_vec();
    v.resize(len, 0);
    v
}

fuzz_target!(|data: &[u8]| {
    let fp = NonZeroU8::new(data.first().copied().unwrap_or(1).max(1)).unwrap();
    for buf in [data.to_vec(), padded(data, 64), padded(data, 192)] {
        if let Ok(b) = Bucket::new_checked(&buf[..]) {
            let _ = (
                b.local_depth(),
                b.suffix(),
                b.header(),
                b.load(),
                b.first_free(),
            );
            let _ = b.matching(fp).count();
            for i in 0..8 {
                let _ = b.slot(i);
            }
            let _ = BucketRepr::parse(&b);
        }
        for side in [MainSide::Left, MainSide::Right] {
            if let Ok(c) = CombinedBucket::new_checked(&buf[..], side) {
                let _ = (c.header(), c.load(), c.matching(fp).count());
            }
        }
    }
});
