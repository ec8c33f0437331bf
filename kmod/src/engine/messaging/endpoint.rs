//! Endpoints: the send side of messaging (see [`super::node`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::{Gid, MemoryRegion, Nic};
use parking_lot::Mutex;

use super::node::*;
use super::send::*;
use super::state::*;
use super::types::*;
use crate::engine::mrs::OwnedMr;
use crate::engine::vqp::Vqp;

use crate::msg::{
    Carried, CreditReturn, Descriptor, MsgDst, MsgKind, MsgRepr, ReturnBatch, SendWindow, SeqCheck,
};

pub(crate) struct EpTx<N: Nic> {
    pub(crate) vqp: Vqp<N>,
    /// Staging slots for inline messages, used round-robin (see
    /// `MsgNode::staging_ring`).
    pub(crate) ring: OwnedMr<N>,
    pub(crate) posts: u64,
    pub(crate) staging: Staging<N>,
    pub(crate) landing: Arc<Mutex<Vec<OwnedMr<N>>>>,
    /// Releases of pulled reply descriptors whose send failed: (node,
    /// port, token), sent again by the next pop.
    pub(crate) owed_releases: Vec<(Gid, u16, u64)>,
    /// The data messages' tags (lost ones are reported by the next push).
    pub(crate) sent: SentTags,
}

/// A messaging endpoint: one VQP that pushes messages to ports (its id is
/// the immediate of every message) and receives their replies. `Send +
/// Sync`; pushes are serialized per endpoint.
pub struct Endpoint<N: Nic> {
    pub(crate) eng: Arc<dyn MsgHost<N>>,
    pub(crate) node: Arc<MsgNode<N>>,
    pub(crate) shared: Arc<EndpointShared<N>>,
    pub(crate) tx: Mutex<EpTx<N>>,
    pub(crate) id: u32,
    /// Credits its Opens ask for (`msg.window`; `msg.control_window` for
    /// the engine's own control endpoints).
    pub(crate) window: u32,
    /// A push that opens a channel carries its message in the Open (see
    /// [`crate::msg::Carried`]): one round trip for a request/response
    /// exchange. The engine's handshake endpoint only: a push whose Open
    /// times out leaves its message in doubt (delivered at most once,
    /// perhaps later), which its idempotent Requests tolerate.
    pub(crate) carry_first: bool,
}

impl<N: Nic> Endpoint<N> {
    /// An endpoint of the engine's own control exchanges (handshake, meta
    /// registration): its channels ask for `msg.control_window` credits.
    pub(crate) fn control(eng: &Arc<dyn MsgHost<N>>) -> Result<Endpoint<N>, MsgError> {
        let window = MsgNode::get(&**eng)?.cfg.control_window;
        Endpoint::create(eng, window)
    }

    /// A new endpoint of the node of `eng` (a VQP of its own) whose
    /// channels ask for `window` credits (checked by the caller).
    pub(crate) fn create(eng: &Arc<dyn MsgHost<N>>, window: u32) -> Result<Endpoint<N>, MsgError> {
        let node = MsgNode::get(&**eng)?;
        let vqp = messaging_vqp(&**eng)?;
        let id = vqp.id().get();
        let shared = Arc::new(EndpointShared {
            state: Mutex::new(EpState {
                channels: HashMap::new(),
                replies: VecDeque::new(),
                released: Vec::new(),
                credits_owed: false,
            }),
        });
        let ring = node.staging_ring(&**eng)?;
        node.endpoints.write().insert(id, shared.clone());
        Ok(Endpoint {
            eng: eng.clone(),
            node,
            shared,
            tx: Mutex::new(EpTx {
                vqp,
                ring,
                posts: 0,
                staging: Staging::default(),
                landing: Arc::new(Mutex::new(Vec::new())),
                owed_releases: Vec::new(),
                sent: SentTags::new(eng.cfg.vqp_depth),
            }),
            id,
            window,
            carry_first: false,
        })
    }
}

impl<N: Nic> std::fmt::Debug for Endpoint<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("Endpoint")
            .field("vqp", &self.id)
            .field("channels", &st.channels.len())
            .field("replies", &st.replies.len())
            .finish()
    }
}

impl<N: Nic> Drop for Endpoint<N> {
    fn drop(&mut self) {
        self.node.endpoints.write().remove(&self.id);
        self.node.counters.failed.lock().remove(&self.id);
        let st = self.shared.state.lock();
        let reserved: u32 = st.channels.values().map(|c| c.reply_window).sum();
        self.node.unreserve(reserved);
    }
}

/// How a push waits for a credit.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    No,
    For(Duration),
}

impl<N: Nic> Endpoint<N> {
    /// The endpoint's VQP id (the immediate data of its messages; what a
    /// port sees as [`Sender::vqp`]).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Pushes `data` to `port` at node `gid`, waiting up to `msg.timeout`
    /// for a credit (the first push to a port also waits for the channel's
    /// Open round trip).
    ///
    /// # Errors
    /// [`MsgError::TooLarge`]; [`MsgError::Refused`] (`Unbound`: no such
    /// port; `Busy`: its slots are all granted); [`MsgError::NoBuffers`]
    /// (no room here for the channel's replies); [`MsgError::Timeout`] when
    /// the receiver does not pop; engine (`UnknownNode`, ...) and post
    /// errors. Nothing is sent on error.
    pub fn push(&self, gid: Gid, port: u16, data: &[u8]) -> Result<(), MsgError> {
        self.push_with(
            gid,
            port,
            Outgoing::Bytes(data),
            Wait::For(self.node.cfg.timeout),
        )
    }

    /// [`Endpoint::push`] waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`Endpoint::push`].
    pub fn push_timeout(
        &self,
        gid: Gid,
        port: u16,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), MsgError> {
        self.push_with(gid, port, Outgoing::Bytes(data), Wait::For(timeout))
    }

    /// Pushes without waiting for a credit: [`MsgError::WouldBlock`] when
    /// the channel has none (the receiver has not popped enough yet). The
    /// channel's first push still waits for the Open round trip.
    ///
    /// # Errors
    /// [`MsgError::WouldBlock`]; as [`Endpoint::push`].
    pub fn try_push(&self, gid: Gid, port: u16, data: &[u8]) -> Result<(), MsgError> {
        self.push_with(gid, port, Outgoing::Bytes(data), Wait::No)
    }

    /// Pushes `len` bytes at `offset` of `region` as a descriptor (zero
    /// copy: the receiver READs them from `region`). The region must allow
    /// `REMOTE_READ`, and must not be written until the receiver released
    /// it ([`Endpoint::in_flight_regions`] drops to 0).
    ///
    /// # Errors
    /// As [`Endpoint::push`]; [`MsgError::Engine`] for a range outside the
    /// region.
    pub fn push_region(
        &self,
        gid: Gid,
        port: u16,
        region: &OwnedMr<N>,
        offset: usize,
        len: u32,
    ) -> Result<(), MsgError> {
        region
            .sge(offset, len)
            .map_err(MsgError::nic("the pushed region"))?;
        self.push_with(
            gid,
            port,
            Outgoing::Region(region, offset, len),
            Wait::For(self.node.cfg.timeout),
        )
    }

    /// Descriptor buffers not yet released by their receivers.
    pub fn in_flight_regions(&self) -> usize {
        let _ = self.node.progress(&*self.eng);
        let mut tx = self.tx.lock();
        self.collect_released(&mut tx);
        tx.staging.lent.len()
    }

    pub(crate) fn collect_released(&self, tx: &mut EpTx<N>) {
        let released = std::mem::take(&mut self.shared.state.lock().released);
        for t in released {
            tx.staging.release(t);
        }
    }

    pub(crate) fn push_with(
        &self,
        gid: Gid,
        port: u16,
        payload: Outgoing<'_, N>,
        wait: Wait,
    ) -> Result<(), MsgError> {
        let cfg = &self.node.cfg;
        let len = payload.len();
        if len > cfg.max_message {
            return Err(MsgError::TooLarge {
                len,
                max: cfg.max_message,
            });
        }
        let key = (gid, port);
        let start = Instant::now();
        let mut tx = self.tx.lock();
        // Messages accepted earlier and lost since come first, one per push.
        reap(&tx.vqp, &self.node.counters)?;
        self.collect_lost(&mut tx);
        if let Some(lost) = tx.sent.lost.pop_front() {
            return Err(lost);
        }
        // The Open round trip is bounded by the push's wait (a push that
        // does not wait for credits still waits for the Open).
        let limit = match wait {
            Wait::For(t) => t,
            Wait::No => cfg.timeout,
        };
        let first = match payload {
            Outgoing::Bytes(data) if self.carry_first && data.len() <= cfg.inline_max => Some(data),
            _ => None,
        };
        if self.open(&mut tx, key, start, limit, first)? {
            return Ok(());
        }
        // A push that waits for a credit asks the port again after a while
        // (then after twice as long, up to `OPEN_RESEND_MAX`): the Credit
        // that would free it may have been lost on its way.
        // (Started at the first wait: a push with a credit reads no clock.)
        let mut ask: Option<Resend> = None;
        loop {
            self.node.progress(&*self.eng)?;
            let seq = {
                let mut st = self.shared.state.lock();
                let c = st.channels.get_mut(&key);
                // The port went away meanwhile (it reported a message that
                // found no port): typed, and the channel is forgotten.
                if let Some(Status::Refused(code) | Status::Lost(code)) =
                    c.as_ref().map(|c| c.status)
                {
                    drop(st);
                    self.forget(key);
                    return Err(MsgError::Refused { gid, port, code });
                }
                c.and_then(|c| c.fwd.take())
            };
            if let Some(seq) = seq {
                let r = self.send(&mut tx, gid, port, seq, payload);
                if r.is_err() {
                    if let Some(c) = self.shared.state.lock().channels.get_mut(&key) {
                        c.fwd.untake();
                    }
                }
                return r;
            }
            match wait {
                Wait::No => return Err(MsgError::WouldBlock),
                Wait::For(t) if start.elapsed() >= t => {
                    return Err(MsgError::Timeout(start.elapsed()))
                }
                Wait::For(_) => {
                    reap(&tx.vqp, &self.node.counters)?;
                    let ask =
                        ask.get_or_insert_with(|| Resend::new(CREDIT_ASK_FIRST, OPEN_RESEND_MAX));
                    if ask.due() && self.ask_credits(&tx, key).is_ok() {
                        bump(&self.node.counters.credits_asked);
                    }
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Starts opening the channel to (`gid`, `port`) without waiting for
    /// the port's answer: `Ok(true)` once it is open (a push then waits
    /// for no Open round trip, only for a credit if none is back yet),
    /// `Ok(false)` while its Open is out (sent by this call if none was).
    /// For a request sent ahead of need: its sender pushes once this says
    /// open, instead of waiting for the port's node to answer the Open
    /// (its serving threads may be asleep after an idle spell). A push
    /// before that waits for the Open as always, and sends it again if it
    /// was lost.
    ///
    /// # Errors
    /// [`MsgError::Refused`] for a refused Open (`Busy`, `Unbound`, ...:
    /// the channel is forgotten, the next call opens again) and for a
    /// channel the port refused after it was open; [`MsgError::NoBuffers`]
    /// (no room here for the channel's replies); engine and post errors.
    pub fn open_ahead(&self, gid: Gid, port: u16) -> Result<bool, MsgError> {
        self.node.progress(&*self.eng)?;
        let key = (gid, port);
        let mut tx = self.tx.lock();
        let status = self.status(key);
        match status {
            Some(Status::Open) => return Ok(true),
            Some(Status::Opening) => return Ok(false),
            Some(Status::Refused(code) | Status::Lost(code)) => {
                self.forget(key);
                return Err(MsgError::Refused { gid, port, code });
            }
            None => {}
        }
        self.insert_opening(key, None)?;
        if let Err(e) = self.send_open(&mut tx, key, None) {
            self.forget(key);
            return Err(e);
        }
        Ok(false)
    }

    /// Sends `data` to `port` at `gid` without waiting for anything, when
    /// it can go: on an open channel with a credit, as a push; on a
    /// channel not opened yet, carried by its Open (at most `inline_max`
    /// bytes: the port delivers it with its grant, so that a request and
    /// its answer cost one round trip, not an Open's and then the
    /// request's). `Ok(true)`: it went. `Ok(false)`: call again later (the
    /// channel's Open is out, sent again, carrying what it carries, when
    /// it is older than 20 ms; no credit is back; or `data` is too long to
    /// be carried, and the Open went out carrying nothing, as
    /// [`Endpoint::open_ahead`]).
    ///
    /// A carried message is delivered at most once, even when its Open is
    /// sent again, but a refused Open (`Busy`: the port is full) drops it,
    /// and an Open never answered leaves it in doubt (as a push that timed
    /// out): for requests that may be asked again (idempotent, or matched
    /// to their answers by an id), such as a memory node's block
    /// allocations.
    ///
    /// # Errors
    /// [`MsgError::TooLarge`] past `msg.max_message`; [`MsgError::Refused`]
    /// for a refused Open (what it carried was not delivered; the next
    /// call opens again) and for a channel the port refused after it was
    /// open; as [`Endpoint::try_push`] on an open channel (a message lost
    /// earlier, [`MsgError::Lost`], ...); [`MsgError::NoBuffers`], engine
    /// and post errors.
    pub fn push_ahead(&self, gid: Gid, port: u16, data: &[u8]) -> Result<bool, MsgError> {
        let cfg = &self.node.cfg;
        if data.len() > cfg.max_message {
            return Err(MsgError::TooLarge {
                len: data.len(),
                max: cfg.max_message,
            });
        }
        self.node.progress(&*self.eng)?;
        let key = (gid, port);
        let mut tx = self.tx.lock();
        match self.status(key) {
            Some(Status::Open) => {
                drop(tx);
                return match self.push_with(gid, port, Outgoing::Bytes(data), Wait::No) {
                    Ok(()) => Ok(true),
                    Err(MsgError::WouldBlock) => Ok(false),
                    Err(e) => Err(e),
                };
            }
            Some(Status::Opening) => {
                let (due, carried) = {
                    let mut st = self.shared.state.lock();
                    match st.channels.get_mut(&key) {
                        Some(c) if c.open_sent.elapsed() >= OPEN_RESEND_FIRST => {
                            c.open_sent = Instant::now();
                            (true, c.carried.clone())
                        }
                        _ => (false, None),
                    }
                };
                // A failed repeat is not the end: the first may be answered.
                if due && self.send_open(&mut tx, key, carried.as_deref()).is_ok() {
                    bump(&self.node.counters.open_resent);
                }
                return Ok(false);
            }
            Some(Status::Refused(code) | Status::Lost(code)) => {
                self.forget(key);
                return Err(MsgError::Refused { gid, port, code });
            }
            None => {}
        }
        let carried = (data.len() <= cfg.inline_max).then(|| data.to_vec());
        let carries = carried.is_some();
        self.insert_opening(key, carried)?;
        let body = carries.then_some(data);
        if let Err(e) = self.send_open(&mut tx, key, body) {
            self.forget(key);
            return Err(e);
        }
        Ok(carries)
    }

    /// The state of the channel `key`, if there is one.
    fn status(&self, key: (Gid, u16)) -> Option<Status> {
        self.shared
            .state
            .lock()
            .channels
            .get(&key)
            .map(|c| c.status)
    }

    /// Records a new channel `key` as opening, its reply window reserved,
    /// its Open carrying `carried`.
    fn insert_opening(&self, key: (Gid, u16), carried: Option<Vec<u8>>) -> Result<(), MsgError> {
        let cfg = &self.node.cfg;
        self.node.reserve(cfg.reply_window)?;
        self.shared.state.lock().channels.insert(
            key,
            ChannelTx {
                status: Status::Opening,
                fwd: SendWindow::new(0),
                reply_returns: ReturnBatch::new(cfg.reply_window),
                reply_seq: SeqCheck::default(),
                reply_window: cfg.reply_window,
                carried,
                open_sent: Instant::now(),
                early_credit: None,
                resend_total: false,
            },
        );
        Ok(())
    }

    /// Sends channel `key`'s Open (again), carrying `carried`.
    fn send_open(
        &self,
        tx: &mut EpTx<N>,
        key: (Gid, u16),
        carried: Option<&[u8]>,
    ) -> Result<(), MsgError> {
        let header = MsgRepr {
            src: self.eng.nic.gid(),
            dst: MsgDst::Port(key.1),
            kind: self.open_kind(carried.map(|b| Carried {
                len: b.len() as u32,
                only: false,
            })),
        }
        .emit();
        let slot = self.node.ring_slot(&mut tx.posts);
        send_with_body(
            &*self.eng,
            &tx.vqp,
            (&tx.ring, slot),
            key.0,
            self.id,
            (&header, carried.unwrap_or(&[])),
            &self.node,
            0,
        )
    }

    /// Sends the open channel `key`'s Open again (with nothing carried):
    /// the port answers a repeated Open with the same grant and the
    /// cumulative credits it returned, so a push left waiting by a lost
    /// Credit gets its credits (a repeated total changes nothing).
    fn ask_credits(&self, tx: &EpTx<N>, key: (Gid, u16)) -> Result<(), MsgError> {
        self.send_ctl(&tx.vqp, key.0, key.1, self.open_kind(None))
    }

    /// Where answers to an Open come back: this node's DCT (the Open says
    /// where, so that a node registered nowhere gets them too); zeros when
    /// it has none.
    fn answer_dct(&self) -> (u32, u64) {
        match self.eng.msg_rx() {
            Ok((_, _, n, k)) => (n, k),
            Err(_) => (0, 0),
        }
    }

    /// This endpoint's Open, carrying `carries` when given.
    fn open_kind(&self, carries: Option<Carried>) -> MsgKind {
        let (dct_num, dc_key) = self.answer_dct();
        MsgKind::Open {
            window: self.window,
            reply_window: self.node.cfg.reply_window,
            dct_num,
            dc_key,
            carries,
        }
    }

    /// Opens the channel `key` if needed: Open, then wait for its answer.
    /// A fresh channel's Open carries `first` when given; returns whether
    /// it did (then granted: the message was delivered).
    ///
    /// # Errors
    /// [`MsgError::Refused`] for a refused Open, and for a channel the
    /// port refused after it was open (its messages since were lost: the
    /// next push says so once); [`MsgError::Timeout`]; send errors.
    pub(crate) fn open(
        &self,
        tx: &mut EpTx<N>,
        key: (Gid, u16),
        start: Instant,
        limit: Duration,
        first: Option<&[u8]>,
    ) -> Result<bool, MsgError> {
        let status = self.status(key);
        match status {
            Some(Status::Open) => return Ok(false),
            // Pushes since the port refused the open channel were lost:
            // this push reports it (nothing of it is sent).
            Some(Status::Lost(code)) => {
                self.forget(key);
                return Err(MsgError::Refused {
                    gid: key.0,
                    port: key.1,
                    code,
                });
            }
            // A refusal that came after an Open timed out: ask again (the
            // port may be bound, or drained, by now).
            Some(Status::Refused(_)) => self.forget(key),
            Some(Status::Opening) | None => {}
        }
        // An Open still unanswered is sent again: a port answers a repeated
        // Open with the same grant (and delivers a carried message once).
        let carries = status != Some(Status::Opening) && first.is_some();
        if status != Some(Status::Opening) {
            self.insert_opening(key, first.filter(|_| carries).map(<[u8]>::to_vec))?;
        }
        let carried = self
            .shared
            .state
            .lock()
            .channels
            .get(&key)
            .and_then(|c| c.carried.clone());
        if let Err(e) = self.send_open(tx, key, carried.as_deref()) {
            self.forget(key);
            return Err(e);
        }
        // An answer can be lost on its way (it goes out on whichever DCI of
        // the port's node comes next, and a DCI that an earlier send left
        // in ERR flushes it): the Open is sent again, each time after
        // twice as long, while the push may wait. A port answers a
        // repeated Open with the same grant and delivers a carried message
        // once; all of them, and the channel's later messages and Close,
        // leave on this endpoint's one VQP, so they arrive in order.
        let mut resend = Resend::new(OPEN_RESEND_FIRST, OPEN_RESEND_MAX);
        loop {
            self.node.progress(&*self.eng)?;
            match self.status(key) {
                Some(Status::Open) => {
                    return Ok(carries);
                }
                Some(Status::Refused(code) | Status::Lost(code)) => {
                    self.forget(key);
                    return Err(MsgError::Refused {
                        gid: key.0,
                        port: key.1,
                        code,
                    });
                }
                _ => {}
            }
            if start.elapsed() >= limit {
                // Left Opening: a late Grant still opens it.
                return Err(MsgError::Timeout(start.elapsed()));
            }
            reap(&tx.vqp, &self.node.counters)?;
            // A failed repeat is not the end: the first may be answered.
            if resend.due() && self.send_open(tx, key, carried.as_deref()).is_ok() {
                bump(&self.node.counters.open_resent);
            }
            std::thread::yield_now();
        }
    }

    /// Turns the failed SENDs filed for this endpoint's VQP into `Lost`
    /// errors (in posting order), giving each lost message's credit back to
    /// its channel (the receiver never got it, so never returns it).
    pub(crate) fn collect_lost(&self, tx: &mut EpTx<N>) {
        let mut st = self.shared.state.lock();
        tx.sent
            .collect(self.id, &self.node.counters, |gid, dst, seq, status| {
                let port = dst as u16;
                if let Some(c) = st.channels.get_mut(&(gid, port)) {
                    let _ = c.fwd.credit(1);
                }
                MsgError::Lost {
                    gid,
                    port,
                    seq,
                    status,
                }
            });
    }

    pub(crate) fn forget(&self, key: (Gid, u16)) {
        if self.shared.state.lock().channels.remove(&key).is_some() {
            self.node.unreserve(self.node.cfg.reply_window);
        }
    }

    pub(crate) fn send(
        &self,
        tx: &mut EpTx<N>,
        gid: Gid,
        port: u16,
        seq: u64,
        payload: Outgoing<'_, N>,
    ) -> Result<(), MsgError> {
        self.collect_released(tx);
        let dst = MsgDst::Port(port);
        let wr_id = tx.sent.tag(gid, u32::from(port), seq);
        let EpTx {
            vqp,
            ring,
            posts,
            staging,
            ..
        } = tx;
        let slot = self.node.ring_slot(posts);
        match payload {
            Outgoing::Bytes(data) => send_data(
                &*self.eng,
                vqp,
                staging,
                (ring, slot),
                gid,
                dst,
                self.id,
                seq,
                data,
                &self.node,
                wr_id,
            ),
            Outgoing::Region(mr, offset, len) => {
                aim(vqp, gid, self.node.cfg.timeout, &self.node.counters)?;
                let desc = Descriptor {
                    addr: mr.addr() + offset as u64,
                    rkey: mr.rkey(),
                    token: 0,
                };
                let token = staging.lend(mr.clone(), false);
                send_descriptor(
                    vqp,
                    gid,
                    dst,
                    self.id,
                    seq,
                    len,
                    Descriptor { token, ..desc },
                    self.eng.nic.gid(),
                    self.node.cfg.timeout,
                    &self.node.counters,
                    wr_id,
                )
                .inspect_err(|_| staging.release(token))
            }
        }
    }

    /// The longest message this endpoint pushes (`msg.max_message`): a
    /// longer one is refused, [`MsgError::TooLarge`].
    pub fn max_message(&self) -> usize {
        self.node.cfg.max_message
    }

    /// The oldest reply, if any (non-blocking); a descriptor's body is
    /// pulled here. The reply's credit goes back to its port. As with
    /// [`Port::try_pop`](super::Port::try_pop), a popped reply is always
    /// returned: a credit return or Release that cannot be sent stays owed
    /// and is sent again by the next call.
    ///
    /// # Errors
    /// As [`Port::try_pop`](super::Port::try_pop).
    pub fn try_pop_reply(&self) -> Result<Option<Message<N>>, MsgError> {
        self.node.progress(&*self.eng)?;
        let mut tx = self.tx.lock();
        self.settle_owed(&mut tx);
        let Some(mut msg) = take_next(&tx.vqp, &self.node, &self.shared.state, |s| &mut s.replies)?
        else {
            return Ok(None);
        };
        let credit = self
            .shared
            .state
            .lock()
            .channels
            .get_mut(&(msg.from.gid, msg.port))
            .and_then(|c| c.reply_returns.popped());
        let (gid, port) = (msg.from.gid, msg.port);
        let EpTx {
            vqp,
            landing,
            owed_releases,
            ..
        } = &mut *tx;
        let pulled = pull_body(&*self.eng, &self.node, vqp, landing, &mut msg, |token| {
            if self
                .send_ctl(vqp, gid, port, MsgKind::Release { token })
                .is_err()
            {
                owed_releases.push((gid, port, token));
                bump(&self.node.counters.releases_deferred);
            }
        });
        if let Some(cr) = credit {
            let kind = MsgKind::Credit { total: cr.total };
            if self
                .send_ctl(&tx.vqp, msg.from.gid, msg.port, kind)
                .is_err()
            {
                // Delivered regardless: the credits stay owed.
                let mut st = self.shared.state.lock();
                if let Some(c) = st.channels.get_mut(&(msg.from.gid, msg.port)) {
                    c.reply_returns.unflush(cr.count);
                }
                st.credits_owed = true;
                bump(&self.node.counters.credits_deferred);
            }
        }
        pulled?;
        Ok(Some(msg))
    }

    /// Sends a control message to `port` at `gid` from the endpoint's VQP.
    fn send_ctl(&self, vqp: &Vqp<N>, gid: Gid, port: u16, kind: MsgKind) -> Result<(), MsgError> {
        let m = MsgRepr {
            src: self.eng.nic.gid(),
            dst: MsgDst::Port(port),
            kind,
        };
        // Take the VQP's completions first: an earlier control send that
        // failed (its peer unreachable) left the QP in error until its
        // failure is polled, and this one would be flushed behind it.
        // What it did is counted there; a lost Credit is made up by this
        // one's total.
        let _ = reap(vqp, &self.node.counters);
        send_inline(
            vqp,
            gid,
            self.id,
            &m.emit(),
            self.node.cfg.timeout,
            &self.node.counters,
        )
    }

    /// Sends what earlier pops owe (Releases, reply credits); what fails
    /// again stays owed.
    fn settle_owed(&self, tx: &mut EpTx<N>) {
        let EpTx {
            vqp, owed_releases, ..
        } = tx;
        owed_releases.retain(|&(gid, port, token)| {
            let release = MsgKind::Release { token };
            self.send_ctl(vqp, gid, port, release).is_err()
        });
        if !std::mem::take(&mut self.shared.state.lock().credits_owed) {
            return;
        }
        let due: Vec<((Gid, u16), CreditReturn)> = {
            let mut st = self.shared.state.lock();
            st.channels
                .iter_mut()
                .filter_map(|(k, c)| {
                    let again = std::mem::take(&mut c.resend_total);
                    let total = c.reply_returns.total();
                    c.reply_returns
                        .flush()
                        .or_else(|| {
                            (again && total > 0).then_some(CreditReturn { count: 0, total })
                        })
                        .map(|cr| (*k, cr))
                })
                .collect()
        };
        for ((gid, port), cr) in due {
            if self
                .send_ctl(&tx.vqp, gid, port, MsgKind::Credit { total: cr.total })
                .is_err()
            {
                let mut st = self.shared.state.lock();
                if let Some(c) = st.channels.get_mut(&(gid, port)) {
                    c.reply_returns.unflush(cr.count);
                    c.resend_total |= cr.count == 0;
                }
                st.credits_owed = true;
            }
        }
    }

    /// Pops the oldest reply, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`MsgError::Timeout`]; as [`Endpoint::try_pop_reply`].
    pub fn pop_reply_timeout(&self, timeout: Duration) -> Result<Message<N>, MsgError> {
        super::types::wait_for(timeout, || self.try_pop_reply())
    }

    /// Pops the oldest reply, waiting up to `msg.timeout`.
    ///
    /// # Errors
    /// As [`Endpoint::pop_reply_timeout`].
    pub fn pop_reply(&self) -> Result<Message<N>, MsgError> {
        self.pop_reply_timeout(self.node.cfg.timeout)
    }

    /// Closes the channel to (`gid`, `port`) when it is idle: open, every
    /// credit back (all its messages popped at the port) and no reply of
    /// it waiting here. The port then forgets the channel and its window
    /// goes back to the port's slots; this endpoint's reply window goes
    /// back to this node's budget. A later push to the port opens a new
    /// channel (an Open round trip). Returns whether it was closed; a
    /// channel that is not idle is left open (close it again later), and
    /// one never opened, or refused, is simply forgotten (`Ok(false)`).
    ///
    /// Best effort at the port: when the Close cannot be sent (the error
    /// is returned) the channel is still forgotten here, and its window
    /// stays granted at the port until the port is unbound (or, on the
    /// engine's reserved ports, reclaimed when idle: `msg.control_idle`).
    /// A reply the port sends to a closed channel fails there, typed
    /// ([`MsgError::Refused`], `Unbound`).
    ///
    /// # Errors
    /// Engine and post errors of sending the Close.
    pub fn close_channel(&self, gid: Gid, port: u16) -> Result<bool, MsgError> {
        let _ = self.node.progress(&*self.eng);
        let key = (gid, port);
        let tx = self.tx.lock();
        {
            let st = self.shared.state.lock();
            let Some(c) = st.channels.get(&key) else {
                return Ok(false);
            };
            match c.status {
                Status::Open => {}
                // Opening: a late Grant may still come; keep the entry so
                // that it is matched (a repeated Open gets the same grant).
                Status::Opening => return Ok(false),
                Status::Refused(_) => {
                    drop(st);
                    self.forget(key);
                    return Ok(false);
                }
                // Messages pushed since the port refused the open channel
                // were lost: said here (the channel is forgotten).
                Status::Lost(code) => {
                    drop(st);
                    self.forget(key);
                    return Err(MsgError::Refused { gid, port, code });
                }
            }
            let idle = c.fwd.in_use() == 0
                && !st
                    .replies
                    .iter()
                    .any(|m| m.from.gid == gid && m.port == port);
            if !idle {
                return Ok(false);
            }
        }
        // Forgotten first: nothing of this channel is sent after the Close
        // (a push from now on opens a new channel, behind the Close).
        self.forget(key);
        self.send_ctl(&tx.vqp, gid, port, MsgKind::Close)?;
        Ok(true)
    }

    /// Sends `data` to `port` at `gid` as a channel's only message (see
    /// [`crate::msg::Carried::only`]): an Open carrying it, under a sender
    /// id of its own (never a VQP's: it meets no channel of this endpoint
    /// at the port), without waiting for anything. Best effort: the port
    /// delivers it if it has a slot, and forgets the channel once it is
    /// popped (no slot held after); a refused one is counted `orphaned`
    /// there. Bounded: one post (no Open round trip, no credit wait).
    /// For the engine's notices (the handshake's Close).
    ///
    /// # Errors
    /// [`MsgError::TooLarge`] past `msg.inline_max`; engine and post
    /// errors.
    pub(crate) fn send_only(&self, gid: Gid, port: u16, data: &[u8]) -> Result<(), MsgError> {
        let cfg = &self.node.cfg;
        if data.len() > cfg.inline_max {
            return Err(MsgError::TooLarge {
                len: data.len(),
                max: cfg.inline_max,
            });
        }
        let sender = self
            .node
            .next_only
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .max(1 << crate::wrid::VQP_ID_BITS);
        let (dct_num, dc_key) = self.answer_dct();
        let open = MsgRepr {
            src: self.eng.nic.gid(),
            dst: MsgDst::Port(port),
            kind: MsgKind::Open {
                window: 1,
                reply_window: 0,
                dct_num,
                dc_key,
                carries: Some(Carried {
                    len: data.len() as u32,
                    only: true,
                }),
            },
        };
        let mut tx = self.tx.lock();
        let tx = &mut *tx;
        let slot = self.node.ring_slot(&mut tx.posts);
        send_with_body(
            &*self.eng,
            &tx.vqp,
            (&tx.ring, slot),
            gid,
            sender,
            (&open.emit(), data),
            &self.node,
            0,
        )
    }

    /// Credits available now on the channel to (`gid`, `port`) (`None`
    /// before it is open).
    pub fn credits(&self, gid: Gid, port: u16) -> Option<u32> {
        let _ = self.node.progress(&*self.eng);
        let st = self.shared.state.lock();
        st.channels
            .get(&(gid, port))
            .filter(|c| c.status == Status::Open)
            .map(|c| c.fwd.available())
    }
}

/// What a push sends: bytes (copied inline, or into a staging buffer for
/// a descriptor), or a range of the caller's MR (a descriptor of it).
#[derive(Clone, Copy)]
pub(crate) enum Outgoing<'a, N: Nic> {
    Bytes(&'a [u8]),
    Region(&'a OwnedMr<N>, usize, u32),
}

impl<N: Nic> Outgoing<'_, N> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Outgoing::Bytes(b) => b.len(),
            Outgoing::Region(_, _, l) => *l as usize,
        }
    }
}
