//! The sim's host mode (`host=`): a node on a host takes the host's GID, a
//! process restarted on the host answers to it again, and what peers cached
//! about the dead process (QP and DCT numbers, memory keys) fails as it does
//! on hardware instead of reaching the new process's objects.

use krcore_nic::conformance::{poll_one, rc_pair, Side};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;

fn on_host(f: &SimFabric, host: &str) -> Result<SimNic> {
    SimNic::open(
        f,
        SimConfig {
            host: Some(host.into()),
            ..SimConfig::default()
        },
    )
}

/// A DCT on `side` (key `key`), up, with its SRQ kept alive beside it.
fn dct(side: &Side<SimNic>, key: u64) -> (sim::SimQp, sim::SimSrq) {
    let srq = side.nic.create_srq(&side.pd, 16, 1).unwrap();
    let q = side.qp(QpType::Dct, QpCaps::default(), Some(&srq), key);
    bring_up(&q, Access::ALL, None).unwrap();
    (q, srq)
}

#[test]
fn a_restarted_host_keeps_its_gid_and_its_predecessors_numbers_fail() {
    let f = SimFabric::in_memory();
    let a = SimNic::open(&f, SimConfig::default()).unwrap();
    let b1 = on_host(&f, "mem-0").unwrap();
    let gid = b1.gid();
    let sa = Side::new(&a, 4096);
    let sb1 = Side::new(&b1, 4096);
    sb1.mr.write(0, b"first!!!").unwrap();
    let (qa, qb1) = rc_pair(&sa, &sb1, QpCaps::default());
    let (dct1, _srq1) = dct(&sb1, 0xdc);
    let dci = sa.qp(QpType::Dci, QpCaps::default(), None, 0);
    bring_up(&dci, Access::NONE, None).unwrap();
    let to = |dct_num| {
        Destination::Dc(DcTarget {
            gid,
            dct_num,
            dc_key: 0xdc,
        })
    };
    let old_rkey = sb1.mr.remote(0);
    dci.post_send(&[SendWr::read(1, sa.mr.sge(0, 8).unwrap(), old_rkey).to(to(dct1.qpn()))])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
    let (old_qpn, old_dct) = (qb1.qpn(), dct1.qpn());

    // The process dies; another one starts on the host.
    b1.kill();
    drop((qb1, dct1, sb1));
    let b2 = on_host(&f, "mem-0").unwrap();
    assert_eq!(b2.gid(), gid, "a host's GID outlives its process");
    let sb2 = Side::new(&b2, 4096);
    sb2.mr.write(0, b"second!!").unwrap();
    let (dct2, _srq2) = dct(&sb2, 0xdc);
    let qb2 = sb2.qp(QpType::Rc, QpCaps::default(), None, 0);
    assert_ne!(qb2.qpn(), old_qpn, "a new process numbers its QPs anew");
    assert_ne!(dct2.qpn(), old_dct);
    assert_ne!(sb2.mr.remote(0).rkey, old_rkey.rkey, "and its keys");

    // The RC QP connected to the dead process's QP gets no answer.
    qa.post_send(&[SendWr::read(2, sa.mr.sge(0, 8).unwrap(), old_rkey)])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::RetryExcErr);
    // The DCI's cached target follows the GID to the new process: the dead
    // DCT number is unreachable there, the new one answers with new bytes,
    // and the dead process's key reaches none of its memory.
    dci.post_send(&[SendWr::read(3, sa.mr.sge(0, 8).unwrap(), sb2.mr.remote(0)).to(to(old_dct))])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::RetryExcErr);
    let dci = sa.qp(QpType::Dci, QpCaps::default(), None, 0);
    bring_up(&dci, Access::NONE, None).unwrap();
    dci.post_send(
        &[SendWr::read(4, sa.mr.sge(0, 8).unwrap(), sb2.mr.remote(0)).to(to(dct2.qpn()))],
    )
    .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
    let mut got = [0u8; 8];
    sa.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"second!!");
    dci.post_send(&[SendWr::read(5, sa.mr.sge(0, 8).unwrap(), old_rkey).to(to(dct2.qpn()))])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::RemAccessErr);
}

#[test]
fn a_qp_that_cached_a_host_reaches_the_hosts_next_process() {
    // One DCI, never recreated: its target cache holds the first process
    // when that dies, and must resolve the GID again.
    let f = SimFabric::in_memory();
    let a = SimNic::open(&f, SimConfig::default()).unwrap();
    let sa = Side::new(&a, 4096);
    let dci = sa.qp(QpType::Dci, QpCaps::default(), None, 0);
    bring_up(&dci, Access::NONE, None).unwrap();
    for (round, text) in [b"round-0!", b"round-1!", b"round-2!"].iter().enumerate() {
        let b = on_host(&f, "mem-1").unwrap();
        let sb = Side::new(&b, 4096);
        sb.mr.write(0, *text).unwrap();
        let (d, _srq) = dct(&sb, 7);
        let to = Destination::Dc(DcTarget {
            gid: b.gid(),
            dct_num: d.qpn(),
            dc_key: 7,
        });
        dci.post_send(&[
            SendWr::read(round as u64, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0)).to(to),
        ])
        .unwrap();
        assert_eq!(poll_one(&sa.cq).status, WcStatus::Success, "round {round}");
        let mut got = [0u8; 8];
        sa.mr.read(0, &mut got).unwrap();
        assert_eq!(&got, *text);
        if round % 2 == 0 {
            b.kill(); // a crash
        } // else: a clean close (the drop below)
    }
}

#[test]
fn processes_on_one_host_share_its_gid_and_each_gets_its_own_wrs() {
    let f = SimFabric::in_memory();
    let a = SimNic::open(&f, SimConfig::default()).unwrap();
    let sa = Side::new(&a, 4096);
    let nodes: Vec<SimNic> = (0..3).map(|_| on_host(&f, "box").unwrap()).collect();
    let gid = nodes[0].gid();
    assert!(nodes.iter().all(|n| n.gid() == gid), "one GID per host");
    assert_eq!(
        f.live_nodes().iter().filter(|&&g| g == gid).count(),
        1,
        "listed once"
    );
    let plain = SimNic::open(&f, SimConfig::default()).unwrap();
    assert_ne!(plain.gid(), gid);
    // Each process: a DCT, an RC QP and an MR with bytes of its own. The
    // host's QP numbers are unique across its processes.
    let sides: Vec<Side<SimNic>> = nodes.iter().map(|n| Side::new(n, 4096)).collect();
    let dcts: Vec<_> = sides.iter().map(|s| dct(s, 9)).collect();
    let mut qpns: Vec<u32> = dcts.iter().map(|(d, _)| d.qpn()).collect();
    for (k, s) in sides.iter().enumerate() {
        s.mr.write(0, format!("process{k}").as_bytes()).unwrap();
    }
    let pairs: Vec<_> = sides
        .iter()
        .map(|s| rc_pair(&sa, s, QpCaps::default()))
        .collect();
    qpns.extend(pairs.iter().map(|(_, q)| q.qpn()));
    let mut unique = qpns.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), qpns.len(), "{qpns:x?}");

    let dci = sa.qp(QpType::Dci, QpCaps::default(), None, 0);
    bring_up(&dci, Access::NONE, None).unwrap();
    let read_back = || {
        let mut got = [0u8; 8];
        sa.mr.read(0, &mut got).unwrap();
        got
    };
    // Twice round: the DCI's target cache moves between the host's nodes.
    for round in 0..2u64 {
        for (k, ((d, _), s)) in dcts.iter().zip(&sides).enumerate() {
            let to = Destination::Dc(DcTarget {
                gid,
                dct_num: d.qpn(),
                dc_key: 9,
            });
            dci.post_send(&[SendWr::read(round, sa.mr.sge(0, 8).unwrap(), s.mr.remote(0)).to(to)])
                .unwrap();
            assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
            assert_eq!(read_back(), *format!("process{k}").as_bytes());
        }
    }
    for (k, ((qa, _), s)) in pairs.iter().zip(&sides).enumerate() {
        qa.post_send(&[SendWr::read(7, sa.mr.sge(0, 8).unwrap(), s.mr.remote(0))])
            .unwrap();
        assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
        assert_eq!(read_back(), *format!("process{k}").as_bytes());
    }
    // One process dies: its QPs are gone, the others' still answer.
    nodes[1].kill();
    let read_over = |k: usize| {
        let (qa, _) = &pairs[k];
        qa.post_send(&[SendWr::read(
            8,
            sa.mr.sge(0, 8).unwrap(),
            sides[k].mr.remote(0),
        )])
        .unwrap();
        poll_one(&sa.cq).status
    };
    assert_eq!(read_over(1), WcStatus::RetryExcErr);
    assert_eq!(read_over(2), WcStatus::Success);
    assert_eq!(read_back(), *b"process2");
}

#[test]
fn host_nodes_on_a_directory_fabric_and_its_spec() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("sim:{},host=node-7", dir.path().join("f").display());
    let n1 = SimNic::from_spec(&spec).unwrap();
    assert_eq!(n1.config().host.as_deref(), Some("node-7"));
    let n2 = SimNic::from_spec(&spec).unwrap();
    assert_eq!(n2.gid(), n1.gid());
    let gid = n1.gid();
    drop((n1, n2));
    assert_eq!(SimNic::from_spec(&spec).unwrap().gid(), gid);
}

/// Processes of one host pick QP numbers under the host's numbering lock
/// (a file lock in the fabric's directory): while another holder has it, a
/// QP of the host waits, and it is created once the lock is let go. Nodes
/// of the host still get distinct numbers.
#[test]
fn a_hosts_qp_numbers_are_picked_under_its_numbering_lock() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("sim:{},host=numbered", dir.path().join("f").display());
    let n1 = SimNic::from_spec(&spec).unwrap();
    let n2 = SimNic::from_spec(&spec).unwrap();
    let (s1, s2) = (Side::new(&n1, 4096), Side::new(&n2, 4096));
    let qps: Vec<_> = (0..20)
        .flat_map(|_| {
            [
                s1.qp(QpType::Rc, QpCaps::default(), None, 0),
                s2.qp(QpType::Rc, QpCaps::default(), None, 0),
            ]
        })
        .collect();
    let mut qpns: Vec<u32> = qps.iter().map(|q| q.qpn()).collect();
    qpns.sort_unstable();
    qpns.dedup();
    assert_eq!(qpns.len(), 40, "numbers unique among the host's nodes");
    let lock_path = std::fs::read_dir(dir.path().join("f"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".qpn.lock"))
        .expect("the host's numbering lock file");
    let held = std::fs::OpenOptions::new()
        .write(true)
        .open(&lock_path)
        .unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let creator = std::thread::spawn(move || {
        let q = s1.qp(QpType::Rc, QpCaps::default(), None, 0);
        tx.send(q.qpn()).unwrap();
    });
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(200))
            .is_err(),
        "a QP of the host was created while its numbering lock was held"
    );
    rustix::fs::flock(&held, rustix::fs::FlockOperation::Unlock).unwrap();
    assert!(rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok());
    creator.join().unwrap();
    drop((qps, s2));
}
