//! The zipfian family: `ZipfianGenerator`, `ScrambledZipfianGenerator` and
//! `SkewedLatestGenerator`, after `site.ycsb.generator`.
//!
//! The method is Gray et al., "Quickly Generating Billion-Record Synthetic
//! Databases" (SIGMOD 1994), as YCSB implements it. The arithmetic follows
//! YCSB's Java statement by statement, including two of its quirks that change
//! figures and are therefore kept:
//!
//! - when the item count grows (`nextLong(itemcount)`), zeta is extended
//!   incrementally but `eta` keeps using the item count given at construction;
//! - when the item count shrinks, nothing is recomputed (YCSB's
//!   `allowitemcountdecrease` is false and has no setter).
//!
//! What differs: the random stream. Each draw takes one uniform double in
//! `[0, 1)` from the caller's RNG (Java used `ThreadLocalRandom`), and the
//! constructors do not draw (Java's called `nextValue()` once). Every draw can
//! also be fed an exact `u` through `*_from_unit`, which is how the tests check
//! the formula.

use rand::Rng;

use super::error::{Result, YcsbError};
use super::hash::fnv_hash64;

/// YCSB's `ZipfianGenerator.ZIPFIAN_CONSTANT`.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// Item count of the zipfian behind [`ScrambledZipfianGenerator`].
///
/// YCSB 0.1.x to 0.17 use `10_000_000_000`, the count for which
/// [`SCRAMBLED_ZETAN`] was computed. (YCSB's later `master` raised
/// `ITEM_COUNT` to 10^16 but kept the same `ZETAN`, which then no longer
/// matches its item count; we keep the consistent pair.)
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;

/// YCSB's precomputed `zeta(SCRAMBLED_ITEM_COUNT, 0.99)`.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// `sum_{i=st}^{n-1} 1 / (i + 1)^theta`, added to `initial` (YCSB's `zetastatic`).
pub fn zeta(st: u64, n: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    let mut i = st;
    while i < n {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
        i += 1;
    }
    sum
}

/// YCSB's `ZipfianGenerator`: item `min` is the most popular, then `min + 1`, ...
///
/// Not `Sync`-shared: each client thread owns one (the item count it has seen
/// lives inside, as in Java, where a `synchronized` block guarded it).
#[derive(Debug, Clone)]
pub struct ZipfianGenerator {
    /// Item count at construction (`items` in Java; used by `eta` forever).
    items: u64,
    /// Smallest item (`base`).
    base: u64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    /// Item count `zetan` was computed for (`countforzeta`).
    count_for_zeta: u64,
}

impl ZipfianGenerator {
    /// Items `0..items` with the constant 0.99; computes zeta in `O(items)`.
    ///
    /// `items == 0` is accepted and always yields 0 (the Java arithmetic gives
    /// the same: `zetan = 0`, so `u * zetan < 1`).
    pub fn new(items: u64) -> Self {
        Self::build(
            0,
            items,
            ZIPFIAN_CONSTANT,
            zeta(0, items, ZIPFIAN_CONSTANT, 0.0),
        )
    }

    /// Items `min..min + items` with zipfian constant `theta`.
    ///
    /// # Errors
    /// [`YcsbError::ZipfianConstant`] unless `0 < theta < 1`.
    pub fn with_constant(min: u64, items: u64, theta: f64) -> Result<Self> {
        check_theta(theta)?;
        Ok(Self::build(min, items, theta, zeta(0, items, theta, 0.0)))
    }

    /// Like [`ZipfianGenerator::with_constant`] with a precomputed `zetan`
    /// (YCSB's four-argument constructor), which skips the `O(items)` sum.
    ///
    /// # Errors
    /// [`YcsbError::ZipfianConstant`] unless `0 < theta < 1`.
    pub fn with_zetan(min: u64, items: u64, theta: f64, zetan: f64) -> Result<Self> {
        check_theta(theta)?;
        Ok(Self::build(min, items, theta, zetan))
    }

    fn build(base: u64, items: u64, theta: f64, zetan: f64) -> Self {
        let zeta2theta = zeta(0, 2, theta, 0.0);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan);
        Self {
            items,
            base,
            theta,
            zeta2theta,
            alpha,
            zetan,
            eta,
            count_for_zeta: items,
        }
    }

    /// Next item for the construction-time item count (Java `nextValue()`).
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        self.next_long(rng, self.items)
    }

    /// Next item drawn from `min..min + itemcount` (Java `nextLong(itemcount)`).
    ///
    /// A larger `itemcount` than before extends zeta incrementally, which is how
    /// [`SkewedLatestGenerator`] follows a growing key space.
    pub fn next_long<R: Rng + ?Sized>(&mut self, rng: &mut R, itemcount: u64) -> u64 {
        let u: f64 = rng.gen();
        self.next_long_from_unit(itemcount, u)
    }

    /// [`ZipfianGenerator::next_long`] with the uniform draw `u` in `[0, 1)`
    /// given explicitly. The result is always in `min..min + itemcount` (or
    /// `min` when `itemcount` is 0).
    pub fn next_long_from_unit(&mut self, itemcount: u64, u: f64) -> u64 {
        if itemcount > self.count_for_zeta {
            // More items: extend zeta from where it stopped. `eta` uses the
            // construction-time `items`, exactly as YCSB does.
            self.zetan = zeta(self.count_for_zeta, itemcount, self.theta, self.zetan);
            self.count_for_zeta = itemcount;
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta2theta / self.zetan);
        }
        let uz = u * self.zetan;
        let offset = if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(self.theta) {
            1
        } else {
            // Java: `(long) (itemcount * Math.pow(eta * u - eta + 1, alpha))`;
            // `as u64` truncates toward zero like `(long)` (and maps NaN to 0).
            (itemcount as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
        };
        // Java returns `base + itemcount`, one past the end, when `u` is within
        // a few ulps of 1 and `eta * u - eta + 1` rounds to 1.0 (chance ~2^-52
        // per draw); keep every result inside the range instead.
        self.base
            .saturating_add(offset.min(itemcount.saturating_sub(1)))
    }

    /// The item count given at construction.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// Current `zeta(count, theta)`, for the largest item count seen so far.
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// Current `eta` of Gray's method.
    pub fn eta(&self) -> f64 {
        self.eta
    }
}

fn check_theta(theta: f64) -> Result<()> {
    if theta > 0.0 && theta < 1.0 {
        Ok(())
    } else {
        Err(YcsbError::ZipfianConstant(theta))
    }
}

/// YCSB's `ScrambledZipfianGenerator`: zipfian popularity, but the popular
/// items are scattered over `min..min + items` by hashing.
///
/// A zipfian over [`SCRAMBLED_ITEM_COUNT`] `+ 1` items (with the precomputed
/// [`SCRAMBLED_ZETAN`]) is drawn, hashed with [`fnv_hash64`] and reduced modulo
/// the item count. Construction is `O(1)`.
#[derive(Debug, Clone)]
pub struct ScrambledZipfianGenerator {
    zipfian: ZipfianGenerator,
    min: u64,
    item_count: u64,
}

impl ScrambledZipfianGenerator {
    /// Items `min..=max` (YCSB's `ScrambledZipfianGenerator(min, max)`).
    ///
    /// # Errors
    /// [`YcsbError::EmptyRange`] if `max < min` or the range has `2^64` items.
    pub fn new(min: u64, max: u64) -> Result<Self> {
        let item_count = max
            .checked_sub(min)
            .and_then(|d| d.checked_add(1))
            .ok_or_else(|| YcsbError::EmptyRange {
                what: "scrambled zipfian",
                detail: format!("min {min}, max {max}"),
            })?;
        // Java: `new ZipfianGenerator(0, ITEM_COUNT, 0.99, ZETAN)`, i.e. the
        // inclusive range 0..=ITEM_COUNT.
        let zipfian = ZipfianGenerator::build(
            0,
            SCRAMBLED_ITEM_COUNT + 1,
            ZIPFIAN_CONSTANT,
            SCRAMBLED_ZETAN,
        );
        Ok(Self {
            zipfian,
            min,
            item_count,
        })
    }

    /// Next item in `min..=max`.
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        let u: f64 = rng.gen();
        self.next_value_from_unit(u)
    }

    /// [`ScrambledZipfianGenerator::next_value`] with the uniform draw given.
    pub fn next_value_from_unit(&mut self, u: f64) -> u64 {
        let raw = self.zipfian.next_long_from_unit(self.zipfian.items, u);
        self.scramble(raw)
    }

    /// `min + fnvhash64(raw) % itemcount`, YCSB's scrambling step.
    ///
    /// Java's `%` of the one negative hash (`i64::MIN`, left negative by
    /// `Math.abs`) would fall below `min`; `rem_euclid` keeps it in range.
    pub fn scramble(&self, raw: u64) -> u64 {
        let hash = i128::from(fnv_hash64(raw as i64));
        let offset = hash.rem_euclid(i128::from(self.item_count));
        // offset < item_count <= u64::MAX and min + offset <= max.
        self.min + offset as u64
    }

    /// Number of items (`max - min + 1`).
    pub fn item_count(&self) -> u64 {
        self.item_count
    }
}

/// YCSB's `SkewedLatestGenerator`: `latest - zipfian(latest)`, so the most
/// recently inserted keys are the most popular.
///
/// YCSB reads `latest` from the shared insert counter (an
/// `AcknowledgedCounterGenerator`) inside the generator; here the caller passes
/// it to each draw, which keeps the generator free of shared state. Pass
/// [`AcknowledgedCounterGenerator::last_value`](super::AcknowledgedCounterGenerator::last_value).
#[derive(Debug, Clone)]
pub struct SkewedLatestGenerator {
    zipfian: ZipfianGenerator,
}

impl SkewedLatestGenerator {
    /// A generator for a key space whose newest key is `latest` (Java builds
    /// `new ZipfianGenerator(basis.lastValue())`, i.e. `latest` items).
    pub fn new(latest: u64) -> Self {
        Self {
            zipfian: ZipfianGenerator::new(latest),
        }
    }

    /// Next key in `0..=latest`, skewed towards `latest`.
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R, latest: u64) -> u64 {
        let u: f64 = rng.gen();
        self.next_value_from_unit(latest, u)
    }

    /// [`SkewedLatestGenerator::next_value`] with the uniform draw given.
    pub fn next_value_from_unit(&mut self, latest: u64, u: f64) -> u64 {
        latest.saturating_sub(self.zipfian.next_long_from_unit(latest, u))
    }
}

#[cfg(test)]
#[path = "zipfian_tests.rs"]
mod tests;
