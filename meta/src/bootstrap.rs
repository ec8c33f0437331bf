//! Finding a meta server: its [`BootstrapRepr`] published under a
//! well-known name on a sim fabric, or served by a tiny TCP listener for
//! fabrics without a name service.
//!
//! # Format
//! Both carry the same bytes: a wire `Bootstrap` message (see
//! [`crate::wire`]) with request id 0, so the receiver checks magic,
//! version, length and reserved bytes with the wire parser, then the table
//! layout with [`BootstrapRepr::geometry`]. Remote bytes are untrusted:
//! [`decode`] never panics.
//!
//! # TCP
//! Request/response, one exchange per connection: the client connects,
//! sends ONE request message (`BootstrapRequest` or `StoreList`), reads the
//! reply (its header gives its length: a `StoreMembers` reply may be longer
//! than [`MAX_MESSAGE_LEN`]), and the server closes.
//!
//! ```text
//! client                                      server (serve_tcp)
//!   connect ------------------------------->  accept (at most MAX_CONNECTIONS at once,
//!   request: header + payload ------------>   a thread each, CONNECTION_TIMEOUT each)
//!                                             parse -> handler(&request) -> reply
//!   read header, then payload_len bytes <---  reply; close
//! ```
//!
//! [`serve_tcp`] runs a handler for each request; [`serve_bootstrap_tcp`]
//! is the simple case (a fixed bootstrap). The accept thread is stopped
//! (and joined) when the [`TcpBootstrap`] is dropped; each connection's
//! thread ends within [`CONNECTION_TIMEOUT`] whatever the client does, so
//! a stuck client holds one of [`MAX_CONNECTIONS`] slots for that long at
//! most. Bind it to a loopback address unless the port is meant to be
//! reachable from other hosts: it is unauthenticated.
//!
//! The clients, [`fetch_bootstrap_tcp`] and [`fetch_store_tcp`] (both over
//! [`request_tcp`]), wait at most their `timeout` in all (connect, send,
//! receive), and tell a server of another wire version (a reply with the
//! right magic and another version, such as a v2 server's bootstrap sent on
//! connect) apart as [`MetaError::WireVersion`].

use crate::error::{Ctx, MetaError, MetaResult};
use crate::requests::parse_error_code;
use crate::stores::{StoreMember, StoreName};
use crate::wire::{
    BootstrapRepr, ErrorCode, Message, Packet, Repr, WireError, HEADER_LEN, MAGIC, MAX_MESSAGE_LEN,
    WIRE_VERSION,
};
use krcore_nic::sim::SimFabric;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The name a meta server publishes under unless told otherwise.
pub const DEFAULT_NAME: &str = "krcore-meta";

/// The bytes of `b`: a `Bootstrap` message with request id 0.
pub fn encode(b: &BootstrapRepr) -> Vec<u8> {
    Repr {
        request_id: 0,
        message: Message::Bootstrap(*b),
    }
    .to_bytes()
}

/// Parses bootstrap bytes and checks that this build can read the table.
///
/// # Errors
/// [`MetaError::BootstrapBytes`] when the bytes are not a Bootstrap message;
/// [`MetaError::UnexpectedReply`] for another message type;
/// [`MetaError::Bootstrap`] for a table layout this build cannot read.
pub fn decode(bytes: &[u8]) -> MetaResult<BootstrapRepr> {
    let r = Repr::parse_bytes(bytes).map_err(MetaError::BootstrapBytes)?;
    match r.message {
        Message::Bootstrap(b) => {
            b.geometry()?;
            Ok(b)
        }
        other => Err(MetaError::UnexpectedReply {
            op: "decode bootstrap",
            got: other.msg_type(),
        }),
    }
}

/// Publishes `b` under `name` on `fabric` (replacing an earlier value).
///
/// # Errors
/// [`MetaError::Nic`] for a bad name or a failed write.
pub fn publish_on_sim(fabric: &SimFabric, name: &str, b: &BootstrapRepr) -> MetaResult<()> {
    fabric
        .publish(name, &encode(b))
        .ctx("publish the meta server's bootstrap")
}

/// The bootstrap published under `name` on `fabric`.
///
/// # Errors
/// [`MetaError::NotPublished`] when nothing is; the errors of [`decode`];
/// [`MetaError::Nic`] for a bad name or a failed read.
pub fn lookup_on_sim(fabric: &SimFabric, name: &str) -> MetaResult<BootstrapRepr> {
    match fabric
        .lookup(name)
        .ctx("look up the meta server's bootstrap")?
    {
        Some(bytes) => decode(&bytes),
        None => Err(MetaError::NotPublished {
            name: name.to_string(),
        }),
    }
}

/// What a [`serve_tcp`] listener does with each parsed request: the body
/// of its reply (the listener echoes the request id). Called from the
/// connections' threads, concurrently; it should not block for long.
pub type TcpHandler = Arc<dyn Fn(&Repr) -> Message + Send + Sync>;

/// A TCP listener answering one request per connection (see the module
/// docs). Dropping it stops the accept thread (within a few ms), joins it,
/// and waits (at most [`CONNECTION_TIMEOUT`]) for connections in progress.
#[derive(Debug)]
pub struct TcpBootstrap {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpBootstrap {
    /// The bound address (with the port the OS chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TcpBootstrap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let give_up = Instant::now() + CONNECTION_TIMEOUT + ACCEPT_POLL;
        while self.active.load(Ordering::Acquire) > 0 && Instant::now() < give_up {
            std::thread::sleep(ACCEPT_POLL);
        }
    }
}

/// How often the listener thread checks for a stop while idle.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Longest a connection may take, from accept to the reply's last byte.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 16;

/// Serves `b` on `addr` (for example `127.0.0.1:0`): a `BootstrapRequest`
/// gets `Bootstrap(b)`, a `StoreList` `Err(NoSuchStore)` (this server keeps
/// no stores), any other message `Err(UnexpectedMessage)`.
///
/// # Errors
/// As [`serve_tcp`].
pub fn serve_bootstrap_tcp(
    addr: impl ToSocketAddrs,
    b: &BootstrapRepr,
) -> MetaResult<TcpBootstrap> {
    let b = *b;
    serve_tcp(
        addr,
        Arc::new(move |r: &Repr| match r.message {
            Message::BootstrapRequest => Message::Bootstrap(b),
            Message::StoreList { .. } => Message::Err(ErrorCode::NoSuchStore),
            _ => Message::Err(ErrorCode::UnexpectedMessage),
        }),
    )
}

/// Serves requests on `addr` (for example `127.0.0.1:0`), one per
/// connection, answering each with `handler`'s reply. Bytes that are not
/// a meta message get no reply (the connection is closed); a message that
/// does not parse gets `Err(UnsupportedVersion | Malformed | ...)`, a
/// reply type `Err(UnexpectedMessage)`, a request longer than
/// [`MAX_MESSAGE_LEN`] `Err(Malformed)`.
///
/// # Errors
/// [`MetaError::Io`] when the address cannot be bound or the thread not
/// created.
pub fn serve_tcp(addr: impl ToSocketAddrs, handler: TcpHandler) -> MetaResult<TcpBootstrap> {
    let io = |op| move |source| MetaError::Io { op, source };
    let listener = TcpListener::bind(addr).map_err(io("bind the TCP bootstrap"))?;
    listener
        .set_nonblocking(true)
        .map_err(io("configure the TCP bootstrap"))?;
    let local = listener
        .local_addr()
        .map_err(io("configure the TCP bootstrap"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let active = Arc::new(AtomicUsize::new(0));
    let (flag, count) = (stop.clone(), active.clone());
    let thread = std::thread::Builder::new()
        .name("krcore-meta-tcp".into())
        .spawn(move || accept_loop(&listener, &flag, &count, &handler))
        .map_err(io("spawn the TCP bootstrap thread"))?;
    Ok(TcpBootstrap {
        addr: local,
        stop,
        active,
        thread: Some(thread),
    })
}

fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    active: &Arc<AtomicUsize>,
    handler: &TcpHandler,
) {
    while !stop.load(Ordering::Acquire) {
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            std::thread::sleep(ACCEPT_POLL);
            continue;
        }
        match listener.accept() {
            Ok((s, _)) => {
                active.fetch_add(1, Ordering::AcqRel);
                let (count, h) = (active.clone(), handler.clone());
                let spawned = std::thread::Builder::new()
                    .name("krcore-meta-tcp-conn".into())
                    .spawn(move || {
                        answer(s, &*h);
                        count.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    // The stream went with the closure: the client sees EOF.
                    active.fetch_sub(1, Ordering::AcqRel);
                }
            }
            // WouldBlock (idle) or a failed accept: wait, retry.
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Why reading a stream stopped short.
enum ReadFail {
    /// The deadline passed.
    Timeout,
    /// The peer closed after this many bytes.
    Eof(usize),
    /// Another OS error.
    Io(std::io::Error),
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Fills `buf` from `s` before `deadline`.
fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), ReadFail> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadFail::Timeout);
        }
        s.set_read_timeout(Some(left)).map_err(ReadFail::Io)?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ReadFail::Eof(got)),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if timed_out(&e) => return Err(ReadFail::Timeout),
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
}

/// Writes `bytes` to `s` before `deadline`.
fn write_by(s: &mut TcpStream, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    s.set_write_timeout(Some(left))?;
    s.write_all(bytes)
}

/// Serves one connection: its request, then the reply. Failures only
/// affect that client; every wait ends by [`CONNECTION_TIMEOUT`].
fn answer(mut s: TcpStream, handler: &(dyn Fn(&Repr) -> Message + Send + Sync)) {
    let deadline = Instant::now() + CONNECTION_TIMEOUT;
    let _ = s.set_nonblocking(false);
    let _ = s.set_nodelay(true);
    if let Some(reply) = request_of(&mut s, deadline, handler) {
        let _ = write_by(&mut s, &reply.to_bytes(), deadline);
    }
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// Reads and handles the request of one connection: the reply, or `None`
/// when there is no one to answer (not a meta message, a timeout).
fn request_of(
    s: &mut TcpStream,
    deadline: Instant,
    handler: &(dyn Fn(&Repr) -> Message + Send + Sync),
) -> Option<Repr> {
    let mut buf = [0u8; MAX_MESSAGE_LEN];
    read_by(s, &mut buf[..HEADER_LEN], deadline).ok()?;
    let header = Packet::new_unchecked(&buf[..HEADER_LEN]);
    if header.magic() != MAGIC {
        return None;
    }
    let request_id = header.request_id();
    let err = |code| {
        Some(Repr {
            request_id,
            message: Message::Err(code),
        })
    };
    if header.version() != WIRE_VERSION {
        return err(ErrorCode::UnsupportedVersion);
    }
    let len = HEADER_LEN + header.payload_len();
    if len > MAX_MESSAGE_LEN {
        return err(ErrorCode::Malformed);
    }
    read_by(s, &mut buf[HEADER_LEN..len], deadline).ok()?;
    let message = match Repr::parse_bytes(&buf[..len]) {
        Err(e) => Message::Err(parse_error_code(&e)),
        Ok(r) if !r.message.msg_type().is_request() => Message::Err(ErrorCode::UnexpectedMessage),
        Ok(r) => handler(&r),
    };
    Some(Repr {
        request_id,
        message,
    })
}

static NEXT_TCP_REQUEST: AtomicU64 = AtomicU64::new(1);

/// Sends `message` (with a fresh request id) to the [`serve_tcp`]
/// listener at `addr` and returns the reply, waiting at most `timeout` in
/// all. The reply's header, magic and version are checked first, then
/// the whole message is parsed and its request id compared.
///
/// # Errors
/// [`MetaError::Connect`] when no address connects (the last address and
/// its error); [`MetaError::Timeout`] when the deadline passes;
/// [`MetaError::WireVersion`] for a reply of another format version;
/// [`MetaError::ReplyBytes`] for a reply that does not parse (a stranger,
/// a truncated reply, another request's id); [`MetaError::Io`] when the
/// address does not resolve or the connection fails otherwise.
pub fn request_tcp(
    addr: impl ToSocketAddrs,
    message: Message,
    timeout: Duration,
) -> MetaResult<Repr> {
    let deadline = Instant::now() + timeout;
    let op = "a TCP meta request";
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| MetaError::Io {
            op: "resolve the meta server's TCP address",
            source,
        })?
        .collect();
    let mut last: Option<(SocketAddr, std::io::Error)> = None;
    let mut stream = None;
    for a in &addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(a, left) {
            Ok(s) => {
                stream = Some((s, *a));
                break;
            }
            Err(e) => last = Some((*a, e)),
        }
    }
    let Some((mut s, peer)) = stream else {
        return Err(match last {
            Some((a, source)) if !timed_out(&source) => MetaError::Connect {
                addr: a.to_string(),
                source,
            },
            Some((a, _)) => MetaError::Timeout {
                op: "connect",
                addr: a.to_string(),
                timeout,
            },
            None if addrs.is_empty() => MetaError::Io {
                op: "resolve the meta server's TCP address",
                source: std::io::Error::new(ErrorKind::NotFound, "it resolved to nothing"),
            },
            None => MetaError::Timeout {
                op: "connect",
                addr: addrs[0].to_string(),
                timeout,
            },
        });
    };
    let timeout_err = |op| MetaError::Timeout {
        op,
        addr: peer.to_string(),
        timeout,
    };
    let request = Repr {
        request_id: NEXT_TCP_REQUEST.fetch_add(1, Ordering::Relaxed),
        message,
    };
    let _ = s.set_nodelay(true);
    // A server that answers without reading (a v2 server) may have closed
    // already: its reply can still be read, so a failed send is reported
    // only when no reply follows.
    let sent = match write_by(&mut s, &request.to_bytes(), deadline) {
        Err(e) if timed_out(&e) => return Err(timeout_err("send the request")),
        r => r,
    };
    let read_fail = |f: ReadFail, got: &[u8], sent: std::io::Result<()>| match f {
        ReadFail::Timeout => timeout_err("receive the reply"),
        ReadFail::Eof(0) if sent.is_err() => MetaError::Io {
            op: "send the request",
            source: sent.err().unwrap_or_else(|| ErrorKind::BrokenPipe.into()),
        },
        ReadFail::Eof(n) => MetaError::ReplyBytes {
            op,
            source: WireError::Truncated {
                len: n,
                need: got.len(),
            },
        },
        ReadFail::Io(source) => MetaError::Io {
            op: "receive the reply",
            source,
        },
    };
    let mut header = [0u8; HEADER_LEN];
    if let Err(f) = read_by(&mut s, &mut header, deadline) {
        return Err(read_fail(f, &header, sent));
    }
    let h = Packet::new_unchecked(&header[..]);
    if h.magic() != MAGIC {
        return Err(MetaError::ReplyBytes {
            op,
            source: WireError::BadMagic(h.magic()),
        });
    }
    if h.version() != WIRE_VERSION {
        return Err(MetaError::WireVersion {
            ours: WIRE_VERSION,
            theirs: h.version(),
        });
    }
    let mut bytes = vec![0u8; HEADER_LEN + h.payload_len()];
    bytes[..HEADER_LEN].copy_from_slice(&header);
    if let Err(f) = read_by(&mut s, &mut bytes[HEADER_LEN..], deadline) {
        let f = match f {
            ReadFail::Eof(n) => ReadFail::Eof(HEADER_LEN + n),
            f => f,
        };
        return Err(read_fail(f, &bytes, Ok(())));
    }
    let reply = Repr::parse_bytes(&bytes).map_err(|source| MetaError::ReplyBytes { op, source })?;
    if reply.request_id != request.request_id {
        return Err(MetaError::ReplyBytes {
            op,
            source: WireError::Malformed {
                msg_type: reply.message.msg_type(),
                what: "the reply does not echo the request id",
            },
        });
    }
    Ok(reply)
}

/// Fetches a bootstrap from a [`serve_tcp`] listener (a `BootstrapRequest`,
/// see [`request_tcp`]), waiting at most `timeout` in all.
///
/// # Errors
/// Those of [`request_tcp`], but [`MetaError::BootstrapBytes`] for a reply
/// that does not parse; [`MetaError::Refused`] for an `Err` reply;
/// [`MetaError::UnexpectedReply`] for another type; [`MetaError::Bootstrap`]
/// for a table layout this build cannot read.
pub fn fetch_bootstrap_tcp(
    addr: impl ToSocketAddrs,
    timeout: Duration,
) -> MetaResult<BootstrapRepr> {
    let op = "fetch the bootstrap over TCP";
    let reply = match request_tcp(addr, Message::BootstrapRequest, timeout) {
        Err(MetaError::ReplyBytes { source, .. }) => return Err(MetaError::BootstrapBytes(source)),
        r => r?,
    };
    match reply.message {
        Message::Bootstrap(b) => {
            b.geometry()?;
            Ok(b)
        }
        Message::Err(code) => Err(MetaError::Refused { op, code }),
        other => Err(MetaError::UnexpectedReply {
            op,
            got: other.msg_type(),
        }),
    }
}

/// The live members of `store` (ids ascending), from the [`serve_tcp`]
/// listener of a meta server that keeps stores (a `StoreList`, see
/// [`request_tcp`]), waiting at most `timeout` in all.
///
/// # Errors
/// [`MetaError::Store`] for a bad name (nothing is sent); those of
/// [`request_tcp`]; [`MetaError::NoSuchStore`] when the store has no live
/// member; [`MetaError::Refused`] for another `Err` reply;
/// [`MetaError::UnexpectedReply`] for another type.
pub fn fetch_store_tcp(
    addr: impl ToSocketAddrs,
    store: &str,
    timeout: Duration,
) -> MetaResult<Vec<StoreMember>> {
    let op = "list a store over TCP";
    let name = StoreName::new(store)?;
    let reply = request_tcp(addr, Message::StoreList { store: name }, timeout)?;
    match reply.message {
        Message::StoreMembers(members) => Ok(members),
        Message::Err(ErrorCode::NoSuchStore) => Err(MetaError::NoSuchStore {
            store: store.to_string(),
        }),
        Message::Err(code) => Err(MetaError::Refused { op, code }),
        other => Err(MetaError::UnexpectedReply {
            op,
            got: other.msg_type(),
        }),
    }
}
