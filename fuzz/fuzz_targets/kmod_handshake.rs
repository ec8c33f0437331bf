//! The RC-fallback handshake messages (UD datagrams from any peer): the
//! checked view and the parse never panic, and what parses re-emits to bytes
//! that parse to the same message.
#![no_main]
use krcore_kmod::handshake::{HandshakePacket, HandshakeRepr, HANDSHAKE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = HandshakeRepr::is_handshake(data);
    // Also zero-padded to one message, so every input reaches the parser.
    let mut one = data[..data.len().min(HANDSHAKE_LEN)].to_vec();
    one.resize(HANDSHAKE_LEN, 0);
    for buf in [data, &one[..]] {
        if let Ok(p) = HandshakePacket::new_checked(buf) {
            let _ = (p.magic(), p.version(), p.msg_type(), p.code(), p.nonce());
            let _ = (p.gid(), p.qpn(), p.reply_qkey());
        }
        if let Ok(repr) = HandshakeRepr::parse_bytes(buf) {
            let again = HandshakeRepr::parse_bytes(&repr.emit()).expect("emitted bytes parse");
            assert_eq!(again, repr);
        }
    }
});
