//! Huffman-coded literals (RFC 8878, 4.2): the decoding table, and the streams decoded in
//! lockstep, only as far as the needed part of the chunk.

use super::bits::{Backward, bits_at};
use super::fse::Fse;
use super::{HUF_MAX_LOG, Result, corrupt};

/// Huffman decoding table, always indexed by 11 bits (a code of `log` bits or fewer fills
/// 2^(11 - log) times the entries it would in a table of `log` bits), so a lookup needs no
/// mask: entry = bits | symbol << 8.
pub(super) struct Huffman {
    pub(super) log: u32,
    pub(super) entries: Box<[u16; 1 << HUF_MAX_LOG]>,
}

impl Huffman {
    /// Reads the Huffman tree description at the start of `src` (its length is
    /// [`Self::description_len`]) and builds the table.
    pub(super) fn read(src: &[u8]) -> Result<Huffman> {
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
    pub(super) fn description_len(src: &[u8]) -> Result<usize> {
        match src.first() {
            None => corrupt("Huffman tree description missing"),
            Some(&h) if h >= 128 => Ok(1 + (usize::from(h) - 127).div_ceil(2)),
            Some(&h) => Ok(1 + usize::from(h)),
        }
    }
}

/// One Huffman stream to decode into `out` (its first `out.len()` symbols).
pub(super) struct Stream<'a> {
    pub(super) table: &'a Huffman,
    pub(super) src: &'a [u8],
    /// Bits not yet read.
    pub(super) pos: i64,
    pub(super) out: &'a mut [u8],
    pub(super) done: usize,
    /// Whether `out` takes every symbol of the stream (then it must end exactly).
    pub(super) whole: bool,
}

impl Stream<'_> {
    /// Rounds the stream can take without a check: each needs 64 bits left before it and
    /// takes at most `ROUND * log` of them, and ROUND bytes of output.
    pub(super) fn safe_rounds(&self) -> usize {
        if self.pos < 64 {
            return 0;
        }
        let by_bits = (self.pos - 64) as usize / (ROUND * self.table.log as usize) + 1;
        by_bits.min((self.out.len() - self.done) / ROUND)
    }

    /// Decodes the rest one symbol at a time, reading past the start as zeros.
    pub(super) fn finish(&mut self) -> Result<()> {
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

pub(super) const ROUND: usize = 5;

/// Decodes all `streams` in lockstep: their bit chains are independent, so the core overlaps
/// them, where one stream alone waits on each table lookup. Streams run in groups of up to
/// four for as many rounds as all of the group can take unchecked; a stream near its end
/// leaves and finishes alone. Returns, per stream, whether it decoded cleanly.
pub(super) fn decode_streams(streams: &mut [Stream<'_>]) -> Vec<Result<()>> {
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
pub(super) fn run_group<const N: usize>(mut group: [&mut Stream<'_>; N]) {
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
