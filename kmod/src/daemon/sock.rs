//! Frames over the daemon's unix stream socket, with descriptors passed as
//! `SCM_RIGHTS` on a reply's first byte (see [`super::wire`]).

use super::wire::{frame_len_within, WireError};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// The most descriptors one reply carries.
pub(crate) const MAX_FDS: usize = 2;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecvError {
    /// The other side closed the socket (at a frame boundary).
    #[error("the other side closed the socket")]
    Closed,
    /// The socket failed (or closed inside a frame).
    #[error("socket I/O")]
    Io(#[source] std::io::Error),
    /// The frame is malformed.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// Sends `frame` with `fds` attached to its first byte.
pub(crate) fn send(sock: &UnixStream, frame: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    if fds.is_empty() {
        let mut s = sock;
        return s.write_all(frame);
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !cmsg.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors for one frame"));
    }
    let n = sendmsg(sock, &[IoSlice::new(frame)], &mut cmsg, SendFlags::NOSIGNAL)?;
    let mut s = sock;
    s.write_all(&frame[n..])
}

/// Reads one frame of at most `max` body bytes: its body and the
/// descriptors that came with it.
pub(crate) fn recv(sock: &UnixStream, max: usize) -> Result<(Vec<u8>, Vec<OwnedFd>), RecvError> {
    let mut prefix = [0u8; 4];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut prefix)],
            &mut cmsg,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(RecvError::Io(e.into())),
        }
    };
    let mut fds = Vec::new();
    for msg in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = msg {
            fds.extend(it);
        }
    }
    if got == 0 {
        return Err(RecvError::Closed);
    }
    let mut s = sock;
    s.read_exact(&mut prefix[got..]).map_err(RecvError::Io)?;
    let len = frame_len_within(prefix, max)?;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).map_err(RecvError::Io)?;
    Ok((body, fds))
}
