//! The control messages' encoding: frames, `Request::encode` /
//! `decode`, `Reply::encode` / `decode`, and the frame length checks a
//! reader makes before it reads a body. Decoding is checked: a short, long
//! or unknown frame is a [`WireError`], never a panic.

use super::types::{
    MsgFailure, NodeStats, RefuseCode, Reply, Request, WireError, WireGrant, MAX_FRAME, MAX_TEXT,
};
use krcore_nic::Gid;

struct Out(Vec<u8>);

impl Out {
    fn new(tag: u8) -> Out {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&[0; 4]);
        v.push(tag);
        Out(v)
    }
    fn u8(mut self, x: u8) -> Out {
        self.0.push(x);
        self
    }
    fn u32(mut self, x: u32) -> Out {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(mut self, x: u64) -> Out {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn gid(mut self, g: &Gid) -> Out {
        self.0.extend_from_slice(g.as_bytes());
        self
    }
    /// A reason text, cut to [`MAX_TEXT`] bytes at a character boundary.
    fn text(self, t: &str) -> Out {
        let mut end = t.len().min(MAX_TEXT);
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&t.as_bytes()[..end])
    }
    fn grant(self, g: &WireGrant) -> Out {
        self.gid(&g.gid)
            .u32(g.rkey)
            .u64(g.addr)
            .u64(g.len)
            .u32(g.access)
            .u64(g.ttl_ms)
    }
    fn u16(mut self, x: u16) -> Out {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    /// Bytes with their length, whole: callers keep data within
    /// [`MAX_MSG_BYTES`] (checked before encoding; a longer frame would be
    /// refused by the other side's [`frame_len`], never cut).
    fn bytes(mut self, b: &[u8]) -> Out {
        self = self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    /// The frame: its length prefix filled in.
    fn done(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

struct In<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> In<'a> {
    fn take<const K: usize>(&mut self) -> Result<[u8; K], WireError> {
        let end = self.at + K;
        let src = self.buf.get(self.at..end).ok_or(WireError::Truncated {
            len: self.buf.len(),
        })?;
        let mut out = [0u8; K];
        out.copy_from_slice(src);
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn gid(&mut self) -> Result<Gid, WireError> {
        Ok(Gid(self.take()?))
    }
    fn grant(&mut self) -> Result<WireGrant, WireError> {
        Ok(WireGrant {
            gid: self.gid()?,
            rkey: self.u32()?,
            addr: self.u64()?,
            len: self.u64()?,
            access: self.u32()?,
            ttl_ms: self.u64()?,
        })
    }
    fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        let end = self.at.checked_add(n).ok_or(WireError::Truncated {
            len: self.buf.len(),
        })?;
        let s = self.buf.get(self.at..end).ok_or(WireError::Truncated {
            len: self.buf.len(),
        })?;
        self.at = end;
        Ok(s)
    }
    /// A text field of a request (a store's name), whole and UTF-8.
    fn string(&mut self, tag: u8) -> Result<String, WireError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::NotUtf8 { tag })
    }
    fn end<T>(self, tag: u8, v: T) -> Result<T, WireError> {
        match self.buf.len() - self.at {
            0 => Ok(v),
            extra => Err(WireError::Trailing { tag, extra }),
        }
    }
}

/// The body length a request frame's 4-byte prefix announces, checked
/// against [`MAX_FRAME`].
///
/// # Errors
/// [`WireError::TooLong`].
pub fn frame_len(prefix: [u8; 4]) -> Result<usize, WireError> {
    frame_len_within(prefix, MAX_FRAME)
}

/// The body length a frame's prefix announces, checked against `max`
/// ([`MAX_FRAME`] for requests, [`MAX_REPLY_FRAME`](super::MAX_REPLY_FRAME) for replies).
///
/// # Errors
/// [`WireError::TooLong`].
pub fn frame_len_within(prefix: [u8; 4], max: usize) -> Result<usize, WireError> {
    match u32::from_le_bytes(prefix) as usize {
        len if len > max => Err(WireError::TooLong { len, max }),
        len => Ok(len),
    }
}

impl Request {
    /// The request in a word (for errors).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "attach",
            Request::AllocMr { .. } => "allocate memory",
            Request::FreeMr { .. } => "free memory",
            Request::CreateVqp => "create a VQP",
            Request::DestroyVqp { .. } => "destroy a VQP",
            Request::Connect { .. } => "connect",
            Request::Grant { .. } => "grant",
            Request::SetUngranted { .. } => "set the ungranted rule",
            Request::Stats => "stats",
            Request::CreateEndpoint { .. } => "create an endpoint",
            Request::DestroyEndpoint { .. } => "destroy an endpoint",
            Request::Push { .. } => "push",
            Request::PopReply { .. } => "pop a reply",
            Request::CloseChannel { .. } => "close a channel",
            Request::Credits { .. } => "credits",
            Request::OpenAhead { .. } => "open a channel ahead",
            Request::PushAhead { .. } => "push ahead",
            Request::BindPort { .. } => "bind a port",
            Request::UnbindPort { .. } => "unbind a port",
            Request::PopPort { .. } => "pop a port",
            Request::ReplyPort { .. } => "reply",
            Request::ReturnCredits { .. } => "return credits",
            Request::Queued { .. } => "count queued messages",
            Request::Lease { .. } => "lease",
            Request::Revoke { .. } => "revoke a lease",
            Request::RevokeLeases { .. } => "revoke leases",
            Request::LiveLeases { .. } => "count live leases",
            Request::Upgrade { .. } => "upgrade a VQP",
            Request::Path { .. } => "a VQP's path",
            Request::OpenVqp(_) => "open a VQP",
            Request::StoreJoin { .. } => "join a store",
            Request::StoreLeave { .. } => "leave a store",
        }
    }

    /// The request as one frame.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Request::Hello { version, pid } => Out::new(1).u32(*version).u32(*pid),
            Request::AllocMr { len, access } => Out::new(2).u64(*len).u32(*access),
            Request::FreeMr { mr } => Out::new(3).u32(*mr),
            Request::CreateVqp => Out::new(4),
            Request::DestroyVqp { vqp } => Out::new(5).u32(*vqp),
            Request::Connect { vqp, gid } => Out::new(6).u32(*vqp).gid(gid),
            Request::Grant { vqp, grant } => Out::new(7).u32(*vqp).grant(grant),
            Request::SetUngranted { vqp, allow } => Out::new(8).u32(*vqp).u8(*allow),
            Request::Stats => Out::new(9),
            Request::CreateEndpoint { window } => Out::new(10).u32(*window),
            Request::DestroyEndpoint { ep } => Out::new(11).u32(*ep),
            Request::Push {
                ep,
                gid,
                port,
                wait_ms,
                data,
            } => Out::new(12)
                .u32(*ep)
                .gid(gid)
                .u16(*port)
                .u64(*wait_ms)
                .bytes(data),
            Request::PopReply { ep, wait_ms } => Out::new(13).u32(*ep).u64(*wait_ms),
            Request::CloseChannel { ep, gid, port } => Out::new(14).u32(*ep).gid(gid).u16(*port),
            Request::Credits { ep, gid, port } => Out::new(15).u32(*ep).gid(gid).u16(*port),
            Request::OpenAhead { ep, gid, port } => Out::new(31).u32(*ep).gid(gid).u16(*port),
            Request::PushAhead {
                ep,
                gid,
                port,
                data,
            } => Out::new(32).u32(*ep).gid(gid).u16(*port).bytes(data),
            Request::BindPort { port, reclaiming } => Out::new(16).u16(*port).u8(*reclaiming),
            Request::UnbindPort { handle } => Out::new(17).u32(*handle),
            Request::PopPort { handle, wait_ms } => Out::new(18).u32(*handle).u64(*wait_ms),
            Request::ReplyPort {
                handle,
                gid,
                vqp,
                wait_ms,
                data,
            } => Out::new(19)
                .u32(*handle)
                .gid(gid)
                .u32(*vqp)
                .u64(*wait_ms)
                .bytes(data),
            Request::ReturnCredits { handle } => Out::new(20).u32(*handle),
            Request::Queued { handle } => Out::new(21).u32(*handle),
            Request::Lease {
                mr,
                offset,
                len,
                access,
                ttl_ms,
            } => Out::new(22)
                .u32(*mr)
                .u64(*offset)
                .u64(*len)
                .u32(*access)
                .u64(*ttl_ms),
            Request::Revoke { mr, id } => Out::new(23).u32(*mr).u64(*id),
            Request::RevokeLeases { mr } => Out::new(24).u32(*mr),
            Request::LiveLeases { mr } => Out::new(25).u32(*mr),
            Request::Upgrade { vqp } => Out::new(26).u32(*vqp),
            Request::Path { vqp } => Out::new(27).u32(*vqp),
            Request::OpenVqp(grant) => Out::new(28).grant(grant),
            Request::StoreJoin {
                store,
                id,
                record,
                lease_ms,
            } => Out::new(29)
                .bytes(store.as_bytes())
                .u16(*id)
                .bytes(record)
                .u64(*lease_ms),
            Request::StoreLeave { store, id } => Out::new(30).bytes(store.as_bytes()).u16(*id),
        }
        .done()
    }

    /// Decodes a frame body.
    ///
    /// # Errors
    /// [`WireError`] for anything but exactly one request.
    pub fn decode(body: &[u8]) -> Result<Request, WireError> {
        let mut r = In { buf: body, at: 0 };
        let tag = r.u8()?;
        let req = match tag {
            1 => Request::Hello {
                version: r.u32()?,
                pid: r.u32()?,
            },
            2 => Request::AllocMr {
                len: r.u64()?,
                access: r.u32()?,
            },
            3 => Request::FreeMr { mr: r.u32()? },
            4 => Request::CreateVqp,
            5 => Request::DestroyVqp { vqp: r.u32()? },
            6 => Request::Connect {
                vqp: r.u32()?,
                gid: r.gid()?,
            },
            7 => Request::Grant {
                vqp: r.u32()?,
                grant: r.grant()?,
            },
            8 => Request::SetUngranted {
                vqp: r.u32()?,
                allow: r.u8()?,
            },
            9 => Request::Stats,
            10 => Request::CreateEndpoint { window: r.u32()? },
            11 => Request::DestroyEndpoint { ep: r.u32()? },
            12 => Request::Push {
                ep: r.u32()?,
                gid: r.gid()?,
                port: r.u16()?,
                wait_ms: r.u64()?,
                data: r.bytes()?.to_vec(),
            },
            13 => Request::PopReply {
                ep: r.u32()?,
                wait_ms: r.u64()?,
            },
            14 => Request::CloseChannel {
                ep: r.u32()?,
                gid: r.gid()?,
                port: r.u16()?,
            },
            15 => Request::Credits {
                ep: r.u32()?,
                gid: r.gid()?,
                port: r.u16()?,
            },
            16 => Request::BindPort {
                port: r.u16()?,
                reclaiming: r.u8()?,
            },
            17 => Request::UnbindPort { handle: r.u32()? },
            18 => Request::PopPort {
                handle: r.u32()?,
                wait_ms: r.u64()?,
            },
            19 => Request::ReplyPort {
                handle: r.u32()?,
                gid: r.gid()?,
                vqp: r.u32()?,
                wait_ms: r.u64()?,
                data: r.bytes()?.to_vec(),
            },
            20 => Request::ReturnCredits { handle: r.u32()? },
            21 => Request::Queued { handle: r.u32()? },
            22 => Request::Lease {
                mr: r.u32()?,
                offset: r.u64()?,
                len: r.u64()?,
                access: r.u32()?,
                ttl_ms: r.u64()?,
            },
            23 => Request::Revoke {
                mr: r.u32()?,
                id: r.u64()?,
            },
            24 => Request::RevokeLeases { mr: r.u32()? },
            25 => Request::LiveLeases { mr: r.u32()? },
            26 => Request::Upgrade { vqp: r.u32()? },
            27 => Request::Path { vqp: r.u32()? },
            28 => Request::OpenVqp(r.grant()?),
            29 => Request::StoreJoin {
                store: r.string(tag)?,
                id: r.u16()?,
                record: r.bytes()?.to_vec(),
                lease_ms: r.u64()?,
            },
            30 => Request::StoreLeave {
                store: r.string(tag)?,
                id: r.u16()?,
            },
            31 => Request::OpenAhead {
                ep: r.u32()?,
                gid: r.gid()?,
                port: r.u16()?,
            },
            32 => Request::PushAhead {
                ep: r.u32()?,
                gid: r.gid()?,
                port: r.u16()?,
                data: r.bytes()?.to_vec(),
            },
            tag => return Err(WireError::UnknownTag { tag }),
        };
        r.end(tag, req)
    }
}

impl Reply {
    /// The reply as one frame.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Welcome {
                version,
                gid,
                mode,
                max_vqps,
                max_mr_bytes,
            } => Out::new(101)
                .u32(*version)
                .gid(gid)
                .u8(*mode)
                .u32(*max_vqps)
                .u64(*max_mr_bytes),
            Reply::Mr {
                mr,
                addr,
                len,
                lkey,
                rkey,
            } => Out::new(102)
                .u32(*mr)
                .u64(*addr)
                .u64(*len)
                .u32(*lkey)
                .u32(*rkey),
            Reply::Vqp { vqp, id } => Out::new(103).u32(*vqp).u32(*id),
            Reply::Done => Out::new(104),
            Reply::Stats(n) => Out::new(106)
                .u64(n.qps_created)
                .u64(n.modeled_control_ns)
                .u64(n.network_ops)
                .u64(n.dcis)
                .u64(n.vqps_created)
                .u64(n.connect_hits)
                .u64(n.connect_misses)
                .u64(n.meta_reads)
                .u64(n.rc_upgrades)
                .u64(n.rc_downgrades)
                .u64(n.rc_upgrade_failures)
                .u32(n.rc_pairs)
                .u32(n.clients),
            Reply::Refused { code, message } => Out::new(105).u8(code.to_u8()).text(message),
            Reply::Endpoint { ep, id } => Out::new(107).u32(*ep).u32(*id),
            Reply::Message {
                gid,
                vqp,
                port,
                seq,
                data,
            } => Out::new(108)
                .gid(gid)
                .u32(*vqp)
                .u16(*port)
                .u64(*seq)
                .bytes(data),
            Reply::NoMessage => Out::new(109),
            Reply::Flag(b) => Out::new(110).u8(u8::from(*b)),
            Reply::Credits(c) => Out::new(111).u8(u8::from(c.is_some())).u32(c.unwrap_or(0)),
            Reply::MsgFailed(f) => {
                let o = Out::new(112);
                match f {
                    MsgFailure::Refused { gid, port, code } => {
                        o.u8(1).gid(gid).u16(*port).u8(*code)
                    }
                    MsgFailure::TooLarge { len, max } => o.u8(2).u64(*len).u64(*max),
                    MsgFailure::WouldBlock => o.u8(3),
                    MsgFailure::Timeout(ns) => o.u8(4).u64(*ns),
                    MsgFailure::Lost {
                        gid,
                        port,
                        seq,
                        status,
                    } => o.u8(5).gid(gid).u16(*port).u64(*seq).u8(*status),
                    MsgFailure::Other(t) => o.u8(6).text(t),
                    MsgFailure::ReplyLost {
                        gid,
                        vqp,
                        seq,
                        status,
                    } => o.u8(7).gid(gid).u32(*vqp).u64(*seq).u8(*status),
                    MsgFailure::PortInUse { port } => o.u8(8).u16(*port),
                    MsgFailure::ReservedPort { port } => o.u8(9).u16(*port),
                    MsgFailure::NoBuffers { wanted, free } => o.u8(10).u32(*wanted).u32(*free),
                    MsgFailure::Unsupported(t) => o.u8(11).text(t),
                }
            }
            Reply::Port { handle } => Out::new(113).u32(*handle),
            Reply::Count(n) => Out::new(114).u64(*n),
            Reply::Leased { id, rkey, addr } => Out::new(115).u64(*id).u32(*rkey).u64(*addr),
            Reply::Path(t) => Out::new(116).u8(*t),
            Reply::MetaRefused { code } => Out::new(117).u16(*code),
        }
        .done()
    }

    /// Decodes a frame body.
    ///
    /// # Errors
    /// [`WireError`] for anything but exactly one reply.
    pub fn decode(body: &[u8]) -> Result<Reply, WireError> {
        let mut r = In { buf: body, at: 0 };
        let tag = r.u8()?;
        let rep = match tag {
            101 => Reply::Welcome {
                version: r.u32()?,
                gid: r.gid()?,
                mode: r.u8()?,
                max_vqps: r.u32()?,
                max_mr_bytes: r.u64()?,
            },
            102 => Reply::Mr {
                mr: r.u32()?,
                addr: r.u64()?,
                len: r.u64()?,
                lkey: r.u32()?,
                rkey: r.u32()?,
            },
            103 => Reply::Vqp {
                vqp: r.u32()?,
                id: r.u32()?,
            },
            104 => Reply::Done,
            106 => Reply::Stats(NodeStats {
                qps_created: r.u64()?,
                modeled_control_ns: r.u64()?,
                network_ops: r.u64()?,
                dcis: r.u64()?,
                vqps_created: r.u64()?,
                connect_hits: r.u64()?,
                connect_misses: r.u64()?,
                meta_reads: r.u64()?,
                rc_upgrades: r.u64()?,
                rc_downgrades: r.u64()?,
                rc_upgrade_failures: r.u64()?,
                rc_pairs: r.u32()?,
                clients: r.u32()?,
            }),
            105 => Reply::Refused {
                code: RefuseCode::from_u8(r.u8()?),
                message: String::from_utf8_lossy(r.bytes()?).into_owned(),
            },
            107 => Reply::Endpoint {
                ep: r.u32()?,
                id: r.u32()?,
            },
            108 => Reply::Message {
                gid: r.gid()?,
                vqp: r.u32()?,
                port: r.u16()?,
                seq: r.u64()?,
                data: r.bytes()?.to_vec(),
            },
            109 => Reply::NoMessage,
            110 => Reply::Flag(r.u8()? != 0),
            111 => {
                let some = r.u8()? != 0;
                let c = r.u32()?;
                Reply::Credits(some.then_some(c))
            }
            112 => Reply::MsgFailed(match r.u8()? {
                1 => MsgFailure::Refused {
                    gid: r.gid()?,
                    port: r.u16()?,
                    code: r.u8()?,
                },
                2 => MsgFailure::TooLarge {
                    len: r.u64()?,
                    max: r.u64()?,
                },
                3 => MsgFailure::WouldBlock,
                4 => MsgFailure::Timeout(r.u64()?),
                5 => MsgFailure::Lost {
                    gid: r.gid()?,
                    port: r.u16()?,
                    seq: r.u64()?,
                    status: r.u8()?,
                },
                6 => MsgFailure::Other(String::from_utf8_lossy(r.bytes()?).into_owned()),
                7 => MsgFailure::ReplyLost {
                    gid: r.gid()?,
                    vqp: r.u32()?,
                    seq: r.u64()?,
                    status: r.u8()?,
                },
                8 => MsgFailure::PortInUse { port: r.u16()? },
                9 => MsgFailure::ReservedPort { port: r.u16()? },
                10 => MsgFailure::NoBuffers {
                    wanted: r.u32()?,
                    free: r.u32()?,
                },
                11 => MsgFailure::Unsupported(String::from_utf8_lossy(r.bytes()?).into_owned()),
                kind => return Err(WireError::UnknownTag { tag: kind }),
            }),
            113 => Reply::Port { handle: r.u32()? },
            114 => Reply::Count(r.u64()?),
            116 => Reply::Path(r.u8()?),
            117 => Reply::MetaRefused { code: r.u16()? },
            115 => Reply::Leased {
                id: r.u64()?,
                rkey: r.u32()?,
                addr: r.u64()?,
            },
            tag => return Err(WireError::UnknownTag { tag }),
        };
        r.end(tag, rep)
    }
}
