//! `AnyNic`: a provider chosen at run time, from one fabric string.
//!
//! [`AnyNic`] is an enum over the providers of this build ([`SimNic`], and
//! `VerbsNic` with feature `verbs`) that implements [`Nic`] by static
//! dispatch: every call is one `match` on the variant, inlined, with no
//! allocation and no trait object. Its handles ([`AnyPd`], [`AnyMr`],
//! [`AnyCq`], [`AnySrq`], [`AnyQp`]) are enums over the inner handles in the
//! same way. Code generic over [`Nic`] runs on it unchanged; code that wants
//! to pick the provider from a `--fabric` string calls
//! [`FabricSpec::open`]:
//!
//! ```
//! # use krcore_nic::{FabricSpec, Nic, Access};
//! let opened = "sim:mem,dc=off".parse::<FabricSpec>()?.open()?;
//! let nic = opened.nic;
//! assert_eq!(nic.provider(), "sim");
//! assert!(!nic.caps().dc);
//! let pd = nic.alloc_pd()?;
//! let mr = nic.alloc_mr(&pd, 4096, Access::ALL)?;
//! // More nodes on the same fabric, with the spec's device options:
//! let spec: FabricSpec = "sim:mem,dc=off".parse()?;
//! let other = spec.open_on(opened.fabric.as_ref().unwrap())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Invariants
//! - An `AnyNic` and every handle made from it hold the same variant. A
//!   handle of another variant passed to a call (a verbs CQ in the
//!   [`QpInit`] of a sim node, ...) is refused with
//!   [`NicError::InvalidArgument`], never a panic.
//! - The wrapper adds no semantics: each call is the inner provider's call,
//!   with the same results and errors (the conformance suite runs on
//!   `AnyNic::Sim`, see `tests/conformance_any.rs`).

use crate::counters::Counters;
use crate::error::{NicError, PostError, Result};
use crate::provider::{CompletionQueue, MemoryRegion, Nic, QpInit, QueuePair, SharedReceiveQueue};
use crate::sim::{SimCq, SimFabric, SimMr, SimNic, SimPd, SimQp, SimSrq};
use crate::spec::{FabricSpec, SimLocation, SimSpec};
use crate::types::{
    Access, DeviceCaps, Gid, QpState, QpType, RecvWr, RemoteAddr, SendWr, Sge, Transition, Wc,
};
#[cfg(feature = "verbs")]
use crate::verbs::{VerbsCq, VerbsMr, VerbsNic, VerbsPd, VerbsQp, VerbsSrq};

/// One call on whichever variant `$e` is, binding the inner value to `$v`.
macro_rules! each {
    ($e:expr, $v:ident => $body:expr) => {
        match $e {
            Self::Sim($v) => $body,
            #[cfg(feature = "verbs")]
            Self::Verbs($v) => $body,
        }
    };
}

/// Like `each!`, wrapping the `Ok` value in the same variant of `$out`.
macro_rules! each_wrap {
    ($e:expr, $v:ident => $body:expr, $out:ident) => {
        match $e {
            Self::Sim($v) => $body.map($out::Sim),
            #[cfg(feature = "verbs")]
            Self::Verbs($v) => $body.map($out::Verbs),
        }
    };
}

/// Defines a handle enum with `as_sim`/`as_verbs`, `From` impls and Debug.
macro_rules! handle_enum {
    ($(#[$m:meta])* $name:ident, $sim:ty, $verbs:ident) => {
        $(#[$m])*
        #[derive(Clone, Debug)]
        #[non_exhaustive]
        pub enum $name {
            /// A `sim` handle.
            Sim($sim),
            /// A `verbs` handle.
            #[cfg(feature = "verbs")]
            Verbs($verbs),
        }

        impl $name {
            /// The sim handle, if this is one.
            #[inline]
            pub fn as_sim(&self) -> Option<&$sim> {
                match self {
                    Self::Sim(h) => Some(h),
                    #[cfg(feature = "verbs")]
                    Self::Verbs(_) => None,
                }
            }

            /// The verbs handle, if this is one.
            #[cfg(feature = "verbs")]
            #[inline]
            pub fn as_verbs(&self) -> Option<&$verbs> {
                match self {
                    Self::Verbs(h) => Some(h),
                    Self::Sim(_) => None,
                }
            }

            /// `"sim"` or `"verbs"`.
            pub fn provider(&self) -> &'static str {
                match self {
                    Self::Sim(_) => "sim",
                    #[cfg(feature = "verbs")]
                    Self::Verbs(_) => "verbs",
                }
            }
        }

        impl From<$sim> for $name {
            fn from(h: $sim) -> Self {
                Self::Sim(h)
            }
        }

        #[cfg(feature = "verbs")]
        impl From<$verbs> for $name {
            fn from(h: $verbs) -> Self {
                Self::Verbs(h)
            }
        }
    };
}

handle_enum!(
    /// A protection domain of an [`AnyNic`].
    AnyPd, SimPd, VerbsPd
);
handle_enum!(
    /// A memory region of an [`AnyNic`].
    AnyMr, SimMr, VerbsMr
);
handle_enum!(
    /// A completion queue of an [`AnyNic`].
    AnyCq, SimCq, VerbsCq
);
handle_enum!(
    /// A shared receive queue of an [`AnyNic`].
    AnySrq, SimSrq, VerbsSrq
);
handle_enum!(
    /// A queue pair of an [`AnyNic`].
    AnyQp, SimQp, VerbsQp
);

/// A NIC of the provider a fabric string chose (see the module docs).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyNic {
    /// A `sim` node.
    Sim(SimNic),
    /// A real device (feature `verbs`).
    #[cfg(feature = "verbs")]
    Verbs(VerbsNic),
}

impl From<SimNic> for AnyNic {
    fn from(n: SimNic) -> AnyNic {
        AnyNic::Sim(n)
    }
}

#[cfg(feature = "verbs")]
impl From<VerbsNic> for AnyNic {
    fn from(n: VerbsNic) -> AnyNic {
        AnyNic::Verbs(n)
    }
}

/// The error for a handle of another provider than the NIC's.
#[cold]
fn mismatch(what: &'static str, handle: &'static str, nic: &'static str) -> NicError {
    NicError::InvalidArgument(format!(
        "{what} is a {handle} handle, passed to a {nic} NIC"
    ))
}

impl AnyNic {
    /// Opens the NIC a spec names; see [`FabricSpec::open`].
    ///
    /// # Errors
    /// The errors of [`FabricSpec::open`].
    pub fn open(spec: &FabricSpec) -> Result<Opened> {
        spec.open()
    }

    /// The sim node, if this is one.
    #[inline]
    pub fn as_sim(&self) -> Option<&SimNic> {
        match self {
            AnyNic::Sim(n) => Some(n),
            #[cfg(feature = "verbs")]
            AnyNic::Verbs(_) => None,
        }
    }

    /// The verbs device, if this is one.
    #[cfg(feature = "verbs")]
    #[inline]
    pub fn as_verbs(&self) -> Option<&VerbsNic> {
        match self {
            AnyNic::Verbs(n) => Some(n),
            AnyNic::Sim(_) => None,
        }
    }

    /// `"sim"` or `"verbs"`.
    pub fn provider(&self) -> &'static str {
        match self {
            AnyNic::Sim(_) => "sim",
            #[cfg(feature = "verbs")]
            AnyNic::Verbs(_) => "verbs",
        }
    }
}

impl Nic for AnyNic {
    type Pd = AnyPd;
    type Mr = AnyMr;
    type Cq = AnyCq;
    type Srq = AnySrq;
    type Qp = AnyQp;

    #[inline]
    fn gid(&self) -> Gid {
        each!(self, n => n.gid())
    }

    #[inline]
    fn caps(&self) -> DeviceCaps {
        each!(self, n => n.caps())
    }

    fn port_lock_path(&self) -> Option<std::path::PathBuf> {
        each!(self, n => n.port_lock_path())
    }

    #[inline]
    fn counters(&self) -> Counters {
        each!(self, n => n.counters())
    }

    #[inline]
    fn alloc_pd(&self) -> Result<AnyPd> {
        each_wrap!(self, n => n.alloc_pd(), AnyPd)
    }

    #[inline]
    fn alloc_mr(&self, pd: &AnyPd, len: usize, access: Access) -> Result<AnyMr> {
        match (self, pd) {
            (AnyNic::Sim(n), AnyPd::Sim(pd)) => n.alloc_mr(pd, len, access).map(AnyMr::Sim),
            #[cfg(feature = "verbs")]
            (AnyNic::Verbs(n), AnyPd::Verbs(pd)) => n.alloc_mr(pd, len, access).map(AnyMr::Verbs),
            #[cfg(feature = "verbs")]
            _ => Err(mismatch("the PD", pd.provider(), self.provider())),
        }
    }

    #[inline]
    fn alloc_shared_mr(
        &self,
        pd: &AnyPd,
        len: usize,
        access: Access,
    ) -> Result<(AnyMr, std::fs::File)> {
        match (self, pd) {
            (AnyNic::Sim(n), AnyPd::Sim(pd)) => n
                .alloc_shared_mr(pd, len, access)
                .map(|(m, f)| (AnyMr::Sim(m), f)),
            #[cfg(feature = "verbs")]
            (AnyNic::Verbs(n), AnyPd::Verbs(pd)) => n
                .alloc_shared_mr(pd, len, access)
                .map(|(m, f)| (AnyMr::Verbs(m), f)),
            #[cfg(feature = "verbs")]
            _ => Err(mismatch("the PD", pd.provider(), self.provider())),
        }
    }

    // `unsafe fn` of the trait: this forwards the caller's contract to the
    // inner provider and does nothing unsafe of its own.
    #[allow(unsafe_code)]
    #[inline]
    unsafe fn register_mr(
        &self,
        pd: &AnyPd,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<AnyMr> {
        match (self, pd) {
            (AnyNic::Sim(n), AnyPd::Sim(pd)) => {
                // SAFETY: the caller upholds `Nic::register_mr`'s contract
                // for `ptr..ptr+len`; it is passed through unchanged.
                unsafe { n.register_mr(pd, ptr, len, access) }.map(AnyMr::Sim)
            }
            #[cfg(feature = "verbs")]
            (AnyNic::Verbs(n), AnyPd::Verbs(pd)) => {
                // SAFETY: as above, the caller's contract passed through.
                unsafe { n.register_mr(pd, ptr, len, access) }.map(AnyMr::Verbs)
            }
            #[cfg(feature = "verbs")]
            _ => Err(mismatch("the PD", pd.provider(), self.provider())),
        }
    }

    fn register_sub_mr(
        &self,
        parent: &AnyMr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<AnyMr> {
        match (self, parent) {
            (AnyNic::Sim(n), AnyMr::Sim(p)) => {
                n.register_sub_mr(p, offset, len, access).map(AnyMr::Sim)
            }
            #[cfg(feature = "verbs")]
            (AnyNic::Verbs(n), AnyMr::Verbs(p)) => {
                n.register_sub_mr(p, offset, len, access).map(AnyMr::Verbs)
            }
            #[cfg(feature = "verbs")]
            _ => Err(mismatch("the MR", parent.provider(), self.provider())),
        }
    }

    #[inline]
    fn create_cq(&self, depth: u32) -> Result<AnyCq> {
        each_wrap!(self, n => n.create_cq(depth), AnyCq)
    }

    #[inline]
    fn create_srq(&self, pd: &AnyPd, max_wr: u32, max_sge: u32) -> Result<AnySrq> {
        match (self, pd) {
            (AnyNic::Sim(n), AnyPd::Sim(pd)) => n.create_srq(pd, max_wr, max_sge).map(AnySrq::Sim),
            #[cfg(feature = "verbs")]
            (AnyNic::Verbs(n), AnyPd::Verbs(pd)) => {
                n.create_srq(pd, max_wr, max_sge).map(AnySrq::Verbs)
            }
            #[cfg(feature = "verbs")]
            _ => Err(mismatch("the PD", pd.provider(), self.provider())),
        }
    }

    #[inline]
    fn create_qp(&self, pd: &AnyPd, init: &QpInit<'_, AnyNic>) -> Result<AnyQp> {
        match (self, pd) {
            (AnyNic::Sim(n), AnyPd::Sim(pd)) => {
                let inner = inner_init::<SimNic>(init, "sim", AnyCq::as_sim, AnySrq::as_sim)?;
                n.create_qp(pd, &inner).map(AnyQp::Sim)
            }
            #[cfg(feature = "verbs")]
            (AnyNic::Verbs(n), AnyPd::Verbs(pd)) => {
                let inner =
                    inner_init::<VerbsNic>(init, "verbs", AnyCq::as_verbs, AnySrq::as_verbs)?;
                n.create_qp(pd, &inner).map(AnyQp::Verbs)
            }
            #[cfg(feature = "verbs")]
            _ => Err(mismatch("the PD", pd.provider(), self.provider())),
        }
    }
}

/// The inner provider's `QpInit` of an `AnyNic` one: `cq`/`srq` pick the
/// inner handle of provider `nic`, and a handle of another provider is an
/// `InvalidArgument`.
#[inline]
fn inner_init<'a, N: Nic>(
    init: &QpInit<'a, AnyNic>,
    nic: &'static str,
    cq: fn(&AnyCq) -> Option<&N::Cq>,
    srq: fn(&AnySrq) -> Option<&N::Srq>,
) -> Result<QpInit<'a, N>> {
    let pick = |c: &'a AnyCq, what| cq(c).ok_or_else(|| mismatch(what, c.provider(), nic));
    Ok(QpInit {
        qp_type: init.qp_type,
        caps: init.caps,
        send_cq: pick(init.send_cq, "the send CQ")?,
        recv_cq: pick(init.recv_cq, "the receive CQ")?,
        srq: match init.srq {
            Some(s) => Some(srq(s).ok_or_else(|| mismatch("the SRQ", s.provider(), nic))?),
            None => None,
        },
        dc_key: init.dc_key,
    })
}

impl MemoryRegion for AnyMr {
    #[inline]
    fn addr(&self) -> u64 {
        each!(self, m => m.addr())
    }
    #[inline]
    fn len(&self) -> usize {
        each!(self, m => m.len())
    }
    #[inline]
    fn is_empty(&self) -> bool {
        each!(self, m => m.is_empty())
    }
    #[inline]
    fn lkey(&self) -> u32 {
        each!(self, m => m.lkey())
    }
    #[inline]
    fn rkey(&self) -> u32 {
        each!(self, m => m.rkey())
    }
    #[inline]
    fn access(&self) -> Access {
        each!(self, m => m.access())
    }
    #[inline]
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        each!(self, m => m.read(offset, buf))
    }
    #[inline]
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        each!(self, m => m.write(offset, data))
    }
    #[inline]
    fn load_u64(&self, offset: usize) -> Result<u64> {
        each!(self, m => m.load_u64(offset))
    }
    #[inline]
    fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        each!(self, m => m.store_u64(offset, value))
    }
    #[inline]
    fn prefault(&self, offset: usize, len: usize) -> Result<()> {
        each!(self, m => m.prefault(offset, len))
    }
    #[inline]
    fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        each!(self, m => m.sge(offset, len))
    }
    #[inline]
    fn remote(&self, offset: usize) -> RemoteAddr {
        each!(self, m => m.remote(offset))
    }
}

impl CompletionQueue for AnyCq {
    #[inline]
    fn depth(&self) -> u32 {
        each!(self, c => c.depth())
    }
    #[inline]
    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        each!(self, c => c.poll(out))
    }
}

impl SharedReceiveQueue for AnySrq {
    #[inline]
    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        each!(self, s => s.post_recv(wrs))
    }
    #[inline]
    fn free_slots(&self) -> u32 {
        each!(self, s => s.free_slots())
    }
}

impl QueuePair for AnyQp {
    #[inline]
    fn qpn(&self) -> u32 {
        each!(self, q => q.qpn())
    }
    #[inline]
    fn qp_type(&self) -> QpType {
        each!(self, q => q.qp_type())
    }
    #[inline]
    fn state(&self) -> QpState {
        each!(self, q => q.state())
    }
    #[inline]
    fn modify(&self, t: Transition) -> Result<()> {
        each!(self, q => q.modify(t))
    }
    #[inline]
    fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        each!(self, q => q.post_send(wrs))
    }
    #[inline]
    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        each!(self, q => q.post_recv(wrs))
    }
    #[inline]
    fn send_credits(&self) -> u32 {
        each!(self, q => q.send_credits())
    }
    #[inline]
    fn max_send_wr(&self) -> u32 {
        each!(self, q => q.max_send_wr())
    }
}

/// What [`FabricSpec::open`] opened: the NIC and, for sim, the fabric it
/// joined (to open more nodes on it, fork processes onto it, publish
/// names).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Opened {
    /// The node or device.
    pub nic: AnyNic,
    /// The sim fabric the node joined (`None` for verbs).
    pub fabric: Option<SimFabric>,
}

impl SimSpec {
    /// Opens (or, for a directory, creates when missing) the fabric this
    /// spec names. Device options do not concern the fabric.
    ///
    /// # Errors
    /// The errors of [`SimFabric::open_dir`].
    pub fn open_fabric(&self) -> Result<SimFabric> {
        match self.location() {
            SimLocation::Mem => Ok(SimFabric::in_memory()),
            SimLocation::Shm(_) | SimLocation::Dir(_) => {
                let dir = self
                    .dir_path()
                    .ok_or(NicError::Unsupported("sim:mem has no directory"))?;
                SimFabric::open_dir(dir, true)
            }
        }
    }

    /// Opens a node on `fabric`, already open, with this spec's device
    /// options ([`SimSpec::config`]). The fabric is not checked against
    /// the spec's location: a caller joining a fabric it holds passes it.
    ///
    /// # Errors
    /// The errors of [`SimNic::open`].
    pub fn open_node(&self, fabric: &SimFabric) -> Result<SimNic> {
        SimNic::open(fabric, self.config())
    }
}

impl FabricSpec {
    /// Opens the NIC this spec names: for `sim:`, the fabric (see
    /// [`SimSpec::open_fabric`]) and a node on it with the spec's `dc` and
    /// `latency`; for `verbs:`, the device through
    /// `verbs::VerbsNic::open_with` with the spec's port and GID
    /// index.
    ///
    /// # Errors
    /// The sim fabric and node errors; for verbs, the device's
    /// `verbs::VerbsError` as the source of [`NicError::Os`]; in
    /// a build without feature `verbs`, [`NicError::NoProvider`] for a
    /// `verbs:` spec.
    pub fn open(&self) -> Result<Opened> {
        match self {
            FabricSpec::Sim(s) => {
                let fabric = s.open_fabric()?;
                let nic = AnyNic::Sim(s.open_node(&fabric)?);
                Ok(Opened {
                    nic,
                    fabric: Some(fabric),
                })
            }
            #[cfg(feature = "verbs")]
            FabricSpec::Verbs(v) => Ok(Opened {
                nic: AnyNic::Verbs(VerbsNic::open_with(&v.options())?),
                fabric: None,
            }),
            #[cfg(not(feature = "verbs"))]
            FabricSpec::Verbs(_) => Err(NicError::NoProvider {
                spec: self.to_string(),
                provider: "verbs",
            }),
        }
    }

    /// Opens one more node on a sim fabric that is already open (one a
    /// previous [`FabricSpec::open`] returned, or one inherited over a
    /// fork), with this spec's device options.
    ///
    /// # Errors
    /// `BadFabricSpec` ([`crate::SpecError::NotSim`]) for a `verbs:` spec,
    /// and the errors of [`SimNic::open`].
    pub fn open_on(&self, fabric: &SimFabric) -> Result<AnyNic> {
        match self {
            FabricSpec::Sim(s) => s.open_node(fabric).map(AnyNic::Sim),
            FabricSpec::Verbs(_) => Err(NicError::BadFabricSpec(Box::new(
                crate::spec::SpecError::NotSim {
                    spec: self.to_string(),
                },
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::Side;
    use crate::types::QpCaps;

    #[test]
    fn opens_every_sim_form_with_its_options() {
        let o = FabricSpec::parse("sim:mem").unwrap().open().unwrap();
        assert_eq!(o.nic.provider(), "sim");
        assert!(o.nic.caps().dc);
        assert!(o.fabric.as_ref().unwrap().dir().is_none());
        let sim = o.nic.as_sim().unwrap();
        assert!(sim.config().latency.is_none());

        let o = FabricSpec::parse("sim:mem,dc=off,latency=cx4")
            .unwrap()
            .open()
            .unwrap();
        assert!(!o.nic.caps().dc);
        assert_eq!(
            o.nic.as_sim().unwrap().config().latency,
            Some(crate::sim::LatencyModel::cx4())
        );

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fab");
        let spec = FabricSpec::parse(&format!("sim:{},dc=off", path.display())).unwrap();
        let o = spec.open().unwrap();
        let fabric = o.fabric.clone().unwrap();
        assert_eq!(fabric.dir(), Some(path.as_path()));
        let b = spec.open_on(&fabric).unwrap();
        assert!(!b.caps().dc);
        assert_eq!(fabric.live_nodes().len(), 2);
        // A second process-style open of the same directory is the same fabric.
        let again = spec.open().unwrap();
        assert_eq!(again.fabric.unwrap().id(), fabric.id());
    }

    #[test]
    fn shm_name_form() {
        if !std::path::Path::new("/dev/shm").is_dir() {
            return;
        }
        let name = format!("krcore-any-test-{}", std::process::id());
        let o = FabricSpec::parse(&format!("sim:{name}"))
            .unwrap()
            .open()
            .unwrap();
        let f = o.fabric.unwrap();
        assert_eq!(
            f.dir(),
            Some(std::path::Path::new("/dev/shm").join(&name).as_path())
        );
        drop(o.nic);
        drop(f);
        let _ = std::fs::remove_dir_all(std::path::Path::new("/dev/shm").join(&name));
    }

    #[cfg(not(feature = "verbs"))]
    #[test]
    fn verbs_without_the_feature_is_a_typed_error() {
        let e = FabricSpec::parse("verbs:rxe0").unwrap().open().unwrap_err();
        assert!(
            matches!(&e, NicError::NoProvider { spec, provider: "verbs" } if spec == "verbs:rxe0"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "verbs:rxe0: this build has no verbs provider; rebuild with `--features verbs`"
        );
    }

    #[test]
    fn open_on_refuses_a_verbs_spec() {
        let f = SimFabric::in_memory();
        let e = FabricSpec::parse("verbs:rxe0")
            .unwrap()
            .open_on(&f)
            .unwrap_err();
        assert!(
            matches!(
                &e,
                NicError::BadFabricSpec(b) if matches!(**b, crate::spec::SpecError::NotSim { .. })
            ),
            "{e:?}"
        );
    }

    /// Handles go through the wrapper and back; a QpInit converts.
    #[test]
    fn handles_round_trip() {
        let o = FabricSpec::sim_mem().open().unwrap();
        let s = Side::new(&o.nic, 4096);
        assert_eq!(s.mr.provider(), "sim");
        assert!(s.mr.as_sim().is_some());
        let qp = s.qp(QpType::Rc, QpCaps::default(), None, 0);
        assert_eq!(qp.state(), QpState::Reset);
        let from: AnyNic = o.nic.as_sim().unwrap().clone().into();
        assert_eq!(from.gid(), o.nic.gid());
    }
}
