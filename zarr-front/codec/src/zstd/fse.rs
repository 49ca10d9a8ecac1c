//! FSE (tANS) decoding tables (RFC 8878, 4.1.1): the distributions of sequence codes and
//! Huffman weights.

use super::bits::bits_at;
use super::{Result, corrupt};

/// An FSE decoding table entry.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FseEntry {
    pub(super) symbol: u8,
    pub(super) nb_bits: u8,
    pub(super) new_state: u16,
}

#[derive(Debug, Clone)]
pub(super) struct Fse {
    pub(super) log: u32,
    pub(super) table: Vec<FseEntry>,
}

impl Fse {
    /// Builds the decoding table of normalized counts `norm` (`-1` = "less than one").
    pub(super) fn build(norm: &[i16], log: u32) -> Result<Fse> {
        let size = 1usize << log;
        let mut table = vec![FseEntry::default(); size];
        let mut next = vec![0u32; norm.len()];
        let mut high = size - 1;
        for (s, &c) in norm.iter().enumerate() {
            if c == -1 {
                let Some(e) = table.get_mut(high) else {
                    return corrupt("FSE table: too many low-probability symbols");
                };
                e.symbol = s as u8;
                high = high.wrapping_sub(1);
                next[s] = 1;
            } else {
                next[s] = c.max(0) as u32;
            }
        }
        let step = (size >> 1) + (size >> 3) + 3;
        let mask = size - 1;
        let mut position = 0usize;
        for (s, &c) in norm.iter().enumerate() {
            for _ in 0..c.max(0) {
                table[position].symbol = s as u8;
                position = (position + step) & mask;
                while position > high {
                    position = (position + step) & mask;
                }
            }
        }
        if position != 0 {
            return corrupt("FSE table: counts do not fill the table");
        }
        for entry in &mut table {
            let s = entry.symbol as usize;
            let n = next[s];
            next[s] += 1;
            if n == 0 {
                return corrupt("FSE table: symbol without a count");
            }
            let nb = log - n.ilog2();
            entry.nb_bits = nb as u8;
            entry.new_state = ((n << nb) as usize - size) as u16;
        }
        Ok(Fse { log, table })
    }

    /// A table whose only symbol is `symbol` (RLE mode).
    pub(super) fn rle(symbol: u8) -> Fse {
        Fse {
            log: 0,
            table: vec![FseEntry {
                symbol,
                nb_bits: 0,
                new_state: 0,
            }],
        }
    }

    /// Reads normalized counts from the start of `src` (the FSE table description) and builds
    /// the table; returns it with the bytes the description took.
    pub(super) fn read(
        src: &[u8],
        max_symbol: usize,
        max_log: u32,
        what: &str,
    ) -> Result<(Fse, usize)> {
        let total_bits = 8 * src.len() as i64;
        let mut bp: i64 = 0;
        let mut take = |n: u32, peek_only: bool| -> u64 {
            let v = bits_at(src, bp, n);
            if !peek_only {
                bp += i64::from(n);
            }
            v
        };
        let log = take(4, false) as u32 + 5;
        if log > max_log {
            return corrupt(format!("{what}: accuracy log {log} above {max_log}"));
        }
        let mut norm = vec![0i16; max_symbol + 1];
        let mut remaining: i32 = (1 << log) + 1;
        let mut threshold: i32 = 1 << log;
        let mut nb_bits: u32 = log + 1;
        let mut symbol = 0usize;
        let mut previous_zero = false;
        loop {
            if previous_zero {
                loop {
                    let r = take(2, false) as usize;
                    symbol += r;
                    if r != 3 {
                        break;
                    }
                    if symbol > max_symbol {
                        break;
                    }
                }
                if symbol > max_symbol {
                    return corrupt(format!("{what}: zero run past the last symbol"));
                }
            }
            let max = (2 * threshold - 1) - remaining;
            let low = take(nb_bits - 1, true) as i32;
            let mut count = if low < max {
                take(nb_bits - 1, false);
                low
            } else {
                let mut c = take(nb_bits, false) as i32;
                if c >= threshold {
                    c -= max;
                }
                c
            };
            count -= 1;
            remaining -= count.abs();
            norm[symbol] = count as i16;
            symbol += 1;
            previous_zero = count == 0;
            if remaining < threshold {
                if remaining <= 1 {
                    break;
                }
                nb_bits = 32 - (remaining as u32).leading_zeros();
                threshold = 1 << (nb_bits - 1);
            }
            if symbol > max_symbol {
                break;
            }
        }
        if remaining != 1 {
            return corrupt(format!("{what}: counts do not sum to the table size"));
        }
        if bp > total_bits {
            return corrupt(format!("{what}: description runs past its bytes"));
        }
        norm.truncate(symbol);
        let used = ((bp + 7) / 8) as usize;
        Ok((Fse::build(&norm, log)?, used))
    }
}
