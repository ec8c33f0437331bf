//! The state messaging keeps per bound port and per endpoint, held by the
//! node ([`super::node::MsgNode`]'s maps) and by the handles
//! ([`super::Port`], [`super::Endpoint`]): their data here, their
//! behaviour in `port.rs` and `endpoint.rs`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use krcore_nic::{Gid, Nic};
use parking_lot::Mutex;

use super::types::{Message, Sender};
use crate::msg::{RefuseCode, ReturnBatch, SendWindow, SeqCheck};

/// The receive side of one channel at the port.
pub(crate) struct ChannelRx {
    pub(crate) window: u32,
    pub(crate) returns: ReturnBatch,
    pub(crate) seq: SeqCheck,
    pub(crate) reply: SendWindow,
    /// Last data message received or popped (idle reclaim, reserved
    /// ports only).
    pub(crate) last: Instant,
    /// Opened with its only message ([`crate::msg::Carried::only`]): the
    /// channel ends when that message is popped.
    pub(crate) only: bool,
    /// The DCT (number, key) its Open named: which process at the
    /// sender's GID opened it (see `PortShared::admit`).
    pub(crate) opener: Opener,
}

/// The DCT (number, key) an Open names: a node has one for its life, so
/// another one at a known GID is another process there (a restarted
/// client). Number 0: not said (matches any).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Opener {
    pub(crate) dct_num: u32,
    pub(crate) dc_key: u64,
}

impl Opener {
    /// Whether `self` and `other` may be the same process.
    pub(crate) fn same(self, other: Opener) -> bool {
        self.dct_num == 0 || other.dct_num == 0 || self == other
    }
}

pub(crate) struct PortState<N: Nic> {
    pub(crate) ring: VecDeque<Message<N>>,
    pub(crate) channels: HashMap<Sender, ChannelRx>,
    /// Slots not granted to any channel.
    pub(crate) ungranted: u32,
    pub(crate) bound: bool,
    /// Tokens of reply descriptors the endpoints released.
    pub(crate) released: Vec<u64>,
    /// A credit return failed: some channel's credits are owed (sent again
    /// by the next pop).
    pub(crate) credits_owed: bool,
}

pub(crate) struct PortShared<N: Nic> {
    pub(crate) port: u16,
    /// Whether a full port takes back idle channels (`msg.control_idle`),
    /// as the engine's reserved ports do ([`Engine::bind_reclaiming`]).
    pub(crate) reclaims: bool,
    /// The receive slots the port reserved from the node's budget (given
    /// back when it is unbound).
    pub(crate) slots: u32,
    pub(crate) state: Mutex<PortState<N>>,
}

/// An Open unanswered this long is sent again (then after twice as long,
/// up to [`OPEN_RESEND_MAX`]), within the push's wait.
pub(crate) const OPEN_RESEND_FIRST: Duration = Duration::from_millis(20);

/// The longest pause between two sends of one Open.
pub(crate) const OPEN_RESEND_MAX: Duration = Duration::from_millis(500);

/// How long a push waits for a credit before it asks the port again (see
/// `Endpoint::ask_credits`), doubling up to [`OPEN_RESEND_MAX`].
pub(crate) const CREDIT_ASK_FIRST: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Opening,
    Open,
    /// The Open was refused.
    Refused(RefuseCode),
    /// The port refused the channel after it was open, with messages of
    /// it unaccounted for (credits out): they were not delivered (the port
    /// was unbound, or had reclaimed the channel). The next push reports
    /// it, then the channel is forgotten.
    Lost(RefuseCode),
}

/// The send side of one channel at the endpoint.
pub(crate) struct ChannelTx {
    pub(crate) status: Status,
    pub(crate) fwd: SendWindow,
    pub(crate) reply_returns: ReturnBatch,
    pub(crate) reply_seq: SeqCheck,
    pub(crate) reply_window: u32,
    /// While opening: the first message, carried by the Open (see
    /// [`crate::msg::Carried`]); a repeated Open carries it again.
    pub(crate) carried: Option<Vec<u8>>,
    /// While opening: when the Open went out (or was last sent again by
    /// `Endpoint::push_ahead`, which repeats it, carrying what it carries,
    /// once it is older than [`OPEN_RESEND_FIRST`]; the waiting paths
    /// repeat it from their own waits).
    pub(crate) open_sent: std::time::Instant,
    /// While opening: the latest credit total that came before the Grant
    /// (the port returned the carried message's credit, and its Credit
    /// overtook the Grant: they leave the port's node on different DCIs),
    /// applied when the Grant comes.
    pub(crate) early_credit: Option<u64>,
    /// The port asked for the reply credits again (a repeated Grant of the
    /// open channel: its `reply` waits for a credit): the next settle sends
    /// the total again.
    pub(crate) resend_total: bool,
}

impl ChannelTx {
    /// Applies a Credit (the port's cumulative `total`); one that comes
    /// while the channel is opening is kept for the Grant. `false`: a
    /// total past the credits in use (malformed).
    pub(crate) fn credited(&mut self, total: u64) -> bool {
        if self.status == Status::Opening {
            self.early_credit = Some(self.early_credit.map_or(total, |t| t.max(total)));
            return true;
        }
        self.fwd.credit_total(total).is_ok()
    }

    /// Applies the port's answer to the channel's Open (a duplicate Grant,
    /// answering a repeated Open, changes nothing but asks for the reply
    /// credits' total again: see `resend_total`). A Refuse of an open
    /// channel is a loss: see [`Status::Lost`].
    pub(crate) fn answered(&mut self, answer: Result<u32, RefuseCode>) {
        match (self.status, answer) {
            (Status::Opening, Ok(window)) => {
                self.status = Status::Open;
                self.fwd = SendWindow::new(window);
                // The carried message went with the grant: seq 0.
                if self.carried.take().is_some() {
                    let _ = self.fwd.take();
                }
                // Its credit may be back already.
                if let Some(total) = self.early_credit.take() {
                    let _ = self.fwd.credit_total(total);
                }
            }
            (Status::Opening, Err(code)) => self.status = Status::Refused(code),
            (Status::Open, Ok(_)) => self.resend_total = true,
            // Credits out: a message of the channel never reached the port
            // (its credit never comes back). None out: the port reclaimed
            // an idle channel, nothing was lost (the next push reopens).
            (Status::Open, Err(code)) if self.fwd.in_use() > 0 => {
                self.status = Status::Lost(code);
            }
            (Status::Open, Err(code)) => self.status = Status::Refused(code),
            _ => {}
        }
    }
}

pub(crate) struct EpState<N: Nic> {
    pub(crate) channels: HashMap<(Gid, u16), ChannelTx>,
    pub(crate) replies: VecDeque<Message<N>>,
    pub(crate) released: Vec<u64>,
    /// A reply credit return failed: credits are owed (sent again by the
    /// next pop).
    pub(crate) credits_owed: bool,
}

pub(crate) struct EndpointShared<N: Nic> {
    pub(crate) state: Mutex<EpState<N>>,
}
