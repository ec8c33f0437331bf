//! `race-kv`: one key-value command against a deployed RACE store, for
//! operators and scripts (what `redis-cli` is to a Redis server).
//!
//! ```text
//! race-kv (--fabric F | --daemon SOCKET) [--meta HOST:PORT] --store NAME [--config FILE] COMMAND
//!   get KEY            the value on stdout (a newline after it on a terminal)
//!   put KEY VALUE      set (insert or replace); VALUE `-` reads stdin
//!   insert KEY VALUE   add an absent key (refused when present)
//!   delete KEY         remove a present key
//!   check              read the whole table, check its invariants, count its keys,
//!                      and say what each memory node's memory in use holds
//!   usage              every memory node's usage (one READ of its usage record each);
//!                      --format json or prometheus for monitoring
//!   sweep              remove the tentative copies killed inserters left (waits
//!                      grace - max_op ticks, 200 ms by default, when it finds any)
//!   collect            take back what killed clients left on the memory nodes, one
//!                      node at a time (each stops granting until its clients'
//!                      leases end: up to a grant lease); --dry-run only counts
//!   maintain           until SIGTERM, a round every --every-s seconds (600): sweep,
//!                      check, and collect each node with --collect-above-mib (256)
//!                      unlinked or more, or on which a client's lease ran out
//!                      since its last collection (not with --mark-only);
//!                      --once: one round (for cron)
//!   dump FILE          every pair into FILE (`-`: stdout), in `race_store::dump`'s format
//!   load FILE          put every pair of a dump (`-`: stdin), 64 per batch
//! ```
//!
//! `dump` scans the table (`race_store::Client::scan`) while writers may
//! run: each pair written was its key's value at some time during the
//! dump, and every key in the table for the whole dump is in it. Subtables
//! that split while it ran are read again, so a key may be written twice
//! (the later value last, which `load` keeps). A dump that could not see
//! the whole table (the table still split after several passes, or a key's
//! block kept changing under it) gets no footer, so `load` refuses it, and
//! exits 1 saying why: dump again with fewer writers. `load` puts the
//! pairs in order; at its first failure it exits 1 saying how many it
//! loaded. Both say on stderr what they start on, and every 10 s how far
//! they got; SIGINT or SIGTERM stops them (a dump without its footer, a
//! load between two batches or while it waits for more of stdin, saying
//! how many pairs it put), and the client
//! gives back what it borrowed before race-kv exits 1.
//!
//! Keys and values are the arguments' bytes. The client posts from a node of
//! its own on `--fabric` (another process's port is refused: use a GID of
//! its own, or the node daemon) or attached to `krcored` at `--daemon`; it
//! finds the store's memory nodes through the meta server (`--meta`, TCP)
//! and gives back what it borrowed before it exits.
//!
//! Exit codes: 0 done; 1 a failure (the cause on one line), including a key
//! that `get` or `delete` did not find and an `insert` of a present key;
//! 2 a bad command line or config file; 141, quietly, when stdout's reader
//! went away (`race-kv check | head -1`). `check` exits 1 when the table
//! has problems (each on a line).
//!
//! `check` splits each memory node's memory in use (its usage record, read
//! after the table) into its prefix, live subtables, subtables splits
//! retired, the KV blocks slots link, and the rest, *unlinked*: what running
//! clients hold (grants, free blocks, blocks in their grace period) and what
//! killed clients left behind, which stays allocated while the node runs
//! (a dump and a load into a new store gets it back). Run with no client
//! writing, the unlinked bytes are that loss.
#![forbid(unsafe_code)]

mod maintenance;

use clap::{Parser, Subcommand};
use krcore::Node;
use krcore_cli::{
    bytes_text, fail, init_tracing, load_toml, parse_fabric, stopped_by_signal, usage, Periodic,
    Shutdown, StoppableStdin,
};
use maintenance::{check, collect, maintain, sweep, usage_of, MaintainOptions, UsageFormat};
use race_store::client::Op;
use race_store::deploy::{Store, StoreOptions};
use race_store::dump::{DumpError, DumpReader, DumpWriter};
use race_store::{Client, Error};
use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const PROGRAM: &str = "race-kv";

/// One key-value command against a deployed RACE store.
#[derive(Parser, Debug)]
#[command(name = "race-kv", version)]
struct Args {
    /// Fabric of the client's own node: sim:NAME, sim:/path, or
    /// verbs:DEVICE[,port=N][,gid=N].
    #[arg(long, conflicts_with = "daemon")]
    fabric: Option<String>,
    /// Post through the node daemon (krcored) listening at this socket.
    #[arg(long)]
    daemon: Option<PathBuf>,
    /// The meta server's TCP address [default: 127.0.0.1:7471].
    #[arg(long)]
    meta: Option<String>,
    /// The store's name.
    #[arg(long)]
    store: Option<String>,
    /// Seconds to wait for the store to be complete [default: 5].
    #[arg(long)]
    wait_s: Option<u64>,
    /// TOML file with `[engine]` (the client node's `EngineConfig`) and
    /// `[client]` (race-store's `ClientConfig`), and any of `fabric`,
    /// `meta`, `store`, `wait_s` (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the value of KEY.
    Get { key: OsString },
    /// Set KEY to VALUE (`-`: read VALUE from stdin).
    Put { key: OsString, value: OsString },
    /// Add KEY with VALUE; refused when KEY is present.
    Insert { key: OsString, value: OsString },
    /// Remove KEY.
    Delete { key: OsString },
    /// Read the whole table, check its invariants and count its keys; then
    /// say what each memory node's memory in use holds: its prefix, live
    /// and retired subtables, the values the table links, and the rest
    /// (unlinked: what running clients hold, or killed ones left behind).
    Check,
    /// Write every pair of the store into FILE (`-`: stdout), for `load`.
    Dump { file: OsString },
    /// Put every pair of a dump FILE (`-`: stdin) into the store.
    Load { file: OsString },
    /// Every memory node's usage: region in use, heap handed out and
    /// pooled, live grant leases, memory taken back from ended leases
    /// (each node's usage record, read with one-sided READs).
    Usage {
        /// text (lines for people), json (one object), or prometheus
        /// (the text exposition format, e.g. for node_exporter's textfile
        /// collector).
        #[arg(long, value_enum, default_value_t = UsageFormat::Text)]
        format: UsageFormat,
    },
    /// Remove the tentative copies that killed inserters left (`check`
    /// counts them): read the table, wait out the time an inserter may
    /// take to commit (grace_ticks - max_op_ticks of the client config,
    /// 200 ms by default) when any were found, then remove those still
    /// unchanged. Safe beside running clients.
    Sweep,
    /// Take back what killed clients left on the memory nodes (written and
    /// not linked, retired, free: what `check` counts as unlinked once no
    /// client runs), one node at a time: the node grants and renews
    /// nothing until every client's lease on it ended (up to a grant
    /// lease, 10 s by default: writers use the other nodes meanwhile, and
    /// get an error on a one-node store), then the table is read and the
    /// node takes back what nothing links, pools or holds. Readers go on.
    Collect {
        /// Only count what would be taken back.
        #[arg(long)]
        dry_run: bool,
        /// Collect only this memory node (repeatable; default: every node).
        #[arg(long = "node", value_name = "ID")]
        nodes: Vec<u8>,
        /// Give up on a node whose clients' leases did not end within this
        /// many seconds (nothing is taken back from it).
        #[arg(long, default_value_t = 60, value_name = "S")]
        max_drain_s: u64,
    },
    /// Look after the store until SIGINT or SIGTERM: a round every
    /// --every-s seconds runs `sweep`, `check` (light: the subtables
    /// alone, no value read), and `collect` on each
    /// memory node whose unlinked bytes (`check`'s figure: what running
    /// clients hold and killed ones left) reached --collect-above-mib.
    /// Prints a ready line, then each step's lines; a step that fails is
    /// said on stderr and tried again next round.
    Maintain {
        /// Seconds from the start of a round to the start of the next.
        #[arg(long, default_value_t = 600, value_name = "S",
              value_parser = clap::value_parser!(u64).range(1..))]
        every_s: u64,
        /// Collect a node once this many MiB of it are unlinked (0: every
        /// round). Set it above what the running clients hold (free lists
        /// up to 2 MiB per size class and node, grants, blocks in their
        /// grace period): a collection costs writers the node's new
        /// memory for up to a grant lease. A node on which a client's
        /// lease ran out since its last collection (a killed client's, or
        /// one silent for a lease) is collected whatever its unlinked
        /// bytes, unless --mark-only.
        #[arg(long, default_value_t = 256, value_name = "MIB")]
        collect_above_mib: u64,
        /// Collect by --collect-above-mib alone, not after a lease ran out.
        #[arg(long)]
        mark_only: bool,
        /// As for `collect`.
        #[arg(long, default_value_t = 60, value_name = "S")]
        max_drain_s: u64,
        /// One round, then exit: 0, or 1 when a step failed or the table
        /// has problems (for cron).
        #[arg(long)]
        once: bool,
    },
}

/// The settings a `--config` file may hold.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    fabric: Option<String>,
    meta: Option<String>,
    store: Option<String>,
    wait_s: Option<u64>,
    engine: krcore::EngineConfig,
    client: race_store::ClientConfig,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(PROGRAM);
    let file: FileConfig = match load_toml(args.config.as_deref()) {
        Ok(f) => f,
        Err(e) => return usage(PROGRAM, e),
    };
    let Some(store_name) = args.store.or(file.store) else {
        return usage(PROGRAM, "--store is required (see --help)");
    };
    let meta = args
        .meta
        .or(file.meta)
        .unwrap_or_else(|| krcore_cli::DEFAULT_META_ADDR.to_string());
    let opts = StoreOptions {
        wait: Duration::from_secs(args.wait_s.or(file.wait_s).unwrap_or(5)),
        client: file.client,
        engine: file.engine.clone(),
        ..StoreOptions::default()
    };
    let node = match (args.daemon, args.fabric.or(file.fabric)) {
        (Some(path), _) => Node::attach(&path),
        (None, Some(fabric)) => {
            if let Err(code) = parse_fabric(PROGRAM, &fabric) {
                return code;
            }
            Node::builder()
                .fabric(&fabric)
                .config(file.engine)
                .meta_addr(&meta)
                .build()
        }
        (None, None) => return usage(PROGRAM, "--fabric or --daemon is required (see --help)"),
    };
    let node = match node {
        Ok(n) => n,
        Err(e) => return fail(PROGRAM, &e),
    };
    let store = match Store::open(&node, &meta, &store_name, opts) {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    match args.command {
        Command::Usage { format } => return usage_of(&store, format),
        Command::Maintain {
            every_s,
            collect_above_mib,
            mark_only,
            max_drain_s,
            once,
        } => {
            let opts = MaintainOptions {
                every: Duration::from_secs(every_s),
                collect_above: collect_above_mib.saturating_mul(1 << 20),
                after_ran_out: !mark_only,
                max_drain: Duration::from_secs(max_drain_s),
                once,
            };
            return maintain(&store, || store.client(), &opts);
        }
        _ => {}
    }
    let mut client = match store.client() {
        Ok(c) => c,
        Err(e) => return fail(PROGRAM, &e),
    };
    let code = run(&mut client, &store, args.command);
    let closed = client.close();
    if let Some(e) = closed.error {
        // The command's outcome stands; the memory it kept is the nodes'
        // to take back when its lease ends.
        eprintln!("{PROGRAM}: warning: giving memory back: {e}");
    }
    code
}

/// Runs `command` with `client` (`check` also reads `store`'s usage records);
/// its exit code.
fn run<T: race_store::remote::Transport>(
    client: &mut Client<T>,
    store: &Store,
    command: Command,
) -> ExitCode {
    let bytes = |s: &OsString| s.as_bytes().to_vec();
    let outcome = match command {
        Command::Get { key } => match client.get(key.as_bytes()) {
            Ok(Some(v)) => {
                let mut out = std::io::stdout().lock();
                let newline = std::io::stdout().is_terminal();
                let written = out
                    .write_all(&v)
                    .and_then(|()| {
                        if newline {
                            out.write_all(b"\n")
                        } else {
                            Ok(())
                        }
                    })
                    .and_then(|()| out.flush());
                return match written {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => fail(PROGRAM, &e),
                };
            }
            Ok(None) => Err(Error::NotFound),
            Err(e) => Err(e),
        },
        Command::Put { key, value } | Command::Insert { key, value }
            if value.as_bytes() == b"-" =>
        {
            let mut v = Vec::new();
            if let Err(e) = std::io::stdin().read_to_end(&mut v) {
                return fail(PROGRAM, &e);
            }
            client.put(key.as_bytes(), &v)
        }
        Command::Put { key, value } => client.put(key.as_bytes(), &bytes(&value)),
        Command::Insert { key, value } => client.insert(key.as_bytes(), &bytes(&value)),
        Command::Delete { key } => client.delete(key.as_bytes()),
        Command::Check => return check(client, store),
        Command::Dump { file } => return dump_to(client, &file),
        Command::Load { file } => return load_from(client, &file),
        Command::Sweep => return sweep(client),
        Command::Collect {
            dry_run,
            nodes,
            max_drain_s,
        } => return collect(client, dry_run, nodes, max_drain_s),
        // Answered before a client opens (main); never reach here.
        Command::Usage { .. } | Command::Maintain { .. } => {
            return usage(PROGRAM, "usage and maintain are answered without a client")
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(PROGRAM, &e),
    }
}

/// Pairs put per batch by `load`.
const LOAD_BATCH: usize = 64;

/// `file` as said on stderr: `dash` for `-`.
fn name_of(file: &OsString, dash: &str) -> String {
    if file.as_bytes() == b"-" {
        dash.to_string()
    } else {
        file.to_string_lossy().into_owned()
    }
}

/// How often `dump` and `load` say how far they got (on stderr).
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// `dump FILE`: every pair of the table into FILE (see the module docs).
fn dump_to<T: race_store::remote::Transport>(client: &mut Client<T>, file: &OsString) -> ExitCode {
    let started = Instant::now();
    let out: Box<dyn Write> = if file.as_bytes() == b"-" {
        if std::io::stdout().is_terminal() {
            return usage(
                PROGRAM,
                "dump -: stdout is a terminal (redirect it to a file)",
            );
        }
        Box::new(std::io::stdout().lock())
    } else {
        match std::fs::File::create(file) {
            Ok(f) => Box::new(f),
            Err(e) => return fail(PROGRAM, &FileError::new(file, e)),
        }
    };
    let mut w = match DumpWriter::new(std::io::BufWriter::new(out)) {
        Ok(w) => w,
        Err(e) => return fail(PROGRAM, &e),
    };
    let shutdown = match Shutdown::install() {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    eprintln!("{PROGRAM}: dumping into {}", name_of(file, "stdout"));
    let mut progress = Periodic::new(PROGRESS_EVERY);
    let mut failed = None;
    let mut bytes = 0u64;
    let mut pairs = 0u64;
    let report = client.scan(|k, v| {
        if shutdown.requested() {
            return false;
        }
        if let Err(e) = w.pair(k, v) {
            failed = Some(e);
            return false;
        }
        bytes += (k.len() + v.len()) as u64;
        pairs += 1;
        if pairs % 1024 == 0 && progress.due(Instant::now()).is_some() {
            eprintln!(
                "{PROGRAM}: dump: {pairs} pair(s), {} so far ({:.0} s)",
                bytes_text(bytes),
                started.elapsed().as_secs_f64()
            );
        }
        true
    });
    if let Some(e) = failed {
        return fail(PROGRAM, &e);
    }
    let report = match report {
        Ok(r) => r,
        Err(e) => return fail(PROGRAM, &e),
    };
    if shutdown.requested() {
        eprintln!(
            "{PROGRAM}: dump stopped by a signal after {pairs} pair(s); it has no footer, \
             so load refuses it"
        );
        return ExitCode::FAILURE;
    }
    if !report.complete() {
        // No footer: `load` refuses what was written.
        let why = if report.directory_changed {
            format!(
                "the table still split after {} passes over the subtables that split \
                 (keys the last splits moved may be missing)",
                race_store::client::RESCAN_PASSES
            )
        } else {
            format!(
                "{} key(s) changed under it on every read and are missing",
                report.skipped
            )
        };
        eprintln!(
            "{PROGRAM}: the dump is incomplete: {why}; it has no footer, so load refuses it: \
             dump again with fewer writers"
        );
        return ExitCode::FAILURE;
    }
    match w.finish() {
        Ok(n) => {
            eprintln!(
                "{PROGRAM}: dumped {n} pair(s) ({} of keys and values) from {} subtable(s) \
                 ({} read again after splits) in {:.1} s",
                bytes_text(bytes),
                report.subtables,
                report.rescanned,
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(PROGRAM, &e),
    }
}

/// `load FILE`: put every pair of a dump, [`LOAD_BATCH`] per batch.
fn load_from<T: race_store::remote::Transport>(
    client: &mut Client<T>,
    file: &OsString,
) -> ExitCode {
    let started = Instant::now();
    let shutdown = match Shutdown::install() {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    // Standard input is read on a thread of its own: a load waiting for a
    // slow or stalled writer still stops at a signal.
    let input: Box<dyn Read> = if file.as_bytes() == b"-" {
        match StoppableStdin::new(&shutdown) {
            Ok(s) => Box::new(s),
            Err(e) => return fail(PROGRAM, &e),
        }
    } else {
        match std::fs::File::open(file) {
            Ok(f) => Box::new(f),
            Err(e) => return fail(PROGRAM, &FileError::new(file, e)),
        }
    };
    let stopped = |loaded: u64| {
        // Between batches: every pair counted is in the store.
        eprintln!("{PROGRAM}: load stopped by a signal after {loaded} pair(s)");
        ExitCode::FAILURE
    };
    let mut r = match DumpReader::new(std::io::BufReader::new(input)) {
        Ok(r) => r,
        Err(DumpError::Io(e)) if stopped_by_signal(&e) => return stopped(0),
        Err(e) => return fail(PROGRAM, &e),
    };
    eprintln!("{PROGRAM}: loading {}", name_of(file, "stdin"));
    let mut progress = Periodic::new(PROGRESS_EVERY);
    let mut loaded = 0u64;
    loop {
        if shutdown.requested() {
            return stopped(loaded);
        }
        if progress.due(Instant::now()).is_some() {
            eprintln!(
                "{PROGRAM}: load: {loaded} pair(s) so far ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
        }
        let mut pairs = Vec::with_capacity(LOAD_BATCH);
        let mut end = false;
        while pairs.len() < LOAD_BATCH {
            match r.next_pair() {
                Ok(Some(p)) => pairs.push(p),
                Ok(None) => {
                    end = true;
                    break;
                }
                Err(e) => {
                    // What was read before the damage (or the signal) is
                    // put: a loader that stops says how far it got.
                    let put = put_all(client, &pairs, &mut loaded);
                    return match e {
                        DumpError::Io(io) if stopped_by_signal(&io) => match put {
                            Ok(()) => stopped(loaded),
                            Err(e) => fail(PROGRAM, &LoadStopped::new(loaded, &e)),
                        },
                        e => fail(PROGRAM, &LoadStopped::new(loaded, &e)),
                    };
                }
            }
        }
        if let Err(e) = put_all(client, &pairs, &mut loaded) {
            return fail(PROGRAM, &LoadStopped::new(loaded, &e));
        }
        if end {
            break;
        }
    }
    eprintln!(
        "{PROGRAM}: loaded {loaded} pair(s) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

/// Puts `pairs` as one batch, counting those that succeeded in `loaded`;
/// the first failure.
fn put_all<T: race_store::remote::Transport>(
    client: &mut Client<T>,
    pairs: &[(Vec<u8>, Vec<u8>)],
    loaded: &mut u64,
) -> Result<(), Error> {
    let ops: Vec<Op<'_>> = pairs.iter().map(|(k, v)| Op::Put(k, v)).collect();
    let mut first = None;
    for reply in client.batch(&ops) {
        match reply {
            Ok(_) => *loaded += 1,
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// A load that stopped at an error, and how far it got (one line).
#[derive(Debug, thiserror::Error)]
#[error("{cause} ({loaded} pair(s) loaded before it)")]
struct LoadStopped {
    loaded: u64,
    cause: String,
}

impl LoadStopped {
    fn new(loaded: u64, e: &(dyn std::error::Error + 'static)) -> Self {
        LoadStopped {
            loaded,
            cause: krcore_cli::error_chain(e),
        }
    }
}

/// A file that could not be opened or created, with its name.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", .path.to_string_lossy())]
struct FileError {
    path: OsString,
    source: std::io::Error,
}

impl FileError {
    fn new(path: &OsString, source: std::io::Error) -> Self {
        FileError {
            path: path.clone(),
            source,
        }
    }
}
