//! The block allocation exchange of [`super::VqpTransport`]: requests to a
//! memory node's allocation port and their answers, asked again when an
//! answer does not come in time or the port is full (see the transport's
//! module docs), either waited for at once ([`Allocations::exchange`]) or
//! sent ahead and collected later ([`Allocations::ask`],
//! [`Allocations::answer`]).
//!
//! A request is a coarse block (nodes without [`super::proto::FEATURE_RUNS`]),
//! a grant of blocks of one size (blocks given back first), or blocks given
//! back ([`Want`]).
//!
//! All answers come back to one endpoint, in any order: each is matched to
//! its request by id. An answer to a request sent ahead that arrives while
//! another exchange waits is kept for it; any other stray answer (to a
//! request given up on) is dropped, its block leaked, never handed out
//! twice.

use super::endpoints::{AllocEndpoints, Need};
use super::proto::{
    AllocReply, AllocRequest, RunsKind, RunsReply, RunsRequest, ALLOC_REPLY_LEN, MAX_RUNS,
    RUNS_COLLECTING, RUNS_OUT_OF_MEMORY, RUNS_REFUSED, RUNS_REQUEST_HEADER,
};
use crate::holders::GrantLease;
use crate::layout::slot::RemotePtr;
use crate::remote::{AllocAsk, BlockRun, Cause, LeaseBook, TransportError};
use krcore::messaging::Endpoint;
use krcore_nic::{Gid, Nic};
use std::sync::Arc;
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
/// The longest one waiting look for an answer waits before the waiter looks
/// at its deadline again.
const WAIT_SLICE: Duration = Duration::from_millis(10);

/// The shortest time between two looks without waiting for an answer to a
/// request sent ahead: its answer takes a memory node's round trip and
/// serving (100 us and more), and a look costs a client attached to the
/// node daemon a control call (two while the request waits for its
/// channel: the send, the pop).
const LOOK_EVERY: Duration = Duration::from_micros(500);
/// Requests sent ahead and not collected, at most (more are refused: the
/// caller then allocates when it needs to).
const MAX_ASKED: usize = 64;

/// Requests sent ahead to one memory node's port whose answers this
/// endpoint has not taken yet, at most; the rest wait, unsent. The node
/// answers into this endpoint's reply window (`msg.reply_window`, 4 by
/// default) and waits while it is full; a push that waits for a credit (a
/// request needed now) takes no answers meanwhile, and its credit comes
/// back only once the node took the requests before it. With blocks of
/// several size classes asked ahead and given back, requests out past the
/// window held the node and the push up until the reply timed out, and
/// the node's other clients with them: the window must keep room for the
/// answer of the request pushed now.
const MAX_OUT_PER_PORT: usize = 2;

/// How a client names itself to a node that keeps leases: its holder id,
/// and whether it drops what it holds of the node when the node's
/// collection count changes ([`RunsRequest::aware`]: to nodes that
/// collect).
#[derive(Clone, Copy, Debug)]
pub(super) struct Holder {
    pub(super) id: u64,
    pub(super) aware: bool,
}

/// What a request asks of a memory node's allocator.
#[derive(Clone, Debug)]
pub(super) enum Want {
    /// A coarse block of `size` bytes (the exchange every node knows).
    Coarse {
        /// Bytes.
        size: u64,
    },
    /// About `size` bytes of blocks of `block_bytes`.
    Grant {
        /// Bytes.
        size: u64,
        /// Bytes of one block.
        block_bytes: u64,
        /// The client, for a node that keeps leases.
        holder: Option<Holder>,
    },
    /// Blocks given back.
    GiveBack {
        /// Bytes of one block.
        block_bytes: u64,
        /// Runs `(offset, len)`.
        runs: Vec<(u64, u64)>,
        /// Microseconds before the node may hand them out.
        delay_us: u64,
        /// As for a grant.
        holder: Option<Holder>,
    },
    /// The client's lease renewed.
    Renew {
        /// The client.
        holder: Holder,
    },
    /// The client's lease ended (it closed).
    End {
        /// The client.
        holder: Holder,
    },
    /// A step of a collection ([`RunsKind::CollectBegin`] and the two
    /// after it), whose answer is taken as it comes
    /// ([`Allocations::exchange_reply`]).
    Collect(RunsKind),
}

impl Want {
    fn encode(&self, req_id: u64) -> Vec<u8> {
        match self {
            Want::Coarse { size } => AllocRequest {
                req_id,
                size: *size,
            }
            .encode()
            .to_vec(),
            Want::Grant {
                size,
                block_bytes,
                holder,
            } => RunsRequest {
                req_id,
                block_bytes: *block_bytes,
                kind: RunsKind::Grant { size: *size },
                holder: holder.map(|h| h.id),
                aware: holder.is_some_and(|h| h.aware),
            }
            .encode(),
            Want::GiveBack {
                block_bytes,
                runs,
                delay_us,
                holder,
            } => RunsRequest {
                req_id,
                block_bytes: *block_bytes,
                kind: RunsKind::GiveBack {
                    runs: runs.clone(),
                    delay_us: *delay_us,
                },
                holder: holder.map(|h| h.id),
                aware: holder.is_some_and(|h| h.aware),
            }
            .encode(),
            Want::Renew { holder } => RunsRequest {
                req_id,
                block_bytes: 0,
                kind: RunsKind::Renew,
                holder: Some(holder.id),
                aware: holder.aware,
            }
            .encode(),
            Want::End { holder } => RunsRequest {
                req_id,
                block_bytes: 0,
                kind: RunsKind::End,
                holder: Some(holder.id),
                aware: holder.aware,
            }
            .encode(),
            Want::Collect(kind) => RunsRequest {
                req_id,
                block_bytes: 0,
                kind: kind.clone(),
                holder: None,
                aware: false,
            }
            .encode(),
        }
    }

    fn size(&self) -> u64 {
        match self {
            Want::Coarse { size } | Want::Grant { size, .. } => *size,
            Want::GiveBack { runs, .. } => runs.iter().map(|r| r.1).sum(),
            Want::Renew { .. } | Want::End { .. } | Want::Collect(_) => 0,
        }
    }

    /// The runs an answer names, checked against the request, and the
    /// lease it carried.
    #[allow(clippy::type_complexity)]
    fn settle(
        &self,
        node: u8,
        answer: Answer,
    ) -> Result<(Vec<BlockRun>, Option<GrantLease>), TransportError> {
        let size = self.size();
        let lease = match &answer {
            Answer::Runs(r) => r.lease,
            Answer::Coarse(_) => None,
        };
        let runs = match (self, answer) {
            (Want::Coarse { .. }, Answer::Coarse(Some(offset))) => vec![(offset, size)],
            (Want::Coarse { .. }, Answer::Coarse(None)) => {
                return Err(TransportError::OutOfMemory { node, size })
            }
            (
                Want::Grant { .. } | Want::GiveBack { .. } | Want::Renew { .. } | Want::End { .. },
                Answer::Runs(r),
            ) if r.status == 0 => r.runs,
            (Want::Grant { .. }, Answer::Runs(r)) if r.status == RUNS_OUT_OF_MEMORY => {
                return Err(TransportError::OutOfMemory { node, size })
            }
            (_, Answer::Runs(r)) if r.status == RUNS_COLLECTING => {
                return Err(TransportError::Collecting { node })
            }
            (Want::Grant { .. } | Want::Renew { .. }, Answer::Runs(r))
                if r.status == RUNS_REFUSED =>
            {
                return Err(TransportError::Refused {
                    node,
                    source: Cause::msg(
                        "the memory node refused the request (a client of an older version \
                         after a collection?)",
                    ),
                })
            }
            (Want::GiveBack { .. }, Answer::Runs(_)) => {
                return Err(TransportError::Refused {
                    node,
                    source: Cause::msg("the memory node refused the blocks given back"),
                })
            }
            _ => {
                return Err(TransportError::BadResponse {
                    reason: "allocation answer of another kind than its request",
                })
            }
        };
        let granted: u64 = runs.iter().map(|r| r.1).sum();
        let fits = match self {
            Want::Grant { block_bytes, .. } => {
                !runs.is_empty()
                    && granted <= size
                    && runs.iter().all(|r| r.1 > 0 && r.1 % block_bytes == 0)
            }
            Want::GiveBack { .. } | Want::Renew { .. } | Want::End { .. } => runs.is_empty(),
            Want::Coarse { .. } | Want::Collect(_) => true,
        };
        if !fits {
            return Err(TransportError::BadResponse {
                reason: "granted runs do not fit the request",
            });
        }
        let runs = runs
            .into_iter()
            .map(|(offset, len)| {
                RemotePtr::new(node, offset)
                    .map(|start| BlockRun { start, len })
                    .map_err(|_| TransportError::BadResponse {
                        reason: "allocated offset out of range",
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((runs, lease))
    }
}

/// An answer, decoded.
#[derive(Clone, Debug)]
enum Answer {
    Coarse(Option<u64>),
    Runs(RunsReply),
}

/// A request sent ahead ([`Allocations::ask`]).
#[derive(Debug)]
struct Asked {
    req_id: u64,
    node: u8,
    gid: Gid,
    port: u16,
    want: Want,
    /// When it was sent (its answer's timeout runs from there).
    at: Instant,
    /// The request, while its channel's Open is out: pushed once the
    /// port's node answered the Open.
    unsent: Option<Vec<u8>>,
    /// Why it could not be sent: the answer to it.
    failed: Option<TransportError>,
}

/// The allocation side of one transport: the messaging endpoint lent to it
/// while a request of it is out (from the node's [`AllocEndpoints`], made
/// on first use: a client that only reads creates no QP; see that type for
/// the invariants), and its requests.
pub(super) struct Allocations<N: Nic> {
    pool: Arc<AllocEndpoints<N>>,
    /// Held while a request is out (or an exchange runs); `asked` not
    /// empty implies `Some`.
    ep: Option<Endpoint<N>>,
    /// Whether an endpoint was ever lent to it.
    borrowed: bool,
    /// A request of it was given up on (its answer may still come): the
    /// endpoint is dropped, not given back ([`AllocEndpoints`]).
    gave_up: bool,
    /// The longest message of the node's endpoints, once known.
    max_message: Option<usize>,
    /// The client's leases on the nodes' grants, learned from answers.
    pub(super) leases: LeaseBook,
    asked: Vec<Asked>,
    /// When a look without waiting last went to the wire
    /// ([`Allocations::answer`]).
    looked: Option<Instant>,
    /// Answers that came for requests in `asked`.
    answers: Vec<(u64, Answer)>,
    /// Nodes a message sent without waiting for its answer failed to reach
    /// ([`Allocations::send_only`]).
    stalled: Vec<u8>,
}

impl<N: Nic> Allocations<N> {
    pub(super) fn new(pool: Arc<AllocEndpoints<N>>) -> Self {
        Allocations {
            pool,
            ep: None,
            borrowed: false,
            gave_up: false,
            max_message: None,
            leases: LeaseBook::new(),
            asked: Vec::new(),
            looked: None,
            answers: Vec::new(),
            stalled: Vec::new(),
        }
    }

    /// Whether an endpoint was ever lent to it (the one QP a client may
    /// make, at its first allocation).
    pub(super) fn has_endpoint(&self) -> bool {
        self.borrowed
    }

    /// The endpoint held, or one lent now for a request to node `to`.
    fn endpoint(&mut self, to: u8, need: Need) -> Result<&Endpoint<N>, TransportError> {
        if self.ep.is_none() {
            let ep = self.pool.lend(to, need)?;
            self.max_message = Some(ep.max_message());
            self.ep = Some(ep);
            self.borrowed = true;
        }
        self.ep.as_ref().ok_or(TransportError::BadResponse {
            reason: "no allocation endpoint",
        })
    }

    /// Gives the endpoint back to the node's set once no request of this
    /// client is out (drops it when one was given up on).
    fn release_idle(&mut self) {
        if self.asked.is_empty() {
            self.hand_back();
        }
    }

    /// Gives the endpoint held back to the node's set, or drops it when a
    /// request of this client is out or was given up on (see
    /// [`AllocEndpoints`]).
    fn hand_back(&mut self) {
        let given_up = std::mem::take(&mut self.gave_up);
        match self.ep.take() {
            Some(ep) if self.asked.is_empty() && !given_up => self.pool.give_back(ep),
            Some(ep) => self.pool.discard(ep),
            None => {}
        }
    }

    /// Most runs one give-back to memory node `to` may carry: what fits
    /// the allocation endpoint's longest message (64 KiB through the node
    /// daemon, about 4,000 runs), at most `MAX_RUNS`.
    pub(super) fn max_runs(&mut self, to: u8) -> Result<usize, TransportError> {
        let max = match self.max_message {
            Some(max) => max,
            None => {
                let max = self.endpoint(to, Need::Now(ALLOC_BUSY_WAIT))?.max_message();
                self.release_idle();
                max
            }
        };
        // The request's header and its optional holder word first.
        Ok((max.saturating_sub(RUNS_REQUEST_HEADER + 8) / 16).clamp(1, MAX_RUNS))
    }

    fn next_request(&mut self, want: &Want) -> (u64, Vec<u8>) {
        let req_id = self.pool.next_request_id();
        (req_id, want.encode(req_id))
    }

    /// One request to node `to` (its port `port` at `gid`) and its answer.
    pub(super) fn exchange(
        &mut self,
        to: u8,
        port: (Gid, u16),
        want: &Want,
    ) -> Result<Vec<BlockRun>, TransportError> {
        let (answer, sent) = self.exchange_answer(to, port, want)?;
        self.accept(to, want, sent, answer)
    }

    /// One request of a collection to node `to` and its answer, as it
    /// came (a runs reply).
    pub(super) fn exchange_reply(
        &mut self,
        to: u8,
        port: (Gid, u16),
        want: &Want,
    ) -> Result<RunsReply, TransportError> {
        match self.exchange_answer(to, port, want)?.0 {
            Answer::Runs(r) => Ok(r),
            Answer::Coarse(_) => Err(TransportError::BadResponse {
                reason: "allocation answer of another kind than its request",
            }),
        }
    }

    /// One request and its answer, with the time it was sent.
    fn exchange_answer(
        &mut self,
        to: u8,
        (gid, port): (Gid, u16),
        want: &Want,
    ) -> Result<(Answer, Instant), TransportError> {
        let (req_id, req) = self.next_request(want);
        self.endpoint(to, Need::Now(ALLOC_BUSY_WAIT))?;
        // Requests asked ahead whose channels opened go first: their
        // answers then come while this one is waited for.
        self.send_opened();
        let r = self.exchange_inner(to, gid, port, req_id, &req);
        self.gave_up |= matches!(r, Err(TransportError::Timeout { .. }));
        self.close_unless_asked(gid, port);
        self.release_idle();
        r
    }

    /// Sends `want` to node `to` once, without waiting for its answer (a
    /// client dropped without closing gives its blocks back and ends its
    /// leases so). The node answers every message and takes the next only
    /// while its answers have room here, so a message that finds no
    /// credit pops the answers that came (nobody waits for them) and tries
    /// again, for at most [`CLOSE_WAIT`]; a node that gave no room in time,
    /// or refused or lost a message, gets no more of them (`stalled`), so
    /// a drop waits at most that long per node (and, for a channel not
    /// open yet, once for its Open). Until 2026-12-08 a message went only if it could go at
    /// once: the give-backs before it took the channel's credits, and a
    /// dropped client's lease end went out in none of 10 drops in a row
    /// (its node held the grants a whole lease), some of its give-backs
    /// in none either.
    pub(super) fn send_only(
        &mut self,
        to: u8,
        (gid, port): (Gid, u16),
        want: &Want,
    ) -> Result<(), TransportError> {
        if self.stalled.contains(&to) {
            return Err(TransportError::Refused {
                node: to,
                source: Cause::msg("an earlier message to the node failed"),
            });
        }
        let (_, req) = self.next_request(want);
        let until = Instant::now() + CLOSE_WAIT;
        let r = loop {
            let ep = self.endpoint(to, Need::Now(CLOSE_WAIT))?;
            match ep.try_push(gid, port, &req) {
                Err(krcore::MsgError::WouldBlock) if Instant::now() < until => {}
                r => break r,
            }
            // The node answers every message, and takes the next ones
            // only while its answers have room here: they are popped (and
            // dropped: nobody waits for them).
            while let Ok(Some(_)) = self.next_answer(to) {}
            std::thread::yield_now();
        };
        if r.is_err() {
            // No room in time, or the channel could not open (its Open is
            // waited for up to the messaging timeout once, not per message).
            self.stalled.push(to);
        }
        self.release_idle();
        r.map_err(|e| lost(to, e))
    }

    fn exchange_inner(
        &mut self,
        node: u8,
        gid: Gid,
        port: u16,
        req_id: u64,
        req: &[u8],
    ) -> Result<(Answer, Instant), TransportError> {
        // Messaging delivers a pushed request once or reports it lost; an
        // answer that does not come in time (a memory node stalled, or its
        // reply lost) is asked again with the same request id: a block
        // handed out twice is leaked, never shared (the client takes the
        // first answer to its id and skips the others).
        let sent = Instant::now();
        for _ in 0..ALLOC_ATTEMPTS {
            let ep = self.ep.as_ref().ok_or(TransportError::BadResponse {
                reason: "no allocation endpoint",
            })?;
            // A closed channel's Open carries the request (one round trip
            // for both); otherwise a push, waiting for what it must.
            let went = match ep.push_ahead(gid, port, req) {
                Ok(went) => went,
                Err(e) if no_room_yet(&e) => false,
                Err(e) => return Err(lost(node, e)),
            };
            if !went {
                push_when_admitted(ep, gid, port, req).map_err(|e| lost(node, e))?;
            }
            let deadline = Instant::now() + ALLOC_TIMEOUT;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match self.next_answer_within(node, Some(left.min(WAIT_SLICE)))? {
                    Some((id, answer)) if id == req_id => return Ok((answer, sent)),
                    Some(_) | None => continue,
                }
            }
        }
        Err(TransportError::Timeout {
            node,
            after: ALLOC_TIMEOUT * ALLOC_ATTEMPTS,
        })
    }

    /// The next answer on the endpoint, if one came: an answer to a
    /// request sent ahead is kept for it (and `Some` returned so that the
    /// caller looks again); a stray one is dropped likewise.
    fn next_answer(&mut self, node: u8) -> Result<Option<(u64, Answer)>, TransportError> {
        self.next_answer_within(node, None)
    }

    /// [`Allocations::next_answer`], waiting up to `wait` for one to come
    /// (`None`: not at all). A wait is one pop that waits: through the
    /// node daemon one control call, which the daemon answers when the
    /// reply comes, where looking again and again was a call per look.
    fn next_answer_within(
        &mut self,
        node: u8,
        wait: Option<Duration>,
    ) -> Result<Option<(u64, Answer)>, TransportError> {
        let Some(ep) = self.ep.as_ref() else {
            return Ok(None);
        };
        let popped = match wait {
            None => ep.try_pop_reply(),
            Some(d) => match ep.pop_reply_timeout(d) {
                Ok(m) => Ok(Some(m)),
                Err(krcore::MsgError::Timeout(_)) => Ok(None),
                Err(e) => Err(e),
            },
        };
        let Some(m) = popped.map_err(|e| lost(node, e))? else {
            return Ok(None);
        };
        let p = m.to_vec();
        let decoded = if RunsReply::is_one(&p) {
            RunsReply::decode(&p).map(|r| (r.req_id, Answer::Runs(r)))
        } else {
            p.get(..ALLOC_REPLY_LEN)
                .map_or(
                    Err(TransportError::BadResponse {
                        reason: "allocation reply: wrong length",
                    }),
                    AllocReply::decode,
                )
                .map(|r| (r.req_id, Answer::Coarse(r.offset)))
        };
        // Malformed: nobody's answer.
        let Ok((req_id, answer)) = decoded else {
            return Ok(Some((0, Answer::Coarse(None))));
        };
        if self.asked.iter().any(|a| a.req_id == req_id)
            && !self.answers.iter().any(|(id, _)| *id == req_id)
        {
            self.answers.push((req_id, answer.clone()));
        }
        Ok(Some((req_id, answer)))
    }

    /// Sends a request to node `to` without waiting for its answer, nor
    /// for the Open of its channel: when the channel is closed, its Open
    /// goes out now carrying the request (`Endpoint::push_ahead`: one
    /// round trip for both); when the Open is out already (another
    /// request's), the request goes once the port's node answered it
    /// ([`Allocations::answer`] looks, and sends it). The Open is answered
    /// by the memory node's threads, which may be asleep after an idle
    /// spell: waiting for it here made the write that asked wait up to
    /// that sleep (about 170 waits of 0.5 ms on average in a YCSB-A run of
    /// 600,000 operations, the p99.9 of its batched updates).
    pub(super) fn ask(
        &mut self,
        to: u8,
        (gid, port): (Gid, u16),
        want: Want,
    ) -> Result<AllocAsk, TransportError> {
        if self.asked.len() >= MAX_ASKED {
            return Err(TransportError::BadResponse {
                reason: "too many blocks asked ahead and not collected",
            });
        }
        let r = self.ask_inner(to, (gid, port), want);
        self.release_idle();
        r
    }

    fn ask_inner(
        &mut self,
        to: u8,
        (gid, port): (Gid, u16),
        want: Want,
    ) -> Result<AllocAsk, TransportError> {
        let (req_id, req) = self.next_request(&want);
        let room = self.out_at(gid, port) < MAX_OUT_PER_PORT;
        // Lent for a request sent ahead only while more than the set's
        // reserve is free: a client that cannot ask ahead allocates when
        // it needs to.
        let ep = self.endpoint(to, Need::Ahead)?;
        // On a closed channel the Open carries the request: one call to a
        // node daemon, one round trip to the memory node. A full port
        // (`Busy`) is asked again by the later looks, and so is a request
        // past `MAX_OUT_PER_PORT`.
        let went = match room.then(|| ep.push_ahead(gid, port, &req)) {
            None => false,
            Some(Ok(went)) => went,
            Some(Err(e)) if no_room_yet(&e) => false,
            Some(Err(e)) => return Err(lost(to, e)),
        };
        let unsent = (!went).then_some(req);
        self.asked.push(Asked {
            req_id,
            node: to,
            gid,
            port,
            want,
            at: Instant::now(),
            unsent,
            failed: None,
        });
        Ok(AllocAsk(req_id))
    }

    /// Sends the requests asked ahead that can go now (their channels
    /// opened, or closed and opened by an Open that carries them); a
    /// refused Open fails its request, but a full port's (`Busy`) only
    /// after [`ALLOC_BUSY_WAIT`].
    fn send_opened(&mut self) {
        let Some(ep) = self.ep.as_ref() else {
            return;
        };
        for i in 0..self.asked.len() {
            let Some(a) = self.asked.get(i).filter(|a| a.unsent.is_some()) else {
                continue;
            };
            if self.out_at(a.gid, a.port) >= MAX_OUT_PER_PORT {
                continue;
            }
            let Some(a) = self.asked.get_mut(i) else {
                continue;
            };
            let Some(req) = &a.unsent else {
                continue;
            };
            let sent = match ep.push_ahead(a.gid, a.port, req) {
                Ok(false) => continue,
                Err(e) if no_room_yet(&e) && a.at.elapsed() < ALLOC_BUSY_WAIT => continue,
                Ok(true) => Ok(()),
                Err(e) => Err(e),
            };
            a.unsent = None;
            a.at = Instant::now();
            if let Err(e) = sent {
                a.failed = Some(lost(a.node, e));
            }
        }
    }

    /// The answer to `ask`, if it came (`wait`: waiting for it until
    /// `ALLOC_TIMEOUT` after it was sent).
    pub(super) fn answer(
        &mut self,
        ask: AllocAsk,
        wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        let r = self.answer_inner(ask, wait);
        self.release_idle();
        r
    }

    fn answer_inner(
        &mut self,
        ask: AllocAsk,
        wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        let Some(i) = self.asked.iter().position(|a| a.req_id == ask.0) else {
            return Err(TransportError::BadResponse {
                reason: "no block asked ahead with this id",
            });
        };
        if !wait {
            // A look without waiting goes to the wire (on a node attached
            // to the daemon: a control call for the answer, one more for a
            // request not sent yet) at most every LOOK_EVERY, unless what
            // it looks for is here already; an answer takes longer than
            // that to come.
            let here = self.answers.iter().any(|(id, _)| *id == ask.0)
                || self.asked.get(i).is_some_and(|a| a.failed.is_some());
            if !here && self.looked.is_some_and(|at| at.elapsed() < LOOK_EVERY) {
                return Ok(None);
            }
            self.looked = Some(Instant::now());
        }
        self.send_opened();
        let Some(a) = self.asked.get_mut(i) else {
            return Ok(None);
        };
        if let Some(e) = a.failed.take() {
            self.forget(ask.0);
            return Err(e);
        }
        if let Some(req) = a.unsent.take() {
            if !wait {
                a.unsent = Some(req);
                return Ok(None);
            }
            // Needed now: sent as a plain exchange is, waiting for the
            // channel's Open.
            let (to, gid, port) = (a.node, a.gid, a.port);
            a.at = Instant::now();
            let ep = self.ep.as_ref().ok_or(TransportError::BadResponse {
                reason: "no allocation endpoint",
            })?;
            if let Err(e) = push_when_admitted(ep, gid, port, &req) {
                self.forget(ask.0);
                return Err(lost(to, e));
            }
        }
        let (node, want, at) = match self.asked.get(i) {
            Some(a) => (a.node, a.want.clone(), a.at),
            None => return Ok(None),
        };
        loop {
            if let Some(k) = self.answers.iter().position(|(id, _)| *id == ask.0) {
                let (_, answer) = self.answers.swap_remove(k);
                self.done_with(ask.0);
                return self.accept(node, &want, at, answer).map(Some);
            }
            let left = ALLOC_TIMEOUT.saturating_sub(at.elapsed());
            if wait && left.is_zero() {
                // What came while nobody looked is taken first: an answer
                // that arrived long ago is not a timeout (a client that
                // asked ahead and then stood idle past ALLOC_TIMEOUT, a
                // phase's end, failed its close so).
                match self.next_answer_within(node, None) {
                    Ok(Some(_)) => continue,
                    Ok(None) => {}
                    Err(e) => {
                        self.forget(ask.0);
                        return Err(e);
                    }
                }
                // Given up on: a late answer is dropped (its block leaked).
                self.forget(ask.0);
                self.gave_up = true;
                return Err(TransportError::Timeout {
                    node,
                    after: ALLOC_TIMEOUT,
                });
            }
            match self.next_answer_within(node, wait.then_some(left.min(WAIT_SLICE))) {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => {
                    self.forget(ask.0);
                    return Err(e);
                }
            }
            if !wait {
                return Ok(None);
            }
        }
    }

    /// The runs of `answer` to `want`, sent at `sent`, whose lease is
    /// learned: a grant under a lease the node has since ended is refused
    /// ([`TransportError::LeaseEnded`]; its memory may have been taken
    /// back), other answers only update the lease.
    fn accept(
        &mut self,
        node: u8,
        want: &Want,
        sent: Instant,
        answer: Answer,
    ) -> Result<Vec<BlockRun>, TransportError> {
        let (runs, lease) = want.settle(node, answer)?;
        if let Some(lease) = lease {
            let learned = self.leases.learn(node, sent, lease);
            if matches!(want, Want::Grant { .. }) {
                learned?;
            }
        }
        Ok(runs)
    }

    /// Requests sent ahead to `(gid, port)` whose answers this endpoint
    /// has not taken yet (see [`MAX_OUT_PER_PORT`]).
    fn out_at(&self, gid: Gid, port: u16) -> usize {
        self.asked
            .iter()
            .filter(|a| a.gid == gid && a.port == port && a.unsent.is_none())
            .filter(|a| a.failed.is_none() && !self.answers.iter().any(|(id, _)| *id == a.req_id))
            .count()
    }

    /// Closes the channel to `(gid, port)` unless a request sent ahead
    /// there is still out (its answer closes it).
    fn close_unless_asked(&self, gid: Gid, port: u16) {
        if self.asked.iter().any(|a| a.gid == gid && a.port == port) {
            return;
        }
        if let Some(ep) = &self.ep {
            close(ep, gid, port);
        }
    }

    /// Forgets request `req_id` and closes its channel unless another
    /// request there is still out.
    fn done_with(&mut self, req_id: u64) {
        let to = self
            .asked
            .iter()
            .find(|a| a.req_id == req_id)
            .map(|a| (a.gid, a.port));
        self.forget(req_id);
        if let Some((gid, port)) = to {
            self.close_unless_asked(gid, port);
        }
    }

    fn forget(&mut self, req_id: u64) {
        self.asked.retain(|a| a.req_id != req_id);
        self.answers.retain(|(id, _)| *id != req_id);
    }
}

impl<N: Nic> Drop for Allocations<N> {
    /// Requests sent ahead and not collected: their answers are waited
    /// for a little (the blocks are leaked) so that their channels can be
    /// closed and the memory nodes' ports get their slots back at once,
    /// not after an idle reclaim; a channel still busy then is left to it.
    /// The endpoint goes back to the node's set, or, with a request still
    /// out, is dropped (see [`AllocEndpoints`]).
    fn drop(&mut self) {
        self.wait_for_asked();
        self.hand_back();
    }
}

impl<N: Nic> Allocations<N> {
    /// The wait of [`Allocations`]'s drop for the answers of the requests
    /// sent ahead.
    fn wait_for_asked(&mut self) {
        if self.asked.is_empty() {
            return;
        }
        let until = Instant::now() + CLOSE_WAIT;
        while !self.asked.is_empty() && Instant::now() < until {
            // Requests never sent are dropped; their channels are closed
            // once their Opens are answered.
            let still_opening = |a: &Asked| {
                a.unsent.is_some()
                    && self
                        .ep
                        .as_ref()
                        .is_some_and(|ep| matches!(ep.open_ahead(a.gid, a.port), Ok(false)))
            };
            let unsent: Vec<u64> = self
                .asked
                .iter()
                .filter(|a| (a.unsent.is_some() || a.failed.is_some()) && !still_opening(a))
                .map(|a| a.req_id)
                .collect();
            for id in unsent {
                self.done_with(id);
            }
            if self.asked.is_empty() {
                break;
            }
            match self.next_answer(0) {
                Ok(Some(_)) => {
                    let answered: Vec<u64> = self.answers.iter().map(|(id, _)| *id).collect();
                    for id in answered {
                        self.done_with(id);
                    }
                }
                Ok(None) => std::thread::yield_now(),
                Err(_) => break,
            }
        }
    }
}

fn lost(node: u8, e: krcore::MsgError) -> TransportError {
    match e {
        // The node is gone: its messages fail on the wire.
        krcore::MsgError::Lost { .. } => TransportError::NodeDown { node },
        other => TransportError::Refused {
            node,
            source: Cause::new(other),
        },
    }
}

/// Done with a request: the memory node's port gets the channel's slot
/// back. The request's credit was sent back before the answer (same path,
/// in order), so the channel is idle now unless another request to the
/// node is out; a late credit is waited for a little, then the slot is
/// left to the port's reclaim.
fn close<N: Nic>(ep: &Endpoint<N>, gid: Gid, port: u16) {
    let until = Instant::now() + CLOSE_WAIT;
    while let Ok(false) = ep.close_channel(gid, port) {
        if ep.credits(gid, port).is_none() || Instant::now() >= until {
            break;
        }
        std::thread::yield_now();
    }
}

/// Whether `e` says there is no room for the request's channel yet: a
/// full port's refusal (its slots taken, or one reclaimed from this
/// endpoint while idle), or this node's receive budget taken by the reply
/// windows of its other channels (the other clients of a process that
/// share its node: their channels close as their answers come). The
/// request is asked again. Until 2026-12-07 a full budget failed the
/// write: a deployed `krcore-ycsb` of 100 threads on one node failed 46%
/// of its inserts ("4 receive slots wanted, 0 left unreserved").
fn no_room_yet(e: &krcore::MsgError) -> bool {
    use krcore::messaging::RefuseCode;
    matches!(
        e,
        krcore::MsgError::Refused {
            code: RefuseCode::Busy | RefuseCode::Reclaimed,
            ..
        } | krcore::MsgError::NoBuffers { .. }
    )
}

/// Pushes `req`, asking again (pauses of 1 ms doubling to 100 ms) while
/// there is no room for its channel ([`no_room_yet`]: the port refuses it
/// `Busy`, or this node's receive budget is taken), for at most
/// [`ALLOC_BUSY_WAIT`]: a full port
/// reclaims the slot of a client that left without closing once it has
/// been idle for `msg.control_idle`.
fn push_when_admitted<N: Nic>(
    ep: &Endpoint<N>,
    gid: Gid,
    port: u16,
    req: &[u8],
) -> Result<(), krcore::MsgError> {
    let deadline = Instant::now() + ALLOC_BUSY_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        match ep.push(gid, port, req) {
            Err(e) if no_room_yet(&e) && Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}
