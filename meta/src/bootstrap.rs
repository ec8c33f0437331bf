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
//! [`serve_bootstrap_tcp`] answers every connection with the bytes and
//! closes it; one thread, stopped (and joined) when the [`TcpBootstrap`] is
//! dropped. Bind it to a loopback address unless the port is meant to be
//! reachable from other hosts: it is unauthenticated.

use crate::error::{Ctx, MetaError, MetaResult};
use crate::wire::{BootstrapRepr, Message, Repr, MAX_MESSAGE_LEN};
use krcore_nic::sim::SimFabric;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// A TCP listener answering every connection with the bootstrap bytes.
/// Dropping it stops the listener thread (within a few ms) and joins it.
#[derive(Debug)]
pub struct TcpBootstrap {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
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
    }
}

/// How often the listener thread checks for a stop while idle.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// How long a connection may take to accept the bytes.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves `b` on `addr` (for example `127.0.0.1:0`) from one thread.
///
/// # Errors
/// [`MetaError::Io`] when the address cannot be bound or the thread not
/// created.
pub fn serve_bootstrap_tcp(
    addr: impl ToSocketAddrs,
    b: &BootstrapRepr,
) -> MetaResult<TcpBootstrap> {
    let io = |op| move |source| MetaError::Io { op, source };
    let listener = TcpListener::bind(addr).map_err(io("bind the TCP bootstrap"))?;
    listener
        .set_nonblocking(true)
        .map_err(io("configure the TCP bootstrap"))?;
    let local = listener
        .local_addr()
        .map_err(io("configure the TCP bootstrap"))?;
    let bytes = encode(b);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("krcore-meta-tcp".into())
        .spawn(move || {
            while !flag.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((s, _)) => answer(s, &bytes),
                    // WouldBlock (idle) or a failed accept: wait, retry.
                    Err(_) => std::thread::sleep(ACCEPT_POLL),
                }
            }
        })
        .map_err(io("spawn the TCP bootstrap thread"))?;
    Ok(TcpBootstrap {
        addr: local,
        stop,
        thread: Some(thread),
    })
}

/// Writes the bytes to one connection; failures only affect that client.
fn answer(mut s: TcpStream, bytes: &[u8]) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// Fetches a bootstrap from a [`serve_bootstrap_tcp`] listener, waiting at
/// most `timeout` to connect (per resolved address) and `timeout` for the
/// bytes.
///
/// # Errors
/// [`MetaError::Io`] when no address connects or the read fails or times
/// out; the errors of [`decode`].
pub fn fetch_bootstrap_tcp(
    addr: impl ToSocketAddrs,
    timeout: Duration,
) -> MetaResult<BootstrapRepr> {
    let io = |op| move |source| MetaError::Io { op, source };
    let mut last = None;
    for a in addr
        .to_socket_addrs()
        .map_err(io("resolve the TCP bootstrap address"))?
    {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(mut s) => {
                s.set_read_timeout(Some(timeout))
                    .map_err(io("configure the TCP bootstrap connection"))?;
                let mut bytes = Vec::with_capacity(MAX_MESSAGE_LEN);
                (&mut s)
                    .take(4 * MAX_MESSAGE_LEN as u64)
                    .read_to_end(&mut bytes)
                    .map_err(io("read the TCP bootstrap"))?;
                return decode(&bytes);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(MetaError::Io {
        op: "connect to the TCP bootstrap",
        source: last.unwrap_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the address resolved to nothing",
            )
        }),
    })
}
