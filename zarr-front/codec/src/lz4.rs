//! LZ4 block decoding that stops once the bytes a crop needs are out: one of zcrop-codec's
//! unsafe modules (SSSE3 loads and stores), for the LZ4 splits of blosc chunks.
//!
//! A crop needs a prefix of a chunk's compressed split (most of it, on the benchmark's crops),
//! but liblz4 decodes a prefix slower per byte than a whole block: its partial decoder checks
//! the end more often and copies a match that crosses the target byte by byte. This decoder
//! runs one loop for both: it stops after the first sequence that reaches the target.
//!
//! What costs time in these splits is not bytes but sequences (hundreds in a 16 KiB split of
//! 16-bit imagery's high bytes, mostly matches: long runs with offsets of 2 or 3, short
//! matches further back), and a branch mispredicted per sequence costs more than the copy. So
//! every match begins with one 16-byte store made the same way whatever its offset: a 16-byte
//! load from the match's source, shuffled (SSSE3 `pshufb`) into the offset's repeating pattern
//! when the offset is under 16 and kept as it is otherwise. Longer matches go on in 16-byte
//! steps: copies for offsets of 16 or more, the same pattern stored again every multiple of the
//! offset below them. Near the end of the output (a match that ends less than 32 bytes before
//! it) the steps go only as far as they stay inside the match, and the last bytes one at a
//! time; long literal runs are slice copies. Where SSSE3 is missing (or off x86-64), liblz4
//! decodes.
//!
//! Every read and write stays inside `src` and `out` whatever the input: tested against
//! liblz4 on compressed data of many kinds and on damaged blocks, and fuzzed (the `lz4` fuzz
//! target compares it with liblz4 on arbitrary bytes).
#![allow(unsafe_code)]

use crate::dest::PrefetchAlong;

/// Decodes the LZ4 block `src` into `out`, stopping once `want` bytes are out
/// (`want <= out.len()`). Returns how many bytes it produced, or `None` if the block is
/// malformed (a length or offset outside `src` or `out`).
///
/// With `want == out.len()` the whole block is decoded and the count is what it holds (the
/// caller checks it fills `out`). Otherwise the count is at least `want`, or less if the
/// block ends first, and bytes of `out` past `want` may have been written with anything (the
/// decoder stores 16 bytes at a time past the end of a sequence, within `out`).
pub fn decompress(src: &[u8], out: &mut [u8], want: usize) -> Option<usize> {
    decompress_along(src, out, want, &mut PrefetchAlong::none())
}

/// [`decompress`], asking for one line of `along` per sequence decoded (see
/// [`PrefetchAlong`]); lines left when it returns are the caller's to finish.
pub fn decompress_along(
    src: &[u8],
    out: &mut [u8],
    want: usize,
    along: &mut PrefetchAlong<'_>,
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("ssse3") {
        // SAFETY: the CPU has SSSE3, the one feature `ssse3::decompress` is built with.
        return unsafe { ssse3::decompress(src, out, want, along) };
    }
    crate::ffi::lz4_decompress(src, out, want)
}

#[cfg(target_arch = "x86_64")]
mod ssse3 {
    use std::arch::x86_64::{_mm_loadu_si128, _mm_shuffle_epi8, _mm_storeu_si128};

    use crate::dest::PrefetchAlong;

    /// `PATTERN[p]` picks byte `i % p` of a 16-byte load for lane `i`: the repeating pattern of
    /// a match at offset `p` (< 16); `PATTERN[16]` keeps every byte (offsets of 16 or more).
    static PATTERN: [[u8; 16]; 17] = {
        let mut m = [[0u8; 16]; 17];
        let mut p = 1;
        while p <= 16 {
            let mut i = 0;
            while i < 16 {
                m[p][i] = (i % p) as u8;
                i += 1;
            }
            p += 1;
        }
        m
    };

    /// `STEP[p]`: the largest multiple of `p` up to 16, where a pattern of offset `p` is stored
    /// again.
    static STEP: [u8; 16] = {
        let mut s = [16u8; 16];
        let mut p = 1;
        while p < 16 {
            s[p] = (16 / p * p) as u8;
            p += 1;
        }
        s
    };

    /// Output bytes past a fast sequence's start that its stores may reach: 16 literal bytes
    /// stored for at most 14, then a match whose first store or last step ends at most 15
    /// bytes past it.
    const FAST_ROOM: usize = 32;

    /// Bytes of `src` that a fast sequence may read past its token: 16 literal bytes loaded for
    /// at most 14, then the 2-byte offset.
    const FAST_INPUT: usize = 32;

    /// Reads one extended length (bytes of 255 go on) from `src` at `*ip`.
    #[inline]
    fn ext_len(src: &[u8], ip: &mut usize) -> Option<usize> {
        let mut n = 0usize;
        loop {
            let b = *src.get(*ip)?;
            *ip += 1;
            n += usize::from(b);
            if b != 255 {
                return Some(n);
            }
        }
    }

    /// [`super::decompress`] with SSSE3.
    #[target_feature(enable = "ssse3")]
    pub(super) fn decompress(
        src: &[u8],
        out: &mut [u8],
        want: usize,
        along: &mut PrefetchAlong<'_>,
    ) -> Option<usize> {
        let (iend, oend) = (src.len(), out.len());
        if want == 0 {
            return Some(0);
        }
        // A whole block stops only where its input ends, so that input left over is an error.
        let stop = if want >= oend { usize::MAX } else { want };
        // Pointers into `out` are taken where they are used, after any write through the
        // slice: a pointer taken once at the start would be invalidated (under Rust's aliasing
        // rules, as Miri checks them) by the slice writes between its uses.
        let (mut ip, mut op) = (0usize, 0usize);
        loop {
            along.step();
            let token = *src.get(ip)?;
            ip += 1;
            let ll = usize::from(token >> 4);
            if ll < 15 && iend - ip >= FAST_INPUT && oend - op >= FAST_ROOM {
                // SAFETY: `ip + 16 <= iend` and `op + 16 <= oend` (checked just above); the
                // two buffers are distinct (`&` and `&mut`).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.as_ptr().add(ip),
                        out.as_mut_ptr().add(op),
                        16,
                    );
                }
                ip += ll;
                op += ll;
                if op >= stop {
                    return Some(op);
                }
            } else {
                let ll = if ll == 15 {
                    15 + ext_len(src, &mut ip)?
                } else {
                    ll
                };
                if ll > iend - ip || ll > oend - op {
                    return None;
                }
                out[op..op + ll].copy_from_slice(&src[ip..ip + ll]);
                ip += ll;
                op += ll;
                if op >= stop || ip == iend {
                    return Some(op);
                }
            }
            let off = usize::from(u16::from_le_bytes([*src.get(ip)?, *src.get(ip + 1)?]));
            ip += 2;
            let ml = usize::from(token & 15);
            let ml = 4 + if ml == 15 {
                15 + ext_len(src, &mut ip)?
            } else {
                ml
            };
            if off == 0 || off > op || ml > oend - op {
                return None;
            }
            if oend - op - ml >= FAST_ROOM {
                // SAFETY: `off <= op` and `op + ml + 32 <= oend` (checked above), so `dst` and
                // `from` point into `out`. The first store covers `dst..dst + 16`; a step at
                // `k < ml` covers at most `dst + ml + 15`, all below `oend`. Loads read
                // `from + k..from + k + 16`: at most `dst + 16` for offsets under 16 (past `op`,
                // but inside `out`), below `dst + k` for larger ones. SSSE3 is enabled here.
                unsafe {
                    let dst = out.as_mut_ptr().add(op);
                    let from = dst.sub(off);
                    let v = _mm_shuffle_epi8(
                        _mm_loadu_si128(from.cast()),
                        _mm_loadu_si128(PATTERN[off.min(16)].as_ptr().cast()),
                    );
                    _mm_storeu_si128(dst.cast(), v);
                    if ml > 16 {
                        if off >= 16 {
                            // Each step's source lies before its destination and was written
                            // by the steps before it (or earlier sequences).
                            let mut k = 16;
                            while k < ml {
                                std::ptr::copy_nonoverlapping(from.add(k), dst.add(k), 16);
                                k += 16;
                            }
                        } else {
                            let step = usize::from(STEP[off]);
                            let mut k = step;
                            while k < ml {
                                _mm_storeu_si128(dst.add(k).cast(), v);
                                k += step;
                            }
                        }
                    }
                }
            } else {
                // Near the end of `out`: 16-byte steps only while they end inside the match, then
                // byte by byte (at most 15). A run that reaches the end of a split (common in
                // imagery) would otherwise go byte by byte all the way.
                let mut k = 0;
                if ml >= 16 {
                    // SAFETY: `off <= op` and `op + ml <= oend` (checked above); every store
                    // and copy below ends at `dst + k + 16 <= dst + ml`, inside `out`, and the
                    // pattern's load reads `from..from + 16`, below `dst + 16 <= dst + ml`.
                    // Copies for offsets of 16 or more read before what they write, as above.
                    unsafe {
                        let dst = out.as_mut_ptr().add(op);
                        let from = dst.sub(off);
                        if off >= 16 {
                            while k + 16 <= ml {
                                std::ptr::copy_nonoverlapping(from.add(k), dst.add(k), 16);
                                k += 16;
                            }
                        } else {
                            let v = _mm_shuffle_epi8(
                                _mm_loadu_si128(from.cast()),
                                _mm_loadu_si128(PATTERN[off].as_ptr().cast()),
                            );
                            let step = usize::from(STEP[off]);
                            while k + 16 <= ml {
                                _mm_storeu_si128(dst.add(k).cast(), v);
                                k += step;
                            }
                        }
                    }
                }
                for i in op + k..op + ml {
                    out[i] = out[i - off];
                }
            }
            op += ml;
            if op >= stop {
                return Some(op);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::decompress;
    use crate::ffi::compress::lz4_compress as compress;

    /// Data that compresses with matches of every kind: runs of `period` (1 to 40) repeated
    /// bytes, noise, copies from far back, smooth 16-bit-like high bytes; chosen by `seed`.
    fn data(seed: u64, len: usize, period: usize) -> Vec<u8> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut v = Vec::with_capacity(len);
        while v.len() < len {
            let r = next();
            let n = (r >> 8) as usize % 300 + 1;
            match r % 5 {
                0 => v.extend((0..n).map(|_| next() as u8)),
                1 => {
                    let pat: Vec<u8> = (0..period).map(|_| next() as u8).collect();
                    v.extend((0..n).map(|i| pat[i % period]));
                }
                2 if v.len() > 70_000 => {
                    let from = v.len() - 1 - (next() as usize % 65_000);
                    for i in 0..n.min(v.len() - from) {
                        v.push(v[from + i]);
                    }
                }
                _ => {
                    let base = (next() % 200) as f64;
                    v.extend((0..n).map(|i| (base + (i as f64 / 40.0).sin() * 3.0) as u8));
                }
            }
        }
        v.truncate(len);
        v
    }

    /// Lines to ask for along the way change nothing decoded, and one goes per sequence: a
    /// whole block of many sequences takes all of a 4 KiB range's 64 lines (its 16 KiB of
    /// output take more than 64 sequences), a one-sequence prefix one line.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn one_line_is_asked_for_per_sequence() {
        use super::decompress_along;
        use crate::dest::PrefetchAlong;
        if !std::arch::is_x86_feature_detected!("ssse3") {
            return; // liblz4 decodes, and leaves the lines to the caller.
        }
        let src = data(3, 16 << 10, 7);
        let block = compress(&src, false);
        let lines = vec![0u8; 4096 + 64];
        let lines = &lines[64 - (lines.as_ptr().addr() & 63)..][..4096];
        let mut out = vec![0u8; src.len()];
        let mut along = PrefetchAlong::new(lines);
        assert_eq!(along.left(), 64);
        let n = decompress_along(&block, &mut out, src.len(), &mut along);
        assert_eq!((n, &out), (Some(src.len()), &src));
        assert_eq!(along.left(), 0);
        let mut along = PrefetchAlong::new(lines);
        assert!(decompress_along(&block, &mut out, 1, &mut along).unwrap() >= 1);
        assert_eq!(along.left(), 63);
    }

    /// Decodes `block` whole into a buffer of `len` bytes.
    fn whole(block: &[u8], len: usize) -> Option<Vec<u8>> {
        let mut out = vec![0u8; len];
        let n = decompress(block, &mut out, len)?;
        (n == len).then_some(out)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Whole blocks and every kind of prefix decode to liblz4's bytes.
        #[test]
        fn equals_liblz4(seed: u64, len in 1usize..40_000, period in 1usize..40, hc: bool,
                         wants in proptest::collection::vec(0usize..40_000, 8)) {
            let src = data(seed, len, period);
            let block = compress(&src, hc);
            let decoded = whole(&block, len);
            prop_assert_eq!(decoded.as_deref(), Some(&src[..]));
            let mut out = vec![0u8; len];
            for want in wants.iter().map(|w| w % (len + 1)).chain([0, 1, len.saturating_sub(1)]) {
                let n = decompress(&block, &mut out, want).unwrap();
                prop_assert!(n >= want && n <= len);
                prop_assert_eq!(&out[..want], &src[..want]);
            }
        }

        /// A damaged block decodes as the plain decoder below reads it (an error, or the same
        /// bytes), never with a read or write outside the buffers (a panic, or a crash of the
        /// test); where liblz4 decodes it whole, so does this, to the same bytes.
        #[test]
        fn damaged_blocks(seed: u64, len in 1usize..5_000, period in 1usize..20,
                          flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
                          cut in any::<usize>(), extra in 0usize..64, want in any::<usize>()) {
            let src = data(seed, len, period);
            let mut block = compress(&src, false);
            for (at, b) in &flips {
                let at = at % block.len();
                block[at] ^= b;
            }
            block.truncate(block.len() - cut % 3);
            let cap = len + extra;
            for want in [cap, want % (cap + 1)] {
                let mut ours = vec![0u8; cap];
                let n = decompress(&block, &mut ours, want);
                let (plain_n, plain) = reference(&block, cap, want);
                prop_assert_eq!(n, plain_n);
                if let Some(n) = n {
                    let valid = if want == cap { n } else { n.min(want) };
                    prop_assert_eq!(&ours[..valid], &plain[..valid]);
                }
            }
            let mut theirs = vec![0u8; cap];
            if let Some(n) = crate::ffi::lz4_decompress(&block, &mut theirs, cap) {
                let (plain_n, plain) = reference(&block, cap, cap);
                // liblz4 lets an offset of 0 through (it copies what is there); the format
                // and this decoder do not.
                if plain_n.is_some() {
                    prop_assert_eq!(plain_n, Some(n));
                    prop_assert_eq!(&plain[..n], &theirs[..n]);
                }
            }
        }
    }

    /// The LZ4 block format read one byte at a time, with this module's stopping rule: after
    /// the first sequence whose literals or match reach `want` (< `cap`), or at the end of
    /// the input for a whole block. Offsets of 0 or before the output's start, and lengths
    /// past either buffer, are errors.
    fn reference(src: &[u8], cap: usize, want: usize) -> (Option<usize>, Vec<u8>) {
        let mut out = Vec::new();
        let stop = if want >= cap { usize::MAX } else { want };
        if want == 0 {
            return (Some(0), out);
        }
        let mut ip = 0;
        let len = |ip: &mut usize, n: usize| -> Option<usize> {
            if n < 15 {
                return Some(n);
            }
            let mut n = n;
            loop {
                let b = *src.get(*ip)?;
                *ip += 1;
                n += usize::from(b);
                if b != 255 {
                    return Some(n);
                }
            }
        };
        let result = (|| loop {
            let token = *src.get(ip)?;
            ip += 1;
            let ll = len(&mut ip, usize::from(token >> 4))?;
            if ip + ll > src.len() || out.len() + ll > cap {
                return None;
            }
            out.extend_from_slice(&src[ip..ip + ll]);
            ip += ll;
            if out.len() >= stop || ip == src.len() {
                return Some(out.len());
            }
            let off = usize::from(u16::from_le_bytes([*src.get(ip)?, *src.get(ip + 1)?]));
            ip += 2;
            let ml = 4 + len(&mut ip, usize::from(token & 15))?;
            if off == 0 || off > out.len() || out.len() + ml > cap {
                return None;
            }
            for _ in 0..ml {
                out.push(out[out.len() - off]);
            }
            if out.len() >= stop {
                return Some(out.len());
            }
        })();
        (result, out)
    }

    /// Blocks built by hand: lengths and offsets that point outside the buffers are errors, and
    /// input left after a whole block's output is one too.
    #[test]
    fn malformed_blocks_are_errors() {
        let cases: [(&[u8], usize); 7] = [
            // A match before the start of the output.
            (&[0x10, b'a', 2, 0, 0x00], 8),
            // Offset zero.
            (&[0x10, b'a', 0, 0, 0x00], 8),
            // Literals past the end of the input.
            (&[0x50, b'a', b'b'], 8),
            // Literals past the end of the output.
            (&[0x40, 1, 2, 3, 4], 3),
            // A match past the end of the output.
            (&[0x1f, b'a', 1, 0, 40, 0x00], 16),
            // An extended length cut short.
            (&[0xf0, 255, 255], 8),
            // An offset cut short.
            (&[0x10, b'a', 1], 8),
        ];
        for (block, cap) in cases {
            let mut out = vec![0u8; cap];
            assert_eq!(decompress(block, &mut out, cap), None, "{block:?}");
        }
        // A valid block (a, then 7 more by offset 1) with a byte left over.
        let mut out = [0u8; 8];
        assert_eq!(decompress(&[0x13, b'a', 1, 0, 0x00], &mut out, 8), Some(8));
        assert_eq!(out, *b"aaaaaaaa");
        assert_eq!(decompress(&[0x13, b'a', 1, 0, 0x00, 7], &mut out, 8), None);
        // A prefix stops at the first sequence that reaches it, input left or not.
        assert_eq!(
            decompress(&[0x13, b'a', 1, 0, 0x00, 7], &mut out, 3),
            Some(8)
        );
    }
}
