//! zstd's backward bit streams (RFC 8878, 4.1): bits read from a stream's end down.

use super::{Result, corrupt};

/// Bits `[lo, lo + n)` of `src` read as a little-endian bit string (`n <= 56`); bits below 0
/// read as zeros, as the backward streams of zstd are read past their start.
#[inline]
pub(super) fn bits_at(src: &[u8], lo: i64, n: u32) -> u64 {
    debug_assert!(n <= 56);
    if n == 0 {
        return 0;
    }
    if lo < 0 {
        let have = lo + i64::from(n);
        if have <= 0 {
            return 0;
        }
        return bits_at(src, 0, have as u32) << (-lo) as u32;
    }
    let byte = (lo >> 3) as usize;
    let word = if let Some(b) = src.get(byte..byte + 8) {
        u64::from_le_bytes(b.try_into().expect("8 bytes"))
    } else {
        let mut b = [0u8; 8];
        let tail = src.get(byte..).unwrap_or(&[]);
        b[..tail.len()].copy_from_slice(tail);
        u64::from_le_bytes(b)
    };
    (word >> (lo & 7)) & ((1u64 << n) - 1)
}

/// A zstd backward bit stream: read from its last bit down, after the padding marker.
pub(super) struct Backward<'a> {
    pub(super) src: &'a [u8],
    /// Bits not yet read; negative once reads went past the start.
    pub(super) pos: i64,
}

impl<'a> Backward<'a> {
    pub(super) fn new(src: &'a [u8], what: &str) -> Result<Self> {
        let Some(&last) = src.last() else {
            return corrupt(format!("{what}: empty bit stream"));
        };
        if last == 0 {
            return corrupt(format!("{what}: bit stream without its end marker"));
        }
        let pos = 8 * src.len() as i64 - i64::from(last.leading_zeros()) - 1;
        Ok(Backward { src, pos })
    }

    #[inline]
    pub(super) fn read(&mut self, n: u32) -> u64 {
        self.pos -= i64::from(n);
        bits_at(self.src, self.pos, n)
    }

    pub(super) fn overflowed(&self) -> bool {
        self.pos < 0
    }
}

/// A backward bit stream read through a 64-bit window of it (libzstd's `BIT_DStream`): one
/// 8-byte load serves several reads, where [`Backward`] loads for each. For the sequences
/// section, whose reads are many and short.
pub(super) struct Window<'a> {
    src: &'a [u8],
    /// Bits not yet read; negative once reads went past the start.
    pub(super) pos: i64,
    /// Stream bit of the window's lowest bit (a multiple of 8; negative near the start).
    base: i64,
    /// The window: stream bits `[base, base + 64)`.
    bits: u64,
}

impl<'a> Window<'a> {
    pub(super) fn new(src: &'a [u8], what: &str) -> Result<Self> {
        let head = Backward::new(src, what)?;
        let mut w = Window {
            src,
            pos: head.pos,
            base: 0,
            bits: 0,
        };
        w.refill();
        Ok(w)
    }

    /// Loads the 8 bytes that end with the byte holding bit `pos - 1`; bytes before the
    /// stream's start read as zeros. Afterwards at least 57 bits lie below `pos` in the window,
    /// which [`Self::read`] can take without another refill.
    #[inline]
    pub(super) fn refill(&mut self) {
        let top = (self.pos + 7) >> 3;
        let first = top - 8;
        self.base = 8 * first;
        self.bits = if let Ok(at) = usize::try_from(first)
            && let Some(b) = self.src.get(at..at + 8)
        {
            u64::from_le_bytes(b.try_into().expect("8 bytes"))
        } else {
            self.load_start(top)
        };
    }

    /// The window of the stream's first `top` bytes (at most 8), zeros below them.
    #[cold]
    fn load_start(&self, top: i64) -> u64 {
        let mut b = [0u8; 8];
        let have = usize::try_from(top).unwrap_or(0).min(self.src.len());
        b[8 - have..].copy_from_slice(&self.src[..have]);
        u64::from_le_bytes(b)
    }

    /// The next `n <= 56` bits down the stream. At most 57 bits are read between two calls of
    /// [`Self::refill`]; more read wrong bits (never out of bounds).
    #[inline]
    pub(super) fn read(&mut self, n: u32) -> u64 {
        debug_assert!(n <= 56);
        self.pos -= i64::from(n);
        // A shift of 64 (a read of no bits right after a refill) wraps to 0, masked to 0 bits.
        self.bits.wrapping_shr((self.pos - self.base) as u32) & ((1u64 << n) - 1)
    }

    pub(super) fn overflowed(&self) -> bool {
        self.pos < 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The window reads the bits [`Backward`] reads, past the stream's start included.
        #[test]
        fn window_reads_what_backward_reads(
            mut src in proptest::collection::vec(any::<u8>(), 1..40),
            reads in proptest::collection::vec(0u32..=56, 0..80),
        ) {
            let last = src.len() - 1;
            src[last] |= 1;
            let mut slow = Backward::new(&src, "s").unwrap();
            let mut fast = Window::new(&src, "s").unwrap();
            for n in reads {
                fast.refill();
                prop_assert_eq!(fast.read(n), slow.read(n), "{} bits at {}", n, slow.pos);
                prop_assert_eq!(fast.pos, slow.pos);
                prop_assert_eq!(fast.overflowed(), slow.overflowed());
            }
        }
    }
}
