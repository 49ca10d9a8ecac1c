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
