//! `krcore-meta`: a standalone meta server on a sim directory fabric.
//!
//! ```text
//! krcore-meta --fabric sim:NAME|sim:/path [--name krcore-meta] [--buckets N]
//!             [--slots-per-bucket N] [--lease-sweep-ms N] [--tcp ADDR]
//! ```
//!
//! Joins the fabric as a node whose engine hosts the meta table
//! ([`krcore::NodeBuilder::host_meta_with`], a `krcore_kmod::MsgMetaHost`):
//! clients look entries up with one-sided READs through the node's DCT, and
//! nodes register, renew and deregister with two-sided messages to its
//! reserved port `krcore_kmod::META_PORT` (no UD QP). It publishes its
//! bootstrap under `--name` (and serves it over TCP with `--tcp`), prints
//! the bootstrap and a line `ready`, then serves until killed. A killed
//! server leaves its publication behind; the next server replaces it, and
//! clients of the dead one get bounded, typed errors (registration calls
//! time out, READs fail with an error completion).
//!
//! Exit codes: 2 for a bad command line or fabric (clap's own errors, a bad
//! `--fabric` spec, `sim:mem`, a fabric directory that cannot be opened, an
//! invalid geometry); 1 when the server fails.
#![forbid(unsafe_code)]

use clap::Parser;
use krcore::Node;
use krcore_meta::bootstrap::{serve_bootstrap_tcp, DEFAULT_NAME};
use krcore_meta::table::{Geometry, DEFAULT_SLOTS_PER_BUCKET};
use krcore_meta::MetaConfig;
use krcore_nic::sim::SimFabric;
use std::io::Write;
use std::process::ExitCode;

/// KRCore meta server: DCT metadata served by one-sided READ, registration
/// by two-sided messages.
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
    let cfg = MetaConfig {
        geometry,
        lease_sweep_ms: args.lease_sweep_ms,
        ..MetaConfig::default()
    };
    let node = match Node::builder()
        .sim_fabric(&fabric)
        .host_meta_with(cfg)
        .build()
    {
        Ok(n) => n,
        Err(e) => return failure(format!("start: {e}")),
    };
    let Some(server) = node.meta_server() else {
        return failure("the device has no DC: this binary serves DC fabrics");
    };
    if let Err(e) = server.publish_on_sim(&fabric, &args.name) {
        return failure(format!("publish as {:?}: {e}", args.name));
    }
    let b = server.bootstrap();
    let tcp = match &args.tcp {
        Some(addr) => match serve_bootstrap_tcp(addr.as_str(), &b) {
            Ok(t) => Some(t),
            Err(e) => return failure(format!("--tcp {addr}: {e}")),
        },
        None => None,
    };
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
        "bootstrap: gid {} dct_num {:#x} dc_key {:#x} meta_port {:#x}",
        b.server.gid, b.server.dct_num, b.server.dc_key, b.rpc_qpn
    );
    let _ = writeln!(
        out,
        "table: addr {:#x} rkey {:#x} len {} buckets {} slots/bucket {} incarnation {:#x}",
        b.table.addr, b.table.rkey, b.table_len, b.n_buckets, b.slots_per_bucket, b.incarnation
    );
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);
    // The node's thread serves; this one waits until the process is killed.
    loop {
        std::thread::park();
    }
}
