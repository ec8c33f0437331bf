//! `krcore-meta`: a standalone meta server on a sim directory fabric.
//!
//! ```text
//! krcore-meta --fabric sim:NAME|sim:/path [--name krcore-meta] [--buckets N]
//!             [--slots-per-bucket N] [--lease-sweep-ms N] [--tcp ADDR]
//! ```
//!
//! Joins the fabric as a node, starts a [`MetaServer`], publishes its
//! bootstrap under `--name` (and serves it over TCP with `--tcp`), prints the
//! bootstrap and a line `ready`, then serves until killed. A killed server
//! leaves its publication behind; the next server replaces it, and clients
//! of the dead one get RPC timeouts and failed READs.
//!
//! Exit codes: 2 for a bad command line or fabric (clap's own errors, a bad
//! `--fabric` spec, `sim:mem`, a fabric directory that cannot be opened, an
//! invalid geometry); 1 when the server fails.
#![forbid(unsafe_code)]

use clap::Parser;
use krcore_meta::bootstrap::DEFAULT_NAME;
use krcore_meta::table::{Geometry, DEFAULT_SLOTS_PER_BUCKET};
use krcore_meta::{MetaConfig, MetaServer};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

/// KRCore meta server: DCT metadata served by one-sided READ.
#[derive(Parser, Debug)]
#[command(name = "krcore-meta", version)]
struct Args {
    /// Fabric to serve on: sim:NAME (/dev/shm/NAME) or sim:/path.
    #[arg(long)]
    fabric: String,
    /// Well-known name to publish the bootstrap under.
    #[arg(long, default_value = DEFAULT_NAME)]
    name: String,
    /// Buckets in the table.
    #[arg(long, default_value_t = 1024)]
    buckets: u32,
    /// Entries per bucket (one lookup READs a whole bucket).
    #[arg(long, default_value_t = DEFAULT_SLOTS_PER_BUCKET)]
    slots_per_bucket: u32,
    /// Least time between lease sweeps, in ms.
    #[arg(long, default_value_t = 100)]
    lease_sweep_ms: u64,
    /// Also serve the bootstrap over TCP on this address (e.g. 127.0.0.1:7470).
    #[arg(long)]
    tcp: Option<String>,
}

fn usage_error(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("krcore-meta: {msg}");
    ExitCode::from(2)
}

fn failure(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("krcore-meta: {msg}");
    ExitCode::from(1)
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.fabric == "sim:mem" {
        return usage_error(
            "--fabric sim:mem is private to one process: a standalone server needs a \
             directory fabric (sim:NAME or sim:/path)",
        );
    }
    let fabric = match SimFabric::from_spec(&args.fabric) {
        Ok(f) => f,
        Err(e) => return usage_error(format!("--fabric {}: {e}", args.fabric)),
    };
    let geometry = match Geometry::new(args.buckets, args.slots_per_bucket) {
        Ok(g) => g,
        Err(e) => return usage_error(format!("table geometry: {e}")),
    };
    let nic = match SimNic::open(&fabric, SimConfig::default()) {
        Ok(n) => n,
        Err(e) => return failure(format!("join the fabric: {e}")),
    };
    let cfg = MetaConfig {
        geometry,
        lease_sweep_ms: args.lease_sweep_ms,
        ..MetaConfig::default()
    };
    let mut server = match MetaServer::start(nic, cfg) {
        Ok(s) => s,
        Err(e) => return failure(format!("start: {e}")),
    };
    if let Err(e) = server.publish_on_sim(&fabric, &args.name) {
        return failure(format!("publish as {:?}: {e}", args.name));
    }
    let tcp = match &args.tcp {
        Some(addr) => match server.serve_bootstrap_tcp(addr.as_str()) {
            Ok(t) => Some(t),
            Err(e) => return failure(format!("--tcp {addr}: {e}")),
        },
        None => None,
    };
    let b = server.bootstrap();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "krcore-meta: fabric {} name {:?}{}",
        args.fabric,
        args.name,
        tcp.as_ref()
            .map(|t| format!(" tcp {}", t.local_addr()))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "bootstrap: gid {} dct_num {:#x} dc_key {:#x} rpc_qpn {:#x} qkey {:#x}",
        b.server.gid, b.server.dct_num, b.server.dc_key, b.rpc_qpn, b.rpc_qkey
    );
    let _ = writeln!(
        out,
        "table: addr {:#x} rkey {:#x} len {} buckets {} slots/bucket {} incarnation {:#x}",
        b.table.addr, b.table.rkey, b.table_len, b.n_buckets, b.slots_per_bucket, b.incarnation
    );
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);
    // Runs until killed: nothing sets the flag.
    let stop = AtomicBool::new(false);
    match server.run(&stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failure(format!("serve: {e}")),
    }
}
