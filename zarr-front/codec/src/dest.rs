//! Where decoders put their output: the geometry of a copy's runs in the output buffer
//! ([`RunGroup`], [`Rows`]) and cache-line prefetches for the bytes a decoder reads or writes
//! next ([`PrefetchAlong`], [`prefetch_read`], [`prefetch_for_write`]). The unsafe module of
//! zcrop-codec for raw output writes and prefetch intrinsics, besides `ffi`, `lz4` and
//! `shuffle`.
#![allow(unsafe_code)]

use std::marker::PhantomData;

use crate::shuffle::interleave;
/// Hints the CPU to fetch the cache lines of `bytes` for reading, so that a decoder that reads
/// them later (or sequentially, one miss at a time) finds them in cache: e.g. a blosc chunk's
/// raw split in the page cache, read only after its compressed split is decoded. Nothing on
/// other architectures.
pub fn prefetch_read(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes.as_ptr(), bytes.len());
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// [`prefetch_read`] into the second-level cache (not the first): for bytes read a while later,
/// whose lines would take the first level's room and outstanding misses from what is read now.
pub fn prefetch_read_l2(bytes: &[u8]) {
    PrefetchAlong::second_level(bytes).finish();
}

/// Cache lines to ask for one at a time, spread over work that goes on meanwhile:
/// [`PrefetchAlong::step`] asks for the next line, [`PrefetchAlong::finish`] for all those left.
///
/// A blosc chunk's raw split (up to 16 KiB of a 16-bit chunk of 32 KiB, read from memory) is
/// read by the unshuffle only after the chunk's LZ4 split is decoded. Asked for in one burst
/// before that decode, its 256 lines would fill the core's outstanding misses and the burst
/// itself wait on them; the LZ4 decoder now asks for one line per sequence it decodes (about 490 in such a split), so
/// the lines arrive during the decode, which misses little itself. They are asked into the
/// first-level cache ([`PrefetchAlong::new`]), since the unshuffle reads them right after the
/// decode ([`PrefetchAlong::second_level`] is for bytes read later).
#[derive(Debug)]
pub struct PrefetchAlong<'a> {
    /// The first line not asked for yet, as an offset from `base`, and the end of the bytes.
    next: usize,
    end: usize,
    base: *const u8,
    /// Whether the lines go into the first-level cache (else the second).
    first_level: bool,
    _bytes: PhantomData<&'a [u8]>,
}

impl<'a> PrefetchAlong<'a> {
    /// The lines of `bytes`, into the second-level cache: for bytes read a while after the
    /// work they are spread over.
    pub fn second_level(bytes: &'a [u8]) -> Self {
        PrefetchAlong {
            first_level: false,
            ..Self::new(bytes)
        }
    }

    /// The lines of `bytes`, into the first-level cache: for bytes read right after the work
    /// they are spread over.
    pub fn new(bytes: &'a [u8]) -> Self {
        let skew = bytes.as_ptr().addr() & 63;
        PrefetchAlong {
            first_level: true,
            next: 0,
            // (No bytes, no lines, wherever the empty slice points.)
            end: if bytes.is_empty() {
                0
            } else {
                skew + bytes.len()
            },
            base: bytes.as_ptr().wrapping_sub(skew),
            _bytes: PhantomData,
        }
    }

    /// No lines.
    pub fn none() -> Self {
        Self::new(&[])
    }

    /// Asks for the next line, if any is left.
    #[inline]
    pub fn step(&mut self) {
        if self.next < self.end {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
                let line = self.base.wrapping_add(self.next).cast::<i8>();
                // SAFETY: a prefetch only hints the cache: it neither reads nor writes memory
                // and never faults, whatever the address.
                unsafe {
                    if self.first_level {
                        _mm_prefetch::<_MM_HINT_T0>(line);
                    } else {
                        _mm_prefetch::<_MM_HINT_T1>(line);
                    }
                }
            }
            self.next += 64;
        }
    }

    /// Asks for every line left.
    pub fn finish(mut self) {
        while self.next < self.end {
            self.step();
        }
    }

    /// Lines not asked for yet.
    #[cfg(test)]
    pub(crate) fn left(&self) -> usize {
        (self.end.saturating_sub(self.next)).div_ceil(64)
    }
}

/// Issues the prefetch `HINT` for every cache line of the `len` bytes at `start` (the
/// second-level hint goes through [`PrefetchAlong`]).
#[cfg(target_arch = "x86_64")]
fn prefetch_lines<const HINT: i32>(start: *const u8, len: usize) {
    let skew = start.addr() & 63;
    let first = start.wrapping_sub(skew);
    for off in (0..skew + len).step_by(64) {
        // SAFETY: a prefetch only hints the cache: it neither reads nor writes memory and
        // never faults, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(first.wrapping_add(off).cast::<i8>()) };
    }
}

/// Rows ahead of the one being copied whose output lines a stitch asks for. A 16-bit
/// blosc-lz4 crop row in a chunk (about 128 bytes) is copied in about 20 ns, and a line the
/// CPU has not seen takes longer than several of them to arrive; much further ahead, the lines
/// asked for crowd out those in use.
pub const WRITE_AHEAD: usize = 12;

/// Hints the CPU to fetch the cache lines of `start..start + len` of the buffer of `buf_len`
/// bytes at `base` for writing; nothing if that range is not inside the buffer (or not on
/// x86-64).
pub fn prefetch_for_write(base: *mut u8, buf_len: usize, start: usize, len: usize) {
    // Not `prefetch_lines`: a run's first and last cache lines can be shared with runs of
    // neighbouring chunks that other threads write. Stepping 64 bytes from `start` skips
    // the last line when the run ends early in it, which costs less than asking for
    // every line.
    #[cfg(target_arch = "x86_64")]
    if start.checked_add(len).is_some_and(|end| end <= buf_len) {
        use std::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
        let mut at = start;
        while at < start + len {
            // SAFETY: a prefetch only hints the cache: it neither reads nor writes memory and
            // never faults, whatever the address (`at` lies inside the buffer anyway).
            unsafe { _mm_prefetch::<_MM_HINT_ET0>(base.wrapping_add(at).cast::<i8>()) };
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (base, buf_len, start, len);
}

/// The output runs of one [`RunGroup`] of a copy, handed out one at a time.
pub struct Rows<'a> {
    ptr: *mut u8,
    buf_len: usize,
    dst: usize,
    step: usize,
    len: usize,
    count: usize,
    _buf: PhantomData<&'a mut [u8]>,
}

impl Rows<'_> {
    /// The `count` runs of `len` bytes at `dst + i * step` (`i < count`) of the buffer of
    /// `buf_len` bytes at `ptr`.
    ///
    /// # Safety
    /// The first and last runs must lie inside the buffer, and no one else may read or write
    /// the runs' bytes while the `Rows` lives: they are written through `ptr` without a
    /// borrow of the buffer.
    pub unsafe fn new(
        ptr: *mut u8,
        buf_len: usize,
        dst: usize,
        step: usize,
        len: usize,
        count: usize,
    ) -> Self {
        Rows {
            ptr,
            buf_len,
            dst,
            step,
            len,
            count,
            _buf: PhantomData,
        }
    }

    /// The bytes of each run.
    pub fn run_len(&self) -> usize {
        self.len
    }

    /// The output bytes of run `i`. Asks for the lines of the run [`WRITE_AHEAD`] runs on, as
    /// the stitch of a whole decoded chunk does.
    ///
    /// # Panics
    /// If `i` is not below the group's run count.
    #[inline]
    pub fn row(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.count, "run {i} of a group of {}", self.count);
        let dst = self.dst + i * self.step;
        if self.step > 0 {
            prefetch_for_write(
                self.ptr,
                self.buf_len,
                dst.saturating_add(self.step.saturating_mul(WRITE_AHEAD)),
                self.len,
            );
        }
        // SAFETY: the group's first and last runs lie inside the buffer (`Rows::new`'s contract), and
        // run `i` lies between them (the step is not negative); no one else touches the runs
        // (`Rows::new`'s contract), and the slice borrows `self` mutably, so no two of
        // them live at once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(dst), self.len) }
    }

    /// Writes run `i` as the interleave of `lows` and `highs` (the low and high bytes of the
    /// run's 16-bit samples, half the run each, as blosc's byte shuffle stores them). The
    /// cache lines the run covers whole go from registers straight to memory with
    /// non-temporal stores: no read-for-ownership of the line, as an ordinary store would
    /// make, and no cache room. Only the partial lines at its ends are stored (and asked for,
    /// [`WRITE_AHEAD`] runs on) as usual. The caller orders the stores (an `sfence`)
    /// before the copy counts as done. The samples are interleaved in registers, so no copy of
    /// the run is needed; the partial lines are not streamed (masked non-temporal stores,
    /// `maskmovdqu`, are much slower than ordinary ones).
    ///
    /// # Panics
    /// If `i` is not below the group's run count, or `lows` and `highs` are not half the run
    /// each.
    #[allow(
        clippy::cast_ptr_alignment,
        reason = "unaligned loads; the streaming stores' targets are 64-byte aligned (below)"
    )]
    pub fn write_interleaved2(&mut self, i: usize, lows: &[u8], highs: &[u8]) {
        assert!(i < self.count, "run {i} of a group of {}", self.count);
        let len = self.len;
        assert!(
            lows.len() * 2 == len && highs.len() * 2 == len,
            "a run's two byte streams"
        );
        let dst = self.dst + i * self.step;
        let addr = self.ptr.addr() + dst;
        // An odd address (a caller's buffer can be anywhere) takes ordinary stores throughout.
        let head = if addr % 2 == 1 {
            len
        } else {
            ((64 - addr % 64) % 64).min(len)
        };
        let body = if cfg!(target_arch = "x86_64") {
            (len - head) / 64 * 64
        } else {
            0
        };
        if self.step > 0 {
            // Only the partial lines are read before they are written.
            let ahead = dst.saturating_add(self.step.saturating_mul(WRITE_AHEAD));
            if head > 0 {
                prefetch_for_write(self.ptr, self.buf_len, ahead, 1);
            }
            if head + body < len {
                prefetch_for_write(self.ptr, self.buf_len, ahead + head + body, 1);
            }
        }
        // `head` is even unless it is all of the run (`len` is even: whole samples).
        let (h, b) = (head / 2, head / 2 + body / 2);
        // SAFETY: run `i` lies inside the buffer (as in `row`) and belongs to this copy alone;
        // its head and tail, the two slices here, do not overlap; `lows` and `highs` are other
        // memory.
        unsafe {
            let to = self.ptr.add(dst);
            let head_out = std::slice::from_raw_parts_mut(to, head);
            interleave::<2>([&lows[..h], &highs[..h]], head_out);
            let tail_out = std::slice::from_raw_parts_mut(to.add(head + body), len - head - body);
            interleave::<2>([&lows[b..], &highs[b..]], tail_out);
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{
                __m128i, _mm_loadu_si128, _mm_stream_si128, _mm_unpackhi_epi8, _mm_unpacklo_epi8,
            };
            let (lows, highs) = (&lows[h..b], &highs[h..b]);
            for e in (0..body / 2).step_by(32) {
                // SAFETY: `e + 32 <= body / 2`, the length of both streams' slices, so the
                // 16-byte loads at `e` and `e + 16` are inside them (unaligned loads need no
                // alignment); the 64 output bytes at `head + 2 * e` are a whole line of run
                // `i` (64-byte aligned, as `movntdq` needs), which belongs to this copy alone.
                // SSE2 is part of every x86-64 CPU.
                unsafe {
                    let l0 = _mm_loadu_si128(lows.as_ptr().add(e).cast::<__m128i>());
                    let l1 = _mm_loadu_si128(lows.as_ptr().add(e + 16).cast::<__m128i>());
                    let h0 = _mm_loadu_si128(highs.as_ptr().add(e).cast::<__m128i>());
                    let h1 = _mm_loadu_si128(highs.as_ptr().add(e + 16).cast::<__m128i>());
                    let line = self.ptr.add(dst + head + 2 * e).cast::<__m128i>();
                    _mm_stream_si128(line, _mm_unpacklo_epi8(l0, h0));
                    _mm_stream_si128(line.add(1), _mm_unpackhi_epi8(l0, h0));
                    _mm_stream_si128(line.add(2), _mm_unpacklo_epi8(l1, h1));
                    _mm_stream_si128(line.add(3), _mm_unpackhi_epi8(l1, h1));
                }
            }
        }
    }
}

/// Evenly spaced runs of one copy, as a stitch hands them out: run `i` (of `rows`)
/// starts at byte `src + i * src_step` of the decoded chunk and `dst + i * dst_step` of the
/// output, is `elems` elements long, and lies at index `axis_index + i * axis_step` along the
/// transform's axis. A crop's copy from a chunk is mostly the rows of one 2-D slab: one group.
#[derive(Clone, Copy, Debug)]
pub struct RunGroup {
    /// The first run's byte in the decoded chunk.
    pub src: usize,
    /// Bytes from one run to the next in the decoded chunk.
    pub src_step: usize,
    /// The first run's byte in the output.
    pub dst: usize,
    /// Bytes from one run to the next in the output.
    pub dst_step: usize,
    /// The number of runs.
    pub rows: usize,
    /// Elements in each run.
    pub elems: usize,
    /// The first run's index along the transform's axis.
    pub axis_index: u64,
    /// Steps along that axis from one run to the next.
    pub axis_step: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_along_covers_each_line_of_its_bytes() {
        let buf = vec![0u8; 1024];
        let at = 64 - (buf.as_ptr().addr() & 63);
        for (skew, len, lines) in [
            (0, 0, 0),
            (0, 1, 1),
            (0, 64, 1),
            (0, 65, 2),
            (63, 2, 2),
            (10, 128, 3),
        ] {
            let bytes = &buf[at + skew..at + skew + len];
            for mut along in [
                PrefetchAlong::new(bytes),
                PrefetchAlong::second_level(bytes),
            ] {
                assert_eq!(along.left(), lines, "{skew}+{len}");
                for k in (0..lines).rev() {
                    along.step();
                    assert_eq!(along.left(), k);
                }
                along.step();
                assert_eq!(along.left(), 0);
            }
        }
        assert_eq!(PrefetchAlong::none().left(), 0);
    }
}
