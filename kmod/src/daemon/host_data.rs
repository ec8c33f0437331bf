//! The data threads (see [`super::host`]): each serves the rings of the
//! processes placed on it, in rounds. A round takes the doorbells the
//! processes' pages mark ([`super::ring::PAGE_DOORBELLS`]) and serves
//! those rings and the VQPs with WRs in flight: a doorbell's entries go
//! through the trust checks and the engine's post, its verdict goes back
//! into the ring, and completions move from the VQP into the ring's
//! completion queue. Idle, a data thread spins, then yields, then sleeps
//! on its eventfd (the idle flag up in its processes' pages).

use super::host_state::*;
use super::ring::PostCode;
use super::ring::{
    self, decode_sqe, doorbells_marked, encode_cqe, rang, take_doorbells, this_cpu, word,
    write_verdict, Verdict, CQ_CAP, CQ_HEAD, CQ_TAIL, DOORBELL_WORDS, PAGE_DATA_CPU, PAGE_SLEEPING,
    SQ_CAP, SQ_CPU, SQ_HEAD, SQ_TAIL,
};
use crate::engine::VqpError;
use krcore_nic::{Nic, Payload};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the data thread spins idle before it starts yielding its CPU
/// (see `data_loop`).
const YIELD_AFTER: Duration = Duration::from_micros(20);

/// The data thread (see the module docs).
/// Data thread `t`: serves the rings of the processes placed on it.
pub(super) fn data_loop<N: Nic>(s: &Arc<Shared<N>>, t: usize) {
    let Some(wake_fd) = s.wakes.get(t) else {
        return;
    };
    let mut seen = u64::MAX;
    // The VQPs this thread serves, each with the index of its process's
    // page in `pages`.
    let mut slots: Vec<(usize, Arc<VqpSlot<N>>)> = Vec::new();
    let mut pages: Vec<Arc<ClientCore>> = Vec::new();
    let mut rung: Vec<[u64; DOORBELL_WORDS]> = Vec::new();
    let mut idle_since = Instant::now();
    // Empty rounds since the last look at the clock: reading it costs a
    // few tens of ns, which every empty round would add to the next
    // doorbell's wait.
    let mut empty = 0u32;
    // This thread's CPU, as the pages say it (see `PAGE_DATA_CPU`), and
    // whether the last doorbell came from a process thread on it: that
    // thread waits for this one to give the CPU back, so this one yields
    // as soon as it finds no work (at the first look at the clock, about
    // 64 empty rounds) instead of after `YIELD_AFTER`. Not at once after
    // serving it: with other busy threads on the CPU a yield with work
    // still to come handed the CPU away for their whole slice (a join
    // through the daemon took 11 ms instead of 4.5, 2026-12-07).
    let mut cpu = this_cpu();
    let mut colocated = false;
    while !s.stop.load(Ordering::Relaxed) {
        let v = s.version.load(Ordering::Acquire);
        if v != seen {
            seen = v;
            let clients = s.clients.read();
            let mine = || clients.iter().filter(|c| c.thread == t);
            slots = mine()
                .enumerate()
                .flat_map(|(i, c)| {
                    c.vqps
                        .read()
                        .iter()
                        .map(|v| (i, v.clone()))
                        .collect::<Vec<_>>()
                })
                .collect();
            pages = mine().map(|c| c.core.clone()).collect();
            publish_cpu(&pages, cpu);
        }
        let mut busy = false;
        let mut doorbell_here = None;
        rung.clear();
        rung.extend(pages.iter().map(|p| take_doorbells(&p.page)));
        for (page, slot) in &slots {
            // Only the rings whose doorbells the pages mark, and the VQPs
            // with WRs in flight.
            let marked = rung.get(*page).is_some_and(|bits| rang(bits, slot.handle));
            if !marked && slot.quiet.load(Ordering::Relaxed) != QUIET_NEVER {
                continue;
            }
            let (b, here) = serve(s, slot, cpu);
            busy |= b;
            if let Some(here) = here {
                // Any doorbell of the round posted from this CPU counts.
                doorbell_here = Some(here || doorbell_here == Some(true));
            }
        }
        if let Some(here) = doorbell_here {
            colocated = here;
        }
        if busy {
            empty = 0;
            continue;
        }
        if empty == 0 {
            // The first empty round since work: the idle spin starts.
            idle_since = Instant::now();
        }
        empty += 1;
        if empty % 64 != 0 {
            std::hint::spin_loop();
            continue;
        }
        cpu = moved(&pages, cpu);
        let idle = idle_since.elapsed();
        if idle < s.cfg.idle_spin {
            // Idle a while, not yet asleep: give the CPU to a thread that
            // waits for it. A process this thread woke (eventfd, futex)
            // is often placed on this CPU, and a spin that never yields
            // keeps it off until the spin ends (a whole `idle_spin` per
            // request was measured so). Not in the first microseconds:
            // back-to-back doorbells keep the spin plain; but at once
            // when the last doorbell's poster waits on this CPU.
            if idle >= YIELD_AFTER || colocated {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        // Idle: raise the flag, look once more, sleep on the eventfd.
        for p in &pages {
            word(&p.page, PAGE_SLEEPING).store(1, Ordering::SeqCst);
        }
        let pending = pages.iter().any(|p| doorbells_marked(&p.page));
        if !pending && s.version.load(Ordering::Acquire) == seen {
            s.n.sleeps.fetch_add(1, Ordering::Relaxed);
            let mut fds = [rustix::event::PollFd::new(
                wake_fd,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            let _ = rustix::event::poll(&mut fds, Some(&timeout));
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(wake_fd, &mut buf);
            cpu = moved(&pages, cpu);
        }
        for p in &pages {
            word(&p.page, PAGE_SLEEPING).store(0, Ordering::SeqCst);
        }
        empty = 0;
    }
}

/// Writes `cpu` into every page as the data thread's CPU.
fn publish_cpu(pages: &[Arc<ClientCore>], cpu: u64) {
    for p in pages {
        word(&p.page, PAGE_DATA_CPU).store(cpu, Ordering::Relaxed);
    }
}

/// This thread's CPU now, written into the pages when it is not `cpu`.
fn moved(pages: &[Arc<ClientCore>], cpu: u64) -> u64 {
    let now = this_cpu();
    if now != cpu {
        publish_cpu(pages, now);
    }
    now
}

/// Serves one ring: its new doorbell, then its completions. Whether the
/// VQP had work or still has WRs in flight, and, when a doorbell was
/// served, whether the process posted it from `cpu` (this thread's).
fn serve<N: Nic>(s: &Shared<N>, slot: &VqpSlot<N>, cpu: u64) -> (bool, Option<bool>) {
    let tail = word(&slot.ring, SQ_TAIL).load(Ordering::Acquire);
    if slot.quiet.load(Ordering::Relaxed) == tail {
        // No new doorbell, nothing in flight: not even the lock (a round
        // over 200 idle rings spent most of its time taking theirs).
        return (false, None);
    }
    let mut st = slot.serve.lock();
    let r = serve_locked(s, slot, &mut st, tail, cpu);
    let quiet = if st.active { QUIET_NEVER } else { st.head };
    slot.quiet.store(quiet, Ordering::Relaxed);
    r
}

fn serve_locked<N: Nic>(
    s: &Shared<N>,
    slot: &VqpSlot<N>,
    st: &mut Serve,
    tail: u64,
    cpu: u64,
) -> (bool, Option<bool>) {
    let ring = &slot.ring;
    let mut busy = false;
    let mut doorbell_here = None;
    if tail != st.head {
        busy = true;
        doorbell_here = Some(word(ring, SQ_CPU).load(Ordering::Relaxed) == cpu);
        let verdict = doorbell(s, slot, st, tail);
        // Whatever the verdict, look at the VQP's completions again.
        st.active = true;
        if verdict.code != PostCode::Posted as u64 {
            s.n.refused_doorbells.fetch_add(1, Ordering::Relaxed);
        }
        write_verdict(ring, &verdict);
        st.head = tail;
        word(ring, SQ_HEAD).store(tail, Ordering::Release);
        ring::notify(ring);
    }
    if !st.active {
        return (busy, doorbell_here);
    }
    let used = st
        .cq_tail
        .wrapping_sub(word(ring, CQ_HEAD).load(Ordering::Acquire));
    // Completions may wait in the VQP while the ring is full, or past
    // what one poll takes: it stays active until a poll finds none and
    // nothing is in flight.
    let mut more = true;
    if let Some(room) = (CQ_CAP as u64).checked_sub(used).filter(|r| *r > 0) {
        let want = (room as usize).min(st.wcs.len());
        let k = slot.vqp.poll(&mut st.wcs[..want]).unwrap_or(0);
        more = k > 0;
        for (i, wc) in st.wcs[..k].iter().enumerate() {
            encode_cqe(ring, st.cq_tail.wrapping_add(i as u64), wc);
        }
        if k > 0 {
            st.cq_tail = st.cq_tail.wrapping_add(k as u64);
            word(ring, CQ_TAIL).store(st.cq_tail, Ordering::Release);
            ring::notify(ring);
            s.n.completions.fetch_add(k as u64, Ordering::Relaxed);
            busy = true;
        }
    }
    st.active = more || slot.vqp.outstanding() > 0;
    (busy || st.active, doorbell_here)
}

fn verdict(code: PostCode, index: usize, message: String) -> Verdict {
    Verdict {
        code: code as u64,
        index: index as u64,
        a: 0,
        b: 0,
        message,
    }
}

/// The entries `st.head..tail` as one doorbell, checked.
fn doorbell<N: Nic>(s: &Shared<N>, slot: &VqpSlot<N>, st: &mut Serve, tail: u64) -> Verdict {
    let n = tail.wrapping_sub(st.head);
    if st.broken {
        return verdict(
            PostCode::Broken,
            0,
            "the VQP's ring was broken earlier".into(),
        );
    }
    if n > SQ_CAP as u64 {
        st.broken = true;
        return verdict(
            PostCode::BadRing,
            0,
            format!("submission tail {tail} runs {n} entries past the head (at most {SQ_CAP})"),
        );
    }
    st.wrs.clear();
    // One load from each slot's line first: their misses (the process
    // wrote them on another core) overlap instead of coming one by one
    // as the decode loop reaches them.
    ring::touch_sq(&slot.ring, st.head, n);
    let spans = slot.core.spans.read();
    let mut at = st.head;
    while at != tail {
        let i = st.wrs.len();
        let wr = match decode_sqe(&slot.ring, at, tail) {
            Ok((wr, slots)) => {
                at = at.wrapping_add(slots);
                wr
            }
            Err(e) => return verdict(PostCode::BadEntry, i, e.to_string()),
        };
        if let Payload::Local(list) = &wr.payload {
            for sge in list.as_slice() {
                if !owns(&spans, sge.addr, sge.length, sge.lkey) {
                    return verdict(
                        PostCode::ForeignMemory,
                        i,
                        format!(
                            "local {} bytes at {:#x} under lkey {:#x} are not this process's memory",
                            sge.length, sge.addr, sge.lkey
                        ),
                    );
                }
            }
        }
        st.wrs.push(wr);
    }
    drop(spans);
    s.n.doorbells.fetch_add(1, Ordering::Relaxed);
    match slot.vqp.post_send(&mut st.wrs) {
        Ok(()) => {
            s.n.wrs.fetch_add(st.wrs.len() as u64, Ordering::Relaxed);
            verdict(PostCode::Posted, 0, String::new())
        }
        Err(VqpError::Rejected(r)) => verdict(PostCode::Rejected, r.index, r.reason.to_string()),
        Err(e @ VqpError::NotConnected { .. }) => verdict(PostCode::NotConnected, 0, e.to_string()),
        Err(e @ VqpError::VqpFull { .. }) => verdict(PostCode::Full, 0, e.to_string()),
        Err(e) => verdict(PostCode::Failed, 0, error_line(&e)),
    }
}
