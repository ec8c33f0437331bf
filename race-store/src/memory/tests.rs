//! Tests of the in-process memory nodes, their table format and transport.

use super::*;
use crate::layout::directory::Directory;
use crate::layout::subtable::SubtableGeometry;
use crate::remote::{OpResult, RemoteOp, Transport};

fn p(node: u8, off: u64) -> RemotePtr {
    RemotePtr::new(node, off).unwrap()
}

#[test]
fn presizing_picks_the_smallest_depth_that_holds_the_keys_at_half_fill() {
    let t = TableConfig::default();
    // 86,016 slots per subtable: 43,008 keys each.
    let depth = |keys, nodes| t.presized_for(keys, nodes).initial_global_depth;
    assert_eq!(depth(0, 1), 0);
    assert_eq!(depth(43_008, 1), 0);
    assert_eq!(depth(43_009, 1), 1);
    assert_eq!(depth(100_000, 1), 2);
    assert_eq!(depth(1_000_000, 1), 5);
    assert_eq!(depth(u64::MAX, 1), t.max_global_depth);
    assert_eq!(t.presized_for(1_000_000, 1).geometry, t.geometry);
    // Over several nodes: at least 4 subtables per node, so that each
    // holds a share; keys 0 still grows from one subtable.
    assert_eq!(depth(0, 4), 0);
    assert_eq!(depth(1, 2), 3);
    assert_eq!(depth(100_000, 3), 4);
    assert_eq!(depth(1_000_000, 2), 5);
    assert_eq!(depth(1_000_000, 16), 6);
    assert_eq!(depth(1_000_000, 255), 10);
    for nodes in 1..=9u8 {
        let table = t.presized_for(1, nodes);
        let shares: Vec<u64> = (0..nodes)
            .map(|n| table.share(n, nodes).unwrap().0)
            .collect();
        let mean = (1u64 << table.initial_global_depth) as f64 / f64::from(nodes);
        let most = *shares.iter().max().unwrap() as f64;
        assert!(most <= 1.25 * mean, "{nodes} nodes: {shares:?}");
        assert!(shares.iter().all(|&s| s > 0), "{nodes} nodes: {shares:?}");
    }
}

#[test]
fn bytes_over_words() {
    let n = MemoryNode::new(1, 256);
    n.write(3, b"hello, world").unwrap();
    assert_eq!(n.read(3, 12).unwrap(), b"hello, world");
    assert_eq!(n.read(0, 3).unwrap(), [0, 0, 0]);
    n.write(5, b"XY").unwrap();
    assert_eq!(n.read(3, 12).unwrap(), b"heXYo, world");
    assert_eq!(n.read(16, 0).unwrap(), Vec::<u8>::new());
    assert!(matches!(
        n.read(250, 8),
        Err(TransportError::OutOfBounds { len: 8, .. })
    ));
    assert!(n.write(u64::MAX, b"x").is_err());
}

#[test]
fn atomics_and_alignment() {
    let n = MemoryNode::new(2, 64);
    assert_eq!(n.cas(8, 0, 7).unwrap(), 0);
    assert_eq!(n.cas(8, 0, 9).unwrap(), 7);
    assert_eq!(n.faa(8, 3).unwrap(), 7);
    assert_eq!(n.read(8, 8).unwrap(), 10u64.to_le_bytes());
    assert!(matches!(
        n.cas(4, 0, 1),
        Err(TransportError::Misaligned { .. })
    ));
    assert!(matches!(
        n.faa(64, 1),
        Err(TransportError::OutOfBounds { .. })
    ));
    n.set_down(true);
    assert_eq!(n.cas(8, 0, 1), Err(TransportError::NodeDown { node: 2 }));
    assert_eq!(n.alloc(64), Err(TransportError::NodeDown { node: 2 }));
}

/// Memory that records what it was asked to fault in.
#[derive(Debug)]
struct Faults {
    words: WordMemory,
    asked: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl NodeMemory for Faults {
    fn len_bytes(&self) -> u64 {
        self.words.len_bytes()
    }
    fn read_into(&self, offset: u64, buf: &mut [u8]) {
        self.words.read_into(offset, buf);
    }
    fn write_from(&self, offset: u64, bytes: &[u8]) {
        self.words.write_from(offset, bytes);
    }
    fn prefault(&self, offset: u64, len: u64) {
        self.asked.lock().unwrap().push((offset, len));
    }
}

#[test]
fn prefault_keeps_ahead_of_the_heap_in_bounded_steps() {
    let cap = 3 * PREFAULT_AHEAD;
    let n = MemoryNode::with_memory(
        0,
        Faults {
            words: WordMemory::new(cap),
            asked: Default::default(),
        },
    );
    let catch_up = |n: &MemoryNode<Faults>| {
        let mut total = 0;
        loop {
            match n.prefault_ahead() {
                0 => return total,
                step => {
                    assert!(step <= PREFAULT_STEP);
                    total += step;
                }
            }
        }
    };
    // From the region's start to PREFAULT_AHEAD past the heap's end.
    let first = catch_up(&n);
    assert_eq!(first, RESERVED_PREFIX + PREFAULT_AHEAD);
    assert_eq!(n.stats().prefaulted, first);
    // Handing out memory moves the target by as much, no more.
    n.alloc(5 << 20).unwrap();
    let heap = n.stats().heap_used;
    assert_eq!(catch_up(&n), heap - RESERVED_PREFIX);
    assert_eq!(n.stats().prefaulted, heap + PREFAULT_AHEAD);
    // Never past the region's end.
    while n.alloc(1 << 20).is_ok() {}
    catch_up(&n);
    assert_eq!(n.stats().prefaulted, cap);
    // The steps tile the region exactly once, in order.
    let asked = n.memory().asked.lock().unwrap().clone();
    let mut at = 0;
    for (off, len) in asked {
        assert_eq!(off, at);
        assert!(len > 0 && len <= PREFAULT_STEP);
        at += len;
    }
    assert_eq!(at, cap);
}

#[test]
fn allocator_aligns_and_runs_out() {
    let n = MemoryNode::new(0, 8192);
    assert_eq!(n.alloc(1).unwrap(), 4096);
    assert_eq!(n.alloc(100).unwrap(), 4160);
    assert_eq!(n.alloc(64).unwrap(), 4288);
    assert_eq!(n.stats().blocks, 3);
    assert!(matches!(
        n.alloc(8192),
        Err(TransportError::OutOfMemory { .. })
    ));
    assert!(n.alloc(u64::MAX).is_err());
}

#[test]
fn format_lays_out_directory_and_subtables() {
    let table = TableConfig {
        geometry: SubtableGeometry::new(2).unwrap(),
        initial_global_depth: 2,
        max_global_depth: 5,
    };
    let cluster = LocalCluster::new(ClusterConfig {
        nodes: 2,
        node_bytes: 1 << 16,
        table,
    })
    .unwrap();
    let n0 = cluster.node(0).unwrap();
    let sb = SuperblockRepr::parse(&n0.read(0, 64).unwrap()).unwrap();
    assert_eq!(
        (sb.geometry, sb.max_global_depth, sb.nodes),
        (table.geometry, 5, 2)
    );
    let dir_bytes = n0.read(DIR_OFFSET, 64 + 8 * 4).unwrap();
    let dir = DirectoryRepr::parse(&Directory::new_checked(&dir_bytes[..]).unwrap()).unwrap();
    dir.check_consistency().unwrap();
    assert_eq!(dir.global_depth(), 2);
    // Spread by suffix as splits place subtables: 0 and 2 on node 0
    // after the directory area, 1 and 3 on node 1 after its prefix.
    let stride = table.geometry.bytes().next_multiple_of(BLOCK_ALIGN);
    for (i, e) in dir.entries.iter().enumerate() {
        assert_eq!(e.local_depth(), 2);
        let (node, start) = match i % 2 {
            0 => (0, node0_heap_start(5).unwrap()),
            _ => (1, RESERVED_PREFIX),
        };
        assert_eq!(e.ptr().node(), node, "subtable {i}");
        assert_eq!(e.ptr().offset(), start + (i as u64 / 2) * stride);
        let img = cluster
            .node(node)
            .unwrap()
            .read(e.ptr().offset(), table.geometry.bytes() as usize)
            .unwrap();
        let st = Subtable::new_checked(&img[..], table.geometry).unwrap();
        assert_eq!(
            st.bucket(1, 2).unwrap().header(),
            Ok(Suffix::new(i as u32, 2).unwrap())
        );
    }
    for node in 0..2 {
        let (count, end) = table.share(node, 2).unwrap();
        assert_eq!(count, 2);
        assert_eq!(end, cluster.node(node).unwrap().stats().heap_used);
    }
    assert!(matches!(n0.format(&table, 2), Err(Error::BadTable { .. })));
    let n1 = cluster.node(1).unwrap();
    assert!(matches!(n1.format(&table, 2), Err(Error::BadTable { .. })));
    // A share is laid out once, on a node that holds one.
    for (node, nodes) in [(n1, 2), (n0, 2)] {
        assert!(matches!(
            node.lay_out_share(&table, nodes),
            Err(Error::BadTable { .. })
        ));
    }
    assert!(matches!(
        MemoryNode::new(2, 1 << 16).lay_out_share(&table, 2),
        Err(Error::BadTable { .. })
    ));
    // More nodes than subtables: the last ones hold none.
    let (count, end) = table.share(6, 7).unwrap();
    assert_eq!((count, end), (0, RESERVED_PREFIX));
    let idle = MemoryNode::new(6, 1 << 16);
    idle.lay_out_share(&table, 7).unwrap();
    assert_eq!(idle.stats().heap_used, RESERVED_PREFIX);
    assert!(table.share(7, 7).is_err());
    // A node too small for its share: out of memory, not a short table.
    let small = ClusterConfig {
        nodes: 2,
        node_bytes: RESERVED_PREFIX + stride,
        table: TableConfig {
            max_global_depth: 2,
            ..table
        },
    };
    assert!(matches!(
        LocalCluster::new(small),
        Err(Error::OutOfMemory { .. })
    ));
    let tiny = ClusterConfig {
        nodes: 1,
        node_bytes: 4096,
        table,
    };
    assert!(matches!(
        LocalCluster::new(tiny),
        Err(Error::OutOfMemory { .. })
    ));
    assert!(LocalCluster::new(ClusterConfig {
        nodes: 0,
        ..ClusterConfig::default()
    })
    .is_err());
}

#[test]
fn transport_batches_in_order_and_node_down() {
    let cluster = LocalCluster::new(ClusterConfig {
        nodes: 2,
        node_bytes: 1 << 16,
        table: TableConfig {
            geometry: SubtableGeometry::new(1).unwrap(),
            initial_global_depth: 0,
            max_global_depth: 4,
        },
    })
    .unwrap();
    let mut t = cluster.transport();
    assert_eq!(t.nodes(), 2);
    let block = t.alloc_block(1, 100).unwrap();
    assert_eq!(block.node(), 1);
    assert_eq!(block.offset() % 64, 0);
    let data = 5u64.to_le_bytes();
    let r = t
        .execute(&[
            RemoteOp::Write {
                ptr: block,
                bytes: &data,
            },
            RemoteOp::Cas {
                ptr: block,
                expect: 5,
                new: 6,
            },
            RemoteOp::Faa { ptr: block, add: 1 },
            RemoteOp::Read { ptr: block, len: 8 },
        ])
        .unwrap();
    assert_eq!(
        r,
        vec![
            OpResult::Written,
            OpResult::Cas { old: 5 },
            OpResult::Faa { old: 6 },
            OpResult::Read(7u64.to_le_bytes().to_vec())
        ]
    );
    assert!(cluster.set_node_down(1, true));
    assert_eq!(
        t.execute(&[RemoteOp::Read { ptr: block, len: 8 }]),
        Err(TransportError::NodeDown { node: 1 })
    );
    assert!(t
        .execute(&[RemoteOp::Read {
            ptr: p(0, 0),
            len: 8
        }])
        .is_ok());
    assert!(cluster.set_node_down(1, false));
    assert!(!cluster.set_node_down(9, true));
    assert_eq!(
        t.execute(&[RemoteOp::Read {
            ptr: p(3, 0),
            len: 8
        }]),
        Err(TransportError::NoSuchNode { node: 3 })
    );
    assert_eq!(cluster.len(), 2);
    assert!(!cluster.is_empty());
    assert_eq!(cluster.stats().len(), 2);
}
