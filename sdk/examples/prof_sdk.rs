//! `prof_sdk`: a fixed loop of synchronous 64 B READs through the SDK's
//! `Vqp` on `sim:mem`, for instruction counts of the SDK layer (the
//! engine's own VQP path has `kmod/examples/prof_vqp.rs`):
//!
//! ```text
//! cargo build --release -p krcore --example prof_sdk
//! valgrind --tool=callgrind --toggle-collect='*verbs_loop*' \
//!     target/release/examples/prof_sdk 20000 verbs     # post + poll
//! valgrind --tool=callgrind --toggle-collect='*request_loop*' \
//!     target/release/examples/prof_sdk 20000 request   # read(..).wait()
//! ```
//!
//! Instructions per READ = Ir / the count.

use krcore::{Access, Node};
use krcore_nic::{SendWr, Wc};

#[inline(never)]
fn verbs_loop(vqp: &krcore::Vqp, sge: krcore_nic::Sge, at: krcore_nic::RemoteAddr, n: u64) {
    let mut out = [Wc::default(); 4];
    for i in 0..n {
        let mut wr = [SendWr::read(i, sge, at)];
        vqp.post(&mut wr).unwrap();
        loop {
            if vqp.poll(&mut out).unwrap() > 0 {
                break;
            }
        }
    }
}

#[inline(never)]
fn request_loop(
    vqp: &krcore::Vqp,
    buf: &krcore::MemoryRegion,
    token: &krcore::RemoteRegion,
    n: u64,
) {
    for _ in 0..n {
        vqp.read(buf, 0, token, 0, 64).unwrap().wait().unwrap();
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let mode = args.next().unwrap_or_else(|| "verbs".into());
    let server = Node::builder().fabric("sim:mem").host_meta().build()?;
    let client = Node::builder().join(&server).build()?;
    let region = server.alloc(4096, Access::ALL)?;
    let token = region.token();
    let vqp = client.connect(server.gid())?;
    let buf = client.alloc(64, Access::LOCAL_WRITE)?;
    if mode == "verbs" {
        // WRs posted at the verbs level reach the token's range once its
        // grant is known (the request API makes it known by itself).
        vqp.grant(&token)?;
        verbs_loop(&vqp, buf.sge(0, 64)?, token.at(0), n);
    } else {
        request_loop(&vqp, &buf, &token, n);
    }
    Ok(())
}
