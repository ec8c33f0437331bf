//! `krcore-metareg`: the cost of registering with the meta server over
//! messaging (`Engine::meta_register`/`meta_renew` to an engine-hosted
//! `MsgMetaHost` on its reserved port), and of a node's join (engine start,
//! DCT, first registration), on `sim:mem` (no latency model: measured
//! software time).
//!
//! ```text
//! krcore-metareg [--rounds 20] [--ops 200]
//! ```
//!
//! Each round runs `--ops` Register calls, `--ops` Renew calls and one
//! join. Prints p50/p90 per call (a registration channel is opened and
//! closed by every call: see `krcore_kmod::meta_msg`). (The UD RPC path
//! this replaced, `MetaRpc` to a UD `LocalMetaHost`, is gone; its figures,
//! measured side by side with this one before its removal, are in the
//! commit history.)
#![forbid(unsafe_code)]

use clap::Parser;
use krcore::Node;
use krcore_kmod::{Engine, EngineConfig, MsgMetaHost};
use krcore_meta::table::Geometry;
use krcore_meta::MetaConfig;
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Registration cost over messaging.
#[derive(Parser, Debug)]
#[command(name = "krcore-metareg", version)]
struct Args {
    /// Rounds.
    #[arg(long, default_value_t = 20)]
    rounds: u32,
    /// Calls of each kind per round.
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
    let meta_cfg = MetaConfig {
        geometry: Geometry::with_buckets(1024)?,
        ..MetaConfig::default()
    };
    let host_engine = Engine::start(
        SimNic::open(&fabric, SimConfig::default())?,
        EngineConfig::default().with_pool_size(1),
    )?;
    let host = Arc::new(MsgMetaHost::start(&host_engine, meta_cfg.clone())?);
    let _serving = host.spawn(Duration::from_micros(50))?;
    let node = Engine::start(
        SimNic::open(&fabric, SimConfig::default())?,
        EngineConfig::default()
            .with_pool_size(1)
            .with_meta(host.location()?),
    )?;
    let target = node.local_target()?;
    let t = Instant::now();
    node.meta_register(target, 0, 60_000)?;
    let first = t.elapsed();
    // Joins: a node of the SDK hosting the table, nodes joining it.
    let sdk_host = Node::builder()
        .fabric("sim:mem")
        .host_meta_with(meta_cfg)
        .build()?;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (mut reg, mut renew, mut join) = (vec![], vec![], vec![]);
    let mut joined = Vec::new();
    for _ in 0..args.rounds {
        for _ in 0..args.ops {
            let t = Instant::now();
            node.meta_register(target, 0, 60_000)?;
            reg.push(us(t.elapsed()));
        }
        for _ in 0..args.ops {
            let t = Instant::now();
            node.meta_renew(&target)?;
            renew.push(us(t.elapsed()));
        }
        let t = Instant::now();
        joined.push(Node::builder().join(&sdk_host).build()?);
        join.push(us(t.elapsed()));
    }
    krcore_cli::outln!(
        "krcore-metareg: sim:mem, no latency model (measured), {} rounds x {} calls per kind",
        args.rounds,
        args.ops
    );
    krcore_cli::outln!("first registration: {:.1} us", us(first));
    for (name, v) in [
        ("register", &mut reg),
        ("renew", &mut renew),
        ("join", &mut join),
    ] {
        let (p50, p90) = (p(v, 0.5), p(v, 0.9));
        krcore_cli::outln!("{name:9} messaging p50 {p50:8.1} us  p90 {p90:8.1} us");
    }
    let s = host.stats();
    krcore_cli::outln!(
        "messaging host: {} requests, {} malformed, {} reply failures; {} handshake endpoints (UD QPs)",
        s.requests,
        s.malformed,
        s.reply_failures,
        host_engine.stats().handshake_endpoints_created
    );
    Ok(())
}
