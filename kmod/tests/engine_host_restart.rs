//! A process restarted on its host, on the sim's host mode (`host=`): the
//! new process has its predecessor's GID, as on hardware, and the engine's
//! per-GID state (messaging channels, the DCCache entry of the GID, the
//! meta entry) must take it for the new process it is.

mod common;

use std::time::Duration;

use common::{config, wait_wcs, Cluster, WAIT};
use krcore_kmod::{Engine, EngineConfig, OwnedMr};
use krcore_nic::sim::{SimConfig, SimNic};
use krcore_nic::{Access, MemoryRegion, Nic, SendWr, WcStatus};

const PORT: u16 = 9;

/// A registered engine on `nic` with a progress thread.
fn engine_on(c: &Cluster, nic: SimNic) -> Engine<SimNic> {
    let cfg = config(|cfg: &mut EngineConfig| {
        cfg.msg.timeout = WAIT;
        cfg.msg.progress_thread = true;
        cfg.ungranted = krcore_kmod::Ungranted::Allow;
    });
    let e = Engine::start(nic, cfg.with_meta(c.location)).expect("engine");
    c.register(e.local_target().unwrap(), 1 << 40, 0)
        .expect("register");
    e
}

fn host_nic(c: &Cluster, host: &str) -> SimNic {
    SimNic::open(
        &c.fabric,
        SimConfig {
            host: Some(host.into()),
            ..SimConfig::default()
        },
    )
    .expect("a node on the host")
}

/// A client dies with its channel to a port open (it never closed it), and
/// a new client process starts on the same host: its endpoint has the dead
/// one's id and its GID, but its Open names another DCT, so the port takes
/// it as a new channel. Its messages arrive, the answers reach it, and it
/// does not wait for credits the dead process's channel owed.
#[test]
fn a_client_restarted_on_its_host_is_a_new_sender() {
    let c = Cluster::new();
    let rx = engine_on(&c, c.nic());
    let port = rx.bind(PORT).unwrap();
    let exchange = |ep: &krcore_kmod::Endpoint<SimNic>, text: &[u8]| {
        ep.push(rx.gid(), PORT, text).unwrap();
        let m = port.pop_timeout(WAIT).unwrap();
        let m_from = m.from;
        assert_eq!(m.to_vec(), text);
        port.reply(&m, &[text, b" ok"].concat()).unwrap();
        let r = ep.pop_reply().unwrap_or_else(|e| {
            panic!(
                "reply to {text:?}: {e}; port side {:?}; next reply: {:?}",
                rx.msg_stats(),
                port.reply_to(m_from, b"x")
            )
        });
        assert_eq!(r.to_vec(), [text, b" ok"].concat());
    };

    let nic1 = host_nic(&c, "client-1");
    let gid = nic1.gid();
    let first = engine_on(&c, nic1.clone());
    let ep = first.endpoint().unwrap();
    for i in 0..3u8 {
        exchange(&ep, &[b'a', i]);
    }
    assert_eq!(rx.msg_port_usage(PORT).unwrap().channels, 1);
    // The crash: the node goes at once (no Close reaches the port).
    nic1.kill();
    drop(ep);
    drop(first);

    let nic2 = host_nic(&c, "client-1");
    assert_eq!(nic2.gid(), gid);
    let second = engine_on(&c, nic2);
    let ep = second.endpoint().unwrap();
    // More messages than the window, so a credit owed to the dead channel
    // would stall the new sender.
    for i in 0..40u8 {
        exchange(&ep, &[b'b', i]);
    }
    assert!(rx.msg_stats().replaced >= 1, "{:?}", rx.msg_stats());
}

/// A memory node restarts on its host: a client that read it through the
/// DCCache reads the new process's memory after the meta entry changes, and
/// never the dead one's through its old DCT number.
#[test]
fn a_memory_node_restarted_on_its_host_is_reached_anew() {
    let c = Cluster::new();
    let client = engine_on(&c, c.nic());
    let local = client.alloc_mr(64, Access::ALL).unwrap();
    // One READ through a new VQP: the status, and the bytes read.
    let read = |mem: &Engine<SimNic>, mr: &OwnedMr<SimNic>| {
        let vqp = client.create_vqp().unwrap();
        vqp.connect(mem.gid()).unwrap();
        let wr = SendWr::read(1, local.sge(0, 8).unwrap(), mr.remote(0));
        vqp.post_send(&mut [wr]).unwrap();
        let wc = wait_wcs(&vqp, 1)[0];
        let mut got = [0u8; 8];
        local.read(0, &mut got).unwrap();
        (wc.status, got)
    };
    let nic1 = host_nic(&c, "mem-1");
    let m1 = engine_on(&c, nic1.clone());
    let mr1 = m1.alloc_mr(4096, Access::ALL).unwrap();
    mr1.write(0, b"process1").unwrap();
    assert_eq!(read(&m1, &mr1), (WcStatus::Success, *b"process1"));
    nic1.kill();
    drop(m1);

    let m2 = engine_on(&c, host_nic(&c, "mem-1"));
    let mr2 = m2.alloc_mr(4096, Access::ALL).unwrap();
    mr2.write(0, b"process2").unwrap();
    // The client's DCCache still holds the dead process's DCT for the GID:
    // that READ fails (and drops the entry); the next one looks the GID up
    // again and reaches the new process.
    let t0 = std::time::Instant::now();
    loop {
        match read(&m2, &mr2) {
            (WcStatus::Success, v) => {
                assert_eq!(v, *b"process2");
                break;
            }
            (st, _) => assert!(t0.elapsed() < WAIT, "never reached the new process: {st:?}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The dead process's key names none of the new process's memory.
    assert_ne!(read(&m2, &mr1).0, WcStatus::Success);
}

/// RC fallback mode (no DC, as Soft-RoCE): the client's RC pair to a
/// memory node is per GID; the node restarts on its host, so the pair's
/// peer QP is gone while the GID lives on. The client's reads fail on the
/// old pair (never reaching the new process's memory with the old key)
/// and reach the new process through a new pair.
#[test]
fn rc_fallback_a_memory_node_restarted_on_its_host_gets_a_new_pair() {
    let f = common::fallback::Fabric::new();
    let host_nic = || {
        SimNic::open(
            &f.fabric,
            SimConfig {
                host: Some("mem-rc".into()),
                ..common::fallback::no_dc()
            },
        )
        .unwrap()
    };
    let server = |nic: SimNic| {
        let mut cfg = EngineConfig::default().with_handshake_thread(true);
        cfg.ungranted = krcore_kmod::Ungranted::Allow;
        let e = Engine::start(nic, cfg.with_meta(f.location)).unwrap();
        f.meta
            .table()
            .register(e.local_target().unwrap(), 0, 1 << 40, 0)
            .unwrap();
        e
    };
    let client = f.client();
    let local = client.alloc_mr(64, Access::ALL).unwrap();
    let read = |gid, mr: &OwnedMr<SimNic>| {
        let vqp = client.create_vqp().unwrap();
        vqp.connect(gid).map_err(|e| format!("connect: {e}"))?;
        let wr = SendWr::read(1, local.sge(0, 8).unwrap(), mr.remote(0));
        vqp.post_send(&mut [wr]).map_err(|e| format!("post: {e}"))?;
        let wc = wait_wcs(&vqp, 1)[0];
        let mut got = [0u8; 8];
        local.read(0, &mut got).unwrap();
        Ok::<_, String>((wc.status, got))
    };
    let nic1 = host_nic();
    let m1 = server(nic1.clone());
    let mr1 = m1.alloc_mr(4096, Access::ALL).unwrap();
    mr1.write(0, b"rc-proc1").unwrap();
    let gid = m1.gid();
    assert_eq!(read(gid, &mr1).unwrap(), (WcStatus::Success, *b"rc-proc1"));
    nic1.kill();
    drop(m1);

    let m2 = server(host_nic());
    assert_eq!(m2.gid(), gid);
    let mr2 = m2.alloc_mr(4096, Access::ALL).unwrap();
    mr2.write(0, b"rc-proc2").unwrap();
    let t0 = std::time::Instant::now();
    loop {
        match read(gid, &mr2) {
            Ok((WcStatus::Success, v)) => {
                assert_eq!(v, *b"rc-proc2");
                break;
            }
            other => assert!(
                t0.elapsed() < WAIT,
                "never reached the new process: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Ok((WcStatus::Success, v)) = read(gid, &mr1) {
        panic!("the dead process's key read {v:?}");
    }
}

/// The port's lock on a directory fabric's host: a second engine on the
/// host is refused, typed, while the first lives; an engine started with
/// `port_lock` off is not (a loopback test's second engine); once the
/// first is dropped the host takes an engine again.
#[test]
fn a_host_takes_one_engine_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let fabric = krcore_nic::sim::SimFabric::open_dir(dir.path().join("f"), true).unwrap();
    let nic = || {
        SimNic::open(
            &fabric,
            SimConfig {
                host: Some("h".into()),
                ..SimConfig::default()
            },
        )
        .unwrap()
    };
    let first = Engine::start(nic(), EngineConfig::default()).unwrap();
    match Engine::start(nic(), EngineConfig::default()) {
        Err(krcore_kmod::EngineError::PortInUse { gid, holder, .. }) => {
            assert_eq!(gid, first.gid());
            assert_eq!(holder, Some(std::process::id()));
        }
        other => panic!("a second engine on the host: {:?}", other.map(|e| e.gid())),
    }
    let unlocked = Engine::start(nic(), EngineConfig::default().with_port_lock(false)).unwrap();
    assert_eq!(unlocked.gid(), first.gid());
    drop(unlocked);
    drop(first);
    Engine::start(nic(), EngineConfig::default()).expect("the host is free again");
}
