//! A keyed bijection on `[0, n)` for any `n`, computed element by element: a balanced Feistel
//! network on the smallest even number of bits that covers `n`, with cycle-walking (apply the
//! network again until the value falls below `n`). The permutation of a trillion indices costs
//! a few words of memory, and `apply(i)` and `invert(j)` each cost a handful of hashes.
//!
//! Why it is a bijection: the Feistel network is a bijection on `[0, 4^h)` whatever its round
//! function, and cycle-walking a bijection of a superset restricted to `[0, n)` gives a
//! bijection of `[0, n)` (each walk follows the cycle through `i` to the next member of
//! `[0, n)`). The superset is less than `4n`, so a walk takes fewer than 4 steps on average.

/// Feistel rounds. Four rounds already give a pseudo-random permutation (Luby-Rackoff); more
/// rounds mix better for the weak round function used here.
pub const ROUNDS: usize = 8;

/// A pseudo-random permutation of `[0, n)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    mask: u64,
    keys: [u64; ROUNDS],
}

/// The murmur3 64-bit finaliser: a fast bijective mixer with full avalanche.
fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

impl Permutation {
    /// The permutation of `[0, n)` with round keys `keys` (any values; different keys give
    /// unrelated permutations).
    pub fn new(n: u64, keys: [u64; ROUNDS]) -> Self {
        // Smallest h with 4^h >= n (at least 1 so that both halves exist).
        let bits = if n <= 1 {
            2
        } else {
            64 - (n - 1).leading_zeros()
        };
        let half_bits = bits.div_ceil(2).max(1);
        let mask = if half_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << half_bits) - 1
        };
        Permutation {
            n,
            half_bits,
            mask,
            keys,
        }
    }

    /// The permutation of `[0, n)` for epoch `epoch` under `seed`.
    pub fn for_epoch(n: u64, seed: u64, epoch: u64) -> Self {
        Self::new(n, crate::rng::permutation_keys(seed, epoch))
    }

    /// The domain size `n`.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the domain is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn round(&self, r: usize, x: u64) -> u64 {
        fmix64(x ^ self.keys[r]).wrapping_add(self.keys[r].rotate_left(17)) & self.mask
    }

    fn forward(&self, x: u64) -> u64 {
        let (mut l, mut r) = (x >> self.half_bits, x & self.mask);
        for k in 0..ROUNDS {
            let next = l ^ self.round(k, r);
            l = r;
            r = next;
        }
        (l << self.half_bits) | r
    }

    fn backward(&self, x: u64) -> u64 {
        let (mut l, mut r) = (x >> self.half_bits, x & self.mask);
        for k in (0..ROUNDS).rev() {
            let prev = r ^ self.round(k, l);
            r = l;
            l = prev;
        }
        (l << self.half_bits) | r
    }

    /// The image of `i` (`i < n`).
    ///
    /// # Panics
    /// If `i >= n`.
    pub fn apply(&self, i: u64) -> u64 {
        assert!(i < self.n, "index {i} outside a permutation of {}", self.n);
        let mut x = self.forward(i);
        while x >= self.n {
            x = self.forward(x);
        }
        x
    }

    /// The preimage of `j` (`j < n`): `invert(apply(i)) == i`.
    ///
    /// # Panics
    /// If `j >= n`.
    pub fn invert(&self, j: u64) -> u64 {
        assert!(j < self.n, "index {j} outside a permutation of {}", self.n);
        let mut x = self.backward(j);
        while x >= self.n {
            x = self.backward(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_bijection_for_every_small_n() {
        for n in 1..=600u64 {
            for seed in 0..3 {
                let p = Permutation::for_epoch(n, seed, 7);
                let mut seen = vec![false; n as usize];
                for i in 0..n {
                    let j = p.apply(i);
                    assert!(j < n);
                    assert!(!seen[j as usize], "n={n}: {j} hit twice");
                    seen[j as usize] = true;
                    assert_eq!(p.invert(j), i);
                }
            }
        }
    }

    #[test]
    fn is_a_bijection_on_powers_of_two_and_odd_bit_widths() {
        for bits in 1..=16 {
            for n in [(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1] {
                let p = Permutation::for_epoch(n, 1, 0);
                let mut seen = vec![false; n as usize];
                for i in 0..n {
                    let j = p.apply(i) as usize;
                    assert!(!seen[j]);
                    seen[j] = true;
                }
            }
        }
    }

    #[test]
    fn large_domains_round_trip_and_stay_in_range() {
        for n in [
            1_000_000_007u64,
            3_000_000_000_000,
            (1 << 62) + 12345,
            u64::MAX,
        ] {
            let p = Permutation::for_epoch(n, 42, 1);
            let mut images = std::collections::HashSet::new();
            for k in 0..20_000u64 {
                let i = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) % n;
                let j = p.apply(i);
                assert!(j < n);
                assert_eq!(p.invert(j), i, "n={n} i={i}");
                images.insert((i, j));
            }
            // Distinct inputs give distinct outputs (injectivity on the sample).
            let outs: std::collections::HashSet<u64> = images.iter().map(|x| x.1).collect();
            let ins: std::collections::HashSet<u64> = images.iter().map(|x| x.0).collect();
            assert_eq!(outs.len(), ins.len());
        }
    }

    #[test]
    fn epochs_and_seeds_give_different_orders() {
        let n = 10_000;
        let order = |seed, epoch| {
            let p = Permutation::for_epoch(n, seed, epoch);
            (0..50).map(|i| p.apply(i)).collect::<Vec<_>>()
        };
        assert_ne!(order(1, 0), order(1, 1));
        assert_ne!(order(1, 0), order(2, 0));
        assert_eq!(order(1, 0), order(1, 0));
        // Not the identity, and spread out: the first 50 images are not clustered.
        let first = order(5, 0);
        assert!(first.iter().filter(|&&j| j < 50).count() < 10, "{first:?}");
    }
}
