//! Tests of the zipfian family against Gray's formula written out independently.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Gray et al.'s draw for `n` items and constant `theta`, written from the
/// paper/YCSB formula without sharing code with the generator.
struct Gray {
    n: f64,
    theta: f64,
    zetan: f64,
    alpha: f64,
    eta: f64,
}

impl Gray {
    fn new(n: u64, theta: f64) -> Self {
        let zetan: f64 = (1..=n).map(|i| (i as f64).powf(-theta)).sum();
        let zeta2 = 1.0 + 2f64.powf(-theta);
        let nf = n as f64;
        Self {
            n: nf,
            theta,
            zetan,
            alpha: 1.0 / (1.0 - theta),
            eta: (1.0 - (2.0 / nf).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    fn draw(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(self.theta) {
            1
        } else {
            (self.n * (self.eta * u - self.eta + 1.0).powf(self.alpha)).floor() as u64
        }
    }

    /// Exact probability that `draw` returns `k` for `u` uniform in [0, 1).
    fn probability(&self, k: u64) -> f64 {
        let head = (1.0 + 0.5f64.powf(self.theta)) / self.zetan;
        match k {
            0 => 1.0 / self.zetan,
            1 => head - 1.0 / self.zetan,
            _ => {
                // P(draw >= k) = P(u >= max(head, cut(k))).
                let at_least = |k: f64| {
                    let cut = ((k / self.n).powf(1.0 / self.alpha) - 1.0 + self.eta) / self.eta;
                    1.0 - cut.max(head)
                };
                at_least(k as f64) - at_least(k as f64 + 1.0)
            }
        }
    }
}

#[test]
fn zeta_matches_direct_sum_and_is_incremental() {
    let direct: f64 = (1..=500u64).map(|i| 1.0 / (i as f64).powf(0.99)).sum();
    assert!((zeta(0, 500, 0.99, 0.0) - direct).abs() < 1e-12);
    let part = zeta(0, 200, 0.99, 0.0);
    assert!((zeta(200, 500, 0.99, part) - direct).abs() < 1e-12);
}

#[test]
fn first_values_match_formula_for_a_fixed_stream() {
    let n = 1000;
    let gray = Gray::new(n, 0.99);
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    // The generator takes exactly one f64 per draw; read the same stream.
    let mut probe = rng.clone();
    let mut gen = ZipfianGenerator::new(n);
    for i in 0..64 {
        let u: f64 = probe.gen();
        let expected = gray.draw(u);
        assert_eq!(gen.next_value(&mut rng), expected, "draw {i}, u = {u}");
    }
}

#[test]
fn hand_picked_units_hit_each_branch() {
    let n = 1000;
    let gray = Gray::new(n, 0.99);
    let mut gen = ZipfianGenerator::new(n);
    let z = gray.zetan;
    // uz < 1 -> item 0; 1 <= uz < 1 + 2^-0.99 -> item 1; beyond: the formula.
    assert_eq!(gen.next_long_from_unit(n, 0.0), 0);
    assert_eq!(gen.next_long_from_unit(n, 0.999 / z), 0);
    assert_eq!(gen.next_long_from_unit(n, 1.0 / z), 1);
    assert_eq!(gen.next_long_from_unit(n, 1.5 / z), 1);
    for u in [0.2, 0.5, 0.75, 0.9, 0.99, 0.999_999] {
        let got = gen.next_long_from_unit(n, u);
        assert_eq!(got, gray.draw(u), "u = {u}");
        assert!(got < n, "u = {u} gave {got}");
    }
    // At the top of [0, 1) the raw formula rounds to n, one past the end (YCSB
    // returns that); the generator clamps it to the last item.
    let top = 1.0 - f64::EPSILON;
    assert_eq!(gray.draw(top), n);
    assert_eq!(gen.next_long_from_unit(n, top), n - 1);
    // u = 0.5 worked by hand: n * (eta * 0.5 - eta + 1)^100.
    let by_hand = (1000.0 * (1.0 - gray.eta / 2.0).powf(100.0)) as u64;
    assert_eq!(gen.next_long_from_unit(n, 0.5), by_hand);
    // A minimum shifts every item.
    let mut shifted = ZipfianGenerator::with_constant(7, n, 0.99).unwrap();
    assert_eq!(shifted.next_long_from_unit(n, 0.0), 7);
    assert_eq!(shifted.next_long_from_unit(n, 0.5), 7 + by_hand);
}

#[test]
fn growing_item_count_extends_zeta_like_ycsb() {
    let mut gen = ZipfianGenerator::new(100);
    let eta_before = gen.eta();
    let out = gen.next_long_from_unit(200, 0.9);
    let zeta200: f64 = (1..=200u64).map(|i| (i as f64).powf(-0.99)).sum();
    assert!((gen.zetan() - zeta200).abs() < 1e-12);
    // YCSB recomputes eta with the *construction-time* item count (100).
    let zeta2 = 1.0 + 2f64.powf(-0.99);
    let eta = (1.0 - (2.0f64 / 100.0).powf(0.01)) / (1.0 - zeta2 / zeta200);
    assert!((gen.eta() - eta).abs() < 1e-15);
    assert_ne!(gen.eta(), eta_before);
    assert_eq!(out, (200.0 * (eta * 0.9 - eta + 1.0).powf(100.0)) as u64);
    // A smaller count later does not recompute anything.
    let _ = gen.next_long_from_unit(150, 0.3);
    assert!((gen.zetan() - zeta200).abs() < 1e-12);
}

#[test]
fn rank_frequencies_follow_power_law() {
    const N: u64 = 1000;
    const SAMPLES: u32 = 1_000_000;
    let theta = 0.99;
    let mut gen = ZipfianGenerator::new(N);
    let mut rng = SmallRng::seed_from_u64(42);
    let mut counts = vec![0u32; N as usize];
    for _ in 0..SAMPLES {
        counts[gen.next_value(&mut rng) as usize] += 1;
    }
    let zetan: f64 = (1..=N).map(|i| (i as f64).powf(-theta)).sum();
    let ideal = |rank0: usize| (rank0 as f64 + 1.0).powf(-theta) / zetan;
    let freq = |rank0: usize| f64::from(counts[rank0]) / f64::from(SAMPLES);

    // Gray's method is exact for the two most popular items.
    for r in 0..2 {
        let ratio = freq(r) / ideal(r);
        assert!((ratio - 1.0).abs() < 0.02, "rank {} ratio {ratio}", r + 1);
    }
    // Beyond them it approximates the power law: within 12% per decade of
    // ranks (the method itself is off by up to 8% there).
    for (lo, hi) in [(2, 10), (10, 100), (100, 1000)] {
        let emp: f64 = (lo..hi).map(freq).sum();
        let exp: f64 = (lo..hi).map(ideal).sum();
        let ratio = emp / exp;
        assert!(
            (0.88..1.12).contains(&ratio),
            "ranks {}..{hi}: ratio {ratio}",
            lo + 1
        );
    }
    // The log-log slope of frequency against rank is -theta.
    let points: Vec<(f64, f64)> = (0..N as usize)
        .filter(|&r| counts[r] > 0)
        .map(|r| ((r as f64 + 1.0).ln(), freq(r).ln()))
        .collect();
    let mx = points.iter().map(|p| p.0).sum::<f64>() / points.len() as f64;
    let my = points.iter().map(|p| p.1).sum::<f64>() / points.len() as f64;
    let cov: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let var: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let slope = cov / var;
    assert!((slope + theta).abs() < 0.03, "slope {slope}");
    // And the sample agrees with the exact probabilities of Gray's method.
    let gray = Gray::new(N, theta);
    for (lo, hi) in [(0, 1), (1, 2), (2, 10), (10, 100), (100, 1000)] {
        let emp: f64 = (lo..hi).map(freq).sum();
        let exact: f64 = (lo..hi).map(|k| gray.probability(k as u64)).sum();
        assert!(
            (emp / exact - 1.0).abs() < 0.02,
            "ranks {lo}..{hi}: {emp} vs {exact}"
        );
    }
}

#[test]
fn scrambled_stays_in_range() {
    let mut rng = SmallRng::seed_from_u64(3);
    for (min, max) in [
        (0, 0),
        (0, 1),
        (0, 6),
        (0, 999),
        (5, 5),
        (1000, 1_000_002),
        (10, u64::MAX - 1),
    ] {
        let mut gen = ScrambledZipfianGenerator::new(min, max).unwrap();
        for _ in 0..10_000 {
            let v = gen.next_value(&mut rng);
            assert!(v >= min && v <= max, "{v} outside {min}..={max}");
        }
        for u in [0.0, 0.5, 1.0 - f64::EPSILON] {
            let v = gen.next_value_from_unit(u);
            assert!(v >= min && v <= max);
        }
    }
    assert!(ScrambledZipfianGenerator::new(5, 4).is_err());
    assert!(ScrambledZipfianGenerator::new(0, u64::MAX).is_err());
}

#[test]
fn scrambled_hot_item_is_hash_of_zero() {
    // The zipfian's most popular value is 0, so the hottest key is
    // fnvhash64(0) % n: YCSB's well-known hot key.
    let n = 1000;
    let mut gen = ScrambledZipfianGenerator::new(0, n - 1).unwrap();
    assert_eq!(gen.next_value_from_unit(0.0), 6284781860667377211 % n);
    let mut rng = SmallRng::seed_from_u64(9);
    let mut counts = vec![0u32; n as usize];
    for _ in 0..200_000 {
        counts[gen.next_value(&mut rng) as usize] += 1;
    }
    let hottest = (0..n as usize).max_by_key(|&i| counts[i]).unwrap();
    assert_eq!(hottest as u64, 6284781860667377211 % n);
    // Far from uniform: the hot key takes several percent of all draws.
    assert!(counts[hottest] > 200_000 / 100 * 3);
}

#[test]
fn latest_favors_recent_keys() {
    let mut rng = SmallRng::seed_from_u64(11);
    let latest = 999;
    let mut gen = SkewedLatestGenerator::new(latest);
    let mut counts = vec![0u32; 1000];
    for _ in 0..100_000 {
        let k = gen.next_value(&mut rng, latest);
        assert!(k <= latest);
        counts[k as usize] += 1;
    }
    let hottest = (0..1000).max_by_key(|&i| counts[i]).unwrap();
    assert_eq!(hottest, 999);
    let recent: u32 = counts[990..].iter().sum();
    let old: u32 = counts[..10].iter().sum();
    assert!(recent > 30 * old.max(1), "recent {recent}, old {old}");
    assert!(recent > 100_000 / 3);
    // After inserts the newest key becomes the hottest (zeta grows incrementally).
    let latest = 1999;
    let mut counts = vec![0u32; 2000];
    for _ in 0..50_000 {
        counts[gen.next_value(&mut rng, latest) as usize] += 1;
    }
    assert_eq!((0..2000).max_by_key(|&i| counts[i]).unwrap(), 1999);
    // Degenerate key spaces do not panic.
    let mut one = SkewedLatestGenerator::new(0);
    assert_eq!(one.next_value(&mut rng, 0), 0);
}

#[test]
fn bad_constants_are_errors() {
    for theta in [0.0, 1.0, -0.5, f64::NAN, f64::INFINITY] {
        assert!(ZipfianGenerator::with_constant(0, 10, theta).is_err());
        assert!(ZipfianGenerator::with_zetan(0, 10, theta, 2.0).is_err());
    }
    let mut empty = ZipfianGenerator::new(0);
    assert_eq!(empty.next_value(&mut SmallRng::seed_from_u64(1)), 0);
}
