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

/// A sequences section being decoded, one sequence a [`Self::step`].
pub(super) struct SeqDecoder<'a> {
    /// Literal length, offset and match length tables, padded.
    tables: Box<[[FseEntry; PAD]; 3]>,
    bits: Window<'a>,
    /// Literal length, offset and match length states.
    states: [usize; 3],
    reps: [u32; 3],
    list: Vec<Sequence>,
    count: usize,
    literals: usize,
    full: usize,
    stop: usize,
    literals_used: usize,
    produced: usize,
    done: bool,
    error: Option<Error>,
}

impl<'a> SeqDecoder<'a> {
    /// Starts decoding the sequences section `src` (everything after the literals) of a block
    /// of `full` decoded bytes; `literals` is how many the literals section holds. Decoding
    /// stops after the first sequence that reaches output byte `stop` (the sequences after it
    /// are not needed to produce the bytes before `stop`), so the stream past that point is not
    /// verified.
    pub(super) fn new(src: &'a [u8], literals: usize, full: usize, stop: usize) -> Result<Self> {
        let (count, mut at) = sequence_count(src)?;
        let mut d = SeqDecoder {
            tables: Box::new([[FseEntry::default(); PAD]; 3]),
            bits: Window::new(&[1], "sequences")?,
            states: [0; 3],
            reps: [1, 4, 8],
            list: Vec::new(),
            count,
            literals,
            full,
            stop,
            literals_used: 0,
            produced: 0,
            done: count == 0,
            error: None,
        };
        if count == 0 {
            return Ok(d);
        }
        let modes = *src
            .get(at)
            .ok_or_else(|| Error::Corrupt("sequences header truncated".into()))?;
        at += 1;
        if modes & 3 != 0 {
            return corrupt("reserved bits set in the sequence modes");
        }
        let mut logs = [0u32; 3];
        for (k, f) in SEQ_FIELDS.iter().enumerate() {
            let (table, n) =
                read_seq_table((modes >> f.mode_shift) & 3, src.get(at..).unwrap_or(&[]), f)?;
            at += n;
            // At most 2^9 entries (the fields' largest accuracy log).
            d.tables[k][..table.table.len()].copy_from_slice(&table.table);
            logs[k] = table.log;
        }
        let Some(stream) = src.get(at..) else {
            return corrupt("sequence tables run past the block");
        };
        d.bits = Window::new(stream, "sequences")?;
        // The three initial states: at most 9 + 8 + 9 bits.
        for (state, log) in d.states.iter_mut().zip(logs) {
            *state = d.bits.read(log) as usize;
        }
        d.list.reserve_exact(count);
        Ok(d)
    }

    /// Whether decoding has ended (every sequence decoded, `stop` reached, or an error).
    #[inline]
    pub(super) fn done(&self) -> bool {
        self.done
    }

    fn fail(&mut self, e: Error) {
        self.error = Some(e);
        self.done = true;
    }

    /// Decodes the next sequence (call only while not [`Self::done`]).
    #[inline]
    pub(super) fn step(&mut self) {
        let [sll, sof, sml] = self.states;
        let lle = self.tables[0][sll & PAD_MASK];
        let ofe = self.tables[1][sof & PAD_MASK];
        let mle = self.tables[2][sml & PAD_MASK];
        let (llc, ofc, mlc) = (
            usize::from(lle.symbol) & CODE_MASK,
            u32::from(ofe.symbol),
            usize::from(mle.symbol) & CODE_MASK,
        );
        if ofc > 31 {
            return self.fail(Error::Corrupt(format!("offset code {ofc}")));
        }
        let bits = &mut self.bits;
        // A refill leaves 57 bits: enough for an offset of up to 31 bits, a match length's
        // 16 and, but for offsets over 25 bits, a literal length's 16.
        bits.refill();
        let offset_value = (1u64 << ofc) + bits.read(ofc);
        let match_len = ML[mlc].0 + bits.read(u32::from(ML[mlc].1)) as u32;
        if ofc > 25 {
            bits.refill();
        }
        let lit_len = LL[llc].0 + bits.read(u32::from(LL[llc].1)) as u32;
        let reps = &mut self.reps;
        let offset = if offset_value > 3 {
            let o = (offset_value - 3) as u32;
            *reps = [o, reps[0], reps[1]];
            o
        } else {
            let idx = offset_value as usize - 1 + usize::from(lit_len == 0);
            match idx {
                0 => reps[0],
                1 => {
                    *reps = [reps[1], reps[0], reps[2]];
                    reps[0]
                }
                2 => {
                    *reps = [reps[2], reps[0], reps[1]];
                    reps[0]
                }
                _ => {
                    let o = reps[0].wrapping_sub(1);
                    if o == 0 {
                        return self.fail(Error::Corrupt("repeat offset of zero".into()));
                    }
                    *reps = [o, reps[0], reps[1]];
                    o
                }
            }
        };
        self.literals_used += lit_len as usize;
        self.produced += (lit_len + match_len) as usize;
        self.list.push(Sequence {
            literals: lit_len,
            match_len,
            offset,
        });
        if self.literals_used > self.literals || self.produced > self.full {
            return self.fail(Error::Corrupt(
                "sequences produce more than the block holds".into(),
            ));
        }
        let more = self.list.len() < self.count;
        if more {
            // At most 9 + 9 + 8 bits.
            bits.refill();
            let ll = usize::from(lle.new_state) + bits.read(u32::from(lle.nb_bits)) as usize;
            let ml = usize::from(mle.new_state) + bits.read(u32::from(mle.nb_bits)) as usize;
            let of = usize::from(ofe.new_state) + bits.read(u32::from(ofe.nb_bits)) as usize;
            self.states = [ll, of, ml];
        }
        if bits.overflowed() {
            return self.fail(Error::Corrupt("sequence bit stream ends early".into()));
        }
        if !more || self.produced >= self.stop {
            self.done = true;
        }
    }

    /// The sequences decoded, or why decoding failed.
    pub(super) fn finish(self) -> Result<Sequences> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let complete = self.list.len() == self.count;
        if complete && self.count > 0 && self.bits.pos != 0 {
            return corrupt("sequence bit stream has bits left");
        }
        Ok(Sequences {
            list: self.list,
            count: self.count,
            literals_used: self.literals_used,
            produced: self.produced,
        })
    }
}

/// Decodes the sequences section `src` (see [`SeqDecoder::new`]).
pub(super) fn read_sequences(
    src: &[u8],
    literals: usize,
    full: usize,
    stop: usize,
) -> Result<Sequences> {
    let mut d = SeqDecoder::new(src, literals, full, stop)?;
    while !d.done() {
        d.step();
    }
    d.finish()
}
