//! Two-sided meta messages (header + payload from the wire): parsing never
//! panics, and what parses re-emits to bytes that parse the same.
#![no_main]
use krcore_meta::wire::Repr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = Repr::parse_bytes(data) {
        let bytes = repr.to_bytes();
        assert_eq!(Repr::parse_bytes(&bytes).ok(), Some(repr));
    }
});
