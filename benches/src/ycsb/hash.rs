//! YCSB's 64-bit FNV-1a hash (`site.ycsb.Utils.fnvhash64`) and key naming.
//!
//! YCSB hashes a `long` by feeding its 8 bytes, least significant first, through
//! FNV-1a 64 and then takes Java's `Math.abs` of the result read as a signed
//! `long`. Both the scrambled zipfian generator and the key names
//! (`CoreWorkload.buildKeyName`) use it, so key 0 is `user6284781860667377211`
//! as in every YCSB run.

/// FNV-1a 64 offset basis (`Utils.FNV_OFFSET_BASIS_64`).
pub const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;

/// FNV-1a 64 prime (`Utils.FNV_PRIME_64`).
pub const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64(long)`: FNV-1a 64 over the 8 little-endian bytes of
/// `val`, then `Math.abs` of the signed result.
///
/// Like Java's `Math.abs`, the one input whose hash is `i64::MIN` keeps that
/// negative value (`wrapping_abs`); callers that need a non-negative number must
/// reduce it with `rem_euclid` (see [`crate::ycsb::ScrambledZipfianGenerator`]).
pub fn fnv_hash64(val: i64) -> i64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    let mut v = val;
    for _ in 0..8 {
        // Java: `long octet = val & 0x00ff; val = val >> 8;` (arithmetic shift:
        // only the low 8 bits of each step are used, so this is the LE bytes).
        let octet = (v & 0xff) as u64;
        v >>= 8;
        hash ^= octet;
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    (hash as i64).wrapping_abs()
}

/// Plain FNV-1a 64 over a byte string (the published algorithm, no `abs`).
///
/// Not used by YCSB itself; it is the reference against which
/// [`fnv_hash64`] is checked, and handy for hashing key bytes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS_64, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(FNV_PRIME_64)
    })
}

/// Order in which the load phase lays out keys (`insertorder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InsertOrder {
    /// `insertorder=hashed` (YCSB's default): key number `k` is named after
    /// `fnv_hash64(k)`, which scatters consecutive inserts over the key space.
    Hashed,
    /// `insertorder=ordered`: key number `k` is named after `k` itself.
    Ordered,
}

/// YCSB's `CoreWorkload.buildKeyName`: `"user"`, then zeros up to
/// `zero_padding` digits, then the decimal key number (hashed first when
/// `order` is [`InsertOrder::Hashed`]).
pub fn build_key_name(keynum: u64, order: InsertOrder, zero_padding: usize) -> String {
    let mut key = String::new();
    write_key_name(&mut key, keynum, order, zero_padding);
    key
}

/// [`build_key_name`] into `key` (cleared first), reusing its storage: the
/// drivers name a key per operation without allocating.
pub fn write_key_name(key: &mut String, keynum: u64, order: InsertOrder, zero_padding: usize) {
    let (negative, n) = match order {
        // Java passes the key number as a `long`; key numbers stay far below
        // 2^63, and the cast keeps the same 8 bytes in any case. The hash is
        // negative only as `Math.abs(Long.MIN_VALUE)`, printed with its sign.
        InsertOrder::Hashed => {
            let h = fnv_hash64(keynum as i64);
            (h < 0, h.unsigned_abs())
        }
        InsertOrder::Ordered => (false, keynum),
    };
    // The decimal digits, last first (a u64 has at most 20).
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let mut v = n;
    loop {
        at -= 1;
        if let Some(d) = buf.get_mut(at) {
            *d = b'0' + (v % 10) as u8;
        }
        v /= 10;
        if v == 0 || at == 0 {
            break;
        }
    }
    let digits = buf.get(at..).unwrap_or_default();
    key.clear();
    key.push_str("user");
    // Java pads the string of the number, sign included.
    let len = digits.len() + usize::from(negative);
    let mut pad = zero_padding.saturating_sub(len);
    while pad > 0 {
        let n = pad.min(ZEROS.len());
        key.push_str(ZEROS.get(..n).unwrap_or_default());
        pad -= n;
    }
    if negative {
        key.push('-');
    }
    // Decimal digits are ASCII: the conversion always succeeds and copies
    // them in one go (pushing them as chars encoded each one).
    key.push_str(std::str::from_utf8(digits).unwrap_or_default());
}

/// Padding zeros, copied a slice at a time.
const ZEROS: &str = "00000000000000000000000000000000";

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent, textbook FNV-1a 64 over the little-endian bytes, with
    /// Java's `Math.abs` applied afterwards.
    fn reference_ycsb_hash(val: i64) -> i64 {
        let mut h: u64 = 0xcbf29ce484222325;
        for b in val.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        let signed = h as i64;
        if signed == i64::MIN {
            signed
        } else {
            signed.abs()
        }
    }

    #[test]
    fn fnv1a64_published_vectors() {
        // From the FNV reference test suite (Noll's test vectors).
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn fnv_hash64_known_constants() {
        // Computed with a separate implementation (Python, arbitrary precision).
        let cases: [(i64, i64); 8] = [
            (0, 6284781860667377211),
            (1, 8517097267634966620),
            (2, 1820151046732198393),
            (42, 55488592825689361),
            (1000, 5952875239596136740),
            (123456789, 2350796791908741607),
            (-1, 8289690350564177859),
            (i64::MAX, 8289549613075766851),
        ];
        for (input, expected) in cases {
            assert_eq!(fnv_hash64(input), expected, "fnv_hash64({input})");
        }
    }

    #[test]
    fn fnv_hash64_matches_reference_over_many_inputs() {
        let mut x: i64 = 0x1234_5678_9abc_def0;
        for i in -1000i64..1000 {
            assert_eq!(fnv_hash64(i), reference_ycsb_hash(i));
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            assert_eq!(fnv_hash64(x), reference_ycsb_hash(x));
            assert_eq!(fnv_hash64(i) as u64, {
                let h = fnv1a64(&i.to_le_bytes()) as i64;
                h.wrapping_abs() as u64
            });
        }
    }

    #[test]
    fn key_names_like_ycsb() {
        // user6284781860667377211 is the first key of every hashed YCSB load.
        assert_eq!(
            build_key_name(0, InsertOrder::Hashed, 1),
            "user6284781860667377211"
        );
        assert_eq!(
            build_key_name(1, InsertOrder::Hashed, 1),
            "user8517097267634966620"
        );
        assert_eq!(build_key_name(5, InsertOrder::Ordered, 1), "user5");
        assert_eq!(build_key_name(5, InsertOrder::Ordered, 8), "user00000005");
        assert_eq!(build_key_name(123, InsertOrder::Ordered, 2), "user123");
        // Padding applies to the hashed digits too (they are usually longer).
        assert_eq!(
            build_key_name(42, InsertOrder::Hashed, 20),
            "user00055488592825689361"
        );
        assert_eq!(build_key_name(0, InsertOrder::Ordered, 1), "user0");
        // Padding longer than one slice of zeros.
        assert_eq!(
            build_key_name(7, InsertOrder::Ordered, 70),
            format!("user{}7", "0".repeat(69))
        );
        assert_eq!(
            build_key_name(u64::MAX, InsertOrder::Ordered, 1),
            format!("user{}", u64::MAX)
        );
    }

    #[test]
    fn a_reused_key_buffer_holds_only_the_new_name() {
        let mut key = String::from("a much longer leftover than any key name");
        for (k, order, pad) in [
            (7, InsertOrder::Hashed, 1),
            (5, InsertOrder::Ordered, 8),
            (123_456, InsertOrder::Ordered, 2),
            (0, InsertOrder::Ordered, 0),
        ] {
            write_key_name(&mut key, k, order, pad);
            let want = match order {
                InsertOrder::Hashed => fnv_hash64(k as i64).to_string(),
                InsertOrder::Ordered => k.to_string(),
            };
            let fill = pad.saturating_sub(want.len());
            assert_eq!(key, format!("user{}{want}", "0".repeat(fill)));
        }
    }
}
