//! Unshuffling an opened range of a blosc chunk into a buffer or straight into crops.

use super::frame::{Chunk, HEADER, bit_main, seg_bytes};
use crate::dest::{Rows, RunGroup};
use crate::shuffle::interleave;

/// The longest run (bytes) that [`Chunk::gather_group`] writes with streaming stores
/// ([`Rows::write_interleaved2`]); longer runs take the per-run gather. A run's whole cache
/// lines then go to memory without being read first. Runs of 128 bytes at any alignment have
/// one whole line in most cases; the partial lines at their ends are stored as usual.
const STREAMED_RUN: usize = 512;

impl<'a> Chunk<'a> {
    /// Bytes decompressed or read from raw splits to open this range.
    pub fn decoded_bytes(&self) -> usize {
        self.decoded
    }

    /// `len` bytes at position `q` of block `j`'s split-ordered buffer (one split holds them).
    pub(super) fn seg_slice(&self, j: usize, q: usize, len: usize) -> &'a [u8] {
        seg_bytes(self.src, self.tmp, self.segs, &self.layout, j, q, len)
    }

    /// `len` bytes at position `q` of block `j` in byte-shuffled order: the splits of a
    /// byte-shuffled block, the planes of a bitshuffled one.
    pub(super) fn shuffled(&self, j: usize, q: usize, len: usize) -> &'a [u8] {
        if self.layout.bits {
            let at = j * self.layout.blocksize + q;
            &self.planes[at..at + len]
        } else {
            self.seg_slice(j, q, len)
        }
    }

    /// Writes the decoded chunk's bytes `at..at + out.len()` into `out`. The bytes must lie in
    /// the range the chunk was opened for.
    ///
    /// # Panics
    /// If they do not (the planner's guarantee).
    #[inline]
    pub fn gather(&self, at: usize, out: &mut [u8]) {
        assert!(
            at >= self.want.start && at + out.len() <= self.want.end,
            "blosc gather {at}+{} outside the opened range {:?}",
            out.len(),
            self.want
        );
        // The common case (16-bit samples in one block), called once per row of a crop in the
        // chunk, so kept small enough to inline and free of divisions by the type size (the
        // general path's four divisions and large frame show in blosc-lz4 crop profiles).
        if let Some((2, s)) = &self.streams
            && at.is_multiple_of(2)
            && out.len().is_multiple_of(2)
        {
            let (e0, e1) = (at / 2, at / 2 + out.len() / 2);
            interleave::<2>([&s[0][e0..e1], &s[1][e0..e1]], out);
            return;
        }
        self.gather_general(at, out);
    }

    /// Gathers the runs of `group` (decoded-chunk bytes `group.src + i * group.src_step`, as
    /// many as `rows.row(i)` holds) into `rows`. The common case (16-bit samples in one block,
    /// every run inside the opened range and at most `STREAMED_RUN` bytes) checks the group
    /// once and interleaves run by run; anything else gathers run by run.
    pub fn gather_group(&self, group: &RunGroup, rows: &mut Rows<'_>) {
        let len = rows.run_len();
        if let Some((2, s)) = &self.streams
            && len.is_multiple_of(2)
            && group.src.is_multiple_of(2)
            && group.src_step.is_multiple_of(2)
            && let Some(end) = (group.rows.max(1) - 1)
                .checked_mul(group.src_step)
                .and_then(|x| x.checked_add(group.src + len))
            && group.src >= self.want.start
            && end <= self.want.end
            && len <= STREAMED_RUN
        {
            let (e0, e1) = (group.src / 2, end / 2);
            let (a, b) = (&s[0][e0..e1], &s[1][e0..e1]);
            let (half, step) = (len / 2, group.src_step / 2);
            for i in 0..group.rows {
                let at = i * step;
                rows.write_interleaved2(i, &a[at..at + half], &b[at..at + half]);
            }
            return;
        }
        for i in 0..group.rows {
            self.gather(group.src + i * group.src_step, rows.row(i));
        }
    }

    /// [`Self::gather`] of any chunk this module opens.
    #[inline(never)]
    fn gather_general(&self, at: usize, out: &mut [u8]) {
        if self.layout.memcpyed {
            out.copy_from_slice(&self.src[HEADER + at..HEADER + at + out.len()]);
            return;
        }
        if let Some((ts, s)) = &self.streams
            && at.is_multiple_of(*ts)
            && out.len().is_multiple_of(*ts)
        {
            let (e0, e1) = (at / ts, (at + out.len()) / ts);
            match ts {
                2 => interleave::<2>([&s[0][e0..e1], &s[1][e0..e1]], out),
                4 => interleave::<4>(std::array::from_fn(|k| &s[k][e0..e1]), out),
                _ => interleave::<8>(std::array::from_fn(|k| &s[k][e0..e1]), out),
            }
            return;
        }
        let bs = self.layout.blocksize;
        let mut p = at;
        let mut out = out;
        while !out.is_empty() {
            let j = p / bs;
            let (size, nsplits) = self.layout.block(j);
            let lp = p - j * bs;
            let n = out.len().min(size - lp);
            let (here, rest) = out.split_at_mut(n);
            // A bitshuffled block with no whole group of 8 elements is stored as it is.
            let shuffled = if self.layout.bits {
                bit_main(size, self.layout.shuffle) > 0
            } else {
                self.layout.shuffle > 1
            };
            if shuffled {
                self.unshuffle(j, size, lp, here);
            } else {
                self.copy_plain(j, size / nsplits, lp, here);
            }
            out = rest;
            p += n;
        }
    }

    /// Copies the bytes `q..q + out.len()` of block `j`, stored as they are in splits of
    /// `seg_len` bytes, into `out`.
    fn copy_plain(&self, j: usize, seg_len: usize, mut q: usize, out: &mut [u8]) {
        let mut to = out;
        while !to.is_empty() {
            let len = to.len().min(seg_len - q % seg_len);
            let (part, later) = to.split_at_mut(len);
            part.copy_from_slice(self.seg_slice(j, q, len));
            to = later;
            q += len;
        }
    }

    /// Unshuffles the bytes `lp..lp + out.len()` of block `j` (of `size` bytes) into `out`.
    fn unshuffle(&self, j: usize, size: usize, lp: usize, out: &mut [u8]) {
        let ts = self.layout.shuffle;
        let neb = size / ts;
        let main = if self.layout.bits {
            bit_main(size, ts)
        } else {
            neb * ts
        };
        let end = lp + out.len();
        // Shuffled part: element e's byte k is byte e of stream k.
        let mut p = lp;
        let byte = |p: usize| self.shuffled(j, (p % ts) * neb + p / ts, 1)[0];
        while p < end.min(main) && !p.is_multiple_of(ts) {
            out[p - lp] = byte(p);
            p += 1;
        }
        let whole_end = end.min(main) / ts * ts;
        if p < whole_end {
            let (e0, e1) = (p / ts, whole_end / ts);
            let to = &mut out[p - lp..whole_end - lp];
            let stream = |k: usize| self.shuffled(j, k * neb + e0, e1 - e0);
            match ts {
                2 => interleave::<2>([stream(0), stream(1)], to),
                4 => interleave::<4>(std::array::from_fn(stream), to),
                8 => interleave::<8>(std::array::from_fn(stream), to),
                _ => {
                    for k in 0..ts {
                        for (o, &b) in to[k..].iter_mut().step_by(ts).zip(stream(k)) {
                            *o = b;
                        }
                    }
                }
            }
            p = whole_end;
        }
        while p < end.min(main) {
            out[p - lp] = byte(p);
            p += 1;
        }
        // Bytes past the last whole element are stored as they are, at the block's end.
        if end > main {
            let from = p.max(main);
            let (_, nsplits) = self.layout.block(j);
            self.copy_plain(j, size / nsplits, from, &mut out[from - lp..]);
        }
    }
}
