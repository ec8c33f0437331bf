//! Memory two processes map: a node daemon and the processes attached to
//! it (see `krcore_kmod::daemon`).
//!
//! A [`SharedMap`] is a shared mapping of a file (a memfd made here, or a
//! file another process sent over a unix socket). As with a memory region,
//! the other side (the daemon, the NIC, a peer) may write the bytes at any
//! time, so they are never exposed as `&[u8]`: every access is a checked,
//! copying or atomic accessor (the sim's `Segment` underneath, with its
//! invariants: the mapping lives as long as the value, and is never
//! truncated by this crate).
//!
//! [`memfd`] makes the file: anonymous, sealed against shrinking so that a
//! process that maps it never meets a SIGBUS because the other side
//! truncated it.

use crate::error::{NicError, Result};
use crate::sim::shm::Segment;
use std::fs::File;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Bytes shared with another process through a file mapping.
pub struct SharedMap {
    seg: Segment,
}

impl std::fmt::Debug for SharedMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMap")
            .field("len", &self.seg.len())
            .finish()
    }
}

/// An anonymous file of `len` zero bytes (`memfd_create`, close-on-exec),
/// sealed against shrinking and further sealing: a peer may map it for its
/// whole length for as long as it holds it.
///
/// # Errors
/// [`NicError::InvalidArgument`] for a zero length; [`NicError::Os`] when
/// the kernel refuses (no memory, too many files).
pub fn memfd(name: &str, len: usize) -> Result<File> {
    if len == 0 {
        return Err(NicError::InvalidArgument(
            "zero-length shared memory".into(),
        ));
    }
    let file = memfd_create(name)?;
    file.set_len(len as u64).map_err(|source| NicError::Os {
        op: "size a memfd",
        source,
    })?;
    seal(&file)?;
    Ok(file)
}

#[allow(unsafe_code)]
fn memfd_create(name: &str) -> Result<File> {
    use std::os::fd::FromRawFd;
    let cname = std::ffi::CString::new(name.replace('\0', "_"))
        .map_err(|_| NicError::InvalidArgument("memfd name".into()))?;
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the
    // call; the flags are plain bits.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(NicError::Os {
            op: "memfd_create",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a new descriptor this process owns and nothing else
    // refers to: the File takes it over (and closes it).
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[allow(unsafe_code)]
fn seal(file: &File) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_ADD_SEALS on a descriptor we own, with plain flag bits.
    let r = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        )
    };
    if r < 0 {
        return Err(NicError::Os {
            op: "seal a memfd",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

impl SharedMap {
    /// A new anonymous shared file of `len` zero bytes ([`memfd`]) and its
    /// mapping: the file is what the other process maps.
    ///
    /// # Errors
    /// As [`memfd`], or the mapping's.
    pub fn create(name: &str, len: usize) -> Result<(SharedMap, File)> {
        let file = memfd(name, len)?;
        let map = SharedMap::map(&file, len)?;
        Ok((map, file))
    }

    /// Maps the first `len` bytes of `file` (which another process made).
    ///
    /// # Errors
    /// [`NicError::InvalidArgument`] when the file is shorter than `len`
    /// (mapping past its end would raise SIGBUS on access) or `len` is 0;
    /// the mapping's errors.
    pub fn map(file: &File, len: usize) -> Result<SharedMap> {
        let have = file
            .metadata()
            .map_err(|source| NicError::Os {
                op: "stat a shared file",
                source,
            })?
            .len();
        if len == 0 || have < len as u64 {
            return Err(NicError::InvalidArgument(format!(
                "shared file of {have} bytes, {len} expected"
            )));
        }
        Ok(SharedMap {
            seg: Segment::map_file(file, len)?,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.seg.len()
    }

    /// Never true: a mapping has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.seg.len() == 0
    }

    /// Copies `buf.len()` bytes at `offset` out.
    ///
    /// # Errors
    /// A range error for bytes outside the mapping.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.seg.copy_out(offset, buf)
    }

    /// Copies `data` in at `offset`.
    ///
    /// # Errors
    /// Range errors.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.seg.copy_in(offset, data)
    }

    /// Faults `offset..offset + len` in without changing it (as
    /// [`crate::MemoryRegion::prefault`] does for sim memory): the pages
    /// are the file's, so the other side's mapping finds them allocated
    /// and zeroed too.
    ///
    /// # Errors
    /// A range error for bytes outside the mapping.
    pub fn prefault(&self, offset: usize, len: usize) -> Result<()> {
        self.seg.prefault(offset, len)
    }

    /// The 8-byte word at `offset` (8-byte aligned, in range).
    ///
    /// # Errors
    /// Range or alignment errors.
    #[inline]
    pub fn word(&self, offset: usize) -> Result<&AtomicU64> {
        self.seg.u64_at(offset)
    }

    /// The 4-byte word at `offset` (4-byte aligned, in range), for a futex:
    /// bytes the users of the map access only through this view.
    ///
    /// # Errors
    /// Range or alignment errors.
    #[inline]
    pub fn word32(&self, offset: usize) -> Result<&AtomicU32> {
        self.seg.u32_at(offset)
    }

    /// The `n` 8-byte words from `offset` (8-byte aligned, in range),
    /// checked once.
    ///
    /// # Errors
    /// Range or alignment errors.
    #[inline]
    pub fn words(&self, offset: usize, n: usize) -> Result<&[AtomicU64]> {
        self.seg.u64s_at(offset, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimConfig, SimFabric, SimNic};
    use crate::{Access, MemoryRegion, Nic};

    fn same_bytes(fabric: &SimFabric) {
        let nic = SimNic::open(fabric, SimConfig::default()).unwrap();
        let pd = nic.alloc_pd().unwrap();
        let (mr, file) = nic.alloc_shared_mr(&pd, 4096, Access::ALL).unwrap();
        let map = SharedMap::map(&file, 4096).unwrap();
        mr.write(0, b"from the region").unwrap();
        let mut got = [0u8; 15];
        map.read(0, &mut got).unwrap();
        assert_eq!(&got, b"from the region");
        map.word(64)
            .unwrap()
            .store(7, std::sync::atomic::Ordering::Release);
        assert_eq!(mr.load_u64(64).unwrap(), 7);
        // The file is as long as the region; asking for more is refused.
        assert!(SharedMap::map(&file, 8192).is_err());
        assert!(map.read(4090, &mut got).is_err());
        // A run of words is checked once, whole: the last 8 words are
        // there, 9 from the same place are not, nor a misaligned start.
        let words = map.words(4096 - 64, 8).unwrap();
        words[7].store(9, std::sync::atomic::Ordering::Release);
        assert_eq!(mr.load_u64(4088).unwrap(), 9);
        assert!(map.words(4096 - 64, 9).is_err());
        assert!(map.words(4, 1).is_err());
        assert!(map.words(0, usize::MAX).is_err());
        assert!(map.words(4096, 0).unwrap().is_empty());
    }

    #[test]
    fn a_shared_region_and_its_file_are_the_same_bytes() {
        same_bytes(&SimFabric::in_memory());
        let dir = tempfile::tempdir().unwrap();
        same_bytes(&SimFabric::open_dir(dir.path().join("f"), true).unwrap());
    }

    #[test]
    fn a_memfd_cannot_shrink_under_its_mappers() {
        let (map, file) = SharedMap::create("t", 8192).unwrap();
        assert!(file.set_len(4096).is_err());
        assert_eq!(map.len(), 8192);
        assert!(matches!(memfd("t", 0), Err(NicError::InvalidArgument(_))));
    }
}
