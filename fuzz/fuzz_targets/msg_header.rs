//! A two-sided message's header read from a receive buffer: parsing never
//! panics, and a header that parses re-emits to bytes that parse to the
//! same header.
#![no_main]
use krcore_kmod::msg::{MsgPacket, MsgRepr, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Also as exactly one header (zero-padded), so every input reaches parse.
    let mut one = data[..data.len().min(HEADER_LEN)].to_vec();
    one.resize(HEADER_LEN, 0);
    check(data);
    check(&one);
});

fn check(data: &[u8]) {
    let Ok(p) = MsgPacket::new_checked(data) else {
        return;
    };
    // Every accessor is total on a checked view.
    let _ = (p.dst(), p.src_port(), p.gid(), p.arg(), p.len(), p.addr(), p.body().len());
    let Ok(repr) = MsgRepr::parse(&p) else {
        return;
    };
    let mut image = repr.emit().to_vec();
    // The body travels after the header (a Data message's, an Open's
    // carried message).
    if repr.kind.inline_body_len().is_some() {
        image.extend_from_slice(p.body());
    }
    assert_eq!(MsgRepr::parse_bytes(&image), Ok(repr));
}
