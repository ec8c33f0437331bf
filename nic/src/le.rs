//! Little-endian fields in byte buffers: the one helper every checked view
//! over remote (or shared) bytes uses, in every crate of the workspace (the
//! meta table's entries and requests, the engine's messaging and handshake
//! packets, RACE's layouts).
//!
//! The contract, for all of them: **no panic, whatever the offset**. A view
//! checks its buffer's length once, when it is made (`new_checked` in the
//! smoltcp `wire` style); after that its accessors read with these
//! functions, which return zeros for a range outside the buffer (only a
//! buffer whose `AsRef` lies about its length between calls can get there),
//! and its writers get `false` back, with nothing written, instead of a
//! panic. Offsets are byte offsets; the range read or written is
//! `at..at + N`, never wrapping.

/// The `N` bytes at `at`, or zeros if `at..at + N` is not inside `buf`.
#[inline]
pub fn read_array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    at.checked_add(N)
        .and_then(|end| buf.get(at..end))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .unwrap_or([0; N])
}

/// Writes `bytes` at `at`; `false` (nothing written) if `at..at + N` is not
/// inside `buf`.
#[inline]
pub fn write_array<const N: usize>(buf: &mut [u8], at: usize, bytes: [u8; N]) -> bool {
    write_bytes(buf, at, &bytes)
}

/// Writes `bytes` at `at`; `false` (nothing written) if they do not fit
/// inside `buf` there.
#[inline]
pub fn write_bytes(buf: &mut [u8], at: usize, bytes: &[u8]) -> bool {
    match at
        .checked_add(bytes.len())
        .and_then(|end| buf.get_mut(at..end))
    {
        Some(dst) => {
            dst.copy_from_slice(bytes);
            true
        }
        None => false,
    }
}

/// The little-endian `u16` at `at` (0 out of range).
#[inline]
pub fn read_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(read_array(buf, at))
}

/// The little-endian `u32` at `at` (0 out of range).
#[inline]
pub fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(read_array(buf, at))
}

/// The little-endian `u64` at `at` (0 out of range).
#[inline]
pub fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(read_array(buf, at))
}

/// The 16-byte GID at `at` (all zeros out of range).
#[inline]
pub fn read_gid(buf: &[u8], at: usize) -> crate::Gid {
    crate::Gid(read_array(buf, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_never_panic_out_of_range() {
        let buf = [1u8, 2, 3];
        assert_eq!(read_u16(&buf, 1), 0x0302);
        assert_eq!(read_u16(&buf, 2), 0);
        assert_eq!(read_u32(&buf, 0), 0);
        assert_eq!(read_u64(&buf, usize::MAX), 0);
        assert_eq!(read_gid(&buf, 0), crate::Gid([0; 16]));
        let mut out = [0u8; 4];
        assert!(write_array(&mut out, 0, [9u8; 4]));
        assert_eq!(out, [9; 4]);
        assert!(!write_array(&mut out, 1, [7u8; 4]));
        assert!(!write_array(&mut out, usize::MAX - 1, [7u8; 4]));
        assert!(!write_bytes(&mut out, 3, &[7, 7]));
        assert_eq!(out, [9; 4], "a refused write writes nothing");
        assert!(write_bytes(&mut out, 2, &[5, 6]));
        assert_eq!(read_u16(&out, 2), 0x0605);
    }
}
