//! The opened device context: `ibv_context`, port/GID attributes, the
//! lazy reader of its async events, the receive-id table and the counters
//! shared by every object made from it.
//!
//! ## Async events (CQ overflow) without a thread
//! The provider starts no thread. The context's async event fd is made
//! non-blocking at open, and the provider reads the queued events itself,
//! lazily ([`DeviceInner::drain_events`]): from a CQ poll every
//! `cq::EVENT_CHECK_EMPTY_POLLS` empty polls of that CQ, from every poll
//! whose device poll fails, and when the caller asks
//! ([`super::VerbsNic::read_async_events`]). A drain reads every queued event
//! (`ibv_get_async_event` until `EAGAIN`), marks the CQ of each
//! `IBV_EVENT_CQ_ERR` overflowed, and acknowledges each event at once, so no
//! event is ever left unacknowledged (destroying a CQ or QP waits for the
//! acknowledgement of every event it was reported; unread events are
//! discarded by the kernel with their object or context). Invariant: an
//! overflow is reported by the first poll of the CQ after the provider has
//! read the device's event, which happens at the latest after
//! `EVENT_CHECK_EMPTY_POLLS` empty polls of that CQ, or at the first poll
//! that fails.
//!
//! Why no thread: one sleeping thread makes the process multi-threaded,
//! which costs every post (glibc's cancellation wrappers around librxe's
//! doorbell `write`, the kernel's shared-fd-table path): the provider's 8 B
//! CAS latency in the Soft-RoCE guest was 1.107-1.131x perftest's with the
//! thread and 1.033-1.060x without it. rdma-core starts no thread either:
//! async events are the application's to read.

use super::error::VerbsError;
use super::ffi::{self, sys};
use super::recv::RecvTable;
use super::select;
use crate::counters::Counters;
use crate::types::{DeviceCaps, Gid, MAX_INLINE, MAX_SGE};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

/// Control-path counters kept device-wide; data-path counters live per QP
/// (under the QP's send lock) and are folded in by `counters()`.
#[derive(Default)]
pub(crate) struct DeviceCounters {
    pub qps_created: AtomicU64,
    pub qps_destroyed: AtomicU64,
    pub state_changes: AtomicU64,
    pub recv_wrs: AtomicU64,
    pub error_completions: AtomicU64,
    pub mrs_registered: AtomicU64,
}

/// CQs that a drain of the async events may flag as overflowed, by
/// `ibv_cq` address. A CQ is removed before it is destroyed (the kernel
/// discards its unread events at destruction, so an address reused by a
/// later CQ never receives an older CQ's event).
pub(crate) type CqFlags = Mutex<HashMap<usize, Arc<AtomicBool>>>;

/// The owner of `ibv_context`. Every object holds an `Arc` to it (through
/// its PD or directly), so the context is closed after the last object.
pub(crate) struct DeviceInner {
    ctx: *mut sys::ibv_context,
    pub name: String,
    /// The port every object uses (1-based): QP INIT, address vectors.
    pub port: u8,
    pub gid_index: u8,
    pub gid: Gid,
    pub caps: DeviceCaps,
    /// `enum ibv_mtu` of the port's active MTU (the path MTU we use).
    pub active_mtu: u32,
    /// Most outstanding READs/atomics per QP (initiator and responder).
    pub rd_atomic: u8,
    pub counters: DeviceCounters,
    /// Live QPs' data-path counters, and those of destroyed QPs.
    pub qps: Mutex<Vec<Weak<dyn QpCounters>>>,
    pub retired: Mutex<Counters>,
    pub recv: RecvTable,
    pub cq_flags: CqFlags,
    pub dc: Option<super::mlx5::DcSupport>,
    next_id: AtomicU64,
    /// Held by the one thread draining the async events; a second drainer
    /// skips (`try_lock`). Lock order: a CQ's poll lock is never held
    /// across a drain; a drain takes `cq_flags` under this.
    events: Mutex<()>,
}

// SAFETY: `ibv_context` and every verbs call on it are thread-safe
// (libibverbs documents all verbs as callable from any thread); the raw
// pointer is only dereferenced by libibverbs itself.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; shared access only passes the pointer to libibverbs.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // Nothing to stop or join: no thread reads the async fd, and every
        // event a drain read was acknowledged within that drain (`&mut
        // self`: no drain runs now). Events still queued are discarded by
        // the kernel with the context.
        // SAFETY: `ctx` came from `ibv_open_device`, every object made from it
        // held an `Arc` to this struct and is gone, and nothing else uses it.
        unsafe { sys::ibv_close_device(self.ctx) };
    }
}

impl DeviceInner {
    pub(crate) fn ctx(&self) -> *mut sys::ibv_context {
        self.ctx
    }

    /// Reads every async event queued on the context (non-blocking), marks
    /// the CQ of each `IBV_EVENT_CQ_ERR` overflowed and acknowledges each
    /// event; returns how many it read. Device-wide and safe from any
    /// number of threads: when another thread is draining, returns 0 at
    /// once (that drain, or the next one, reads what is queued). Out of
    /// line and cold: the poll path calls it every
    /// `cq::EVENT_CHECK_EMPTY_POLLS` empty polls or after a failed poll.
    #[cold]
    #[inline(never)]
    pub(crate) fn drain_events(&self) -> usize {
        let Some(_drainer) = self.events.try_lock() else {
            return 0;
        };
        drain_async_events(self.ctx, &self.cq_flags)
    }

    /// A process-unique id for owners of receive entries.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Relaxed)
    }

    /// Opens `opts.device` on the chosen port with the chosen GID index
    /// (see [`super::select`] for the defaults).
    pub(crate) fn open(opts: &super::VerbsOptions) -> Result<DeviceInner, VerbsError> {
        let name = opts.device.as_str();
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below on
        // every path.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = ffi::errno();
            // ENOSYS: no kernel support at all; treat like "no device".
            return match e.raw_os_error() {
                Some(libc::ENOSYS) | Some(libc::ENODEV) => Err(VerbsError::NoDevice),
                _ => Err(VerbsError::Os {
                    op: "ibv_get_device_list",
                    source: e,
                }),
            };
        }
        let list = DeviceList(list);
        let mut found = Vec::new();
        let mut chosen = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: the list has `n` valid entries followed by NULL.
            let dev = unsafe { *list.0.add(i) };
            // SAFETY: `dev` is a valid device; the name is a NUL-terminated
            // string owned by it.
            let dname = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if dname == name {
                chosen = Some(dev);
            }
            found.push(dname);
        }
        let Some(dev) = chosen else {
            return Err(if found.is_empty() {
                VerbsError::NoDevice
            } else {
                VerbsError::UnknownDevice {
                    name: name.to_string(),
                    found,
                }
            });
        };
        let mlx5 = super::mlx5::is_mlx5(dev);
        // SAFETY: `dev` is an entry of the live list.
        let ctx = unsafe { sys::ibv_open_device(dev) };
        drop(list);
        if ctx.is_null() {
            return Err(VerbsError::from_os("ibv_open_device", ffi::errno()));
        }
        let ctx = Ctx(ctx);
        let attr = ctx.query_device()?;
        let (port_num, port) = ctx.choose_port(name, opts.port, attr.phys_port_cnt)?;
        let (gid_index, gid) = match opts.gid_index {
            Some(i) => (i, ctx.gid(port_num, i, port.gid_tbl_len)?),
            None => ctx.default_gid(name, port_num, &port)?,
        };
        let dc = if mlx5 {
            super::mlx5::probe(ctx.0)
        } else {
            None
        };
        let phys = physical_memory();
        let caps = DeviceCaps {
            dc: dc.is_some(),
            max_mr_size: attr.max_mr_size.min(phys),
            max_qp_wr: attr.max_qp_wr.max(1) as u32,
            max_cqe: attr.max_cqe.max(1) as u32,
            max_sge: (attr.max_sge.max(1) as u32).min(MAX_SGE as u32),
            max_inline: MAX_INLINE as u32,
            ud_mtu: ffi::mtu_bytes(port.active_mtu),
            register_user_memory: true,
        };
        ctx.async_fd_nonblocking()?;
        let rd_atomic = (attr.max_qp_rd_atom.clamp(1, ffi::RD_ATOMIC as i32) as u8)
            .min(attr.max_qp_init_rd_atom.clamp(1, ffi::RD_ATOMIC as i32) as u8);
        Ok(DeviceInner {
            ctx: ctx.take(),
            name: name.to_string(),
            port: port_num,
            gid_index,
            gid,
            caps,
            active_mtu: port.active_mtu,
            rd_atomic,
            counters: DeviceCounters::default(),
            qps: Mutex::new(Vec::new()),
            retired: Mutex::new(Counters::default()),
            recv: RecvTable::default(),
            cq_flags: CqFlags::default(),
            dc,
            next_id: AtomicU64::new(1),
            events: Mutex::new(()),
        })
    }
}

/// Where sysfs lists RDMA devices (GID types are read from it).
const SYSFS_IB: &str = "/sys/class/infiniband";

/// `ibv_get_device_list` result, freed on drop.
struct DeviceList(*mut *mut sys::ibv_device);

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `ibv_get_device_list` and is freed
        // once; opened contexts stay valid after the list is freed.
        unsafe { sys::ibv_free_device_list(self.0) };
    }
}

/// A context being set up: closed on drop unless taken.
struct Ctx(*mut sys::ibv_context);

impl Ctx {
    fn take(self) -> *mut sys::ibv_context {
        let p = self.0;
        std::mem::forget(self);
        p
    }

    fn query_device(&self) -> Result<sys::ibv_device_attr, VerbsError> {
        let mut attr = std::mem::MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: valid context and out-pointer to a zeroed attribute struct.
        let rc = unsafe { sys::ibv_query_device(self.0, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(VerbsError::from_os("ibv_query_device", ffi::rc_error(rc)));
        }
        // SAFETY: `ibv_query_device` succeeded and filled the struct (it is
        // plain old data, valid even where the device left bytes zeroed).
        Ok(unsafe { attr.assume_init() })
    }

    fn query_port(&self, port_num: u8) -> Result<sys::ibv_port_attr, VerbsError> {
        let mut port = std::mem::MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: valid context and out-pointer; libibverbs checks the port
        // number (EINVAL past the last port).
        let rc = unsafe { sys::___ibv_query_port(self.0, port_num, port.as_mut_ptr()) };
        if rc != 0 {
            return Err(VerbsError::from_os("ibv_query_port", ffi::rc_error(rc)));
        }
        // SAFETY: filled by a successful query; plain old data.
        Ok(unsafe { port.assume_init() })
    }

    /// The port to use (`requested`, or the first ACTIVE one) and its
    /// attributes.
    fn choose_port(
        &self,
        device: &str,
        requested: Option<u8>,
        count: u8,
    ) -> Result<(u8, sys::ibv_port_attr), VerbsError> {
        let mut attrs = Vec::with_capacity(count as usize);
        for p in 1..=count {
            attrs.push((p, self.query_port(p)?));
        }
        let states: Vec<(u8, u32)> = attrs.iter().map(|(p, a)| (*p, a.state)).collect();
        match select::choose_port(requested, &states) {
            select::PortChoice::Port(p) => {
                let attr = attrs
                    .into_iter()
                    .find(|(n, _)| *n == p)
                    .map(|(_, a)| a)
                    .ok_or(VerbsError::NoSuchPort {
                        device: device.into(),
                        port: p,
                        count,
                    })?;
                Ok((p, attr))
            }
            select::PortChoice::NoSuchPort => Err(VerbsError::NoSuchPort {
                device: device.into(),
                port: requested.unwrap_or(0),
                count,
            }),
            select::PortChoice::Down(state) => Err(VerbsError::PortDown {
                device: device.into(),
                port: requested.unwrap_or(0),
                state,
                state_name: select::port_state_name(state),
            }),
            select::PortChoice::NoneActive => Err(VerbsError::NoActivePort {
                device: device.into(),
                ports: states
                    .iter()
                    .map(|(p, s)| format!("{p}: {}", select::port_state_name(*s)))
                    .collect(),
            }),
        }
    }

    /// The default GID of `port_num` (see [`select::choose_gid`]).
    fn default_gid(
        &self,
        device: &str,
        port_num: u8,
        port: &sys::ibv_port_attr,
    ) -> Result<(u8, Gid), VerbsError> {
        let len = port.gid_tbl_len.clamp(0, 256) as u16;
        let ib = port.link_layer != select::LINK_LAYER_ETHERNET;
        let mut entries = Vec::new();
        for i in 0..len {
            let index = i as u8;
            let Some(gid) = self.raw_gid(port_num, index) else {
                continue;
            };
            if gid == Gid([0; 16]) {
                continue;
            }
            let kind = if ib {
                select::GidType::IbOrRoceV1
            } else {
                select::read_gid_type(Path::new(SYSFS_IB), device, port_num, index)
            };
            let e = select::GidEntry { index, gid, kind };
            if let Some(chosen) = select::choose_gid(std::slice::from_ref(&e), port.link_layer) {
                return Ok((chosen, gid));
            }
            entries.push(e);
        }
        Err(VerbsError::NoUsableGid {
            device: device.into(),
            port: port_num,
            found: entries.iter().map(ToString::to_string).collect(),
        })
    }

    /// GID `index` of `port_num`, `None` when the query fails.
    fn raw_gid(&self, port_num: u8, index: u8) -> Option<Gid> {
        let mut g = sys::ibv_gid { raw: [0; 16] };
        // SAFETY: valid context and out-pointer to a 16-byte union; the
        // port exists (queried before) and libibverbs checks the index.
        let rc = unsafe { sys::ibv_query_gid(self.0, port_num, i32::from(index), &mut g) };
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        (rc == 0).then_some(Gid(unsafe { g.raw }))
    }

    /// Makes the context's async event fd non-blocking, so that reading
    /// the events never waits (`ibv_get_async_event` then fails with
    /// `EAGAIN` when none is queued).
    fn async_fd_nonblocking(&self) -> Result<(), VerbsError> {
        // SAFETY: `self.0` is a valid open context; reading the fd field.
        let async_fd = unsafe { (*self.0).async_fd };
        // SAFETY: fcntl on a valid fd owned by the context.
        let fl = unsafe { libc::fcntl(async_fd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(async_fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(VerbsError::from_os(
                "fcntl(async_fd, O_NONBLOCK)",
                ffi::errno(),
            ));
        }
        Ok(())
    }

    fn gid(&self, port_num: u8, index: u8, table_len: i32) -> Result<Gid, VerbsError> {
        let bad = |reason: &'static str| VerbsError::BadGidIndex {
            index,
            table_len: table_len.max(0) as u32,
            reason,
        };
        if i32::from(index) >= table_len {
            return Err(bad("past the end of the port's GID table"));
        }
        match self.raw_gid(port_num, index) {
            None => Err(bad("ibv_query_gid failed")),
            Some(g) if g == Gid([0; 16]) => {
                Err(bad("the entry is empty (no address on the netdev?)"))
            }
            Some(g) => Ok(g),
        }
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the context was opened by `ibv_open_device`, nothing was
        // created from it yet, and it is closed once.
        unsafe { sys::ibv_close_device(self.0) };
    }
}

/// Bytes of physical memory: the most any registration can pin.
fn physical_memory() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || size <= 0 {
        u64::MAX
    } else {
        (pages as u64).saturating_mul(size as u64)
    }
}

/// Reads every async event queued on `ctx` (whose async fd is
/// non-blocking): flags the CQ of each `IBV_EVENT_CQ_ERR` in `flags` and
/// acknowledges every event (destroying an object waits for its events to
/// be acknowledged). Stops at the first failure (`EAGAIN`: none queued).
/// Returns how many events it read. The caller holds the device's drain
/// lock.
fn drain_async_events(ctx: *mut sys::ibv_context, flags: &CqFlags) -> usize {
    let mut n = 0;
    loop {
        let mut ev = std::mem::MaybeUninit::<ffi::RawAsyncEvent>::zeroed();
        // SAFETY: `ctx` is a live context (its owner is borrowed by the
        // caller); `RawAsyncEvent` has the layout of `ibv_async_event`
        // (checked at compile time in `ffi`); the async fd is non-blocking,
        // so this returns -1 at once when no event is queued.
        let rc = unsafe { sys::ibv_get_async_event(ctx, ev.as_mut_ptr().cast()) };
        if rc != 0 {
            return n;
        }
        n += 1;
        // SAFETY: filled by a successful `ibv_get_async_event`; both fields
        // are plain integers/pointers.
        let e = unsafe { ev.assume_init_ref() };
        if e.event_type == ffi::EVENT_CQ_ERR {
            if let Some(f) = flags.lock().get(&(e.element as usize)) {
                f.store(true, std::sync::atomic::Ordering::Release);
            }
        }
        // SAFETY: acknowledging the event we just got, once.
        unsafe { sys::ibv_ack_async_event(ev.as_mut_ptr().cast()) };
    }
}

/// A QP as its device sees it when it sums its counters. (A trait, so
/// that the device does not name the QPs that hold it.)
pub(crate) trait QpCounters: Send + Sync {
    /// Adds the QP's data-path counters to `into`.
    fn add_counters(&self, into: &mut Counters);
}
