//! Round trips and cuts of every control message.

use super::*;
use krcore_nic::Gid;

fn body(frame: &[u8]) -> &[u8] {
    assert_eq!(
        frame_len(frame[..4].try_into().unwrap()).unwrap(),
        frame.len() - 4
    );
    &frame[4..]
}

#[test]
fn every_message_round_trips_and_every_cut_is_an_error() {
    let gid = Gid([7; 16]);
    let reqs = [
        Request::Hello {
            version: 1,
            pid: 42,
        },
        Request::AllocMr {
            len: 4096,
            access: 15,
        },
        Request::FreeMr { mr: 3 },
        Request::CreateVqp,
        Request::DestroyVqp { vqp: 9 },
        Request::Connect { vqp: 1, gid },
        Request::Grant {
            vqp: 1,
            grant: WireGrant {
                gid,
                rkey: 5,
                addr: 6,
                len: 7,
                access: 4,
                ttl_ms: u64::MAX,
            },
        },
        Request::SetUngranted { vqp: 2, allow: 1 },
        Request::Stats,
        Request::CreateEndpoint { window: 1 },
        Request::DestroyEndpoint { ep: 2 },
        Request::Push {
            ep: 1,
            gid,
            port: 7,
            wait_ms: 5000,
            data: b"req".to_vec(),
        },
        Request::PopReply { ep: 1, wait_ms: 0 },
        Request::CloseChannel {
            ep: 1,
            gid,
            port: 7,
        },
        Request::Credits {
            ep: 1,
            gid,
            port: 7,
        },
        Request::OpenAhead {
            ep: 1,
            gid,
            port: 7,
        },
        Request::PushAhead {
            ep: 1,
            gid,
            port: 7,
            data: b"grant please".to_vec(),
        },
        Request::StoreJoin {
            store: "kv".into(),
            id: 3,
            record: b"rec".to_vec(),
            lease_ms: 10_000,
        },
        Request::StoreLeave {
            store: "kv".into(),
            id: 3,
        },
    ];
    for r in &reqs {
        let f = r.encode();
        assert_eq!(&Request::decode(body(&f)).unwrap(), r);
        for cut in 0..f.len() - 4 {
            assert!(
                Request::decode(&f[4..4 + cut]).is_err(),
                "{r:?} cut at {cut}"
            );
        }
        let mut long = f[4..].to_vec();
        long.push(0);
        assert!(matches!(
            Request::decode(&long),
            Err(WireError::Trailing { .. })
        ));
    }
    let reps = [
        Reply::Welcome {
            version: 1,
            gid,
            mode: 1,
            max_vqps: 8,
            max_mr_bytes: 1 << 30,
        },
        Reply::Mr {
            mr: 1,
            addr: 2,
            len: 3,
            lkey: 4,
            rkey: 5,
        },
        Reply::Vqp { vqp: 1, id: 2 },
        Reply::Done,
        Reply::Stats(NodeStats {
            qps_created: 1,
            modeled_control_ns: 2,
            network_ops: 3,
            dcis: 4,
            vqps_created: 5,
            connect_hits: 6,
            connect_misses: 7,
            meta_reads: 8,
            rc_upgrades: 9,
            rc_downgrades: 10,
            rc_upgrade_failures: 11,
            rc_pairs: 12,
            clients: 13,
        }),
        Reply::Refused {
            code: RefuseCode::Quota,
            message: "full".into(),
        },
        Reply::Refused {
            code: RefuseCode::UnknownNode,
            message: "no such node".into(),
        },
        Reply::Endpoint { ep: 1, id: 3 },
        Reply::Message {
            gid,
            vqp: 11,
            port: 7,
            seq: 9,
            data: b"ans".to_vec(),
        },
        Reply::NoMessage,
        Reply::Flag(true),
        Reply::Credits(Some(4)),
        Reply::Credits(None),
        Reply::MsgFailed(MsgFailure::Refused {
            gid,
            port: 7,
            code: 2,
        }),
        Reply::MsgFailed(MsgFailure::TooLarge { len: 9, max: 8 }),
        Reply::MsgFailed(MsgFailure::WouldBlock),
        Reply::MsgFailed(MsgFailure::Timeout(5)),
        Reply::MsgFailed(MsgFailure::Lost {
            gid,
            port: 7,
            seq: 1,
            status: 12,
        }),
        Reply::MsgFailed(MsgFailure::Other("why".into())),
        Reply::MetaRefused { code: 32 },
    ];
    for r in &reps {
        let f = r.encode();
        assert_eq!(&Reply::decode(body(&f)).unwrap(), r);
        for cut in 0..f.len() - 4 {
            assert!(Reply::decode(&f[4..4 + cut]).is_err(), "{r:?} cut at {cut}");
        }
    }
    assert_eq!(
        Request::decode(&[200]),
        Err(WireError::UnknownTag { tag: 200 })
    );
    // A store's name that is not UTF-8 is refused, typed.
    let mut bad = Request::StoreLeave {
        store: "ab".into(),
        id: 1,
    }
    .encode();
    bad[4 + 1 + 4] = 0xff;
    assert_eq!(
        Request::decode(&bad[4..]),
        Err(WireError::NotUtf8 { tag: 30 })
    );
    assert!(matches!(
        frame_len((MAX_FRAME as u32 + 1).to_le_bytes()),
        Err(WireError::TooLong { .. })
    ));
}
