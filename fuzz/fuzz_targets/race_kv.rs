//! Out-of-place KV blocks read from a memory node: decoding never panics,
//! and a block that decodes re-encodes to the same key and value.
#![no_main]
use race_store::layout::kv;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = kv::decode_checked(data) {
        let (k, v) = (r.key().to_vec(), r.value().to_vec());
        let block = kv::encode(&k, &v).expect("a decoded block re-encodes");
        let again = kv::decode_checked(&block).expect("re-encoded block decodes");
        assert_eq!((again.key(), again.value()), (&k[..], &v[..]));
    }
});
