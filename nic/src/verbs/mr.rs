//! Protection domains and memory regions.
//!
//! `alloc_mr` maps anonymous, page-aligned, zeroed memory that the region
//! owns (unmapped after deregistration); `register_mr` registers caller
//! memory under the caller's `# Safety` contract.

use super::device::DeviceInner;
use super::error::VerbsError;
use super::ffi::{self, sys};
use crate::error::{NicError, Result};
use crate::provider::{check_range, MemoryRegion};
use crate::types::Access;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Owner of an `ibv_pd`.
pub(crate) struct PdInner {
    pub pd: *mut sys::ibv_pd,
    pub dev: Arc<DeviceInner>,
}

// SAFETY: a PD is only passed to thread-safe libibverbs calls.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: `pd` came from `ibv_alloc_pd`; every MR/QP/SRQ/AH made in
        // it holds an `Arc` to this struct, so none is left.
        unsafe { sys::ibv_dealloc_pd(self.pd) };
    }
}

/// A protection domain of a verbs device.
#[derive(Clone)]
pub struct VerbsPd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for VerbsPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: reading the handle field of our live PD.
        let handle = unsafe { (*self.inner.pd).handle };
        f.debug_struct("VerbsPd").field("handle", &handle).finish()
    }
}

impl VerbsPd {
    pub(crate) fn alloc(dev: &Arc<DeviceInner>) -> Result<VerbsPd> {
        // SAFETY: valid context.
        let pd = unsafe { sys::ibv_alloc_pd(dev.ctx()) };
        if pd.is_null() {
            return Err(VerbsError::from_os("ibv_alloc_pd", ffi::errno()).into());
        }
        Ok(VerbsPd {
            inner: Arc::new(PdInner {
                pd,
                dev: dev.clone(),
            }),
        })
    }

    pub(crate) fn check_device(&self, dev: &Arc<DeviceInner>) -> Result<()> {
        if Arc::ptr_eq(&self.inner.dev, dev) {
            Ok(())
        } else {
            Err(NicError::InvalidArgument(
                "protection domain of another device".into(),
            ))
        }
    }
}

/// Anonymous memory owned by a region, unmapped on drop.
pub(crate) struct PageBuf {
    ptr: *mut u8,
    len: usize,
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is a mapping we made and unmap once, after
        // the region using it was deregistered (field drop order).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Owner of an `ibv_mr` (and, for `alloc_mr`, of its memory).
pub(crate) struct MrInner {
    mr: *mut sys::ibv_mr,
    addr: *mut u8,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: Access,
    /// Dropped after `mr` is deregistered (declared after it).
    _buf: Option<PageBuf>,
    /// A sub-region's parent (which owns or holds the memory), released
    /// after this registration.
    _parent: Option<Arc<MrInner>>,
    _pd: Arc<PdInner>,
}

// SAFETY: the MR handle is only passed to `ibv_dereg_mr`; the memory is
// accessed through raw copies and atomics that the trait documents as racy
// with the NIC, never through references.
unsafe impl Send for MrInner {}
// SAFETY: as above.
unsafe impl Sync for MrInner {}

impl Drop for MrInner {
    fn drop(&mut self) {
        // SAFETY: `mr` came from `ibv_reg_mr` and is deregistered once.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

/// A registered memory region of a verbs device. Dropping the last clone
/// deregisters it (its keys go stale: remote use fails with
/// `REM_ACCESS_ERR`) and frees memory it allocated.
#[derive(Clone)]
pub struct VerbsMr {
    inner: Arc<MrInner>,
}

impl std::fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsMr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.inner.len)
            .field("lkey", &format_args!("{:#x}", self.inner.lkey))
            .field("rkey", &format_args!("{:#x}", self.inner.rkey))
            .finish()
    }
}

pub(crate) fn check_len(dev: &DeviceInner, len: usize) -> Result<()> {
    if len == 0 {
        return Err(NicError::InvalidArgument(
            "zero-length memory region".into(),
        ));
    }
    if len as u64 > dev.caps.max_mr_size {
        return Err(NicError::MrTooLarge {
            requested: len as u64,
            limit: dev.caps.max_mr_size,
        });
    }
    Ok(())
}

impl VerbsMr {
    /// Maps `len` zeroed bytes (rounded up to pages) and registers `len` of
    /// them (so bounds checks by the NIC are exact).
    pub(crate) fn alloc(pd: &VerbsPd, len: usize, access: Access) -> Result<VerbsMr> {
        check_len(&pd.inner.dev, len)?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let map_len =
            len.checked_add(page - 1)
                .map(|l| l / page * page)
                .ok_or(NicError::MrTooLarge {
                    requested: len as u64,
                    limit: pd.inner.dev.caps.max_mr_size,
                })?;
        // SAFETY: an anonymous private mapping with no address hint; the
        // result is checked below and owned by `PageBuf`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(VerbsError::from_os("mmap for a memory region", ffi::errno()).into());
        }
        let buf = PageBuf {
            ptr: p.cast(),
            len: map_len,
        };
        // SAFETY: `buf` owns `ptr..ptr+map_len` (>= len) and moves into the
        // region, so the memory lives exactly as long as the registration.
        unsafe { Self::register(pd, buf.ptr, len, access, Some(buf)) }
    }

    /// [`crate::Nic::alloc_shared_mr`]: a memfd of `len` bytes (rounded up
    /// to pages) mapped shared here and registered; the region owns the
    /// mapping, the returned file maps the same pages elsewhere.
    pub(crate) fn alloc_shared(
        pd: &VerbsPd,
        len: usize,
        access: Access,
    ) -> Result<(VerbsMr, std::fs::File)> {
        use std::os::fd::AsRawFd;
        check_len(&pd.inner.dev, len)?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let map_len = len.div_ceil(page) * page;
        let file = crate::shared::memfd("krcore-mr", map_len)?;
        // SAFETY: a shared mapping of a file we hold (sealed against
        // shrinking, so every page stays backed), no address hint; checked
        // below and owned by `PageBuf`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(VerbsError::from_os("mmap a shared memory region", ffi::errno()).into());
        }
        let buf = PageBuf {
            ptr: p.cast(),
            len: map_len,
        };
        // SAFETY: `buf` owns `ptr..ptr+map_len` (>= len) and moves into the
        // region, so the mapping lives exactly as long as the registration.
        let mr = unsafe { Self::register(pd, buf.ptr, len, access, Some(buf)) }?;
        Ok((mr, file))
    }

    /// Registers `ptr..ptr+len`.
    ///
    /// # Safety
    /// The memory must stay valid (and not be accessed through Rust
    /// references) for as long as the returned region lives; when `buf` is
    /// given it owns that memory.
    pub(crate) unsafe fn register(
        pd: &VerbsPd,
        ptr: *mut u8,
        len: usize,
        access: Access,
        buf: Option<PageBuf>,
    ) -> Result<VerbsMr> {
        // SAFETY: this function's contract, forwarded.
        unsafe { Self::register_in(pd, ptr, len, access, buf, None) }
    }

    /// [`VerbsMr::register`], holding `parent` (a sub-region's).
    ///
    /// # Safety
    /// As [`VerbsMr::register`].
    unsafe fn register_in(
        pd: &VerbsPd,
        ptr: *mut u8,
        len: usize,
        access: Access,
        buf: Option<PageBuf>,
        parent: Option<Arc<MrInner>>,
    ) -> Result<VerbsMr> {
        // SAFETY: `pd` is live; the memory range is valid per this
        // function's contract; the access flags are plain bits.
        let mr = unsafe {
            sys::ibv_reg_mr(
                pd.inner.pd,
                ptr.cast(),
                len,
                ffi::access_flags(access) as i32,
            )
        };
        if mr.is_null() {
            return Err(VerbsError::pinning("ibv_reg_mr", len as u64, ffi::errno()).into());
        }
        // SAFETY: `mr` is a valid registration returned just above.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        pd.inner
            .dev
            .counters
            .mrs_registered
            .fetch_add(1, Ordering::Relaxed);
        Ok(VerbsMr {
            inner: Arc::new(MrInner {
                mr,
                addr: ptr,
                len,
                lkey,
                rkey,
                access,
                _buf: buf,
                _parent: parent,
                _pd: pd.inner.clone(),
            }),
        })
    }

    /// [`crate::Nic::register_sub_mr`] (arguments checked): `ibv_reg_mr`
    /// over `offset..offset+len` of this region, in its PD, holding this
    /// region (and so its memory) until the sub-region is deregistered.
    pub(crate) fn register_sub(
        &self,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<VerbsMr> {
        let pd = VerbsPd {
            inner: self.inner._pd.clone(),
        };
        // SAFETY: `offset..offset+len` lies inside this live region
        // (checked by the caller); the sub-region holds this region, whose
        // memory stays mapped until after both are deregistered.
        unsafe {
            Self::register_in(
                &pd,
                self.inner.addr.add(offset),
                len,
                access,
                None,
                Some(self.inner.clone()),
            )
        }
    }

    /// Whether this region belongs to the device `dev`.
    pub(crate) fn check_device(&self, dev: &Arc<DeviceInner>) -> Result<()> {
        VerbsPd {
            inner: self.inner._pd.clone(),
        }
        .check_device(dev)
    }

    /// A pointer to the 8-byte aligned word at `offset`.
    fn word(&self, offset: usize) -> Result<*mut u64> {
        check_range(self.inner.len, offset, 8)?;
        let addr = self.inner.addr as usize + offset;
        if addr % 8 != 0 {
            return Err(NicError::InvalidArgument(format!(
                "offset {offset} is not 8-byte aligned"
            )));
        }
        Ok(addr as *mut u64)
    }
}

impl MemoryRegion for VerbsMr {
    fn addr(&self) -> u64 {
        self.inner.addr as u64
    }
    fn len(&self) -> usize {
        self.inner.len
    }
    fn lkey(&self) -> u32 {
        self.inner.lkey
    }
    fn rkey(&self) -> u32 {
        self.inner.rkey
    }
    fn access(&self) -> Access {
        self.inner.access
    }

    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        check_range(self.inner.len, offset, buf.len())?;
        // SAFETY: the range is inside the live region (checked); `buf` is a
        // distinct Rust buffer. The NIC may write concurrently: the copy is
        // of bytes (no invariant to break), as the trait documents.
        unsafe {
            std::ptr::copy_nonoverlapping(self.inner.addr.add(offset), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(self.inner.len, offset, data.len())?;
        // SAFETY: as in `read`, in the other direction.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.inner.addr.add(offset), data.len())
        };
        Ok(())
    }

    fn load_u64(&self, offset: usize) -> Result<u64> {
        let p = self.word(offset)?;
        // SAFETY: `p` is 8-byte aligned inside the live region, and all
        // accesses to it from this process are atomic or NIC DMA.
        Ok(unsafe { AtomicU64::from_ptr(p) }.load(Ordering::Acquire))
    }

    fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        let p = self.word(offset)?;
        // SAFETY: as in `load_u64`.
        unsafe { AtomicU64::from_ptr(p) }.store(value, Ordering::Release);
        Ok(())
    }
}
