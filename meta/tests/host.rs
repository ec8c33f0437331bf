//! The table host without an engine ([`LocalMetaHost`]) on `sim:mem`:
//! registrations by local calls, lookups by one READ through its DCT,
//! leases and sweeps on the caller's clock, failures as typed errors.
//! (Registration as messages is the engine-hosted server's: see
//! `krcore-kmod`'s `engine_meta_msg` and the SDK's `meta_multiprocess`.)

mod common;

use common::*;
use krcore_meta::client::LookupError;
use krcore_meta::registry::{Lease, TableError};
use krcore_meta::{LocalMetaHost, MetaConfig, MetaError};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Nic, WcStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

struct Setup {
    _fabric: SimFabric,
    server: LocalMetaHost<SimNic>,
    client: SimNic,
    reader: Reader,
}

fn setup_with(cfg: MetaConfig) -> Setup {
    let fabric = SimFabric::in_memory();
    let server =
        LocalMetaHost::start(SimNic::open(&fabric, SimConfig::default()).unwrap(), cfg).unwrap();
    let client = SimNic::open(&fabric, SimConfig::default()).unwrap();
    let reader = Reader::new(&client);
    Setup {
        _fabric: fabric,
        server,
        client,
        reader,
    }
}

fn setup() -> Setup {
    setup_with(config())
}

#[test]
fn register_then_lookup_by_one_read() {
    let mut s = setup();
    let b = s.server.bootstrap();
    let me = target(s.client.gid(), 0x77);
    let lease = s.server.table_mut().register(me, 3, 500, 1_000).unwrap();
    assert_eq!(
        lease,
        Lease {
            epoch: 1,
            lease_expiry_ms: 1_500,
            replaced_dct: 0,
        }
    );
    let before = s.client.counters();
    let e = s.reader.once(&b, &me.gid).unwrap().expect("registered");
    let d = s.client.counters() - before;
    assert_eq!(d.reads, 1, "one READ per lookup: {d:?}");
    assert_eq!(d.network_ops(), 1, "{d:?}");
    assert_eq!(d.bytes_read, b.geometry().unwrap().bucket_len() as u64);
    assert_eq!(d.qps_created, 0);
    assert_eq!(e.dc_target(), me);
    assert_eq!((e.lid, e.epoch, e.lease_expiry_ms), (3, 1, 1_500));
    // A GID nobody registered: every slot stable, no match.
    assert_eq!(s.reader.once(&b, &fake_gid(9)).unwrap(), None);
    assert_eq!(s.server.table().memory().faults(), 0);
    // The host made one QP (its DCT) and no request endpoint: the
    // bootstrap's RPC target names the DCT.
    assert_eq!(s.server.nic().counters().qps_created, 1);
    assert_eq!(b.rpc_qpn, b.server.dct_num);
}

#[test]
fn renew_deregister_and_sweep_change_what_a_read_finds() {
    let mut s = setup();
    let b = s.server.bootstrap();
    let me = target(s.client.gid(), 1);
    let lease = s.server.table_mut().register(me, 0, 100, 0).unwrap();
    let renewed = s.server.table_mut().renew(&me.gid, me.dct_num, 50).unwrap();
    assert_eq!((renewed.epoch, renewed.lease_expiry_ms), (lease.epoch, 150));
    assert_eq!(s.server.sweep(149), 0);
    assert!(s.reader.lookup(&b, &me.gid).is_some());
    assert_eq!(s.server.sweep(150), 1, "expired at its expiry");
    assert_eq!(s.reader.lookup(&b, &me.gid), None);
    assert!(matches!(
        s.server.table_mut().renew(&me.gid, me.dct_num, 151),
        Err(TableError::NotRegistered { .. })
    ));
    // Re-registration bumps the epoch; deregistration removes it.
    let again = s.server.table_mut().register(me, 0, 100, 200).unwrap();
    assert!(again.epoch > lease.epoch);
    assert_eq!(s.reader.lookup(&b, &me.gid).unwrap().epoch, again.epoch);
    s.server
        .table_mut()
        .deregister(&me.gid, me.dct_num)
        .unwrap();
    assert_eq!(s.reader.lookup(&b, &me.gid), None);
}

#[test]
fn device_without_dc_is_a_typed_error() {
    let fabric = SimFabric::in_memory();
    let nic = SimNic::open(
        &fabric,
        SimConfig {
            dc: false,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let e = LocalMetaHost::start(nic.clone(), config()).unwrap_err();
    assert!(matches!(e, MetaError::DcUnsupported), "{e:?}");
    assert!(e.to_string().contains("MsgMetaHost"), "{e}");
    let c = nic.counters();
    assert_eq!(
        (c.qps_created, c.mrs_registered),
        (0, 0),
        "nothing allocated"
    );
}

#[test]
fn concurrent_writer_never_yields_a_mixed_entry() {
    let mut s = setup();
    let b = s.server.bootstrap();
    let gid = s.client.gid();
    // Every field of registration n is derived from n (epoch = 1 + n).
    let reg = |server: &mut LocalMetaHost<SimNic>, n: u32| {
        let lease = server
            .table_mut()
            .register(
                target(gid, n),
                n as u16 ^ 0x5a5a,
                1_000_000 + u64::from(n),
                0,
            )
            .unwrap();
        assert_eq!(lease.epoch, 1 + n);
    };
    reg(&mut s.server, 0);
    let stop = AtomicBool::new(false);
    let server = &mut s.server;
    let (written, reads, torn) = std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let mut n = 1;
            while !stop.load(Ordering::Relaxed) {
                reg(server, n);
                n += 1;
            }
            n
        });
        let (mut reads, mut torn, mut last_epoch) = (0u32, 0u32, 0u32);
        let start = Instant::now();
        while reads < 5_000 && start.elapsed() < Duration::from_secs(10) {
            match s.reader.once(&b, &gid) {
                Ok(Some(e)) => {
                    let n = e.dct_num;
                    assert_eq!(e.gid, gid);
                    assert_eq!(e.dc_key, dc_key_of(n), "mixed entry {e:?}");
                    assert_eq!(e.lid, n as u16 ^ 0x5a5a, "mixed entry {e:?}");
                    assert_eq!(e.epoch, 1 + n, "mixed entry {e:?}");
                    assert_eq!(e.lease_expiry_ms, 1_000_000 + u64::from(n), "{e:?}");
                    assert!(e.epoch >= last_epoch, "epochs go back: {e:?}");
                    last_epoch = e.epoch;
                    reads += 1;
                }
                Err(e) if e.is_torn() => torn += 1,
                other => panic!("neither old, new nor torn: {other:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        (writer.join().unwrap(), reads, torn)
    });
    eprintln!("{written} writes, {reads} clean READs, {torn} torn READs retried");
    assert!(reads >= 1_000, "the reader made progress: {reads}");
    assert!(written > 10, "the writer made progress: {written}");
}

#[test]
fn a_dropped_server_fails_reads_typed() {
    let Setup {
        _fabric,
        mut server,
        client,
        reader,
    } = setup();
    let b = server.bootstrap();
    let me = target(client.gid(), 1);
    server.table_mut().register(me, 0, 100, 0).unwrap();
    drop(server);
    let start = Instant::now();
    match reader.once(&b, &me.gid) {
        Err(LookupError::Completion(WcStatus::RetryExcErr)) => {}
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() < WAIT);
}
