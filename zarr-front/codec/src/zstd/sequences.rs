//! The sequences section of a compressed block (RFC 8878, 3.1.1.3.2): literal lengths,
//! match lengths and offsets, FSE-coded.

use super::bits::Window;
use super::fse::{Fse, FseEntry};
use super::{Error, Result, corrupt};

/// One decoded sequence.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sequence {
    pub(super) literals: u32,
    pub(super) match_len: u32,
    pub(super) offset: u32,
}

pub(super) const LL_BASE: [u32; 36] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 28, 32, 40, 48, 64,
    0x80, 0x100, 0x200, 0x400, 0x800, 0x1000, 0x2000, 0x4000, 0x8000, 0x10000,
];
pub(super) const LL_BITS: [u8; 36] = [
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11,
    12, 13, 14, 15, 16,
];
pub(super) const LL_DEFAULT: [i16; 36] = [
    4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1,
    -1, -1, -1, -1,
];
pub(super) const ML_BASE: [u32; 53] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
    28, 29, 30, 31, 32, 33, 34, 35, 37, 39, 41, 43, 47, 51, 59, 67, 83, 99, 0x83, 0x103, 0x203,
    0x403, 0x803, 0x1003, 0x2003, 0x4003, 0x8003, 0x10003,
];
pub(super) const ML_BITS: [u8; 53] = [
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
];
pub(super) const ML_DEFAULT: [i16; 53] = [
    1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1,
];
pub(super) const OF_DEFAULT: [i16; 29] = [
    1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1,
];

/// One of the three fields of a sequence (literal length, offset, match length).
pub(super) struct SeqField {
    /// Where its mode sits in the modes byte.
    pub(super) mode_shift: u8,
    /// Predefined distribution and its accuracy log.
    pub(super) default: &'static [i16],
    pub(super) default_log: u32,
    pub(super) max_symbol: usize,
    pub(super) max_log: u32,
    pub(super) what: &'static str,
}

/// The fields in the order their tables are stored.
pub(super) const SEQ_FIELDS: [SeqField; 3] = [
    SeqField {
        mode_shift: 6,
        default: &LL_DEFAULT,
        default_log: 6,
        max_symbol: 35,
        max_log: 9,
        what: "literal lengths",
    },
    SeqField {
        mode_shift: 4,
        default: &OF_DEFAULT,
        default_log: 5,
        max_symbol: 31,
        max_log: 8,
        what: "offsets",
    },
    SeqField {
        mode_shift: 2,
        default: &ML_DEFAULT,
        default_log: 6,
        max_symbol: 52,
        max_log: 9,
        what: "match lengths",
    },
];

/// Reads the table of one sequence field: returns it and the bytes its description took.
pub(super) fn read_seq_table(mode: u8, src: &[u8], f: &SeqField) -> Result<(Fse, usize)> {
    match mode {
        0 => Ok((Fse::build(f.default, f.default_log)?, 0)),
        1 => match src.first() {
            Some(&s) if usize::from(s) <= f.max_symbol => Ok((Fse::rle(s), 1)),
            _ => corrupt(format!("{}: bad RLE symbol", f.what)),
        },
        2 => Fse::read(src, f.max_symbol, f.max_log, f.what),
        _ => Err(Error::Unsupported(
            "sequence tables repeat the previous block's",
        )),
    }
}

/// Entries of the padded tables: every state a stream can name indexes them (masked), so the
/// loop needs no bounds checks; a valid stream never reaches the padding.
const PAD: usize = 512;
const PAD_MASK: usize = PAD - 1;
/// Literal and match length codes, masked into the padded (base, extra bits) tables.
const CODE_MASK: usize = 63;

/// (base, extra bits) of each code of `base` and `bits`, padded to 64 codes.
const fn code_table<const N: usize>(base: &[u32; N], bits: &[u8; N]) -> [(u32, u8); 64] {
    let mut t = [(0u32, 0u8); 64];
    let mut i = 0;
    while i < N {
        t[i] = (base[i], bits[i]);
        i += 1;
    }
    t
}

const LL: [(u32, u8); 64] = code_table(&LL_BASE, &LL_BITS);
const ML: [(u32, u8); 64] = code_table(&ML_BASE, &ML_BITS);

/// The sequences section's header: how many sequences, and where their tables start.
pub(super) fn sequence_count(src: &[u8]) -> Result<(usize, usize)> {
    let Some(&b0) = src.first() else {
        return corrupt("block without a sequences section");
    };
    let b = |i: usize| -> Result<usize> {
        src.get(i)
            .map(|&x| usize::from(x))
            .ok_or_else(|| Error::Corrupt("sequences header truncated".into()))
    };
    Ok(match b0 {
        0 => {
            if src.len() != 1 {
                return corrupt("bytes after an empty sequences section");
            }
            (0, 1)
        }
        1..=127 => (usize::from(b0), 1),
        128..=254 => (((usize::from(b0) - 128) << 8) + b(1)?, 2),
        255 => (b(1)? + (b(2)? << 8) + 0x7F00, 3),
    })
}

/// The sequences of a block, decoded from its first on.
pub(super) struct Sequences {
    pub(super) list: Vec<Sequence>,
    /// How many the block holds (more than `list` where decoding stopped early).
    pub(super) count: usize,
    /// Literals the decoded sequences use.
    pub(super) literals_used: usize,
    /// Bytes the decoded sequences produce (their literals and matches).
    pub(super) produced: usize,
}

impl Sequences {
    pub(super) fn complete(&self) -> bool {
        self.list.len() == self.count
    }
}

/// Reads the sequences section `src` (everything after the literals) of a block of `full`
/// decoded bytes; `literals` is how many the literals section holds. Stops after the first
/// sequence that reaches output byte `stop` (the sequences after it are not needed to produce
/// the bytes before `stop`), so the stream past that point is not verified.
pub(super) fn read_sequences(
    src: &[u8],
    literals: usize,
    full: usize,
    stop: usize,
) -> Result<Sequences> {
    let (count, mut at) = sequence_count(src)?;
    let mut list = Vec::new();
    if count == 0 {
        return Ok(Sequences {
            list,
            count,
            literals_used: 0,
            produced: 0,
        });
    }
    let modes = *src
        .get(at)
        .ok_or_else(|| Error::Corrupt("sequences header truncated".into()))?;
    at += 1;
    if modes & 3 != 0 {
        return corrupt("reserved bits set in the sequence modes");
    }
    // Literal length, offset and match length tables, padded.
    let mut tables = [[FseEntry::default(); PAD]; 3];
    let mut logs = [0u32; 3];
    for (k, f) in SEQ_FIELDS.iter().enumerate() {
        let (table, n) =
            read_seq_table((modes >> f.mode_shift) & 3, src.get(at..).unwrap_or(&[]), f)?;
        at += n;
        // At most 2^9 entries (the fields' largest accuracy log).
        tables[k][..table.table.len()].copy_from_slice(&table.table);
        logs[k] = table.log;
    }
    let [lls, ofs, mls] = &tables;
    let Some(stream) = src.get(at..) else {
        return corrupt("sequence tables run past the block");
    };
    let mut bits = Window::new(stream, "sequences")?;
    // The three initial states: at most 9 + 8 + 9 bits.
    let mut sll = bits.read(logs[0]) as usize;
    let mut sof = bits.read(logs[1]) as usize;
    let mut sml = bits.read(logs[2]) as usize;
    let mut reps = [1u32, 4, 8];
    list.reserve_exact(count);
    let mut literals_used = 0usize;
    let mut produced = 0usize;
    for i in 0..count {
        let (lle, ofe, mle) = (
            lls[sll & PAD_MASK],
            ofs[sof & PAD_MASK],
            mls[sml & PAD_MASK],
        );
        let (llc, ofc, mlc) = (
            usize::from(lle.symbol) & CODE_MASK,
            u32::from(ofe.symbol),
            usize::from(mle.symbol) & CODE_MASK,
        );
        if ofc > 31 {
            return corrupt(format!("offset code {ofc}"));
        }
        // A refill leaves 57 bits: enough for an offset of up to 31 bits, a match length's
        // 16 and, but for offsets over 25 bits, a literal length's 16.
        bits.refill();
        let offset_value = (1u64 << ofc) + bits.read(ofc);
        let match_len = ML[mlc].0 + bits.read(u32::from(ML[mlc].1)) as u32;
        if ofc > 25 {
            bits.refill();
        }
        let lit_len = LL[llc].0 + bits.read(u32::from(LL[llc].1)) as u32;
        let offset = if offset_value > 3 {
            let o = (offset_value - 3) as u32;
            reps = [o, reps[0], reps[1]];
            o
        } else {
            let idx = offset_value as usize - 1 + usize::from(lit_len == 0);
            match idx {
                0 => reps[0],
                1 => {
                    reps = [reps[1], reps[0], reps[2]];
                    reps[0]
                }
                2 => {
                    reps = [reps[2], reps[0], reps[1]];
                    reps[0]
                }
                _ => {
                    let o = reps[0].wrapping_sub(1);
                    if o == 0 {
                        return corrupt("repeat offset of zero");
                    }
                    reps = [o, reps[0], reps[1]];
                    o
                }
            }
        };
        literals_used += lit_len as usize;
        produced += (lit_len + match_len) as usize;
        list.push(Sequence {
            literals: lit_len,
            match_len,
            offset,
        });
        if literals_used > literals || produced > full {
            return corrupt("sequences produce more than the block holds");
        }
        let more = i + 1 < count;
        if more {
            // At most 9 + 9 + 8 bits.
            bits.refill();
            sll = usize::from(lle.new_state) + bits.read(u32::from(lle.nb_bits)) as usize;
            sml = usize::from(mle.new_state) + bits.read(u32::from(mle.nb_bits)) as usize;
            sof = usize::from(ofe.new_state) + bits.read(u32::from(ofe.nb_bits)) as usize;
        }
        if bits.overflowed() {
            return corrupt("sequence bit stream ends early");
        }
        if more && produced >= stop {
            break;
        }
    }
    if list.len() == count && bits.pos != 0 {
        return corrupt("sequence bit stream has bits left");
    }
    Ok(Sequences {
        list,
        count,
        literals_used,
        produced,
    })
}
