//! Interleaving byte streams back into elements (blosc's unshuffle) with SSE2 on x86-64:
//! one of zcrop-codec's unsafe modules, for vector loads and stores.
//!
//! A shuffled blosc block stores byte k of every element in stream k. For 4- and 8-byte types
//! (float32, int32, float64, ...) the compiler leaves the plain loop scalar, one byte at a
//! time: a whole 32 KiB float32 chunk took 8.6-9.0 µs to decode this way against c-blosc's
//! 5.2 µs, whose unshuffle is vectorized. Here 16 elements go per step, through the SSE2 unpack
//! instructions, which every x86-64 CPU has; the rest of a row, and other architectures, take
//! the plain loop. Two streams (16-bit types) end a row with one more step, overlapping the one
//! before it, where the plain loop would store the last 1-15 elements a byte at a time.
#![allow(unsafe_code)]

/// `out[i * T + k] = streams[k][i]` for every element `i < out.len() / T`; each stream must
/// hold at least that many bytes (asserted). Trailing bytes of `out` past the last whole
/// element are left alone.
#[allow(
    clippy::inline_always,
    reason = "once per crop row; measured, see `interleave2`"
)]
#[inline(always)]
pub fn interleave<const T: usize>(streams: [&[u8]; T], out: &mut [u8]) {
    let n = out.len() / T;
    let streams = streams.map(|s| &s[..n]);
    let done = match T {
        2 => sse2::interleave2(streams[0], streams[1], out),
        4 => sse2::interleave4(&[streams[0], streams[1], streams[2], streams[3]], out),
        8 => sse2::interleave8(&std::array::from_fn(|k| streams[k]), out),
        _ => 0,
    };
    // The rest (all of it for other types, and rows of two streams shorter than 8 elements).
    let streams = streams.map(|s| &s[done..]);
    for (i, o) in out[done * T..n * T].chunks_exact_mut(T).enumerate() {
        for k in 0..T {
            o[k] = streams[k][i];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_loadl_epi64, _mm_loadu_si128, _mm_storeu_si128, _mm_unpackhi_epi8,
        _mm_unpackhi_epi16, _mm_unpackhi_epi32, _mm_unpacklo_epi8, _mm_unpacklo_epi16,
        _mm_unpacklo_epi32,
    };

    /// Elements per step.
    const STEP: usize = 16;

    /// 16 bytes of `s` from `at` (checked).
    fn load(s: &[u8], at: usize) -> __m128i {
        let bytes = &s[at..at + 16];
        // SAFETY: `bytes` is 16 readable bytes (the slice above is bounds-checked); an
        // unaligned load needs no alignment. SSE2 is part of every x86-64 CPU.
        unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
    }

    /// 8 bytes of `s` from `at` (checked), in the low half.
    fn load8(s: &[u8], at: usize) -> __m128i {
        let bytes = &s[at..at + 8];
        // SAFETY: `bytes` is 8 readable bytes (the slice above is bounds-checked), all that
        // `movq` reads; it needs no alignment. SSE2 is part of every x86-64 CPU.
        unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) }
    }

    /// Stores `v` into `out[at..at + 16]` (checked).
    pub(super) fn store(out: &mut [u8], at: usize, v: __m128i) {
        let bytes = &mut out[at..at + 16];
        // SAFETY: `bytes` is 16 writable bytes of `out`, borrowed mutably here alone; an
        // unaligned store needs no alignment. SSE2 is part of every x86-64 CPU.
        unsafe { _mm_storeu_si128(bytes.as_mut_ptr().cast(), v) }
    }

    /// The low and high halves of `x` and `y` interleaved by bytes.
    #[target_feature(enable = "sse2")]
    fn zip8(x: __m128i, y: __m128i) -> (__m128i, __m128i) {
        (_mm_unpacklo_epi8(x, y), _mm_unpackhi_epi8(x, y))
    }

    /// The low and high halves of `x` and `y` interleaved by 2-byte words.
    #[target_feature(enable = "sse2")]
    fn zip16(x: __m128i, y: __m128i) -> (__m128i, __m128i) {
        (_mm_unpacklo_epi16(x, y), _mm_unpackhi_epi16(x, y))
    }

    /// The low and high halves of `x` and `y` interleaved by 4-byte words.
    #[target_feature(enable = "sse2")]
    fn zip32(x: __m128i, y: __m128i) -> (__m128i, __m128i) {
        (_mm_unpacklo_epi32(x, y), _mm_unpackhi_epi32(x, y))
    }

    /// Interleaves two streams (each at least `out.len() / 2` bytes) into `out`; returns the
    /// elements done: all of them from 8 on, else none. A crop's row in a chunk is any length
    /// from 1 to the chunk's width, so the last step overlaps the one before it (writing the
    /// same bytes again) instead of leaving up to 15 elements to a loop of byte stores, which
    /// was where the time of unshuffling short rows went.
    ///
    /// Inlined into its caller, as [`super::interleave`] is: both run once per row of a crop in
    /// a chunk (a 16-bit row of 64 elements takes a few nanoseconds), where a call costs a
    /// visible share of the time.
    #[allow(clippy::inline_always, reason = "once per crop row")]
    #[inline(always)]
    pub(super) fn interleave2(a: &[u8], b: &[u8], out: &mut [u8]) -> usize {
        let n = out.len() / 2;
        if n >= STEP {
            let steps = n / STEP;
            for j in 0..steps {
                step2(a, b, out, j * STEP);
            }
            if n > steps * STEP {
                step2(a, b, out, n - STEP);
            }
            n
        } else if n >= 8 {
            for i in [0, n - 8] {
                let (lows, highs) = (load8(a, i), load8(b, i));
                // SAFETY: SSE2 is part of the x86-64 baseline: every CPU this code runs on has
                // it (and the intrinsic only shuffles registers).
                store(out, 2 * i, unsafe { _mm_unpacklo_epi8(lows, highs) });
            }
            n
        } else {
            0
        }
    }

    /// Interleaves 16 elements of `a` and `b` from `i` into `out`.
    #[allow(clippy::inline_always, reason = "four times per crop row")]
    #[inline(always)]
    fn step2(a: &[u8], b: &[u8], out: &mut [u8], i: usize) {
        let (lows, highs) = (load(a, i), load(b, i));
        // SAFETY: as in `interleave2`.
        let (lo, hi) = unsafe {
            (
                _mm_unpacklo_epi8(lows, highs),
                _mm_unpackhi_epi8(lows, highs),
            )
        };
        store(out, 2 * i, lo);
        store(out, 2 * i + 16, hi);
    }

    /// Interleaves whole steps of four streams (each at least `out.len() / 4` bytes) into
    /// `out`; returns the elements done.
    pub(super) fn interleave4(s: &[&[u8]; 4], out: &mut [u8]) -> usize {
        // SAFETY: SSE2 is part of the x86-64 baseline: every CPU this code runs on has it.
        unsafe { interleave4_sse2(s, out) }
    }

    #[target_feature(enable = "sse2")]
    fn interleave4_sse2(s: &[&[u8]; 4], out: &mut [u8]) -> usize {
        let steps = out.len() / 4 / STEP;
        for j in 0..steps {
            let i = j * STEP;
            // Bytes of streams (0, 1) and (2, 3), elements 0-7 and 8-15; then words of those:
            // whole elements, four per register.
            let (ab_lo, ab_hi) = zip8(load(s[0], i), load(s[1], i));
            let (cd_lo, cd_hi) = zip8(load(s[2], i), load(s[3], i));
            let o = i * 4;
            for (g, (x, y)) in [(ab_lo, cd_lo), (ab_hi, cd_hi)].into_iter().enumerate() {
                let (first, second) = zip16(x, y);
                store(out, o + 32 * g, first);
                store(out, o + 32 * g + 16, second);
            }
        }
        steps * STEP
    }

    /// Interleaves whole steps of eight streams (each at least `out.len() / 8` bytes) into
    /// `out`; returns the elements done.
    pub(super) fn interleave8(s: &[&[u8]; 8], out: &mut [u8]) -> usize {
        // SAFETY: as in `interleave4`.
        unsafe { interleave8_sse2(s, out) }
    }

    #[target_feature(enable = "sse2")]
    fn interleave8_sse2(s: &[&[u8]; 8], out: &mut [u8]) -> usize {
        let steps = out.len() / 8 / STEP;
        for j in 0..steps {
            let i = j * STEP;
            // Bytes of stream pairs (0, 1), (2, 3), (4, 5), (6, 7): elements 0-7, 8-15.
            let mut lo = [load(s[0], i); 4];
            let mut hi = lo;
            for q in 0..4 {
                (lo[q], hi[q]) = zip8(load(s[2 * q], i), load(s[2 * q + 1], i));
            }
            let o = i * 8;
            for (h, half) in [lo, hi].into_iter().enumerate() {
                // Words of pairs: streams 0-3 and 4-7, elements 0-3 and 4-7 of the half.
                let (a_lo, a_hi) = zip16(half[0], half[1]);
                let (b_lo, b_hi) = zip16(half[2], half[3]);
                // Whole elements, two per register.
                for (g, (x, y)) in [(a_lo, b_lo), (a_hi, b_hi)].into_iter().enumerate() {
                    let (first, second) = zip32(x, y);
                    let at = o + 64 * h + 32 * g;
                    store(out, at, first);
                    store(out, at + 16, second);
                }
            }
        }
        steps * STEP
    }
}

/// The plain loop does every element elsewhere.
#[cfg(not(target_arch = "x86_64"))]
mod sse2 {
    pub(super) fn interleave2(_: &[u8], _: &[u8], _: &mut [u8]) -> usize {
        0
    }

    pub(super) fn interleave4(_: &[&[u8]; 4], _: &mut [u8]) -> usize {
        0
    }

    pub(super) fn interleave8(_: &[&[u8]; 8], _: &mut [u8]) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference<const T: usize>(streams: [&[u8]; T], out: &mut [u8]) {
        for (i, o) in out.chunks_exact_mut(T).enumerate() {
            for k in 0..T {
                o[k] = streams[k][i];
            }
        }
    }

    fn check<const T: usize>(bytes: &[u8], offset: usize, n: usize, tail: usize) {
        let len = bytes.len() / T;
        let streams: [&[u8]; T] =
            std::array::from_fn(|k| &bytes[k * len + offset..k * len + offset + n]);
        let mut got = vec![0xA5u8; n * T + tail];
        let mut want = got.clone();
        interleave(streams, &mut got);
        reference(streams, &mut want);
        assert_eq!(
            got, want,
            "T = {T}, offset {offset}, {n} elements, {tail} extra bytes"
        );
    }

    proptest! {
        /// Every element count (steps and remainders), stream offset (unaligned loads) and
        /// trailing partial element matches the plain loop.
        #[test]
        fn interleave_matches_the_plain_loop(
            bytes in proptest::collection::vec(any::<u8>(), 8 * 300),
            offset in 0usize..40,
            n in 0usize..250,
            tail in 0usize..8,
        ) {
            check::<2>(&bytes, offset, n, tail % 2);
            check::<3>(&bytes, offset, n, tail % 3);
            check::<4>(&bytes, offset, n, tail % 4);
            check::<8>(&bytes, offset, n, tail);
        }
    }
}
