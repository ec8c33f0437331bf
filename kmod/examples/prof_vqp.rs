//! Profiling loop: 64-byte READs (or 8-byte atomics) on sim:mem, through
//! one VQP or directly on a raw DCI of the provider aimed at the same DCT
//! (the pair the `control_plane` bench compares), `batch` WRs per doorbell
//! (the last signaled), posted then polled to completion.
//!
//! `prof_vqp [ops] [batch] [vqp|raw|rc|rawrc|fb] [poll] [read|cas|faa|mix] [grant|lease]`
//!
//! - `vqp`: a VQP on its DCI; `raw`: a raw DCI of the provider.
//! - `rc`: a VQP upgraded (DC -> RC hint) to the RC pair with its target,
//!   the physical QP the RC fallback mode also posts on; `rawrc`: a raw RC
//!   QP of the provider connected to a QP of the target node.
//! - `fb`: a VQP of an engine in RC fallback mode (sim devices without DC,
//!   the meta table on an `RcMetaHost`, like Soft-RoCE), on the RC pair
//!   with its target (`Vqp::post_send` / `Vqp::poll` in that mode); its raw
//!   counterpart is `rawrc`.
//! - `poll`: the length of the completion array each poll passes (default
//!   1, at most 64), the same for the VQP and the raw CQ. A length of 1 is
//!   a one-entry array (its length known where the poll is inlined), in
//!   `vqp_loop` / `raw_loop`; others a slice of the given length, in
//!   `vqp_loop_array` / `raw_loop_array` (the same globs match both).
//! - `read|cas|faa|mix` (default `read`): the WRs, the same for every
//!   mode: 64-byte READs, or CASes (compare 0, swap 1: the first one
//!   swaps, the others fail the compare, every one completes
//!   successfully) or FAAs (add 1) of the 8-byte word at the same
//!   offsets, each WR its own 64-byte slot locally and remotely. `mix`:
//!   one READ, then one CAS, and so on (`ops` of each, one WR per post
//!   whatever `batch`, `poll` 1), the READ into the local MR and, for a
//!   VQP, the CAS into a second one (as the SDK's atomics land in a
//!   scratch MR of their own), in `vqp_loop_mix` / `raw_loop_mix`.
//! - `grant`: the VQP knows a grant (every remote access, no expiry) over
//!   the remote MR, as the SDK makes its remote regions known: its posts
//!   check it (the raw modes ignore it). `lease`: the same grant with an
//!   expiry an hour away (a leased token), so every post checks the time.
//!
//! The measured loop is the non-inlined `vqp_loop` / `raw_loop`, so that
//! `valgrind --tool=callgrind --toggle-collect='*vqp_loop*'` (or
//! `'*raw_loop*'`) counts its instructions only; divide by `ops * batch`
//! for instructions per WR.
use krcore_kmod::{
    Engine, EngineConfig, EngineMode, MetaLocation, OwnedMr, RcMetaHost, RemoteGrant, Vqp, VqpPath,
};
use krcore_meta::{LocalMetaHost, MetaConfig};
use krcore_nic::conformance::{rc_pair, Side};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;

const MAX_BATCH: usize = 64;

/// The `grant` argument (1: the VQP knows a grant over the remote MR;
/// 2, `lease`: with an expiry; 0: none).
static GRANT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The WRs a run posts.
#[derive(Clone, Copy, Debug)]
enum Op {
    Read,
    Cas,
    Faa,
    Mix,
}

impl Op {
    /// The `i`th WR of a batch of `batch` (the last one signaled): its
    /// local slot at `local(offset, len)`, its remote one at
    /// `remote(offset)`.
    fn wr(
        self,
        i: usize,
        batch: usize,
        local: impl Fn(usize, u32) -> Sge,
        remote: impl Fn(usize) -> RemoteAddr,
    ) -> SendWr {
        let (off, id) = (64 * i, i as u64);
        let wr = match self {
            Op::Read => SendWr::read(id, local(off, 64), remote(off)),
            Op::Cas => SendWr::cas(id, local(off, 8), remote(off), 0, 1),
            Op::Faa => SendWr::faa(id, local(off, 8), remote(off), 1),
            Op::Mix => unreachable!("mix has loops of its own"),
        };
        wr.signaled(i + 1 == batch)
    }

    /// A raw QP's WRs: the batch, or for `mix` its READ and its CAS.
    fn wrs(
        self,
        batch: usize,
        local: impl Fn(usize, u32) -> Sge,
        remote: impl Fn(usize) -> RemoteAddr,
    ) -> Vec<SendWr> {
        match self {
            Op::Mix => vec![
                Op::Read.wr(0, 1, &local, &remote),
                Op::Cas.wr(1, 2, &local, &remote),
            ],
            op => (0..batch)
                .map(|i| op.wr(i, batch, &local, &remote))
                .collect(),
        }
    }
}

#[inline(never)]
fn vqp_loop(
    vqp: &Vqp<SimNic>,
    local: &OwnedMr<SimNic>,
    remote: &<SimNic as Nic>::Mr,
    n: u64,
    (batch, op): (usize, Op),
) {
    let mut wc = [Wc::default()];
    let mut wrs = vqp_wrs(local, remote, batch, op);
    for _ in 0..n {
        vqp.post_send(&mut wrs[..batch]).unwrap();
        while vqp.poll(&mut wc).unwrap() == 0 {}
    }
}

/// [`vqp_loop`], polling into a completion array of `poll` entries.
#[inline(never)]
fn vqp_loop_array(
    vqp: &Vqp<SimNic>,
    local: &OwnedMr<SimNic>,
    remote: &<SimNic as Nic>::Mr,
    n: u64,
    (batch, op): (usize, Op),
    poll: usize,
) {
    let mut wc = [Wc::default(); MAX_BATCH];
    let wc = &mut wc[..poll];
    let mut wrs = vqp_wrs(local, remote, batch, op);
    for _ in 0..n {
        vqp.post_send(&mut wrs[..batch]).unwrap();
        while vqp.poll(wc).unwrap() == 0 {}
    }
}

/// The `mix` op: a READ into `local`, then a CAS into `scratch`, `n`
/// times, each its own post, polled to completion.
#[inline(never)]
fn vqp_loop_mix(
    vqp: &Vqp<SimNic>,
    local: &OwnedMr<SimNic>,
    scratch: &OwnedMr<SimNic>,
    remote: &<SimNic as Nic>::Mr,
    n: u64,
) {
    let mut wc = [Wc::default()];
    let mut read = [SendWr::read(0, local.sge(0, 64).unwrap(), remote.remote(0))];
    let mut cas = [SendWr::cas(
        1,
        scratch.sge(0, 8).unwrap(),
        remote.remote(64),
        0,
        1,
    )];
    for _ in 0..n {
        vqp.post_send(&mut read).unwrap();
        while vqp.poll(&mut wc).unwrap() == 0 {}
        vqp.post_send(&mut cas).unwrap();
        while vqp.poll(&mut wc).unwrap() == 0 {}
    }
}

/// [`vqp_loop_mix`] on a raw QP (`wrs`: the READ and the CAS).
#[inline(never)]
fn raw_loop_mix(qp: &<SimNic as Nic>::Qp, cq: &<SimNic as Nic>::Cq, wrs: &[SendWr], n: u64) {
    let mut wc = [Wc::default()];
    for _ in 0..n {
        qp.post_send(&wrs[..1]).unwrap();
        while cq.poll(&mut wc).unwrap() == 0 {}
        qp.post_send(&wrs[1..2]).unwrap();
        while cq.poll(&mut wc).unwrap() == 0 {}
    }
}

/// The loop's WRs (post_send hands the WRs back as the caller wrote
/// them: they are reused).
fn vqp_wrs(
    local: &OwnedMr<SimNic>,
    remote: &<SimNic as Nic>::Mr,
    batch: usize,
    op: Op,
) -> [SendWr; MAX_BATCH] {
    std::array::from_fn(|i| {
        op.wr(
            i,
            batch,
            |off, len| local.sge(off, len).unwrap(),
            |off| remote.remote(off),
        )
    })
}

#[inline(never)]
fn raw_loop(qp: &<SimNic as Nic>::Qp, cq: &<SimNic as Nic>::Cq, wrs: &[SendWr], n: u64) {
    let mut wc = [Wc::default()];
    for _ in 0..n {
        qp.post_send(wrs).unwrap();
        while cq.poll(&mut wc).unwrap() == 0 {}
    }
}

/// [`raw_loop`], polling into a completion array of `poll` entries.
#[inline(never)]
fn raw_loop_array(
    qp: &<SimNic as Nic>::Qp,
    cq: &<SimNic as Nic>::Cq,
    wrs: &[SendWr],
    n: u64,
    poll: usize,
) {
    let mut wc = [Wc::default(); MAX_BATCH];
    let wc = &mut wc[..poll];
    for _ in 0..n {
        qp.post_send(wrs).unwrap();
        while cq.poll(wc).unwrap() == 0 {}
    }
}

/// The raw loop with a completion array of `poll` entries (`mix`: its
/// own loop).
fn raw_poll(
    qp: &<SimNic as Nic>::Qp,
    cq: &<SimNic as Nic>::Cq,
    wrs: &[SendWr],
    n: u64,
    (poll, op): (usize, Op),
) {
    if let Op::Mix = op {
        raw_loop_mix(qp, cq, wrs, n);
    } else if poll == 1 {
        raw_loop(qp, cq, wrs, n);
    } else {
        raw_loop_array(qp, cq, wrs, n, poll);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let batch: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .clamp(1, MAX_BATCH);
    let mode = args.next().unwrap_or_else(|| "vqp".into());
    let (raw, rc) = match mode.as_str() {
        "vqp" => (false, false),
        "raw" => (true, false),
        "rc" | "fb" => (false, true),
        "rawrc" => (true, true),
        m => panic!("unknown mode {m}: vqp, raw, rc, rawrc or fb"),
    };
    let poll: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .clamp(1, MAX_BATCH);
    let op = match args.next().as_deref().unwrap_or("read") {
        "read" => Op::Read,
        "cas" => Op::Cas,
        "faa" => Op::Faa,
        "mix" => Op::Mix,
        o => panic!("unknown op {o}: read, cas, faa or mix"),
    };
    let grant = match args.next().as_deref() {
        None => 0,
        Some("grant") => 1,
        Some("lease") => 2,
        Some(g) => panic!("unknown argument {g}: grant or lease"),
    };
    GRANT.store(grant, std::sync::atomic::Ordering::Relaxed);
    // `mix`: one WR per post, polled one by one.
    let (batch, poll) = match op {
        Op::Mix => (1, 1),
        _ => (batch, poll),
    };
    if mode == "fb" {
        let t = std::time::Instant::now();
        fallback(n, (batch, op), poll);
        println!(
            "{mode} {op:?} {:.1} ns per WR (batch {batch}, poll {poll})",
            t.elapsed().as_nanos() as f64 / (n as f64 * wrs_per_op(batch, op))
        );
        return;
    }
    let f = SimFabric::in_memory();
    let node = || SimNic::open(&f, SimConfig::default()).unwrap();
    let mut meta = LocalMetaHost::start(node(), MetaConfig::default()).unwrap();
    let loc = MetaLocation::from_bootstrap(&meta.bootstrap()).unwrap();
    // The upgrade needs its endpoint on both ends (and the target's upgrade
    // entry registered).
    let cfg = || {
        EngineConfig::default()
            .with_meta(loc)
            .with_pool_size(1)
            .with_upgrade_endpoint(rc && !raw)
            .with_handshake_thread(rc && !raw)
            // Without `grant`/`lease` the VQP posts the rkey by hand: the
            // grant rule's opt-out (one compare on the fast path).
            .with_ungranted(krcore_kmod::Ungranted::Allow)
    };
    let server = Engine::start(node(), cfg()).unwrap();
    meta.table_mut()
        .register(server.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();
    if rc && !raw {
        let entry = server.handshake_entry().unwrap().unwrap();
        meta.table_mut().register(entry, 0, 1 << 40, 0).unwrap();
    }
    let client = Engine::start(node(), cfg()).unwrap();
    let remote = server.alloc_mr(1 << 16, Access::ALL).unwrap();
    let t = std::time::Instant::now();
    if raw && rc {
        let side = Side::new(client.nic(), 1 << 16);
        let far = Side::new(server.nic(), 1 << 16);
        let caps = QpCaps {
            max_send_wr: 64,
            ..QpCaps::default()
        };
        let (qp, _peer) = rc_pair(&side, &far, caps);
        let wrs = op.wrs(
            batch,
            |off, len| side.mr.sge(off, len).unwrap(),
            |off| far.mr.remote(off),
        );
        raw_poll(&qp, &side.cq, &wrs, n, (poll, op));
    } else if raw {
        let side = Side::new(client.nic(), 1 << 16);
        let dci = side.qp(
            QpType::Dci,
            QpCaps {
                max_send_wr: 64,
                ..QpCaps::default()
            },
            None,
            0,
        );
        bring_up(&dci, Access::NONE, None).unwrap();
        let to = Destination::Dc(server.local_target().unwrap());
        let mut wrs = op.wrs(
            batch,
            |off, len| side.mr.sge(off, len).unwrap(),
            |off| remote.remote(off),
        );
        for wr in &mut wrs {
            wr.dest = to;
        }
        raw_poll(&dci, &side.cq, &wrs, n, (poll, op));
    } else {
        let local = client.alloc_mr(1 << 16, Access::ALL).unwrap();
        let vqp = client.create_vqp().unwrap();
        vqp.connect(server.gid()).unwrap();
        if rc {
            assert_eq!(vqp.upgrade().unwrap(), VqpPath::Rc);
        }
        run_vqp(&client, &vqp, (&local, &remote), n, (batch, op), poll);
    }
    println!(
        "{} {:?} {:.1} ns per WR (batch {batch}, poll {poll})",
        mode,
        op,
        t.elapsed().as_nanos() as f64 / (n as f64 * wrs_per_op(batch, op))
    );
}

/// WRs per loop iteration.
fn wrs_per_op(batch: usize, op: Op) -> f64 {
    match op {
        Op::Mix => 2.0,
        _ => batch as f64,
    }
}

/// The `fb` mode: a fabric of sim devices without DC, the meta table on an
/// `RcMetaHost` answering from its own thread, a target engine and a
/// client engine answering handshakes from theirs; the client's VQP posts
/// on its RC pair with the target.
fn fallback(n: u64, (batch, op): (usize, Op), poll: usize) {
    let f = SimFabric::in_memory();
    let no_dc = SimConfig {
        dc: false,
        ..SimConfig::default()
    };
    let node = || SimNic::open(&f, no_dc.clone()).unwrap();
    let meta = RcMetaHost::start(node(), MetaConfig::default(), Default::default()).unwrap();
    let loc = meta.location().unwrap();
    let _meta_thread = meta.spawn_progress().unwrap();
    let cfg = || {
        EngineConfig::default()
            .with_meta(loc)
            .with_handshake_thread(true)
            .with_ungranted(krcore_kmod::Ungranted::Allow)
    };
    let server = Engine::start(node(), cfg()).unwrap();
    meta.table()
        .register(server.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();
    let client = Engine::start(node(), cfg()).unwrap();
    assert_eq!(client.mode(), EngineMode::RcFallback);
    let remote = server.alloc_mr(1 << 16, Access::ALL).unwrap();
    let local = client.alloc_mr(1 << 16, Access::ALL).unwrap();
    let vqp = client.create_vqp().unwrap();
    vqp.connect(server.gid()).unwrap();
    run_vqp(&client, &vqp, (&local, &remote), n, (batch, op), poll);
}

/// The VQP's loop for `op` and `poll` (`mix`: with a scratch MR of the
/// client's for the CASes).
fn run_vqp(
    client: &Engine<SimNic>,
    vqp: &Vqp<SimNic>,
    (local, remote): (&OwnedMr<SimNic>, &<SimNic as Nic>::Mr),
    n: u64,
    (batch, op): (usize, Op),
    poll: usize,
) {
    let kind = GRANT.load(std::sync::atomic::Ordering::Relaxed);
    if kind > 0 {
        let gid = vqp.target().unwrap().target.gid;
        let grant = RemoteGrant {
            addr: remote.addr(),
            len: remote.len() as u64,
            access: Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            expires_at: (kind == 2)
                .then(|| std::time::Instant::now() + std::time::Duration::from_secs(3600)),
        };
        vqp.add_grant(gid, remote.rkey(), grant);
    }
    if let Op::Mix = op {
        let scratch = client.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        vqp_loop_mix(vqp, local, &scratch, remote, n);
    } else if poll == 1 {
        vqp_loop(vqp, local, remote, n, (batch, op));
    } else {
        vqp_loop_array(vqp, local, remote, n, (batch, op), poll);
    }
}
