//! Counter-based randomness: every random number is a pure function of the seed, a purpose tag
//! and a counter (a global sample index or an epoch), never of a sequential global stream, so
//! thread counts, prefetch depths and restarts cannot change what a sample gets.
//!
//! Each (seed, purpose) pair keys a ChaCha8 generator; the counter selects one of its 2^64
//! independent streams (`set_stream`). A sample draws from its own stream, in a fixed order
//! (position, then jitter source by source), so its values depend on nothing else.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// The stream tag of per-sample draws (positions and jitter).
const TAG_SAMPLE: u64 = 0x7a63_726f_7073_6d70; // "zcropsmp"
/// The stream tag of per-epoch permutation keys.
const TAG_PERMUTATION: u64 = 0x7a63_726f_7070_726d; // "zcropprm"

fn keyed(seed: u64, tag: u64, counter: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&tag.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(counter);
    rng
}

/// The random stream of global sample `index` under `seed`, keyed on its first draw (samples
/// that draw nothing cost nothing).
pub(crate) struct SampleRng {
    seed: u64,
    index: u64,
    rng: Option<ChaCha8Rng>,
}

impl SampleRng {
    pub(crate) fn new(seed: u64, index: u64) -> Self {
        SampleRng {
            seed,
            index,
            rng: None,
        }
    }

    /// A uniform integer in `[0, n)` (`n > 0`), without modulo bias (Lemire's method).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        let (seed, index) = (self.seed, self.index);
        below(
            self.rng
                .get_or_insert_with(|| keyed(seed, TAG_SAMPLE, index)),
            n,
        )
    }

    /// A uniform float in `[0, 1)` with 53 random bits.
    pub(crate) fn unit(&mut self) -> f64 {
        let (seed, index) = (self.seed, self.index);
        let r = self
            .rng
            .get_or_insert_with(|| keyed(seed, TAG_SAMPLE, index));
        (r.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[-j, j]`.
    pub(crate) fn jitter(&mut self, j: u64) -> i64 {
        if j == 0 {
            return 0;
        }
        // 2j + 1 <= 2^63 + 1 fits for every j < 2^62, which bounds jitter far beyond any array.
        let span = j.saturating_mul(2).saturating_add(1);
        self.below(span) as i64 - j as i64
    }
}

/// Keys for the permutation of epoch `epoch` under `seed`.
pub(crate) fn permutation_keys<const N: usize>(seed: u64, epoch: u64) -> [u64; N] {
    let mut rng = keyed(seed, TAG_PERMUTATION, epoch);
    std::array::from_fn(|_| rng.next_u64())
}

fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    debug_assert!(n > 0);
    loop {
        let m = u128::from(rng.next_u64()) * u128::from(n);
        let low = m as u64;
        if low < n {
            let threshold = n.wrapping_neg() % n;
            if low < threshold {
                continue;
            }
        }
        return (m >> 64) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_pure_functions_of_seed_and_index() {
        let draw = |seed, index| {
            let mut r = SampleRng::new(seed, index);
            (0..8).map(|_| r.below(1 << 40)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 5), draw(1, 5));
        assert_ne!(draw(1, 5), draw(1, 6));
        assert_ne!(draw(1, 5), draw(2, 5));
        assert_eq!(permutation_keys::<4>(9, 3), permutation_keys::<4>(9, 3));
        assert_ne!(permutation_keys::<4>(9, 3), permutation_keys::<4>(9, 4));
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut counts = [0u32; 7];
        for i in 0..70_000 {
            let v = SampleRng::new(3, i).below(7);
            counts[v as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        let mut r = SampleRng::new(0, 0);
        for _ in 0..1000 {
            let j = r.jitter(3);
            assert!((-3..=3).contains(&j));
        }
        assert_eq!(r.jitter(0), 0);
        assert_eq!(r.below(1), 0);
    }
}
