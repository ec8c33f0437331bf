//! The control messages between an attached process and the daemon, over
//! the daemon's unix stream socket: each is a frame (`u32` little-endian
//! body length, then the body: a tag byte and the message's fields,
//! little-endian). The process sends [`Request`]s and reads one [`Reply`]
//! each; replies that hand over shared memory carry its descriptors as
//! `SCM_RIGHTS` on the frame's first byte. Decoding is checked: a short,
//! long or unknown frame is a [`WireError`], never a panic. The messages
//! and their fields are `types`; their encoding and decoding
//! (`Request::encode`, `Reply::decode`, ...) and the frame length checks
//! are `codec`.

mod codec;
mod types;

pub use codec::{frame_len, frame_len_within};
pub use types::{
    MsgFailure, NodeStats, RefuseCode, Reply, Request, WireError, WireGrant, MAX_FRAME,
    MAX_MSG_BYTES, MAX_RECV_BYTES, MAX_REPLY_FRAME, PROTOCOL_VERSION,
};

#[cfg(test)]
mod tests;
