//! `race-kv`: one key-value command against a deployed RACE store, for
//! operators and scripts (what `redis-cli` is to a Redis server).
//!
//! ```text
//! race-kv (--fabric F | --daemon SOCKET) [--meta HOST:PORT] --store NAME [--config FILE] COMMAND
//!   get KEY            the value on stdout (a newline after it on a terminal)
//!   put KEY VALUE      set (insert or replace); VALUE `-` reads stdin
//!   insert KEY VALUE   add an absent key (refused when present)
//!   delete KEY         remove a present key
//!   check              read the whole table, check its invariants, count its keys
//!   usage              every memory node's usage (one READ of its usage record each)
//! ```
//!
//! Keys and values are the arguments' bytes. The client posts from a node of
//! its own on `--fabric` (another process's port is refused: use a GID of
//! its own, or the node daemon) or attached to `krcored` at `--daemon`; it
//! finds the store's memory nodes through the meta server (`--meta`, TCP)
//! and gives back what it borrowed before it exits.
//!
//! Exit codes: 0 done; 1 a failure (the cause on one line), including a key
//! that `get` or `delete` did not find and an `insert` of a present key;
//! 2 a bad command line or config file. `check` exits 1 when the table has
//! problems (each on a line).
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use krcore::Node;
use krcore_cli::{bytes_text, fail, init_tracing, load_toml, parse_fabric, usage};
use race_store::deploy::{Store, StoreOptions};
use race_store::{Client, Error};
use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
    /// Read the whole table, check its invariants and count its keys.
    Check,
    /// Every memory node's usage: region in use, heap handed out and
    /// pooled, live grant leases, memory taken back from ended leases
    /// (each node's usage record, read with one-sided READs).
    Usage,
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
    if let Command::Usage = args.command {
        return usage_of(&store);
    }
    let mut client = match store.client() {
        Ok(c) => c,
        Err(e) => return fail(PROGRAM, &e),
    };
    let code = run(&mut client, args.command);
    let closed = client.close();
    if let Some(e) = closed.error {
        // The command's outcome stands; the memory it kept is the nodes'
        // to take back when its lease ends.
        eprintln!("{PROGRAM}: warning: giving memory back: {e}");
    }
    code
}

/// Runs `command` with `client`; its exit code.
fn run<T: race_store::remote::Transport>(client: &mut Client<T>, command: Command) -> ExitCode {
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
        Command::Check => return check(client),
        // Answered before a client opens (main); never reaches here.
        Command::Usage => return usage(PROGRAM, "usage is answered without a client"),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(PROGRAM, &e),
    }
}

/// A usage record older than this is called stale (its node stopped
/// writing it: stopped, hung, or gone).
const STALE_MS: u64 = 10_000;

/// `usage`: each memory node's usage record, and the store's total.
fn usage_of(store: &Store) -> ExitCode {
    let nodes = match store.usage() {
        Ok(n) => n,
        Err(e) => return fail(PROGRAM, &e),
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let (mut in_use, mut capacity) = (0u64, 0u64);
    for (id, u) in &nodes {
        let Some(u) = u else {
            println!("node {id}: no usage record (a node of an older build, or one that has just started)");
            continue;
        };
        in_use += u.in_use();
        capacity += u.capacity;
        let age = now_ms.saturating_sub(u.written_ms);
        let stale = if age > STALE_MS {
            format!(
                " (stale: written {} s ago; the node stopped writing it)",
                age / 1000
            )
        } else {
            String::new()
        };
        println!(
            "node {id}: in use {} of {} ({}%): heap {} handed out, {} of it pooled ({} cooling); \
             {} live grant lease(s); {} taken back so far, from {} ended lease(s){stale}",
            bytes_text(u.in_use()),
            bytes_text(u.capacity),
            pct(u.in_use(), u.capacity),
            bytes_text(u.heap_used),
            bytes_text(u.pooled),
            bytes_text(u.cooling),
            u.holders,
            bytes_text(u.reclaimed),
            u.ended,
        );
    }
    println!(
        "store {}: in use {} of {} ({}%) on {} memory node(s) with a record",
        store.name(),
        bytes_text(in_use),
        bytes_text(capacity),
        pct(in_use, capacity),
        nodes.iter().filter(|(_, u)| u.is_some()).count(),
    );
    ExitCode::SUCCESS
}

fn pct(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    u64::try_from(u128::from(part) * 100 / u128::from(whole)).unwrap_or(100)
}

/// `check`: the table's invariants and its key count.
fn check<T: race_store::remote::Transport>(client: &mut Client<T>) -> ExitCode {
    let c = match client.check_table() {
        Ok(c) => c,
        Err(e) => return fail(PROGRAM, &e),
    };
    for p in &c.problems {
        println!("problem: {p}");
    }
    println!(
        "global depth {}, {} subtables (per memory node: {:?}), {} keys, {} duplicates, {} problem(s)",
        c.global_depth,
        c.subtables,
        c.subtables_per_node,
        c.pairs.len(),
        c.duplicates,
        c.problems.len()
    );
    if c.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
