//! The RACE RDMA binding's byte formats from the fabric: the memory node
//! record (`NodeInfo`) and the two-sided allocation request/reply. Decoding
//! never panics, and what decodes re-encodes to bytes that decode the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use race_store::rdma::{AllocReply, AllocRequest, NodeInfo};

fuzz_target!(|data: &[u8]| {
    // As given, and zero-padded / truncated to each message's length.
    let mut inputs = vec![data.to_vec()];
    for len in [24usize, 28, 48] {
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
    }
});
