//! The engine's control-path events (`tracing`): a recording subscriber,
//! installed globally in this test binary (its only test), sees a DCI
//! created and a shared QP's recovery, and no event for the posts and
//! polls around them.

mod common;

use std::sync::{Arc, Mutex};

use common::{config, wait_wcs, Cluster};
use krcore_nic::{Access, MemoryRegion, SendWr, WcStatus};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Records each event as `LEVEL message field=value ...`.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}{}", self.0);
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = Line(String::new());
        event.record(&mut line);
        let level = *event.metadata().level();
        if let Ok(mut v) = self.0.lock() {
            v.push(format!("{level} {}", line.0));
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn dci_creation_and_recovery_are_events_posts_and_polls_are_not() {
    let rec = Recorder::default();
    tracing::subscriber::set_global_default(rec.clone()).expect("the only subscriber");
    let events = || rec.0.lock().map(|v| v.clone()).unwrap_or_default();

    let c = Cluster::new();
    let mem = c.memory_node(4096);
    let e = c.engine(config(|c| c.precheck = false).with_pool_size(1));
    let local = e.alloc_mr(4096, Access::ALL).unwrap();
    let (good, bad) = (e.create_vqp().unwrap(), e.create_vqp().unwrap());
    good.connect(mem.gid()).unwrap();
    bad.connect(mem.gid()).unwrap();
    let dci = events()
        .into_iter()
        .filter(|l| l.contains("DCI created"))
        .count();
    assert_eq!(dci, 1, "one DCI: {:?}", events());

    // Posts and polls on a healthy QP: no event.
    let before = events().len();
    for i in 0..16 {
        let wr = SendWr::read(i, local.sge(0, 8).unwrap(), mem.mr.remote(0)).signaled(true);
        good.post_send(&mut [wr]).unwrap();
        assert_eq!(wait_wcs(&good, 1)[0].status, WcStatus::Success);
    }
    assert_eq!(events().len(), before, "{:?}", &events()[before..]);

    // A bad rkey: the shared DCI goes to ERR, the next poll or post
    // recovers it.
    let mut remote = mem.mr.remote(0);
    remote.rkey ^= 0x5a5a;
    let wr = SendWr::read(99, local.sge(8, 8).unwrap(), remote).signaled(true);
    bad.post_send(&mut [wr]).unwrap();
    assert_eq!(wait_wcs(&bad, 1)[0].status, WcStatus::RemAccessErr);
    let wr = SendWr::read(100, local.sge(0, 8).unwrap(), mem.mr.remote(0)).signaled(true);
    good.post_send(&mut [wr]).unwrap();
    assert_eq!(wait_wcs(&good, 1)[0].status, WcStatus::Success);
    let all = events();
    for l in &all {
        eprintln!("{l}");
    }
    let found = |what: &str, level: Level| {
        all.iter()
            .any(|l| l.starts_with(&level.to_string()) && l.contains(what))
    };
    assert!(found("shared QP found in ERR", Level::WARN), "{all:?}");
    assert!(found("shared QP recovered", Level::INFO), "{all:?}");
    assert!(
        all.iter().any(|l| l.contains("guilty_vqp=vqp#")),
        "the failing VQP is named: {all:?}"
    );
}
