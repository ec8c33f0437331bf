//! Out-of-place KV blocks read from a memory node: decoding never panics,
//! and a block that decodes re-encodes to the same key and value.
//!
//! Raw bytes rarely pass the magic and the CRC, so every input is also used
//! as a recipe: a valid block is encoded from a key and value cut from the
//! input, then torn (truncated) and corrupted at positions the input
//! chooses, which drives the decoder through its length, checksum and key
//! checks.
#![no_main]
use libfuzzer_sys::fuzz_target;
use race_store::layout::kv;

fn check(buf: &[u8]) {
    if let Ok(r) = kv::decode_checked(buf) {
        let (k, v) = (r.key().to_vec(), r.value().to_vec());
        assert_eq!(r.block_len() % 64, 0);
        let block = kv::encode(&k, &v).expect("a decoded block re-encodes");
        let again = kv::decode_checked(&block).expect("re-encoded block decodes");
        assert_eq!((again.key(), again.value()), (&k[..], &v[..]));
        assert!(kv::decode_for_key(buf, &k).is_ok());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let klen = (usize::from(ctl) % 16 + 1).min(rest.len());
    let (key, rest) = rest.split_at(klen);
    let Ok(mut block) = kv::encode(key, rest) else {
        return;
    };
    check(&block);
    let _ = kv::decode_for_key(&block, b"another key");
    // Corrupt one byte and tear the tail, as the input's first byte says.
    if !block.is_empty() {
        let at = usize::from(ctl) * 7 % block.len();
        block[at] ^= ctl | 1;
        check(&block);
        block.truncate(block.len() - usize::from(ctl) % block.len());
        check(&block);
    }
});
