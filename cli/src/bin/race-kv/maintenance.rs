//! The commands that look after a store rather than its keys: `usage`,
//! `check`, `sweep`, `collect`, and `maintain`, which runs the last three
//! on a schedule.

use crate::PROGRAM;
use krcore_cli::{bytes_text, fail, percent, Shutdown};
use race_store::client::{CollectOptions, NodeCollect};
use race_store::deploy::Store;
use race_store::layout::usage::UsageRepr;
use race_store::remote::Transport;
use race_store::{Client, Error};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Any error of a maintenance step, as the step's line says it.
type StepError = Box<dyn std::error::Error + Send + Sync>;

/// A usage record older than this is called stale (its node stopped
/// writing it: stopped, hung, or gone).
const STALE_MS: u64 = 10_000;

/// How `usage` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum UsageFormat {
    /// A line per node, and the store's total.
    Text,
    /// One JSON object: the store, its nodes and their records.
    Json,
    /// Prometheus's text exposition format.
    Prometheus,
}

/// `usage`: each memory node's usage record, and the store's total.
pub(crate) fn usage_of(store: &Store, format: UsageFormat) -> ExitCode {
    let nodes = match store.usage() {
        Ok(n) => n,
        Err(e) => return fail(PROGRAM, &e),
    };
    let now_ms = race_store::layout::usage::wall_ms();
    match format {
        UsageFormat::Text => usage_text(store, &nodes, now_ms),
        UsageFormat::Json => krcore_cli::outln!("{}", usage_json(store.name(), &nodes, now_ms)),
        UsageFormat::Prometheus => {
            krcore_cli::outln!(
                "{}",
                usage_prometheus(store.name(), &nodes, now_ms).trim_end()
            );
        }
    }
    ExitCode::SUCCESS
}

fn usage_text(store: &Store, nodes: &[(u8, Option<UsageRepr>)], now_ms: u64) {
    let (mut in_use, mut capacity) = (0u64, 0u64);
    for (id, u) in nodes {
        let Some(u) = u else {
            krcore_cli::outln!("node {id}: no usage record (a node of an older build, or one that has just started)");
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
        krcore_cli::outln!(
            "node {id}: in use {} of {} ({}%): heap {} handed out, {} of it pooled ({} cooling); \
             {} live grant lease(s); {} taken back so far, from {} ended lease(s){}{stale}",
            bytes_text(u.in_use()),
            bytes_text(u.capacity),
            percent(u.in_use(), u.capacity),
            bytes_text(u.heap_used),
            bytes_text(u.pooled),
            bytes_text(u.cooling),
            u.holders,
            bytes_text(u.reclaimed),
            u.ended,
            ran_out_text(u.ran_out_since_collection),
        );
    }
    krcore_cli::outln!(
        "store {}: in use {} of {} ({}%) on {} memory node(s) with a record",
        store.name(),
        bytes_text(in_use),
        bytes_text(capacity),
        percent(in_use, capacity),
        nodes.iter().filter(|(_, u)| u.is_some()).count(),
    );
}

/// The records as one JSON object: `{"store", "nodes": [{"node",
/// "record"}]}`, a record `null` for a node without one, its age in ms
/// beside its fields.
fn usage_json(store: &str, nodes: &[(u8, Option<UsageRepr>)], now_ms: u64) -> String {
    let nodes: Vec<serde_json::Value> = nodes
        .iter()
        .map(|(id, u)| {
            let record = u.map(|u| {
                serde_json::json!({
                    "written_ms": u.written_ms,
                    "age_ms": now_ms.saturating_sub(u.written_ms),
                    "capacity": u.capacity,
                    "in_use": u.in_use(),
                    "heap_used": u.heap_used,
                    "pooled": u.pooled,
                    "cooling": u.cooling,
                    "returned": u.returned,
                    "reused": u.reused,
                    "reclaimed": u.reclaimed,
                    "ended_leases": u.ended,
                    "live_leases": u.holders,
                    "doomed_kib": u.doomed_kib,
                    "ran_out_since_collection": u.ran_out_since_collection,
                })
            });
            serde_json::json!({ "node": id, "record": record })
        })
        .collect();
    serde_json::json!({ "store": store, "nodes": nodes }).to_string()
}

/// The records in Prometheus's text exposition format: a gauge or a
/// counter per field, labelled with the store and the node; a node
/// without a record has `race_store_usage_record 0` only.
fn usage_prometheus(store: &str, nodes: &[(u8, Option<UsageRepr>)], now_ms: u64) -> String {
    type Field = fn(&UsageRepr, u64) -> Option<u64>;
    let metrics: [(&str, &str, &str, Field); 13] = [
        ("capacity_bytes", "gauge", "Bytes of the node's region.", |u, _| Some(u.capacity)),
        ("in_use_bytes", "gauge", "Bytes handed out and not pooled (clients hold them).", |u, _| {
            Some(u.in_use())
        }),
        ("heap_used_bytes", "gauge", "Bytes handed out by the block allocator.", |u, _| {
            Some(u.heap_used)
        }),
        ("pooled_bytes", "gauge", "Bytes given back, pooled to hand out again.", |u, _| {
            Some(u.pooled)
        }),
        ("cooling_bytes", "gauge", "Pooled bytes still in their grace period.", |u, _| {
            Some(u.cooling)
        }),
        ("returned_bytes_total", "counter", "Bytes given back since the node started.", |u, _| {
            Some(u.returned)
        }),
        ("reused_bytes_total", "counter", "Bytes handed out again since the node started.", |u, _| {
            Some(u.reused)
        }),
        ("reclaimed_bytes_total", "counter", "Bytes taken back from ended leases since the node started.", |u, _| {
            Some(u.reclaimed)
        }),
        ("leases_ended_total", "counter", "Grant leases that ended since the node started.", |u, _| {
            Some(u.ended)
        }),
        ("live_leases", "gauge", "Clients holding grants now.", |u, _| Some(u64::from(u.holders))),
        ("doomed_bytes", "gauge", "Bytes of dead clients' grants not read yet.", |u, _| {
            Some(u64::from(u.doomed_kib) << 10)
        }),
        (
            "leases_ran_out_since_collection",
            "gauge",
            "Grant leases that ran out since the node's last collection (killed or silent clients).",
            |u, _| u.ran_out_since_collection.map(u64::from),
        ),
        ("record_age_seconds", "gauge", "Age of the node's usage record.", |u, now| {
            Some(now.saturating_sub(u.written_ms) / 1000)
        }),
    ];
    let label = |id: u8| format!("{{store=\"{}\",node=\"{id}\"}}", store.escape_default());
    let mut out = String::new();
    out.push_str("# HELP race_store_usage_record Whether the node has a usage record.\n");
    out.push_str("# TYPE race_store_usage_record gauge\n");
    for (id, u) in nodes {
        out.push_str(&format!(
            "race_store_usage_record{} {}\n",
            label(*id),
            u64::from(u.is_some())
        ));
    }
    for (name, kind, help, field) in metrics {
        out.push_str(&format!("# HELP race_store_node_{name} {help}\n"));
        out.push_str(&format!("# TYPE race_store_node_{name} {kind}\n"));
        for (id, u) in nodes {
            if let Some(v) = u.as_ref().and_then(|u| field(u, now_ms)) {
                out.push_str(&format!("race_store_node_{name}{} {v}\n", label(*id)));
            }
        }
    }
    out
}

/// A node's leases that ran out since its last collection, for a line
/// that says its usage ("" from a node of an older build).
fn ran_out_text(ran_out: Option<u32>) -> String {
    match ran_out {
        Some(0) => "; no lease ran out since its last collection".to_string(),
        Some(n) => format!(
            "; {n} lease(s) ran out since its last collection (killed or silent clients: \
             what they left is taken back by a collection)"
        ),
        None => String::new(),
    }
}

/// `collect`: what killed clients left, taken back node by node.
pub(crate) fn collect<T: Transport>(
    client: &mut Client<T>,
    dry_run: bool,
    nodes: Vec<u8>,
    max_drain_s: u64,
) -> ExitCode {
    let shutdown = match Shutdown::install() {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    let opts = CollectOptions {
        apply: !dry_run,
        nodes: (!nodes.is_empty()).then_some(nodes),
        max_drain: Duration::from_secs(max_drain_s),
        cancel: Some(shutdown.flag()),
    };
    let started = Instant::now();
    let done = match client.collect(&opts) {
        Ok(d) => d,
        Err(e) => return fail(PROGRAM, &e),
    };
    let verb = collect_verb(dry_run);
    for n in &done {
        print_collected(n, verb);
    }
    krcore_cli::outln!(
        "{} memory node(s): {verb} {}; {:.1} s",
        done.len(),
        bytes_text(done.iter().map(|n| n.collected.bytes).sum()),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

fn collect_verb(dry_run: bool) -> &'static str {
    if dry_run {
        "would take back"
    } else {
        "took back"
    }
}

/// A node's collection, on one line.
fn print_collected(n: &NodeCollect, verb: &str) {
    krcore_cli::outln!(
        "node {}: leases ended after {:.2} s; {} subtable(s) read, {} linked block(s) ({}); \
         {verb} {} in {} run(s)",
        n.node,
        n.drained.as_secs_f64(),
        n.subtables,
        n.live_blocks,
        bytes_text(n.live_bytes),
        bytes_text(n.collected.bytes),
        n.collected.runs
    );
}

/// `sweep`: the tentative copies of killed inserters removed.
pub(crate) fn sweep<T: Transport>(client: &mut Client<T>) -> ExitCode {
    match sweep_step(client) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(PROGRAM, &e),
    }
}

/// The sweep, its outcome printed.
fn sweep_step<T: Transport>(client: &mut Client<T>) -> Result<(), Error> {
    let started = Instant::now();
    let r = client.sweep_tentative()?;
    krcore_cli::outln!(
        "{} subtable(s) read, {} tentative slot(s) found: {} removed, {} changed while \
         the sweep waited (live inserts), {} left in subtables being split; {:.1} s",
        r.subtables,
        r.tentative,
        r.removed,
        r.changed,
        r.splitting,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `check`: the table's invariants and its key count, then what each
/// memory node's memory in use holds; exits 1 when the table has problems.
pub(crate) fn check<T: Transport>(client: &mut Client<T>, store: &Store) -> ExitCode {
    match check_step(client, store, true) {
        Ok(c) if c.problems == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => fail(PROGRAM, &*e),
    }
}

/// What a check found that `maintain` acts on.
struct Checked {
    /// Problems the table has (each printed).
    problems: usize,
    /// Each memory node's unlinked bytes, and the leases that ran out on
    /// it since its last collection (nodes with a usage record).
    nodes: Vec<NodeChecked>,
}

/// A memory node, as a check found it.
struct NodeChecked {
    node: u8,
    unlinked: u64,
    /// `None` from a node of an older build.
    ran_out: Option<u32>,
}

/// The table checked and each node's memory in use split, printed.
/// With `values`, the full check (`Client::check_table_counts`: every KV
/// block read and verified, one subtable's keys held at a time); without,
/// the light one (`Client::account_table`: the subtables alone), which
/// says the same of each node's memory.
fn check_step<T: Transport>(
    client: &mut Client<T>,
    store: &Store,
    values: bool,
) -> Result<Checked, StepError> {
    let c = if values {
        client.check_table_counts()?
    } else {
        client.account_table()?
    };
    for p in &c.problems {
        krcore_cli::outln!("problem: {p}");
    }
    let content = if values {
        format!("{} keys, {} duplicates", c.keys, c.duplicates)
    } else {
        "values not read".to_string()
    };
    krcore_cli::outln!(
        "global depth {}, {} subtables (per memory node: {:?}), {content}, {} problem(s), {} tentative slot(s)",
        c.global_depth,
        c.subtables,
        c.subtables_per_node,
        c.problems.len(),
        c.tentative_slots
    );
    if c.locked || c.split_logged || c.frozen_slots > 0 {
        // A split running now, or one a dead client left: the next writer
        // that needs the lock takes it over once its lease ends.
        krcore_cli::outln!(
            "split: directory {}, split {}, {} frozen slot(s) (a split in progress, or one a \
             killed client left: the next writer of its subtable completes it once its lease ends)",
            if c.locked { "locked" } else { "not locked" },
            if c.split_logged {
                "logged"
            } else {
                "not logged"
            },
            c.frozen_slots
        );
    }
    // Read after the table, so that what a client gave back meanwhile is
    // not counted as unlinked.
    let usages = store.usage()?;
    let with_record: Vec<_> = usages
        .iter()
        .filter_map(|(n, u)| u.map(|u| (*n, u)))
        .collect();
    for (n, u) in &usages {
        if u.is_none() {
            krcore_cli::outln!("node {n}: no usage record (a node of an older build, or one that has just started)");
        }
    }
    let initial_depth = store
        .infos()
        .first()
        .and_then(|i| i.table)
        .map(|t| t.initial_global_depth);
    let (mut unlinked, mut in_use) = (0u64, 0u64);
    let mut per_node = Vec::with_capacity(with_record.len());
    for (n, a) in c.accounts(&with_record, initial_depth) {
        let ran_out = with_record
            .iter()
            .find(|(id, _)| *id == n)
            .and_then(|(_, u)| u.ran_out_since_collection);
        per_node.push(NodeChecked {
            node: n,
            unlinked: a.unlinked,
            ran_out,
        });
        unlinked += a.unlinked;
        in_use += a.in_use;
        let retired = match a.retired_subtables {
            Some(r) => format!("{} retired by splits", bytes_text(r)),
            None => "retired ones not known (a node 0 of an older build)".to_string(),
        };
        krcore_cli::outln!(
            "node {n}: in use {}: prefix {}, subtables {} live, {retired}, values {} linked, \
             {} unlinked ({}%){}",
            bytes_text(a.in_use),
            bytes_text(a.reserved),
            bytes_text(a.subtables),
            bytes_text(a.linked),
            bytes_text(a.unlinked),
            percent(a.unlinked, a.in_use),
            ran_out_text(ran_out),
        );
    }
    krcore_cli::outln!(
        "store {}: {} unlinked of {} in use ({}%): held by running clients, or left by killed ones",
        store.name(),
        bytes_text(unlinked),
        bytes_text(in_use),
        percent(unlinked, in_use),
    );
    Ok(Checked {
        problems: c.problems.len(),
        nodes: per_node,
    })
}

/// How `maintain` runs.
pub(crate) struct MaintainOptions {
    /// Time from the start of a round to the start of the next.
    pub every: Duration,
    /// A node is collected once its unlinked bytes reach this.
    pub collect_above: u64,
    /// A node is also collected when a lease ran out on it since its last
    /// collection (and it has unlinked bytes).
    pub after_ran_out: bool,
    /// As `collect --max-drain-s`.
    pub max_drain: Duration,
    /// One round, then exit (for cron): 1 if a step failed.
    pub once: bool,
}

/// `maintain`: a round every `every` until SIGINT or SIGTERM (or one
/// round with `once`): the sweep, the check, and a collection of each node
/// whose unlinked bytes reached `collect_above`, or, with `after_ran_out`,
/// on which a lease ran out since its last collection (a node with no
/// unlinked bytes is not collected; none is when the table has
/// problems). Each round opens a client of its own (a memory node that
/// restarted is reached again) and closes it. A step that fails is said
/// on stderr and the round goes on; the next round tries again.
pub(crate) fn maintain<T: Transport>(
    store: &Store,
    mut open: impl FnMut() -> Result<Client<T>, Error>,
    opts: &MaintainOptions,
) -> ExitCode {
    let shutdown = match Shutdown::install() {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    if !opts.once {
        let line = format!(
            "race-kv maintain: store {}, a round every {} s, collecting a node with {} unlinked or more{}",
            store.name(),
            opts.every.as_secs(),
            bytes_text(opts.collect_above),
            if opts.after_ran_out {
                ", or on which a lease ran out"
            } else {
                ""
            }
        );
        if let Err(e) = krcore_cli::announce_ready(&line, None) {
            return fail(PROGRAM, &e);
        }
    }
    let mut round = 0u64;
    loop {
        round += 1;
        let started = Instant::now();
        let failed = maintain_round(store, &mut open, opts, &shutdown, round);
        if opts.once {
            return if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
        let next = started + opts.every;
        if shutdown.wait_until(Duration::from_millis(100), || Instant::now() >= next) {
            eprintln!("{PROGRAM}: maintain stopped by a signal after {round} round(s)");
            return ExitCode::SUCCESS;
        }
    }
}

/// One round of `maintain`; whether a step failed (or the table has
/// problems).
fn maintain_round<T: Transport>(
    store: &Store,
    open: &mut impl FnMut() -> Result<Client<T>, Error>,
    opts: &MaintainOptions,
    shutdown: &Shutdown,
    round: u64,
) -> bool {
    let started = Instant::now();
    let say_failed = |step: &str, e: &(dyn std::error::Error + 'static)| {
        eprintln!(
            "{PROGRAM}: round {round}: {step} failed: {}",
            krcore_cli::error_chain(e)
        );
    };
    krcore_cli::outln!("round {round}: sweep, check, collect");
    let mut client = match open() {
        Ok(c) => c,
        Err(e) => {
            say_failed("opening a client", &e);
            return true;
        }
    };
    let mut failed = false;
    if let Err(e) = sweep_step(&mut client) {
        say_failed("sweep", &e);
        failed = true;
    }
    let mut taken = 0u64;
    let mut collected = Vec::new();
    match check_step(&mut client, store, false) {
        Err(e) => {
            say_failed("check", &*e);
            failed = true;
        }
        Ok(c) if c.problems > 0 => {
            krcore_cli::outln!(
                "round {round}: the table has {} problem(s): nothing collected",
                c.problems
            );
            failed = true;
        }
        Ok(c) => {
            for NodeChecked {
                node,
                unlinked,
                ran_out,
            } in c.nodes
            {
                let ran_out = opts.after_ran_out && ran_out.is_some_and(|n| n > 0);
                if unlinked == 0
                    || (unlinked < opts.collect_above && !ran_out)
                    || shutdown.requested()
                {
                    continue;
                }
                krcore_cli::outln!(
                    "round {round}: collecting node {node}: {}",
                    if unlinked >= opts.collect_above {
                        format!("{} unlinked", bytes_text(unlinked))
                    } else {
                        "a lease ran out on it since its last collection".to_string()
                    }
                );
                let one = CollectOptions {
                    apply: true,
                    nodes: Some(vec![node]),
                    max_drain: opts.max_drain,
                    cancel: Some(shutdown.flag()),
                };
                match client.collect(&one) {
                    Ok(done) => {
                        for n in &done {
                            print_collected(n, collect_verb(false));
                            taken += n.collected.bytes;
                        }
                        collected.push(node);
                    }
                    Err(Error::Cancelled { .. }) => break,
                    Err(e) => {
                        say_failed(&format!("collecting node {node}"), &e);
                        failed = true;
                    }
                }
            }
        }
    }
    let closed = client.close();
    if let Some(e) = closed.error {
        eprintln!("{PROGRAM}: warning: round {round}: giving memory back: {e}");
    }
    krcore_cli::outln!(
        "round {round}: {} in {:.1} s; node(s) collected: {collected:?}, {} taken back",
        if failed { "a step failed" } else { "done" },
        started.elapsed().as_secs_f64(),
        bytes_text(taken)
    );
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<(u8, Option<UsageRepr>)> {
        let record = UsageRepr {
            written_ms: 1_000_000,
            capacity: 1 << 30,
            heap_used: 300 << 20,
            pooled: 20 << 20,
            cooling: 1 << 20,
            returned: 900 << 20,
            reused: 880 << 20,
            reclaimed: 5 << 20,
            ended: 3,
            holders: 7,
            doomed_kib: 64,
            ran_out_since_collection: Some(2),
        };
        vec![(0, Some(record)), (1, None)]
    }

    #[test]
    fn usage_in_prometheus_format_has_a_sample_per_field_and_node_with_a_record() {
        let text = usage_prometheus("s\"1", &nodes(), 1_004_500);
        let lines: Vec<&str> = text.lines().collect();
        for want in [
            "race_store_usage_record{store=\"s\\\"1\",node=\"0\"} 1",
            "race_store_usage_record{store=\"s\\\"1\",node=\"1\"} 0",
            "race_store_node_in_use_bytes{store=\"s\\\"1\",node=\"0\"} 293601280",
            "race_store_node_doomed_bytes{store=\"s\\\"1\",node=\"0\"} 65536",
            "race_store_node_leases_ran_out_since_collection{store=\"s\\\"1\",node=\"0\"} 2",
            "race_store_node_record_age_seconds{store=\"s\\\"1\",node=\"0\"} 4",
            "# TYPE race_store_node_leases_ended_total counter",
        ] {
            assert!(lines.contains(&want), "{want} in\n{text}");
        }
        let samples: Vec<&&str> = lines.iter().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(samples.len(), 2 + 13, "{text}");
        assert!(samples.iter().all(|l| l.split(' ').count() == 2), "{text}");
        // Every family has its HELP and TYPE before its samples.
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("# TYPE ")).count(),
            14
        );
    }

    #[test]
    fn usage_in_json_is_one_object_with_a_record_or_null_per_node() {
        let v: serde_json::Value =
            serde_json::from_str(&usage_json("s", &nodes(), 1_004_500)).unwrap();
        assert_eq!(v["store"], "s");
        assert_eq!(v["nodes"][0]["node"], 0);
        assert_eq!(v["nodes"][0]["record"]["in_use"], 293_601_280u64);
        assert_eq!(v["nodes"][0]["record"]["age_ms"], 4500);
        assert_eq!(v["nodes"][0]["record"]["ran_out_since_collection"], 2);
        assert!(v["nodes"][1]["record"].is_null());
    }
}
