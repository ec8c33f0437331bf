//! The block allocation exchange of [`super::VqpTransport`]: one request
//! to a memory node's allocation port and its answer, asked again when the
//! answer does not come in time or the port is full (see the transport's
//! module docs).

use super::proto::{AllocReply, ALLOC_REPLY_LEN};
use crate::layout::slot::RemotePtr;
use crate::remote::TransportError;
use krcore::messaging::Endpoint;
use krcore_nic::Nic;
use std::time::{Duration, Instant};

/// How long a block allocation waits for the memory node's answer, and how
/// often it asks.
pub(super) const ALLOC_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const ALLOC_ATTEMPTS: u32 = 3;
/// How long an answered allocation waits for its credit to close its
/// channel.
pub(super) const CLOSE_WAIT: Duration = Duration::from_millis(20);
/// How long an allocation asks again while the memory node's port is full
/// (`Busy`): longer than the default `msg.control_idle` (1 s) after which
/// a full port reclaims the slot of a client that left without a Close.
pub const ALLOC_BUSY_WAIT: Duration = Duration::from_secs(3);

/// One allocation request and its answer (see [`crate::remote::Transport::alloc_block`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn alloc_exchange<N: Nic>(
    ep: &Endpoint<N>,
    gid: krcore_nic::Gid,
    port: u16,
    node: u8,
    req_id: u64,
    size: u64,
    req: &[u8],
    lost: impl Fn(krcore::MsgError) -> TransportError,
) -> Result<RemotePtr, TransportError> {
    // Messaging delivers a pushed request once or reports it lost; an
    // answer that does not come in time (a memory node stalled, or its
    // reply lost) is asked again with the same request id: a block
    // handed out twice is leaked, never shared (the client takes the
    // first answer to its id and skips the others).
    for _ in 0..ALLOC_ATTEMPTS {
        push_when_admitted(ep, gid, port, req).map_err(&lost)?;
        let deadline = Instant::now() + ALLOC_TIMEOUT;
        while Instant::now() < deadline {
            let Some(m) = ep.try_pop_reply().map_err(&lost)? else {
                std::thread::yield_now();
                continue;
            };
            let p = m.to_vec();
            if p.len() < ALLOC_REPLY_LEN {
                continue;
            }
            let Ok(reply) = AllocReply::decode(&p) else {
                continue;
            };
            if reply.req_id != req_id {
                continue; // the late answer to an abandoned request
            }
            return match reply.offset {
                Some(off) => RemotePtr::new(node, off).map_err(|_| TransportError::BadResponse {
                    reason: "allocated offset out of range",
                }),
                None => Err(TransportError::OutOfMemory { node, size }),
            };
        }
    }
    Err(TransportError::Timeout {
        node,
        after: ALLOC_TIMEOUT * ALLOC_ATTEMPTS,
    })
}

/// Pushes `req`, asking again (pauses of 1 ms doubling to 100 ms) while the
/// port refuses it `Busy`, for at most [`ALLOC_BUSY_WAIT`]: a full port
/// reclaims the slot of a client that left without closing once it has
/// been idle for `msg.control_idle`.
fn push_when_admitted<N: Nic>(
    ep: &Endpoint<N>,
    gid: krcore_nic::Gid,
    port: u16,
    req: &[u8],
) -> Result<(), krcore::MsgError> {
    let deadline = Instant::now() + ALLOC_BUSY_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        match ep.push(gid, port, req) {
            Err(krcore::MsgError::Refused {
                code: krcore::messaging::RefuseCode::Busy | krcore::messaging::RefuseCode::Reclaimed,
                ..
            }) if Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}
