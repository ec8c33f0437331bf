//! Shared-memory segments: the only module of `sim` with `unsafe` code.
//!
//! A [`Segment`] is a mapping of bytes that other threads or processes may read
//! and write concurrently, exactly like memory a NIC can DMA into. It is never
//! exposed as `&[u8]`/`&mut [u8]` (that would promise no concurrent writer);
//! every access goes through a bounds-checked accessor that uses atomic
//! operations, so racy accesses are defined behaviour (relaxed atomics compile
//! to plain moves on x86-64 and aarch64).
//!
//! Invariants:
//! - `base` is page aligned (mmap) or caller memory the caller vouched for, and
//!   stays mapped for the lifetime of the `Segment` (the mapping is owned, or
//!   the caller promised it under `unsafe` in [`Segment::borrowed`]).
//! - Segments are never truncated or remapped: a file-backed segment that is
//!   removed from the fabric is only unlinked, so existing mappings in other
//!   processes stay valid (no SIGBUS).
#![allow(unsafe_code)]

use crate::error::{NicError, Result};
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

enum Backing {
    Map(memmap2::MmapRaw),
    Anon(memmap2::MmapMut),
    Borrowed,
}

/// A byte range shared with the (simulated) NIC and with other processes.
pub struct Segment {
    base: *mut u8,
    len: usize,
    _backing: Backing,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: a Segment is a pointer to memory that is valid for the Segment's
// lifetime (see the module invariants) and is only accessed through atomic
// operations, which are safe to perform from any thread.
unsafe impl Send for Segment {}
// SAFETY: as above: all access through `&Segment` is atomic.
unsafe impl Sync for Segment {}

fn os(op: &'static str) -> impl FnOnce(std::io::Error) -> NicError {
    move |source| NicError::Os { op, source }
}

/// Anonymous segments from this size on ask for transparent huge pages.
const HUGE_PAGE_MIN: usize = 4 << 20;

impl Segment {
    /// Zeroed private memory of `len` bytes (anonymous mapping, lazily backed).
    pub fn anon(len: usize) -> Result<Segment> {
        let mut map = memmap2::MmapOptions::new()
            .len(len.max(1))
            .map_anon()
            .map_err(os("mmap anonymous"))?;
        if len >= HUGE_PAGE_MIN {
            // Large regions (memory nodes' tables) are read at random
            // offsets: transparent huge pages spare most TLB misses. Only a
            // hint; the kernel may ignore it.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let base = map.as_mut_ptr();
        Ok(Segment {
            base,
            len,
            _backing: Backing::Anon(map),
        })
    }

    /// Creates a new file of `len` zero bytes at `path` (fails if it exists) and
    /// maps it shared.
    pub fn create_file(path: &Path, len: usize) -> Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(os("create segment file"))?;
        file.set_len(len.max(1) as u64)
            .map_err(os("size segment file"))?;
        Self::map_file(&file, len)
    }

    /// Maps an existing segment file shared.
    pub fn open_file(path: &Path) -> Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(os("open segment file"))?;
        let len = file.metadata().map_err(os("stat segment file"))?.len() as usize;
        Self::map_file(&file, len)
    }

    /// Maps `len` bytes of `file` shared (the file is at least that long).
    pub(crate) fn map_file(file: &File, len: usize) -> Result<Segment> {
        let map = memmap2::MmapOptions::new()
            .len(len.max(1))
            .map_raw(file)
            .map_err(os("mmap segment file"))?;
        let base = map.as_mut_ptr();
        Ok(Segment {
            base,
            len,
            _backing: Backing::Map(map),
        })
    }

    /// Wraps caller memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes for the lifetime of
    /// the returned segment, and must not be accessed through Rust references
    /// while the segment may write it.
    pub unsafe fn borrowed(ptr: *mut u8, len: usize) -> Segment {
        Segment {
            base: ptr,
            len,
            _backing: Backing::Borrowed,
        }
    }

    /// Address of the first byte in this process.
    pub fn addr(&self) -> u64 {
        self.base as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        crate::provider::check_range(self.len, off, len)
    }

    /// The 8-byte word at `off` as an atomic.
    ///
    /// # Errors
    /// `InvalidArgument` when `off` is misaligned or out of bounds.
    #[inline]
    pub fn u64_at(&self, off: usize) -> Result<&AtomicU64> {
        self.check(off, 8)?;
        if (self.base as usize + off) % 8 != 0 {
            return Err(NicError::InvalidArgument(format!(
                "offset {off} is not 8-byte aligned"
            )));
        }
        // SAFETY: `off..off+8` is in bounds (checked above) of memory that is
        // valid for the lifetime of `self` (module invariant), the address is
        // 8-byte aligned (checked), and AtomicU64 has the size and alignment
        // of u64. All accesses to this memory are atomic (module invariant).
        Ok(unsafe { &*(self.base.add(off) as *const AtomicU64) })
    }

    /// The 4-byte word at `off` as an atomic (a futex word: memory that is
    /// only ever accessed as this one 4-byte atomic, never as part of an
    /// 8-byte word).
    ///
    /// # Errors
    /// `InvalidArgument` when `off` is misaligned or out of bounds.
    #[inline]
    pub fn u32_at(&self, off: usize) -> Result<&AtomicU32> {
        self.check(off, 4)?;
        if (self.base as usize + off) % 4 != 0 {
            return Err(NicError::InvalidArgument(format!(
                "offset {off} is not 4-byte aligned"
            )));
        }
        // SAFETY: `off..off+4` is in bounds (checked above) of memory that is
        // valid for the lifetime of `self` (module invariant), the address is
        // 4-byte aligned (checked), and AtomicU32 has the size and alignment
        // of u32. All accesses to this memory are atomic (module invariant);
        // the caller accesses these bytes only through this 4-byte view.
        Ok(unsafe { &*(self.base.add(off) as *const AtomicU32) })
    }

    /// The `n` 8-byte words from `off` as atomics, checked once.
    ///
    /// # Errors
    /// `InvalidArgument` when `off` is misaligned or the words run out of
    /// bounds.
    #[inline]
    pub fn u64s_at(&self, off: usize, n: usize) -> Result<&[AtomicU64]> {
        let bytes = n
            .checked_mul(8)
            .ok_or_else(|| NicError::InvalidArgument(format!("{n} words overflow")))?;
        self.check(off, bytes)?;
        if (self.base as usize + off) % 8 != 0 {
            return Err(NicError::InvalidArgument(format!(
                "offset {off} is not 8-byte aligned"
            )));
        }
        // SAFETY: `off..off + 8n` is in bounds (checked above) of memory
        // valid for the lifetime of `self` (module invariant), the start is
        // 8-byte aligned (checked), so every element is; AtomicU64 has the
        // size and alignment of u64, and all accesses to this memory are
        // atomic (module invariant).
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(off) as *const AtomicU64, n) })
    }

    /// The 8-byte word at `off`, for offsets the caller computed from a fixed
    /// layout. Panics on a misaligned or out-of-bounds offset, which would be a
    /// bug in the sim's own table layout, never a consequence of user input.
    #[inline]
    pub fn word(&self, off: usize) -> &AtomicU64 {
        let addr = self.base as usize + off;
        if off.checked_add(8).is_none_or(|e| e > self.len) || addr % 8 != 0 {
            layout_bug(off, self.len);
        }
        // SAFETY: in bounds and aligned (checked above) in memory valid for
        // the lifetime of `self`; AtomicU64 has the layout of u64.
        unsafe { &*(addr as *const AtomicU64) }
    }

    /// The `n` consecutive 8-byte words at `off`, for offsets the caller
    /// computed from a fixed layout (a ring cell): one bounds and alignment
    /// check for all of them. Panics like [`Segment::word`] on a bad range,
    /// which would be a bug in the sim's own layout.
    #[inline]
    pub fn words(&self, off: usize, n: usize) -> &[AtomicU64] {
        let addr = self.base as usize + off;
        let bytes = n.checked_mul(8);
        if bytes
            .and_then(|b| off.checked_add(b))
            .is_none_or(|e| e > self.len)
            || addr % 8 != 0
        {
            layout_bug(off, self.len);
        }
        // SAFETY: `off..off + 8n` is in bounds and the start is 8-byte
        // aligned (checked above), in memory valid for the lifetime of
        // `self`; AtomicU64 has the size and alignment of u64, so `n`
        // consecutive words form a valid `[AtomicU64]`. All accesses to this
        // memory are atomic (module invariant).
        unsafe { std::slice::from_raw_parts(addr as *const AtomicU64, n) }
    }

    /// The `N` consecutive 8-byte words at `off` as an array (a fixed
    /// header: constant indices need no further checks). Panics like
    /// [`Segment::word`] on a bad range, a bug in the sim's own layout.
    #[inline]
    pub fn words_array<const N: usize>(&self, off: usize) -> &[AtomicU64; N] {
        let addr = self.base as usize + off;
        if off.checked_add(N * 8).is_none_or(|e| e > self.len) || addr % 8 != 0 {
            layout_bug(off, self.len);
        }
        // SAFETY: `off..off + 8N` is in bounds and the start is 8-byte
        // aligned (checked above), in memory valid for the lifetime of
        // `self`; `[AtomicU64; N]` has the layout of `[u64; N]`. All accesses
        // to this memory are atomic (module invariant).
        unsafe { &*(addr as *const [AtomicU64; N]) }
    }

    /// The word at `off` where the caller has already checked that
    /// `off..off+8` is in bounds and `base + off` is 8-byte aligned.
    #[inline]
    fn word_unchecked(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.len && (self.base as usize + off) % 8 == 0);
        // SAFETY: callers guarantee bounds and alignment (see above); the
        // memory is valid for the lifetime of `self`.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    #[inline]
    fn byte(&self, off: usize) -> &AtomicU8 {
        // SAFETY: callers check `off < self.len`; the memory is valid for the
        // lifetime of `self` and AtomicU8 has the layout of u8.
        unsafe { &*(self.base.add(off) as *const AtomicU8) }
    }

    /// Hints that `off..off + len` will be accessed soon: starts loading its
    /// cache lines (clipped to the segment). No effect on the contents,
    /// never faults.
    #[inline]
    pub fn prefetch(&self, off: usize, len: usize) {
        let end = off.saturating_add(len).min(self.len);
        let mut line = off & !63;
        while line < end {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: PREFETCHT0 is a hint: it never faults and changes no
            // memory, whatever the address (here one inside the mapping,
            // `line < self.len`; `wrapping_add` needs no in-bounds promise).
            // SSE is part of the x86-64 baseline.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    self.base.wrapping_add(line) as *const i8,
                );
            }
            line += 64;
        }
    }

    /// Faults the pages of `off..off + len` in, writable, without changing a
    /// byte of them: what registering memory with a NIC does to it at once
    /// (pinning), done here on demand because sim memory is backed lazily.
    /// The first WRITE to a page that is not in costs the writer the
    /// kernel's zeroing of it (2 MiB at once for a transparent huge page),
    /// inside whatever operation touched it.
    ///
    /// Uses `MADV_POPULATE_WRITE` on mappings the segment owns, and where
    /// the kernel refuses it (before Linux 5.14) or the memory is borrowed,
    /// an atomic `fetch_or(0)` on one word of each page: a write that
    /// leaves the word as any concurrent writer left it.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the segment.
    pub fn prefault(&self, off: usize, len: usize) -> Result<()> {
        self.check(off, len)?;
        if len == 0 {
            return Ok(());
        }
        let advised = match &self._backing {
            Backing::Anon(m) => m
                .advise_range(memmap2::Advice::PopulateWrite, off, len)
                .is_ok(),
            Backing::Map(m) => m
                .advise_range(memmap2::Advice::PopulateWrite, off, len)
                .is_ok(),
            Backing::Borrowed => false,
        };
        if advised {
            return Ok(());
        }
        const PAGE: usize = 4096;
        let end = off + len;
        let base = self.base as usize;
        // The first aligned word of each page that the range touches.
        let mut page = (base + off) & !(PAGE - 1);
        while page < base + end {
            let word = page.max(base + off).next_multiple_of(8);
            if word + 8 <= base + end {
                self.word(word - base).fetch_or(0, Ordering::Relaxed);
            }
            page += PAGE;
        }
        Ok(())
    }

    /// Copies `buf.len()` bytes at `off` out of the segment.
    pub fn copy_out(&self, off: usize, buf: &mut [u8]) -> Result<()> {
        self.check(off, buf.len())?;
        let mut i = 0;
        let n = buf.len();
        while i < n && (self.base as usize + off + i) % 8 != 0 {
            buf[i] = self.byte(off + i).load(Ordering::Relaxed);
            i += 1;
        }
        // Aligned words: exact 8-byte chunks of `buf` (no per-word slice
        // bounds checks).
        let mut chunks = buf[i..].chunks_exact_mut(8);
        for (k, chunk) in (&mut chunks).enumerate() {
            let w = self.word_unchecked(off + i + 8 * k).load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        let done = n - chunks.into_remainder().len();
        for (j, b) in buf.iter_mut().enumerate().skip(done) {
            *b = self.byte(off + j).load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copies `data` into the segment at `off`.
    pub fn copy_in(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        let mut i = 0;
        let n = data.len();
        while i < n && (self.base as usize + off + i) % 8 != 0 {
            self.byte(off + i).store(data[i], Ordering::Relaxed);
            i += 1;
        }
        while i + 8 <= n {
            let mut w = [0u8; 8];
            w.copy_from_slice(&data[i..i + 8]);
            self.word_unchecked(off + i)
                .store(u64::from_ne_bytes(w), Ordering::Relaxed);
            i += 8;
        }
        while i < n {
            self.byte(off + i).store(data[i], Ordering::Relaxed);
            i += 1;
        }
        Ok(())
    }

    /// Copies `len` bytes from `self[src_off..]` to `dst[dst_off..]` (the two
    /// may be the same segment; overlapping ranges copy as if through a
    /// temporary only when they are word-aligned alike, as a DMA engine would
    /// not promise either).
    pub fn copy_to(&self, src_off: usize, dst: &Segment, dst_off: usize, len: usize) -> Result<()> {
        self.check(src_off, len)?;
        dst.check(dst_off, len)?;
        let (sp, dp) = (self.base as usize + src_off, dst.base as usize + dst_off);
        if (sp | dp | len) % 8 == 0 {
            // The common case (aligned words): a tight loop of relaxed word
            // loads and stores.
            let n = len / 8;
            // SAFETY: `src_off..src_off+len` and `dst_off..dst_off+len` are
            // in bounds (checked above), both start 8-byte aligned and `len`
            // is a multiple of 8, so each is `n` aligned words in memory that
            // lives as long as the segments; AtomicU64 has the layout of u64.
            // The two views may overlap: shared references to atomics may
            // alias, and all accesses to this memory are atomic.
            let (s, d) = unsafe {
                (
                    std::slice::from_raw_parts(sp as *const AtomicU64, n),
                    std::slice::from_raw_parts(dp as *const AtomicU64, n),
                )
            };
            for (d, s) in d.iter().zip(s) {
                d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            return Ok(());
        }
        let s = self.base as usize + src_off;
        let d = dst.base as usize + dst_off;
        let mut i = 0;
        if s % 8 == d % 8 {
            while i < len && (s + i) % 8 != 0 {
                dst.byte(dst_off + i).store(
                    self.byte(src_off + i).load(Ordering::Relaxed),
                    Ordering::Relaxed,
                );
                i += 1;
            }
            while i + 8 <= len {
                dst.word(dst_off + i).store(
                    self.word(src_off + i).load(Ordering::Relaxed),
                    Ordering::Relaxed,
                );
                i += 8;
            }
        } else {
            // Different word phase: stage through a stack buffer.
            let mut tmp = [0u8; 256];
            while i < len {
                let n = (len - i).min(tmp.len());
                self.copy_out(src_off + i, &mut tmp[..n])?;
                dst.copy_in(dst_off + i, &tmp[..n])?;
                i += n;
            }
        }
        while i < len {
            dst.byte(dst_off + i).store(
                self.byte(src_off + i).load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
            i += 1;
        }
        Ok(())
    }
}

#[cold]
#[inline(never)]
fn layout_bug(off: usize, len: usize) -> ! {
    panic!("sim layout bug: word at {off} outside or misaligned in a segment of {len} bytes")
}

/// This process's id, cached: `getpid` is a system call, and the sim asks on
/// every operation whether a target node lives in this process. A
/// `pthread_atfork` child handler clears the cache, so a forked child never
/// sees its parent's pid.
#[inline]
pub fn pid() -> u32 {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    refresh_pid()
}

#[cold]
fn refresh_pid() -> u32 {
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only performs an atomic store,
        // which is async-signal-safe and valid in a freshly forked child.
        unsafe {
            libc::pthread_atfork(None, None, Some(clear_pid_after_fork));
        }
    });
    let p = std::process::id();
    PID.store(p, Ordering::Relaxed);
    p
}

extern "C" fn clear_pid_after_fork() {
    PID.store(0, Ordering::Relaxed);
}

static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Nanoseconds on the system-wide monotonic clock (the same clock in every
/// process of the machine, unlike `Instant`'s opaque values).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC always
    // exists, so the call only writes `ts`.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A child process made by [`fork_process`]. Dropping it without
/// [`ForkedChild::wait`] kills the child (SIGKILL) and reaps it.
#[derive(Debug)]
pub struct ForkedChild {
    pid: libc::pid_t,
    reaped: bool,
}

/// Forks this process (for workers that inherit an initialized sim node on
/// a directory fabric; see `krcore_kmod::ForkKit` for what a child may
/// use). The child runs `child` and exits with its return value through
/// `_exit`: no destructors and no exit handlers run in the child, so it
/// never releases objects it inherited (they are the parent's). A panic in
/// `child` exits with 101.
///
/// The child has one thread, the caller's: `child` must not wait for a
/// lock another thread of the parent may have held at the fork.
///
/// # Errors
/// `Os` when `fork` fails.
pub fn fork_process(child: impl FnOnce() -> i32) -> Result<ForkedChild> {
    // SAFETY: `fork` has no memory-safety precondition; in the child only
    // `child` runs, then `_exit` (the documented contract covers locks held
    // by other threads at the fork).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(NicError::Os {
            op: "fork",
            source: std::io::Error::last_os_error(),
        });
    }
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: `_exit` ends the process at once; it is always sound.
        unsafe { libc::_exit(code) }
    }
    Ok(ForkedChild { pid, reaped: false })
}

impl ForkedChild {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Whether the child exited: its exit code (or 128 + the signal that
    /// killed it), without waiting.
    ///
    /// # Errors
    /// `Os` when `waitpid` fails.
    pub fn try_wait(&mut self) -> Result<Option<i32>> {
        if self.reaped {
            return Err(NicError::InvalidArgument(
                "the child was already reaped".into(),
            ));
        }
        let mut status = 0;
        // SAFETY: `status` is a valid, writable int; `pid` is our child.
        let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if r == 0 {
            return Ok(None);
        }
        if r != self.pid {
            return Err(NicError::Os {
                op: "waitpid",
                source: std::io::Error::last_os_error(),
            });
        }
        self.reaped = true;
        Ok(Some(exit_code(status)))
    }

    /// Waits for the child to exit: its exit code, or 128 + the signal
    /// that killed it.
    ///
    /// # Errors
    /// `Os` when `waitpid` fails.
    pub fn wait(mut self) -> Result<i32> {
        let mut status = 0;
        loop {
            // SAFETY: `status` is a valid, writable int; `pid` is our child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(NicError::Os {
                    op: "waitpid",
                    source: e,
                });
            }
        }
        self.reaped = true;
        Ok(exit_code(status))
    }
}

fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

impl Drop for ForkedChild {
    fn drop(&mut self) {
        if !self.reaped {
            let mut status = 0;
            // SAFETY: signals and reaps our own child; `status` is writable.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, &mut status, 0);
            }
        }
    }
}
