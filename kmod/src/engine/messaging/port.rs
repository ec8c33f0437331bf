//! Bound ports: the receive side of messaging (see [`super::node`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::Nic;
use parking_lot::Mutex;

use super::node::*;
use super::send::*;
use super::state::*;
use super::types::*;
use crate::engine::mrs::OwnedMr;
use crate::engine::vqp::Vqp;
use crate::msg::{
    CreditReturn, MsgDst, MsgKind, MsgRepr, RefuseCode, ReturnBatch, SendWindow, SeqCheck,
};

impl<N: Nic> PortShared<N> {
    /// A bound port `port` with `slots` receive slots, none granted.
    pub(crate) fn new(port: u16, reclaims: bool, slots: u32) -> PortShared<N> {
        PortShared {
            port,
            reclaims,
            slots,
            state: Mutex::new(PortState {
                ring: VecDeque::new(),
                channels: HashMap::new(),
                ungranted: slots,
                bound: true,
                released: Vec::new(),
                credits_owed: false,
            }),
        }
    }

    /// Admits `from`'s channel (the answer to its Open). With `reclaim`
    /// (the engine's reserved ports: `msg.control_idle`), a port whose
    /// slots are all granted first takes back the window of the channel
    /// idle longest, if idle that long (no message of it in the ring,
    /// nothing received or popped since): the senders whose channels were
    /// reclaimed are pushed to `reclaimed` (they are told with a Refuse
    /// `Reclaimed`). Credits the port still owes such a channel are
    /// dropped with it: its sender forgets the channel (and the credits
    /// it had out) when told, and a sender that left without a Close (a
    /// process that exited after fewer pops than a credit batch) is owed
    /// credits forever, which must not pin its slots.
    ///
    /// A message the Open `carried` is delivered (seq 0, one credit of the
    /// new window) only when this Open created the channel: a repeated
    /// Open carries it again and must not deliver it twice. Returns the
    /// answer, whether the carried message was delivered, and the credits
    /// returned so far (a repeated Open).
    ///
    /// An Open of an open channel whose `opener` names another DCT is not
    /// a repeat: another process at the sender's GID (a client restarted
    /// on its host, whose endpoints get the same ids) opens a channel of
    /// its own. The old channel ended without a Close (its process died):
    /// it and its messages not popped yet are dropped (`replaced`, counted
    /// by the caller), then the Open is admitted as new. Answered with
    /// the old channel's state instead, the new process's messages would
    /// be taken for repeats and its credits never come back.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admit(
        &self,
        from: Sender,
        opener: Opener,
        (window, reply_window): (u32, u32),
        reclaim: Option<Duration>,
        reclaimed: &mut Vec<Sender>,
        replaced: &mut bool,
        carried: Option<(crate::msg::Carried, Vec<u8>)>,
    ) -> (MsgKind, bool, Option<u64>) {
        let mut st = self.state.lock();
        if !st.bound {
            return (MsgKind::Refuse(RefuseCode::Unbound), false, None);
        }
        match st.channels.get(&from) {
            Some(c) if c.opener.same(opener) => {
                // A repeated Open (the answer was slow, or the sender waits
                // for credits and asks again): the same grant, and the
                // credits returned so far again (their total: one lost on
                // its way is made up, one that came changes nothing).
                let total = Some(c.returns.total()).filter(|t| *t > 0);
                return (MsgKind::Grant { window: c.window }, false, total);
            }
            Some(_) => {
                if let Some(old) = st.channels.remove(&from) {
                    st.ungranted += old.window;
                }
                st.ring.retain(|m| m.from != from);
                *replaced = true;
            }
            None => {}
        }
        if let (0, Some(idle)) = (st.ungranted, reclaim) {
            let st = &mut *st;
            let victim = st
                .channels
                .iter()
                .filter(|(s, c)| c.last.elapsed() >= idle && !st.ring.iter().any(|m| m.from == **s))
                .min_by_key(|(_, c)| c.last)
                .map(|(s, _)| *s);
            if let Some(v) = victim.and_then(|v| st.channels.remove(&v).map(|c| (v, c))) {
                st.ungranted += v.1.window;
                reclaimed.push(v.0);
            }
        }
        let granted = window.min(st.ungranted);
        if granted == 0 {
            return (MsgKind::Refuse(RefuseCode::Busy), false, None);
        }
        st.ungranted -= granted;
        let mut c = ChannelRx {
            window: granted,
            returns: ReturnBatch::new(granted),
            seq: SeqCheck::default(),
            reply: SendWindow::new(reply_window),
            last: Instant::now(),
            only: false,
            opener,
        };
        let delivered = carried.map(|(carried, body)| {
            c.only = carried.only;
            // Seq 0 of a fresh account: always the expected one.
            let _ = c.seq.accept(0);
            st.ring.push_back(Message {
                from,
                port: self.port,
                seq: 0,
                body: Body::Inline(body),
            });
        });
        st.channels.insert(from, c);
        (
            MsgKind::Grant { window: granted },
            delivered.is_some(),
            None,
        )
    }

    /// The sender `from` closed its channel: the port forgets it and its
    /// window goes back to the ungranted slots. Returns whether there was
    /// such a channel.
    ///
    /// Sound because an endpoint sends Close only with every credit of the
    /// channel back (each of its messages was popped here) and after its
    /// last message (same VQP, same target queue: in order), so none of
    /// the channel's messages is in flight or in the ring, and none
    /// follows; messages of the channel still in the ring (a sender that
    /// broke this rule) are delivered, their credits not returned. Replies
    /// and credits the port still owed the channel are dropped with it
    /// (its sender forgot the channel before sending Close).
    pub(crate) fn close(&self, from: Sender) -> bool {
        let mut st = self.state.lock();
        match st.channels.remove(&from) {
            Some(c) => {
                st.ungranted += c.window;
                true
            }
            None => false,
        }
    }

    /// A message of `from`'s channel was popped: the credits to send back
    /// now, if any. A channel opened with its only message ends with it
    /// (no credit goes back, its window returns to the port's slots).
    pub(crate) fn popped(&self, from: Sender, counters: &Counters) -> Option<CreditReturn> {
        let mut st = self.state.lock();
        let c = st.channels.get_mut(&from)?;
        if !c.only {
            c.last = Instant::now();
            return c.returns.popped();
        }
        let window = c.window;
        st.channels.remove(&from);
        st.ungranted += window;
        bump(&counters.closed);
        None
    }

    /// What the port has granted now.
    pub(crate) fn usage(&self) -> PortUsage {
        let st = self.state.lock();
        PortUsage {
            channels: st.channels.len(),
            ungranted: st.ungranted,
            queued: st.ring.len(),
        }
    }
}

/// What a bound port has granted ([`crate::engine::Engine::msg_port_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortUsage {
    /// Open channels (senders holding a window of the port's slots).
    pub channels: usize,
    /// The port's slots granted to no channel (all of its slots
    /// when no channel is open).
    pub ungranted: u32,
    /// Messages received and not popped.
    pub queued: usize,
}

/// A bound port: receives the messages pushed to it, in per-sender order,
/// and replies to their senders. Dropping it unbinds the port (messages
/// still in its ring are discarded; later ones are counted as
/// [`MsgStats::orphaned`]).
pub struct Port<N: Nic> {
    pub(crate) eng: Arc<dyn MsgHost<N>>,
    pub(crate) node: Arc<MsgNode<N>>,
    pub(crate) shared: Arc<PortShared<N>>,
    pub(crate) tx: Mutex<PortTx<N>>,
}

pub(crate) struct PortTx<N: Nic> {
    pub(crate) vqp: Vqp<N>,
    pub(crate) landing: Arc<Mutex<Vec<OwnedMr<N>>>>,
    pub(crate) staging: Staging<N>,
    /// Staging slots for inline replies (see `EpTx::ring`).
    pub(crate) ring: OwnedMr<N>,
    pub(crate) posts: u64,
    /// Releases of pulled descriptors whose send failed (sent again by the
    /// next pop).
    pub(crate) owed_releases: Vec<(Sender, u64)>,
    /// The replies' tags (lost ones are reported by the next reply).
    pub(crate) sent: SentTags,
}

impl<N: Nic> std::fmt::Debug for Port<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("Port")
            .field("port", &self.shared.port)
            .field("queued", &st.ring.len())
            .field("channels", &st.channels.len())
            .finish()
    }
}

impl<N: Nic> Drop for Port<N> {
    fn drop(&mut self) {
        self.node.ports.write().remove(&self.shared.port);
        let vqp = self.tx.lock().vqp.id().get();
        self.node.counters.failed.lock().remove(&vqp);
        let mut st = self.shared.state.lock();
        st.bound = false;
        st.ring.clear();
        self.node.unreserve(self.shared.slots);
    }
}

impl<N: Nic> Port<N> {
    /// Binds `port` on the node of `eng` (see `Engine::bind`; no
    /// reserved-port check here) with `slots` receive slots (`None`:
    /// `msg.port_slots`). `reclaims`: see `Engine::bind_reclaiming`.
    pub(crate) fn bind(
        eng: &Arc<dyn MsgHost<N>>,
        port: u16,
        reclaims: bool,
        slots: Option<u32>,
    ) -> Result<Port<N>, MsgError> {
        let node = MsgNode::get(&**eng)?;
        let slots = slots.unwrap_or(node.cfg.port_slots);
        if slots == 0 {
            return Err(MsgError::Config("a port needs at least one slot".into()));
        }
        if node.ports.read().contains_key(&port) {
            return Err(MsgError::PortInUse { port });
        }
        let vqp = messaging_vqp(&**eng)?;
        let ring = node.staging_ring(&**eng)?;
        let shared = Arc::new(PortShared::new(port, reclaims, slots));
        {
            let mut ports = node.ports.write();
            if ports.contains_key(&port) {
                return Err(MsgError::PortInUse { port });
            }
            node.reserve(slots)?;
            ports.insert(port, shared.clone());
        }
        Ok(Port {
            eng: eng.clone(),
            node,
            shared,
            tx: Mutex::new(PortTx {
                vqp,
                landing: Arc::new(Mutex::new(Vec::new())),
                staging: Staging::default(),
                ring,
                posts: 0,
                owed_releases: Vec::new(),
                sent: SentTags::new(eng.cfg.vqp_depth),
            }),
        })
    }
}

impl<N: Nic> Port<N> {
    /// The port number.
    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// Messages received and not popped yet.
    pub fn queued(&self) -> usize {
        self.shared.state.lock().ring.len()
    }

    /// The oldest message, if any (non-blocking). A descriptor's body is
    /// pulled here (one READ, waited for); its sender then gets the buffer
    /// back. The message's credit goes back to its sender (in batches of
    /// half its window).
    ///
    /// A popped message is always returned: when its credit return (or its
    /// descriptor's Release) cannot be sent, the credits stay owed and the
    /// Release pending, both sent again by the next call
    /// ([`MsgStats::credits_deferred`], [`MsgStats::releases_deferred`]).
    ///
    /// # Errors
    /// [`MsgError::Failed`] when the pull's READ failed (the message is
    /// consumed and reported, not dropped silently); engine errors when the
    /// sender of a descriptor cannot be reached (the message stays queued,
    /// pulled by a later pop).
    pub fn try_pop(&self) -> Result<Option<Message<N>>, MsgError> {
        self.node.progress(&*self.eng)?;
        let mut tx = self.tx.lock();
        self.settle_owed(&mut tx);
        let Some(mut msg) = take_next(&tx.vqp, &self.node, &self.shared.state, |s| &mut s.ring)?
        else {
            return Ok(None);
        };
        let credit = self.shared.popped(msg.from, &self.node.counters);
        let pulled = self.pull(&mut tx, &mut msg);
        if let Some(cr) = credit {
            if self
                .send_ctl(&tx.vqp, msg.from, MsgKind::Credit { total: cr.total })
                .is_err()
            {
                // Delivered regardless: the credits stay owed.
                let mut st = self.shared.state.lock();
                if let Some(c) = st.channels.get_mut(&msg.from) {
                    c.returns.unflush(cr.count);
                }
                st.credits_owed = true;
                bump(&self.node.counters.credits_deferred);
            }
        }
        pulled?;
        Ok(Some(msg))
    }

    /// Sends a control message to `to`'s endpoint from the port's VQP.
    fn send_ctl(&self, vqp: &Vqp<N>, to: Sender, kind: MsgKind) -> Result<(), MsgError> {
        let m = MsgRepr {
            src: self.eng.nic.gid(),
            dst: MsgDst::Vqp {
                vqp: to.vqp,
                from: self.shared.port,
            },
            kind,
        };
        let imm = vqp.id().get();
        // Take the VQP's completions first: an earlier control send that
        // failed (its peer unreachable) left the QP in error until its
        // failure is polled, and this one would be flushed behind it.
        // What it did is counted there; a lost Credit is made up by this
        // one's total.
        let _ = reap(vqp, &self.node.counters);
        send_inline(
            vqp,
            to.gid,
            imm,
            &m.emit(),
            self.node.cfg.timeout,
            &self.node.counters,
        )
    }

    /// Sends what earlier pops owe (Releases, credits); what fails again
    /// stays owed.
    fn settle_owed(&self, tx: &mut PortTx<N>) {
        let PortTx {
            vqp, owed_releases, ..
        } = tx;
        owed_releases
            .retain(|&(to, token)| self.send_ctl(vqp, to, MsgKind::Release { token }).is_err());
        if std::mem::take(&mut self.shared.state.lock().credits_owed)
            && self.return_credits_with(tx).is_err()
        {
            self.shared.state.lock().credits_owed = true;
        }
    }

    /// Pulls a descriptor's body (one READ) and releases the sender's
    /// buffer (a Release that cannot be sent now is owed: the message is
    /// not lost for it).
    pub(crate) fn pull(&self, tx: &mut PortTx<N>, msg: &mut Message<N>) -> Result<(), MsgError> {
        let from = msg.from;
        let PortTx {
            vqp,
            landing,
            owed_releases,
            ..
        } = tx;
        pull_body(&*self.eng, &self.node, vqp, landing, msg, |token| {
            if self
                .send_ctl(vqp, from, MsgKind::Release { token })
                .is_err()
            {
                owed_releases.push((from, token));
                bump(&self.node.counters.releases_deferred);
            }
        })
    }

    /// Returns now the credits of every message popped so far (they go
    /// back in batches of half a channel's window otherwise): for a
    /// receiver that pops in batches and wants its senders at full window
    /// at once. Returns the credits sent back.
    ///
    /// # Errors
    /// Engine and post errors (the credits stay pending).
    pub fn return_credits(&self) -> Result<u32, MsgError> {
        let tx = self.tx.lock();
        self.return_credits_with(&tx)
    }

    fn return_credits_with(&self, tx: &PortTx<N>) -> Result<u32, MsgError> {
        let due: Vec<(Sender, CreditReturn)> = {
            let mut st = self.shared.state.lock();
            st.channels
                .iter_mut()
                .filter_map(|(s, c)| c.returns.flush().map(|cr| (*s, cr)))
                .collect()
        };
        let mut sent = 0;
        let mut result = Ok(());
        for (sender, cr) in due {
            if result.is_ok() {
                match self.send_ctl(&tx.vqp, sender, MsgKind::Credit { total: cr.total }) {
                    Ok(()) => {
                        sent += cr.count;
                        continue;
                    }
                    Err(e) => result = Err(e),
                }
            }
            // Not sent: the credits stay pending.
            if let Some(c) = self.shared.state.lock().channels.get_mut(&sender) {
                c.returns.unflush(cr.count);
            }
        }
        result.map(|()| sent)
    }

    /// Pops the oldest message, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`MsgError::Timeout`]; as [`Port::try_pop`].
    pub fn pop_timeout(&self, timeout: Duration) -> Result<Message<N>, MsgError> {
        super::types::wait_for(timeout, || self.try_pop())
    }

    /// Pops the oldest message, waiting up to `msg.timeout`.
    ///
    /// # Errors
    /// As [`Port::pop_timeout`].
    pub fn pop(&self) -> Result<Message<N>, MsgError> {
        self.pop_timeout(self.node.cfg.timeout)
    }

    /// Replies to `to`'s sender (its endpoint's reply ring), waiting up to
    /// `msg.timeout` for a reply credit.
    ///
    /// # Errors
    /// [`MsgError::TooLarge`], [`MsgError::Timeout`] (the sender does not
    /// pop its replies), [`MsgError::ReplyLost`] for a reply sent earlier
    /// that was not delivered (one per lost reply; nothing is sent then), [`MsgError::Refused`] with
    /// [`RefuseCode::Unbound`] when the sender's channel is unknown here;
    /// engine and post errors.
    pub fn reply(&self, to: &Message<N>, data: &[u8]) -> Result<(), MsgError> {
        self.reply_to(to.from, data)
    }

    /// Replies to `sender` (see [`Port::reply`]).
    ///
    /// # Errors
    /// As [`Port::reply`].
    pub fn reply_to(&self, sender: Sender, data: &[u8]) -> Result<(), MsgError> {
        self.reply_within(sender, data, self.node.cfg.timeout)
    }

    /// [`Port::reply_to`] waiting at most `timeout` for a reply credit.
    pub(crate) fn reply_within(
        &self,
        sender: Sender,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), MsgError> {
        let cfg = &self.node.cfg;
        if data.len() > cfg.max_message {
            return Err(MsgError::TooLarge {
                len: data.len(),
                max: cfg.max_message,
            });
        }
        let start = Instant::now();
        {
            // Replies accepted earlier and lost since come first, one per
            // call (their senders' reply credits back).
            let mut tx = self.tx.lock();
            reap(&tx.vqp, &self.node.counters)?;
            let vqp = tx.vqp.id().get();
            let mut st = self.shared.state.lock();
            tx.sent
                .collect(vqp, &self.node.counters, |gid, dst, seq, status| {
                    let to = Sender { gid, vqp: dst };
                    if let Some(c) = st.channels.get_mut(&to) {
                        let _ = c.reply.credit(1);
                    }
                    MsgError::ReplyLost { to, seq, status }
                });
            drop(st);
            if let Some(lost) = tx.sent.lost.pop_front() {
                return Err(lost);
            }
        }
        // A reply that waits for a credit asks the endpoint again (the
        // channel's Grant repeated), as a push asks a port: the Credit that
        // would free it may have been lost on its way.
        // (Started at the first wait: a reply with a credit reads no clock.)
        let mut ask: Option<Resend> = None;
        loop {
            self.node.progress(&*self.eng)?;
            let taken = {
                let mut st = self.shared.state.lock();
                let Some(c) = st.channels.get_mut(&sender) else {
                    return Err(MsgError::Refused {
                        gid: sender.gid,
                        port: self.shared.port,
                        code: RefuseCode::Unbound,
                    });
                };
                c.reply.take()
            };
            if let Some(seq) = taken {
                let mut tx = self.tx.lock();
                let tx = &mut *tx;
                let dst = MsgDst::Vqp {
                    vqp: sender.vqp,
                    from: self.shared.port,
                };
                let released = std::mem::take(&mut self.shared.state.lock().released);
                for t in released {
                    tx.staging.release(t);
                }
                let imm = tx.vqp.id().get();
                let slot = self.node.ring_slot(&mut tx.posts);
                let wr_id = tx.sent.tag(sender.gid, sender.vqp, seq);
                let r = send_data(
                    &*self.eng,
                    &tx.vqp,
                    &mut tx.staging,
                    (&tx.ring, slot),
                    sender.gid,
                    dst,
                    imm,
                    seq,
                    data,
                    &self.node,
                    wr_id,
                );
                if r.is_err() {
                    if let Some(c) = self.shared.state.lock().channels.get_mut(&sender) {
                        c.reply.untake();
                    }
                }
                return r;
            }
            if start.elapsed() >= timeout {
                return Err(MsgError::Timeout(start.elapsed()));
            }
            let ask = ask.get_or_insert_with(|| Resend::new(CREDIT_ASK_FIRST, OPEN_RESEND_MAX));
            if ask.due() {
                let window = self
                    .shared
                    .state
                    .lock()
                    .channels
                    .get(&sender)
                    .map(|c| c.window);
                if let Some(window) = window {
                    let tx = self.tx.lock();
                    if self
                        .send_ctl(&tx.vqp, sender, MsgKind::Grant { window })
                        .is_ok()
                    {
                        bump(&self.node.counters.credits_asked);
                    }
                }
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::Carried;
    use krcore_nic::sim::SimNic;
    use krcore_nic::Gid;

    fn port(slots: u32) -> PortShared<SimNic> {
        PortShared::new(9, true, slots)
    }

    /// An Open carrying `body` from `from`, opened by `opener`: (answer,
    /// delivered, credits returned so far, replaced).
    fn open(
        p: &PortShared<SimNic>,
        from: Sender,
        opener: Opener,
        body: &[u8],
    ) -> (MsgKind, bool, Option<u64>, bool) {
        let mut reclaimed = Vec::new();
        let mut replaced = false;
        let carried = Carried {
            len: body.len() as u32,
            only: false,
        };
        let (a, d, t) = p.admit(
            from,
            opener,
            (2, 4),
            None,
            &mut reclaimed,
            &mut replaced,
            Some((carried, body.to_vec())),
        );
        assert!(reclaimed.is_empty());
        (a, d, t, replaced)
    }

    fn bodies(p: &PortShared<SimNic>) -> Vec<Vec<u8>> {
        p.state
            .lock()
            .ring
            .iter()
            .map(|m| match &m.body {
                Body::Inline(b) => b.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// A process restarted at its GID gets the same endpoint ids: its
    /// Open names another DCT, so it is a new channel (its first message
    /// delivered, the old channel's slots and unpopped message dropped),
    /// not a repeat of the dead process's Open. A repeat from the same
    /// DCT (or one naming none) stays a repeat.
    #[test]
    fn an_open_from_another_process_at_the_same_gid_is_a_new_channel() {
        let p = port(4);
        let from = Sender {
            gid: Gid([7; 16]),
            vqp: 3,
        };
        let old = Opener {
            dct_num: 41,
            dc_key: 5,
        };
        let new = Opener {
            dct_num: 42,
            dc_key: 5,
        };
        let (a, delivered, _, replaced) = open(&p, from, old, b"old");
        assert_eq!(a, MsgKind::Grant { window: 2 });
        assert!(delivered && !replaced);
        // The same process asks again: a repeat, nothing delivered twice.
        let (a, delivered, _, replaced) = open(&p, from, old, b"old");
        assert_eq!(a, MsgKind::Grant { window: 2 });
        assert!(!delivered && !replaced);
        let unsaid = Opener::default();
        let (_, delivered, _, replaced) = open(&p, from, unsaid, b"old");
        assert!(!delivered && !replaced);
        assert_eq!(p.state.lock().ungranted, 2);
        // The old process died with "old" unpopped; a new one opens.
        let (a, delivered, total, replaced) = open(&p, from, new, b"new");
        assert_eq!(a, MsgKind::Grant { window: 2 });
        assert!(delivered && replaced);
        assert_eq!(total, None, "a new channel has returned nothing yet");
        assert_eq!(bodies(&p), vec![b"new".to_vec()]);
        let st = p.state.lock();
        assert_eq!(st.ungranted, 2, "the old channel's window went back");
        assert_eq!(st.channels.len(), 1);
        assert_eq!(st.channels.get(&from).map(|c| c.opener), Some(new));
    }
}
