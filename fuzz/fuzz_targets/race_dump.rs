//! Dump streams (`race-kv load`'s input, a file that may be cut or
//! damaged) and usage records (read from a memory node): reading never
//! panics; what a dump reader accepts whole re-writes to the same bytes;
//! a usage record that parses re-emits to the same bytes.
//!
//! Raw bytes rarely carry a valid footer, so every input is also used as a
//! recipe: pairs cut from the input are written as a dump, which is then
//! cut and one byte of it flipped at positions the input chooses.
#![no_main]
use libfuzzer_sys::fuzz_target;
use race_store::dump::{DumpReader, DumpWriter};
use race_store::layout::usage::{UsageRepr, USAGE_SIZE};

/// Reads `bytes` as a dump; the pairs if it is whole and valid.
fn read(bytes: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut r = DumpReader::new(bytes).ok()?;
    let mut pairs = Vec::new();
    loop {
        match r.next_pair() {
            Ok(Some(p)) => pairs.push(p),
            Ok(None) => return Some(pairs),
            Err(_) => return None,
        }
    }
}

fn write(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = DumpWriter::new(&mut out).expect("writing to memory");
    for (k, v) in pairs {
        w.pair(k, v).expect("small pairs");
    }
    w.finish().expect("writing to memory");
    out
}

fuzz_target!(|data: &[u8]| {
    if let Some(pairs) = read(data) {
        assert_eq!(write(&pairs), data, "a valid dump is what its pairs write");
    }
    if let Ok(u) = UsageRepr::parse(data) {
        assert_eq!(&u.emit()[..], &data[..USAGE_SIZE]);
    }
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    // Pairs of up to 15-byte keys and values cut from the input.
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = rest
        .chunks(30)
        .map(|c| {
            let k = (usize::from(c[0]) % 16).min(c.len());
            (c[..k].to_vec(), c[k..].to_vec())
        })
        .collect();
    let dump = write(&pairs);
    assert_eq!(read(&dump).as_deref(), Some(&pairs[..]));
    // Cut it: never a short success.
    let cut = usize::from(ctl) * dump.len() / 256;
    if cut < dump.len() {
        assert!(read(&dump[..cut]).is_none(), "a cut dump is refused");
    }
    // Flip one byte past the header: refused, or (a length byte that still
    // frames the stream) never the same pairs.
    if dump.len() > 8 {
        let mut bad = dump.clone();
        let at = 8 + usize::from(ctl) % (dump.len() - 8);
        bad[at] ^= 0x5a;
        if let Some(got) = read(&bad) {
            assert_ne!(got, pairs, "a damaged dump read as the original");
        }
    }
});
