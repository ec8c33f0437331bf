//! The RACE RDMA binding's byte formats from the fabric: the memory node
//! record (`NodeInfo`), the two-sided allocation request/reply, and the
//! runs request/reply (grants of blocks given back, blocks given back).
//! Decoding never panics, and what decodes re-encodes to bytes that decode
//! the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use race_store::rdma::{AllocReply, AllocRequest, NodeInfo, RunsReply, RunsRequest};

fuzz_target!(|data: &[u8]| {
    // As given, and zero-padded / truncated to each message's length.
    let mut inputs = vec![data.to_vec()];
    for len in [24usize, 28, 40, 48, 56] {
        let mut v = data[..data.len().min(len)].to_vec();
        v.resize(len, 0);
        inputs.push(v);
    }
    for b in &inputs {
        if let Ok(n) = NodeInfo::decode(b) {
            assert_eq!(NodeInfo::decode(&n.encode()).ok(), Some(n));
        }
        if let Ok(r) = AllocRequest::decode(b) {
            assert_eq!(AllocRequest::decode(&r.encode()).ok(), Some(r));
        }
        if let Ok(r) = AllocReply::decode(b) {
            assert_eq!(AllocReply::decode(&r.encode()).ok(), Some(r));
        }
        if let Ok(r) = RunsRequest::decode(b) {
            assert_eq!(RunsRequest::decode(&r.encode()).ok(), Some(r));
        }
        if let Ok(r) = RunsReply::decode(b) {
            assert_eq!(RunsReply::decode(&r.encode()).ok(), Some(r));
        }
    }
});
