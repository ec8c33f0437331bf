//! The 8-byte words of RACE (slots, directory header, directory entries),
//! as read by one-sided READ or returned by CAS: validation is total.
#![no_main]
use libfuzzer_sys::fuzz_target;
use race_store::layout::dir_header::DirHeader;
use race_store::layout::directory::DirEntry;
use race_store::layout::slot::Slot;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    bytes.resize(data.len().div_ceil(8).max(1) * 8, 0);
    for w in bytes.chunks_exact(8) {
        let raw = u64::from_le_bytes(w.try_into().unwrap());
        let _ = Slot::from_raw(raw).validate();
        let _ = DirHeader::from_raw(raw).validate();
        for depth in [0u8, 1, 5, 20, 63] {
            let _ = DirEntry::from_raw(raw).validate(depth);
        }
    }
});
