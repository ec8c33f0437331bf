//! A joining process: what `krcore-elastic` runs in each child it spawns
//! (its spec, its engine or the daemon it attaches to, the client's open
//! and its first get).

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChildSpec {
    pub(crate) mode: Mode,
    pub(crate) fabric: PathBuf,
    pub(crate) memory_nodes: u8,
    pub(crate) acceptors: Vec<SocketAddr>,
    pub(crate) index: usize,
    pub(crate) spawn_us: u64,
    pub(crate) stop_us: u64,
    pub(crate) records: u64,
    pub(crate) latency: String,
    pub(crate) model_sleep: bool,
    pub(crate) pool_size: usize,
    pub(crate) upgrade_after: Option<u64>,
    /// The node daemon's socket ([`Mode::Daemon`]).
    pub(crate) socket: Option<PathBuf>,
}

pub(crate) fn key(k: u64) -> String {
    format!("elastic{k:012}")
}

/// The RACE transport of either mode (VQPs, or the RC baseline), boxed:
/// every `Transport` method forwards (leases, give-backs sent ahead, two
/// doorbells in flight), which a hand-written enum had not done for all.
pub(crate) type AnyTransport = Box<dyn Transport + Send>;

pub(crate) fn engine_summary(node: &Node) -> Option<EngineSummary> {
    let s = node.engine().ok()?.stats();
    Some(EngineSummary {
        dcis: s.dcis as u64,
        vqps_created: s.vqps_created,
        connect_hits: s.connect_hits,
        connect_misses: s.connect_misses,
        meta_reads: s.meta.reads,
        rc_upgrades: s.rc_upgrades,
        rc_downgrades: s.rc_downgrades,
        rc_upgrade_failures: s.rc_upgrade_failures,
        dcts_created: u64::from(s.dcts_created),
        handshake_endpoints_created: u64::from(s.handshake_endpoints_created),
    })
}

/// The main thread's scheduler figures when `main` began (a join process
/// takes them once, first thing).
pub(crate) static SCHED_AT_MAIN: std::sync::OnceLock<(Option<SchedSample>, Option<u64>)> =
    std::sync::OnceLock::new();

pub(crate) fn child_main(spec: &ChildSpec) -> Result<(), String> {
    let main = epoch_us();
    SCHED_AT_MAIN.get_or_init(|| (SchedSample::now(), process_age_us()));
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let sim = SimConfig {
        latency: LatencyModel::from_name(&spec.latency)?,
        ..SimConfig::default()
    };
    let remote = Remote::discover(&spec.fabric, spec.memory_nodes).map_err(|x| e(&x))?;
    if spec.mode == Mode::Daemon {
        return daemon_child(spec, main, &remote);
    }
    let nic = SimNic::open(&remote.fabric, sim).map_err(|x| e(&x))?;
    let device = epoch_us();
    let c0 = nic.counters();
    let mut node = None;
    let mut modeled = Modeled::default();
    let (transport, context, c1) = match spec.mode {
        Mode::Krcore => {
            // The lazy engine start (`context`) creates no QP: no DCT (a
            // compute node is never reached), no meta QP (its READs share
            // DCI 0), no handshake endpoint (made by the first upgrade), no
            // DCI (`prestart` 0: the first VQP creates DCI 0, in `connect`).
            let mut cfg = EngineConfig::default()
                .with_pool_size(spec.pool_size.max(1))
                .with_upgrade_after(spec.upgrade_after)
                .with_upgrade_endpoint(spec.upgrade_after.is_some());
            cfg.prestart = 0;
            let n = Node::builder()
                .nic(nic.clone())
                .config(cfg)
                .meta(remote.meta)
                .build()
                .map_err(|x| e(&x))?;
            let context = epoch_us();
            let c1 = nic.counters();
            let t = VqpTransport::connect(&n, &remote.infos).map_err(|x| e(&x))?;
            node = Some(n);
            (Box::new(t) as AnyTransport, context, c1)
        }
        Mode::Verbs => {
            let ep = RcEndpoint::new(nic.clone(), 1024).map_err(|x| e(&x))?;
            let context = epoch_us();
            let c1 = nic.counters();
            let t = RcTransport::connect(ep, &remote.infos, &spec.acceptors).map_err(|x| e(&x))?;
            modeled.server_ns = t.server_modeled_ns;
            modeled.server_qps = spec.acceptors.len() as u64;
            (Box::new(t) as AnyTransport, context, c1)
        }
        Mode::Daemon => return Err("a daemon join runs in daemon_child".into()),
    };
    let connect = epoch_us();
    let c2 = nic.counters();
    modeled.context_ns = c1.modeled_control_ns - c0.modeled_control_ns;
    modeled.connect_ns = c2.modeled_control_ns - c1.modeled_control_ns;
    // Opening the NIC itself charges nothing the counters see before c0.
    modeled.device_ns = 0;
    // The application's part: KRCore's engine start happens at boot.
    let (client, rng, slept_us) = open_and_get(
        spec,
        transport,
        &remote,
        modeled.connect_ns + modeled.server_ns,
    )?;
    let first_get = epoch_us();
    let c3 = nic.counters();
    modeled.first_get_ns = c3.modeled_control_ns - c2.modeled_control_ns;
    modeled.qps_created = c3.qps_created - c0.qps_created;
    let stamps = Stamps {
        spawn: spec.spawn_us,
        main,
        device,
        context,
        connect,
        first_get,
    };
    run_load(spec, client, rng, node.as_ref(), stamps, modeled, slept_us)
}

/// A join through the node daemon: attach (no NIC, no engine of the
/// process's own), connect through the daemon's VQPs, first get. The
/// modeled control time and the QPs created are the daemon's NIC's,
/// node-wide, over the join (the other joined processes only issue gets,
/// which charge no control time).
pub(crate) fn daemon_child(spec: &ChildSpec, main: u64, remote: &Remote) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let socket = spec
        .socket
        .as_ref()
        .ok_or("a daemon join needs the daemon's socket")?;
    let device = epoch_us();
    let n = Node::attach(socket).map_err(|x| e(&x))?;
    let context = epoch_us();
    let stats = |n: &Node| -> Result<krcore::NodeStats, String> {
        n.daemon_stats()
            .map_err(|x| e(&x))?
            .ok_or_else(|| "an attached node has daemon stats".to_string())
    };
    let s1 = stats(&n)?;
    let t = VqpTransport::connect(&n, &remote.infos).map_err(|x| e(&x))?;
    let connect = epoch_us();
    let s2 = stats(&n)?;
    let mut modeled = Modeled {
        connect_ns: s2.modeled_control_ns - s1.modeled_control_ns,
        ..Modeled::default()
    };
    let (client, rng, slept_us) = open_and_get(spec, Box::new(t), remote, modeled.connect_ns)?;
    let first_get = epoch_us();
    let s3 = stats(&n)?;
    modeled.first_get_ns = s3.modeled_control_ns - s2.modeled_control_ns;
    // Node-wide: the daemon's NIC, over this process's whole join.
    modeled.qps_created = s3.qps_created - s1.qps_created;
    let stamps = Stamps {
        spawn: spec.spawn_us,
        main,
        device,
        context,
        connect,
        first_get,
    };
    run_load(spec, client, rng, Some(&n), stamps, modeled, slept_us)
}

/// Sleeps `sleep_ns` of modeled time (when the spec says so), opens the
/// RACE client and issues the first get; returns the client, the
/// process's key generator and the microseconds slept.
pub(crate) fn open_and_get(
    spec: &ChildSpec,
    transport: AnyTransport,
    remote: &Remote,
    sleep_ns: u64,
) -> Result<(Client<AnyTransport>, SmallRng, u64), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let mut slept_us = 0;
    if spec.model_sleep {
        let t = epoch_us();
        std::thread::sleep(Duration::from_nanos(sleep_ns));
        slept_us = epoch_us() - t;
    }
    let mut client = Client::open(transport, remote.clock.clone(), ClientConfig::default())
        .map_err(|x| e(&x))?;
    let mut rng = SmallRng::seed_from_u64(spec.index as u64 + 1);
    let first = rng.gen_range(0..spec.records.max(1));
    match client.get(key(first).as_bytes()).map_err(|x| e(&x))? {
        Some(_) => {}
        None => return Err(format!("first get: {} is absent", key(first))),
    }
    Ok((client, rng, slept_us))
}
