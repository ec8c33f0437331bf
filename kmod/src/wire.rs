//! What the crate's checked views over remote bytes share
//! ([`crate::handshake::HandshakePacket`], [`crate::msg::MsgPacket`]; the
//! smoltcp `wire` pattern): one check of the length and the magic when the
//! view is made, then accessors that cannot panic (the workspace's one
//! little-endian helper, `krcore_nic::le`, underneath).

use std::ops::Range;

/// Checks `buf` once for a view: at least `min_len` bytes, and the
/// little-endian `u32` at `magic_at` equal to `magic`. The errors are the
/// layout's own: `truncated(len)`, `bad_magic(found)`.
///
/// # Errors
/// `truncated` for a short buffer, `bad_magic` for another magic.
pub(crate) fn check<E>(
    buf: &[u8],
    (min_len, magic_at, magic): (usize, Range<usize>, u32),
    truncated: impl FnOnce(usize) -> E,
    bad_magic: impl FnOnce(u32) -> E,
) -> Result<(), E> {
    if buf.len() < min_len {
        return Err(truncated(buf.len()));
    }
    match krcore_nic::le::read_u32(buf, magic_at.start) {
        m if m == magic => Ok(()),
        m => Err(bad_magic(m)),
    }
}

/// The `K` bytes of `buf` at the field `r` (`K` bytes long); zeros when
/// they are not inside `buf` (a view checked its length once: its
/// accessors never panic).
#[inline]
pub(crate) fn array<const K: usize>(buf: &[u8], r: Range<usize>) -> [u8; K] {
    debug_assert_eq!(r.len(), K, "a field of {K} bytes");
    krcore_nic::le::read_array(buf, r.start)
}
