//! A bucket of the meta table (one READ): lookup never panics, whatever the
//! bytes and the GID asked for.
#![no_main]
use krcore_meta::table::find_in_bucket;
use krcore_nic::Gid;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let mut g = [0u8; 16];
    g.copy_from_slice(&data[..16]);
    let _ = find_in_bucket(&data[16..], &Gid(g));
});
