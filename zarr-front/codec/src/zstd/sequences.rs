//! The sequences section of a compressed block (RFC 8878, 3.1.1.3.2): literal lengths,
//! match lengths and offsets, FSE-coded.

use super::bits::Backward;
use super::fse::Fse;
use super::{Error, MAX_SEQUENCES, Result, TOO_MANY_SEQUENCES, corrupt};

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

/// Reads the sequences section (everything after the literals); `literals` is how many the
/// literals section holds.
pub(super) fn read_sequences(src: &[u8], literals: usize) -> Result<Vec<Sequence>> {
    let Some(&b0) = src.first() else {
        return corrupt("block without a sequences section");
    };
    let b = |i: usize| -> Result<usize> {
        src.get(i)
            .map(|&x| usize::from(x))
            .ok_or_else(|| Error::Corrupt("sequences header truncated".into()))
    };
    let (count, mut at) = match b0 {
        0 => {
            if src.len() != 1 {
                return corrupt("bytes after an empty sequences section");
            }
            return Ok(Vec::new());
        }
        1..=127 => (usize::from(b0), 1),
        128..=254 => (((usize::from(b0) - 128) << 8) + b(1)?, 2),
        255 => (b(1)? + (b(2)? << 8) + 0x7F00, 3),
    };
    if count > MAX_SEQUENCES {
        return Err(Error::Unsupported(TOO_MANY_SEQUENCES));
    }
    let modes = b(at)? as u8;
    at += 1;
    if modes & 3 != 0 {
        return corrupt("reserved bits set in the sequence modes");
    }
    let mut tables = Vec::with_capacity(3);
    for f in &SEQ_FIELDS {
        let (table, n) =
            read_seq_table((modes >> f.mode_shift) & 3, src.get(at..).unwrap_or(&[]), f)?;
        at += n;
        tables.push(table);
    }
    let [ll, of, ml]: [Fse; 3] = tables.try_into().expect("three tables");
    let Some(stream) = src.get(at..) else {
        return corrupt("sequence tables run past the block");
    };
    let mut bits = Backward::new(stream, "sequences")?;
    let mut sll = bits.read(ll.log) as usize;
    let mut sof = bits.read(of.log) as usize;
    let mut sml = bits.read(ml.log) as usize;
    let mut reps = [1u32, 4, 8];
    let mut out = Vec::with_capacity(count);
    let mut literals_used = 0usize;
    for i in 0..count {
        let (lle, ofe, mle) = (ll.table[sll], of.table[sof], ml.table[sml]);
        let (llc, ofc, mlc) = (
            usize::from(lle.symbol),
            u32::from(ofe.symbol),
            usize::from(mle.symbol),
        );
        if ofc > 31 {
            return corrupt(format!("offset code {ofc}"));
        }
        let offset_value = (1u64 << ofc) + bits.read(ofc);
        let match_len = ML_BASE[mlc] + bits.read(u32::from(ML_BITS[mlc])) as u32;
        let lit_len = LL_BASE[llc] + bits.read(u32::from(LL_BITS[llc])) as u32;
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
        out.push(Sequence {
            literals: lit_len,
            match_len,
            offset,
        });
        if i + 1 < count {
            sll = usize::from(lle.new_state) + bits.read(u32::from(lle.nb_bits)) as usize;
            sml = usize::from(mle.new_state) + bits.read(u32::from(mle.nb_bits)) as usize;
            sof = usize::from(ofe.new_state) + bits.read(u32::from(ofe.nb_bits)) as usize;
        }
        if bits.overflowed() {
            return corrupt("sequence bit stream ends early");
        }
    }
    if bits.pos != 0 {
        return corrupt("sequence bit stream has bits left");
    }
    if literals_used > literals {
        return corrupt("sequences use more literals than the block has");
    }
    Ok(out)
}
