//! The node daemon's control frames and ring entries (`krcore_kmod::daemon`),
//! which an attached process and the daemon read from each other (untrusted):
//! the frame prefix and both decoders never panic; a request that decodes
//! re-encodes to the very bytes it came from, a reply to bytes that decode to
//! the same reply; an SQE (the input zero-padded to two 64-byte slots: the
//! entry and its continuation) decodes to a WR the ring can carry or to an
//! opcode or payload error, and a CQE (16 bytes) always decodes; what
//! decodes re-encodes to entries that decode the same.
#![no_main]
use krcore_kmod::daemon::wire::{
    frame_len, frame_len_within, MsgFailure, Reply, Request, MAX_FRAME, MAX_REPLY_FRAME,
};
use krcore_kmod::daemon::{
    decode_cqe_bytes, decode_sqe_bytes, encode_cqe_bytes, encode_sqe_bytes, sqe_continues,
    DecodeError, CQE_BYTES, SQE_BYTES,
};
use krcore_nic::{Destination, Payload, SendFlags, WrOp, MAX_INLINE, MAX_SGE};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    // As a frame: a checked length prefix, then that many bytes of body.
    if let Some((prefix, rest)) = data.split_first_chunk::<4>() {
        if let Ok(len) = frame_len(*prefix) {
            assert!(len <= MAX_FRAME);
            if let Some(body) = rest.get(..len) {
                control(body);
            }
        }
    }
    // As a body, whatever its length.
    control(data);
    sqe(&padded::<{ 2 * SQE_BYTES }>(data));
    cqe(&padded::<CQE_BYTES>(data));
});

fn padded<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut one = [0u8; N];
    let n = data.len().min(N);
    one[..n].copy_from_slice(&data[..n]);
    one
}

/// The body of an encoded frame, after checking its prefix.
fn body_of(frame: &[u8]) -> &[u8] {
    let (prefix, body) = frame
        .split_first_chunk::<4>()
        .expect("a frame has a prefix");
    assert_eq!(
        frame_len_within(*prefix, MAX_REPLY_FRAME),
        Ok(body.len()),
        "encoded frame's prefix"
    );
    body
}

fn control(body: &[u8]) {
    if let Ok(req) = Request::decode(body) {
        // Every field of a request is kept whole: decoding is one-to-one.
        let frame = req.encode();
        assert_eq!(body_of(&frame), body);
        assert_eq!(Request::decode(body_of(&frame)), Ok(req));
    }
    if let Ok(rep) = Reply::decode(body) {
        let frame = rep.encode();
        let again = Reply::decode(body_of(&frame)).expect("an encoded reply decodes");
        match (&rep, &again) {
            // The encoder caps a reason text at a character boundary: a
            // longer one comes back cut, the same up to there.
            (
                Reply::Refused { code, message },
                Reply::Refused {
                    code: code2,
                    message: message2,
                },
            ) if message.len() > message_cap() => {
                assert_eq!(code, code2);
                assert_eq!(message2, cut(message), "{rep:?}");
            }
            (
                Reply::MsgFailed(MsgFailure::Other(text)),
                Reply::MsgFailed(MsgFailure::Other(text2)),
            ) if text.len() > message_cap() => assert_eq!(text2, cut(text), "{rep:?}"),
            (
                Reply::MsgFailed(MsgFailure::Unsupported(text)),
                Reply::MsgFailed(MsgFailure::Unsupported(text2)),
            ) if text.len() > message_cap() => assert_eq!(text2, cut(text), "{rep:?}"),
            _ => assert_eq!(again, rep),
        }
    }
}

/// `text` cut as the encoder cuts it (at most [`message_cap`] bytes, at a
/// character boundary).
fn cut(text: &str) -> &str {
    let mut keep = message_cap();
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    &text[..keep]
}

/// The longest refusal message that survives encoding whole (the wire
/// module's cap is private: measured once, so the target follows it).
fn message_cap() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| {
        let long = Reply::Refused {
            code: krcore_kmod::daemon::wire::RefuseCode::Engine,
            message: "x".repeat(4 * MAX_FRAME),
        };
        match Reply::decode(body_of(&long.encode())) {
            Ok(Reply::Refused { message, .. }) => message.len(),
            other => panic!("a refusal does not round-trip: {other:?}"),
        }
    })
}

fn sqe(slots: &[u8; 2 * SQE_BYTES]) {
    let (head, cont) = slots.split_at(SQE_BYTES);
    let head: &[u8; SQE_BYTES] = head.try_into().expect("one slot");
    let cont: &[u8; SQE_BYTES] = cont.try_into().expect("one slot");
    let opcode = head[8];
    // Without its continuation, an entry that needs one is Truncated.
    if sqe_continues(head) {
        assert!(matches!(
            decode_sqe_bytes(head, None),
            Err(DecodeError::Truncated | DecodeError::Opcode(_) | DecodeError::Payload { .. })
        ));
    }
    let wr = match decode_sqe_bytes(head, Some(cont)) {
        Ok(wr) => wr,
        Err(DecodeError::Opcode(op)) => {
            assert_eq!(op, u64::from(opcode));
            assert!(!(1..=4).contains(&op));
            return;
        }
        Err(DecodeError::Payload { kind, count, .. }) => {
            assert_eq!((kind, count), (head[10], head[11]));
            return;
        }
        Err(e) => panic!("the continuation was given: {e:?}"),
    };
    assert!((1..=4).contains(&opcode));
    // What the decoder promises the daemon's post path.
    match &wr.payload {
        Payload::Local(list) => assert!(list.as_slice().len() <= MAX_SGE, "at most 4 SGEs"),
        Payload::Inline(d) => {
            assert!(matches!(wr.op, WrOp::Write { .. }), "inline only on WRITE");
            assert!(d.as_slice().len() <= MAX_INLINE);
        }
    }
    assert!(matches!(wr.dest, Destination::Connected));
    assert_eq!(
        wr.flags.0 & !(SendFlags::SIGNALED.0 | SendFlags::FENCE.0),
        0
    );
    let (again, again_cont) = encode_sqe_bytes(0, &wr).expect("a decoded WR encodes");
    assert_eq!(sqe_continues(&again), again_cont.is_some());
    assert_eq!(decode_sqe_bytes(&again, again_cont.as_ref()), Ok(wr));
}

fn cqe(entry: &[u8; CQE_BYTES]) {
    let wc = decode_cqe_bytes(entry, 7);
    assert_eq!((wc.qp_num, wc.imm, wc.src_qp), (7, None, 0));
    assert_eq!(decode_cqe_bytes(&encode_cqe_bytes(&wc), 7), wc);
}
