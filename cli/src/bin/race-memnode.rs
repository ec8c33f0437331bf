//! `race-memnode`: one memory node of a deployed RACE store.
//!
//! ```text
//! race-memnode --fabric F --meta HOST:PORT --store NAME --id I --nodes N --mb M
//!              [--expected-keys K] [--lease-ms MS] [--grant-lease-ms MS] [--wait-s S]
//!              [--meta-wait-s S] [--report-s S] [--config FILE] [--ready-file PATH]
//! race-memnode --daemon SOCKET --meta HOST:PORT --store NAME --id I --nodes N --mb M ...
//! race-memnode --status --meta HOST:PORT --store NAME
//! ```
//!
//! With `--status` it serves nothing: it prints the store's live members
//! (asked of the meta server over TCP) and exits 0 when they make a
//! complete store, 1 when not (the reason on one line).
//!
//! Opens a node on `--fabric`, registered with the meta server at `--meta`
//! (so compute nodes reach it by a metadata lookup), or with `--daemon`
//! attaches to the node daemon `krcored` at `SOCKET` (its node, already
//! registered: the region is the daemon's shared memory, the store joined
//! through the daemon's engine, which leaves it if this process dies;
//! `--fabric` and the `[engine]` settings are then the daemon's). It
//! registers an `M` MiB
//! region for remote READ, WRITE and atomics, and joins store `NAME` as
//! memory node `I` of `N`. Node 0 formats the table first; nodes `1..N`
//! wait (at most `--wait-s`, default 30) for node 0 to have joined. Node 0
//! presizes the table for `--expected-keys K` keys (initial subtables that
//! hold them without a split), spread over the nodes: each of the others
//! lays out its share before it joins. With
//! `--meta-wait-s S` a node whose meta server does not answer yet waits
//! for it (at most S seconds, saying so once on stderr). The
//! node's CPU then only answers block allocations (two-sided messages);
//! every key-value operation is one-sided. A client not heard from for
//! `--grant-lease-ms` (default 10 s) is taken for dead: the blocks of its
//! grants it never wrote are handed out again (`race_store::holders`).
//!
//! While it serves, a usage line goes to stderr every `--report-s` seconds
//! (default 60; 0: none): the region in use, the heap handed out and what
//! of it is pooled, the live grant leases, and what was given back,
//! handed out again and taken back since the last line. Once more than 90%
//! of the region is in use it warns (again after use fell below 80%):
//! clients' writes fail with "out of memory" when every node is full.
//!
//! Prints `ready: ...` (and writes it to `--ready-file`) once it has joined;
//! on SIGINT/SIGTERM it leaves the store, deregisters and exits 0. Exit
//! codes: 2 for a bad command line or config file; 1 when it cannot serve
//! (no such device, the meta server unreachable, the id taken, node 0
//! missing, ...), with the cause on one line. A node whose membership
//! lapsed (stopped or starved past `--lease-ms`) while node 0 was replaced
//! by one that formatted a new table leaves the store and exits 1 (its
//! region holds the old table's data where the new directory points).
#![forbid(unsafe_code)]

use clap::Parser;
use krcore::Node;
use krcore_cli::{
    announce_ready, build_waiting_for_meta, bytes_text, fail, init_tracing, load_toml,
    parse_fabric, percent, usage, Periodic, Shutdown,
};
use race_store::deploy::{DeployError, MemoryNodeOptions, DEFAULT_MEMBER_LEASE};
use race_store::memory::NodeStats;
use race_store::rdma::MemoryNodeServer;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const PROGRAM: &str = "race-memnode";
/// The shortest `--grant-lease-ms`.
const MIN_GRANT_LEASE_MS: u64 = 1000;
/// How often a serving node asks whether node 0 is still the one it
/// joined beside (`DeployedMemoryNode::check_standing`).
const STANDING_EVERY: Duration = Duration::from_secs(1);
/// Default seconds between usage lines.
const REPORT_EVERY_S: u64 = 60;
/// Percent of the region in use past which the node warns...
const FULL_WARN_PCT: u64 = 90;
/// ... and below which it warns again the next time.
const FULL_CLEAR_PCT: u64 = 80;

/// One memory node of a RACE store (one-sided hash table on disaggregated
/// memory).
#[derive(Parser, Debug)]
#[command(name = "race-memnode", version)]
struct Args {
    /// Fabric: sim:NAME, sim:/path, or verbs:DEVICE[,port=N][,gid=N].
    #[arg(long, conflicts_with = "daemon")]
    fabric: Option<String>,
    /// Attach to the node daemon (krcored) listening at this socket
    /// instead of opening a fabric.
    #[arg(long)]
    daemon: Option<PathBuf>,
    /// The meta server's TCP address [default: 127.0.0.1:7471].
    #[arg(long)]
    meta: Option<String>,
    /// The store's name (1..=32 of [A-Za-z0-9._-]).
    #[arg(long)]
    store: Option<String>,
    /// This memory node's id (0 formats the table).
    #[arg(long)]
    id: Option<u8>,
    /// Memory nodes in the store.
    #[arg(long)]
    nodes: Option<u8>,
    /// MiB of this node's region [default: 1024].
    #[arg(long)]
    mb: Option<u64>,
    /// Node 0: the keys the new table is presized for, so that its initial
    /// subtables hold them without a split (a split stalls the writers of
    /// its subtable for about 100 ms; 768 KiB each, one per 43,008 keys
    /// and at least 4 per node, rounded up to a power of two, spread
    /// evenly over the N nodes)
    /// [default: 0: one subtable, grown by splits]. Overrides the file's
    /// `[table] initial_global_depth`. Other nodes ignore it: they take
    /// node 0's table from its record and lay out their share of it (a
    /// region too small for the share is refused, naming what it needs).
    #[arg(long)]
    expected_keys: Option<u64>,
    /// Lease in ms of the store membership and of the node's meta entry
    /// (renewed every third) [default: 10000].
    #[arg(long)]
    lease_ms: Option<u64>,
    /// Lease in ms of a client on the node's grants, renewed by its
    /// requests: a client not heard from for that long is taken for dead,
    /// and the blocks of its grants it never wrote come back (at least
    /// 1000) [default: 10000].
    #[arg(long)]
    grant_lease_ms: Option<u64>,
    /// Seconds nodes 1..N wait for node 0 [default: 30].
    #[arg(long)]
    wait_s: Option<u64>,
    /// Seconds to wait for the meta server when nobody answers at `--meta`
    /// yet (a node started before its meta server) [default: 0: fail at
    /// once].
    #[arg(long)]
    meta_wait_s: Option<u64>,
    /// Seconds between usage lines on stderr (region in use, heap handed
    /// out and pooled, live grant leases, given back and taken back
    /// since the last line) [default: 60; 0: none]. A warning when more
    /// than 90% of the region is in use comes either way.
    #[arg(long)]
    report_s: Option<u64>,
    /// TOML file with any of the settings above (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Also write the readiness line to this file.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Print the members of `--store` (asked of the meta server at
    /// `--meta` over TCP: no fabric) and exit: 0 when they make a complete
    /// store, 1 when not (the reason on one line).
    #[arg(long)]
    status: bool,
}

/// Where the memory node's engine runs.
enum Host {
    /// An engine of its own on this fabric.
    Fabric(krcore_nic::FabricSpec),
    /// The node daemon at this socket.
    Daemon(PathBuf),
}

/// The settings a `--config` file may hold.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    fabric: Option<String>,
    meta: Option<String>,
    store: Option<String>,
    id: Option<u8>,
    nodes: Option<u8>,
    mb: Option<u64>,
    expected_keys: Option<u64>,
    lease_ms: Option<u64>,
    grant_lease_ms: Option<u64>,
    wait_s: Option<u64>,
    meta_wait_s: Option<u64>,
    report_s: Option<u64>,
    /// The engine's settings (`[engine]`: see `krcore::EngineConfig`).
    engine: krcore::EngineConfig,
    /// The table node 0 formats (`[table]`: see
    /// `race_store::memory::TableConfig`).
    table: race_store::memory::TableConfig,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(PROGRAM);
    let file: FileConfig = match load_toml(args.config.as_deref()) {
        Ok(f) => f,
        Err(e) => return usage(PROGRAM, e),
    };
    if args.status {
        let Some(store) = args.store.or(file.store) else {
            return usage(PROGRAM, "--status needs --store (see --help)");
        };
        let meta = args
            .meta
            .or(file.meta)
            .unwrap_or_else(|| krcore_cli::DEFAULT_META_ADDR.to_string());
        return status(&meta, &store);
    }
    let (Some(store), Some(id), Some(nodes)) = (
        args.store.or(file.store),
        args.id.or(file.id),
        args.nodes.or(file.nodes),
    ) else {
        return usage(
            PROGRAM,
            "--store, --id and --nodes are required (see --help)",
        );
    };
    // Where the node runs: a fabric of its own, or the node daemon.
    let host = match (args.daemon, args.fabric.or(file.fabric)) {
        (Some(path), _) => Host::Daemon(path),
        (None, Some(fabric)) => match parse_fabric(PROGRAM, &fabric) {
            Ok(s) => Host::Fabric(s),
            Err(code) => return code,
        },
        (None, None) => return usage(PROGRAM, "--fabric or --daemon is required (see --help)"),
    };
    if nodes == 0 || id >= nodes {
        return usage(PROGRAM, format!("--id {id} must be below --nodes {nodes}"));
    }
    let meta = args
        .meta
        .or(file.meta)
        .unwrap_or_else(|| krcore_cli::DEFAULT_META_ADDR.to_string());
    let mb = args.mb.or(file.mb).unwrap_or(1024);
    let Some(bytes) = mb.checked_mul(1 << 20).filter(|&b| b > 0) else {
        return usage(PROGRAM, format!("--mb {mb}: out of range"));
    };
    let mut opts = MemoryNodeOptions::new(&store, id, nodes, bytes, &meta);
    opts.table = match args.expected_keys.or(file.expected_keys) {
        Some(keys) => file.table.presized_for(keys, nodes),
        None => file.table,
    };
    opts.lease = args
        .lease_ms
        .or(file.lease_ms)
        .map_or(DEFAULT_MEMBER_LEASE, Duration::from_millis);
    if let Some(ms) = args.grant_lease_ms.or(file.grant_lease_ms) {
        // A quarter of it bounds how long a client may stall between carving a
        // block and writing it (race_store::holders): far above a client's
        // attempt deadline (100 ms by default).
        if !(MIN_GRANT_LEASE_MS..=u64::from(u32::MAX)).contains(&ms) {
            return usage(
                PROGRAM,
                format!(
                    "--grant-lease-ms {ms}: must be {MIN_GRANT_LEASE_MS}..={}",
                    u32::MAX
                ),
            );
        }
        opts.grant_lease = Duration::from_millis(ms);
    }
    if let Some(s) = args.wait_s.or(file.wait_s) {
        opts.wait = Duration::from_secs(s);
    }
    let shutdown = match Shutdown::install() {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    let meta_wait = Duration::from_secs(args.meta_wait_s.or(file.meta_wait_s).unwrap_or(0));
    let report_s = args.report_s.or(file.report_s).unwrap_or(REPORT_EVERY_S);
    if report_s > u64::from(u32::MAX) {
        return usage(PROGRAM, format!("--report-s {report_s}: out of range"));
    }
    let report_every = Duration::from_secs(report_s);
    // Refused starts end before the node registers: its meta entry would
    // replace that of a live node at the same GID (a process of the same
    // host). An unreachable meta server is left to the build (it may wait
    // for it) and to the same check in `deploy`.
    if let Err(e @ (DeployError::DuplicateId { .. } | DeployError::EarlierTable { .. })) =
        race_store::deploy::check_membership(&opts)
    {
        return fail(PROGRAM, &e);
    }
    let opened = match &host {
        Host::Fabric(spec) => build_waiting_for_meta(PROGRAM, meta_wait, &shutdown, || {
            Node::builder()
                .fabric_spec(spec.clone())
                // Room for an allocation port of ALLOC_PORT_SLOTS slots
                // (a recv_depth set larger in the file stays).
                .config(race_store::rdma::memory_node_engine(file.engine.clone()))
                .meta_addr(meta.as_str())
                .register(true)
                // The node's meta entry is kept as its membership is: a
                // dead node leaves the table and the store together, and a
                // restarted meta server has both back within one period.
                .lease(opts.lease)
                .build()
        }),
        Host::Daemon(path) => Node::attach(path),
    };
    let node = match opened {
        Ok(n) => n,
        Err(e) => return fail(PROGRAM, &e),
    };
    let served = match MemoryNodeServer::deploy(&node, &opts) {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    tracing::info!(store = %store, id, nodes, gid = %node.gid(), bytes, "memory node joined");
    let on = match &host {
        Host::Fabric(spec) => format!("fabric {spec}"),
        Host::Daemon(path) => format!("daemon {}", path.display()),
    };
    // How many clients may have an allocation out at once (the daemon's
    // msg.port_slots through krcored).
    let port = served
        .alloc_port_slots()
        .map_or_else(|| "the daemon's".to_string(), |n| n.to_string());
    let line = format!(
        "race-memnode store {store} id {id} of {nodes} {on} mode {:?} gid {} region {} MiB \
         allocation port {port} slots",
        node.mode(),
        node.gid(),
        mb
    );
    if let Err(e) = announce_ready(&line, args.ready_file.as_deref()) {
        return fail(PROGRAM, &e);
    }
    if let Some(old) = served.predecessor() {
        eprintln!(
            "{PROGRAM}: warning: memory node {id} of store {store} served its table before as \
             another process (incarnation {old:#x}): that data is lost and clients will refuse \
             the store; start the store anew (every memory node)"
        );
    }
    // A node whose membership lapsed while node 0 was replaced must not
    // serve the new table (race_store::deploy): it looks every second.
    let mut looked = Instant::now();
    let mut standing = Ok(());
    let mut report = Report::new(report_every, served.stats());
    shutdown.wait_until(Duration::from_millis(50), || {
        if looked.elapsed() < STANDING_EVERY {
            return false;
        }
        looked = Instant::now();
        if let Some(s) = served.stats() {
            for line in report.lines(&s, looked) {
                eprintln!("{PROGRAM}: {line}");
            }
        }
        standing = served.check_standing();
        standing.is_err()
    });
    if let Err(e) = standing {
        let _ = served.shutdown();
        return fail(PROGRAM, &e);
    }
    tracing::info!("signal received: leaving the store");
    let usage = served.stats().map(|s| {
        // The pool counts what it took back from dead clients as returned.
        format!(
            "; heap {} KiB handed out, clients gave back {} KiB, {} KiB taken back (grant leases ended: {}; {} KiB of it all reused, {} KiB pooled)",
            s.heap_used >> 10,
            s.pool.returned.saturating_sub(s.holders.reclaimed) >> 10,
            s.holders.reclaimed >> 10,
            s.holders.ended,
            s.pool.reused >> 10,
            s.pool.pooled >> 10
        )
    });
    match served.shutdown() {
        Ok(()) => {
            eprintln!(
                "{PROGRAM}: left store {store} (id {id}){}",
                usage.unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(PROGRAM, &e),
    }
}

/// The usage lines of a serving node (see the module docs).
struct Report {
    period: Periodic,
    last: NodeStats,
    /// Warned of a full region, and use has not fallen below
    /// [`FULL_CLEAR_PCT`] since.
    warned: bool,
}

impl Report {
    fn new(every: Duration, first: Option<NodeStats>) -> Self {
        Report {
            period: Periodic::new(every),
            last: first.unwrap_or_default(),
            warned: false,
        }
    }

    /// The lines due at `now` with figures `s`: a warning when use passed
    /// [`FULL_WARN_PCT`], the usage line when its time came.
    fn lines(&mut self, s: &NodeStats, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        let pct = in_use_pct(s);
        if pct > FULL_WARN_PCT && !self.warned {
            self.warned = true;
            out.push(format!(
                "warning: {pct}% of the region in use ({} of {}): clients' writes fail \
                 with \"out of memory\" once every memory node of the store is full",
                bytes_text(in_use(s)),
                bytes_text(s.capacity)
            ));
        } else if pct < FULL_CLEAR_PCT {
            self.warned = false;
        }
        if let Some(since) = self.period.due(now) {
            out.push(usage_line(s, &self.last, since));
            self.last = *s;
        }
        out
    }
}

/// Bytes of the region in use: handed out and not pooled (clients hold
/// them: linked, free in their lists, or in their grace period).
fn in_use(s: &NodeStats) -> u64 {
    s.heap_used.saturating_sub(s.pool.pooled)
}

fn in_use_pct(s: &NodeStats) -> u64 {
    percent(in_use(s), s.capacity)
}

/// One usage line: `s` now, against `last` `over` ago.
fn usage_line(s: &NodeStats, last: &NodeStats, over: Duration) -> String {
    // The pool counts what it took back from dead clients as returned.
    let reclaimed = s.holders.reclaimed.saturating_sub(last.holders.reclaimed);
    let given = s
        .pool
        .returned
        .saturating_sub(last.pool.returned)
        .saturating_sub(reclaimed);
    format!(
        "in use {} of {} ({}%): heap {} handed out, {} of it pooled ({} cooling); \
         {} live grant lease(s); last {} s: clients gave back {}, {} handed out again, \
         {} taken back from {} ended lease(s), {} of them ran out (killed or silent clients)",
        bytes_text(in_use(s)),
        bytes_text(s.capacity),
        in_use_pct(s),
        bytes_text(s.heap_used),
        bytes_text(s.pool.pooled),
        bytes_text(s.pool.cooling),
        s.holders.holders,
        over.as_secs(),
        bytes_text(given),
        bytes_text(s.pool.reused.saturating_sub(last.pool.reused)),
        bytes_text(reclaimed),
        s.holders.ended.saturating_sub(last.holders.ended),
        s.holders.ran_out.saturating_sub(last.holders.ran_out),
    )
}

/// `--status`: the store's members, one line each, and whether they make a
/// complete store.
fn status(meta: &str, store: &str) -> ExitCode {
    let (members, complete) = match race_store::deploy::store_members(meta, store) {
        Ok(m) => m,
        Err(e) => return fail(PROGRAM, &e),
    };
    let nodes = members.iter().find(|i| i.id == 0).map(|i| i.nodes);
    krcore_cli::outln!(
        "store {store} at {meta}: {} live member(s){}",
        members.len(),
        nodes.map_or(String::new(), |n| format!(
            ", {n} memory node(s) in node 0's table"
        ))
    );
    for i in &members {
        let table = i.table.map_or(String::new(), |t| {
            format!(
                ", table of {} initial subtable(s) (global depth {}, at most {})",
                1u64 << t.initial_global_depth,
                t.initial_global_depth,
                t.max_global_depth
            )
        });
        krcore_cli::outln!(
            "  node {}: gid {} region {} MiB incarnation {:#x}{table}",
            i.id,
            i.gid,
            i.len >> 20,
            i.incarnation
        );
    }
    match complete {
        Ok(()) => {
            krcore_cli::outln!("store {store}: complete");
            ExitCode::SUCCESS
        }
        Err(e) => fail(PROGRAM, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(heap_mib: u64, pooled_mib: u64) -> NodeStats {
        let mut s = NodeStats {
            capacity: 100 << 20,
            heap_used: heap_mib << 20,
            ..NodeStats::default()
        };
        s.pool.pooled = pooled_mib << 20;
        s
    }

    #[test]
    fn a_usage_line_comes_every_period_with_the_figures_since_the_last() {
        let t0 = Instant::now();
        let mut r = Report::new(Duration::from_secs(60), Some(stats(10, 0)));
        assert!(r
            .lines(&stats(20, 0), t0 + Duration::from_secs(30))
            .is_empty());
        let mut s = stats(40, 5);
        s.pool.returned = 8 << 20;
        s.pool.reused = 3 << 20;
        s.holders.reclaimed = 2 << 20;
        s.holders.ended = 1;
        s.holders.ran_out = 1;
        s.holders.holders = 3;
        let lines = r.lines(&s, t0 + Duration::from_secs(61));
        assert_eq!(lines.len(), 1, "{lines:?}");
        let l = &lines[0];
        assert!(l.starts_with("in use 35.0 MiB of 100.0 MiB (35%)"), "{l}");
        assert!(
            l.contains("heap 40.0 MiB handed out, 5.0 MiB of it pooled"),
            "{l}"
        );
        assert!(l.contains("3 live grant lease(s)"), "{l}");
        assert!(
            l.contains("clients gave back 6.0 MiB, 3.0 MiB handed out again, 2.0 MiB taken back from 1 ended lease(s), 1 of them ran out"),
            "{l}"
        );
        // The next line counts from this one.
        s.pool.reused = 4 << 20;
        let lines = r.lines(&s, t0 + Duration::from_secs(122));
        assert!(
            lines[0].contains("clients gave back 0 KiB, 1.0 MiB handed out again"),
            "{lines:?}"
        );
        // None with a period of 0.
        let mut off = Report::new(Duration::ZERO, None);
        assert!(off.lines(&s, t0 + Duration::from_secs(3600)).is_empty());
    }

    #[test]
    fn a_full_region_warns_once_until_use_falls_back() {
        let t0 = Instant::now();
        let mut r = Report::new(Duration::ZERO, None);
        assert!(r.lines(&stats(90, 0), t0).is_empty(), "90% is not past 90%");
        let w = r.lines(&stats(95, 2), t0);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("warning: 93% of the region in use (93.0 MiB of 100.0 MiB)"),
            "{w:?}"
        );
        assert!(r.lines(&stats(99, 0), t0).is_empty(), "once");
        assert!(r.lines(&stats(85, 0), t0).is_empty(), "not below 80% yet");
        assert!(r.lines(&stats(95, 0), t0).is_empty());
        assert!(r.lines(&stats(79, 0), t0).is_empty());
        assert_eq!(
            r.lines(&stats(91, 0), t0).len(),
            1,
            "again after it fell back"
        );
    }
}
