//! Quick start on the embedded default fabric (`sim:mem`): two nodes, one DC
//! initiator reaching a DC target, one-sided READ/WRITE/CAS/FAA and a SEND,
//! then the device counters. With `--latency-model cx4` the completions are
//! delayed by the modeled hardware time and the modeled control-path cost is
//! printed, labelled as modeled, beside the measured software time.
//!
//! Run: `cargo run --release --example sim_quickstart [-- --latency-model cx4]`

use krcore_nic::conformance::{poll_one, Side};
use krcore_nic::sim::{LatencyModel, SimConfig, SimFabric, SimNic};
use krcore_nic::*;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = match args.iter().position(|a| a == "--latency-model") {
        Some(i) => LatencyModel::from_name(args.get(i + 1).map(String::as_str).unwrap_or(""))?,
        None => None,
    };
    let cfg = SimConfig {
        latency: model,
        ..SimConfig::default()
    };
    let fabric = SimFabric::from_spec("sim:mem")?;
    let start = Instant::now();
    let client = SimNic::open(&fabric, cfg.clone())?;
    let server = SimNic::open(&fabric, cfg)?;
    println!(
        "fabric {fabric:?}\n  client {}\n  server {}",
        client.gid(),
        server.gid()
    );

    // The server exposes a DC target and a registered buffer.
    let s = Side::new(&server, 4096);
    let srq = server.create_srq(&s.pd, 16, 1)?;
    let dct = s.qp(QpType::Dct, QpCaps::default(), Some(&srq), 0xc0ffee);
    bring_up(&dct, Access::ALL, None)?;
    s.mr.write(0, b"hello from the server's memory")?;

    // The client reaches it through a DC initiator: no connection per target.
    let c = Side::new(&client, 4096);
    let dci = c.qp(QpType::Dci, QpCaps::default(), None, 0);
    bring_up(&dci, Access::NONE, None)?;
    let to = Destination::Dc(DcTarget {
        gid: server.gid(),
        dct_num: dct.qpn(),
        dc_key: 0xc0ffee,
    });
    let setup = start.elapsed();
    let before = client.counters();

    let t = Instant::now();
    dci.post_send(&[SendWr::read(1, c.mr.sge(0, 30)?, s.mr.remote(0)).to(to)])?;
    let wc = poll_one(&c.cq);
    let read_time = t.elapsed();
    let mut buf = [0u8; 30];
    c.mr.read(0, &mut buf)?;
    println!(
        "READ  {:?} -> {:?}",
        wc.status,
        String::from_utf8_lossy(&buf)
    );

    c.mr.write(100, b"written by the client")?;
    dci.post_send(&[SendWr::write(2, c.mr.sge(100, 21)?, s.mr.remote(1024)).to(to)])?;
    println!("WRITE {:?}", poll_one(&c.cq).status);

    dci.post_send(&[SendWr::cas(3, c.mr.sge(200, 8)?, s.mr.remote(2048), 0, 42).to(to)])?;
    println!(
        "CAS   {:?}, old value {}",
        poll_one(&c.cq).status,
        c.mr.load_u64(200)?
    );
    dci.post_send(&[SendWr::faa(4, c.mr.sge(208, 8)?, s.mr.remote(2048), 8).to(to)])?;
    println!(
        "FAA   {:?}, old value {}, now {}",
        poll_one(&c.cq).status,
        c.mr.load_u64(208)?,
        s.mr.load_u64(2048)?
    );

    srq.post_recv(&[RecvWr::new(77, s.mr.sge(3072, 64)?)])?;
    dci.post_send(&[SendWr::send(5, c.mr.sge(100, 21)?, Some(0xabc)).to(to)])?;
    println!("SEND  {:?}", poll_one(&c.cq).status);
    let r = poll_one(&s.cq);
    let imm = r
        .imm
        .map(|i| format!("{i:#x}"))
        .unwrap_or_else(|| "none".into());
    println!("RECV  {:?} {} bytes, imm {imm}", r.status, r.byte_len);

    let d = client.counters() - before;
    println!(
        "client counters for these ops: {} doorbells, {} READ, {} WRITE, {} atomics, {} SEND, {} QPs created",
        d.doorbells, d.reads, d.writes, d.atomics, d.sends, d.qps_created
    );
    println!("measured: setup {setup:?}, first READ round trip {read_time:?}");
    if let Some(m) = model {
        let c = client.counters();
        println!(
            "modeled ({}): control path {:.3} ms for the client's setup (QP creation, MR registration)",
            m.name,
            c.modeled_control_ns as f64 / 1e6
        );
    }
    Ok(())
}
