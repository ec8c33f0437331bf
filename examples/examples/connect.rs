//! KRCore's connect: a meta server and two nodes on `sim:mem`. The client
//! connects to the server with a metadata lookup (one one-sided READ of the
//! meta table on a DCCache miss, nothing on a hit) instead of creating a
//! queue pair, then READs, WRITEs and CASes the server's memory. The
//! counters printed at the end are the proof: the connects created no QP.
//!
//! Run: `cargo run --release --example connect`

use krcore::{Access, Node};
use std::time::Instant;

fn main() -> Result<(), krcore::Error> {
    // The server hosts the meta server and registers itself in it; the
    // client joins the same fabric and meta table. It only issues
    // one-sided operations, so it does not register (a registering node
    // sends its Register as a message to the meta server, which would
    // leave the server's address in its DCCache before the cold connect).
    let server = Node::builder().fabric("sim:mem").host_meta().build()?;
    let client = Node::builder().join(&server).register(false).build()?;
    println!(
        "meta server + memory node {}\nclient {}",
        server.gid(),
        client.gid()
    );

    let region = server.alloc(1 << 20, Access::ALL)?;
    region.write(0, b"bytes in the server's memory")?;
    let token = region.token(); // plain data: serializes with serde

    let vqp = client.vqp()?; // bound to a pre-initialized DC initiator
    let before = client.counters();
    let t = Instant::now();
    vqp.connect(server.gid())?; // DCCache miss: one READ of the meta table
    let cold = t.elapsed();
    let d_cold = client.counters() - before;

    let again = client.vqp()?;
    let before = client.counters();
    let t = Instant::now();
    again.connect(server.gid())?; // DCCache hit: no network at all
    let warm = t.elapsed();
    let d_warm = client.counters() - before;

    let buf = client.alloc(4096, Access::LOCAL_WRITE)?;
    vqp.read(&buf, 0, &token, 0, 28)?.wait()?;
    let mut got = [0u8; 28];
    buf.read(0, &mut got)?;
    println!("READ  -> {:?}", String::from_utf8_lossy(&got));
    buf.write(100, b"written by the client")?;
    vqp.write(&buf, 100, &token, 4096, 21)?.wait()?;
    let mut check = [0u8; 21];
    region.read(4096, &mut check)?;
    println!(
        "WRITE -> server now holds {:?}",
        String::from_utf8_lossy(&check)
    );
    let old = again
        .compare_and_swap(&token, 8192, 0, 7)?
        .wait()?
        .old_value;
    println!(
        "CAS   -> old value {old:?}, server word now {}",
        region.load_u64(8192)?
    );

    println!(
        "cold connect: {:?} measured, {} READ, {} QPs created",
        cold, d_cold.reads, d_cold.qps_created
    );
    println!(
        "warm connect: {:?} measured, {} network ops, {} QPs created",
        warm,
        d_warm.network_ops(),
        d_warm.qps_created
    );
    assert_eq!((d_cold.reads, d_cold.qps_created), (1, 0));
    assert_eq!((d_warm.network_ops(), d_warm.qps_created), (0, 0));
    Ok(())
}
