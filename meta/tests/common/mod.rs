//! Shared helpers of the host tests: a READ-side client node, a driver that
//! steps a server while a client call blocks on another thread, targets.
#![allow(dead_code)] // each test binary uses a subset

use krcore_meta::client::LookupError;
use krcore_meta::entry::EntryRepr;
use krcore_meta::wire::BootstrapRepr;
use krcore_meta::{lookup_once, MetaConfig};
use krcore_nic::sim::{SimCq, SimMr, SimNic, SimPd, SimQp};
use krcore_nic::{bring_up, Access, DcTarget, Gid, Nic, QpCaps, QpInit, QpType};
use std::time::Duration;

/// Upper bound of every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(20);

/// A server config with deterministic epochs (first registration: epoch 1).
pub fn config() -> MetaConfig {
    MetaConfig {
        first_epoch: Some(1),
        incarnation: Some(7),
        ..MetaConfig::default()
    }
}

/// The READ side of a client node: a DCI with its CQ and a scratch MR.
pub struct Reader {
    pub nic: SimNic,
    pub pd: SimPd,
    pub cq: SimCq,
    pub dci: SimQp,
    pub scratch: SimMr,
}

impl Reader {
    pub fn new(nic: &SimNic) -> Reader {
        let pd = nic.alloc_pd().unwrap();
        let cq = nic.create_cq(16).unwrap();
        let dci = nic
            .create_qp(
                &pd,
                &QpInit {
                    qp_type: QpType::Dci,
                    caps: QpCaps {
                        max_send_wr: 8,
                        max_recv_wr: 0,
                        ..QpCaps::default()
                    },
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    dc_key: 0,
                },
            )
            .unwrap();
        bring_up(&dci, Access::NONE, None).unwrap();
        let scratch = nic.alloc_mr(&pd, 4096, Access::LOCAL_WRITE).unwrap();
        Reader {
            nic: nic.clone(),
            pd,
            cq,
            dci,
            scratch,
        }
    }

    /// One READ of `gid`'s bucket.
    pub fn once(&self, b: &BootstrapRepr, gid: &Gid) -> Result<Option<EntryRepr>, LookupError> {
        lookup_once::<SimNic>(&self.dci, &self.cq, &self.scratch, b, gid)
    }

    /// Looks `gid` up, repeating torn READs (bounded); panics on any other
    /// error.
    pub fn lookup(&self, b: &BootstrapRepr, gid: &Gid) -> Option<EntryRepr> {
        for _ in 0..10_000 {
            match self.once(b, gid) {
                Ok(e) => return e,
                Err(e) if e.is_retryable() => continue,
                Err(e) => panic!("lookup of {gid}: {e}"),
            }
        }
        panic!("lookup of {gid}: torn 10000 times in a row");
    }
}

/// A DC target with every field derived from `n`, on `gid`.
pub fn target(gid: Gid, n: u32) -> DcTarget {
    DcTarget {
        gid,
        dct_num: n,
        dc_key: dc_key_of(n),
    }
}

pub fn dc_key_of(n: u32) -> u64 {
    u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// A GID of a node that does not exist, derived from `n`.
pub fn fake_gid(n: u64) -> Gid {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
    g[8..].copy_from_slice(&n.to_le_bytes());
    Gid(g)
}
