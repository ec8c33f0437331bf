//! `krcore-metareg`: the cost of registering with the meta server, the UD
//! RPC path (`krcore_meta::MetaRpc` to a `MetaServer`, what remote nodes
//! used before and what RC fallback still uses) against the messaging path
//! deployments use (`Engine::meta_register`/`meta_renew` to an
//! engine-hosted `MsgMetaHost` on its reserved port), side by side on
//! `sim:mem` (no latency model: measured software time).
//!
//! ```text
//! krcore-metareg [--rounds 20] [--ops 200]
//! ```
//!
//! Each round runs `--ops` Register calls then `--ops` Renew calls on one
//! path, then on the other (the order alternates per round), so the load
//! of the machine hits both alike. Prints p50/p90 per call per path and the
//! ratio of the medians; also the one-time cost of a node's first
//! registration by messages (its control channel's Open/Grant and Close
//! are part of every call: a registration channel is closed after each).
#![forbid(unsafe_code)]

use clap::Parser;
use krcore_kmod::{Engine, EngineConfig, MsgMetaHost};
use krcore_meta::table::Geometry;
use krcore_meta::{MetaConfig, MetaRpc, MetaServer, RpcConfig};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::Nic;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Registration cost: UD RPC vs messaging.
#[derive(Parser, Debug)]
#[command(name = "krcore-metareg", version)]
struct Args {
    /// Rounds (each runs both paths).
    #[arg(long, default_value_t = 20)]
    rounds: u32,
    /// Calls of each kind per path per round.
    #[arg(long, default_value_t = 200)]
    ops: u32,
}

fn p(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.rounds == 0 || args.ops == 0 {
        eprintln!("krcore-metareg: --rounds and --ops must be positive");
        return ExitCode::from(2);
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("krcore-metareg: {e}");
            ExitCode::from(1)
        }
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn run(args: &Args) -> Res<()> {
    let fabric = SimFabric::in_memory();
    let nic = || SimNic::open(&fabric, SimConfig::default());
    let meta_cfg = MetaConfig {
        geometry: Geometry::with_buckets(1024)?,
        idle_sleep: Duration::from_micros(50),
        ..MetaConfig::default()
    };
    // UD: the MetaServer and a MetaRpc client.
    let ud_server = MetaServer::start(nic()?, meta_cfg.clone())?;
    let ud_boot = ud_server.bootstrap();
    let _ud_thread = ud_server.spawn()?;
    let ud_nic = nic()?;
    let mut rpc = MetaRpc::new(&ud_nic, &ud_boot, RpcConfig::default())?;
    let ud_target = krcore_nic::DcTarget {
        gid: ud_nic.gid(),
        dct_num: 0x42,
        dc_key: 0xdc,
    };
    // Messaging: an engine-hosted table and a node's engine.
    let host_engine = Engine::start(nic()?, EngineConfig::default().with_pool_size(1))?;
    let host = Arc::new(MsgMetaHost::start(&host_engine, meta_cfg)?);
    let _msg_thread = host.spawn(Duration::from_micros(50))?;
    let node = Engine::start(
        nic()?,
        EngineConfig::default()
            .with_pool_size(1)
            .with_meta(host.location()?),
    )?;
    let msg_target = node.local_target()?;
    let t = Instant::now();
    node.meta_register(msg_target, 0, 60_000)?;
    let first_msg = t.elapsed();
    let t = Instant::now();
    rpc.register(ud_target, 0, 60_000)?;
    let first_ud = t.elapsed();

    let (mut ud_reg, mut ud_renew, mut msg_reg, mut msg_renew) = (vec![], vec![], vec![], vec![]);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for round in 0..args.rounds {
        for leg in 0..2 {
            if (round + leg) % 2 == 0 {
                for _ in 0..args.ops {
                    let t = Instant::now();
                    rpc.register(ud_target, 0, 60_000)?;
                    ud_reg.push(us(t.elapsed()));
                }
                for _ in 0..args.ops {
                    let t = Instant::now();
                    rpc.renew(&ud_target.gid)?;
                    ud_renew.push(us(t.elapsed()));
                }
            } else {
                for _ in 0..args.ops {
                    let t = Instant::now();
                    node.meta_register(msg_target, 0, 60_000)?;
                    msg_reg.push(us(t.elapsed()));
                }
                for _ in 0..args.ops {
                    let t = Instant::now();
                    node.meta_renew(&msg_target.gid)?;
                    msg_renew.push(us(t.elapsed()));
                }
            }
        }
    }
    let (ur50, ur90) = (p(&mut ud_reg, 0.5), p(&mut ud_reg, 0.9));
    let (un50, un90) = (p(&mut ud_renew, 0.5), p(&mut ud_renew, 0.9));
    let (mr50, mr90) = (p(&mut msg_reg, 0.5), p(&mut msg_reg, 0.9));
    let (mn50, mn90) = (p(&mut msg_renew, 0.5), p(&mut msg_renew, 0.9));
    println!(
        "krcore-metareg: sim:mem, no latency model (measured), {} rounds x {} calls per kind per path",
        args.rounds, args.ops
    );
    println!(
        "first registration: UD RPC {:.1} us, messaging {:.1} us",
        us(first_ud),
        us(first_msg)
    );
    println!("register  UD RPC    p50 {ur50:8.1} us  p90 {ur90:8.1} us");
    println!(
        "register  messaging p50 {mr50:8.1} us  p90 {mr90:8.1} us  (x{:.2} of UD)",
        mr50 / ur50
    );
    println!("renew     UD RPC    p50 {un50:8.1} us  p90 {un90:8.1} us");
    println!(
        "renew     messaging p50 {mn50:8.1} us  p90 {mn90:8.1} us  (x{:.2} of UD)",
        mn50 / un50
    );
    let s = host.stats();
    let ms = host_engine.msg_stats();
    println!(
        "messaging host: {} requests, {} malformed, {} reply failures; its engine: {} channels granted, {} handshake endpoints (UD QPs)",
        s.requests,
        s.malformed,
        s.reply_failures,
        ms.granted,
        host_engine.stats().handshake_endpoints_created
    );
    Ok(())
}
