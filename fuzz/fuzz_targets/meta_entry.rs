//! A meta-table entry read from remote memory: parsing never panics, and an
//! entry that parses re-emits to bytes that parse to the same entry.
#![no_main]
use krcore_meta::entry::{EntryRepr, EntryView};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Also as exactly one entry (zero-padded), so every input reaches parse.
    let mut one = data[..data.len().min(64)].to_vec();
    one.resize(64, 0);
    check(data);
    check(&one);
});

fn check(data: &[u8]) {
    if let Ok(view) = EntryView::new_checked(data) {
        if let Ok(repr) = EntryRepr::parse(&view) {
            let image = repr.to_image(2);
            let again = EntryRepr::parse(&EntryView::new_checked(&image[..]).unwrap()).unwrap();
            assert_eq!(again, repr);
        }
    }
}
