//! A RACE directory image read from a memory node: the view and the parse are
//! total over arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use race_store::layout::directory::{Directory, DirectoryRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = Directory::new_checked(data) {
        let _ = DirectoryRepr::parse(&d);
    }
});
