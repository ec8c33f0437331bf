//! Printing one mode's joins: the table, the median and the slowest, the
//! outliers, and the tails `--tail-factor` fails on.

use super::*;

pub(crate) fn secs_since(start_us: u64, t_us: u64) -> f64 {
    t_us.saturating_sub(start_us) as f64 / 1e6
}

/// A join slower than this many medians is printed as an outlier.
pub(crate) const OUTLIER_FACTOR: f64 = 10.0;
/// The least a join's time after `main` must exceed the median by to fail
/// `--tail-factor` (10x a 1 ms median is scheduling noise on 2 cores).
pub(crate) const TAIL_FLOOR_US: u64 = 50_000;

/// Prints one mode's joins and returns the tails of the join's own code
/// (`--tail-factor`; none when it is 0), one line each.
pub(crate) fn print_mode(r: &ModeRun, model: &str, tail_factor: f64) -> Vec<String> {
    krcore_cli::outln!(
        "# mode={} memory_nodes={} compute_nodes={} (modeled = measured + {model} control-path time)",
        r.mode.name(),
        r.memory_nodes,
        r.compute_nodes
    );
    krcore_cli::outln!("join  measured_ms  modeled_{model}_ms  app_measured_ms  app_modeled_{model}_ms  app_control_{model}_ms  qps(node/memory)  exec_ms  device_ms  context_ms  connect_ms  first_get_ms");
    for j in &r.joins {
        let s = j.stamps;
        let ms = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1000.0;
        krcore_cli::outln!(
            "{:>4}  {:>11.2}  {:>14.2}  {:>15.2}  {:>18.2}  {:>18.2}  {:>8}/{:<7}  {:>7.2}  {:>9.2}  {:>10.2}  {:>10.2}  {:>12.2}",
            j.index + 1,
            j.measured_us() as f64 / 1000.0,
            j.modeled_us() as f64 / 1000.0,
            j.app_measured_us() as f64 / 1000.0,
            j.app_modeled_us() as f64 / 1000.0,
            (j.modeled.total_ns() - j.modeled.context_ns) as f64 / 1e6,
            j.modeled.qps_created,
            j.modeled.server_qps,
            ms(s.spawn, s.main),
            ms(s.main, s.device),
            ms(s.device, s.context),
            ms(s.context, s.connect),
            ms(s.connect, s.first_get).max(0.0) - j.slept_us as f64 / 1000.0,
        );
    }
    for (name, f) in [
        (
            "mean",
            ModeRun::mean as fn(&ModeRun, fn(&JoinRecord) -> u64) -> f64,
        ),
        ("median", ModeRun::median),
    ] {
        krcore_cli::outln!(
            "{name:<6}{:>9.2}  {:>14.2}  {:>15.2}  {:>18.2}",
            f(r, JoinRecord::measured_us),
            f(r, JoinRecord::modeled_us),
            f(r, JoinRecord::app_measured_us),
            f(r, JoinRecord::app_modeled_us),
        );
    }
    if let Some(slow) = r.joins.iter().max_by_key(|j| j.measured_us()) {
        let (stage, us) = slow.slowest_stage();
        krcore_cli::outln!(
            "slowest: join {} {:.2} ms measured, {:.2} ms modeled; its longest stage {stage} {:.2} ms",
            slow.index + 1,
            slow.measured_us() as f64 / 1000.0,
            slow.modeled_us() as f64 / 1000.0,
            us as f64 / 1000.0
        );
    }
    // The tail the median hides, named with where it went.
    for j in krcore_benches::elastic::outliers(&r.joins, OUTLIER_FACTOR) {
        let (stage, us) = j.slowest_stage();
        let sched = j.sched.map_or(String::new(), |s| {
            // Pages read from disk (the binary's code among them): a
            // thread that neither ran nor waited for a CPU was blocked.
            let faults = match (s.at_main.major_faults, s.at_join.major_faults) {
                (Some(a), Some(b)) => format!(
                    "; {a} major page faults (reads from disk) before main, {} after",
                    b.saturating_sub(a)
                ),
                _ => String::new(),
            };
            let ran = s.at_join.cpu_us.saturating_sub(s.at_main.cpu_us)
                + s.at_join.wait_us.saturating_sub(s.at_main.wait_us);
            let blocked = j.after_main_us().saturating_sub(ran);
            format!(
                "; the process existed {} of it; its main thread waited {:.2} ms for a CPU and ran {:.2} ms before main, {:.2} ms and {:.2} ms over the join, and was blocked (neither) {:.2} ms after main{faults}",
                s.age_at_main_us.map_or("?".to_string(), |a| format!("{:.0} ms", a as f64 / 1000.0)),
                s.at_main.wait_us as f64 / 1000.0,
                s.at_main.cpu_us as f64 / 1000.0,
                s.at_join.wait_us as f64 / 1000.0,
                s.at_join.cpu_us as f64 / 1000.0,
                blocked as f64 / 1000.0,
            )
        });
        let note = if stage.starts_with("exec") {
            " (before main: the kernel's process start, not KRCore's join)"
        } else {
            ""
        };
        krcore_cli::outln!(
            "# OUTLIER: join {} took {:.2} ms measured, over {OUTLIER_FACTOR}x the median; {:.2} ms of it in {stage}{note}{sched}",
            j.index + 1,
            j.measured_us() as f64 / 1000.0,
            us as f64 / 1000.0
        );
    }
    let median_after =
        krcore_benches::elastic::median_of(&r.joins, JoinRecord::after_main_us).unwrap_or(0);
    let tails = if tail_factor > 0.0 {
        krcore_benches::elastic::tails_after_main(&r.joins, tail_factor, TAIL_FLOOR_US)
    } else {
        Vec::new()
    };
    let tail_lines: Vec<String> = tails
        .iter()
        .map(|j| {
            let (stage, us) = j.slowest_stage();
            format!(
                "mode {}: join {} took {:.2} ms from main to its first get, over {tail_factor}x the median of {:.2} ms (and 50 ms more); {:.2} ms of it in {stage}",
                r.mode.name(),
                j.index + 1,
                j.after_main_us() as f64 / 1000.0,
                median_after as f64 / 1000.0,
                us as f64 / 1000.0
            )
        })
        .collect();
    let total: u64 = r.loads.iter().map(|l| l.ops).sum();
    let errors: u64 = r.loads.iter().map(|l| l.errors).sum();
    let peak = r.timeline.iter().map(|p| p.1).fold(0.0, f64::max);
    krcore_cli::outln!("gets {total} ({errors} failed), peak {peak:.0} ops/s per 100 ms bucket");
    if let Some(e) = r.loads.iter().find_map(|l| l.engine) {
        krcore_cli::outln!(
            "engine (node 1 at the end): dcis {} vqps {} connect hits {} misses {} meta reads {} rc upgrades {} downgrades {} failed {}; created on first need: DCT {}, handshake endpoint {}",
            e.dcis, e.vqps_created, e.connect_hits, e.connect_misses, e.meta_reads,
            e.rc_upgrades, e.rc_downgrades, e.rc_upgrade_failures,
            e.dcts_created, e.handshake_endpoints_created
        );
    }
    if let Some(e) = r.joins.iter().find_map(|j| j.engine) {
        krcore_cli::outln!(
            "engine (node 1 at its first get): dcis {}, DCT {}, handshake endpoint {} (lazy start: only DCI 0 before the first get)",
            e.dcis, e.dcts_created, e.handshake_endpoints_created
        );
    }
    if let Some(d) = &r.daemon {
        krcore_cli::outln!(
            "node daemon: started once before the first join (at boot): {:.2} ms measured, {:.2} ms modeled control path, {} QPs; after its start its NIC created {} QPs for {} attached processes; its engine at the end: dcis {} vqps {} connect hits {} misses {} meta reads {} rc upgrades {}",
            d.start_measured_us as f64 / 1000.0,
            d.start_modeled_ns as f64 / 1e6,
            d.start_qps,
            d.qps_after_start,
            d.processes_attached,
            d.dcis,
            d.vqps_created,
            d.connect_hits,
            d.connect_misses,
            d.meta_reads,
            d.rc_upgrades
        );
    }
    if r.mode != Mode::Verbs {
        krcore_cli::outln!("upgrade events (DC->RC; time since first spawn, node, cumulative upgrades/downgrades/failed):");
        for u in &r.upgrades {
            krcore_cli::outln!(
                "  {:>6.2} s  node {:>2}  {}/{}/{}",
                secs_since(r.start_us, u.t_us),
                u.node + 1,
                u.upgrades,
                u.downgrades,
                u.failures
            );
        }
        if r.upgrades.is_empty() {
            krcore_cli::outln!("  none");
        }
        for &(n, t, a, b) in &r.upgrade_rates {
            krcore_cli::outln!(
                "  node {:>2} first upgrade at {t:.2} s: its gets/s 500 ms before {a:.0}, after {b:.0} ({:+.1}%)",
                n + 1,
                if a > 0.0 { 100.0 * (b / a - 1.0) } else { 0.0 }
            );
        }
    }
    krcore_cli::outln!();
    tail_lines
}
