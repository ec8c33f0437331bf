//! `krcore_lat`'s in-process contenders (see the crate docs): the SDK side
//! (its meta host and engines), the provider's loopback pair, the
//! interleaved timing loop and the profiling loop.

use super::*;

/// The SDK side of the latency runs.
pub(super) struct Sdk {
    pub(super) _meta_thread: krcore_kmod::ProgressThread,
    pub(super) _meta: RcMetaHost<VerbsNic>,
    pub(super) _server: Node<VerbsNic>,
    pub(super) _region: krcore::MemoryRegion<VerbsNic>,
    pub(super) token: krcore::RemoteRegion,
    /// Where the meta host is (for `sdk_vqp_proc`).
    pub(super) meta: Option<krcore_kmod::MetaLocation>,
    pub(super) client: Node<VerbsNic>,
    /// Verbs level (`post`/`poll`); knows no grant.
    pub(super) vqp: krcore::Vqp<VerbsNic>,
    pub(super) buf: krcore::MemoryRegion<VerbsNic>,
    /// Request level (`read(..).wait()`).
    pub(super) rvqp: krcore::Vqp<VerbsNic>,
    pub(super) rbuf: krcore::MemoryRegion<VerbsNic>,
}

impl Sdk {
    pub(super) fn start(a: &Args) -> Result<Sdk, String> {
        let (meta, thread, cfg) = meta_host(a, a.idle_sleep)?;
        let server = Node::with_nic(open(a)?, cfg.clone()).map_err(|e| format!("server: {e}"))?;
        meta.table()
            .register(server.local_target().unwrap(), 0, 1 << 40, 0)
            .map_err(|e| format!("register: {e}"))?;
        let region = server.alloc(4096, Access::ALL).map_err(|e| e.to_string())?;
        let meta_loc = cfg.meta;
        let client = Node::with_nic(open(a)?, cfg).map_err(|e| format!("client: {e}"))?;
        let vqp = client
            .connect(server.gid())
            .map_err(|e| format!("connect: {e}"))?;
        let rvqp = client
            .connect(server.gid())
            .map_err(|e| format!("connect: {e}"))?;
        // Both post the region's rkey by hand, as perftest does: the
        // grant rule's opt-out (the measured path is the same).
        vqp.set_ungranted(krcore::Ungranted::Allow)
            .map_err(|e| format!("set_ungranted: {e}"))?;
        rvqp.set_ungranted(krcore::Ungranted::Allow)
            .map_err(|e| format!("set_ungranted: {e}"))?;
        let alloc = |n| {
            client
                .alloc(n, Access::LOCAL_WRITE)
                .map_err(|e| e.to_string())
        };
        Ok(Sdk {
            _meta_thread: thread,
            _meta: meta,
            token: region.token(),
            meta: meta_loc,
            _region: region,
            _server: server,
            buf: alloc(64)?,
            rbuf: alloc(64)?,
            client,
            vqp,
            rvqp,
        })
    }
}

/// A meta host with its progress thread, and an engine configuration
/// that reads it.
pub(super) fn meta_host(
    a: &Args,
    idle_sleep: Option<Duration>,
) -> Result<
    (
        RcMetaHost<VerbsNic>,
        krcore_kmod::ProgressThread,
        EngineConfig,
    ),
    String,
> {
    let h = handshake(idle_sleep);
    let meta = RcMetaHost::start(
        open(a)?,
        MetaConfig {
            geometry: Geometry::with_buckets(64).map_err(|e| e.to_string())?,
            ..MetaConfig::default()
        },
        h.clone(),
    )
    .map_err(|e| format!("meta host: {e}"))?;
    let thread = meta.spawn_progress().map_err(|e| e.to_string())?;
    // Every engine of this tool is on one port (loopback, and client
    // processes beside the parent): the port's lock would refuse all but
    // the first.
    let mut cfg = EngineConfig::default()
        .with_meta(meta.location().map_err(|e| e.to_string())?)
        .with_port_lock(false);
    cfg.handshake = h;
    if let Some(d) = a.sdk_depth {
        cfg.dci_depth = d;
    }
    Ok((meta, thread, cfg))
}

/// Cycles of one poll of an empty queue (what one spin costs).
pub(super) fn empty_poll_cycles(
    mut poll: impl FnMut(&mut [Wc]) -> Result<usize, String>,
) -> Result<f64, String> {
    let mut wc = [Wc::default()];
    let mut v = Vec::with_capacity(10_000);
    for _ in 0..10_000 {
        let c0 = cycles();
        if poll(&mut wc)? != 0 {
            return Err("a completion on an idle queue".into());
        }
        v.push((cycles() - c0) as f64);
    }
    // The median: a preempted poll (the host is shared) says nothing.
    Ok(median(v))
}

/// Medians of one contender's round trips in [`interleaved`] (cycles).
pub(super) struct Split {
    pub(super) total: f64,
    pub(super) post: Option<f64>,
    pub(super) completion: Option<f64>,
    pub(super) spins: Option<f64>,
}

/// Contenders one round trip each in turn, `iters` times (after 100
/// turns of warm-up): the median of each one's round trip, of its post
/// alone and of the rest (the polls up to the completion).
pub(super) fn interleaved(iters: usize, ours: &mut [Contender<'_>]) -> Result<Vec<Split>, String> {
    let n = ours.len();
    let (mut total, mut post, mut done, mut spins) = (
        vec![vec![]; n],
        vec![vec![]; n],
        vec![vec![]; n],
        vec![vec![]; n],
    );
    for i in 0..iters + 100 {
        for (j, (_, one)) in ours.iter_mut().enumerate() {
            let mut at = 0;
            let r = one(&mut || at = cycles())?;
            let end = cycles();
            if i < 100 {
                continue;
            }
            total[j].push(end.wrapping_sub(at) as f64);
            if let Some(r) = r {
                post[j].push(r.posted_at.wrapping_sub(at) as f64);
                done[j].push(end.wrapping_sub(r.posted_at) as f64);
                spins[j].push(f64::from(r.spins));
            }
        }
    }
    let m = |v: &mut Vec<Vec<f64>>, j: usize| {
        let v = std::mem::take(&mut v[j]);
        (!v.is_empty()).then(|| median(v))
    };
    Ok((0..n)
        .map(|j| Split {
            total: median(std::mem::take(&mut total[j])),
            post: m(&mut post, j),
            completion: m(&mut done, j),
            spins: m(&mut spins, j),
        })
        .collect())
}

/// What the provider contender posts on.
pub(super) struct Prov<'a> {
    pub(super) qp: &'a krcore_nic::verbs::VerbsQp,
    pub(super) cq: &'a krcore_nic::verbs::VerbsCq,
    /// The 64 B READ (built once, as perftest does).
    pub(super) read: SendWr,
    /// The local 8 B of a CAS and its target.
    pub(super) word: krcore_nic::Sge,
    pub(super) remote: krcore_nic::RemoteAddr,
    /// The target's value: every CAS succeeds.
    pub(super) x: &'a Cell<u64>,
}

/// The provider: `post_send` of one WR and `poll` of its CQ.
/// `--prof N`: N round trips of each contender and operation, each
/// in a loop function of its own name (`prof_<contender>_<op>`), for
/// `valgrind --tool=callgrind --toggle-collect='*prof_sdk_vqp_cas8*'`
/// and the like: instructions per operation, which do not depend on
/// the guest's load. No timing, no perftest.
pub(super) fn prof(
    a: &Args,
    prov: &Prov<'_>,
    sdk: Option<&Sdk>,
    x: (&Cell<u64>, &Cell<u64>),
    limit: u64,
) -> Result<(), String> {
    println!("prof mark={:#x}", std::ptr::addr_of!(PROF_MARK) as usize);
    for op in ["read64", "cas8"] {
        let mut ours: Vec<Contender<'_>> = vec![provider_contender(op, prov, limit)];
        if let Some(k) = sdk {
            sdk_contenders(k, op, x, limit, &mut ours)?;
        }
        for (name, one) in ours.iter_mut() {
            // Warm: the first round trips touch everything once.
            prof_loop(one, 100)?;
            let run = match (*name, op) {
                ("provider", "read64") => prof_provider_read64,
                ("provider", _) => prof_provider_cas8,
                ("sdk_vqp", "read64") => prof_sdk_vqp_read64,
                ("sdk_vqp", _) => prof_sdk_vqp_cas8,
                ("sdk_request", "read64") => prof_sdk_request_read64,
                (_, _) => prof_sdk_request_cas8,
            };
            run(one, a.prof)?;
            println!("prof op={op} who={name} n={}", a.prof);
        }
    }
    Ok(())
}

/// Read once per round trip of the `--prof` loops: a memory-trace
/// tool (valgrind's lackey, `--trace-mem=yes`) splits its trace into
/// round trips at this byte's address (printed as `prof mark=ADDR`).
pub(super) static PROF_MARK: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// `n` round trips of `one`.
#[inline(always)]
pub(super) fn prof_loop(one: &mut ContenderFn<'_>, n: usize) -> Result<(), String> {
    for _ in 0..n {
        std::hint::black_box(PROF_MARK.load(std::sync::atomic::Ordering::Relaxed));
        one(&mut || {})?;
    }
    Ok(())
}

// Each loop function passes its own tag through `black_box`, so that
// the six identical bodies are not folded into one symbol.
macro_rules! prof_fns {
    ($($f:ident = $tag:literal),*) => {$(
        #[inline(never)]
        fn $f(one: &mut ContenderFn<'_>, n: usize) -> Result<(), String> {
            std::hint::black_box($tag);
            prof_loop(one, n)
        }
    )*};
}
prof_fns!(
    prof_provider_read64 = 1u8,
    prof_provider_cas8 = 2u8,
    prof_sdk_vqp_read64 = 3u8,
    prof_sdk_vqp_cas8 = 4u8,
    prof_sdk_request_read64 = 5u8,
    prof_sdk_request_cas8 = 6u8
);

pub(super) fn provider_contender<'a>(op: &str, p: &'a Prov<'a>, limit: u64) -> Contender<'a> {
    if op == "read64" {
        (
            "provider",
            Box::new(move |stamp: &mut dyn FnMut()| {
                stamp();
                p.qp.post_send(std::slice::from_ref(&p.read))
                    .map_err(|e| e.to_string())?;
                spin(limit, |wc| p.cq.poll(wc).map_err(|e| e.to_string()))
            }),
        )
    } else {
        (
            "provider",
            Box::new(move |stamp: &mut dyn FnMut()| {
                let v = p.x.get();
                p.x.set(v + 1);
                let wr = SendWr::cas(2, p.word, p.remote, v, v + 1);
                stamp();
                p.qp.post_send(&[wr]).map_err(|e| e.to_string())?;
                spin(limit, |wc| p.cq.poll(wc).map_err(|e| e.to_string()))
            }),
        )
    }
}

/// The SDK's contenders: the VQP at the verbs level (`post`/`poll`) and
/// at the request level (`read(..).wait()`, `compare_and_swap`).
pub(super) fn sdk_contenders<'a>(
    k: &'a Sdk,
    op: &str,
    (xv, xr): (&'a Cell<u64>, &'a Cell<u64>),
    limit: u64,
    out: &mut Vec<Contender<'a>>,
) -> Result<(), String> {
    let vqp = &k.vqp;
    let token = &k.token;
    if op == "read64" {
        let vbuf = k.buf.sge(0, 64).map_err(|e| e.to_string())?;
        out.push((
            "sdk_vqp",
            Box::new(move |stamp: &mut dyn FnMut()| {
                let mut wr = [SendWr::read(3, vbuf, token.at(0))];
                stamp();
                vqp.post(&mut wr).map_err(|e| e.to_string())?;
                spin(limit, |wc| vqp.poll(wc).map_err(|e| e.to_string()))
            }),
        ));
        // A VQP of its own: the request level makes the token's grant
        // known to its VQP.
        let (rvqp, rbuf) = (&k.rvqp, &k.rbuf);
        out.push((
            "sdk_request",
            Box::new(move |stamp: &mut dyn FnMut()| {
                stamp();
                rvqp.read(rbuf, 0, token, 0, 64)
                    .and_then(|r| r.wait())
                    .map(|_| None)
                    .map_err(|e| e.to_string())
            }),
        ));
    } else {
        let vword = k.buf.sge(0, 8).map_err(|e| e.to_string())?;
        out.push((
            "sdk_vqp",
            Box::new(move |stamp: &mut dyn FnMut()| {
                let v = xv.get();
                xv.set(v + 1);
                let mut wr = [SendWr::cas(4, vword, token.at(128), v, v + 1)];
                stamp();
                vqp.post(&mut wr).map_err(|e| e.to_string())?;
                spin(limit, |wc| vqp.poll(wc).map_err(|e| e.to_string()))
            }),
        ));
        let rvqp = &k.rvqp;
        out.push((
            "sdk_request",
            Box::new(move |stamp: &mut dyn FnMut()| {
                let v = xr.get();
                stamp();
                let c = rvqp
                    .compare_and_swap(token, 256, v, v + 1)
                    .and_then(|r| r.wait())
                    .map_err(|e| e.to_string())?;
                if c.old_value != Some(v) {
                    return Err(format!("CAS saw {:?}, expected {v}", c.old_value));
                }
                xr.set(v + 1);
                Ok(None)
            }),
        ));
    }
    Ok(())
}
