//! Unshuffling an opened range of a blosc chunk into a buffer or straight into crops.

use super::frame::{Chunk, HEADER, Seg};
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
        let (size, nsplits) = self.layout.block(j);
        let seg_len = size / nsplits;
        let s = q / seg_len;
        let off = q % seg_len;
        match self.segs[j * self.layout.splits + s] {
            Seg::Raw(at) => &self.src[at + off..at + off + len],
            Seg::Decoded => {
                let at = j * self.layout.blocksize + s * seg_len + off;
                &self.tmp[at..at + len]
            }
            Seg::Unread => unreachable!("blosc split {s} of block {j} read but not opened"),
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
            if self.layout.shuffle > 1 {
                self.unshuffle(j, size, lp, here);
            } else {
                // Not shuffled: the block is its splits in order.
                let seg_len = size / nsplits;
                let mut q = lp;
                let mut to = &mut here[..];
                while !to.is_empty() {
                    let len = to.len().min(seg_len - q % seg_len);
                    let (part, later) = to.split_at_mut(len);
                    part.copy_from_slice(self.seg_slice(j, q, len));
                    to = later;
                    q += len;
                }
            }
            out = rest;
            p += n;
        }
    }

    /// Unshuffles the bytes `lp..lp + out.len()` of block `j` (of `size` bytes) into `out`.
    fn unshuffle(&self, j: usize, size: usize, lp: usize, out: &mut [u8]) {
        let ts = self.layout.shuffle;
        let neb = size / ts;
        let main = neb * ts;
        let end = lp + out.len();
        // Shuffled part: element e's byte k is byte e of stream k.
        let mut p = lp;
        let byte = |p: usize| self.seg_slice(j, (p % ts) * neb + p / ts, 1)[0];
        while p < end.min(main) && !p.is_multiple_of(ts) {
            out[p - lp] = byte(p);
            p += 1;
        }
        let whole_end = end.min(main) / ts * ts;
        if p < whole_end {
            let (e0, e1) = (p / ts, whole_end / ts);
            let to = &mut out[p - lp..whole_end - lp];
            let stream = |k: usize| self.seg_slice(j, k * neb + e0, e1 - e0);
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
            out[from - lp..].copy_from_slice(self.seg_slice(j, from, end - from));
        }
    }
}
