//! Partial decoding of single-block zstd frames: only the part of a chunk that crops need.
//!
//! libzstd decodes a block (up to 128 KiB) whole, so a chunk of one block cannot stop early
//! through it. Yet a random crop usually needs only a band of rows of each chunk it touches,
//! and the chunks of imagery compressed at low levels are almost all Huffman-coded literals:
//! four independent streams, each producing a quarter of the literals. This module decodes
//! such a block itself (RFC 8878) and decodes only the literal streams that hold the needed
//! band, stopping inside the last one, then runs only the sequences that reach the band.
//!
//! Scope: frames of exactly one block, without a dictionary, holding at most
//! [`MAX_SEQUENCES`] sequences; anything else is [`Error::Unsupported`] and the caller decodes
//! with libzstd. Bytes outside the returned range are left as they were. What lies outside the
//! needed part is not verified (the streams not decoded, the bits after the stop), as with any
//! decoder that stops early; a frame checksum, when one is to be verified, needs a full decode
//! and the caller does not come here.

use std::ops::Range;

/// Sequences are decoded one by one here (libzstd's loop is far faster); blocks with more than
/// this many are left to libzstd, where partial decoding would save less than it costs.
pub const MAX_SEQUENCES: usize = 512;

/// Decoding here pays when the needed literal streams hold at most this share of a block's
/// literals: per literal this decoder costs about twice libzstd's four-stream assembly loop,
/// and building its Huffman table adds a little per chunk.
pub const MAX_SHARE: f64 = 0.6;

const MAGIC: u32 = 0xFD2F_B528;
const MAX_BLOCK: usize = 128 * 1024;
const HUF_MAX_LOG: u32 = 11;

/// Why a frame was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A valid frame outside this decoder's scope (several blocks, a dictionary, ...).
    Unsupported(&'static str),
    /// The frame is malformed.
    Corrupt(String),
}

type Result<T> = std::result::Result<T, Error>;

fn corrupt<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Corrupt(msg.into()))
}

/// Bits `[lo, lo + n)` of `src` read as a little-endian bit string (`n <= 56`); bits below 0
/// read as zeros, as the backward streams of zstd are read past their start.
#[inline]
fn bits_at(src: &[u8], lo: i64, n: u32) -> u64 {
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
struct Backward<'a> {
    src: &'a [u8],
    /// Bits not yet read; negative once reads went past the start.
    pos: i64,
}

impl<'a> Backward<'a> {
    fn new(src: &'a [u8], what: &str) -> Result<Self> {
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
    fn read(&mut self, n: u32) -> u64 {
        self.pos -= i64::from(n);
        bits_at(self.src, self.pos, n)
    }

    fn overflowed(&self) -> bool {
        self.pos < 0
    }
}

/// An FSE decoding table entry.
#[derive(Debug, Clone, Copy, Default)]
struct FseEntry {
    symbol: u8,
    nb_bits: u8,
    new_state: u16,
}

#[derive(Debug, Clone)]
struct Fse {
    log: u32,
    table: Vec<FseEntry>,
}

impl Fse {
    /// Builds the decoding table of normalized counts `norm` (`-1` = "less than one").
    fn build(norm: &[i16], log: u32) -> Result<Fse> {
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
    fn rle(symbol: u8) -> Fse {
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
    fn read(src: &[u8], max_symbol: usize, max_log: u32, what: &str) -> Result<(Fse, usize)> {
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

/// Huffman decoding table, always indexed by 11 bits (a code of `log` bits or fewer fills
/// 2^(11 - log) times the entries it would in a table of `log` bits), so a lookup needs no
/// mask: entry = bits | symbol << 8.
struct Huffman {
    log: u32,
    entries: Box<[u16; 1 << HUF_MAX_LOG]>,
}

impl Huffman {
    /// Reads the Huffman tree description at the start of `src` (its length is
    /// [`Self::description_len`]) and builds the table.
    fn read(src: &[u8]) -> Result<Huffman> {
        let len = Self::description_len(src)?;
        let Some(body) = src.get(1..len) else {
            return corrupt("Huffman weights truncated");
        };
        let header = src[0];
        let mut weights = Vec::with_capacity(256);
        if header >= 128 {
            let n = usize::from(header) - 127;
            for i in 0..n {
                let b = body[i / 2];
                weights.push(if i % 2 == 0 { b >> 4 } else { b & 15 });
            }
        } else {
            let (fse, head) = Fse::read(body, 255, 6, "Huffman weights")?;
            let Some(stream) = body.get(head..) else {
                return corrupt("Huffman weights: no bit stream");
            };
            let mut bits = Backward::new(stream, "Huffman weights")?;
            let mut state = bits.read(fse.log) as usize;
            let mut other = bits.read(fse.log) as usize;
            // Two interleaved states, taking turns (swapped, so both stay in registers); when
            // the stream runs out the other state gives the final symbol.
            loop {
                let Some(&e) = fse.table.get(state) else {
                    return corrupt("Huffman weights: FSE state out of its table");
                };
                weights.push(e.symbol);
                state = usize::from(e.new_state) + bits.read(u32::from(e.nb_bits)) as usize;
                if bits.overflowed() {
                    let Some(last) = fse.table.get(other) else {
                        return corrupt("Huffman weights: FSE state out of its table");
                    };
                    weights.push(last.symbol);
                    break;
                }
                if weights.len() > 255 {
                    break;
                }
                std::mem::swap(&mut state, &mut other);
            }
            if weights.len() > 255 {
                return corrupt("Huffman weights: more than 255");
            }
        }
        let mut total: u32 = 0;
        for &w in &weights {
            if u32::from(w) > HUF_MAX_LOG {
                return corrupt(format!("Huffman weight {w} above {HUF_MAX_LOG}"));
            }
            if w > 0 {
                total += 1 << (w - 1);
            }
        }
        if total == 0 {
            return corrupt("Huffman weights all zero");
        }
        let log = 32 - total.leading_zeros();
        if log > HUF_MAX_LOG {
            return corrupt(format!("Huffman table log {log} above {HUF_MAX_LOG}"));
        }
        let rest = (1u32 << log) - total;
        if !rest.is_power_of_two() {
            return corrupt("Huffman weights do not complete a prefix code");
        }
        weights.push((rest.trailing_zeros() + 1) as u8);
        // Weights never exceed 12 from here (each at most HUF_MAX_LOG, the implied last at most
        // log + 1), so `w & 15` indexes without changing them.
        //
        // The table lists symbols by weight, and by symbol within a weight. Their places are
        // counted in four quarters of the symbols at once, each with counters of its own:
        // neighbouring symbols often share a weight, and one set of counters would make every
        // step wait for the previous one's store.
        let quarter = weights.len().div_ceil(4);
        let mut counts = [[0u16; 16]; 4];
        for i in 0..quarter {
            for (q, c) in counts.iter_mut().enumerate() {
                if let Some(&w) = weights.get(q * quarter + i) {
                    c[usize::from(w & 15)] += 1;
                }
            }
        }
        let mut rank_count = [0usize; 16];
        for c in &counts {
            for (r, &n) in rank_count.iter_mut().zip(c) {
                *r += usize::from(n);
            }
        }
        if rank_count[1] < 2 || rank_count[1] % 2 == 1 {
            return corrupt("Huffman weights: odd count of the longest codes");
        }
        // Where each quarter's symbols of each weight go in `sorted`.
        let mut slots = [[0usize; 16]; 4];
        let mut next = 0usize;
        for w in 1..=log as usize {
            for (q, c) in counts.iter().enumerate() {
                slots[q][w] = next;
                next += usize::from(c[w]);
            }
        }
        let mut sorted = [0u8; 256];
        for i in 0..quarter {
            for (q, slot) in slots.iter_mut().enumerate() {
                let symbol = q * quarter + i;
                if let Some(&w) = weights.get(symbol)
                    && w != 0
                {
                    let at = &mut slot[usize::from(w & 15)];
                    sorted[*at & 255] = symbol as u8;
                    *at += 1;
                }
            }
        }
        // Each weight's symbols fill runs of 2^(w-1) entries of a table of `log` bits, weight 1
        // first (scaled to 11 bits).
        let mut entries = Box::new([0u16; 1 << HUF_MAX_LOG]);
        let (mut symbol_at, mut entry_at) = (0usize, 0usize);
        let scale = HUF_MAX_LOG - log;
        for w in 1..=log as usize {
            let len = 1usize << (w - 1 + scale as usize);
            let bits = (log as usize + 1 - w) as u16;
            for &symbol in &sorted[symbol_at..symbol_at + rank_count[w]] {
                let entry = bits | u16::from(symbol) << 8;
                entries[entry_at..entry_at + len].fill(entry);
                entry_at += len;
            }
            symbol_at += rank_count[w];
        }
        Ok(Huffman { log, entries })
    }

    /// The size of the tree description at the start of `src` (without reading it).
    fn description_len(src: &[u8]) -> Result<usize> {
        match src.first() {
            None => corrupt("Huffman tree description missing"),
            Some(&h) if h >= 128 => Ok(1 + (usize::from(h) - 127).div_ceil(2)),
            Some(&h) => Ok(1 + usize::from(h)),
        }
    }
}

/// One Huffman stream to decode into `out` (its first `out.len()` symbols).
struct Stream<'a> {
    table: &'a Huffman,
    src: &'a [u8],
    /// Bits not yet read.
    pos: i64,
    out: &'a mut [u8],
    done: usize,
    /// Whether `out` takes every symbol of the stream (then it must end exactly).
    whole: bool,
}

impl Stream<'_> {
    /// Rounds the stream can take without a check: each needs 64 bits left before it and
    /// takes at most `ROUND * log` of them, and ROUND bytes of output.
    fn safe_rounds(&self) -> usize {
        if self.pos < 64 {
            return 0;
        }
        let by_bits = (self.pos - 64) as usize / (ROUND * self.table.log as usize) + 1;
        by_bits.min((self.out.len() - self.done) / ROUND)
    }

    /// Decodes the rest one symbol at a time, reading past the start as zeros.
    fn finish(&mut self) -> Result<()> {
        while self.done < self.out.len() {
            let idx = bits_at(self.src, self.pos - i64::from(HUF_MAX_LOG), HUF_MAX_LOG) as usize;
            let e = self.table.entries[idx & ((1 << HUF_MAX_LOG) - 1)];
            self.out[self.done] = (e >> 8) as u8;
            self.done += 1;
            self.pos -= i64::from(e & 0xFF);
            if self.pos < 0 {
                return corrupt("Huffman stream ends before its last literal");
            }
        }
        if self.whole && self.pos != 0 {
            return corrupt("Huffman stream has bits left after its last literal");
        }
        Ok(())
    }
}

const ROUND: usize = 5;

/// Decodes all `streams` in lockstep: their bit chains are independent, so the core overlaps
/// them, where one stream alone waits on each table lookup. Streams run in groups of up to
/// four for as many rounds as all of the group can take unchecked; a stream near its end
/// leaves and finishes alone. Returns, per stream, whether it decoded cleanly.
fn decode_streams(streams: &mut [Stream<'_>]) -> Vec<Result<()>> {
    let mut results: Vec<Result<()>> = streams.iter().map(|_| Ok(())).collect();
    let mut active: Vec<usize> = (0..streams.len()).collect();
    loop {
        let mut k = 0;
        while k < active.len() {
            let s = &mut streams[active[k]];
            if s.safe_rounds() == 0 {
                results[active[k]] = s.finish();
                active.swap_remove(k);
            } else {
                k += 1;
            }
        }
        let group = |n: usize| -> [usize; 4] {
            let mut g = [0; 4];
            g[..n].copy_from_slice(&active[..n]);
            g
        };
        let g = group(active.len().min(4));
        let disjoint = "active streams are distinct";
        match active.len() {
            0 => return results,
            1 => run_group([&mut streams[g[0]]]),
            2 => run_group(streams.get_disjoint_mut([g[0], g[1]]).expect(disjoint)),
            3 => run_group(
                streams
                    .get_disjoint_mut([g[0], g[1], g[2]])
                    .expect(disjoint),
            ),
            _ => run_group(streams.get_disjoint_mut(g).expect(disjoint)),
        }
    }
}

/// Runs the streams of `group` round by round until one of them cannot take another round.
/// Each stream's position and output count live in locals (registers) across the rounds, and
/// its bits are read from the top of a left-aligned container, so a symbol costs a shift, a
/// table load and a shift: the chain the core waits on. A round is five symbols from one
/// refill (5 x 11 bits fit in the 57 a refill guarantees).
fn run_group<const N: usize>(mut group: [&mut Stream<'_>; N]) {
    loop {
        let rounds = group.iter().map(|s| s.safe_rounds()).min().unwrap_or(0);
        if rounds == 0 {
            return;
        }
        let mut pos: [i64; N] = std::array::from_fn(|k| group[k].pos);
        let mut done: [usize; N] = std::array::from_fn(|k| group[k].done);
        let tables: [&[u16; 1 << HUF_MAX_LOG]; N] =
            std::array::from_fn(|k| &*group[k].table.entries);
        let srcs: [&[u8]; N] = std::array::from_fn(|k| group[k].src);
        let outs: [&mut [u8]; N] = group.each_mut().map(|s| &mut *s.out);
        for _ in 0..rounds {
            for k in 0..N {
                let start = ((pos[k] + 7) >> 3) as usize - 8;
                let word =
                    u64::from_le_bytes(srcs[k][start..start + 8].try_into().expect("8 bytes"));
                // Bit `pos - 1` of the stream to the top.
                let mut bits = word << (64 - (pos[k] - 8 * start as i64)) as u32;
                let mut used = 0u32;
                let out: &mut [u8; ROUND] = (&mut outs[k][done[k]..done[k] + ROUND])
                    .try_into()
                    .expect("ROUND bytes");
                for slot in out.iter_mut() {
                    let e = tables[k][(bits >> (64 - HUF_MAX_LOG)) as usize];
                    *slot = (e >> 8) as u8;
                    let n = u32::from(e & 0xFF);
                    bits <<= n;
                    used += n;
                }
                pos[k] -= i64::from(used);
                done[k] += ROUND;
            }
        }
        for (k, s) in group.iter_mut().enumerate() {
            s.pos = pos[k];
            s.done = done[k];
        }
    }
}

/// The literals section of a compressed block.
enum Literals<'a> {
    Raw(&'a [u8]),
    Rle(u8, usize),
    Huffman {
        /// The Huffman tree description (its table is built only for blocks decoded here).
        tree: &'a [u8],
        /// The streams (one or four), each with the literal range it produces.
        streams: Vec<(&'a [u8], Range<usize>)>,
        count: usize,
    },
}

impl<'a> Literals<'a> {
    fn count(&self) -> usize {
        match self {
            Literals::Raw(r) => r.len(),
            Literals::Rle(_, n) => *n,
            Literals::Huffman { count, .. } => *count,
        }
    }

    /// How many literals decoding `want` takes: whole streams from their starts.
    fn cost(&self, want: &Range<usize>) -> usize {
        match self {
            Literals::Huffman { streams, .. } => streams
                .iter()
                .filter(|(_, r)| r.end > want.start && r.start < want.end)
                .map(|(_, r)| r.end.min(want.end) - r.start)
                .sum(),
            _ => want.len(),
        }
    }

    /// Makes literals `want` (literal indices) appear in `out` (indexed by literal): raw and
    /// RLE literals are written now, Huffman streams are queued on `jobs`. Returns the literal
    /// range produced (Huffman streams start where they start).
    fn plan(
        &'a self,
        table: Option<&'a Huffman>,
        want: Range<usize>,
        out: &'a mut [u8],
        jobs: &mut Vec<Stream<'a>>,
    ) -> Result<Range<usize>> {
        if want.is_empty() {
            return Ok(want);
        }
        match self {
            Literals::Raw(raw) => {
                out[want.clone()].copy_from_slice(&raw[want.clone()]);
                Ok(want)
            }
            Literals::Rle(b, _) => {
                out[want.clone()].fill(*b);
                Ok(want)
            }
            Literals::Huffman { streams, .. } => {
                let Some(table) = table else {
                    return corrupt("Huffman literals without their table");
                };
                let mut rest: &'a mut [u8] = out;
                let mut rest_base = 0;
                let mut produced = Range {
                    start: usize::MAX,
                    end: 0,
                };
                for (src, range) in streams {
                    if range.end <= want.start || range.start >= want.end {
                        continue;
                    }
                    let end = range.end.min(want.end);
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(range.start - rest_base);
                    let (mine, after) = tail.split_at_mut(end - range.start);
                    rest = after;
                    rest_base = end;
                    produced.start = produced.start.min(range.start);
                    produced.end = end;
                    let head = Backward::new(src, "Huffman literal stream")?;
                    jobs.push(Stream {
                        table,
                        src,
                        pos: head.pos,
                        out: mine,
                        done: 0,
                        whole: end == range.end,
                    });
                }
                Ok(produced)
            }
        }
    }
}

/// Reads the literals section at the start of `block`; returns it and its size in bytes.
fn read_literals(block: &[u8]) -> Result<(Literals<'_>, usize)> {
    let Some(&h0) = block.first() else {
        return corrupt("block without a literals section");
    };
    let kind = h0 & 3;
    let format = (h0 >> 2) & 3;
    let byte = |i: usize| -> Result<u32> {
        block
            .get(i)
            .map(|&b| u32::from(b))
            .ok_or_else(|| Error::Corrupt("literals section header truncated".into()))
    };
    match kind {
        0 | 1 => {
            let (size, head) = match format {
                0 | 2 => ((h0 >> 3) as usize, 1),
                1 => ((u32::from(h0 >> 4) + (byte(1)? << 4)) as usize, 2),
                _ => (
                    (u32::from(h0 >> 4) + (byte(1)? << 4) + (byte(2)? << 12)) as usize,
                    3,
                ),
            };
            if size > MAX_BLOCK {
                return corrupt(format!("{size} literals in one block"));
            }
            if kind == 0 {
                let Some(raw) = block.get(head..head + size) else {
                    return corrupt("raw literals truncated");
                };
                Ok((Literals::Raw(raw), head + size))
            } else {
                Ok((Literals::Rle(byte(head)? as u8, size), head + 1))
            }
        }
        2 => {
            let (regen, comp, head, four) = match format {
                0 | 1 => {
                    let v = u32::from(h0) | byte(1)? << 8 | byte(2)? << 16;
                    ((v >> 4) & 0x3FF, (v >> 14) & 0x3FF, 3, format == 1)
                }
                2 => {
                    let v = u32::from(h0) | byte(1)? << 8 | byte(2)? << 16 | byte(3)? << 24;
                    ((v >> 4) & 0x3FFF, v >> 18, 4, true)
                }
                _ => {
                    let v = u64::from(h0)
                        | u64::from(byte(1)?) << 8
                        | u64::from(byte(2)?) << 16
                        | u64::from(byte(3)?) << 24
                        | u64::from(byte(4)?) << 32;
                    (((v >> 4) & 0x3FFFF) as u32, (v >> 22) as u32, 5, true)
                }
            };
            let (regen, comp) = (regen as usize, comp as usize);
            if regen > MAX_BLOCK {
                return corrupt(format!("{regen} literals in one block"));
            }
            let Some(body) = block.get(head..head + comp) else {
                return corrupt("compressed literals truncated");
            };
            let tree_len = Huffman::description_len(body)?;
            let Some((tree, data)) = body.split_at_checked(tree_len) else {
                return corrupt("Huffman weights truncated");
            };
            let mut streams = Vec::with_capacity(4);
            if four {
                if data.len() < 10 || regen < 4 {
                    return corrupt("four literal streams in too few bytes");
                }
                let sizes = [
                    usize::from(u16::from_le_bytes([data[0], data[1]])),
                    usize::from(u16::from_le_bytes([data[2], data[3]])),
                    usize::from(u16::from_le_bytes([data[4], data[5]])),
                ];
                let Some(last) = (data.len() - 6).checked_sub(sizes.iter().sum::<usize>()) else {
                    return corrupt("literal stream sizes exceed the section");
                };
                let segment = regen.div_ceil(4);
                if 3 * segment >= regen {
                    return corrupt("too few literals for four streams");
                }
                let mut at = 6;
                for (i, size) in sizes.into_iter().chain([last]).enumerate() {
                    let lit = i * segment..((i + 1) * segment).min(regen);
                    streams.push((&data[at..at + size], lit));
                    at += size;
                }
            } else {
                streams.push((data, 0..regen));
            }
            Ok((
                Literals::Huffman {
                    tree,
                    streams,
                    count: regen,
                },
                head + comp,
            ))
        }
        _ => Err(Error::Unsupported(
            "literals reuse the previous block's Huffman table",
        )),
    }
}

/// One decoded sequence.
#[derive(Debug, Clone, Copy)]
struct Sequence {
    literals: u32,
    match_len: u32,
    offset: u32,
}

const LL_BASE: [u32; 36] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 28, 32, 40, 48, 64,
    0x80, 0x100, 0x200, 0x400, 0x800, 0x1000, 0x2000, 0x4000, 0x8000, 0x10000,
];
const LL_BITS: [u8; 36] = [
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11,
    12, 13, 14, 15, 16,
];
const LL_DEFAULT: [i16; 36] = [
    4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1,
    -1, -1, -1, -1,
];
const ML_BASE: [u32; 53] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
    28, 29, 30, 31, 32, 33, 34, 35, 37, 39, 41, 43, 47, 51, 59, 67, 83, 99, 0x83, 0x103, 0x203,
    0x403, 0x803, 0x1003, 0x2003, 0x4003, 0x8003, 0x10003,
];
const ML_BITS: [u8; 53] = [
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
];
const ML_DEFAULT: [i16; 53] = [
    1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1,
];
const OF_DEFAULT: [i16; 29] = [
    1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1,
];

/// One of the three fields of a sequence (literal length, offset, match length).
struct SeqField {
    /// Where its mode sits in the modes byte.
    mode_shift: u8,
    /// Predefined distribution and its accuracy log.
    default: &'static [i16],
    default_log: u32,
    max_symbol: usize,
    max_log: u32,
    what: &'static str,
}

/// The fields in the order their tables are stored.
const SEQ_FIELDS: [SeqField; 3] = [
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
fn read_seq_table(mode: u8, src: &[u8], f: &SeqField) -> Result<(Fse, usize)> {
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
fn read_sequences(src: &[u8], literals: usize) -> Result<Vec<Sequence>> {
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
        return Err(Error::Unsupported("too many sequences"));
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

/// The frame's single block, located.
struct Frame<'a> {
    block: &'a [u8],
    kind: u8,
    /// The block's size field: stored bytes, or decoded bytes for an RLE block.
    size: usize,
    /// Decoded size, when the frame header declares it.
    content_size: Option<usize>,
}

fn read_frame(src: &[u8]) -> Result<Frame<'_>> {
    if src.len() < 6 {
        return corrupt(format!("{} bytes is too short for a zstd frame", src.len()));
    }
    let magic = u32::from_le_bytes([src[0], src[1], src[2], src[3]]);
    if magic != MAGIC {
        return Err(Error::Unsupported("not a plain zstd frame"));
    }
    let fhd = src[4];
    if fhd & 0x08 != 0 {
        return corrupt("reserved bit set in the frame header");
    }
    let single = fhd & 0x20 != 0;
    let checksum = fhd & 0x04 != 0;
    let mut at = 5 + usize::from(!single);
    let dict_bytes = [0, 1, 2, 4][usize::from(fhd & 3)];
    let dict = bits_at(src, 8 * at as i64, 8 * dict_bytes as u32);
    if dict != 0 {
        return Err(Error::Unsupported("frame needs a dictionary"));
    }
    at += dict_bytes;
    let fcs_bytes = match fhd >> 6 {
        0 => usize::from(single),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let content_size = if fcs_bytes == 0 {
        None
    } else {
        let Some(b) = src.get(at..at + fcs_bytes) else {
            return corrupt("frame header truncated");
        };
        let mut v = [0u8; 8];
        v[..fcs_bytes].copy_from_slice(b);
        let v = u64::from_le_bytes(v) + if fcs_bytes == 2 { 256 } else { 0 };
        Some(usize::try_from(v).map_err(|_| Error::Corrupt("content size overflow".into()))?)
    };
    at += fcs_bytes;
    let Some(h) = src.get(at..at + 3) else {
        return corrupt("block header truncated");
    };
    let h = u32::from(h[0]) | u32::from(h[1]) << 8 | u32::from(h[2]) << 16;
    at += 3;
    if h & 1 == 0 {
        return Err(Error::Unsupported("frame of several blocks"));
    }
    let kind = ((h >> 1) & 3) as u8;
    let size = (h >> 3) as usize;
    let stored = match kind {
        0 | 2 => size,
        1 => 1,
        _ => return corrupt("reserved block type"),
    };
    if size > MAX_BLOCK {
        return corrupt(format!("block of {size} bytes"));
    }
    let Some(block) = src.get(at..at + stored) else {
        return corrupt("block truncated");
    };
    let end = at + stored + if checksum { 4 } else { 0 };
    if end != src.len() {
        return Err(Error::Unsupported("bytes after the first frame"));
    }
    Ok(Frame {
        block,
        kind,
        size,
        content_size,
    })
}

/// One chunk to decode: its frame, its decoded size (`out.len()`) and the part crops need.
pub struct Job<'a> {
    /// The encoded chunk: one zstd frame.
    pub src: &'a [u8],
    /// Where the chunk decodes to (the whole chunk's size).
    pub out: &'a mut [u8],
    /// The byte range of the chunk that must be decoded.
    pub want: Range<usize>,
    /// Reused room for the literals of blocks that also hold sequences.
    pub scratch: &'a mut Vec<u8>,
}

/// A frame parsed down to what decoding `want` takes.
struct Parsed<'a> {
    literals: Literals<'a>,
    sequences: Vec<Sequence>,
    /// Lowest output position the wanted bytes depend on.
    lo: usize,
    /// Literals needed.
    lits: Range<usize>,
}

fn parse<'a>(src: &'a [u8], full: usize, want: &Range<usize>) -> Result<Parsed<'a>> {
    let frame = read_frame(src)?;
    if let Some(n) = frame.content_size
        && n != full
    {
        return corrupt(format!("frame declares {n} bytes, expected {full}"));
    }
    let (literals, sequences) = match frame.kind {
        0 => (Literals::Raw(frame.block), Vec::new()),
        1 => (Literals::Rle(frame.block[0], frame.size), Vec::new()),
        _ => {
            let (literals, n) = read_literals(frame.block)?;
            let sequences = read_sequences(&frame.block[n..], literals.count())?;
            (literals, sequences)
        }
    };
    let nlit = literals.count();
    let used: usize = sequences.iter().map(|s| s.literals as usize).sum();
    let matched: usize = sequences.iter().map(|s| s.match_len as usize).sum();
    if nlit + matched != full {
        return corrupt(format!(
            "block decodes to {} bytes, expected {full}",
            nlit + matched
        ));
    }
    if sequences.is_empty() {
        return Ok(Parsed {
            literals,
            sequences,
            lo: want.start,
            lits: want.clone(),
        });
    }
    // Walk back from the end to find the lowest output position and the literals the wanted
    // bytes depend on (matches pull in their sources).
    let mut lo = want.start;
    let mut lits = Range {
        start: usize::MAX,
        end: 0,
    };
    let mut need_literals = |run: Range<usize>, first_literal: usize, lo: usize| {
        let (a, b) = (run.start.max(lo), run.end.min(want.end));
        if a < b {
            lits.start = lits.start.min(first_literal + (a - run.start));
            lits.end = lits.end.max(first_literal + (b - run.start));
        }
    };
    let trailing = nlit - used;
    let mut pos = full - trailing;
    let mut lp = nlit - trailing;
    need_literals(pos..full, lp, lo);
    for s in sequences.iter().rev() {
        let (ll, ml, off) = (s.literals as usize, s.match_len as usize, s.offset as usize);
        let mpos = pos - ml;
        if off > mpos {
            return corrupt(format!("match offset {off} reaches before the chunk"));
        }
        if pos > lo && mpos < want.end {
            // An overlapping match repeats the `off` bytes before it; otherwise it copies
            // the bytes `off` back.
            lo = lo.min(if off < ml {
                mpos - off
            } else {
                mpos.max(lo) - off
            });
        }
        pos = mpos - ll;
        lp -= ll;
        need_literals(pos..mpos, lp, lo);
    }
    if lits.start > lits.end {
        lits = 0..0;
    }
    Ok(Parsed {
        literals,
        sequences,
        lo,
        lits,
    })
}

/// Runs `sequences` over `[lo, want.end)` of `out`, literals taken from `scratch`.
fn execute(sequences: &[Sequence], lo: usize, out: &mut [u8], scratch: &[u8], end: usize) {
    let mut pos = 0usize;
    let mut lp = 0usize;
    for s in sequences {
        if pos >= end {
            return;
        }
        let ll = s.literals as usize;
        let (a, b) = (pos.max(lo), (pos + ll).min(end));
        if a < b {
            out[a..b].copy_from_slice(&scratch[lp + (a - pos)..lp + (b - pos)]);
        }
        pos += ll;
        lp += ll;
        let (ml, off) = (s.match_len as usize, s.offset as usize);
        let (a, b) = (pos.max(lo), (pos + ml).min(end));
        if a < b {
            if off >= b - a {
                out.copy_within(a - off..b - off, a);
            } else {
                for p in a..b {
                    out[p] = out[p - off];
                }
            }
        }
        pos += ml;
    }
    let (a, b) = (pos.max(lo), end);
    if a < b {
        out[a..b].copy_from_slice(&scratch[lp + (a - pos)..lp + (b - pos)]);
    }
}

/// Decodes at least `want` of each job's one-block zstd frame into its `out`, the literal
/// streams of all jobs in one lockstep. Returns per job the range of `out` written (which
/// contains `want`), or why the job was not decoded. A job whose needed streams hold more
/// than `max_share` of its block's literals is left undecoded ([`Error::Unsupported`]).
pub fn decode_many(jobs: &mut [Job<'_>], max_share: f64) -> Vec<Result<Range<usize>>> {
    let parsed: Vec<Result<Parsed<'_>>> = jobs
        .iter()
        .map(|j| {
            let full = j.out.len();
            if j.want.start > j.want.end || j.want.end > full {
                return corrupt(format!(
                    "range {:?} outside a chunk of {full} bytes",
                    j.want
                ));
            }
            let p = parse(j.src, full, &j.want)?;
            let count = p.literals.count();
            if count > 0 && p.literals.cost(&p.lits) as f64 > max_share * count as f64 {
                return Err(Error::Unsupported("most of the block is needed"));
            }
            Ok(p)
        })
        .collect();
    // The Huffman tables of the blocks decoded here.
    let tables: Vec<Option<Result<Huffman>>> = parsed
        .iter()
        .map(|p| match p {
            Ok(Parsed {
                literals: Literals::Huffman { tree, .. },
                ..
            }) => Some(Huffman::read(tree)),
            _ => None,
        })
        .collect();
    // Queue every job's literal streams, then run them all together.
    let mut written: Vec<Result<Range<usize>>> = Vec::with_capacity(jobs.len());
    let mut owner: Vec<usize> = Vec::new();
    {
        let mut streams: Vec<Stream<'_>> = Vec::new();
        for (i, ((job, p), table)) in jobs.iter_mut().zip(&parsed).zip(&tables).enumerate() {
            let Ok(p) = p else {
                written.push(Ok(0..0));
                continue;
            };
            let table = match table {
                Some(Err(e)) => {
                    written.push(Err(e.clone()));
                    continue;
                }
                Some(Ok(t)) => Some(t),
                None => None,
            };
            let target: &mut [u8] = if p.sequences.is_empty() {
                &mut *job.out
            } else {
                let nlit = p.literals.count();
                if job.scratch.len() < nlit {
                    job.scratch.resize(nlit, 0);
                }
                &mut job.scratch[..nlit]
            };
            written.push(p.literals.plan(table, p.lits.clone(), target, &mut streams));
            owner.resize(streams.len(), i);
        }
        for (r, &i) in decode_streams(&mut streams).into_iter().zip(&owner) {
            if let Err(e) = r
                && written[i].is_ok()
            {
                written[i] = Err(e);
            }
        }
    }
    jobs.iter_mut()
        .zip(parsed)
        .zip(written)
        .map(|((job, p), w)| {
            let p = p?;
            let w = w?;
            if p.sequences.is_empty() {
                return Ok(w);
            }
            execute(&p.sequences, p.lo, job.out, job.scratch, job.want.end);
            Ok(p.lo..job.want.end)
        })
        .collect()
}

/// Decodes at least `want` of a one-block zstd frame whose decoded size is `out.len()`, into
/// `out` (see [`decode_many`]). Returns the range of `out` that was written.
///
/// # Panics
/// Never: [`decode_many`] returns one result per job.
pub fn decode_range(
    src: &[u8],
    out: &mut [u8],
    want: Range<usize>,
    scratch: &mut Vec<u8>,
    max_share: f64,
) -> Result<Range<usize>> {
    let mut jobs = [Job {
        src,
        out,
        want,
        scratch,
    }];
    decode_many(&mut jobs, max_share).pop().expect("one job")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    /// uint16 imagery like the benchmark's: a smooth field plus 5 bits of noise.
    fn imagery(n: usize, rng: &mut StdRng) -> Vec<u8> {
        let phase: f64 = rng.random_range(0.0..6.0);
        (0..n / 2)
            .flat_map(|i| {
                let (y, x) = ((i / 256) as f64, (i % 256) as f64);
                let base = 20000.0 + 8000.0 * ((y * 0.011 + phase).sin() * (x * 0.013).cos());
                let v = base as u16 + rng.random_range(0..32u16);
                v.to_le_bytes()
            })
            .collect()
    }

    /// Imagery with rows repeated from earlier ones and zero runs: a few long matches, some
    /// overlapping their source.
    fn imagery_with_repeats(n: usize, rng: &mut StdRng) -> Vec<u8> {
        let mut v = imagery(n, rng);
        for _ in 0..rng.random_range(1..6) {
            let len = rng.random_range(16..2048).min(n / 4);
            let dst = rng.random_range(len..n - len);
            if rng.random_range(0..2) == 0 {
                let src = rng.random_range(0..dst - len + 1);
                v.copy_within(src..src + len, dst);
            } else {
                v[dst..dst + len].fill(0);
            }
        }
        v
    }

    fn text(n: usize, rng: &mut StdRng) -> Vec<u8> {
        const WORDS: [&str; 8] = [
            "zarr ", "chunk ", "shard ", "crop ", "decode ", "io ", "a ", "the ",
        ];
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(WORDS[rng.random_range(0..WORDS.len())].as_bytes());
        }
        v.truncate(n);
        v
    }

    fn data(kind: usize, n: usize, rng: &mut StdRng) -> Vec<u8> {
        match kind {
            0 => imagery(n, rng),
            1 => imagery_with_repeats(n, rng),
            2 => (0..n).map(|_| rng.random::<u8>()).collect(),
            3 => vec![7u8; n],
            _ => text(n, rng),
        }
    }

    /// Every wanted range decodes to the bytes libzstd gives, or the frame is declared out of
    /// scope; returns how many decodes went through this decoder and how many bytes they wrote.
    fn check(plain: &[u8], frame: &[u8], rng: &mut StdRng, tries: usize) -> (usize, usize) {
        assert_eq!(zstd::bulk::decompress(frame, plain.len()).unwrap(), plain);
        let (mut done, mut written) = (0, 0);
        let mut scratch = Vec::new();
        for t in 0..tries {
            let n = plain.len();
            let want = match t {
                0 => 0..n,
                1 => 0..n.min(1),
                _ => {
                    let a = rng.random_range(0..n);
                    a..rng.random_range(a..=n)
                }
            };
            let mut out = vec![0xA5u8; n];
            match decode_range(frame, &mut out, want.clone(), &mut scratch, 1.0) {
                Ok(got) => {
                    assert!(
                        got.start <= want.start && got.end >= want.end,
                        "{got:?} {want:?}"
                    );
                    assert!(got.end <= n);
                    assert_eq!(
                        out[want.clone()],
                        plain[want.clone()],
                        "range {want:?} of {n}"
                    );
                    done += 1;
                    written += got.len();
                }
                Err(Error::Unsupported(_)) => {}
                Err(Error::Corrupt(e)) => panic!("valid frame called corrupt: {e} ({want:?})"),
            }
        }
        (done, written)
    }

    #[test]
    fn matches_libzstd_on_every_kind_of_block() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut by_kind = [0usize; 5];
        for round in 0..120 {
            let kind = round % 5;
            let n = match round % 4 {
                0 => 128 * 1024,
                1 => 32 * 1024,
                2 => rng.random_range(1..4096) * 2,
                _ => rng.random_range(1..64 * 1024) * 2,
            };
            let level = [1, 3, 7, 19, -5][rng.random_range(0..5)];
            let plain = data(kind, n, &mut rng);
            let frame = zstd::bulk::compress(&plain, level).unwrap();
            by_kind[kind] += check(&plain, &frame, &mut rng, 12).0;
        }
        // Imagery (with and without repeats), random and constant blocks all take this path.
        for (kind, &n) in by_kind.iter().enumerate().take(4) {
            assert!(n > 100, "kind {kind}: only {n} partial decodes");
        }
    }

    /// `len` bytes of imagery made from `seed`, and their zstd frame at level 1.
    fn imagery_frame(seed: u64, len: usize) -> (Vec<u8>, Vec<u8>) {
        let plain = imagery(len, &mut StdRng::seed_from_u64(seed));
        let frame = zstd::bulk::compress(&plain, 1).unwrap();
        (plain, frame)
    }

    #[test]
    fn decodes_only_the_streams_a_band_needs() {
        let (plain, frame) = imagery_frame(2, 128 * 1024);
        let mut out = vec![0u8; plain.len()];
        let mut scratch = Vec::new();
        // A band in the third quarter: only the third literal stream is decoded, and only up
        // to the band's end.
        let want = 80 * 1024..90 * 1024;
        let got = decode_range(&frame, &mut out, want.clone(), &mut scratch, 1.0).unwrap();
        assert_eq!(got, 64 * 1024..90 * 1024);
        assert_eq!(out[want.clone()], plain[want]);
        // Bytes outside what was decoded are untouched.
        assert!(out[..64 * 1024].iter().all(|&b| b == 0));
        assert!(out[90 * 1024..].iter().all(|&b| b == 0));
    }

    /// The Huffman table is built only for blocks decoded here: a damaged tree description is
    /// an error for a band decoded here, and a block left to libzstd never reads it.
    #[test]
    fn huffman_tables_are_read_only_for_blocks_decoded_here() {
        let (plain, mut frame) = imagery_frame(5, 32 * 1024);
        let block = read_frame(&frame).unwrap().block;
        let Literals::Huffman { tree, .. } = read_literals(block).unwrap().0 else {
            panic!("imagery literals are Huffman-coded");
        };
        assert!(tree[0] < 128, "weights are FSE-coded");
        let at = tree.as_ptr() as usize - frame.as_ptr() as usize;
        let len = tree.len();
        // Zero FSE counts: a description no table can be built from.
        frame[at + 1..at + len].fill(0);
        let mut out = vec![0u8; plain.len()];
        let band = 100..200;
        match decode_range(&frame, &mut out, band, &mut Vec::new(), 1.0) {
            Err(Error::Corrupt(e)) => assert!(e.contains("Huffman weights"), "{e}"),
            other => panic!("damaged tree decoded: {other:?}"),
        }
        let whole = 0..plain.len();
        assert_eq!(
            decode_range(&frame, &mut out, whole, &mut Vec::new(), MAX_SHARE),
            Err(Error::Unsupported("most of the block is needed"))
        );
    }

    #[test]
    fn several_blocks_and_dictionaries_are_left_to_libzstd() {
        let (plain, frame) = imagery_frame(3, 300 * 1024);
        let mut out = vec![0u8; plain.len()];
        let r = decode_range(&frame, &mut out, 0..10, &mut Vec::new(), 1.0);
        assert_eq!(r, Err(Error::Unsupported("frame of several blocks")));
        // A frame header that names dictionary 5 (one id byte).
        let small = &plain[..4096];
        let plain_frame = zstd::bulk::compress(small, 1).unwrap();
        let fhd = plain_frame[4];
        assert_eq!(fhd & 3, 0);
        let mut frame = plain_frame[..4].to_vec();
        frame.push(fhd | 1);
        let window = usize::from(fhd & 0x20 == 0);
        frame.extend_from_slice(&plain_frame[5..5 + window]);
        frame.push(5);
        frame.extend_from_slice(&plain_frame[5 + window..]);
        let mut out = vec![0u8; small.len()];
        let r = decode_range(&frame, &mut out, 0..10, &mut Vec::new(), 1.0);
        assert_eq!(r, Err(Error::Unsupported("frame needs a dictionary")));
    }

    #[test]
    fn damaged_frames_give_errors_or_bytes_never_a_panic() {
        let mut rng = StdRng::seed_from_u64(4);
        let mut scratch = Vec::new();
        let mut corrupt_seen = 0;
        for round in 0..3000 {
            let n = [128 * 1024, 32 * 1024, 2048][round % 3];
            let plain = data(round % 5, n, &mut rng);
            let mut frame = zstd::bulk::compress(&plain, [1, 3, 19][round % 3]).unwrap();
            match rng.random_range(0..3) {
                0 => frame.truncate(rng.random_range(0..frame.len())),
                1 => {
                    for _ in 0..rng.random_range(1..4) {
                        let i = rng.random_range(0..frame.len());
                        frame[i] ^= 1 << rng.random_range(0..8);
                    }
                }
                _ => {
                    let i = rng.random_range(0..frame.len());
                    frame[i] = rng.random();
                }
            }
            let mut out = vec![0u8; n];
            let a = rng.random_range(0..n);
            let want = a..rng.random_range(a..=n);
            if let Err(Error::Corrupt(_)) = decode_range(&frame, &mut out, want, &mut scratch, 1.0)
            {
                corrupt_seen += 1;
            }
        }
        assert!(
            corrupt_seen > 500,
            "only {corrupt_seen} damaged frames detected"
        );
    }

    #[test]
    fn fse_tables_fill_as_libzstd_spreads_them() {
        // The predefined literal-length table (RFC 8878, appendix A): state 0 is symbol 0 with
        // 4 bits, state 63 (the last "less than one" symbol placed first) is symbol 32.
        let t = Fse::build(&LL_DEFAULT, 6).unwrap();
        assert_eq!(
            (t.table[0].symbol, t.table[0].nb_bits, t.table[0].new_state),
            (0, 4, 0)
        );
        assert_eq!(
            (t.table[1].symbol, t.table[1].nb_bits, t.table[1].new_state),
            (0, 4, 16)
        );
        assert_eq!((t.table[2].symbol, t.table[2].nb_bits), (1, 5));
        assert_eq!((t.table[63].symbol, t.table[63].nb_bits), (32, 6));
        assert_eq!((t.table[60].symbol, t.table[60].nb_bits), (35, 6));
    }
}
